"""Function-space patching (SPEC-continuum §1.2, §2): the layers of the ViT NO and the FANO.

A field on a 2-D grid ``(B, s₁, s₂, C)`` is cut into ``P = P₁·P₂`` congruent patches of
``p₁ × p₂ = (s₁/P₁) × (s₂/P₂)`` points; each patch is one token, a function on the patch domain
``D′``. Attention compares tokens by the ``L²(D′)`` inner product
(:func:`galerkin_ext.ops.patched_attention`) with the grid's cell volume ``|D|/(s₁s₂)``, so with
the number of patches fixed, a finer grid refines the quadrature instead of adding tokens.

* :func:`patchify`, :func:`unpatchify` — grid ↔ row-major patches ``(B, P, p₁, p₂, C)``.
* :class:`PatchedAttention`, :class:`PatchedEncoderLayer` — multi-head patched attention with
  pointwise (ViT NO) or per-patch spectral (FANO) ``Q``, ``K``, ``V``, and its post-LN layer.
* :func:`even_extension`, :func:`periodic_extension` — the FANO's periodic patch extension:
  an operator applied to the patch mirrored to ``2p₁ × 2p₂``, then cropped.
* :class:`SpectralSmoothing` — multiplies Fourier mode ``k`` by ``(1 + ε|k|²)^(-α)``.

Shapes are channels-last: grids ``(B, s₁, s₂, C)``, patch tokens ``(B, P, p₁, p₂, C)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from .. import ops
from .._checks import (
    check_choice,
    check_float,
    check_heads,
    check_int,
    check_int_pair,
    check_probability,
    check_scale,
    check_tensor,
)
from ..functional import opmath_dtype
from .activation import make_activation
from .continuum import feedforward_width
from .dropout import Dropout
from .fourier import SpectralConv

__all__ = ["PatchedAttention", "PatchedEncoderLayer", "SpectralSmoothing", "even_extension",
           "patchify", "periodic_extension", "unpatchify"]

PATCH_EXTENSIONS = (None, "periodic")


def patchify(x: Tensor, patches: int | tuple[int, int], *, name: str = "x") -> Tensor:
    """Cut a grid into ``P₁ × P₂`` congruent patches, numbered row-major.

    Args:
        x: ``(B, s₁, s₂, C)``; ``P_i`` must divide ``s_i``.
        patches: ``(P₁, P₂)``, or one int for both axes.
        name: ``x``'s name in error messages (e.g. a model's ``u``).

    Returns:
        ``(B, P₁·P₂, s₁/P₁, s₂/P₂, C)``; patch ``i₁·P₂ + i₂`` holds the points
        ``[i₁ p₁, (i₁+1) p₁) × [i₂ p₂, (i₂+1) p₂)``.
    """
    big1, big2 = check_int_pair(patches, "patches")
    check_tensor(x, name, 4, "(B, s1, s2, C)")
    batch, s1, s2, channels = x.shape
    if s1 % big1 or s2 % big2 or 0 in (s1, s2):
        raise ValueError(f"{name}: expected a grid s1 × s2 that the patches ({big1}, {big2}) "
                         f"divide (s_i a positive multiple of P_i), got {s1} × {s2}")
    p1, p2 = s1 // big1, s2 // big2
    tiles = x.reshape(batch, big1, p1, big2, p2, channels).permute(0, 1, 3, 2, 4, 5)
    return tiles.reshape(batch, big1 * big2, p1, p2, channels)


def unpatchify(x: Tensor, patches: int | tuple[int, int]) -> Tensor:
    """The inverse of :func:`patchify`: ``(B, P₁·P₂, p₁, p₂, C)`` → ``(B, P₁p₁, P₂p₂, C)``."""
    big1, big2 = check_int_pair(patches, "patches")
    check_tensor(x, "x", 5, "(B, P, p1, p2, C)")
    batch, p, p1, p2, channels = x.shape
    if p != big1 * big2:
        raise ValueError(f"x: expected shape (B, P, p1, p2, C) with P = {big1} · {big2} = "
                         f"{big1 * big2} patches, got {tuple(x.shape)}")
    tiles = x.reshape(batch, big1, big2, p1, p2, channels).permute(0, 1, 3, 2, 4, 5)
    return tiles.reshape(batch, big1 * p1, big2 * p2, channels)


def even_extension(x: Tensor) -> Tensor:
    """Mirror ``x (..., p₁, p₂, C)`` evenly to ``(..., 2p₁, 2p₂, C)``:
    ``[[x, flip₂ x], [flip₁ x, flip₁₂ x]]``.

    Each edge point is repeated (the half-sample reflection of cell-centred data), so the
    ``2p``-periodic continuation of the result has no jump at the patch boundary, where the
    ``p``-periodic continuation of ``x`` itself generally has one.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x: expected a tensor of shape (..., p1, p2, C), got "
                        f"{type(x).__name__}")
    if x.dim() < 3:
        raise ValueError(f"x: expected shape (..., p1, p2, C), got {tuple(x.shape)}")
    rows = torch.cat([x, x.flip(-2)], dim=-2)
    return torch.cat([rows, rows.flip(-3)], dim=-3)


