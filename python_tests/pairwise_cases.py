"""What the tests of the fused pairwise ops (test_quadratic_attention.py, test_softmax_attention.py)
share: their operands, the dropout multipliers of the independent numpy Threefry, a comparison
with float64 formulas, and what autograd keeps for a backward."""

from __future__ import annotations

import math

import numpy as np
import torch
from threefry_reference import reference_keep

# (B, H, N, M, d, d_v): N = M = 1; sizes off the vector widths; several blocks of query rows
# (64 rows a block at M = 200, 8 at M = 3000 in float64) with a short last one; N = 1; the
# backward's chunks of query blocks: one block each (B·H = 3 at M = 200), and at B·H = 1,
# M = 3000 two blocks each with one left for the last (float64: 19 blocks in 10 chunks).
# (4, 4, 200, 20, ...): a backward chunk of the key-side sums holding four query blocks of 64
# rows (B·H = 16, one chunk a head), where a block buffer not reset between blocks adds the
# earlier blocks again (the larger sizes make chunks of at most two)
SIZES = [(1, 1, 1, 1, 1, 1), (2, 3, 13, 29, 5, 4), (1, 2, 65, 64, 10, 10),
         (3, 1, 130, 200, 3, 17), (2, 2, 1, 70, 4, 2), (1, 1, 150, 3000, 3, 2),
         (4, 4, 200, 20, 3, 2)]
# Relative to the largest |element|: sums of M products round by about their magnitude's eps.
# (At M = 3000 in float32 torch's own (Q Kᵀ) V was 5.0e-6 of it off the float64 product, and
# the op 4.8e-6, for GALERKIN_TEST_SEED=1969146463: 4e-6 had failed there.)
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-13}


def multipliers(shape: tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """The dropout multipliers of the (B, H, N, M) matrix stored contiguously, in float64."""
    keep = reference_keep(math.prod(shape), p, seed).reshape(shape)
    return torch.from_numpy(np.where(keep, 1.0 / (1.0 - p), 0.0))


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    """``got`` (float32 or float64) within its dtype's tolerance of the float64 ``expected``."""
    assert got.shape == expected.shape
    scale = expected.abs().max().item() if expected.numel() else 0.0
    torch.testing.assert_close(got.double(), expected, rtol=0,
                               atol=TOLERANCE[got.dtype] * max(scale, 1.0))


def operands(size: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``q (B, H, N, d)``, ``k (B, H, M, d)``, ``v (B, H, M, d_v)`` of
    ``size = (B, H, N, M, d, d_v)``."""
    b, h, n, m, d, dv = size
    return (torch.randn(b, h, n, d, generator=gen, dtype=dtype),
            torch.randn(b, h, m, d, generator=gen, dtype=dtype),
            torch.randn(b, h, m, dv, generator=gen, dtype=dtype))


def draw_seed(gen: torch.Generator) -> int:
    return int(torch.randint(2**62, (), generator=gen))


def largest_saved(fn) -> int:
    """The most elements of any tensor autograd keeps for the backward of ``fn()``."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def assert_thread_count_invariant(fn) -> None:
    """``fn()``, a list of tensors, gives the same bits on one thread and on two."""
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(fn())
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)
