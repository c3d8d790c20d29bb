"""Building blocks of the Galerkin Transformer models, usable in any PyTorch model.

* :class:`SimpleAttention` — Fourier/Galerkin (compiled ops), softmax and linear attention with
  coordinates in every head, the paper's norm schemes and initialisation.
* :class:`EncoderLayer`, :class:`FeedForward` — the post-norm Transformer encoder layer.
* :class:`SpectralConv1d`, :class:`SpectralConv2d` — FNO-style spectral convolutions.
* :class:`SpectralRegressor`, :class:`PointwiseRegressor` — decoders.
* :class:`CiNNDownsampler`, :class:`CiNNUpsampler`, :func:`cinn_sizes` — the 2-D CiNN.
* :class:`Denormalizer` — target de-normalisation with statistics in buffers.

All fields are channels-last: ``(B, N, C)`` token sequences, ``(B, n, C)`` 1-D and
``(B, n, n, C)`` 2-D grids.
"""

from .attention import ATTENTION_TYPES, NORM_SCHEMES, SimpleAttention
from .cinn import CiNNDownsampler, CiNNSizes, CiNNUpsampler, cinn_sizes
from .encoder import EncoderLayer, FeedForward
from .normalization import Denormalizer
from .regressors import PointwiseRegressor, SpectralRegressor
from .spectral import SpectralConv1d, SpectralConv2d

__all__ = [
    "ATTENTION_TYPES",
    "NORM_SCHEMES",
    "CiNNDownsampler",
    "CiNNSizes",
    "CiNNUpsampler",
    "Denormalizer",
    "EncoderLayer",
    "FeedForward",
    "PointwiseRegressor",
    "SimpleAttention",
    "SpectralConv1d",
    "SpectralConv2d",
    "SpectralRegressor",
    "cinn_sizes",
]
