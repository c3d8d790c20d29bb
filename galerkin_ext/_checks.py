"""Argument checks shared by the whole package (ops, layers, models, data, training): each
written once here.

Each returns the value (converted) or raises with the argument's name and what was expected:
``"name: expected ..., got ..."``; ``TypeError`` for the wrong kind of value, ``ValueError`` for one
out of range. Bools are rejected where numbers are expected (``True`` is not a width).
"""

from __future__ import annotations

import math
import numbers
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import Tensor

_T = TypeVar("_T")


@contextmanager
def arguments_named(**names: str) -> Iterator[None]:
    """Argument errors raised inside (``'dropout: expected ...'``) renamed to the caller's
    argument that was passed on (``dropout='encoder_dropout'``): a model builds its sub-layers
    with its own arguments, and a message must name the one the user gave."""
    try:
        yield
    except (TypeError, ValueError) as err:
        head, sep, rest = str(err).partition(": ")
        if not sep or head not in names or len(err.args) != 1:
            raise
        raise type(err)(f"{names[head]}: {rest}") from None


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``."""
    expected = f"{name}: expected an int >= {minimum}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(expected)
    if value < minimum:
        raise ValueError(expected)
    return int(value)


def check_heads(n_head: object, width: int, width_name: str = "d_model") -> int:
    """``n_head`` as a count of attention heads that divides the layer's ``width``."""
    heads = check_int(n_head, "n_head")
    if width % heads:
        raise ValueError(f"n_head: expected a divisor of {width_name} = {width}, got {heads}")
    return heads


def check_seed(value: object, name: str = "seed") -> int:
    """``value`` as the seed of a data generation: an int in ``[0, 2**64)``, which a data file
    stores as an unsigned 64-bit HDF5 attribute."""
    seed = check_int(value, name, 0)
    if seed >= 2**64:
        raise ValueError(f"{name}: expected an int >= 0 and < 2**64 (a data file stores it in "
                         f"64 bits), got {seed}")
    return seed


def _finite(value: float | numbers.Real) -> bool:
    """Whether ``value`` is finite: ``value - value`` is 0, or NaN for inf and NaN. Unlike
    ``math.isfinite`` this traces on the symbolic floats of torch.compile (a size-derived cell
    volume, or a module's float under ``dynamic=True``), where isfinite broke the graph."""
    return value - value == 0


def check_float(value: object, name: str, *, low: float = 0.0, low_inclusive: bool = False,
                high: float = math.inf) -> float:
    """``value`` as a finite float above ``low`` (or equal to it if ``low_inclusive``) and at
    most ``high``."""
    def expected() -> str:  # built on failure only: the ops call this on every call
        bounds = f"{'>=' if low_inclusive else '>'} {low:g}" + (
            f" and <= {high:g}" if high < math.inf else "")
        return f"{name}: expected a finite float {bounds}, got {value!r}"

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(expected())
    # (float() of a symbolic float would pin it under torch.compile: plain floats pass as such)
    number = value if type(value) is float else float(value)
    above = number >= low if low_inclusive else number > low
    if not (_finite(number) and above and number <= high):
        raise ValueError(expected())
    return number


def check_norm_eps(eps: object) -> float:
    """The ``eps`` of the attention ops' fused layer norms: a finite float no smaller than
    float32's smallest normal number (~1.2e-38), since the norms add it in float32 for float32
    rows, where a smaller one would be 0 or subnormal."""
    return check_float(eps, "eps", low=torch.finfo(torch.float32).tiny, low_inclusive=True)


def check_float_dtype(dtype: object) -> torch.dtype:
    """``dtype`` (the argument of that name) if it is a floating ``torch.dtype``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    return dtype


def check_int_pair(value: object, name: str) -> tuple[int, int]:
    """``value``, an int or a pair of positive ints (e.g. patches per axis), as a pair; an int
    ``p`` means ``(p, p)``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        one = check_int(value, name)
        return one, one
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name}: expected an int or a pair of ints >= 1, got {value!r}")
    return check_int(value[0], f"{name}[0]"), check_int(value[1], f"{name}[1]")


