"""The compiled dropout op (``torch.ops.galerkin_ext.dropout``, ``ops.dropout``, ``layers.Dropout``)
against an independent numpy Threefry-2x32-20 and the op's documented mask layout, with its
statistics, gradients, layouts and fallbacks."""

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import skip_where_subnormals_flush
from threefry_reference import reference_keep, threefry2x32_20
from torch import nn

from galerkin_ext import ops
from galerkin_ext.layers import Dropout, draw_torch_masks


def reference_dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """``x · (kept ? 1/(1 - p) : 0)`` in ``x``'s dtype, for a contiguous ``x``."""
    values = x.detach().numpy().reshape(-1)
    scale = values.dtype.type(1.0 / (1.0 - p))
    keep = reference_keep(values.size, p, seed)
    out = values * np.where(keep, scale, values.dtype.type(0))
    return torch.from_numpy(out.reshape(x.shape))


def test_the_reference_generator_gives_threefrys_known_answers():
    # Random123's kat_vectors: counter (2 words), key (2 words) -> output (2 words)
    cases = [((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
             ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
             ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0))]
    for (c0, c1), (k0, k1), expected in cases:
        counter = np.array([c0 | c1 << 32], dtype=np.uint64)
        w0, w1 = threefry2x32_20(counter, k0 | k1 << 32)
        assert (int(w0[0]), int(w1[0])) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 31, 63, 64, 65, 1000, 4099])
def test_the_op_is_the_documented_threefry_mask(dtype, n, gen):
    x = torch.randn(n, generator=gen, dtype=dtype)
    p = float(torch.rand((), generator=gen)) * 0.9 + 0.05
    for seed in (int(torch.randint(2**62, (), generator=gen)), -1, -(2**63), 2**40 + 7):
        out = torch.ops.galerkin_ext.dropout(x, p, torch.tensor(seed))
        assert torch.equal(out, reference_dropout(x, p, seed)), (seed, p)


def test_the_mask_follows_memory_order_and_the_layout_is_kept(gen):
    seed = torch.tensor(int(torch.randint(2**62, (), generator=gen)))
    x = torch.randn(3, 5, 7, 4, generator=gen).permute(0, 3, 1, 2)  # channels-last, dense
    out = torch.ops.galerkin_ext.dropout(x, 0.3, seed)
    assert out.stride() == x.stride()
    memory_order = (0, 2, 3, 1)
    expected = reference_dropout(x.permute(memory_order).contiguous(), 0.3, int(seed))
    assert torch.equal(out.permute(memory_order), expected)
    # a strided view is read in the layout torch.empty_like gives it (contiguous here)
    view = torch.randn(6, 9, generator=gen)[::2, 1:]
    out = torch.ops.galerkin_ext.dropout(view, 0.3, seed)
    assert out.is_contiguous() and torch.empty_like(view).is_contiguous()
    assert torch.equal(out, reference_dropout(view.contiguous(), 0.3, int(seed)))


