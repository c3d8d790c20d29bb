"""Decoders mapping latent fields to outputs: spectral (FNO-style) and pointwise.

Both take channels-last fields ``(B, *spatial, C)`` with ``len(spatial) == spatial_dim`` and,
with ``spatial_fc=True``, the grid ``(*spatial, spatial_dim)`` or ``(B, *spatial, spatial_dim)``
concatenated to the features before a first ``Linear``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_choice,
    check_int,
    check_probability,
    check_tensor,
    expand_grid,
)
from .activation import make_activation
from .dropout import Dropout
from .spectral import SpectralConv1d, SpectralConv2d

_SPECTRAL = {1: SpectralConv1d, 2: SpectralConv2d}


class _GridInput(nn.Module):
    """The input checks and the optional ``Linear`` on ``[x, grid]`` shared by the decoders."""

    def __init__(self, in_channels: int, out_channels: int, spatial_dim: int,
                 spatial_fc: bool) -> None:
        super().__init__()
        check_int(in_channels, "in_channels")
        check_choice(spatial_dim, "spatial_dim", (1, 2))
        check_bool(spatial_fc, "spatial_fc")
        self.in_channels, self.spatial_dim = in_channels, spatial_dim
        self.fc = nn.Linear(in_channels + spatial_dim, out_channels) if spatial_fc else None

    def forward(self, x: Tensor, grid: Tensor | None, decoder: nn.Module) -> Tensor:
        """``decoder``: the module ``x`` goes into, whose parameters' dtype and device it must
        have (this one has none without ``spatial_fc``)."""
        doc = f"(B, {', '.join(['n'] * self.spatial_dim)}, {self.in_channels})"
        check_tensor(x, "x", self.spatial_dim + 2, doc, decoder)
        if x.shape[-1] != self.in_channels:
            raise ValueError(f"x: expected shape {doc}, got {tuple(x.shape)}")
        if self.fc is None:
            if grid is not None:
                raise ValueError("grid: expected None because spatial_fc=False")
            return x
        if grid is None:
            raise ValueError("grid: expected the coordinates of x's points because "
                             "spatial_fc=True, got None")
        grid = expand_grid(grid, "grid", x.shape[0], tuple(x.shape[1:-1]), self.spatial_dim,
                           x)
        return self.fc(torch.cat([x, grid.to(x.dtype)], dim=-1))


class SpectralRegressor(nn.Module):
    """Spectral decoder: [``Linear`` on ``[x, grid]``], spectral convs, pointwise MLP.

    ``num_layers`` spectral convolutions (``C → freq_dim`` then ``freq_dim → freq_dim``, where
    ``C = freq_dim`` after the optional spatial ``Linear(in_channels + spatial_dim, freq_dim)``
    and ``C = in_channels`` without it), then
    ``Linear(freq_dim, dim_feedforward) → act → Linear(dim_feedforward, out_channels)``.

    Args:
        in_channels, out_channels: feature widths in and out.
        freq_dim: width of the spectral layers.
        modes: Fourier modes per axis of every spectral layer.
        num_layers: number of spectral layers.
        spatial_dim: 1 or 2.
        spatial_fc: concatenate the grid and apply a first ``Linear`` (then ``grid`` is needed).
        dim_feedforward: hidden width of the MLP (default ``2 * spatial_dim * freq_dim``).
        activation: ``'silu'`` (reference), ``'relu'`` or ``'gelu'``, everywhere.
        last_activation: whether the last spectral layer has its activation.
        dropout: in the spectral layers.

    Input ``x (B, *spatial, in_channels)``, ``grid (*spatial, spatial_dim)`` or
    ``(B, *spatial, spatial_dim)``; output ``(B, *spatial, out_channels)``.
    """

    def __init__(
        self,
        in_channels: int,
        freq_dim: int,
        out_channels: int,
        modes: int,
        num_layers: int = 2,
        spatial_dim: int = 1,
        spatial_fc: bool = False,
        dim_feedforward: int | None = None,
        activation: str = "silu",
        last_activation: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_int(freq_dim, "freq_dim")
        check_int(num_layers, "num_layers")
        self.input = _GridInput(in_channels, freq_dim, spatial_dim, spatial_fc)
        conv = _SPECTRAL[spatial_dim]
        widths = [freq_dim if spatial_fc else in_channels] + [freq_dim] * num_layers
        self.spectral = nn.ModuleList(
            conv(widths[i], widths[i + 1], modes,
                 activation=activation if last_activation or i < num_layers - 1 else None,
                 dropout=dropout)
            for i in range(num_layers)
        )
        hidden = 2 * spatial_dim * freq_dim if dim_feedforward is None else dim_feedforward
        check_int(hidden, "dim_feedforward")
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), make_activation(activation),
                                 nn.Linear(hidden, check_int(out_channels, "out_channels")))

    def forward(self, x: Tensor, grid: Tensor | None = None) -> Tensor:
        """``x (B, *spatial, in_channels)`` [, ``grid``] → ``(B, *spatial, out_channels)``."""
        x = self.input(x, grid, self)
        for layer in self.spectral:
            x = layer(x)
        return self.mlp(x)


class PointwiseRegressor(nn.Module):
    """Pointwise decoder: [``Linear`` on ``[x, grid]``], ``num_layers × [Linear, act, dropout]``,
    ``Linear(hidden, out_channels)``.

    The first hidden ``Linear`` maps ``in_channels → hidden`` when there is no spatial
    ``Linear(in_channels + spatial_dim, hidden)`` in front of it, ``hidden → hidden`` otherwise.

    Input ``x (B, *spatial, in_channels)``, ``grid (*spatial, spatial_dim)`` or
    ``(B, *spatial, spatial_dim)``; output ``(B, *spatial, out_channels)``.
    """

    def __init__(
        self,
        in_channels: int,
        hidden: int,
        out_channels: int,
        num_layers: int = 2,
        spatial_dim: int = 2,
        spatial_fc: bool = False,
        activation: str = "silu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_int(hidden, "hidden")
        check_int(num_layers, "num_layers")
        check_probability(dropout, "dropout")
        self.input = _GridInput(in_channels, hidden, spatial_dim, spatial_fc)
        widths = [hidden if spatial_fc else in_channels] + [hidden] * num_layers
        self.layers = nn.Sequential(*(
            nn.Sequential(nn.Linear(widths[i], widths[i + 1]), make_activation(activation),
                          Dropout(dropout))
            for i in range(num_layers)
        ))
        self.out = nn.Linear(hidden, check_int(out_channels, "out_channels"))

    def forward(self, x: Tensor, grid: Tensor | None = None) -> Tensor:
        """``x (B, *spatial, in_channels)`` [, ``grid``] → ``(B, *spatial, out_channels)``."""
        return self.out(self.layers(self.input(x, grid, self)))
