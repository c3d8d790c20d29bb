"""The fused softmax attention (``torch.ops.galerkin_ext.softmax_attention``, the CPU path of
``ops.continuum_attention`` with dropout, which the TNO and the softmax-type layer take in
training) against float64 formulas with the masks of an independent numpy Threefry: values,
each row's log-sum-exp, gradients (the key bias's included), its exponential over the whole
float range, thread-count invariance, what it keeps for the backward, its checks, and its place
in ops and layers."""

import math

import pytest
import torch
from attention_cases import F64
from pairwise_cases import (
    SIZES,
    TOLERANCE,
    assert_close,
    assert_thread_count_invariant,
    draw_seed,
    largest_saved,
    multipliers,
    operands,
)

from galerkin_ext import ops
from galerkin_ext.functional import log_weight_bias
from galerkin_ext.layers import ContinuumAttention, SimpleAttention, draw_torch_masks

SCALE = 0.7


def _formula(q, k, v, bias, scale: float, p: float, seed: int):
    """``(dropout(softmax(scale q kᵀ + bias)) v, logsumexp)`` through the N × M matrix."""
    logits = scale * (q @ k.transpose(-2, -1))
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    probs = logits.softmax(dim=-1)
    if p > 0.0:
        probs = probs * multipliers(probs.shape, p, seed).to(probs.dtype)
    return probs @ v, logits.logsumexp(dim=-1)


def _bias(size, dtype, gen):
    """A (B, M) key bias with the first key removed (-inf) where there is a second."""
    b, _, _, m, _, _ = size
    bias = torch.randn(b, m, generator=gen, dtype=dtype)
    if m > 1:
        bias[:, 0] = -math.inf
    return bias


