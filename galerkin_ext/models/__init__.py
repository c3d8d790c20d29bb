"""The paper's models, built from :mod:`galerkin_ext.layers`.

``build_model(name, **overrides)`` gives the published configurations: ``'burgers'``,
``'darcy'``, ``'darcy_inverse'``, ``'fno1d'``, ``'fno2d'``, and those of the continuum-attention
paper, ``'tno_*'``, ``'fno_ca'``, ``'afno'``, ``'gt_encoder'`` (see :func:`available_models`).
All models are called as ``model(x, grid)`` with channels-last fields and the grid's
coordinates; see :class:`SimpleTransformer1d`, :class:`SimpleTransformer2d`, :class:`FNO1d`,
:class:`FNO2d` for the shapes.
"""

from .continuum import AFNO, TNO, FNOChannelMLP, GTEncoder
from .fno import FNO1d, FNO2d
from .registry import available_models, build_model
from .transformer import SimpleTransformer1d, SimpleTransformer2d, zero_boundary

__all__ = [
    "AFNO",
    "FNO1d",
    "FNO2d",
    "FNOChannelMLP",
    "GTEncoder",
    "SimpleTransformer1d",
    "SimpleTransformer2d",
    "TNO",
    "available_models",
    "build_model",
    "zero_boundary",
]
