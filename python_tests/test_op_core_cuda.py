"""The CUDA twins of the op core (kv_reduce_cuda.cpp, q_apply_cuda.cpp on reduce_cuda.cu and
apply_cuda.cu) against the explicit float64 sums of test_op_core.py, in every dtype: every row
map, the normaliser's column and several normalisers, M != N, M = 1, N = 1, widths at the
kernels' tile edges and limit (P + D = 128), many points (several splits), non-contiguous inputs;
gradients against the float64 CPU core, gradcheck, opcheck, bitwise repeatability, float32
parameters with half activations, CUDA-graph capture.

Skipped where there is no GPU or the extension was built without CUDA. Outputs are poisoned
(test_attention_cuda.poison_cuda_cache): an element a kernel forgets to write shows as NaN.
"""

import pytest
import torch
from attention_cases import needs_cuda
from test_attention_cuda import check_graph_replay, poison_cuda_cache, rel_err
from test_op_core import (
    MAPS,
    SHAPES,
    apply_args,
    core_fn,
    core_inputs,
    core_leaves,
    explicit_apply,
    explicit_s,
    reduce_args,
    run_opchecks,
)

from galerkin_ext import ops

pytestmark = needs_cuda

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 3e-3,
             torch.bfloat16: 2e-2}

# Beyond test_op_core's shapes: tile edges of the reduce (widths 8, 9, 64, 65) and the widest
# rows (P + D = 128; with the ones column P + D_v + 1 = 128), and enough points for several splits.
CUDA_SHAPES = SHAPES + [
    (2, 3, 70, 2100, 7, 7, 1, "batched", "batched", True),
    (1, 2, 130, 90, 63, 62, 1, "shared", "batched", False),
    (3, 1, 65, 40, 96, 95, 32, "batched", None, True),
    (1, 1, 4099, 5000, 8, 8, 0, None, "shared", False),
]


def to_cuda(x: dict, dtype) -> dict:
    """CUDA copies in dtype; the maps' names pass through."""
    def one(val):
        if isinstance(val, tuple):
            return tuple(one(t) for t in val)
        return val.to("cuda", dtype) if isinstance(val, torch.Tensor) else val
    return {key: one(val) for key, val in x.items()}


def to_reference(x: dict) -> dict:
    """The inputs as the kernels got them (rounded to their dtype), float64 on the CPU."""
    def one(val):
        if isinstance(val, tuple):
            return tuple(one(t) for t in val)
        return val.detach().cpu().double() if isinstance(val, torch.Tensor) else val
    return {key: one(val) for key, val in x.items()}


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("maps", MAPS, ids=str)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=str)
def test_kv_reduce_and_q_apply_match_explicit_sums(shape, maps, dtype, gen):
    x = to_cuda(core_inputs(shape, maps, gen), dtype)
    ref = to_reference(x)
    for ones_column in (False, True):
        poison_cuda_cache()
        s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, ones_column))
        expected = explicit_s(ref["k"], ref["v"], ref["kv_pos"], ref["weight"], ref["k_map"],
                              ref["k_norm"], ref["v_map"], ref["v_norm"], ones_column)
        assert s.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert torch.isfinite(s).all(), "unwritten (poisoned) entries"
        assert rel_err(s, expected) <= TOLERANCE[dtype]
        normalizers = int(ones_column)
        for skip in (False, True) if shape[4] == shape[5] else (False,):
            poison_cuda_cache()
            out = torch.ops.galerkin_ext.q_apply(*apply_args(x, s, normalizers, skip))
            assert out.dtype == dtype and torch.isfinite(out).all()
            want = explicit_apply(ref["q"], ref["pos"], ref["k_map"], ref["q_norm"], s.cpu(),
                                  normalizers, skip)
            assert rel_err(out, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_several_normalizers_and_a_block_without_keys(dtype, gen):
    x = to_cuda(core_inputs((2, 2, 300, 250, 5, 6, 1, "batched", "batched", True),
                            ("softmax", "identity"), gen), dtype)
    s1 = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, True))
    x["weight"][1] = 0.0  # sample 1 has no keys in the second block
    s2 = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, True))
    s = torch.cat([s1, s2, s1], dim=-1)
    out = torch.ops.galerkin_ext.q_apply(*apply_args(x, s, 3))
    ref = to_reference(x)
    assert rel_err(out, explicit_apply(ref["q"], ref["pos"], "softmax", None, s.cpu(), 3)) <= \
        TOLERANCE[dtype]


