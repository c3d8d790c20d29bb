"""Fourier Neural Operator baselines (Li et al. 2020) with the same forward contract as the
Transformer models, for the comparison rows.

An FNO is a :class:`~galerkin_ext.layers.SpectralRegressor`: ``Linear`` on ``[x, grid]``
to ``width``, ``num_layers`` Fourier layers ``act(K x + W x)`` (no activation after the last),
then ``Linear(width, 128) → act → Linear(128, out)``. With the defaults the parameter counts are
those of the original FNO code: 549,569 (1-D, width 64, 16 modes) and 2,368,001 (2-D, width 32,
12 modes). Initialisation follows this package's spectral layers (Xavier-normal), not FNO's.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import arguments_named, check_choice, check_int
from ..data.datasets import block_average
from ..layers import Denormalizer, SpectralRegressor
from .transformer import zero_boundary


class FNO1d(nn.Module):
    """1-D FNO. ``forward(x, grid)``: ``x (B, n, in_channels)``, ``grid (n, 1)`` or
    ``(B, n, 1)`` → ``(B, n, out_channels)``, de-normalised by ``model.denormalizer`` (identity
    until its statistics are set, as the Burgers transformer's); any ``n >= 2 modes - 2``.

    Args:
        in_channels, out_channels: channels.
        width, modes, num_layers: Fourier layers.
        dim_feedforward: hidden width of the output MLP.
        activation: ``'relu'`` (as in the FNO paper's experiments), ``'gelu'`` or ``'silu'``.
    """

    def __init__(self, in_channels: int = 1, out_channels: int = 1, width: int = 64,
                 modes: int = 16, num_layers: int = 4, dim_feedforward: int = 128,
                 activation: str = "relu") -> None:
        super().__init__()
        with arguments_named(freq_dim="width"):  # the regressor's name for the width
            self.net = SpectralRegressor(
                in_channels, width, out_channels, modes, num_layers=num_layers, spatial_dim=1,
                spatial_fc=True, dim_feedforward=dim_feedforward, activation=activation,
                last_activation=False,
            )
        self.denormalizer = Denormalizer()

    def forward(self, x: Tensor, grid: Tensor) -> Tensor:
        """``x (B, n, in_channels)``, ``grid (n, 1)`` or ``(B, n, 1)`` →
        ``(B, n, out_channels)``."""
        return self.denormalizer(self.net(x, grid))


class FNO2d(nn.Module):
    """2-D FNO with the Darcy models' output handling.

    ``forward(x, grid)``: ``x (B, n1, n2, in_channels)``, ``grid (n1, n2, 2)`` or
    ``(B, n1, n2, 2)`` → ``(B, n1, n2, out_channels)``, or ``(B, coarse, coarse,
    out_channels)`` with ``coarse``; de-normalised by ``model.denormalizer`` (identity until its
    statistics are set), with a zero boundary ring for ``boundary='dirichlet'``. Works on any
    grid with ``n1 >= 2 modes`` and ``n2 >= 2 modes - 2``.

    Args:
        in_channels, out_channels, width, modes, num_layers, dim_feedforward, activation: as in
            :class:`FNO1d`.
        boundary: ``'free'`` (FNO as published) or ``'dirichlet'``.
        coarse: ``None`` (output on the input grid), or the inverse Darcy problem's coefficient
            grid: the FNO's output on a square input grid of ``n`` nodes per axis is averaged
            onto ``coarse`` nodes per axis as that problem's target is
            (:func:`galerkin_ext.data.block_average`; ``coarse - 1`` must divide ``n - 1``,
            ``coarse = n`` is the identity). The paper's "FNO2d (only n_f)" row.
    """

    def __init__(self, in_channels: int = 1, out_channels: int = 1, width: int = 32,
                 modes: int = 12, num_layers: int = 4, dim_feedforward: int = 128,
                 activation: str = "relu", boundary: str = "free",
                 coarse: int | None = None) -> None:
        super().__init__()
        self.boundary = check_choice(boundary, "boundary", ("dirichlet", "free"))
        self.coarse = None if coarse is None else check_int(coarse, "coarse", 2)
        with arguments_named(freq_dim="width"):  # the regressor's name for the width
            self.net = SpectralRegressor(
                in_channels, width, out_channels, modes, num_layers=num_layers, spatial_dim=2,
                spatial_fc=True, dim_feedforward=dim_feedforward, activation=activation,
                last_activation=False,
            )
        self.denormalizer = Denormalizer()

    def extra_repr(self) -> str:
        return f"boundary={self.boundary!r}, coarse={self.coarse}"

    def forward(self, x: Tensor, grid: Tensor) -> Tensor:
        """``x (B, n1, n2, in_channels)``, ``grid (n1, n2, 2)`` or ``(B, n1, n2, 2)`` →
        ``(B, n1, n2, out_channels)``, or ``(B, coarse, coarse, out_channels)``."""
        # (before the network's work; the network checks x and grid otherwise)
        if self.coarse is not None and isinstance(x, Tensor) and x.dim() == 4:
            n1, n2 = x.shape[1:3]
            if n1 != n2 or n1 < self.coarse or (n1 - 1) % (self.coarse - 1):
                raise ValueError(f"x: the output averages onto coarse = {self.coarse} nodes per "
                                 f"axis, which needs a square grid of n nodes with coarse - 1 "
                                 f"dividing n - 1, got {n1}×{n2}")
        out = self.net(x, grid)
        if self.coarse is not None:
            # the channels out of the averaged axes and back
            out = block_average(out.movedim(-1, -3), self.coarse).movedim(-3, -1)
        out = self.denormalizer(out)
        return zero_boundary(out) if self.boundary == "dirichlet" else out
