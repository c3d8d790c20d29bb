"""Building blocks of the Galerkin Transformer models, usable in any PyTorch model.

* :class:`SimpleAttention` — Fourier/Galerkin (compiled ops), softmax and linear attention with
  coordinates in every head, the paper's norm schemes and initialisation (the choices:
  :data:`ATTENTION_TYPES`, :data:`NORM_SCHEMES`).
* :class:`EncoderLayer`, :class:`FeedForward` — the post-norm Transformer encoder layer.
* :class:`SpectralConv1d`, :class:`SpectralConv2d` — FNO-style spectral convolutions.
* :class:`ContinuumAttention`, :class:`ContinuumEncoderLayer`,
  :func:`auto_quadrature_weights`, :func:`resolve_quadrature_weight` — continuum attention
  and the TNO's encoder layer.
* :class:`SpectralConv` (Fourier integral operator with mode skipping), :class:`AFNOFilter`,
  :class:`AFNOBlock` — the continuum-attention paper's Fourier layers.
* :class:`PatchedAttention`, :class:`PatchedEncoderLayer`, :func:`patchify`,
  :func:`unpatchify`, :func:`even_extension`, :func:`periodic_extension`,
  :class:`SpectralSmoothing` — function-space patching of the ViT NO and FANO.
* :class:`CodomainAttention` — attention among a field's channels (Remark 16, CoDA-NO).
* :class:`GNOTBlock`, :class:`HeteroNormalizedAttention`, :class:`GeometricGate`,
  :class:`MixtureFFN`, :class:`ResidualMLP` — GNOT's blocks.
* :class:`SpectralRegressor`, :class:`PointwiseRegressor` — decoders.
* :class:`CiNNDownsampler`, :class:`CiNNUpsampler`, :func:`cinn_sizes` (:class:`CiNNSizes`)
  — the 2-D CiNN.
* :class:`Denormalizer` — target de-normalisation with statistics in buffers.
* :class:`Dropout` — ``nn.Dropout`` on the compiled CPU op :func:`galerkin_ext.ops.dropout`;
  :func:`draw_torch_masks` switches it, and the attention layers' dropout, to torch's masks.

All fields are channels-last: ``(B, N, C)`` token sequences, ``(B, n, C)`` 1-D and
``(B, n, n, C)`` 2-D grids, ``(B, P, p₁, p₂, C)`` patch tokens.
"""

from .attention import ATTENTION_TYPES, NORM_SCHEMES, SimpleAttention
from .cinn import CiNNDownsampler, CiNNSizes, CiNNUpsampler, cinn_sizes
from .codomain import CodomainAttention
from .continuum import (
    ContinuumAttention,
    ContinuumEncoderLayer,
    auto_quadrature_weights,
    resolve_quadrature_weight,
)
from .dropout import Dropout
from .encoder import EncoderLayer, FeedForward
from .fourier import AFNOBlock, AFNOFilter, SpectralConv
from .gnot import GeometricGate, GNOTBlock, HeteroNormalizedAttention, MixtureFFN, ResidualMLP
from .masks import draw_torch_masks
from .normalization import Denormalizer
from .patching import (
    PatchedAttention,
    PatchedEncoderLayer,
    SpectralSmoothing,
    even_extension,
    patchify,
    periodic_extension,
    unpatchify,
)
from .regressors import PointwiseRegressor, SpectralRegressor
from .spectral import SpectralConv1d, SpectralConv2d

__all__ = [
    "ATTENTION_TYPES",
    "NORM_SCHEMES",
    "AFNOBlock",
    "AFNOFilter",
    "CiNNDownsampler",
    "CiNNSizes",
    "CiNNUpsampler",
    "CodomainAttention",
    "ContinuumAttention",
    "ContinuumEncoderLayer",
    "Denormalizer",
    "Dropout",
    "EncoderLayer",
    "FeedForward",
    "GNOTBlock",
    "GeometricGate",
    "HeteroNormalizedAttention",
    "MixtureFFN",
    "PatchedAttention",
    "PatchedEncoderLayer",
    "PointwiseRegressor",
    "ResidualMLP",
    "SimpleAttention",
    "SpectralConv",
    "SpectralConv1d",
    "SpectralConv2d",
    "SpectralRegressor",
    "SpectralSmoothing",
    "auto_quadrature_weights",
    "cinn_sizes",
    "draw_torch_masks",
    "even_extension",
    "patchify",
    "periodic_extension",
    "resolve_quadrature_weight",
    "unpatchify",
]
