"""The fused quadratic attention (``torch.ops.galerkin_ext.quadratic_attention``, the CPU path of
``ops.fourier_attention`` and of Fourier-type layers with dropout) against float64 formulas with
the masks of an independent numpy Threefry: values, gradients, thread-count invariance, what it
keeps for the backward, its checks, and its place in ops and layers."""

import pytest
import torch
from attention_cases import F64
from pairwise_cases import (
    SIZES,
    assert_close,
    assert_thread_count_invariant,
    draw_seed,
    largest_saved,
    multipliers,
    operands,
)

from galerkin_ext import ops
from galerkin_ext.layers import SimpleAttention, draw_torch_masks


def _formula(q, k, v, p: float, seed: int) -> torch.Tensor:
    attn = q @ k.transpose(-2, -1)
    if p > 0.0:
        attn = attn * multipliers(attn.shape, p, seed).to(attn.dtype)
    return attn @ v


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_the_op_and_its_backward_are_the_formulas(size, dtype, p, gen):
    q, k, v = operands(size, dtype, gen)
    seed = draw_seed(gen)
    out = torch.ops.galerkin_ext.quadratic_attention(q, k, v, p, torch.tensor(seed))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    expected = _formula(*leaves, p, seed)
    assert_close(out, expected)
    grad = torch.randn(out.shape, generator=gen, dtype=dtype)
    grads = torch.ops.galerkin_ext.quadratic_attention_backward(grad, q, k, v, p,
                                                                torch.tensor(seed))
    expected.backward(grad.double())
    for got, leaf in zip(grads, leaves, strict=True):
        assert got.dtype == dtype and got.is_contiguous()
        assert_close(got, leaf.grad)


def test_non_contiguous_operands(gen):
    """Heads split from projected rows ((B, N, H, d) transposed) and a sliced value."""
    q = torch.randn(2, 11, 3, 4, generator=gen, dtype=F64).transpose(1, 2)
    k = torch.randn(2, 17, 3, 4, generator=gen, dtype=F64).transpose(1, 2)
    v = torch.randn(2, 3, 17, 9, generator=gen, dtype=F64)[..., ::2]
    seed = draw_seed(gen)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = torch.ops.galerkin_ext.quadratic_attention(*leaves, 0.25, torch.tensor(seed))
    assert_close(out, _formula(q, k, v, 0.25, seed))
    grad = torch.randn(out.shape, generator=gen, dtype=F64)
    out.backward(grad)
    references = [t.detach().requires_grad_() for t in (q, k, v)]
    _formula(*references, 0.25, seed).backward(grad)
    for leaf, reference in zip(leaves, references, strict=True):
        assert_close(leaf.grad, reference.grad)


@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gradcheck_and_gradgradcheck(p, gen):
    q, k, v = (t.requires_grad_() for t in operands((2, 1, 5, 7, 3, 2), F64, gen))
    seed = torch.tensor(draw_seed(gen))

    def f(q, k, v):
        return torch.ops.galerkin_ext.quadratic_attention(q, k, v, p, seed)

    assert torch.autograd.gradcheck(f, (q, k, v))
    assert torch.autograd.gradgradcheck(f, (q, k, v))


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("size", [(1, 1, 1, 1, 1, 1), (2, 3, 9, 70, 5, 4), (1, 2, 0, 4, 3, 2)],
                         ids=str)
def test_opcheck(size, p, gen):
    q, k, v = (t.requires_grad_() for t in operands(size, torch.float32, gen))
    torch.library.opcheck(torch.ops.galerkin_ext.quadratic_attention.default,
                          (q, k, v, p, torch.tensor(draw_seed(gen))))


