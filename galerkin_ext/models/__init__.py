"""The paper's models, built from :mod:`galerkin_ext.layers`.

``build_model(name, **overrides)`` gives the published configurations: ``'burgers'``,
``'darcy'``, ``'darcy_inverse'``, ``'fno1d'``, ``'fno2d'``, and those of the continuum-attention
paper, ``'tno_*'``, ``'vitno'``, ``'fano'``, ``'fno_ca'``, ``'afno'``, ``'gt_encoder'``, and
GNOT's ``'gnot_heat'``, ``'gnot_elasticity'``, ``'mionet_heat'``, ``'mionet_elasticity'``,
``'gk_elasticity'`` (see :func:`available_models`);
:func:`from_original` builds the first three with the weights of a model trained with the
original code, to be fed the original's coordinates, :func:`original_grid`.
The Galerkin Transformer's models are called as ``model(x, grid)`` with channels-last fields
and the grid's coordinates, GNOT's as ``model(x, inputs, theta, weight=, input_weights=)`` on
padded ragged batches; see :class:`GNOT`, :class:`SimpleTransformer1d`,
:class:`SimpleTransformer2d`, :class:`FNO1d`, :class:`FNO2d` for the shapes.
"""

from .continuum import AFNO, FANO, TNO, FNOChannelMLP, GTEncoder, ViTNO
from .conversion import from_original, original_grid
from .fno import FNO1d, FNO2d
from .gnot import GNOT, GKTransformer, MIONet
from .registry import available_models, build_model
from .transformer import SimpleTransformer1d, SimpleTransformer2d, zero_boundary

__all__ = [
    "AFNO",
    "FANO",
    "FNO1d",
    "FNO2d",
    "FNOChannelMLP",
    "GKTransformer",
    "GNOT",
    "GTEncoder",
    "MIONet",
    "SimpleTransformer1d",
    "SimpleTransformer2d",
    "TNO",
    "ViTNO",
    "available_models",
    "build_model",
    "from_original",
    "original_grid",
    "zero_boundary",
]