def check_probability(value: object, name: str) -> float:
    """``value`` as a dropout probability in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float in [0, 1), got {value!r}")
    # (cast: typeshed's numbers.Real declares no comparison with a float on its left)
    if not 0.0 <= cast(float, value) < 1.0:
        raise ValueError(f"{name}: expected a float in [0, 1), got {value!r}")
    return float(value)


def check_scale(value: object, default: float) -> float:
    """An attention scale: ``value`` as a finite float, or ``default`` for ``None``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"scale: expected a finite float or None, got {value!r}")
    if not _finite(value):
        raise ValueError(f"scale: expected a finite float or None, got {value!r}")
    return value if type(value) is float else float(value)


def check_choice(value: object, name: str, choices: Sequence[_T]) -> _T:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    return cast(_T, value)  # (it equals one of the choices)


def is_tracing(t: Tensor) -> bool:
    """True where a data-dependent check cannot run: tracing (compile, export,
    ``torch.jit.trace``), ``torch.func`` transforms (``vmap`` refuses a branch on a batched
    value), CUDA-graph capture, or meta tensors (shapes without values, e.g. for counting
    FLOPs)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or t.device.type == "meta" or (
            torch._C._are_functorch_transforms_active()):
        return True
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_holds_values(t: Tensor, name: str, what: str) -> None:
    """Refuses a meta tensor (shapes without values) where ``what`` needs its values."""
    if t.device.type == "meta":
        raise ValueError(f"{name}: {what} from its values, which a meta tensor does not hold; "
                         "pass a CPU or CUDA tensor")


# torch 2.5 and 2.6 have no torch.compiler.is_exporting: there an export looks like a compile.
EXPORT_DETECTABLE = hasattr(torch.compiler, "is_exporting")


def is_exporting() -> bool:
    """True under ``torch.export`` or ``torch.jit.trace``, whose programs cannot branch on
    tensor values: a branch would be refused or baked in for every later input."""
    return torch.jit.is_tracing() or (EXPORT_DETECTABLE and torch.compiler.is_exporting())


def without_size_guards() -> bool:
    """True while a program that takes no guard on its sizes is built: under ``torch.export``
    and ``torch.jit.trace``, and with torch < 2.7 (no ``EXPORT_DETECTABLE``) under any
    compile, which there may be an export."""
    return is_exporting() or (torch.compiler.is_compiling() and not EXPORT_DETECTABLE)


def check_index(i: object, n: int) -> int:
    """A dataset's sample index ``i`` as an int of ``[0, n)`` (negative ones count from the end,
    as in a list); a slice, a bool or a tensor is refused: items are single samples."""
    if isinstance(i, bool) or not isinstance(i, int | np.integer):
        raise TypeError(f"i: expected an int index, got {type(i).__name__} (a DataLoader "
                        "batches single samples)")
    if not -n <= i < n:
        raise IndexError(f"i: {i} is out of range for {n} samples")
    return int(i) % n


def check_like(t: Tensor, name: str, like: Tensor, like_name: str = "q") -> None:
    """``t`` on ``like``'s device with ``like``'s dtype."""
    if t.device != like.device:
        raise ValueError(
            f"{name}: expected a tensor on {like.device} like {like_name}, got one on {t.device}"
        )
    if t.dtype != like.dtype:
        raise TypeError(f"{name}: expected dtype {like.dtype} like {like_name}, got {t.dtype}")


def check_model_input(x: Tensor, name: str, model: torch.nn.Module) -> None:
    """``x``, a model's input, on the device and in the dtype of the model's real parameters
    (under autocast also float32 or the autocast dtype, unless the model is float64): the first
    layer would otherwise fail with a message about its own operands."""
    # (a loop, not next(generator, None), which torch 2.5's dynamo cannot trace)
    for p in model.parameters():
        if not p.is_complex():
            break
    else:
        return
    if x.device != p.device:
        raise ValueError(f"{name}: expected a tensor on {p.device} like the model's parameters, "
                         f"got one on {x.device}")
    if x.dtype == p.dtype:
        return
    under = ""
    if (p.dtype != torch.float64 and x.device.type in ("cpu", "cuda")
            and torch.is_autocast_enabled(x.device.type)):
        # Autocast casts float32 and its own dtype to the latter; it leaves float64 alone (which
        # then meets half-precision weights), and torch refuses float16 beside bfloat16.
        accepted = [d for d in (torch.float32, torch.get_autocast_dtype(x.device.type))
                    if d != p.dtype]
        if x.dtype in accepted:
            return
        under = f" (or, under autocast, {' or '.join(map(str, accepted))})"
    raise TypeError(f"{name}: expected {p.dtype} like the model's parameters{under}, got "
                    f"{x.dtype} (convert the model, e.g. model.to({x.dtype}), or the input)")


def check_param_like(t: Tensor, name: str, like: Tensor, like_name: str = "q") -> None:
    """A parameter of ``like``'s rows (quadrature weight, norm parameters): ``like``'s device and
    dtype, or float32 for float16/bfloat16 ``like``, which keeps weights below 2^-14 from going
    subnormal and an autocast model's norm parameters in full precision (as the compiled ops'
    check_param in csrc/attention/core.cpp)."""
    if like.dtype in (torch.float16, torch.bfloat16) and t.dtype == torch.float32:
        if t.device != like.device:
            raise ValueError(f"{name}: expected a tensor on {like.device} like {like_name}, "
                             f"got one on {t.device}")
        return
    check_like(t, name, like, like_name)


def check_nonnegative(t: Tensor, name: str, what: str = "quadrature weights") -> None:
    """``t``'s values finite and ``>= 0`` (``what`` names them in the message). Data-dependent
    (a host sync), so skipped while tracing or capturing (:func:`is_tracing`)."""
    if not is_tracing(t) and not bool(torch.all(torch.isfinite(t) & (t >= 0))):
        raise ValueError(f"{name}: expected finite, non-negative {what}")


def check_statistics(mean: object, std: object) -> None:
    """A unit-Gaussian normaliser's ``mean`` and ``std``: floating tensors of one shape, finite,
    ``std >= 0``."""
    for name, value in (("mean", mean), ("std", std)):
        if not isinstance(value, Tensor) or not value.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got "
                            f"{value.dtype if isinstance(value, Tensor) else type(value).__name__}")
    assert isinstance(mean, Tensor) and isinstance(std, Tensor)
    if mean.shape != std.shape:
        raise ValueError(f"std: expected the shape of mean {tuple(mean.shape)}, got "
                         f"{tuple(std.shape)}")
    if not is_tracing(mean) and not bool(torch.isfinite(mean).all()):
        raise ValueError("mean: expected finite values")
    check_nonnegative(std, "std", "values")


def recorded_statistics(record: object, name: str) -> tuple[Tensor, Tensor]:
    """``(mean, std)`` as float64 tensors from a recorded normaliser ``{'mean': ..., 'std':
    ..., 'eps': ...}`` (numbers or nested lists of them, as the run configurations store them;
    ``eps`` since 2026-11-30, :func:`recorded_eps`), checked with :func:`check_statistics`;
    messages name ``name``."""
    if not isinstance(record, Mapping) or set(record) - {"eps"} != {"mean", "std"}:
        raise ValueError(f"{name}: expected {{'mean': ..., 'std': ...}} (and 'eps'), got "
                         f"{record!r}")
    try:
        mean, std = (torch.tensor(record[key], dtype=torch.float64) for key in ("mean", "std"))
        check_statistics(mean, std)
    except (TypeError, ValueError) as err:  # e.g. ragged lists, a string, a negative std
        raise ValueError(f"{name}: expected numbers or nested lists of them of one shape, "
                         f"finite, std >= 0 ({err}); got {record!r}") from err
    return mean, std


def recorded_eps(record: Mapping[str, Any], name: str, default: float) -> float:
    """The ``eps`` of a recorded normaliser (:func:`recorded_statistics`' ``record``), or
    ``default`` for a record written before ``eps`` was recorded."""
    return check_float(record.get("eps", default), f"{name}['eps']", low_inclusive=True)


def check_quadrature_weight(
    weight: object, batch: int, n: int, like: Tensor, like_name: str = "q", axis: str = "N",
    name: str = "weight", *, values: bool = True,
) -> None:
    """Validate quadrature weights for ``n`` points and a batch of ``batch``: a tensor of shape
    ``(B, N)`` or ``(N,)`` on ``like``'s device (dtype: :func:`check_param_like`), finite and
    non-negative
    (``axis`` names the points' axis in the messages, e.g. ``"M"`` for keys; ``name`` the
    argument).

    The value check is data-dependent (a host sync); it is skipped while tracing
    (``torch.compile``) or capturing a CUDA graph, and with ``values=False`` (a layer whose op
    checks the values again).
    """
    if not isinstance(weight, Tensor):
        raise TypeError(f"{name}: expected a tensor or None, got {type(weight).__name__}")
    check_param_like(weight, name, like, like_name)
    if weight.shape not in ((batch, n), (n,)):
        raise ValueError(
            f"{name}: expected shape (B, {axis}) = ({batch}, {n}) or ({axis},) = ({n},), "
            f"got {tuple(weight.shape)}"
        )
    if values:
        check_nonnegative(weight, name)


def first_without_weight(weight: Tensor, batch: int, m: int) -> int | None:
    """The first batch element of the quadrature weights ``(B, M)`` / ``(M,)`` without a
    positive one, or ``None``; also ``None`` while tracing (data-dependent)."""
    if is_tracing(weight):
        return None
    empty = ~(weight.expand(batch, m) > 0).any(dim=1)
    return int(empty.nonzero()[0]) if bool(empty.any()) else None


def check_has_keys(weight: Tensor, batch: int, m: int,
                   undefined: str = "softmax attention over no keys") -> None:
    """Every batch element of the quadrature weights ``(B, M)`` / ``(M,)`` has a positive one,
    without which ``undefined`` is undefined (the message says so). Skipped while tracing."""
    b = first_without_weight(weight, batch, m)
    if b is not None:
        raise ValueError(f"weight: batch element {b} has no key of positive weight "
                         f"({undefined} is undefined); expected at least one w_j > 0 per "
                         "element")


def check_attention_operands(
    q: object, k: object, v: object, k_name: str = "k", v_name: str = "v", *,
    allow_empty: bool = False,
) -> tuple[int, int, int, int, int]:
    """The two-sided contract of the attention functions: ``q (B, H, N, D)``, ``k (B, H, M, D)``,
    ``v (B, H, M, D_v)``, non-empty but for B, floating point, one dtype and device.  Returns
    ``(B, H, N, M, D_v)``.  ``k_name``, ``v_name``: the arguments' names in messages;
    ``allow_empty``: ``N`` and ``M`` may be 0 too (a domain-parallel shard without points)."""
    for name, t in (("q", q), (k_name, k), (v_name, v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    if not q.is_floating_point():
        raise TypeError(f"q: expected a floating-point tensor, got {q.dtype}")
    least = 0 if allow_empty else 1  # points N and M
    if q.dim() != 4 or 0 in (q.shape[1], q.shape[3]) or q.shape[2] < least:  # B = 0 is fine
        expected = ("tensor of shape (B, H, N, D) with H, D >= 1" if allow_empty
                    else "non-empty floating-point tensor of shape (B, H, N, D)")
        raise ValueError(f"q: expected a {expected}, got {q.dtype} {tuple(q.shape)}")
    batch, heads, n, dim = q.shape
    check_like(k, k_name, q)
    check_like(v, v_name, q)
    if k.dim() != 4 or k.shape[:2] != (batch, heads) or k.shape[3] != dim or k.shape[2] < least:
        raise ValueError(f"{k_name}: expected shape (B, H, M, D) = ({batch}, {heads}, M, {dim}) "
                         f"with M >= {least}, got {tuple(k.shape)}")
    m = k.shape[2]
    if v.dim() != 4 or v.shape[:3] != (batch, heads, m) or v.shape[3] == 0:
        raise ValueError(f"{v_name}: expected shape (B, H, M, D_v) = ({batch}, {heads}, {m}, "
                         f"D_v), got {tuple(v.shape)}")
    return batch, heads, n, m, v.shape[3]


def check_patched_operands(
    q: object, k: object, v: object
) -> tuple[int, int, int, int, int, int, int]:
    """The contract of patched attention: ``q (B, H, P, n, D)``, ``k (B, H, O, n, D)``,
    ``v (B, H, O, n, D_v)`` (patch tokens of ``n`` points with ``D`` features each), non-empty but
    for B, floating point, one dtype and device. Returns ``(B, H, P, O, n, D, D_v)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    if not q.is_floating_point():
        raise TypeError(f"q: expected a floating-point tensor, got {q.dtype}")
    if q.dim() != 5 or 0 in q.shape[1:]:  # an empty batch (B = 0) is fine
        raise ValueError(f"q: expected a non-empty floating-point tensor of shape "
                         f"(B, H, P, n, D), got {q.dtype} {tuple(q.shape)}")
    batch, heads, p, n, dim = q.shape
    check_like(k, "k", q)
    check_like(v, "v", q)
    if k.dim() != 5 or k.shape[:2] != (batch, heads) or k.shape[3:] != (n, dim) or (
        k.shape[2] == 0
    ):
        raise ValueError(f"k: expected shape (B, H, O, n, D) = ({batch}, {heads}, O, {n}, {dim}) "
                         f"with O >= 1 (the same in-patch points as q), got {tuple(k.shape)}")
    o = k.shape[2]
    if v.dim() != 5 or v.shape[:4] != (batch, heads, o, n) or v.shape[4] == 0:
        raise ValueError(f"v: expected shape (B, H, O, n, D_v) = ({batch}, {heads}, {o}, {n}, "
                         f"D_v), got {tuple(v.shape)}")
    return batch, heads, p, o, n, dim, v.shape[4]


def check_cell_weight(cell_weight: object, n: int, like: Tensor) -> float | Tensor:
    """The in-patch quadrature of patched attention: a positive finite float or 0-d tensor (the
    same cell volume at every point), or a tensor of shape ``(n,)``, finite and non-negative, on
    ``like``'s device (dtype: :func:`check_param_like`). The value check of a tensor is skipped
    while tracing (data-dependent)."""
    def expected() -> str:  # built on failure only: n is symbolic under torch.compile
        return f"cell_weight: expected a finite float > 0 or a tensor of shape (n,) = ({n},)"

    if isinstance(cell_weight, Tensor) and cell_weight.dim() == 0:
        # One volume as a 0-d tensor: what 1 / (number of points) becomes under torch.jit.trace.
        if not cell_weight.is_floating_point():
            raise TypeError(f"{expected()}, got a {cell_weight.dtype} tensor")
        if cell_weight.device not in (like.device, torch.device("cpu")):  # (a CPU scalar mixes)
            also = "" if like.device.type == "cpu" else " (or on the CPU)"
            raise ValueError(f"cell_weight: expected a 0-dim tensor on {like.device} like q"
                             f"{also}, got one on {cell_weight.device}")
        if not is_tracing(cell_weight) and not bool(
            torch.isfinite(cell_weight) & (cell_weight > 0)
        ):
            raise ValueError(f"{expected()}, got {cell_weight.item()!r}")
        return cell_weight
    if isinstance(cell_weight, Tensor):
        check_param_like(cell_weight, "cell_weight", like)
        if cell_weight.shape != (n,):
            raise ValueError(f"{expected()}, got shape {tuple(cell_weight.shape)}")
        check_nonnegative(cell_weight, "cell_weight", "cell volumes")
        return cell_weight
    if isinstance(cell_weight, torch.SymFloat):  # 1 / (number of points) of symbolic sizes
        # (torch.export with dynamic shapes): no value to check; cast: it stands in for a float
        return cast(float, cell_weight)
    if isinstance(cell_weight, bool) or not isinstance(cell_weight, numbers.Real):
        raise TypeError(f"{expected()}, got {type(cell_weight).__name__}")
    # (cast: typeshed's numbers.Real declares no comparison with an int on the right)
    if not (_finite(cell_weight) and cast(float, cell_weight) > 0):
        raise ValueError(f"{expected()}, got {cell_weight!r}")
    return float(cell_weight)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None``/``'auto'`` → CUDA if available, else CPU; otherwise a checked ``torch.device``."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: expected e.g. 'cpu', 'cuda', 'cuda:1' or 'auto', "
                         f"got {device!r}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available "
                         f"(this torch {torch.__version__} build or machine has no GPU)")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a CPU or CUDA device, got {device!r}")
    # 'cpu:0' is the one CPU, and torch.load cannot map a checkpoint to it: training with it
    # ran to the end, then failed to read its own best.pt
    return torch.device("cpu") if dev.type == "cpu" else dev


