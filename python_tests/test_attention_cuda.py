"""The attention functions on CUDA (the op core's CUDA twins, and the formulas for shapes beyond
the kernels) against the float64 reference: CPU parity, gradients, CUDA graphs, torch.compile.
The ops themselves: test_op_core_cuda.py.

Skipped where there is no GPU or the extension was built without CUDA. Outputs are "poisoned":
the caching allocator's free blocks are filled with NaN first, so an element a kernel forgets
to write shows up as NaN instead of as a lucky zero.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    CASES,
    Case,
    fourier,
    galerkin,
    grad_inputs,
    map_inputs,
    needs_cuda,
)
from attention_cases import make_inputs as make_cpu_inputs

from galerkin_ext import ops, reference

pytestmark = needs_cuda

# Relative tolerances per dtype against the float64 reference (TF32 stays off in these tests).
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2,
             torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


def poison_cuda_cache(megabytes: int = 256) -> None:
    """Leave NaN-filled free blocks in the caching allocator for the next allocations to reuse:
    one large block (split for allocations over 1 MiB) and many small-pool blocks."""
    large = torch.full((megabytes * 2**18,), float("nan"), device="cuda")
    small = [torch.full((2**16,), float("nan"), device="cuda") for _ in range(64)]
    del large, small


def to_cuda(x: dict, dtype) -> dict:
    """Detached CUDA copies in ``dtype`` (leaves again, for the tests that differentiate)."""
    return map_inputs(x, lambda t: t.to(dtype).detach().cuda())


def as_reference(x: dict) -> dict:
    """The inputs exactly as the kernels get them (rounded to their dtype), in float64 on the CPU:
    the reference must not charge the kernels with the rounding of the inputs, which a layer
    norm over a few features can amplify far beyond the dtype's precision."""
    return map_inputs(x, lambda t: t.detach().cpu().double())