def periodic_extension(operator: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """The FANO's periodic patch extension (SPEC-continuum §2, our definition; the paper gives
    none): ``operator`` on the even extension of the patches, cropped back to the patch.

    A Fourier operator treats its input as periodic; on a patch of a non-periodic field that
    means a jump at the patch edge and the ringing it causes. The even extension is continuous
    across the edges, so the operator sees a periodic function without that jump.

    Args:
        operator: maps ``(N, 2p₁, 2p₂, C)`` to ``(N, 2p₁, 2p₂, C′)`` (e.g. a
            :class:`~galerkin_ext.layers.SpectralConv`).
        x: ``(N, p₁, p₂, C)`` patches.

    Returns:
        ``(N, p₁, p₂, C′)``.
    """
    check_tensor(x, "x", 4, "(N, p1, p2, C)")
    if not callable(operator):
        raise TypeError(f"operator: expected a callable, got {type(operator).__name__}")
    n, p1, p2, _ = x.shape
    out = operator(even_extension(x))
    if not isinstance(out, Tensor) or out.dim() != 4 or tuple(out.shape[:3]) != (n, 2 * p1,
                                                                                  2 * p2):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"operator: expected an output of shape (N, 2p1, 2p2, C') = ({n}, "
                         f"{2 * p1}, {2 * p2}, C') for the extended patches, got {got}")
    return out[:, :p1, :p2]


