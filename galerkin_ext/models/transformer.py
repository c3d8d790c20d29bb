"""The paper's Fourier/Galerkin Transformer models, assembled from :mod:`galerkin_ext.layers`.

* :class:`SimpleTransformer1d` — Burgers: lift, encoder, spectral decoder.
* :class:`SimpleTransformer2d` — Darcy and its inverse problem: CiNN down to a coarse grid,
  encoder with the coarse grid's coordinates in every head, CiNN up, spectral or pointwise
  decoder, de-normalisation and an optional zero (Dirichlet) boundary ring.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import (
    arguments_named,
    check_choice,
    check_int,
    check_model_input,
    check_probability,
    check_tensor,
    expand_grid,
)
from ..layers import (
    CiNNDownsampler,
    CiNNUpsampler,
    Denormalizer,
    Dropout,
    EncoderLayer,
    PointwiseRegressor,
    SpectralRegressor,
    cinn_sizes,
    draw_torch_masks,
)

# the decoders' arguments by the names the models give them
_DECODER_ARGUMENTS = {"activation": "decoder_activation", "dropout": "decoder_dropout",
                      "dim_feedforward": "decoder_dim_feedforward",
                      "num_layers": "num_decoder_layers", "hidden": "decoder_hidden"}


def _encoder(num_layers: int, **layer_kwargs: Any) -> nn.ModuleList:
    check_int(num_layers, "num_layers")
    with arguments_named(dropout="encoder_dropout"):  # the models' name for the layers' dropout
        return nn.ModuleList(EncoderLayer(**layer_kwargs) for _ in range(num_layers))


def zero_boundary(x: Tensor) -> Tensor:
    """Set the outermost ring of ``x (B, n1, n2, C)`` to zero (homogeneous Dirichlet data)."""
    check_tensor(x, "x", 4, "(B, n1, n2, C)")
    out = x.clone()  # (slicing off the ring and padding it back grows a side of 1 to 2)
    out[:, [0, -1]] = 0
    out[:, :, [0, -1]] = 0
    return out


class SimpleTransformer1d(nn.Module):
    """Fourier/Galerkin Transformer for 1-D operators (the paper's Burgers model).

    ``Linear(in_channels, d_model)`` lift, ``num_layers`` :class:`EncoderLayer` with the grid
    coordinate in every head (``pos_dim = 1``), dropout, :class:`SpectralRegressor`
    (``d_model → freq_dim`` spectral layers, MLP of width ``decoder_dim_feedforward``),
    :class:`Denormalizer` (identity until ``model.denormalizer.set_statistics(mean, std)``; the
    Burgers example sets the training targets' scalar statistics, see its ``PRESETS`` comment).
    Defaults are the paper's configuration (530,305 parameters).

    Args:
        in_channels, out_channels: input and output channels.
        d_model, n_head, num_layers, dim_feedforward: encoder sizes.
        attention_type: ``'fourier'`` (default), ``'galerkin'``, ``'softmax'`` or ``'linear'``.
        norm: ``'attn'`` (paper), ``'layer'``, ``'instance'`` or ``None`` (see
            :class:`~galerkin_ext.layers.EncoderLayer`).
        eps: epsilon of the norms.
        xavier_init, diagonal_weight: init of the attention projections.
        encoder_dropout, ffn_dropout, attn_dropout: encoder dropouts (the last two default
            to ``encoder_dropout``).
        reference_dropout: the original code's always-on ``p = 0.5`` attention dropout, and
            every dropout's mask drawn by torch's dropout, as the original's (so that its
            seeded training repeats; :func:`~galerkin_ext.layers.draw_torch_masks`).
        dropout: on the encoder output.
        freq_dim, modes, num_decoder_layers, decoder_dim_feedforward, decoder_dropout,
            decoder_activation: the spectral decoder.

    ``forward(x, grid)``: ``x (B, n, in_channels)``, ``grid (n, 1)`` or ``(B, n, 1)`` →
    ``(B, n, out_channels)``. The same weights apply at any ``n >= 2 modes - 2``.
    """

    def __init__(
        self,
        in_channels: int = 1,
        out_channels: int = 1,
        d_model: int = 96,
        n_head: int = 1,
        num_layers: int = 4,
        dim_feedforward: int = 192,
        attention_type: str = "fourier",
        norm: str | None = "attn",
        eps: float = 1e-5,
        xavier_init: float = 1e-3,
        diagonal_weight: float = 1e-2,
        encoder_dropout: float = 0.0,
        ffn_dropout: float | None = None,
        attn_dropout: float | None = None,
        reference_dropout: bool = False,
        dropout: float = 0.0,
        freq_dim: int = 48,
        modes: int = 16,
        num_decoder_layers: int = 2,
        decoder_dim_feedforward: int = 48,
        decoder_dropout: float = 0.0,
        decoder_activation: str = "silu",
    ) -> None:
        super().__init__()
        self.in_channels = check_int(in_channels, "in_channels")
        self.lift = nn.Linear(in_channels, check_int(d_model, "d_model"))
        self.encoder = _encoder(
            num_layers, d_model=d_model, n_head=n_head, attention_type=attention_type,
            pos_dim=1, dim_feedforward=dim_feedforward, norm=norm, dropout=encoder_dropout,
            ffn_dropout=ffn_dropout, attn_dropout=attn_dropout, eps=eps, xavier_init=xavier_init,
            diagonal_weight=diagonal_weight, reference_dropout=reference_dropout,
        )
        self.dropout = Dropout(check_probability(dropout, "dropout"))
        with arguments_named(**_DECODER_ARGUMENTS):
            self.decoder = SpectralRegressor(
                d_model, freq_dim, out_channels, modes, num_layers=num_decoder_layers,
                spatial_dim=1, dim_feedforward=decoder_dim_feedforward,
                activation=decoder_activation, dropout=decoder_dropout,
            )
        self.denormalizer = Denormalizer()
        if reference_dropout:
            draw_torch_masks(self)

    def forward(self, x: Tensor, grid: Tensor) -> Tensor:
        """``x (B, n, in_channels)``, ``grid (n, 1)`` or ``(B, n, 1)`` →
        ``(B, n, out_channels)``."""
        check_tensor(x, "x", 3, "(B, n, in_channels)")
        check_model_input(x, "x", self)
        if x.shape[-1] != self.in_channels:
            raise ValueError(f"x: expected shape (B, n, in_channels) with in_channels = "
                             f"{self.in_channels}, got {tuple(x.shape)}")
        batch, n, _ = x.shape
        # A grid shared by the batch stays (n, 1): the attention ops broadcast it for free.
        expanded = expand_grid(grid, "grid", batch, (n,), 1, x)
        pos = (grid if grid.dim() == 2 else expanded).to(x.dtype)
        h = self.lift(x)
        for layer in self.encoder:
            h = layer(h, pos)
        return self.denormalizer(self.decoder(self.dropout(h)))


class SimpleTransformer2d(nn.Module):
    """Fourier/Galerkin Transformer for 2-D operators (the paper's Darcy and inverse models).

    :class:`CiNNDownsampler` from the ``fine × fine`` input grid to the ``coarse × coarse``
    grid, dropout, ``num_layers`` :class:`EncoderLayer` over the ``coarse²`` tokens with their
    coordinates in every head (``pos_dim = 2``; obtained by bilinear interpolation of the given
    fine grid, which is exact for a uniform grid), :class:`CiNNUpsampler` to the output grid,
    dropout, a decoder on ``[features, output grid]``, :class:`Denormalizer` (buffers the
    trainer sets with ``model.denormalizer.set_statistics(mean, std)``) and, for
    ``boundary='dirichlet'``, a zero boundary ring. Defaults are the paper's Darcy
    configuration at 141/43 (2,220,829 parameters).

    Args:
        fine, coarse: input grid size ``n`` and attention grid size ``m`` (CiNN sizes from
            :func:`~galerkin_ext.layers.cinn_sizes`).
        in_channels, out_channels: input and output channels.
        d_model, n_head, num_layers, dim_feedforward, attention_type, norm, eps, xavier_init,
            diagonal_weight, encoder_dropout, ffn_dropout, attn_dropout, reference_dropout: the
            encoder, as in :class:`SimpleTransformer1d`.
        dropout: on the encoder input and on the decoder input.
        decoder: ``'spectral'`` (Darcy) or ``'pointwise'`` (inverse problem).
        output_grid: ``'fine'`` (up-sample to ``n``) or ``'coarse'`` (stay on ``m``).
        boundary: ``'dirichlet'`` (zero ring) or ``'free'``.
        freq_dim, modes, decoder_dim_feedforward: the spectral decoder (default 32, 12 and
            ``4 * freq_dim``; refused with the pointwise decoder).
        num_decoder_layers: spectral layers, or hidden layers of the pointwise decoder.
        decoder_hidden: width of the pointwise decoder (default ``d_model``; refused with the
            spectral decoder).
        downsampler_activation, upsampler_activation, decoder_activation: activations.
        downsampler_dropout, upsampler_dropout, decoder_dropout: dropouts.

    ``forward(x, grid)``: ``x (B, n, n, in_channels)``, ``grid (n, n, 2)`` or ``(B, n, n, 2)``
    (the coordinates of the fine grid's nodes) → ``(B, n, n, out_channels)`` for
    ``output_grid='fine'`` or ``(B, m, m, out_channels)`` for ``'coarse'``.
    """

    def __init__(
        self,
        fine: int = 141,
        coarse: int = 43,
        in_channels: int = 1,
        out_channels: int = 1,
        d_model: int = 128,
        n_head: int = 4,
        num_layers: int = 6,
        dim_feedforward: int = 256,
        attention_type: str = "galerkin",
        norm: str | None = "attn",
        eps: float = 1e-7,
        xavier_init: float = 1e-2,
        diagonal_weight: float = 1e-2,
        encoder_dropout: float = 0.05,
        ffn_dropout: float | None = None,
        attn_dropout: float | None = None,
        reference_dropout: bool = False,
        dropout: float = 0.0,
        decoder: str = "spectral",
        output_grid: str = "fine",
        boundary: str = "dirichlet",
        freq_dim: int | None = None,
        modes: int | None = None,
        num_decoder_layers: int = 2,
        decoder_dim_feedforward: int | None = None,
        decoder_hidden: int | None = None,
        downsampler_activation: str = "relu",
        upsampler_activation: str = "silu",
        decoder_activation: str = "silu",
        downsampler_dropout: float = 0.05,
        upsampler_dropout: float = 0.0,
        decoder_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_choice(decoder, "decoder", ("spectral", "pointwise"))
        check_choice(output_grid, "output_grid", ("fine", "coarse"))
        check_choice(boundary, "boundary", ("dirichlet", "free"))
        check_int(d_model, "d_model")
        self.sizes = cinn_sizes(fine, coarse)
        self.in_channels, self.boundary = check_int(in_channels, "in_channels"), boundary
        self.output_grid = output_grid
        with arguments_named(activation="downsampler_activation", dropout="downsampler_dropout"):
            self.downsampler = CiNNDownsampler(
                in_channels, d_model, (self.sizes.down_middle, coarse),
                activation=downsampler_activation, dropout=downsampler_dropout,
            )
        self.dropout = Dropout(check_probability(dropout, "dropout"))
        self.encoder = _encoder(
            num_layers, d_model=d_model, n_head=n_head, attention_type=attention_type,
            pos_dim=2, dim_feedforward=dim_feedforward, norm=norm, dropout=encoder_dropout,
            ffn_dropout=ffn_dropout, attn_dropout=attn_dropout, eps=eps, xavier_init=xavier_init,
            diagonal_weight=diagonal_weight, reference_dropout=reference_dropout,
        )
        # The inverse problem's up path interpolates coarse → coarse, i.e. it is one conv block.
        up_sizes = (self.sizes.up_middle, fine) if output_grid == "fine" else (coarse, coarse)
        with arguments_named(activation="upsampler_activation", dropout="upsampler_dropout"):
            self.upsampler = CiNNUpsampler(d_model, d_model, up_sizes,
                                           activation=upsampler_activation,
                                           dropout=upsampler_dropout)
        # A setting of the decoder not built would be dropped silently: refused.
        for name, value, owner in (("freq_dim", freq_dim, "spectral"),
                                   ("modes", modes, "spectral"),
                                   ("decoder_dim_feedforward", decoder_dim_feedforward,
                                    "spectral"),
                                   ("decoder_hidden", decoder_hidden, "pointwise")):
            if value is not None:
                check_int(value, name)
                if decoder != owner:
                    raise ValueError(f"{name}: only the {owner} decoder has it, got {value} "
                                     f"with decoder={decoder!r}")
        freq_dim = 32 if freq_dim is None else freq_dim
        modes = 12 if modes is None else modes
        out_size = fine if output_grid == "fine" else coarse
        if decoder == "spectral" and out_size < 2 * modes:
            raise ValueError(f"modes: expected at most {out_size // 2} for the {out_size}×"
                             f"{out_size} output grid of the spectral decoder, got {modes}")
        with arguments_named(**_DECODER_ARGUMENTS):
            if decoder == "spectral":
                self.decoder: nn.Module = SpectralRegressor(
                    d_model, freq_dim, out_channels, modes, num_layers=num_decoder_layers,
                    spatial_dim=2, spatial_fc=True, dim_feedforward=decoder_dim_feedforward,
                    activation=decoder_activation, dropout=decoder_dropout,
                )
            else:
                self.decoder = PointwiseRegressor(
                    d_model, d_model if decoder_hidden is None else decoder_hidden,
                    out_channels, num_layers=num_decoder_layers, spatial_dim=2, spatial_fc=True,
                    activation=decoder_activation, dropout=decoder_dropout,
                )
        self.denormalizer = Denormalizer()
        if reference_dropout:
            draw_torch_masks(self)

    def extra_repr(self) -> str:
        return (f"fine={self.sizes.fine}, coarse={self.sizes.coarse}, "
                f"output_grid={self.output_grid!r}, boundary={self.boundary!r}")

    def forward(self, x: Tensor, grid: Tensor) -> Tensor:
        """``x (B, n, n, in_channels)``, ``grid (n, n, 2)`` or ``(B, n, n, 2)`` →
        ``(B, n, n, out_channels)`` (``output_grid='fine'``) or ``(B, m, m, out_channels)``."""
        n, m = self.sizes.fine, self.sizes.coarse
        check_tensor(x, "x", 4, f"(B, {n}, {n}, {self.in_channels})")
        check_model_input(x, "x", self)
        if tuple(x.shape[1:]) != (n, n, self.in_channels):
            raise ValueError(f"x: expected shape (B, {n}, {n}, {self.in_channels}) "
                             f"(fine = {n}), got {tuple(x.shape)}")
        batch = x.shape[0]
        shared = isinstance(grid, Tensor) and grid.dim() == 3 and batch > 0
        grid = expand_grid(grid, "grid", batch, (n, n), 2, x).to(x.dtype)
        # A grid shared by the batch is interpolated once and broadcast by the attention ops.
        coarse_grid = F.interpolate(
            (grid[:1] if shared else grid).permute(0, 3, 1, 2), size=(m, m),
            mode="bilinear", align_corners=True,
        ).permute(0, 2, 3, 1)
        pos = coarse_grid.reshape(-1, m * m, 2)
        pos = pos[0] if shared else pos

        h = self.dropout(self.downsampler(x).flatten(1, 2))
        for layer in self.encoder:
            h = layer(h, pos)
        h = self.dropout(self.upsampler(h.unflatten(1, (m, m))))
        out_grid = grid if self.output_grid == "fine" else coarse_grid.expand(batch, m, m, 2)
        out = self.denormalizer(self.decoder(h, out_grid))
        return zero_boundary(out) if self.boundary == "dirichlet" else out
