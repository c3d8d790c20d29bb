"""Parameter and FLOP counts of models: the costs the continuum-attention paper sets its errors
against (its Table 2, Appendix C's Tables 4 and 5, Figures 10 and 11).

FLOPs follow the paper's convention (its Appendix C.2): a product of an ``r × r'`` matrix with
a vector costs ``2 r r'`` (so every matrix product, ours included, counts ``2 m n k``); a complex
FFT of length ``r`` costs ``5 r log2 r``, and a real FFT is counted as the complex transforms
along its last axis followed by those over the half spectrum along the other axes (the paper's
``(15/2) N log √N`` for an ``s × s`` grid); activations, softmax, normalisations, additions and
skip connections are not counted. The counts are taken, not derived: the model runs under
:class:`torch.utils.flop_counter.FlopCounterMode` with formulas for the package's compiled ops
and for the FFTs added to PyTorch's own. Run it on the ``meta`` device to count paper-sized
models without computing anything::

    with torch.device("meta"):
        model = build_model("fano")
        u, x = torch.empty(1, 416, 416, 1), torch.empty(416, 416, 2)
    forward_flops(model, u, x)   # FLOPs of one forward pass at 416²

Meta tensors hold no values: quadrature weights derived from coordinates (the TNO's default
``weight='auto'``) cannot be formed there; pass ``weight=None`` or explicit weights (the same
FLOPs).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from . import ops  # noqa: F401  (registers the compiled ops with their fake kernels: meta runs)
from ._checks import check_bool, check_int
from .layers.fourier import ffts_only

__all__ = ["flop_counter_mode", "flop_formulas", "forward_flops", "parameter_count"]

_aten = torch.ops.aten


def parameter_count(model: nn.Module) -> int:
    """The number of parameter entries of ``model`` (a complex entry counts once, as the
    paper's Table 4 counts spectral weights)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# FLOP formulas. FlopCounterMode calls each with the shapes of the op's tensor arguments (other
# arguments as they are) and out_shape.


def _product_flops(rows: int, inner: int, cols: int) -> int:
    return 2 * rows * inner * cols


def _kv_reduce_flops(k, v, *args, out_shape, **kwargs) -> int:
    """``S = K̂ᵀ W V̂``: one ``(d_k × M) (M × d_v)`` product per batch element and head."""
    b, h, dk, dv = out_shape
    return b * h * _product_flops(dk, k[2], dv)


def _kv_reduce_backward_flops(grad_s, k, *args, out_shape, **kwargs) -> int:
    """``dK̂ = V̂ dSᵀ`` and ``dV̂ = K̂ dS``: two products of the forward's size."""
    b, h, dk, dv = grad_s
    return 2 * b * h * _product_flops(dk, k[2], dv)


def _q_apply_flops(q, pos, q_map, q_norm_weight, q_norm_bias, s, *args, out_shape,
                   **kwargs) -> int:
    """``Q̂ S``: one ``(N × d_q) (d_q × W)`` product per batch element and head (the
    normalisers' divisions and the skip term are not counted)."""
    b, h, dq, w = s
    return b * h * _product_flops(q[2], dq, w)


def _q_apply_backward_flops(grad_out, q, pos, q_map, q_norm_weight, q_norm_bias, s, *args,
                            out_shape, **kwargs) -> int:
    """``dQ̂ = G' Sᵀ`` and ``dS = Q̂ᵀ G'``: two products of the forward's size."""
    b, h, dq, w = s
    return 2 * b * h * _product_flops(q[2], dq, w)


def _fft_length_flops(count: int, length: int) -> float:
    """``count`` complex FFTs of ``length`` points: ``5 r log2 r`` each."""
    return 5.0 * count * length * math.log2(length) if length > 1 else 0.0


def _fft_r2c_flops(x, dim, normalization, onesided, *args, out_shape, **kwargs) -> int:
    """Real-to-complex over ``dim``: the last axis of ``dim`` as given (the one torch halves,
    whatever its place in the tensor) as complex transforms of its full length, then the other
    axes over the output's (half) spectrum."""
    dims = [d % len(x) for d in dim]
    last = dims[-1]
    total = _fft_length_flops(math.prod(x) // x[last], x[last])
    for d in dims[:-1]:
        total += _fft_length_flops(math.prod(out_shape) // out_shape[d], out_shape[d])
    return round(total)


def _fft_c2r_flops(y, dim, normalization, last_dim_size, *args, out_shape, **kwargs) -> int:
    """Complex-to-real over ``dim``: the forward transform's count in reverse order."""
    dims = [d % len(y) for d in dim]
    last = dims[-1]
    total = sum(_fft_length_flops(math.prod(y) // y[d], y[d]) for d in dims[:-1])
    total += _fft_length_flops(math.prod(out_shape) // out_shape[last], out_shape[last])
    return round(total)


def _fft_c2c_flops(x, dim, normalization, forward, *args, out_shape, **kwargs) -> int:
    sizes = [x[d % len(x)] for d in dim]
    return round(sum(_fft_length_flops(math.prod(x) // n, n) for n in sizes))


def _pairwise_flops(query, key, value, *args, out_shape, **kwargs) -> int:
    """Attention through the ``N × M`` matrix, fused: ``Q Kᵀ`` and the product with ``V``, as
    PyTorch counts its GPU kernels. For the CPU's fused softmax attention, which it does not
    count, and the package's fused quadratic and softmax ops."""
    return flop_counter.sdpa_flop_count(query, key, value)


def _pairwise_backward_flops(grad_out, query, key, value, *args, out_shape, **kwargs) -> int:
    """Their backwards: ``Q Kᵀ`` recomputed, then ``dP``, ``dV``, ``dQ`` and ``dK``."""
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


def flop_formulas() -> dict[Any, Any]:
    """The formulas this module adds to PyTorch's, as ``FlopCounterMode``'s ``custom_mapping``:
    the package's compiled ops (forward and backward), the FFTs, and the CPU's fused softmax
    attention (SDPA's)."""
    compiled = torch.ops.galerkin_ext
    return {
        compiled.kv_reduce: _kv_reduce_flops,
        compiled.kv_reduce_backward: _kv_reduce_backward_flops,
        compiled.q_apply: _q_apply_flops,
        compiled.q_apply_backward: _q_apply_backward_flops,
        _aten._fft_r2c: _fft_r2c_flops,
        _aten._fft_c2r: _fft_c2r_flops,
        _aten._fft_c2c: _fft_c2c_flops,
        compiled.quadratic_attention: _pairwise_flops,
        compiled.quadratic_attention_backward: _pairwise_backward_flops,
        compiled.softmax_attention: _pairwise_flops,
        compiled.softmax_attention_backward: _pairwise_backward_flops,
        _aten._scaled_dot_product_flash_attention_for_cpu: _pairwise_flops,
        _aten._scaled_dot_product_flash_attention_for_cpu_backward: _pairwise_backward_flops,
    }


class _FlopCounterMode(FlopCounterMode):
    """Counts with the spectral products on their FFTs (``layers.fourier.ffts_only``): the CPU
    runs them as DFT-matrix products where that is faster, which would count differently."""

    def __enter__(self):
        self._spectral_paths = contextlib.ExitStack()
        self._spectral_paths.enter_context(ffts_only())
        return super().__enter__()

    def __exit__(self, *exc_info):
        try:
            return super().__exit__(*exc_info)
        finally:
            self._spectral_paths.close()


def flop_counter_mode(display: bool = False, depth: int = 2) -> FlopCounterMode:
    """A :class:`~torch.utils.flop_counter.FlopCounterMode` that also counts the package's ops
    and FFTs (:func:`flop_formulas`), for counts by module or of a backward pass::

        with flop_counter_mode() as counter:
            model(u, x).sum().backward()
        counter.get_total_flops(), counter.get_flop_counts()

    The totals are this thread's work alone; the counts by module take in, besides, the
    modules other threads run meanwhile (torch's module hooks, which name them, are global).
    """
    check_bool(display, "display")
    check_int(depth, "depth", 0)
    return _FlopCounterMode(display=display, depth=depth, custom_mapping=flop_formulas())


def forward_flops(model: nn.Module, *args: Any, **kwargs: Any) -> int:
    """FLOPs of one forward pass ``model(*args, **kwargs)`` (without gradients), counted as the
    module docstring says."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    with flop_counter_mode() as counter, torch.no_grad():
        model(*args, **kwargs)
    return counter.get_total_flops()
