"""FNO-style spectral convolutions with a pointwise residual: ``act(K x + Linear(x))``: whole
FNO layers, named like the Galerkin Transformer reference code's (the bare Fourier operator ``K``
of the continuum models is :class:`~galerkin_ext.layers.SpectralConv`).

``K`` keeps the lowest ``modes`` Fourier modes of ``rfft(x, norm='ortho')`` and multiplies them
by learned complex weights, stored as real tensors with a trailing ``(re, im)`` axis as in the
reference code (so parameter counts and state dicts line up with it).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_int, check_probability, check_tensor
from .activation import make_activation
from .dropout import Dropout
from .fourier import spectral_dtypes, spectral_product, spectral_product_1d


def _activation_or_identity(activation: str | None) -> nn.Module:
    return nn.Identity() if activation is None else make_activation(activation)


class SpectralConv1d(nn.Module):
    """``act(irfft(W · rfft(x)[:modes]) + Linear(x))`` along one periodic axis.

    Args:
        in_channels, out_channels: feature widths.
        modes: number of retained Fourier modes (``<= n // 2 + 1`` for ``n`` points).
        activation: ``'silu'`` (reference), ``'relu'``, ``'gelu'`` or ``None`` for none.
        dropout: on the input of the spectral branch (not of the residual ``Linear``).

    Input ``(B, n, in_channels)``, output ``(B, n, out_channels)``; any ``n`` with enough modes.
    """

    def __init__(self, in_channels: int, out_channels: int, modes: int,
                 activation: str | None = "silu", dropout: float = 0.0) -> None:
        super().__init__()
        check_int(in_channels, "in_channels")
        check_int(out_channels, "out_channels")
        self.modes = check_int(modes, "modes")
        self.linear = nn.Linear(in_channels, out_channels)
        self.weight = nn.Parameter(torch.empty(in_channels, out_channels, modes, 2))
        nn.init.xavier_normal_(self.weight, gain=1.0 / (in_channels * out_channels))
        self.dropout = Dropout(check_probability(dropout, "dropout"))
        self.activation = _activation_or_identity(activation)

    def extra_repr(self) -> str:
        return f"modes={self.modes}"

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, n, in_channels)`` → ``(B, n, out_channels)``."""
        check_tensor(x, "x", 3, "(B, n, in_channels)", self)
        n = x.shape[1]
        if x.shape[-1] != self.linear.in_features:
            raise ValueError(f"x: expected shape (B, n, in_channels) with in_channels = "
                             f"{self.linear.in_features}, got {tuple(x.shape)}")
        if n // 2 + 1 < self.modes:
            raise ValueError(f"x: {n} points give {n // 2 + 1} Fourier modes, fewer than "
                             f"modes = {self.modes}; expected n >= {2 * self.modes - 2}")
        residual = self.linear(x)
        if x.shape[0] == 0:  # an empty batch (MKL's FFT refuses a zero-size batch)
            return self.activation(residual)
        work, result = spectral_dtypes(x)
        y = spectral_product_1d(self.dropout(x).to(work),
                                torch.view_as_complex(self.weight.to(work)), "ortho")
        return self.activation(y.to(result) + residual)


class SpectralConv2d(nn.Module):
    """Two-dimensional :class:`SpectralConv1d`: modes ``[:m, :m]`` and ``[-m:, :m]`` of ``rfft2``.

    The two blocks of weights, ``weight_pos`` and ``weight_neg`` of shape
    ``(in_channels, out_channels, m, m, 2)``, act on the positive and negative frequencies of the
    first axis (the last axis of ``rfft2`` holds only non-negative ones).

    Input ``(B, n1, n2, in_channels)``, output ``(B, n1, n2, out_channels)``; needs
    ``n1 >= 2 m`` and ``n2 // 2 + 1 >= m``.
    """

    def __init__(self, in_channels: int, out_channels: int, modes: int,
                 activation: str | None = "silu", dropout: float = 0.0) -> None:
        super().__init__()
        check_int(in_channels, "in_channels")
        check_int(out_channels, "out_channels")
        self.modes = check_int(modes, "modes")
        self.linear = nn.Linear(in_channels, out_channels)
        gain = math.sqrt(in_channels + out_channels) / (in_channels * out_channels)
        shape = (in_channels, out_channels, modes, modes, 2)
        self.weight_pos = nn.Parameter(nn.init.xavier_normal_(torch.empty(shape), gain=gain))
        self.weight_neg = nn.Parameter(nn.init.xavier_normal_(torch.empty(shape), gain=gain))
        self.dropout = Dropout(check_probability(dropout, "dropout"))
        self.activation = _activation_or_identity(activation)

    def extra_repr(self) -> str:
        return f"modes={self.modes}"

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, n1, n2, in_channels)`` → ``(B, n1, n2, out_channels)``."""
        check_tensor(x, "x", 4, "(B, n1, n2, in_channels)", self)
        batch, n1, n2, channels = x.shape
        m = self.modes
        if channels != self.linear.in_features:
            raise ValueError(f"x: expected shape (B, n1, n2, in_channels) with in_channels = "
                             f"{self.linear.in_features}, got {tuple(x.shape)}")
        if n1 < 2 * m or n2 // 2 + 1 < m:
            raise ValueError(f"x: a {n1}×{n2} grid is too coarse for modes = {m}; expected "
                             f"n1 >= {2 * m} and n2 >= {2 * m - 2}")
        residual = self.linear(x)
        if batch == 0:  # an empty batch (MKL's FFT refuses a zero-size batch)
            return self.activation(residual)
        work, result = spectral_dtypes(x)
        weight = torch.cat([torch.view_as_complex(self.weight_pos.to(work)),
                            torch.view_as_complex(self.weight_neg.to(work))], dim=2)  # k₁ ≥ 0, < 0
        y = spectral_product(self.dropout(x).to(work), weight, m, "ortho")
        return self.activation(y.to(result) + residual)