def test_the_result_does_not_depend_on_the_thread_count(gen):
    q, k, v = operands((2, 3, 150, 90, 6, 5), torch.float32, gen)
    grad = torch.randn(2, 3, 150, 5, generator=gen)
    seed = torch.tensor(draw_seed(gen))
    assert_thread_count_invariant(lambda: [
        torch.ops.galerkin_ext.quadratic_attention(q, k, v, 0.2, seed),
        *torch.ops.galerkin_ext.quadratic_attention_backward(grad, q, k, v, 0.2, seed)])


def test_empty_operands(gen):
    seed = torch.tensor(1)
    q, k, v = torch.randn(2, 1, 4, 3), torch.randn(2, 1, 0, 3), torch.randn(2, 1, 0, 5)
    assert torch.equal(torch.ops.galerkin_ext.quadratic_attention(q, k, v, 0.5, seed),
                       torch.zeros(2, 1, 4, 5))  # no keys: sums over nothing
    grads = torch.ops.galerkin_ext.quadratic_attention_backward(torch.ones(2, 1, 4, 5), q, k, v,
                                                                0.5, seed)
    assert [tuple(g.shape) for g in grads] == [(2, 1, 4, 3), (2, 1, 0, 3), (2, 1, 0, 5)]
    assert not grads[0].any()
    out = torch.ops.galerkin_ext.quadratic_attention(
        torch.randn(0, 2, 4, 3), torch.randn(0, 2, 6, 3), torch.randn(0, 2, 6, 5), 0.5, seed)
    assert out.shape == (0, 2, 4, 5)


def test_the_op_refuses_bad_arguments():
    q, k, v, seed = torch.ones(1, 2, 3, 4), torch.ones(1, 2, 5, 4), torch.ones(1, 2, 5, 6), \
        torch.tensor(1)
    op = torch.ops.galerkin_ext.quadratic_attention
    cases = [
        ((q[0], k, v, 0.5, seed), r"q, k, v: expected \(B, H, N, d\)"),
        ((q, k[..., :3], v, 0.5, seed), r"q, k, v: expected \(B, H, N, d\)"),
        ((q, k, v[:, :, :4], 0.5, seed), r"q, k, v: expected \(B, H, N, d\)"),
        ((q.half(), k.half(), v.half(), 0.5, seed), "q: expected float32 or float64"),
        ((q, k.double(), v, 0.5, seed), "k, v: expected q's dtype"),
        ((q, k, v, 1.0, seed), r"p: expected 0 <= p < 1"),
        ((q, k, v, -0.1, seed), r"p: expected 0 <= p < 1"),
        ((q, k, v, 0.5, torch.tensor([1])), "seed: expected a 0-dim int64"),
    ]
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            op(*args)
    with pytest.raises(RuntimeError, match=r"grad_out: expected Float of shape \(1, 2, 3, 6\)"):
        torch.ops.galerkin_ext.quadratic_attention_backward(torch.ones(1, 2, 3, 5), q, k, v, 0.5,
                                                            seed)


def _fourier_inputs(gen, n=120, m=100):
    """ops.fourier_attention's arguments in float64, every tensor requiring grad."""
    q = torch.randn(2, 3, n, 4, generator=gen, dtype=F64, requires_grad=True)
    k = torch.randn(2, 3, m, 4, generator=gen, dtype=F64, requires_grad=True)
    v = torch.randn(2, 3, m, 5, generator=gen, dtype=F64, requires_grad=True)
    pos = torch.rand(n, 2, generator=gen, dtype=F64, requires_grad=True)
    kv_pos = torch.rand(m, 2, generator=gen, dtype=F64, requires_grad=True)
    weight = torch.rand(2, m, generator=gen, dtype=F64).requires_grad_()
    norms = {name: (1 + 0.1 * torch.randn(3, 4, generator=gen, dtype=F64),
                    0.1 * torch.randn(3, 4, generator=gen, dtype=F64))
             for name in ("q_norm", "k_norm")}
    for weight_and_bias in norms.values():
        for t in weight_and_bias:
            t.requires_grad_()
    return dict(q=q, k=k, v=v, pos=pos, kv_pos=kv_pos, weight=weight, **norms)


