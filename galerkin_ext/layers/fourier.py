"""Fourier layers of the continuum-attention models (SPEC-continuum §2), channels-last:

* :class:`SpectralConv` — the Fourier integral operator ``F⁻¹(R · F u)`` of the ViT NO, FANO and
  the FNO baseline: complex channel mixing per retained mode, no bias, no pointwise residual
  (unlike :class:`~galerkin_ext.layers.SpectralConv2d` of the Galerkin Transformer models),
  with mode skipping so that one set of weights runs on any grid.
* :class:`AFNOFilter`, :class:`AFNOBlock` — the Adaptive Fourier Neural Operator's token mixer
  (a block-diagonal complex MLP on every mode) and its pre-norm block.

:func:`spectral_product` is the product of every spectral convolution of the package (these and
:class:`~galerkin_ext.layers.SpectralConv1d`, :class:`~galerkin_ext.layers.SpectralConv2d`).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import (
    check_float,
    check_int,
    check_spectral_product,
    check_tensor,
    without_size_guards,
)
from ..functional import opmath_dtype
from .activation import make_activation

__all__ = ["AFNOBlock", "AFNOFilter", "SpectralConv"]


def spectral_dtypes(x: Tensor) -> tuple[torch.dtype, torch.dtype]:
    """The dtype an FFT layer computes in for input ``x``, and the one it returns: half types
    compute in float32 (half-precision FFTs are power-of-two only on CUDA and missing for
    bfloat16 on the CPU); the result is in ``x``'s dtype (a ``.bfloat16()`` model's next layer
    expects it), except under autocast, which keeps float32 results as for its float32 ops."""
    work = opmath_dtype(x)
    autocast = x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type)
    return work, work if autocast else x.dtype


def spectral_product(x: Tensor, weight: Tensor, n_pos: int, norm: str) -> Tensor:
    """``irfft2(W(k) · rfft2(x)(k))`` over the kept modes ``k``, every other mode zero: each kept
    mode's coefficients are mixed by its own complex ``(c_in, c_out)`` matrix.

    Args:
        x: ``(B, p₁, p₂, c_in)`` float32 or float64, the dtype to compute in (``B >= 1``).
        weight: ``(c_in, c_out, R, K)`` complex (taken at ``x``'s precision), one matrix per
            kept mode: rows ``k₁ = 0 … n_pos - 1``, then ``k₁ = -(R - n_pos) … -1``; columns
            ``k₂ = 0 … K - 1`` (``R <= p₁``, ``K <= p₂ // 2 + 1``).
        n_pos: how many rows have ``k₁ >= 0``.
        norm: ``torch.fft``'s ``'backward'`` or ``'ortho'``.

    Returns ``(B, p₁, p₂, c_out)`` in ``x``'s dtype.

    On the CPU, where the kept columns are few (``K <= 24`` and ``2 K < p₂``), the transforms
    are products with the kept rows of the DFT matrices instead of FFTs: they compute only the
    kept modes, and MKL's matrix products run near peak where the FFTs of sides such as 85, 141
    or 211 points (factors 17, 47, 211) do not (measured by ``benchmarks/spectral_cpu.py``:
    the README's benchmarks). Other devices run the FFTs, and so do programs being exported or
    traced (one program for every size and device, without a guard on the sizes) and FLOP
    counts (:func:`ffts_only`); ``torch.compile`` takes the rule as a guard on the sizes
    (from torch 2.7: ``_checks.without_size_guards``).
    """
    check_spectral_product(x, weight, n_pos, norm)
    weight = weight.to(torch.promote_types(x.dtype, torch.complex64))
    if _matmuls_pay(x, weight.shape[3], x.shape[2]):
        with torch.autocast("cpu", enabled=False):  # autocast would run the products in bf16
            return _spectral_product_matmul(x, weight, n_pos, norm)
    return _spectral_product_fft(x, weight, n_pos, norm)


def spectral_product_1d(x: Tensor, weight: Tensor, norm: str) -> Tensor:
    """``irfft(W(k) · rfft(x)(k))`` over the modes ``k = 0 … K - 1``: :func:`spectral_product`
    on a line. ``x (B, n, c_in)`` real, ``weight (c_in, c_out, K)`` complex
    (``K <= n // 2 + 1``) → ``(B, n, c_out)``; the same choice of path."""
    check_spectral_product(x, weight, None, norm, line=True)
    if _matmuls_pay(x, weight.shape[2], x.shape[1]):  # as a grid of one row, k₁ = 0
        return spectral_product(x[:, None], weight[:, :, None], 1, norm)[:, 0]
    weight = weight.to(torch.promote_types(x.dtype, torch.complex64))
    x_ft = torch.fft.rfft(x.transpose(1, 2), norm=norm)[..., : weight.shape[2]]
    # irfft zero-pads the spectrum beyond the kept modes up to n // 2 + 1.
    out_ft = torch.einsum("bix,iox->box", x_ft, weight)
    # contiguous channels-last, as the matrix path's: the layers after would run strided
    return torch.fft.irfft(out_ft, n=x.shape[1], norm=norm).transpose(1, 2).contiguous()


# The most kept columns the DFT-matrix products take: their work grows with the columns and the
# FFTs' does not (one Xeon thread, 2-D grids of 66-128 points a side: forward 1.01-1.18x the
# FFTs' at K = 32, 0.58-0.89x at K = 48, benchmarks/results/spectral_cpu_k32_xeon.json; with
# 2 K < p₂ they won at every K <= 24 of spectral_cpu_xeon.json).
_MATMUL_MAX_COLUMNS = 24

# ffts_only()'s flag, per thread as the FLOP counters' totals are (torch dispatch modes).
_fft_state = threading.local()


def _matmuls_pay(x: Tensor, cols: int, length: int) -> bool:
    """Whether the spectral products run as DFT-matrix products: on the CPU, with ``cols``
    kept columns of the real FFT's axis of ``length`` points, ``cols <= 24`` and
    ``2 cols < length``; never while a program without guards on its sizes is built (exported
    or traced; with torch < 2.7 any compiled one) or while this thread counts FLOPs."""
    if x.device.type != "cpu" or without_size_guards():
        return False
    return (not getattr(_fft_state, "only", False) and cols <= _MATMUL_MAX_COLUMNS
            and 2 * cols < length)


@contextlib.contextmanager
def ffts_only() -> Iterator[None]:
    """Inside, in this thread, :func:`spectral_product` runs its FFTs on every device: the FLOP
    counts of :mod:`galerkin_ext.complexity` count FFTs by the paper's convention, and so count
    the same on the CPU as on the meta device."""
    previous = getattr(_fft_state, "only", False)
    _fft_state.only = True
    try:
        yield
    finally:
        _fft_state.only = previous


def _spectral_product_fft(x: Tensor, weight: Tensor, n_pos: int, norm: str) -> Tensor:
    """:func:`spectral_product` through ``rfft2`` and ``irfft2``."""
    batch, p1, p2, _ = x.shape
    _, c_out, rows, cols = weight.shape
    x_ft = torch.fft.rfft2(x, dim=(1, 2), norm=norm)
    # The spectrum is assembled out of place (no writes into a zero tensor), so that
    # torch.func.vmap over the weights alone (ensembles) works.
    pos = torch.einsum("bxyi,ioxy->bxyo", x_ft[:, :n_pos, :cols], weight[:, :, :n_pos])
    neg = torch.einsum("bxyi,ioxy->bxyo", x_ft[:, p1 - (rows - n_pos):, :cols],
                       weight[:, :, n_pos:])
    middle = pos.new_zeros(batch, p1 - rows, cols, c_out)
    # zeros concatenated, not F.pad: inductor's backward of a padded complex spectrum failed
    # a stride assertion at dynamic sizes (torch 2.13)
    high = pos.new_zeros(batch, p1, p2 // 2 + 1 - cols, c_out)
    out_ft = torch.cat([torch.cat([pos, middle, neg], dim=1), high], dim=2)
    # contiguous channels-last, as the matrix path's: the layers after would run strided
    return torch.fft.irfft2(out_ft, s=(p1, p2), dim=(1, 2), norm=norm).contiguous()


def _dft_rows(freqs: Tensor, n: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``2π k j / n`` for the wavenumbers ``k`` of ``freqs`` (rows) and
    ``j < n`` (columns), in ``dtype``: the angles come from the integers ``k j mod n`` and are
    taken in float64, so every entry is correctly rounded whatever ``n``."""
    j = torch.arange(n, device=freqs.device)
    angle = ((freqs[:, None] * j) % n).to(torch.float64) * (2 * math.pi / n)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def _spectral_product_matmul(x: Tensor, weight: Tensor, n_pos: int, norm: str) -> Tensor:
    """:func:`spectral_product` with the transforms as products with the kept rows of the DFT
    matrices; real arithmetic throughout, each complex product as the blocks of a real one.

    Every tensor of the grid's size stays channels-last and contiguous, as are ``x`` and the
    result, and so is ``x``'s gradient: products along ``p₂`` are batched over ``(B, p₁)``,
    products along ``p₁`` take ``(p₂, c)`` as one axis; only the spectrum is permuted.
    Transforms over ``(B, c, p₁, p₂)`` had handed back a channel-major gradient, which every
    layer before took on (in the Burgers model's backward, the encoder's residual stream: each
    of its additions strided, each of its Linear layers copying); benchmarks/table1.py
    ``--impls ours,ours_fft`` times whole training steps.
    """
    batch, p1, p2, c_in = x.shape
    _, c_out, rows, cols = weight.shape
    device, dtype = x.device, x.dtype
    k1 = torch.cat([torch.arange(n_pos, device=device),
                    torch.arange(p1 - (rows - n_pos), p1, device=device)])
    k2 = torch.arange(cols, device=device)
    cos1, sin1 = _dft_rows(k1, p1, dtype)  # (R, p₁)
    cos2, sin2 = _dft_rows(k2, p2, dtype)  # (K, p₂)
    forward_scale = 1 / math.sqrt(p1 * p2) if norm == "ortho" else 1.0
    inverse_scale = 1 / math.sqrt(p1 * p2) if norm == "ortho" else 1 / (p1 * p2)

    # Forward. Along p₂, real: Z = [Zr; Zi] with Zr = Σ cos x, Zi = -Σ sin x.
    z = (torch.cat([cos2, -sin2]) * forward_scale) @ x  # (B, p₁, 2K, c)
    # Along p₁, complex: Σ (c - i s)(Zr + i Zi) = Σ (c Zr + s Zi) + i (c Zi - s Zr), from the
    # four blocks of [c; -s] Z.
    blocks = (torch.cat([cos1, -sin1]) @ z.reshape(batch, p1, 2 * cols * c_in)).view(
        batch, 2 * rows, 2 * cols, c_in)
    re = blocks[:, :rows, :cols] - blocks[:, rows:, cols:]  # (B, R, K, c)
    im = blocks[:, :rows, cols:] + blocks[:, rows:, :cols]

    # Each mode's mixing: [re; im] (2B rows) times [Wr | Wi] holds the four real products.
    spectrum = torch.cat([re, im]).permute(1, 2, 0, 3).reshape(rows * cols, 2 * batch, c_in)
    # (real and imaginary parts stacked, not view_as_real: its backward in torch 2.5 refuses the
    # permuted gradient, and it refuses lazily conjugated weights)
    w = torch.stack([weight.real, weight.imag], dim=-1).permute(2, 3, 0, 4, 1).reshape(
        rows * cols, c_in, 2 * c_out)
    mixed = torch.bmm(spectrum, w).view(rows, cols, 2 * batch, 2 * c_out)
    out_re = (mixed[:, :, :batch, :c_out] - mixed[:, :, batch:, c_out:]).permute(2, 0, 1, 3)
    out_im = (mixed[:, :, :batch, c_out:] + mixed[:, :, batch:, :c_out]).permute(2, 0, 1, 3)

    # Inverse. Along p₁, complex: Σ (c + i s)(Yr + i Yi) = [c | -s] [[Yr, Yi], [Yi, -Yr]].
    stacked = torch.cat([torch.cat([out_re, out_im], dim=2),
                         torch.cat([out_im, -out_re], dim=2)], dim=1)  # (B, 2R, 2K, c_out)
    w1 = torch.cat([cos1.mT, -sin1.mT], dim=1) @ stacked.reshape(batch, 2 * rows,
                                                                 2 * cols * c_out)
    # Along p₂, to real values: Σ_k c_k (Re cos - Im sin), c_k = 2 for the modes that stand for
    # their conjugates too, 1 for k₂ = 0 and the Nyquist mode (whose imaginary parts drop out,
    # as irfft drops them).
    twice = ((k2 != 0) & (2 * k2 != p2)).to(dtype) + 1
    factor = (twice * inverse_scale)[:, None]
    return torch.cat([cos2 * factor, -sin2 * factor]).mT @ w1.view(batch, p1, 2 * cols, c_out)


def _complex_dtype(real: torch.dtype) -> torch.dtype:
    """The complex dtype of weights in a model of dtype ``real``: complex128 for float64,
    complex64 otherwise (FFTs in half precision are poorly supported and the weights are
    few)."""
    return torch.complex128 if real == torch.float64 else torch.complex64


def _apply_to_complex(fn: Callable[[Tensor], Tensor], t: Tensor) -> Tensor:
    """``fn`` (a ``Module._apply`` conversion) on a complex tensor through its real view: a
    real dtype becomes the matching complex one (:func:`_complex_dtype`)."""
    real = torch.view_as_real(t)
    # The (re, im) pairs folded into the last axis keep t's rank, which a conversion may
    # depend on: to(memory_format=torch.channels_last) takes 4-D tensors only.
    converted = fn(real.flatten(-2) if t.dim() else real)
    if converted.is_complex():  # an explicit complex target dtype
        return fn(t)
    if converted.dtype in (torch.float32, torch.float64):
        return torch.view_as_complex(converted.reshape(real.shape).contiguous())
    return t.to(converted.device, _complex_dtype(converted.dtype))


class _ComplexParametersModule(nn.Module):
    """A module whose complex parameters survive real-dtype conversions.

    ``nn.Module.to(torch.float64)`` casts complex parameters to float64, silently dropping
    their imaginary parts, and ``.double()`` leaves them complex64; here both give complex128
    (``.float()`` complex64), so the usual model conversions keep the operator.
    """

    def _apply(self, fn, recurse=True):  # nn.Module's (untyped) signature
        names = [name for name, p in self._parameters.items() if p is not None and p.is_complex()]
        hidden = {name: self._parameters[name] for name in names}
        for name in names:  # None keeps the registration order (state_dict keys) intact
            self._parameters[name] = None
        try:
            super()._apply(fn, recurse)
        finally:
            self._parameters.update(hidden)
        with torch.no_grad():
            for name, p in hidden.items():
                data = _apply_to_complex(fn, p)
                grad = None if p.grad is None else _apply_to_complex(fn, p.grad)
                # as nn.Module does: in place where the tensor types allow it (the optimiser
                # keeps its reference), a new Parameter across them (to and from 'meta')
                if (torch._has_compatible_shallow_copy_type(p, data)
                        and not torch.__future__.get_overwrite_module_params_on_conversion()):
                    p.data = data
                    if grad is not None:
                        p.grad = grad
                else:
                    self._parameters[name] = nn.Parameter(data, p.requires_grad)
                    self._parameters[name].grad = grad
        return self


def _at_most(modes: int, resolved: int) -> int:
    """``min(modes, resolved)`` as a comparison: under ``torch.export`` with dynamic sizes it
    becomes a guard that the sizes' range decides, where a symbolic ``min`` stays in the shapes
    and leaves guards the exporter cannot prove."""
    return modes if resolved >= modes else resolved


class SpectralConv(_ComplexParametersModule):
    """Fourier integral operator on a periodic 2-D grid: ``irfft2(R(k) · rfft2(x)(k))``.

    The first axis keeps wavenumbers ``k₁ ∈ [-m, m)`` (two blocks of weights, ``weight_pos`` for
    ``k₁ ∈ [0, m)`` and ``weight_neg`` for ``k₁ ∈ [-m, -1]``), the second axis (the real FFT's
    half axis) ``k₂ ∈ [0, m₂)`` with ``m₂ = last_modes`` (default ``m``). Each retained mode mixes
    the channels with its own complex ``(c_in, c_out)`` matrix; all other modes are zero.
    FFT norm ``"backward"``; no bias.

    **Mode skipping.** On a ``p₁ × p₂`` grid, modes with ``|k_i| > ⌊(p_i - 1)/2⌋`` are left out
    (they alias or are the unpaired Nyquist mode), so the layer runs on any grid, patches of
    8² with ``m = 12`` included, and a band-limited input gives the same function on every grid
    that resolves it.

    Weights are complex parameters (a complex entry counts once in ``numel``), initialised with
    real and imaginary parts ``U(0, 1/(c_in c_out))``; complex128 when the default dtype is
    float64 (``torch.set_default_dtype``), else complex64. ``model.to(torch.float64)`` and
    ``model.double()`` make them complex128.

    Args:
        in_channels, out_channels: ``c_in``, ``c_out``.
        modes: ``m``, the retained wavenumbers per sign along the first axis.
        last_modes: ``m₂``, along the second axis (default ``m``).

    Input ``(B, p₁, p₂, c_in)``, output ``(B, p₁, p₂, c_out)``, any ``p₁, p₂ >= 1``.
    """

    def __init__(self, in_channels: int, out_channels: int, modes: int,
                 last_modes: int | None = None) -> None:
        super().__init__()
        self.in_channels = check_int(in_channels, "in_channels")
        self.out_channels = check_int(out_channels, "out_channels")
        self.modes = check_int(modes, "modes")
        self.last_modes = self.modes if last_modes is None else check_int(last_modes,
                                                                          "last_modes")
        shape = (in_channels, out_channels, self.modes, self.last_modes)
        bound = 1.0 / (in_channels * out_channels)
        dtype = _complex_dtype(torch.get_default_dtype())  # as real parameters follow it
        self.weight_pos = nn.Parameter(torch.empty(shape, dtype=dtype))
        self.weight_neg = nn.Parameter(torch.empty(shape, dtype=dtype))
        with torch.no_grad():
            for weight in (self.weight_pos, self.weight_neg):
                torch.view_as_real(weight).uniform_(0.0, bound)

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
                f"modes={self.modes}, last_modes={self.last_modes}")

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, p₁, p₂, in_channels)`` → ``(B, p₁, p₂, out_channels)``."""
        check_tensor(x, "x", 4, "(B, p1, p2, in_channels)", self)
        batch, p1, p2, channels = x.shape
        if channels != self.in_channels or 0 in (p1, p2):
            raise ValueError(f"x: expected shape (B, p1, p2, in_channels) with p1, p2 >= 1 and "
                             f"in_channels = {self.in_channels}, got {tuple(x.shape)}")
        if batch == 0:  # MKL's FFT refuses an empty batch
            return x.new_zeros(0, p1, p2, self.out_channels)
        # The largest |k| each axis resolves without aliasing or a Nyquist mode.
        n_pos = _at_most(self.modes, (p1 - 1) // 2 + 1)  # k₁ = 0 .. n_pos - 1
        n_neg = _at_most(self.modes, (p1 - 1) // 2)  # k₁ = -n_neg .. -1
        n_last = _at_most(self.last_modes, (p2 - 1) // 2 + 1)
        work, result = spectral_dtypes(x)
        # weight_neg[..., j, :] holds k₁ = j - m: the last n_neg rows are k₁ = -n_neg .. -1
        weight = torch.cat([self.weight_pos[:, :, :n_pos, :n_last],
                            self.weight_neg[:, :, self.modes - n_neg:, :n_last]], dim=2)
        return spectral_product(x.to(work), weight, n_pos, "backward").to(result)


def _complex(real: Tensor, imag: Tensor) -> Tensor:
    """``torch.complex(real, imag)``; compiled, built from stacked parts instead, because
    inductor gets ``torch.complex`` wrong, silently (torch 2.5 reads ``.real`` / ``.imag`` of one
    made in the graph wrongly: the AFNO filter's output off by 0.13 for a largest of 4.1; torch
    2.13: its ``w2`` gradient off by 1.8 for a largest of 0.95). Eager keeps ``torch.complex``:
    the stacked form cost the filter 6–9 % there."""
    if torch.compiler.is_compiling():
        return torch.view_as_complex(torch.stack([real, imag], dim=-1))
    return torch.complex(real, imag)


class AFNOFilter(nn.Module):
    """The AFNO token mixer: ``x + irfft2(S_λ(MLP(rfft2(x))))`` on a 2-D grid.

    ``rfft2`` (norm ``"ortho"``) over the grid, then on every mode a block-diagonal complex
    two-layer MLP on the channels (``num_blocks`` blocks of ``d_model / num_blocks``; ReLU on the
    real and imaginary parts of the hidden layer), soft-shrinkage ``S_λ`` of the real and
    imaginary parts (``λ = sparsity_threshold``), ``irfft2``, plus the filter's input. No mode
    truncation.

    The complex weights are stored as real tensors with a leading ``(re, im)`` axis — ``w1``,
    ``w2`` of shape ``(2, num_blocks, block, block)``, ``b1``, ``b2`` of shape
    ``(2, num_blocks, block)`` — so each complex entry is two parameters
    (``4 d_model (block + 1)`` in all).

    Args:
        d_model: channels; ``num_blocks`` must divide it.
        num_blocks: ``b``, the number of diagonal blocks.
        sparsity_threshold: ``λ >= 0``.
        init_scale: the weights are ``init_scale · N(0, 1)``.

    Input and output ``(B, s₁, s₂, d_model)``.
    """

    def __init__(self, d_model: int, num_blocks: int = 8, sparsity_threshold: float = 0.01,
                 init_scale: float = 0.02) -> None:
        super().__init__()
        self.d_model = check_int(d_model, "d_model")
        self.num_blocks = check_int(num_blocks, "num_blocks")
        if d_model % num_blocks:
            raise ValueError(f"num_blocks: expected a divisor of d_model = {d_model}, "
                             f"got {num_blocks}")
        self.block = d_model // num_blocks
        self.sparsity_threshold = check_float(sparsity_threshold, "sparsity_threshold",
                                              low_inclusive=True)
        scale = check_float(init_scale, "init_scale")
        square, vector = (2, num_blocks, self.block, self.block), (2, num_blocks, self.block)
        self.w1 = nn.Parameter(scale * torch.randn(square))
        self.b1 = nn.Parameter(scale * torch.randn(vector))
        self.w2 = nn.Parameter(scale * torch.randn(square))
        self.b2 = nn.Parameter(scale * torch.randn(vector))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_blocks={self.num_blocks}, "
                f"sparsity_threshold={self.sparsity_threshold}")

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, s₁, s₂, d_model)`` → ``(B, s₁, s₂, d_model)``."""
        check_tensor(x, "x", 4, "(B, s1, s2, d_model)", self)
        batch, s1, s2, channels = x.shape
        if channels != self.d_model:
            raise ValueError(f"x: expected shape (B, s1, s2, d_model) with d_model = "
                             f"{self.d_model}, got {tuple(x.shape)}")
        if batch == 0:
            return x
        work, result = spectral_dtypes(x)
        x_ft = torch.fft.rfft2(x.to(work), dim=(1, 2), norm="ortho")
        x_ft = x_ft.reshape(*x_ft.shape[:3], self.num_blocks, self.block)
        hidden = self._complex_linear(x_ft, self.w1, self.b1)
        hidden = _complex(F.relu(hidden.real), F.relu(hidden.imag))
        out = self._complex_linear(hidden, self.w2, self.b2)
        out = _complex(F.softshrink(out.real, self.sparsity_threshold),
                       F.softshrink(out.imag, self.sparsity_threshold))
        out = out.reshape(*out.shape[:3], channels)
        return torch.fft.irfft2(out, s=(s1, s2), dim=(1, 2), norm="ortho").to(result) + x

    @staticmethod
    def _complex_linear(z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """Per block: ``z (..., nb, block) @ (W_re + i W_im) + (b_re + i b_im)``."""
        weight, bias = weight.to(z.real.dtype), bias.to(z.real.dtype)
        w = _complex(weight[0], weight[1])
        b = _complex(bias[0], bias[1])
        return torch.einsum("...ni,nio->...no", z, w) + b


class AFNOBlock(nn.Module):
    """Pre-norm AFNO block: ``x ← x + F(LN x)`` (``F`` = :class:`AFNOFilter`, which adds its own
    input), then ``x ← x + MLP(LN x)`` with ``MLP = Lin(d, r d) → GELU → Lin(r d, d)``.

    Args:
        d_model, num_blocks, sparsity_threshold: the filter.
        mlp_ratio: ``r``, the MLP's hidden width over ``d_model``.
        activation: of the MLP.
        eps: of the two layer norms.

    Input and output ``(B, s₁, s₂, d_model)``.
    """

    def __init__(self, d_model: int, num_blocks: int = 8, mlp_ratio: int = 4,
                 sparsity_threshold: float = 0.01, activation: str = "gelu",
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.filter = AFNOFilter(d_model, num_blocks, sparsity_threshold)
        self.norm1 = nn.LayerNorm(d_model, eps=check_float(eps, "eps"))
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        hidden = d_model * check_int(mlp_ratio, "mlp_ratio")
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), make_activation(activation),
                                 nn.Linear(hidden, d_model))

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, s₁, s₂, d_model)`` → ``(B, s₁, s₂, d_model)``."""
        check_tensor(x, "x", 4, "(B, s1, s2, d_model)", self)  # (before the norm's own check)
        x = x + self.filter(self.norm1(x))
        return x + self.mlp(self.norm2(x))