class SpectralSmoothing(nn.Module):
    """Smoothing of a periodic field: Fourier mode ``k`` is multiplied by ``(1 + ε|k|²)^(-α)``.

    ``k = (k₁, k₂)`` are the integer wavenumbers of the periodic ``s₁ × s₂`` grid
    (``rfft2`` order, the Nyquist mode of an even axis as ``|k_i| = s_i/2``). Constants pass
    unchanged and the multiplier is even in ``k``, so real fields stay real. No parameters; the
    multipliers follow the grid of every call. The paper's Kolmogorov run (Fig. 18):
    ``ε = 1e-3``, ``α = 1.001``.

    Args:
        eps: ``ε >= 0``.
        alpha: ``α >= 0``.

    Input and output ``(B, s₁, s₂, C)``.
    """

    def __init__(self, eps: float, alpha: float) -> None:
        super().__init__()
        self.eps = check_float(eps, "eps", low_inclusive=True)
        self.alpha = check_float(alpha, "alpha", low_inclusive=True)

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}, alpha={self.alpha:g}"

    def multiplier(self, s1: int, s2: int, device: torch.device | None = None) -> Tensor:
        """``(s₁, s₂//2 + 1)`` float64 multipliers of the ``rfft2`` modes of an ``s₁ × s₂``
        grid."""
        s1, s2 = check_int(s1, "s1"), check_int(s2, "s2")
        k1 = torch.fft.fftfreq(s1, 1.0 / s1, dtype=torch.float64, device=device)
        k2 = torch.fft.rfftfreq(s2, 1.0 / s2, dtype=torch.float64, device=device)
        return (1.0 + self.eps * (k1[:, None] ** 2 + k2[None, :] ** 2)) ** (-self.alpha)

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, s₁, s₂, C)`` → ``(B, s₁, s₂, C)``."""
        check_tensor(x, "x", 4, "(B, s1, s2, C)")
        batch, s1, s2, _ = x.shape
        if batch == 0 or 0 in x.shape[1:]:  # MKL's FFT refuses empty tensors
            return x
        # Half types: FFTs in float32 (half-precision FFTs need power-of-two sizes on CUDA).
        work = x.to(opmath_dtype(x))
        spectrum = torch.fft.rfft2(work, dim=(1, 2))
        factor = self.multiplier(s1, s2, x.device).to(work.dtype)[None, :, :, None]
        return torch.fft.irfft2(spectrum * factor, s=(s1, s2), dim=(1, 2)).to(x.dtype)


class PatchedAttention(nn.Module):
    """Multi-head patched attention on patch tokens: ``W_o · concat_h A_h``, each head ``A_h``
    :func:`galerkin_ext.ops.patched_attention` on ``d_model / H`` channels.

    ``Q``, ``K``, ``V`` act on every patch: pointwise ``Linear(d_model, d_model)`` with bias
    (ViT NO, ``qkv_modes=None``: ``query``, ``key``, ``value``), or each a Fourier integral
    operator over the patch without bias, ``SpectralConv(d_model, d_model, qkv_modes)`` (FANO;
    the three stacked as one :class:`~galerkin_ext.layers.SpectralConv` ``qkv`` with
    ``3 d_model`` outputs, ``[Q, K, V]``); ``patch_extension='periodic'`` applies those to
    the mirrored patch (:func:`periodic_extension`). ``W_o`` is ``Linear(d_model, d_model)``
    with bias, pointwise.

    The cell weight, which sits inside the exponential and so must follow the grid, is derived
    on every call: ``1 / (P p₁ p₂) = |D| / (s₁s₂)`` for ``P`` patches that tile a domain of
    volume 1 (the models' coordinates lie in ``[0, 1]²``). Nothing grid-dependent is stored.

    Args:
        d_model: channels; ``n_head`` must divide it.
        n_head: heads ``H``.
        qkv_modes: ``None`` for pointwise ``Q``, ``K``, ``V``; else the modes of their spectral
            convolutions.
        patch_extension: ``None`` or ``'periodic'`` (spectral ``Q``, ``K``, ``V`` only).
        scale: the logits' factor (the paper: 1).

    Parameters: pointwise ``4 (d_model² + d_model)``; spectral
    ``3 · 2 d_model² qkv_modes² + d_model² + d_model``.
    """

    def __init__(self, d_model: int, n_head: int, *, qkv_modes: int | None = None,
                 patch_extension: str | None = None, scale: float = 1.0) -> None:
        super().__init__()
        self.d_model = check_int(d_model, "d_model")
        self.n_head = check_heads(n_head, d_model)
        self.d_head = d_model // n_head
        self.scale = check_scale(scale, 1.0)
        self.patch_extension = check_choice(patch_extension, "patch_extension", PATCH_EXTENSIONS)
        self.qkv_modes = None if qkv_modes is None else check_int(qkv_modes, "qkv_modes")
        if qkv_modes is None:
            if patch_extension is not None:
                raise ValueError(f"patch_extension: {patch_extension!r} extends the patches "
                                 "for spectral Q, K, V (pointwise ones do not see the patch "
                                 "edges); pass qkv_modes or patch_extension=None")
            # nn.Linear's own initialisation, as in the authors' ViT NO.
            self.query, self.key, self.value = (nn.Linear(d_model, d_model) for _ in range(3))
        else:
            # Q, K and V as one operator with 3 d_model outputs: one FFT of the patches instead
            # of three (the per-mode channel mixing is the same). Initialised as the authors'
            # per-head operators (d_model → d_head each): real and imaginary parts
            # U(0, 1/(d_model d_head)), H times SpectralConv's bound for one d_model → d_model.
            self.qkv = SpectralConv(d_model, 3 * d_model, qkv_modes)
            with torch.no_grad():
                for weight in (self.qkv.weight_pos, self.qkv.weight_neg):
                    torch.view_as_real(weight).uniform_(0.0, 1.0 / (d_model * self.d_head))
        self.out_proj = nn.Linear(d_model, d_model)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_head={self.n_head}, qkv_modes={self.qkv_modes}, "
                f"patch_extension={self.patch_extension}, scale={self.scale:g}")

    def forward(self, x: Tensor, *, cell_weight: float | Tensor | None = None) -> Tensor:
        """Self-attention among the patches of ``x``.

        Args:
            x: ``(B, P, p₁, p₂, d_model)`` patch tokens.
            cell_weight: the in-patch cell volumes ``ω``, a float or ``(p₁ p₂,)`` tensor; by
                default ``1 / (P p₁ p₂)``, derived from ``x``'s grid.

        Returns:
            ``(B, P, p₁, p₂, d_model)``.
        """
        check_tensor(x, "x", 5, "(B, P, p1, p2, d_model)", self)
        batch, p, p1, p2, channels = x.shape
        if channels != self.d_model or 0 in (p, p1, p2):
            raise ValueError(f"x: expected shape (B, P, p1, p2, d_model) with P, p1, p2 >= 1 and "
                             f"d_model = {self.d_model}, got {tuple(x.shape)}")
        n = p1 * p2
        if cell_weight is None:
            cell_weight = 1.0 / (p * n)
        projected: Sequence[Tensor]
        if self.qkv_modes is None:
            projected = [proj(x) for proj in (self.query, self.key, self.value)]
        else:  # one Fourier operator per patch: the patches form the batch
            patches = x.reshape(batch * p, p1, p2, channels)
            qkv = (self.qkv(patches) if self.patch_extension is None
                   else periodic_extension(self.qkv, patches))
            projected = qkv.chunk(3, dim=-1)

        def heads(t: Tensor) -> Tensor:  # (B, P, p1, p2, H·d) → (B, H, P, n, d)
            return t.reshape(batch, p, n, self.n_head, self.d_head).permute(0, 3, 1, 2, 4)

        q, k, v = (heads(t) for t in projected)
        out = ops.patched_attention(q, k, v, cell_weight, scale=self.scale)
        out = out.permute(0, 2, 3, 1, 4).reshape(batch, p, p1, p2, channels)
        return self.out_proj(out)


class PatchedEncoderLayer(nn.Module):
    """The ViT NO's and FANO's post-LN encoder layer on patch tokens (paper eq. 10 with
    ``W₁ = W₂ = I``):

        x ← LN(x + Drop(W_o · heads(x)))
        x ← LN(x + Drop(Lin(GELU(Lin(x)))))

    with :class:`PatchedAttention`; the feed-forward block and the norms act on the channels of
    each point. At ``d_model = dim_feedforward = 128`` with pointwise ``Q``, ``K``, ``V`` the
    layer has 99,584 parameters (as the TNO's).

    Args:
        d_model, n_head, qkv_modes, patch_extension, scale: the attention, see
            :class:`PatchedAttention`.
        dim_feedforward: hidden width of the feed-forward block (``None``: ``d_model``,
            :func:`~galerkin_ext.layers.continuum.feedforward_width`).
        dropout: on the two residual branches (the paper: 1e-4).
        activation: of the feed-forward block (``'gelu'``, ``'relu'`` or ``'silu'``).
        eps: of the two layer norms.

    Input and output ``(B, P, p₁, p₂, d_model)``.
    """

    def __init__(self, d_model: int, n_head: int, dim_feedforward: int | None = None,
                 dropout: float = 1e-4, *, qkv_modes: int | None = None,
                 patch_extension: str | None = None, scale: float = 1.0,
                 activation: str = "gelu", eps: float = 1e-5) -> None:
        super().__init__()
        self.attn = PatchedAttention(d_model, n_head, qkv_modes=qkv_modes,
                                     patch_extension=patch_extension, scale=scale)
        hidden = feedforward_width(dim_feedforward, d_model)
        self.linear1 = nn.Linear(d_model, hidden)
        self.activation = make_activation(activation)
        self.linear2 = nn.Linear(hidden, d_model)
        self.dropout1 = Dropout(check_probability(dropout, "dropout"))
        self.dropout2 = Dropout(dropout)
        eps = check_float(eps, "eps")
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: Tensor, *, cell_weight: float | Tensor | None = None) -> Tensor:
        """``x (B, P, p₁, p₂, d_model)`` → ``(B, P, p₁, p₂, d_model)``; ``cell_weight`` as
        :meth:`PatchedAttention.forward` (default derived from the grid)."""
        x = self.norm1(x + self.dropout1(self.attn(x, cell_weight=cell_weight)))
        return self.norm2(x + self.dropout2(self.linear2(self.activation(self.linear1(x)))))
