"""Random inputs for the attention tests, shared by the CPU and the CUDA test files."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from galerkin_ext import ops

F64 = torch.float64

# The mark of the CUDA test files.
needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and ops.cuda_built()),
    reason="needs a CUDA device and galerkin_ext built with CUDA",
)


@dataclass(frozen=True)
class Case:
    B: int
    H: int
    N: int
    D: int
    P: int = 0
    shared_pos: bool = False
    weight: str = "uniform"  # uniform | shared | batched (both with some zeros)
    norms: bool = True
    layout: str = "contiguous"  # contiguous | projected (B,N,H,D) view | sliced

    def __str__(self) -> str:
        return (f"B{self.B}H{self.H}N{self.N}D{self.D}P{self.P}{'s' if self.shared_pos else ''}"
                f"-{self.weight}-{'norm' if self.norms else 'nonorm'}-{self.layout}")


CASES = [
    Case(1, 1, 1, 1),
    Case(2, 1, 1, 3, P=1, weight="batched"),
    Case(1, 2, 7, 5, P=2, layout="projected"),
    Case(3, 3, 33, 7, P=1, shared_pos=True, weight="shared", layout="sliced"),
    Case(2, 4, 65, 16, P=2, weight="batched", layout="projected"),
    Case(2, 2, 19, 9, P=0, weight="shared", norms=False),
    Case(1, 1, 130, 33, P=2, shared_pos=True, layout="sliced"),
    Case(4, 1, 257, 4, P=1, norms=False, weight="batched", layout="projected"),
    # widths the op pads internally to aligned GEMM rows: 97 -> 104 and 63 -> 64
    Case(2, 1, 45, 96, P=1, weight="batched", layout="projected"),
    Case(1, 2, 17, 61, P=2, shared_pos=True, weight="shared", norms=False),
]


def layout_tensor(shape, layout: str, gen: torch.Generator, dtype, requires_grad=False):
    """A (B, H, N, D) tensor in one of the layouts a user's projections produce."""
    B, H, N, D = shape
    if layout == "projected":  # view(B, N, H, D).transpose(1, 2), as after a Linear
        t = torch.randn(B, N, H, D, generator=gen, dtype=dtype).transpose(1, 2)
    elif layout == "sliced":  # every other feature of a wider tensor
        t = torch.randn(B, H, N, 2 * D, generator=gen, dtype=dtype)[..., ::2]
    else:
        t = torch.randn(B, H, N, D, generator=gen, dtype=dtype)
    return t.requires_grad_(requires_grad)


def make_inputs(case: Case, gen: torch.Generator, dtype=F64, requires_grad=False) -> dict:
    shape = (case.B, case.H, case.N, case.D)
    q, k, v = (layout_tensor(shape, case.layout, gen, dtype, requires_grad) for _ in range(3))
    pos = None
    if case.P:
        pos_shape = (case.N, case.P) if case.shared_pos else (case.B, case.N, case.P)
        pos = torch.rand(pos_shape, generator=gen, dtype=dtype).requires_grad_(requires_grad)
    weight = None
    if case.weight != "uniform":
        w_shape = (case.N,) if case.weight == "shared" else (case.B, case.N)
        weight = torch.rand(w_shape, generator=gen, dtype=dtype)
        if requires_grad:  # finite differences must stay in the valid range w >= 0
            weight = weight + 0.5
        else:  # some points masked out
            weight = weight * (torch.rand(w_shape, generator=gen) > 0.3)
        weight = (weight / case.N).requires_grad_(requires_grad)

    def norm():
        if not case.norms:
            return None
        w = 1 + 0.3 * torch.randn(case.H, case.D, generator=gen, dtype=dtype)
        b = 0.3 * torch.randn(case.H, case.D, generator=gen, dtype=dtype)
        return w.requires_grad_(requires_grad), b.requires_grad_(requires_grad)

    return dict(q=q, k=k, v=v, pos=pos, weight=weight, n1=norm(), n2=norm())


def galerkin(x, impl=ops, **kw):
    return impl.galerkin_attention(x["q"], x["k"], x["v"], pos=x["pos"], weight=x["weight"],
                                   k_norm=x["n1"], v_norm=x["n2"], eps=1e-5, **kw)


def fourier(x, impl=ops, **kw):
    return impl.fourier_attention(x["q"], x["k"], x["v"], pos=x["pos"], weight=x["weight"],
                                  q_norm=x["n1"], k_norm=x["n2"], eps=1e-5, **kw)


def rand(*shape, gen, dtype=F64):
    return torch.randn(*shape, generator=gen, dtype=dtype)


def map_inputs(x: dict, fn) -> dict:
    """``fn`` applied to every tensor of an input dict (norms are pairs; absent inputs None)."""
    def one(val):
        if isinstance(val, tuple):
            return tuple(fn(t) for t in val)
        return fn(val) if val is not None else None
    return {key: one(val) for key, val in x.items()}


def grad_inputs(x):
    names = [key for key in ("q", "k", "v", "pos", "weight") if x[key] is not None]
    tensors = [x[key] for key in names]
    for norm in (x["n1"], x["n2"]):
        if norm is not None:
            tensors += list(norm)
    return names, tensors


# Cross-attention shapes (B, H, N, M, D, D_v): M != N, N = 1, M = 1, D = 1.
CROSS_SHAPES = [(2, 3, 7, 5, 4, 6), (1, 1, 1, 9, 3, 2), (2, 2, 6, 1, 5, 5), (3, 1, 4, 4, 1, 1)]
WEIGHT_SHAPES = ["none", "shared", "batched"]


def cross_inputs(shape: tuple[int, ...], weight_shape: str, gen: torch.Generator):
    """float64 ``q (B, H, N, D)``, ``k (B, H, M, D)``, ``v (B, H, M, D_v)`` and key weights:
    ``None``, shared ``(M,)`` in [0.1, 1.1), or per sample ``(B, M)`` with key 0 of sample 0
    removed (weight 0) where M > 1."""
    b, h, n, m, d, dv = shape
    q, k, v = (torch.randn(*s, generator=gen, dtype=F64)
               for s in ((b, h, n, d), (b, h, m, d), (b, h, m, dv)))
    weight = {"none": None, "shared": torch.rand(m, generator=gen, dtype=F64) + 0.1,
              "batched": torch.rand(b, m, generator=gen, dtype=F64)}[weight_shape]
    if weight_shape == "batched" and m > 1:
        weight[0, 0] = 0.0
    return q, k, v, weight