def _grads(x, ones_column, upstream_gen, skip=False):
    """Output and gradients of every input of kv_reduce then q_apply, for x's device/dtype."""
    leaves = core_leaves(x)
    out = core_fn(x, ones_column, skip)(*leaves)
    upstream = torch.randn(out.shape, generator=upstream_gen, dtype=torch.float64)
    return out, torch.autograd.grad(out, leaves, upstream.to(out))


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("maps", MAPS, ids=str)
@pytest.mark.parametrize("shape", [CUDA_SHAPES[3], CUDA_SHAPES[5], CUDA_SHAPES[8]], ids=str)
def test_gradients_match_the_float64_cpu_core(shape, maps, dtype, gen):
    """Every input's gradient (q, k, v, pos, kv_pos, weight, the norm parameters) against the
    CPU core in float64 (itself checked against explicit sums and gradcheck); with q_apply's
    skip term where D_k = D_v."""
    x = to_cuda(core_inputs(shape, maps, gen), dtype)
    ones_column, skip = maps[0] == "softmax", shape[4] == shape[5]
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    poison_cuda_cache()
    _, got = _grads(x, ones_column, torch.Generator().manual_seed(seed), skip)
    _, want = _grads(to_reference(x), ones_column, torch.Generator().manual_seed(seed), skip)
    for g, w in zip(got, want, strict=True):
        assert g.is_cuda and torch.isfinite(g).all()
        assert rel_err(g, w) <= 10 * TOLERANCE[dtype]


@pytest.mark.parametrize("maps", MAPS, ids=str)
def test_gradcheck_float64(maps, gen):
    x = to_cuda(core_inputs((2, 2, 4, 3, 3, 2, 1, "batched", "batched", True), maps, gen),
                torch.float64)
    x["weight"] = x["weight"] + 0.1
    assert torch.autograd.gradcheck(core_fn(x, maps[0] == "softmax"), core_leaves(x))


@pytest.mark.parametrize("maps", [("layer_norm", "layer_norm"), ("softmax", "identity")],
                         ids=str)
def test_opcheck(maps, gen):
    x = to_cuda(core_inputs((2, 2, 5, 3, 3, 3, 1, "shared", "batched", True), maps, gen),
                torch.float32)
    run_opchecks(x, maps[0] == "softmax")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("maps", [("layer_norm", "layer_norm"), ("softmax", "identity")],
                         ids=str)
def test_forward_and_backward_are_bitwise_reproducible(maps, dtype, gen):
    """Every sum has a fixed order (no atomics): two runs give the same bits."""
    x = to_cuda(core_inputs((2, 3, 3000, 2900, 16, 16, 2, "batched", "batched", True), maps,
                            gen), dtype)
    runs = []
    for _ in range(2):
        poison_cuda_cache()
        out, grads = _grads(x, maps[0] == "softmax", torch.Generator().manual_seed(1))
        runs.append((out, *grads))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_float32_parameters_with_half_activations(dtype, gen):
    """Quadrature weights and norm parameters may stay float32 beside half activations (small
    weights are not rounded to subnormals; the parameters' gradients come back in float32)."""
    x = core_inputs((2, 2, 40, 30000, 8, 8, 1, "batched", "batched", False),
                    ("layer_norm", "layer_norm"), gen)
    x["weight"] = x["weight"] / 30000  # below 2^-14 ≈ 6.1e-5: subnormal in float16
    low = to_cuda(x, dtype)
    for key in ("weight", "q_norm", "k_norm", "v_norm"):
        low[key] = to_cuda({key: x[key]}, torch.float32)[key]
    s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(low, False))
    ref = to_reference(low)
    expected = explicit_s(ref["k"], ref["v"], ref["kv_pos"], ref["weight"], "layer_norm",
                          ref["k_norm"], "layer_norm", ref["v_norm"], False)
    assert rel_err(s, expected) <= TOLERANCE[dtype]
    _, grads = _grads(low, False, torch.Generator().manual_seed(2))
    assert grads[5].dtype == torch.float32 and grads[-1].dtype == torch.float32


def test_cuda_graph_capture_and_replay(gen):
    x = to_cuda(core_inputs((2, 4, 257, 190, 32, 32, 2, "batched", "batched", False),
                            ("layer_norm", "layer_norm"), gen), torch.float32)
    static = {key: x[key].requires_grad_() for key in ("q", "k", "v")}

    def step():
        y = {**x, **static}
        s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(y, True))
        out = torch.ops.galerkin_ext.q_apply(*apply_args(y, s, 1))
        return torch.autograd.grad(out.square().sum(), list(static.values()))

    check_graph_replay(step, list(static.values()))


def test_wider_than_the_kernels_is_a_clear_error(gen):
    """The op names the limit; ops.py sends such shapes to the formulas instead."""
    k = torch.randn(1, 1, 5, 128, device="cuda")
    with pytest.raises(RuntimeError, match="v: the CUDA kernels take rows of width"):
        torch.ops.galerkin_ext.kv_reduce(k, k, None, None, "identity", None, None, "identity",
                                         None, None, 1e-5, True)
    out = ops.normalized_attention(k, k, k)  # the formula: width 128 + ones column
    assert out.shape == (1, 1, 5, 128)