def check_device(device: object) -> torch.device | None:
    """An optional ``device`` argument: ``None`` (torch's default device) or one that
    :func:`resolve_device` accepts."""
    # (cast: resolve_device raises a ValueError for any other value)
    return None if device is None else resolve_device(cast("str | torch.device", device))


def check_tensor(x: object, name: str, ndim: int, shape_doc: str,
                 module: torch.nn.Module | None = None) -> Tensor:
    """``x`` if it is a floating-point tensor of rank ``ndim``; ``shape_doc`` names the dims.
    ``module``: the layer ``x`` goes into, whose parameters' device and dtype it must have
    (:func:`check_model_input`)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a tensor of shape {shape_doc}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected shape {shape_doc}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if module is not None:
        check_model_input(x, name, module)
    return x


def check_spectral_product(x: object, weight: object, n_pos: object, norm: object,
                           line: bool = False) -> None:
    """The arguments of ``layers.fourier.spectral_product`` (``line``: of
    ``spectral_product_1d``, one axis of ``n`` points and no ``n_pos``): ``x (B, p₁, p₂, c_in)``
    float32 or float64, ``weight (c_in, c_out, R, K)`` complex with ``R <= p₁`` rows,
    ``0 <= n_pos <= R`` of them for ``k₁ >= 0``, ``1 <= K <= p₂ // 2 + 1`` columns; ``norm``
    one of torch.fft's ``'backward'``, ``'ortho'``."""
    x_doc, w_doc = (("(B, n, c_in)", "(c_in, c_out, K)") if line
                    else ("(B, p1, p2, c_in)", "(c_in, c_out, R, K)"))
    x = check_tensor(x, "x", 3 if line else 4, x_doc)
    if x.dtype not in (torch.float32, torch.float64):  # (the layers compute half types in float32)
        raise TypeError(f"x: expected float32 or float64, the dtype to compute in, got {x.dtype}")
    if not isinstance(weight, Tensor) or not weight.is_complex():
        raise TypeError(f"weight: expected a complex tensor of shape {w_doc}, got "
                        f"{weight.dtype if isinstance(weight, Tensor) else type(weight).__name__}")
    check_choice(norm, "norm", ("backward", "ortho"))
    if weight.dim() != (3 if line else 4) or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight: expected shape {w_doc} with c_in = {x.shape[-1]}, got "
                         f"{tuple(weight.shape)}")
    rows = 1 if line else weight.shape[2]
    length = x.shape[-2]
    if not (1 <= weight.shape[-1] <= length // 2 + 1 and rows <= (1 if line else x.shape[1])):
        raise ValueError(f"weight: expected at most {'' if line else 'p1 rows and '}"
                         f"{length // 2 + 1} columns (p2 // 2 + 1) for x of shape "
                         f"{tuple(x.shape)}, got {tuple(weight.shape)}")
    # (sizes are SymInts while compiling, 0-d tensors under torch.jit.trace)
    if not line and (isinstance(n_pos, bool)
                     or not isinstance(n_pos, (int, torch.SymInt, Tensor))
                     or not 0 <= n_pos <= rows):
        raise ValueError(f"n_pos: expected an int from 0 to the weight's {rows} rows, "
                         f"got {n_pos!r}")


def check_features(x: object, name: str, width: int, module: torch.nn.Module) -> Tensor:
    """``x (..., width)``, a floating-point tensor for the pointwise layer ``module`` (its
    parameters' device and dtype, :func:`check_model_input`)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor of shape (..., {width}), got "
                        f"{x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] != width:
        raise ValueError(f"{name}: expected shape (..., {width}), got {tuple(x.shape)}")
    check_model_input(x, name, module)
    return x


def expand_grid(grid: object, name: str, batch: int, points: tuple[int, ...], dim: int,
                like: Tensor, like_name: str = "x") -> Tensor:
    """Accept a grid shared by the batch ``(*points, dim)`` or per sample ``(B, *points, dim)``
    of floating coordinates on ``like``'s device (its dtype is the caller's rule).

    Returns the grid expanded (a view, no copy) to ``(B, *points, dim)``.
    """
    def doc() -> str:  # built on failure only: with symbolic sizes (torch.compile) it fails
        sizes = ", ".join(map(str, points))
        return f"({sizes}, {dim}) or (B, {sizes}, {dim})"

    if not isinstance(grid, Tensor):
        raise TypeError(f"{name}: expected a tensor of shape {doc()}, got {type(grid).__name__}")
    given = tuple(grid.shape)  # the message reports what the caller passed
    if grid.dim() == len(points) + 1:
        grid = grid.unsqueeze(0)
    if grid.dim() != len(points) + 2 or tuple(grid.shape[1:]) != (*points, dim) or (
        grid.shape[0] not in (1, batch)
    ):
        raise ValueError(f"{name}: expected shape {doc()} with B = {batch}, got {given}")
    if not grid.is_floating_point():
        raise TypeError(f"{name}: expected floating-point coordinates, got {grid.dtype}")
    if grid.device != like.device:
        raise ValueError(f"{name}: expected a tensor on {like.device} like {like_name}, got one "
                         f"on {grid.device}")
    return grid.expand(batch, *points, dim)


def check_norm(norm: object, name: str, like: Tensor,
               like_name: str = "q") -> tuple[Tensor, Tensor] | None:
    """A ``(weight, bias)`` pair of shape ``(H, D)`` of ``like (B, H, ·, D)``, or None (the
    values' norm: ``like`` is ``v``, whose width the message calls ``D_v``)."""
    if norm is None:
        return None
    if not isinstance(norm, (tuple, list)) or len(norm) != 2:
        raise TypeError(f"{name}: expected None or a (weight, bias) pair of tensors, got {norm!r}")
    heads, dim = like.shape[1], like.shape[3]
    for i, p in enumerate(norm):
        if not isinstance(p, Tensor):
            raise TypeError(f"{name}[{i}]: expected a tensor, got {type(p).__name__}")
        check_param_like(p, f"{name}[{i}]", like, like_name)
        if p.shape != (heads, dim):
            raise ValueError(
                f"{name}[{i}]: expected shape (H, {'D_v' if like_name == 'v' else 'D'}) = "
                f"({heads}, {dim}), got {tuple(p.shape)}"
            )
    return norm[0], norm[1]


def check_pos(pos: object, x: Tensor, name: str, points: str) -> None:
    """``pos`` fits the rows of ``x (B, H, n, D)``: ``(B, n, P)`` or ``(n, P)``, or None."""
    if pos is None:
        return
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name}: expected a tensor or None, got {type(pos).__name__}")
    check_like(pos, name, x)
    batch, _, n, _ = x.shape
    if not ((pos.dim() == 3 and pos.shape[:2] == (batch, n)) or (pos.dim() == 2
                                                                   and pos.shape[0] == n)):
        raise ValueError(f"{name}: expected shape (B, {points}, P) = ({batch}, {n}, P) or "
                         f"({points}, P) = ({n}, P), got {tuple(pos.shape)}")