def _forward_and_backward(size, dtype, p, with_bias, gen):
    """The op's outputs and gradients against the formula's in float64 (each pair zipped)."""
    q, k, v = operands(size, dtype, gen)
    bias = _bias(size, dtype, gen) if with_bias else None
    seed = draw_seed(gen)
    out, lse = torch.ops.galerkin_ext.softmax_attention(q, k, v, bias, SCALE, p,
                                                        torch.tensor(seed))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    bias_leaf = None if bias is None else bias.double().requires_grad_()
    expected, expected_lse = _formula(*leaves, bias_leaf, SCALE, p, seed)
    grad = torch.randn(out.shape, generator=gen, dtype=dtype)
    grads = torch.ops.galerkin_ext.softmax_attention_backward(
        grad, q, k, v, bias, out, lse, SCALE, p, torch.tensor(seed))
    expected.backward(grad.double())
    wanted = [leaf.grad for leaf in leaves]
    wanted.append(bias_leaf.grad if bias_leaf is not None else None)
    return [(out, expected.detach()), (lse, expected_lse.detach())], list(zip(grads, wanted,
                                                                              strict=True))


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_the_op_and_its_backward_are_the_formulas(size, dtype, p, with_bias, gen):
    if with_bias and size[3] == 1:
        pytest.skip("one key, removed: no probabilities (NaN, as softmax's)")
    values, grads = _forward_and_backward(size, dtype, p, with_bias, gen)
    for got, expected in values:
        assert got.dtype == dtype
        assert_close(got, expected)
    for got, expected in grads:
        if expected is None:  # no bias: an empty placeholder
            assert got.numel() == 0
            continue
        assert got.dtype == dtype and got.is_contiguous()
        assert_close(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
def test_large_logits_keep_the_row_maximum_out_of_the_exponential(dtype, gen):
    """Logits of several hundred, where exp overflows unless the row maximum is subtracted."""
    q, k, v = operands((2, 2, 9, 40, 4, 3), dtype, gen)
    q = q * 60
    out, lse = torch.ops.galerkin_ext.softmax_attention(q, k, v, None, 1.0, 0.0,
                                                        torch.tensor(0))
    expected, expected_lse = _formula(q.double(), k.double(), v.double(), None, 1.0, 0.0, 0)
    assert lse.abs().max() > 300
    assert_close(out, expected)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=TOLERANCE[dtype], atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("m", [1, 13, 21])
def test_rows_of_logits_far_below_zero(dtype, m, gen):
    """Every logit of a row far below 0 (tiny quadrature weights' log as the key bias), over
    key counts that leave a partial vector: the vector lanes past the last key must not enter
    the row maximum (a 0 there made every exp underflow: NaN rows, lse -inf)."""
    q, k, v = operands((2, 2, 3, m, 4, 3), dtype, gen)
    shift = -math.log(torch.finfo(dtype).tiny) + 50  # below exp's range, even less a few
    bias = torch.full((2, m), -shift, dtype=dtype)
    out, lse = torch.ops.galerkin_ext.softmax_attention(q, k, v, bias, SCALE, 0.0,
                                                        torch.tensor(0))
    expected, expected_lse = _formula(q.double(), k.double(), v.double(), bias.double(), SCALE,
                                      0.0, 0)
    assert_close(out, expected)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=TOLERANCE[dtype], atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
def test_each_probability_to_its_dtypes_precision_over_the_whole_range(dtype):
    """The op's exponential (its own, vectorised): one query against keys whose logits run from
    0 to below the least normal number's log, with the identity as values, so the output is the
    row of probabilities itself. Each is within 3 ulp of float64's where it is a normal
    number, and below that at most the least normal number (where the kernel gives 0)."""
    info = torch.finfo(dtype)
    lowest = math.log(info.tiny)
    logits = torch.linspace(lowest * 1.02, 0.0, 4001, dtype=F64)
    logits = torch.cat([logits, torch.tensor([-math.inf], dtype=F64)])  # and a removed key
    m = logits.numel()
    q = torch.ones(1, 1, 1, 1, dtype=dtype)
    k = logits.to(dtype).reshape(1, 1, m, 1)
    v = torch.eye(m, dtype=dtype).reshape(1, 1, m, m)
    out, _ = torch.ops.galerkin_ext.softmax_attention(q, k, v, None, 1.0, 0.0, torch.tensor(0))
    expected = (k.double().reshape(-1)).softmax(dim=0)
    got = out.reshape(-1).double()
    normal = expected > info.tiny * 1.01
    assert normal.float().mean() > 0.9
    torch.testing.assert_close(got[normal], expected[normal], rtol=3 * info.eps, atol=0)
    assert (got[~normal] - expected[~normal]).abs().max() <= info.tiny
    assert got[-1] == 0


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_non_finite_inputs_give_softmaxs_non_finite_rows(p, gen):
    """NaN in a query reaches that row only, NaN in a key every row, and an infinite key the rows
    whose logit it makes +inf or NaN: where SDPA's rows are NaN the op's are, with or without
    dropout (a dropped NaN stays NaN), and the other rows agree with it."""
    q, k, v = operands((1, 1, 5, 70, 3, 2), torch.float32, gen)
    q[0, 0, 1, 0] = math.nan
    nan_key, inf_key = k.clone(), k.clone()
    nan_key[0, 0, 5, 1] = math.nan
    inf_key[0, 0, 5, 1] = math.inf
    for keys in (k, nan_key, inf_key):
        out, _ = torch.ops.galerkin_ext.softmax_attention(q, keys, v, None, 1.0, p,
                                                          torch.tensor(3))
        expected = torch.nn.functional.scaled_dot_product_attention(q, keys, v, scale=1.0)
        nan_rows = expected.isnan().any(dim=-1)
        assert torch.equal(out.isnan().any(dim=-1), nan_rows) and nan_rows.any()
        if p == 0.0:
            torch.testing.assert_close(out[~nan_rows], expected[~nan_rows])


def test_non_contiguous_operands(gen):
    """Heads split from projected rows ((B, N, H, d) transposed), a sliced value, a broadcast
    bias."""
    q = torch.randn(2, 11, 3, 4, generator=gen, dtype=F64).transpose(1, 2)
    k = torch.randn(2, 17, 3, 4, generator=gen, dtype=F64).transpose(1, 2)
    v = torch.randn(2, 3, 17, 9, generator=gen, dtype=F64)[..., ::2]
    bias = torch.randn(17, generator=gen, dtype=F64).expand(2, 17)
    seed = draw_seed(gen)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    out, _ = torch.ops.galerkin_ext.softmax_attention(*leaves[:3], leaves[3], SCALE, 0.25,
                                                      torch.tensor(seed))
    references = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    expected, _ = _formula(*references, SCALE, 0.25, seed)
    assert_close(out, expected.detach())
    grad = torch.randn(out.shape, generator=gen, dtype=F64)
    out.backward(grad)
    expected.backward(grad)
    for leaf, reference in zip(leaves, references, strict=True):
        assert_close(leaf.grad, reference.grad)


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gradcheck_and_gradgradcheck(p, with_bias, gen):
    q, k, v = (t.requires_grad_() for t in operands((2, 1, 5, 7, 3, 2), F64, gen))
    inputs = [q, k, v]
    if with_bias:
        inputs.append(torch.randn(2, 7, generator=gen, dtype=F64, requires_grad=True))
    seed = torch.tensor(draw_seed(gen))

    def f(q, k, v, bias=None):
        return torch.ops.galerkin_ext.softmax_attention(q, k, v, bias, SCALE, p, seed)[0]

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("size", [(1, 1, 1, 1, 1, 1), (2, 3, 9, 70, 5, 4), (1, 2, 0, 4, 3, 2)],
                         ids=str)
def test_opcheck(size, p, with_bias, gen):
    q, k, v = (t.requires_grad_() for t in operands(size, torch.float32, gen))
    bias = (torch.randn(size[0], size[3], generator=gen).requires_grad_() if with_bias
            else None)
    torch.library.opcheck(torch.ops.galerkin_ext.softmax_attention.default,
                          (q, k, v, bias, SCALE, p, torch.tensor(draw_seed(gen))))


def test_the_result_does_not_depend_on_the_thread_count(gen):
    q, k, v = operands((2, 3, 150, 90, 6, 5), torch.float32, gen)
    bias = torch.randn(2, 90, generator=gen)
    grad = torch.randn(2, 3, 150, 5, generator=gen)
    seed = torch.tensor(draw_seed(gen))

    def forward_and_backward():
        out, lse = torch.ops.galerkin_ext.softmax_attention(q, k, v, bias, SCALE, 0.2, seed)
        return [out, lse, *torch.ops.galerkin_ext.softmax_attention_backward(
            grad, q, k, v, bias, out, lse, SCALE, 0.2, seed)]

    assert_thread_count_invariant(forward_and_backward)


def test_empty_operands(gen):
    seed = torch.tensor(1)
    q, k, v = torch.randn(2, 1, 4, 3), torch.randn(2, 1, 0, 3), torch.randn(2, 1, 0, 5)
    out, lse = torch.ops.galerkin_ext.softmax_attention(q, k, v, torch.ones(2, 0), 1.0, 0.5,
                                                        seed)
    assert torch.equal(out, torch.zeros(2, 1, 4, 5))  # no keys: sums over nothing
    assert torch.equal(lse, torch.full((2, 1, 4), -math.inf))
    grads = torch.ops.galerkin_ext.softmax_attention_backward(
        torch.ones(2, 1, 4, 5), q, k, v, torch.ones(2, 0), out, lse, 1.0, 0.5, seed)
    assert [tuple(g.shape) for g in grads] == [(2, 1, 4, 3), (2, 1, 0, 3), (2, 1, 0, 5), (2, 0)]
    assert not grads[0].any()
    out, lse = torch.ops.galerkin_ext.softmax_attention(
        torch.randn(0, 2, 4, 3), torch.randn(0, 2, 6, 3), torch.randn(0, 2, 6, 5), None, 1.0,
        0.5, seed)
    assert out.shape == (0, 2, 4, 5) and lse.shape == (0, 2, 4)


def test_the_op_refuses_bad_arguments():
    q, k, v, seed = torch.ones(1, 2, 3, 4), torch.ones(1, 2, 5, 4), torch.ones(1, 2, 5, 6), \
        torch.tensor(1)
    op = torch.ops.galerkin_ext.softmax_attention
    cases = [
        ((q[0], k, v, None, 1.0, 0.5, seed), r"q, k, v: expected \(B, H, N, d\)"),
        ((q, k[..., :3], v, None, 1.0, 0.5, seed), r"q, k, v: expected \(B, H, N, d\)"),
        ((q.half(), k.half(), v.half(), None, 1.0, 0.5, seed), "q: expected float32 or float64"),
        ((q, k, v.double(), None, 1.0, 0.5, seed), "k, v: expected q's dtype"),
        ((q, k, v, None, 1.0, 1.0, seed), r"p: expected 0 <= p < 1"),
        ((q, k, v, None, 1.0, 0.5, torch.tensor(1.0)), "seed: expected a 0-dim int64"),
        ((q, k, v, torch.ones(1, 4), 1.0, 0.5, seed), r"bias: expected Float of shape \(1, 5\)"),
        ((q, k, v, torch.ones(1, 5, dtype=F64), 1.0, 0.5, seed), "bias: expected Float"),
        ((q, k, v, None, math.inf, 0.5, seed), "scale: expected a finite float, got inf"),
        ((q, k, v, None, math.nan, 0.5, seed), "scale: expected a finite float, got nan"),
    ]
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            op(*args)
    out, lse = op(q, k, v, None, 1.0, 0.5, seed)
    backward = torch.ops.galerkin_ext.softmax_attention_backward
    backward_cases = [
        ((torch.ones(1, 2, 3, 5), q, k, v, None, out, lse), r"grad_out: expected Float of shape"),
        ((out, q, k, v, None, out[..., :2], lse), "out: expected the forward's output"),
        ((out, q, k, v, None, out, lse[..., :2]), "lse: expected the forward's"),
    ]
    for args, match in backward_cases:
        with pytest.raises(RuntimeError, match=match):
            backward(*args, 1.0, 0.5, seed)


def _continuum_inputs(gen, n=120, m=100):
    """ops.continuum_attention's q, k, v and (B, M) weights (a removed key, and one a million
    times the others) in float64, every tensor requiring grad."""
    q = torch.randn(2, 3, n, 4, generator=gen, dtype=F64, requires_grad=True)
    k = torch.randn(2, 3, m, 4, generator=gen, dtype=F64, requires_grad=True)
    v = torch.randn(2, 3, m, 5, generator=gen, dtype=F64, requires_grad=True)
    weight = torch.rand(2, m, generator=gen, dtype=F64)
    weight[0, 3], weight[1, 2] = 0.0, 1e6
    return q, k, v, weight.requires_grad_()


def test_continuum_attention_with_dropout_is_the_formula_without_its_matrix(gen):
    """On the CPU ops.continuum_attention with dropout runs the fused op: from the same seed it
    gives the formula with the dropout op's mask on the probabilities, values and gradients
    (the weights' too), and keeps nothing of N × M elements for the backward, where SDPA with
    torch's masks keeps the matrix."""
    q, k, v, weight = inputs = _continuum_inputs(gen)
    torch.manual_seed(5)
    out = ops.continuum_attention(q, k, v, weight=weight, dropout_p=0.3)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    torch.manual_seed(5)
    seed = int(torch.randint(2**62, (), dtype=torch.int64))
    bias, _ = log_weight_bias(weight, 2, 100)
    expected, _ = _formula(q, k, v, bias, 0.5, 0.3, seed)
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs)
    assert_close(out, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        assert_close(got, want)
    assert grads[3][0, 3] == 0  # the removed key
    n_by_m = 2 * 3 * 120 * 100
    assert largest_saved(lambda: ops.continuum_attention(q, k, v, weight=weight,
                                                         dropout_p=0.3)) < n_by_m / 10
    assert largest_saved(lambda: ops.continuum_attention(q, k, v, weight=weight, dropout_p=0.3,
                                                         torch_masks=True)) >= n_by_m


def test_continuum_attention_with_dropout_under_forward_mode_ad(gen):
    """Forward-mode AD takes SDPA's math kernel with torch's masks (the fused op has no forward
    derivative): the tangent is the directional derivative of that masked function."""
    q, k, v, weight = (t.detach() for t in _continuum_inputs(gen, 30, 20))
    tangent = torch.randn(q.shape, generator=gen, dtype=F64)

    def f(q):
        torch.manual_seed(2)
        return ops.continuum_attention(q, k, v, weight=weight, dropout_p=0.3)

    def primal(q):  # f under forward AD too: its masks
        return torch.func.jvp(f, (q,), (tangent,))[0]

    _, jvp = torch.func.jvp(f, (q,), (tangent,))
    step = 1e-6
    torch.testing.assert_close(
        jvp, (primal(q + step * tangent) - primal(q - step * tangent)) / (2 * step),
        rtol=1e-6, atol=1e-6)


def test_compiled_continuum_attention_with_dropout(gen):
    q, k, v, weight = (t.detach() for t in _continuum_inputs(gen))
    f = torch.compile(lambda q, k, v, w: ops.continuum_attention(q, k, v, weight=w,
                                                                 dropout_p=0.3),
                      backend="aot_eager", fullgraph=True)
    q.requires_grad_()
    out = f(q, k, v, weight)
    out.sum().backward()
    assert out.shape == (2, 3, 120, 5) and q.grad is not None and q.grad.isfinite().all()


def test_second_order_gradients_through_the_dropout(gen):
    """create_graph=True: the fused op's backward is formulas with the same mask, so gradients
    of gradients are exact (checked against the formula's)."""
    q, k, v, weight = _continuum_inputs(gen, 7, 6)
    torch.manual_seed(8)
    out = ops.continuum_attention(q, k, v, weight=weight, dropout_p=0.4)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    second = torch.autograd.grad(grad_q.square().sum(), (q, k, v, weight))
    torch.manual_seed(8)
    seed = int(torch.randint(2**62, (), dtype=torch.int64))
    bias, _ = log_weight_bias(weight, 2, 6)
    expected, _ = _formula(q, k, v, bias, 0.5, 0.4, seed)
    (expected_grad_q,) = torch.autograd.grad(expected.square().sum(), q, create_graph=True)
    expected_second = torch.autograd.grad(expected_grad_q.square().sum(), (q, k, v, weight))
    for got, want in zip(second, expected_second, strict=True):
        assert_close(got, want)


@pytest.mark.parametrize("make_layer", [
    lambda: ContinuumAttention(12, 3, attn_dropout=0.3),
    lambda: SimpleAttention(12, 3, "softmax", pos_dim=2, attn_dropout=0.3),
], ids=["continuum", "softmax_type"])
def test_the_layers_train_on_the_fused_op_and_draw_torchs_masks_when_asked(make_layer, gen):
    layer = make_layer().train()
    x = torch.randn(2, 150, 12, generator=gen)
    pos = torch.rand(150, 2, generator=gen)

    def forward():
        return layer(x, pos) if isinstance(layer, SimpleAttention) else layer(x)

    n_by_m = 2 * 3 * 150 * 150
    assert largest_saved(forward) < n_by_m / 10
    torch.manual_seed(4)
    ours = forward()
    draw_torch_masks(layer)
    assert largest_saved(forward) >= n_by_m
    torch.manual_seed(4)
    torchs = forward()
    assert ours.shape == torchs.shape and not torch.allclose(ours, torchs)
