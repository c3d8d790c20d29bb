"""CiNN: the interpolation-based CNN that moves 2-D fields between the fine and coarse grids.

The down-sampler lifts the input channels with a 3×3 convolution, interpolates to a middle
size, applies three chained convolutions whose outputs are concatenated, and interpolates to
the coarse size on which the attention runs. The up-sampler interpolates back through one
convolution. All interpolation is bilinear with ``align_corners=True``, so node values at the
corners of the unit square stay put and linear fields are reproduced exactly.

Fields are channels-last: ``(B, n, n, C)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_int, check_probability, check_tensor
from .activation import make_activation
from .dropout import Dropout


class CiNNSizes(NamedTuple):
    """Grid sizes of the CiNN paths: ``fine → down_middle → coarse`` and
    ``coarse → up_middle → fine``."""

    fine: int
    down_middle: int
    coarse: int
    up_middle: int


def _reference_factor(fine: int, coarse: int) -> float:
    """The reference code's interpolation factor for ``fine → coarse`` (its Darcy scripts' rule,
    restated): ``sqrt(coarse / fine)`` to 4 decimals, then to 3, plus 0.005 where the 4-decimal
    value's last printed digit is below 5, then to the nearest multiple of 0.005. The same float
    operations in the same order, so that the sizes below come out as the reference's."""
    k = round(math.sqrt(coarse / fine) * 10_000)  # the 4-decimal value, in units of 1e-4
    last_digit = k
    while last_digit and last_digit % 10 == 0:  # printing drops the trailing zeros
        last_digit //= 10
    factor = round(k / 10_000 * 1000) / 1000
    if last_digit % 10 < 5:
        factor += 5e-3
    return int(factor / 5e-3 + 5e-1) * 5e-3


def cinn_sizes(fine: int, coarse: int) -> CiNNSizes:
    """The CiNN grid sizes for a ``fine × fine`` input and a ``coarse × coarse`` latent grid.

    The reference's where it has them: it scales twice by one rounded factor ``f``
    (:func:`_reference_factor`; ``fine → ⌊fine·f⌋ → ⌊⌊fine·f⌋·f⌋``) and comes back through
    ``round(fine·f) − 1``, so the paper's pairs give 211/61 → 113, 113; 141/43 → 78, 77;
    85/29 → 50, 49; 141/36 → 71, 71; 211/71 → 123, 122 (down, up middle). Where the second
    scaling misses ``coarse`` (85/22 reaches 21), pairs the reference cannot run, both paths pass
    through the geometric mean ``round(sqrt(fine·coarse))``.
    """
    check_int(fine, "fine", minimum=2)
    check_int(coarse, "coarse", minimum=2)
    if coarse > fine:
        raise ValueError(f"coarse: expected at most fine = {fine}, got {coarse}")
    factor = _reference_factor(fine, coarse)
    down = math.floor(fine * factor)  # as F.interpolate sizes a scale factor
    if math.floor(down * factor) == coarse:
        up = round(fine * factor) - 1
    else:
        down = up = round(math.sqrt(fine * coarse))
    return CiNNSizes(fine, down, coarse, up)