def test_fourier_attention_with_dropout_is_the_materialised_path_without_its_matrix(gen):
    """On the CPU ops.fourier_attention with dropout runs the fused op: from the same seed it
    draws the masks that the materialised path (kernel_attention, path="quadratic") draws, so
    it gives its values and gradients, and keeps nothing of N × M elements for the backward."""
    x = _fourier_inputs(gen)
    leaves = [x[name] for name in ("q", "k", "v", "pos", "kv_pos", "weight")]
    leaves += [*x["q_norm"], *x["k_norm"]]
    torch.manual_seed(5)
    fused = ops.fourier_attention(**x, dropout_p=0.3)
    grads = torch.autograd.grad(fused.square().sum(), leaves)
    torch.manual_seed(5)
    materialised, _ = ops.kernel_attention(**x, path="quadratic", dropout_p=0.3)
    expected = torch.autograd.grad(materialised.square().sum(), leaves)
    assert_close(fused, materialised)
    for got, want in zip(grads, expected, strict=True):
        assert_close(got, want)
    n_by_m = 2 * 3 * 120 * 100
    assert largest_saved(lambda: ops.fourier_attention(**x, dropout_p=0.3)) < n_by_m / 10
    assert largest_saved(lambda: ops.kernel_attention(**x, path="quadratic",
                                                       dropout_p=0.3)) >= n_by_m


def test_fourier_attention_with_dropout_under_forward_mode_ad(gen):
    """Forward-mode AD takes the materialised path with torch's masks (the fused op has no
    forward derivative): the tangent is the directional derivative of that masked function."""
    x = {name: t.detach() for name, t in _fourier_inputs(gen, 30, 20).items()
         if name in ("q", "k", "v")}
    tangent = torch.randn(x["q"].shape, generator=gen, dtype=F64)

    def f(q):
        torch.manual_seed(2)
        return ops.fourier_attention(q, x["k"], x["v"], dropout_p=0.3)

    def primal(q):  # f under forward AD too: its masks
        return torch.func.jvp(f, (q,), (tangent,))[0]

    _, jvp = torch.func.jvp(f, (x["q"],), (tangent,))
    step = 1e-6
    torch.testing.assert_close(
        jvp, (primal(x["q"] + step * tangent) - primal(x["q"] - step * tangent)) / (2 * step),
        rtol=1e-6, atol=1e-6)


def test_compiled_fourier_attention_with_dropout(gen):
    x = {name: t.detach() for name, t in _fourier_inputs(gen).items() if name in ("q", "k", "v")}
    f = torch.compile(lambda q, k, v: ops.fourier_attention(q, k, v, dropout_p=0.3),
                      backend="aot_eager", fullgraph=True)
    q = x["q"].requires_grad_()
    out = f(q, x["k"], x["v"])
    out.sum().backward()
    assert out.shape == (2, 3, 120, 5) and q.grad is not None and q.grad.isfinite().all()


def test_the_layer_trains_on_the_fused_op_and_draws_torchs_masks_when_asked(gen):
    layer = SimpleAttention(12, 3, "fourier", pos_dim=2, attn_dropout=0.3).train()
    x = torch.randn(2, 150, 12, generator=gen)
    pos = torch.rand(150, 2, generator=gen)
    n_by_m = 2 * 3 * 150 * 150
    assert largest_saved(lambda: layer(x, pos)) < n_by_m / 10
    torch.manual_seed(4)
    ours = layer(x, pos)
    draw_torch_masks(layer)
    assert largest_saved(lambda: layer(x, pos)) >= n_by_m
    torch.manual_seed(4)
    torchs = layer(x, pos)
    assert ours.shape == torchs.shape and not torch.allclose(ours, torchs)
    layer.eval()  # no dropout: the factored path, whichever masks
    assert largest_saved(lambda: layer(x, pos)) < n_by_m / 10