def test_the_mask_does_not_depend_on_the_thread_count(gen):
    x = torch.randn(300_001, generator=gen)
    seed = torch.tensor(int(torch.randint(2**62, (), generator=gen)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.galerkin_ext.dropout(x, 0.2, seed)
        torch.set_num_threads(2)
        two = torch.ops.galerkin_ext.dropout(x, 0.2, seed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9])
def test_the_masks_statistics(p, gen):
    n = 1 << 20
    ones = torch.ones(n, dtype=torch.float64)
    seeds = torch.randint(2**62, (2,), generator=gen)
    kept = [torch.ops.galerkin_ext.dropout(ones, p, s) != 0 for s in seeds]
    a, b = (k.double() for k in kept)
    q = 1.0 - p
    sigma = (q * p / n) ** 0.5
    assert abs(a.mean().item() - q) < 5 * sigma
    # each of the 64 places of a block (word and lane of the generator) alike
    places = a.view(-1, 64).mean(dim=0)
    assert (places - q).abs().max().item() < 5 * (q * p / (n // 64)) ** 0.5
    # neighbours and the two seeds' masks uncorrelated
    centred = a - q
    for lag in (1, 32, 64):
        corr = (centred[:-lag] * centred[lag:]).mean().item() / (q * p)
        assert abs(corr) < 5 / n**0.5, lag
    corr = ((a - q) * (b - q)).mean().item() / (q * p)
    assert abs(corr) < 5 / n**0.5


def test_gradients_regenerate_the_forward_mask(gen):
    x = torch.randn(4, 6, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    seed = torch.tensor(int(torch.randint(2**62, (), generator=gen)))

    def f(t):
        return torch.ops.galerkin_ext.dropout(t, 0.4, seed)

    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(lambda t: f(t).square(), (x,))
    # a gradient in another layout than the output's gets the forward's mask all the same
    x_cl = x.detach().permute(0, 2, 1).requires_grad_()
    out = torch.ops.galerkin_ext.dropout(x_cl, 0.4, seed)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)  # contiguous
    out.backward(grad)
    scale = torch.tensor(1 / 0.6, dtype=torch.float64)
    assert torch.equal(x_cl.grad, grad * torch.where(out != 0, scale, 0.0))


@pytest.mark.parametrize("make", [
    lambda g: torch.randn(3, 4, 5, generator=g, dtype=torch.float64),
    lambda g: torch.randn(3, 4, 5, generator=g).permute(2, 0, 1),
    lambda g: torch.randn(6, 5, generator=g)[::2],
    lambda g: torch.randn(1, generator=g),
    lambda g: torch.randn(0, 3, generator=g),
])
def test_opcheck(make, gen):
    x = make(gen).requires_grad_()
    torch.library.opcheck(torch.ops.galerkin_ext.dropout.default, (x, 0.25, torch.tensor(3)))


def test_the_op_refuses_bad_arguments():
    x = torch.ones(4)
    with pytest.raises(RuntimeError, match="p: expected 0 < p < 1"):
        torch.ops.galerkin_ext.dropout(x, 0.0, torch.tensor(1))
    with pytest.raises(RuntimeError, match="seed: expected a 0-dim int64"):
        torch.ops.galerkin_ext.dropout(x, 0.5, torch.tensor([1]))
    with pytest.raises(RuntimeError, match="x: expected float32 or float64"):
        torch.ops.galerkin_ext.dropout(x.half(), 0.5, torch.tensor(1))


@pytest.mark.parametrize("p", [2.0**-54, 1e-17, 1e-300, 5e-324])
def test_a_tiny_probability_keeps_what_it_should(p, gen):
    """1 - p rounds to 1 for p <= 2^-54, and the threshold 2^32 as a uint32 was 0: every
    element was dropped, by the dropout op and in the fused attention's matrices."""
    if p < sys.float_info.min:
        skip_where_subnormals_flush()
    x = torch.randn(4099, generator=gen, dtype=torch.float64)
    out = torch.ops.galerkin_ext.dropout(x, p, torch.tensor(123))
    assert torch.equal(out, reference_dropout(x, p, 123))
    assert (out != 0).sum() >= 4098  # (each element is dropped with probability 2^-32)
    q, k, v = (torch.randn(1, 1, 40, 8, generator=gen) for _ in range(3))
    for path in (ops.fourier_attention, ops.continuum_attention):
        options = {"path": "quadratic"} if path is ops.fourier_attention else {}
        torch.testing.assert_close(path(q, k, v, dropout_p=p, **options),
                                   path(q, k, v, **options))


def test_a_meta_default_device_or_a_meta_seed(gen):
    """Inside torch.device('meta') the seed came out on the meta device, and a call with one
    meta tensor among CPU ones is dispatched to the op's fake: it returned uninitialised CPU
    memory. The seed is drawn on the CPU, and the fake refuses mixed devices."""
    x = torch.randn(1000, generator=gen)
    torch.manual_seed(3)
    want = ops.dropout(x, 0.5)
    torch.manual_seed(3)
    with torch.device("meta"):
        got = ops.dropout(x, 0.5)
    assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match=r"seed: expected a CPU tensor, got one on meta"):
        torch.ops.galerkin_ext.dropout(x, 0.5, torch.tensor(1, device="meta"))
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(RuntimeError, match=r"expected every tensor on one device, got "
                                           r"\['cpu', 'meta'\]"):
        torch.ops.galerkin_ext.quadratic_attention(q, q.to("meta"), q, 0.0, torch.tensor(1))
    meta = torch.ops.galerkin_ext.dropout(x.to("meta"), 0.5, torch.tensor(1))  # shapes only
    assert meta.device.type == "meta" and meta.shape == x.shape


def test_ops_dropout_is_seeded_by_torch_and_fresh_per_call(gen):
    x = torch.randn(5000, generator=gen)
    torch.manual_seed(7)
    first, second = ops.dropout(x, 0.3), ops.dropout(x, 0.3)
    torch.manual_seed(7)
    assert torch.equal(ops.dropout(x, 0.3), first)
    assert not torch.equal(first != 0, second != 0)
    assert torch.allclose(first[first != 0], x[first != 0] / 0.7)


def test_ops_dropout_passes_through_and_keeps_nans():
    x = torch.randn(100)
    assert ops.dropout(x, 0.3, training=False) is x
    assert ops.dropout(x, 0.0) is x
    nan = torch.full((1000,), float("nan"))
    assert ops.dropout(nan, 0.5).isnan().all()  # NaN · 0, as torch's dropout


def test_ops_dropout_falls_back_to_torch_beyond_the_op():
    # half types, forward-mode AD and vmap: torch's dropout, same distribution
    x = torch.ones(20_000, dtype=torch.bfloat16)
    out = ops.dropout(x, 0.5)
    assert out.dtype == torch.bfloat16 and 0.45 < (out != 0).float().mean().item() < 0.55
    primal = torch.ones(1000, dtype=torch.float64)
    out, tangent = torch.func.jvp(lambda t: ops.dropout(t, 0.5), (primal,), (primal,))
    assert torch.equal(out, tangent)
    batched = torch.func.vmap(lambda t: ops.dropout(t, 0.5), randomness="different")(
        torch.ones(2, 1000))
    assert not torch.equal(batched[0], batched[1])


@pytest.mark.parametrize("bad,name,error", [
    ("p", "p", TypeError), (1.0, "p", ValueError), (-0.1, "p", ValueError),
    (True, "p", TypeError),
])
def test_ops_dropout_names_a_bad_probability(bad, name, error):
    with pytest.raises(error, match=f"^{name}: "):
        ops.dropout(torch.ones(3), bad)


def test_ops_dropout_names_bad_x_and_training():
    with pytest.raises(TypeError, match="^x: expected a floating-point tensor, got list"):
        ops.dropout([1.0, 2.0], 0.5)
    # (integer and bool tensors reached torch's 'result type Float can't be cast')
    for dtype in (torch.int64, torch.bool):
        with pytest.raises(TypeError, match=f"^x: expected a floating-point tensor, got {dtype}"):
            ops.dropout(torch.ones(3, dtype=dtype), 0.5)
    with pytest.raises(TypeError, match="^training: expected a bool"):
        ops.dropout(torch.ones(3), 0.5, training=1)


def test_compiled_dropout_keeps_its_mask_in_the_backward(gen):
    x = torch.randn(64, 33, generator=gen, requires_grad=True)
    f = torch.compile(lambda t: ops.dropout(t, 0.3), backend="aot_eager", fullgraph=True)
    out = f(x)
    out.sum().backward()
    assert 0.6 < (out != 0).float().mean().item() < 0.8
    assert torch.equal(x.grad != 0, out != 0)


def test_the_dropout_layer():
    layer = Dropout(0.25)
    assert isinstance(layer, nn.Dropout) and repr(layer) == "Dropout(p=0.25, inplace=False)"
    assert not list(layer.state_dict())
    x = torch.ones(10_000)
    assert 0.7 < (layer(x) != 0).float().mean().item() < 0.8
    layer.eval()
    assert layer(x) is x
    with pytest.raises(ValueError, match="^p: "):
        Dropout(1.0)


def test_draw_torch_masks_gives_torchs_masks_from_the_same_seed():
    model = nn.Sequential(nn.Linear(4, 4), Dropout(0.5), nn.Sequential(Dropout(0.2)))
    draw_torch_masks(model)
    assert [m.torch_masks for m in model.modules() if isinstance(m, Dropout)] == [True, True]
    x = torch.ones(3, 1000, 4)
    torch.manual_seed(11)
    ours = model[2](model[1](x))
    torch.manual_seed(11)
    torchs = F.dropout(F.dropout(x, 0.5), 0.2)
    assert torch.equal(ours, torchs)
    model.eval()  # and the identity in evaluation, as nn.Dropout
    assert torch.equal(model[2](model[1](x)), x)


def test_draw_torch_masks_reaches_the_attention_layers():
    """The attention matrices' dropout of SimpleAttention and ContinuumAttention draws torch's
    masks too: ContinuumAttention's equals SDPA's from the same seed."""
    from galerkin_ext.layers import ContinuumAttention, SimpleAttention

    continuum = ContinuumAttention(8, 2, attn_dropout=0.5).double()
    model = nn.Sequential(SimpleAttention(8, 2, "fourier", attn_dropout=0.5), continuum)
    draw_torch_masks(model)
    assert [model[0].torch_masks, model[1].torch_masks] == [True, True]
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    torch.manual_seed(5)
    ours = continuum(x)
    q, k, v = (lin(x).view(2, 7, 2, 4).transpose(1, 2)
               for lin in (continuum.query, continuum.key, continuum.value))
    torch.manual_seed(5)
    heads = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(ours, continuum.out_proj(heads.transpose(1, 2).reshape(2, 7, 8)))