def check_graph_replay(step, leaves: list[torch.Tensor]) -> None:
    """Captures ``step()`` (returning tensors) in a CUDA graph, then twice refills ``leaves``
    with fresh values, replays, and compares with an eager ``step()``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the graph (allocator pools, lazy init)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(2):
        for t in leaves:
            with torch.no_grad():
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        for got, expected in zip(captured, step(), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def rel_err(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double().cpu() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


# Beyond the shared cases: the kernels' tile edges (rows of width d = P + D up to 128; wider
# rows run on the formulas) and many points.
CUDA_CASES = CASES + [
    Case(2, 3, 200, 33, P=2, weight="batched", layout="projected"),
    Case(3, 1, 65, 127, P=1, weight="batched", layout="sliced"),   # d = 128, the widest
    Case(1, 2, 40, 129, P=0, weight="shared"),                     # d = 129: the formulas
    Case(2, 2, 1000, 63, P=2, shared_pos=True, weight="batched"),  # d = 65: 16-thread tiles
    Case(1, 1, 4099, 8, P=1, weight="batched", layout="projected"),
]


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("case", CUDA_CASES, ids=str)
def test_forward_matches_float64_reference(case, dtype, gen):
    x = to_cuda(make_cpu_inputs(case, gen), dtype)
    x64 = as_reference(x)
    for fn, paths in ((galerkin, [{}]), (fourier, [{"path": "factored"}, {"path": "quadratic"}])):
        expected = fn(x64, reference)
        for kw in paths:
            poison_cuda_cache()
            out = fn(x, **kw)
            assert out.dtype == dtype and out.is_cuda
            assert torch.isfinite(out).all(), "unwritten (poisoned) or overflowed entries"
            assert rel_err(out, expected) <= TOLERANCE[dtype], (fn.__name__, kw)


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("case", [Case(2, 4, 301, 33, P=2, weight="batched", layout="projected"),
                                  Case(1, 2, 130, 95, P=1, shared_pos=True, weight="shared",
                                       layout="sliced"),
                                  Case(2, 1, 70, 129, P=1, weight="batched")], ids=str)
def test_backward_matches_float64_reference(case, dtype, gen):
    x = to_cuda(make_cpu_inputs(case, gen, requires_grad=False), dtype)
    x64 = as_reference(x)
    for inputs in (x64, x):
        for t in grad_inputs(inputs)[1]:
            t.requires_grad_()
    for fn in (galerkin, fourier):
        upstream = torch.randn(case.B, case.H, case.N, case.D + case.P, generator=gen,
                               dtype=torch.float64)
        expected = torch.autograd.grad(fn(x64, reference), grad_inputs(x64)[1], upstream)
        poison_cuda_cache()
        got = torch.autograd.grad(fn(x), grad_inputs(x)[1], upstream.to("cuda", dtype))
        for g, e in zip(got, expected, strict=True):
            assert torch.isfinite(g).all()
            assert rel_err(g, e) <= 5 * TOLERANCE[dtype]


def test_cpu_cuda_parity_float32(gen):
    case = Case(3, 2, 517, 16, P=1, shared_pos=True, weight="shared", layout="sliced")
    x = make_cpu_inputs(case, gen, dtype=torch.float32)
    xc = to_cuda(x, torch.float32)
    for fn in (galerkin, fourier):
        torch.testing.assert_close(fn(xc).cpu(), fn(x), rtol=1e-5, atol=1e-6)


def test_half_precision_sums_over_many_points_do_not_overflow(gen):
    """N = 2^17 points of O(1) values: the weighted sums stay O(1) in float16."""
    case = Case(1, 2, 2**17, 16, P=1)
    x = to_cuda(make_cpu_inputs(case, gen, dtype=torch.float32), torch.float16)
    out = galerkin(x)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("variant", ["galerkin", "fourier-factored", "fourier-quadratic"])
def test_gradcheck_float64_cuda(variant, gen):
    case = Case(2, 2, 5, 3, P=2, weight="batched", layout="projected")
    # requires_grad=True draws weights away from 0, where finite differences would leave w >= 0
    x = to_cuda(make_cpu_inputs(case, gen, requires_grad=True), torch.float64)
    names, tensors = grad_inputs(x)
    for t in tensors:
        t.requires_grad_()

    def call(*leaves):
        y = dict(x)
        y.update(zip(names, leaves[: len(names)], strict=True))
        rest = list(leaves[len(names):])
        y["n1"], y["n2"] = (rest[0], rest[1]), (rest[2], rest[3])
        if variant == "galerkin":
            return galerkin(y)
        return fourier(y, path=variant.split("-")[1])

    assert torch.autograd.gradcheck(call, tensors, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_cross_and_normalized_attention_match_the_reference(dtype, gen):
    """M != N with their own coordinates and weights (Galerkin, both Fourier paths) and GNOT's
    normalised attention, single and heterogeneous, against the float64 CPU functions."""
    b, h, n, m, d, p = 2, 3, 301, 157, 16, 2
    cpu = {"q": torch.randn(b, h, n, d, generator=gen, dtype=torch.float64),
           "k": torch.randn(b, h, m, d, generator=gen, dtype=torch.float64),
           "v": torch.randn(b, h, m, d, generator=gen, dtype=torch.float64),
           "pos": torch.rand(b, n, p, generator=gen, dtype=torch.float64),
           "kv_pos": torch.rand(b, m, p, generator=gen, dtype=torch.float64),
           "weight": torch.rand(b, m, generator=gen, dtype=torch.float64)}
    cpu["weight"][0, :10] = 0.0
    norm = (1 + 0.2 * torch.randn(h, d, generator=gen, dtype=torch.float64),
            0.1 * torch.randn(h, d, generator=gen, dtype=torch.float64))
    x = {key: t.to("cuda", dtype) for key, t in cpu.items()}
    ref = {key: t.cpu().double() for key, t in x.items()}
    x_norm = tuple(t.to("cuda", dtype) for t in norm)
    ref_norm = tuple(t.cpu().double() for t in x_norm)

    def calls(y, nrm):
        common = dict(pos=y["pos"], kv_pos=y["kv_pos"], weight=y["weight"])
        return [
            ops.galerkin_attention(y["q"], y["k"], y["v"], k_norm=nrm, v_norm=nrm, **common),
            ops.fourier_attention(y["q"], y["k"], y["v"], q_norm=nrm, k_norm=nrm,
                                  path="factored", **common),
            ops.fourier_attention(y["q"], y["k"], y["v"], q_norm=nrm, k_norm=nrm,
                                  path="quadratic", **common),
            ops.normalized_attention(y["q"], y["k"], y["v"], skip=True, **common),
            ops.hetero_normalized_attention(
                y["q"], [y["k"], y["k"][:, :, :50]], [y["v"], y["v"][:, :, :50]], pos=y["pos"],
                kv_pos=[y["kv_pos"], y["kv_pos"][:, :50]],
                weights=[y["weight"], y["weight"][:, :50]], reduce="mean"),
        ]

    poison_cuda_cache()
    for got, want in zip(calls(x, x_norm), calls(ref, ref_norm), strict=True):
        assert got.is_cuda and got.dtype == dtype and torch.isfinite(got).all()
        assert rel_err(got, want) <= TOLERANCE[dtype]


def test_cuda_graph_capture_and_replay(gen):
    case = Case(2, 4, 257, 32, P=2)
    x = to_cuda(make_cpu_inputs(case, gen), torch.float32)
    static = {key: x[key] for key in ("q", "k", "v")}
    for t in static.values():
        t.requires_grad_()
    upstream = torch.randn(case.B, case.H, case.N, case.D + case.P, device="cuda")

    def step():
        y = {**x, **static}
        out = galerkin(y) + fourier(y)
        return torch.autograd.grad(out, list(static.values()), upstream)

    check_graph_replay(step, list(static.values()))


def test_torch_compile_cuda(gen):
    case = Case(2, 2, 64, 16, P=2, weight="batched")
    x = to_cuda(make_cpu_inputs(case, gen), torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(lambda y: galerkin(y) + fourier(y), fullgraph=True)
    torch.testing.assert_close(compiled(x), galerkin(x) + fourier(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forward_and_backward_are_bitwise_reproducible(dtype, gen):
    """Every sum has a fixed order (no atomics): two runs give the same bits."""
    case = Case(2, 3, 3000, 32, P=2, weight="batched", layout="projected")
    x = to_cuda(make_cpu_inputs(case, gen, requires_grad=True), dtype)
    names, tensors = grad_inputs(x)
    for t in tensors:
        t.requires_grad_()
    upstream = torch.randn(case.B, case.H, case.N, case.D + case.P, device="cuda", dtype=dtype)
    for fn, kw in ((galerkin, {}), (fourier, {"path": "factored"}),
                   (fourier, {"path": "quadratic"})):
        runs = []
        for _ in range(2):
            poison_cuda_cache()
            out = fn(x, **kw)
            runs.append((out, *torch.autograd.grad(out, tensors, upstream)))
        for a, b in zip(*runs, strict=True):
            assert torch.equal(a, b), (fn.__name__, kw)


@pytest.mark.parametrize("dim", [3, 33, 100, 140])  # d > 128: formulas
def test_constant_rows_of_any_width_and_size_give_the_bias_cuda(dim, gen):
    """As the CPU test: every constant float32 row normalises to exactly β (the second pass
    corrects the mean, which D copies of c do not sum to exactly)."""
    constants = torch.cat([torch.linspace(1e3, 2e5, 400), torch.linspace(-7.5, 3.3, 100),
                           1e30 * torch.rand(50, generator=gen), torch.tensor([0.0, 1e-30])])
    k = constants[:, None, None, None].expand(-1, 1, 1, dim).cuda()
    beta = torch.randn(1, dim, generator=gen).cuda()
    gamma = (torch.rand(1, dim, generator=gen) + 0.5).cuda()
    s = ops.kv_reduce(k, torch.ones(len(constants), 1, 1, 1, device="cuda"), kv_pos=None,
                      weight=torch.ones(1, device="cuda"), k_map="layer_norm",
                      k_norm=(gamma, beta), v_map="identity", v_norm=None, eps=1e-5,
                      ones_column=False)
    assert torch.equal(s[:, 0, :, 0], beta.expand(len(constants), dim))


@pytest.mark.parametrize("dim", [5, 140], ids=["kernels", "formulas"])  # d > 128: formulas
@pytest.mark.parametrize("magnitude", [1e-30, 1e-3, 1e20, 1e36])
def test_layer_norm_across_the_float32_range_cuda(magnitude, dim, gen):
    """As the CPU test: float32 rows of any magnitude are normalised right by the kernels and
    by the formulas; a constant row gives the bias; non-finite input stays non-finite."""
    q = torch.randn(2, 2, 7, dim, generator=gen)
    k = magnitude * torch.randn(2, 2, 7, dim, generator=gen)
    v = torch.randn(2, 2, 7, dim, generator=gen)
    k[0, 0, 3] = magnitude  # a constant row
    norm = (1 + 0.1 * torch.randn(2, dim, generator=gen), 0.1 * torch.randn(2, dim, generator=gen))
    norm64 = tuple(p.double() for p in norm)
    out = ops.galerkin_attention(q.cuda(), k.cuda(), v.cuda(),
                                 k_norm=tuple(p.cuda() for p in norm),
                                 v_norm=tuple(p.cuda() for p in norm))
    ref = reference.galerkin_attention(q.double(), k.double(), v.double(), k_norm=norm64,
                                       v_norm=norm64)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    k[1, 1, 2, 0] = torch.inf
    out = ops.galerkin_attention(q.cuda(), k.cuda(), v.cuda(),
                                 k_norm=tuple(p.cuda() for p in norm))
    assert not torch.isfinite(out[1, 1]).all()