def _conv_block(in_channels: int, out_channels: int, activation: str, dropout: float) -> nn.Module:
    """``conv3×3 (no bias) → dropout → act``, size-preserving."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        Dropout(dropout),
        make_activation(activation),
    )


def _interpolate(x: Tensor, size: int) -> Tensor:
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=True)


def _check_sizes(sizes: object) -> tuple[int, int]:
    if not isinstance(sizes, (tuple, list)) or len(sizes) != 2:
        raise TypeError(f"sizes: expected a pair of grid sizes (middle, target), got {sizes!r}")
    return check_int(sizes[0], "sizes[0]"), check_int(sizes[1], "sizes[1]")


class CiNNDownsampler(nn.Module):
    """Fine grid → coarse grid.

    ``conv block(in → out)``, interpolate to ``sizes[0]``, act, then conv blocks
    ``out → out//3 → out//3 → out - 2 (out//3)`` whose outputs are concatenated (``out``
    channels), interpolate to ``sizes[1]``, act.

    Args:
        in_channels, out_channels: channel widths (``out_channels >= 3``).
        sizes: ``(middle, coarse)`` grid sizes, e.g. ``(s.down_middle, s.coarse)`` of
            ``s = cinn_sizes(141, 43)``.
        activation: ``'relu'`` (reference for Darcy), ``'silu'`` (inverse problem) or ``'gelu'``.
        dropout: after every convolution.

    Input ``(B, n, n, in_channels)`` for any ``n``; output ``(B, coarse, coarse, out_channels)``.
    """

    def __init__(self, in_channels: int, out_channels: int, sizes: tuple[int, int],
                 activation: str = "relu", dropout: float = 0.0) -> None:
        super().__init__()
        check_int(in_channels, "in_channels")
        check_int(out_channels, "out_channels", minimum=3)
        check_probability(dropout, "dropout")
        self.in_channels, self.sizes = in_channels, _check_sizes(sizes)
        third = out_channels // 3
        self.lift = _conv_block(in_channels, out_channels, activation, dropout)
        self.activation = make_activation(activation)
        self.branches = nn.ModuleList([
            _conv_block(out_channels, third, activation, dropout),
            _conv_block(third, third, activation, dropout),
            _conv_block(third, out_channels - 2 * third, activation, dropout),
        ])

    def forward(self, x: Tensor) -> Tensor:
        """``(B, n, n, in_channels)`` → ``(B, coarse, coarse, out_channels)``."""
        check_tensor(x, "x", 4, "(B, n, n, in_channels)", self)
        if x.shape[-1] != self.in_channels or x.shape[1] != x.shape[2]:
            raise ValueError(f"x: expected shape (B, n, n, in_channels), a square grid, with "
                             f"in_channels = {self.in_channels}, got {tuple(x.shape)}")
        x = self.lift(x.permute(0, 3, 1, 2))
        x = self.activation(_interpolate(x, self.sizes[0]))
        features = []
        for branch in self.branches:
            x = branch(x)
            features.append(x)
        x = self.activation(_interpolate(torch.cat(features, dim=1), self.sizes[1]))
        return x.permute(0, 2, 3, 1)


class CiNNUpsampler(nn.Module):
    """Coarse grid → fine grid: interpolate to ``sizes[0]``, conv block, interpolate to
    ``sizes[1]`` (no activation after the last interpolation).

    As in the reference the conv block is followed by another dropout and activation, so the
    activation is applied twice (``act(drop(act(drop(conv(x)))))``).

    Args:
        in_channels, out_channels: channel widths.
        sizes: ``(middle, fine)`` grid sizes, e.g. ``(s.up_middle, s.fine)`` of
            ``s = cinn_sizes(141, 43)``; the inverse problem stays on the coarse grid with
            ``(coarse, coarse)``.
        activation: ``'silu'`` (reference), ``'relu'`` or ``'gelu'``.
        dropout: after the convolution and again after the first activation.

    Input ``(B, m, m, in_channels)``; output ``(B, fine, fine, out_channels)``.
    """

    def __init__(self, in_channels: int, out_channels: int, sizes: tuple[int, int],
                 activation: str = "silu", dropout: float = 0.0) -> None:
        super().__init__()
        check_int(in_channels, "in_channels")
        check_int(out_channels, "out_channels")
        check_probability(dropout, "dropout")
        self.in_channels, self.sizes = in_channels, _check_sizes(sizes)
        self.conv = nn.Sequential(_conv_block(in_channels, out_channels, activation, dropout),
                                  Dropout(dropout), make_activation(activation))

    def forward(self, x: Tensor) -> Tensor:
        """``(B, m, m, in_channels)`` → ``(B, fine, fine, out_channels)``."""
        check_tensor(x, "x", 4, "(B, m, m, in_channels)", self)
        if x.shape[-1] != self.in_channels or x.shape[1] != x.shape[2]:
            raise ValueError(f"x: expected shape (B, m, m, in_channels), a square grid, with "
                             f"in_channels = {self.in_channels}, got {tuple(x.shape)}")
        x = self.conv(_interpolate(x.permute(0, 3, 1, 2), self.sizes[0]))
        return _interpolate(x, self.sizes[1]).permute(0, 2, 3, 1)