def check_path(path: object, name: str = "path") -> Path:
    """``path`` (a ``str`` or ``os.PathLike``) as a :class:`~pathlib.Path`."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{name}: expected a path (str or os.PathLike), got {type(path).__name__}")
    return Path(path)


def cannot_make_folder(folder: Path) -> str | None:
    """Why ``folder`` (with its parents) cannot be made (the OS's words, e.g. a file in the
    way), or ``None`` once it exists."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return err.strerror or str(err)
    return None


def cannot_write_in(folder: Path) -> str | None:
    """Why no file can be made in ``folder`` (the OS's words), or ``None`` where one can: tried
    with a temporary file, since the permission bits let root write where the file system
    still refuses (a read-only mount, ``/proc``)."""
    try:
        if not folder.is_dir():
            return "not a folder"
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as err:
        return err.strerror or str(err)


ROW_MAPS = ("identity", "layer_norm", "softmax")


def _check_core_operand(x: object, name: str) -> Tensor:
    """An operand of the op core: a floating tensor ``(B, H, points, D)`` with ``D >= 1``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if x.dim() != 4 or x.shape[3] == 0:
        raise ValueError(f"{name}: expected shape (B, H, points, D) with D >= 1, got "
                         f"{tuple(x.shape)}")
    return x


def _check_row_map(kind: object, name: str, norm: object, norm_name: str, like: Tensor,
                   like_name: str) -> None:
    """A row map of :data:`ROW_MAPS` with its norm pair: given exactly for ``'layer_norm'``."""
    check_choice(kind, name, ROW_MAPS)
    if kind == "layer_norm":
        if norm is None:
            raise ValueError(f"{norm_name}: {name}='layer_norm' needs a (weight, bias) pair, "
                             "got None")
        check_norm(norm, norm_name, like, like_name)
    elif norm is not None:
        raise ValueError(f"{norm_name}: expected None with {name}={kind!r} (a norm pair "
                         "belongs to 'layer_norm')")


def _check_map_eps(eps: object, *maps: object) -> None:
    """A layer norm's ``eps`` (:func:`check_norm_eps`) where a map is one; else unused, but a
    finite float >= 0 all the same."""
    if "layer_norm" in maps:
        check_norm_eps(eps)
    else:
        check_float(eps, "eps", low_inclusive=True)


def refused_by_safe_load(err: BaseException) -> bool:
    """Whether ``torch.load(weights_only=True)`` refused a file's content (a pickle of other
    objects, or no pickle at all), whose message advises loading it unsafely instead: the
    package's messages say what the file should hold."""
    return "Weights only load failed" in str(err) or "Unsupported global" in str(err)


def check_bool(value: object, name: str) -> None:
    """``value`` a bool (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {value!r}")


def check_kv_reduce(k: object, v: object, kv_pos: object, weight: object, k_map: object,
                    k_norm: object, v_map: object, v_norm: object, eps: object,
                    ones_column: object) -> None:
    """The arguments of the op core's key side (``kv_reduce``, compiled or formula), as its C++
    twin checks them, and the weights' values and ``eps`` besides; the points ``M`` may be 0."""
    k = _check_core_operand(k, "k")
    v = _check_core_operand(v, "v")
    check_like(v, "v", k, "k")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v: expected shape (B, H, M, D_v) with (B, H, M) = "
                         f"{tuple(k.shape[:3])} of k, got {tuple(v.shape)}")
    check_pos(kv_pos, k, "kv_pos", "M")
    if weight is not None:
        check_quadrature_weight(weight, k.shape[0], k.shape[2], k, "k", axis="M")
    _check_row_map(k_map, "k_map", k_norm, "k_norm", k, "k")
    _check_row_map(v_map, "v_map", v_norm, "v_norm", v, "v")
    _check_map_eps(eps, k_map, v_map)
    check_bool(ones_column, "ones_column")


def check_q_apply(q: object, s: object, pos: object, q_map: object, q_norm: object,
                  eps: object, normalizers: object, skip: object) -> None:
    """The arguments of the op core's query side (``q_apply``, compiled or formula), as its C++
    twin checks them, and ``eps`` besides; the points ``N`` may be 0."""
    q = _check_core_operand(q, "q")
    check_pos(pos, q, "pos", "N")
    _check_row_map(q_map, "q_map", q_norm, "q_norm", q, "q")
    _check_map_eps(eps, q_map)
    if not isinstance(s, Tensor):
        raise TypeError(f"s: expected a tensor, got {type(s).__name__}")
    from .functional import opmath_dtype  # (functional imports this module)

    opmath = opmath_dtype(q)
    if s.dtype != opmath or s.device != q.device:
        raise TypeError(f"s: expected {opmath} on {q.device} (what kv_reduce gives for q's "
                        f"dtype), got {s.dtype} on {s.device}")
    width = (pos.shape[-1] if isinstance(pos, Tensor) else 0) + q.shape[3]
    if s.dim() != 4 or s.shape[:3] != (*q.shape[:2], width):
        raise ValueError(f"s: expected shape (B, H, P + D, W) = ({q.shape[0]}, {q.shape[1]}, "
                         f"{width}, W), got {tuple(s.shape)}")
    blocks = check_int(normalizers, "normalizers", 0)
    if blocks and (s.shape[3] % blocks or s.shape[3] // blocks < 2):
        raise ValueError(f"normalizers: {blocks} blocks of (d_v + 1) >= 2 columns do not make "
                         f"up W = {s.shape[3]}")
    check_bool(skip, "skip")
    out = s.shape[3] // blocks - 1 if blocks else s.shape[3]
    if skip and out != width:
        raise ValueError(f"skip: needs the output width {out} to equal Q̂'s width P + D = "
                         f"{width}")

