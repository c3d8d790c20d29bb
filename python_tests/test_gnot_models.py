"""GNOT and its baselines (SPEC-gnot §2, §6, §7): parameter counts, batch independence,
permutation properties, all-masked inputs, the gate, and clear errors."""

from __future__ import annotations

import copy

import pytest
import torch

from galerkin_ext.layers.gnot import (
    GeometricGate,
    GNOTBlock,
    HeteroNormalizedAttention,
    MixtureFFN,
)
from galerkin_ext.models import GNOT, GKTransformer, MIONet, build_model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lin(i: int, o: int) -> int:
    return i * o + o


def gnot_count(t, bs, out, c=64, f=256, layers=3, k=1, m=3, d=2) -> int:
    """SPEC-gnot §2's formula, written out."""
    def mlp(i, o):
        return lin(i, c) + m * lin(c, c) + lin(c, o)
    n_in = len(bs)
    block = 2 * c * (4 + n_in) + (6 + 2 * n_in) * lin(c, c) + 2 * k * (lin(c, f) + lin(f, c))
    if k > 1:
        block += lin(d, f) + lin(f, f) + lin(f, k)
    return mlp(t, c) + sum(mlp(b, c) for b in bs) + layers * block + mlp(c, out)


@pytest.mark.parametrize("name, expected", [
    ("gnot_heat", 4_101_386), ("gnot_elasticity", 1_389_441), ("gk_elasticity", 584_321)])
def test_published_parameter_counts(name, expected):
    assert n_params(build_model(name)) == expected


def test_parameter_counts_follow_the_formula():
    assert n_params(GNOT(2, 2, [3], 1)) == gnot_count(2, [3], 1) == 350_721
    quick_heat = dict(n_hidden=32, n_inner=2, n_layers=2, mlp_layers=2)
    assert n_params(build_model("gnot_heat", **quick_heat)) == 102_311 == gnot_count(
        14, [3, 2, 2], 1, c=32, f=64, layers=2, k=3, m=2)
    assert n_params(build_model("gnot_heat", **quick_heat, n_experts=1)) == 59_681
    assert n_params(build_model("gnot_elasticity", n_hidden=32, n_inner=2, n_layers=2,
                                n_head=2, mlp_layers=2)) == 44_033
    assert n_params(build_model("gk_elasticity", d_model=32, num_layers=2,
                                dim_feedforward=64, decoder_hidden=32)) == 20_961
    # MIONet: Σ_nets (lin(in, W) + 2 lin(W, W) + lin(W, P o)) + o
    model = build_model("mionet_heat", input_points=[30, 20, 25])
    nets = [30 * 3, 20 * 2, 25 * 2, 12, 2]
    assert n_params(model) == sum(lin(i, 256) + 2 * lin(256, 256) + lin(256, 256)
                                  for i in nets) + 1
    with pytest.raises(TypeError, match="needs \\['input_points'\\]"):
        build_model("mionet_elasticity")


# -- ragged batches ------------------------------------------------------------------------


def sample(gen, n, ms, input_dims, theta_dim, dtype=torch.float64):
    """One sample: query points (n, 2), inputs [(m_l, b_l)], θ (p,), query weights."""
    x = torch.rand(n, 2, generator=gen, dtype=dtype)
    inputs = [torch.randn(m, b, generator=gen, dtype=dtype)
              for m, b in zip(ms, input_dims, strict=True)]
    theta = torch.randn(theta_dim, generator=gen, dtype=dtype) if theta_dim else None
    weight = torch.rand(n, generator=gen, dtype=dtype) + 0.1
    input_weights = [torch.rand(m, generator=gen, dtype=dtype) + 0.1 for m in ms]
    return x, inputs, theta, weight, input_weights


def pad_batch(samples):
    """Pad to the batch maxima with garbage values (not zeros) and weight 0."""
    b = len(samples)
    n_max = max(s[0].shape[0] for s in samples)
    n_inputs = len(samples[0][1])
    x = torch.full((b, n_max, 2), 7.0, dtype=torch.float64)
    weight = torch.zeros(b, n_max, dtype=torch.float64)
    inputs, input_weights = [], []
    for l_ in range(n_inputs):
        m_max = max(s[1][l_].shape[0] for s in samples)
        width = samples[0][1][l_].shape[1]
        inputs.append(torch.full((b, m_max, width), -3.0, dtype=torch.float64))
        input_weights.append(torch.zeros(b, m_max, dtype=torch.float64))
    for i, (xs, ys, _, w, ws) in enumerate(samples):
        x[i, :xs.shape[0]] = xs
        weight[i, :xs.shape[0]] = w
        for l_, (y, wy) in enumerate(zip(ys, ws, strict=True)):
            inputs[l_][i, :y.shape[0]] = y
            input_weights[l_][i, :y.shape[0]] = wy
    theta = torch.stack([s[2] for s in samples]) if samples[0][2] is not None else None
    return x, inputs, theta, weight, input_weights


VARIANTS = {
    "gnot_default": lambda: GNOT(2, 2, [3], 1),
    "gnot_experts_theta": lambda: GNOT(2, 2, [3, 2], 2, theta_dim=4, n_hidden=16, n_layers=2,
                                       n_head=2, n_experts=3, mlp_layers=2, n_inner=2),
    "gnot_paper": lambda: GNOT(2, 2, [3, 2], 1, theta_dim=4, n_hidden=16, n_layers=2, n_head=4,
                               reduce="mean", self_skip=False, theta_mode="branch"),
    "gnot_pre": lambda: GNOT(2, 2, [3], 1, n_hidden=16, n_layers=2, ffn_norm="pre"),
    "mionet": lambda: MIONet(2, 2, [3, 2], [12, 9], 1, theta_dim=4, width=32, latent=16),
    "gk": lambda: GKTransformer(d_model=16, n_head=4, num_layers=2, dim_feedforward=32,
                                decoder_hidden=16),
}


def model_inputs(name):
    model = VARIANTS[name]().double()
    dims = getattr(model, "input_dims", (3,))
    theta_dim = getattr(model, "theta_dim", 0)
    return model, dims, theta_dim


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_sample_does_not_depend_on_its_batch_mates(name):
    torch.manual_seed(0)
    model, dims, theta_dim = model_inputs(name)
    gen = torch.Generator().manual_seed(1)
    sizes = [(5, [7, 3]), (11, [12, 9]), (1, [1, 4]), (8, [2, 1])]
    samples = [sample(gen, n, ms[:len(dims)], dims, theta_dim) for n, ms in sizes]
    x, inputs, theta, weight, input_weights = pad_batch(samples)
    batched = model(x, inputs, theta, weight=weight, input_weights=input_weights)
    assert torch.isfinite(batched).all()
    for i, (xs, ys, th, w, ws) in enumerate(samples):
        alone = model(xs[None], [y[None] for y in ys], None if th is None else th[None],
                      weight=w[None], input_weights=[v[None] for v in ws])
        torch.testing.assert_close(batched[i, :xs.shape[0]], alone[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_query_permutation_permutes_outputs_input_permutation_changes_nothing(name):
    torch.manual_seed(0)
    model, dims, theta_dim = model_inputs(name)
    gen = torch.Generator().manual_seed(2)
    x, ys, th, w, ws = sample(gen, 13, [9, 6][:len(dims)], dims, theta_dim)
    args = lambda x, ys, w, ws: model(x[None], [y[None] for y in ys],  # noqa: E731
                                      None if th is None else th[None], weight=w[None],
                                      input_weights=[v[None] for v in ws])
    out = args(x, ys, w, ws)[0]
    perm = torch.randperm(13, generator=gen)
    torch.testing.assert_close(args(x[perm], ys, w[perm], ws)[0], out[perm], rtol=1e-12,
                               atol=1e-12)
    # The GK-Transformer has no input functions; MIONet's branches take them flattened in the
    # stored order (SPEC-gnot §6), so their order matters to it.
    if name not in ("gk", "mionet"):
        perms = [torch.randperm(y.shape[0], generator=gen) for y in ys]
        torch.testing.assert_close(args(x, [y[p] for y, p in zip(ys, perms, strict=True)], w,
                                        [v[p] for v, p in zip(ws, perms, strict=True)])[0], out,
                                   rtol=1e-12, atol=1e-12)


def test_an_all_masked_input_adds_nothing():
    """reduce='sum': the model with an input whose weights are all 0 equals the model without
    that input (the same parameters otherwise); outputs and gradients finite."""
    torch.manual_seed(0)
    full = GNOT(2, 2, [3, 2], 1, n_hidden=16, n_layers=2, n_head=2).double()
    reduced = GNOT(2, 2, [3], 1, n_hidden=16, n_layers=2, n_head=2).double()
    state = full.state_dict()
    dropped = ("branches.1.", "cross.keys.1.", "cross.values.1.", "norm_inputs.1.")
    reduced.load_state_dict({k: v for k, v in state.items()
                             if not any(part in k for part in dropped)})
    gen = torch.Generator().manual_seed(3)
    x, ys, _, w, ws = sample(gen, 10, [8, 5], (3, 2), 0)
    ws[1] = torch.zeros_like(ws[1])
    ys = [y.requires_grad_() for y in ys]
    out = full(x[None], [y[None] for y in ys], weight=w[None],
               input_weights=[v[None] for v in ws])
    expected = reduced(x[None], [ys[0][None]], weight=w[None], input_weights=[ws[0][None]])
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert torch.isfinite(ys[0].grad).all()
    assert torch.equal(ys[1].grad, torch.zeros_like(ys[1]))


def test_the_gate_is_a_distribution_over_experts_of_the_coordinates():
    """p >= 0 and Σ_k p_k = 1 (float64 to 1e-12, float32 to 1e-6); inside the model each
    block's gate sees the query coordinates only: changing the queries' other features and the
    input functions moves the output, never the gates."""
    torch.manual_seed(0)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        gate = GeometricGate(2, 16, 3).to(dtype)
        p = gate(10 * torch.rand(4, 500, 2, dtype=dtype) - 5)
        assert (p >= 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(4, 500, dtype=dtype), rtol=0, atol=tol)
    model = GNOT(2, 3, [3], 1, n_hidden=16, n_layers=2, n_experts=3).double()
    seen: list[torch.Tensor] = []
    for gate in model.gates:
        gate.register_forward_hook(lambda module, args, out: seen.append(out))
    x, y = torch.rand(2, 9, 3, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)
    out = model(x, [y])
    x2 = x.clone()
    x2[..., 2] += 1.0
    out2 = model(x2, [y + 1.0])
    assert len(seen) == 4 and (out2 - out).abs().max() > 1e-3
    for before, after in zip(seen[:2], seen[2:], strict=True):
        torch.testing.assert_close(after, before, rtol=0, atol=0)


class _Doubling(torch.nn.Module):
    """Stands for a dropout whose mask keeps everything at scale 2: it shows where dropout acts."""

    def forward(self, x):
        return 2 * x


@pytest.mark.parametrize("ffn_norm", ["post", "pre"])
def test_gnot_block_against_its_written_out_form(ffn_norm):
    """SPEC-gnot §2's block from its parts: dropout on the outputs of both attention branches
    (and nowhere else), LN3/LN5 after the mixtures ("post") or in front of them, on the
    branch only ("pre", x + Σ p_k E_k(LN x))."""
    gen = torch.Generator().manual_seed(7)
    block = GNOTBlock(8, 2, 2, 16, n_experts=2, dropout=0.5, ffn_norm=ffn_norm).double()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3)
    block.dropout = _Doubling()
    x = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    inputs = [torch.randn(2, 4, 8, generator=gen, dtype=torch.float64),
              torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)]
    input_weights = [torch.rand(2, 4, generator=gen, dtype=torch.float64), None]
    weight = torch.rand(2, 5, generator=gen, dtype=torch.float64)
    probs = torch.softmax(torch.randn(2, 5, 2, generator=gen, dtype=torch.float64), dim=-1)

    def ln(norm, t):
        return torch.nn.functional.layer_norm(t, (8,), norm.weight, norm.bias, norm.eps)

    def mixture(ffn, norm, t):
        if ffn_norm == "post":
            return t + ln(norm, ffn(t, probs))
        return t + ffn(ln(norm, t), probs)

    ys = [ln(norm, y) for norm, y in zip(block.norm_inputs, inputs, strict=True)]
    h = x + 2 * block.cross(ln(block.norm_query, x), ys, input_weights)
    h = mixture(block.ffn1, block.norm_ffn1, h)
    q = ln(block.norm_self, h)
    h = h + 2 * block.self_attn(q, [q], [weight])
    expected = mixture(block.ffn2, block.norm_ffn2, h)
    out = block(x, inputs, input_weights, weight, probs)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_identical_experts_equal_one_expert():
    torch.manual_seed(0)
    one = GNOT(2, 2, [3], 1, n_hidden=16, n_layers=2, n_experts=1).double()
    three = GNOT(2, 2, [3], 1, n_hidden=16, n_layers=2, n_experts=3).double()
    state = dict(three.state_dict())
    for key, value in one.state_dict().items():
        if ".experts.0." in key:
            for k in range(3):
                state[key.replace(".experts.0.", f".experts.{k}.")] = value
        else:
            state[key] = value
    three.load_state_dict(state)
    gen = torch.Generator().manual_seed(4)
    x, ys, _, w, ws = sample(gen, 12, [7], (3,), 0)
    args = (x[None], [ys[0][None]])
    kwargs = dict(weight=w[None], input_weights=[ws[0][None]])
    torch.testing.assert_close(three(*args, **kwargs), one(*args, **kwargs), rtol=1e-12,
                               atol=1e-12)


def test_given_gate_takes_the_callers_probabilities():
    torch.manual_seed(0)
    model = GNOT(2, 2, [3], 1, n_hidden=16, n_layers=1, n_experts=3, gate="given").double()
    assert model.gates is None
    x = torch.rand(1, 6, 2, dtype=torch.float64)
    ys = [torch.randn(1, 4, 3, dtype=torch.float64)]
    # every point on expert 2 = a model whose experts are all expert 2
    probs = torch.nn.functional.one_hot(torch.full((1, 6), 2), 3).double()
    out = model(x, ys, expert_probs=probs)
    only = copy.deepcopy(model)
    for block in only.blocks:
        for ffn in (block.ffn1, block.ffn2):
            ffn.experts[0] = ffn.experts[1] = ffn.experts[2]
    torch.testing.assert_close(only(x, ys, expert_probs=torch.rand(1, 6, 3).double().softmax(-1)),
                               out, rtol=1e-12, atol=1e-12)
    mixed = torch.nn.functional.one_hot(torch.tensor([[0, 1, 2, 2, 1, 0]]), 3).double()
    assert not torch.allclose(model(x, ys, expert_probs=mixed), out)
    with pytest.raises(TypeError, match="expert_probs: expected a tensor of shape"):
        model(x, ys)
    with pytest.raises(ValueError, match="expert_probs: expected finite, non-negative prob"):
        model(x, ys, expert_probs=torch.full((1, 6, 3), torch.nan, dtype=torch.float64))


@pytest.mark.parametrize("call, match", [
    (lambda m: m(torch.rand(1, 5, 3), [torch.rand(1, 4, 3)]), "x: expected shape"),
    (lambda m: m(torch.rand(1, 5, 2), []), "inputs: expected a list of 1"),
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(1, 4, 2)]), "inputs\\[0\\]: expected shape"),
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(2, 4, 3)]), "inputs\\[0\\]: expected shape"),
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], torch.rand(1, 2)),
     "theta: expected None"),
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], weight=torch.rand(1, 4)),
     "weight: expected shape"),
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], input_weights=[torch.rand(5)]),
     "input_weights\\[0\\]: expected shape \\(B, M_0\\) = \\(1, 4\\) or \\(4,\\), got \\(5,\\)"),
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], expert_probs=torch.rand(1, 5, 1)),
     "expert_probs: expected None"),
    # named as the caller named them, not as the ops' "weights[0]"
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], weight=-torch.rand(5)),
     "^weight: expected finite, non-negative"),
    (lambda m: m(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], input_weights=[-torch.rand(4)]),
     r"^input_weights\[0\]: expected finite, non-negative"),
])
def test_bad_arguments_fail_clearly(call, match):
    model = GNOT(2, 2, [3], 1, n_hidden=8, n_layers=1)
    with pytest.raises((ValueError, TypeError), match=match):
        call(model)


@pytest.mark.parametrize("call, match", [
    (lambda a, g, b: a(torch.rand(5, 8), [torch.rand(1, 4, 8)] * 2), "x: expected shape"),
    (lambda a, g, b: a(torch.rand(1, 5, 6), [torch.rand(1, 4, 8)] * 2),
     r"x: expected shape \(B, N, d_model = 8\)"),
    (lambda a, g, b: a(torch.rand(1, 5, 8), [torch.rand(1, 4, 8)]), "expected sequences of 2"),
    (lambda a, g, b: a(torch.rand(1, 5, 8), [torch.rand(1, 4, 8)] * 2, torch.rand(2, 4)),
     "expected sequences of 2"),
    (lambda a, g, b: a(torch.rand(1, 5, 8), [torch.rand(1, 4, 8), torch.rand(2, 4, 8)]),
     r"inputs\[1\]: expected shape \(B = 1, M, d_model = 8\)"),
    (lambda a, g, b: g(torch.rand(1, 5, 3)), r"coords: expected shape \(B, N, space_dim = 2\)"),
    (lambda a, g, b: b(torch.rand(1, 5, 8), [torch.rand(1, 4, 8)], [None], None, None),
     "inputs: expected a sequence of 2"),
    (lambda a, g, b: HeteroNormalizedAttention(8, 2, 2, skip="no"), "skip: expected a bool"),
    (lambda a, g, b: a(torch.rand(1, 5, 8), [torch.rand(1, 4, 8), torch.rand(1, 4, 8).double()]),
     r"inputs\[1\]: expected dtype torch.float32 like x"),
    (lambda a, g, b: MixtureFFN(8, 16, 2)(torch.rand(1, 5, 8), torch.rand(1, 5, 2, device="meta")),
     "probs: expected a tensor on cpu like x"),
])
def test_gnot_layers_check_their_inputs(call, match):
    """The layers, used on their own, name the argument at fault (they gave torch's matmul,
    unpacking and zip messages, and took skip='no' for True)."""
    layers = (HeteroNormalizedAttention(8, 2, 2), GeometricGate(2, 16, 3),
              GNOTBlock(8, 2, 2, 16))
    with pytest.raises((ValueError, TypeError), match=match):
        call(*layers)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_compiled_models_take_every_padded_size_after_one_recompile(name):
    """Ragged batches change B, N and every M_l between steps: after the first size changes,
    torch.compile's automatic dynamic shapes trace them symbolically and one graph serves
    every later size. The shape checks formatted the sizes into their messages before
    checking, which pinned them: a compile for every new padded size (25-30 s on a CPU)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()  # counting from a clean cache: earlier tests compile these forwards
    torch.manual_seed(0)
    model, dims, theta_dim = model_inputs(name)
    gen = torch.Generator().manual_seed(2)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    # batch, N, M_l: the second batch changes every size at once, the later ones again
    for batch, n, ms in ((2, 9, [6, 4]), (3, 12, [8, 5]), (4, 7, [5, 7]), (2, 15, [9, 3])):
        samples = [sample(gen, n - i, [m - i for m in ms[:len(dims)]], dims, theta_dim)
                   for i in range(batch)]
        x, inputs, theta, weight, input_weights = pad_batch(samples)
        torch.testing.assert_close(
            compiled(x, inputs, theta, weight=weight, input_weights=input_weights),
            model(x, inputs, theta, weight=weight, input_weights=input_weights),
            rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 2
    torch._dynamo.reset()


def test_hetero_attention_weights_default_to_uniform():
    attention = HeteroNormalizedAttention(8, 2, 2)
    x, ys = torch.rand(2, 5, 8), [torch.rand(2, 4, 8), torch.rand(2, 3, 8)]
    torch.testing.assert_close(attention(x, ys), attention(x, ys, [None, None]))


@pytest.mark.parametrize("name", ["gnot_heat", "gk_elasticity"])
def test_one_set_of_weights_serves_the_batch(name):
    """A 1-D weight (as the ops, SimpleAttention and the TNO take) is every sample's."""
    model = build_model(name).eval()
    x = torch.rand(3, 10, model.query_dim)
    inputs = [torch.rand(3, 7, b) for b in getattr(model, "input_dims", ())]
    theta = torch.rand(3, model.theta_dim) if getattr(model, "theta_dim", 0) else None
    w, ws = torch.rand(10), [torch.rand(7) for _ in inputs]
    shared = model(x, inputs or None, theta, weight=w, input_weights=ws or None)
    batched = model(x, inputs or None, theta, weight=w.expand(3, 10),
                    input_weights=[v.expand(3, 7) for v in ws] or None)
    assert torch.equal(shared, batched)


@pytest.mark.parametrize("kwargs, match", [
    (dict(input_dims=[]), "input_dims: expected a non-empty list"),
    (dict(n_head=3), "n_head: expected a divisor"),
    (dict(theta_mode="side"), "theta_mode"),
    (dict(ffn_norm="mid"), "ffn_norm"),
    (dict(query_dim=1), "query_dim: expected at least"),
])
def test_bad_configurations_fail_clearly(kwargs, match):
    config = dict(space_dim=2, query_dim=2, input_dims=[3], out_dim=1, n_hidden=8) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        GNOT(**config)


def test_gk_transformer_decodes_with_silu_after_each_hidden_layer():
    """Decoder: [h | coords] → hidden, then decoder_layers × (Linear, SiLU), → out (SPEC-gnot
    §6), written out from the layers' weights (a reordering keeps the parameter count)."""
    torch.manual_seed(0)
    model = GKTransformer(d_model=16, n_head=2, num_layers=1, dim_feedforward=32,
                          decoder_hidden=8).double()
    x = torch.rand(2, 5, 2, dtype=torch.float64)
    h = model.lift(x)
    for layer in model.encoder:
        h = layer(h, x, None)
    fc, *hidden, out = [m for m in model.decoder if isinstance(m, torch.nn.Linear)]
    z = torch.cat([h, x], dim=-1) @ fc.weight.T + fc.bias
    for linear in hidden:
        z = torch.nn.functional.silu(z @ linear.weight.T + linear.bias)
    assert len(hidden) == 2
    torch.testing.assert_close(model(x), z @ out.weight.T + out.bias, rtol=1e-12, atol=1e-12)


def test_gk_transformer_lifts_every_query_column():
    """Columns after the coordinates (a coefficient's values, say) reach the output through
    the lift; the coordinates alone go into every head and the decoder."""
    torch.manual_seed(0)
    model = GKTransformer(space_dim=2, query_dim=3, d_model=8, n_head=2, num_layers=1,
                          dim_feedforward=8, decoder_hidden=8).double()
    assert model.lift.in_features == 3
    x = torch.rand(2, 6, 3, dtype=torch.float64)
    changed = x.clone()
    changed[..., 2] += 1.0
    assert (model(changed) - model(x)).abs().max() > 1e-6
    for space_dim, query_dim in ((2, 1), (3, 2)):
        with pytest.raises(ValueError, match="query_dim: expected at least space_dim"):
            GKTransformer(space_dim=space_dim, query_dim=query_dim)


def test_mionet_refuses_inputs_larger_than_built_for():
    model = MIONet(2, 2, [3], [4], 1, width=8, latent=4)
    with pytest.raises(ValueError, match="at most input_points\\[0\\] = 4"):
        model(torch.rand(1, 3, 2), [torch.rand(1, 5, 3)])
    # MIONet runs no op that would check the weights: NaN used to pass as padding
    with pytest.raises(ValueError, match=r"^input_weights\[0\]: expected finite, non-negative"):
        model(torch.rand(1, 3, 2), [torch.rand(1, 4, 3)],
              input_weights=[torch.full((1, 4), torch.nan)])


@pytest.mark.parametrize("experts", [1, 3])
def test_equals_the_reference_forward_on_equal_sizes_and_differs_with_padding(experts):
    """SPEC-gnot §7.7: with equal-size samples and uniform weights the model is the reference
    code's forward; with padding the reference lets padded points in, ours does not."""
    from galerkin_ext.reference import gnot_forward

    torch.manual_seed(0)
    model = GNOT(2, 2, [3, 2], 1, theta_dim=3, n_hidden=16, n_layers=2, n_head=2,
                 n_experts=experts).double()
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(3, 10, 2, generator=gen, dtype=torch.float64)
    inputs = [torch.randn(3, 7, 3, generator=gen, dtype=torch.float64),
              torch.randn(3, 4, 2, generator=gen, dtype=torch.float64)]
    theta = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(model(x, inputs, theta), gnot_forward(model, x, inputs, theta),
                               rtol=1e-12, atol=1e-12)
    # sample 0 with its last 3 query points and 2 input points as padding
    weight = torch.ones(3, 10, dtype=torch.float64)
    weight[0, 7:] = 0
    input_weights = [torch.ones(3, 7, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64)]
    input_weights[0][0, 5:] = 0
    ours = model(x, inputs, theta, weight=weight, input_weights=input_weights)
    alone = model(x[:1, :7], [inputs[0][:1, :5], inputs[1][:1]], theta[:1])
    torch.testing.assert_close(ours[0, :7], alone[0], rtol=1e-12, atol=1e-12)
    assert (gnot_forward(model, x, inputs, theta)[0, :7] - alone[0]).abs().max() > 1e-3


# -- mesh weights (SPEC-gnot §7.5) -----------------------------------------------------------


def structured_mesh(n: int, graded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Vertices (of (n+1)² in float64) and triangles of the unit square, cells split in two;
    ``graded``: x ↦ x², crowding the points at x = 0."""
    s = torch.linspace(0, 1, n + 1, dtype=torch.float64)
    x = s.square() if graded else s
    points = torch.stack(torch.meshgrid(x, s, indexing="ij"), dim=-1).reshape(-1, 2)
    idx = torch.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    a, b, c, d = idx[:-1, :-1], idx[1:, :-1], idx[:-1, 1:], idx[1:, 1:]
    cells = torch.cat([torch.stack([a, b, d], -1).reshape(-1, 3),
                       torch.stack([a, d, c], -1).reshape(-1, 3)])
    return points, cells


def attention_on_mesh(points, weight):
    """Normalised attention of fixed probe queries over keys and values that are smooth
    functions of the points."""
    from galerkin_ext import ops

    x, y = points[:, 0], points[:, 1]
    k = torch.stack([torch.sin(torch.pi * x), torch.cos(torch.pi * y), 2 * x * y, x + y], -1)
    v = torch.stack([torch.exp(x) * y, torch.cos(2 * x + y)], -1)
    q = torch.tensor([[0.3, -1.0, 2.0, 0.5], [1.5, 0.2, -0.7, 1.0], [-2.0, 1.0, 0.0, 3.0]],
                     dtype=torch.float64)
    return ops.normalized_attention(q[None, None], k[None, None], v[None, None], weight=weight)


def test_mesh_weights_make_attention_independent_of_the_mesh():
    """A uniform and an x ↦ x² graded mesh of one square: with lumped mesh weights the
    attention agrees to O(h²); with uniform weights it does not (the graded mesh's points
    crowd at x = 0)."""
    from galerkin_ext.quadrature import mesh_weights

    gaps = {}
    for n in (16, 32, 64):
        outs = {}
        for graded in (False, True):
            points, cells = structured_mesh(n, graded)
            outs[graded, "mesh"] = attention_on_mesh(points, mesh_weights(points, cells))
            outs[graded, "uniform"] = attention_on_mesh(points, None)
        gaps[n] = {w: float((outs[True, w] - outs[False, w]).abs().max())
                   for w in ("mesh", "uniform")}
    assert gaps[64]["mesh"] <= 2e-4
    assert gaps[64]["uniform"] >= 0.1
    assert gaps[32]["mesh"] / gaps[64]["mesh"] > 3.5  # second order
    assert gaps[16]["mesh"] / gaps[32]["mesh"] > 3.5


def test_gnot_with_mesh_weights_is_independent_of_the_mesh():
    """SPEC-gnot §7.5, model: a random-init GNOT sees one square meshed uniformly and graded;
    its outputs at probe queries of weight 0 (not keys) agree to O(h²) with mesh weights,
    not with uniform ones."""
    from galerkin_ext.quadrature import mesh_weights

    torch.manual_seed(0)
    model = GNOT(2, 2, [2], 1, n_hidden=16, n_layers=2, n_head=2).double()
    probes = torch.tensor([[0.1, 0.2], [0.5, 0.5], [0.9, 0.3], [0.3, 0.8]], dtype=torch.float64)

    def at_probes(n, graded, weights):
        points, cells = structured_mesh(n, graded)
        w = mesh_weights(points, cells) if weights == "mesh" else torch.ones(len(points),
                                                                           dtype=torch.float64)
        x = torch.cat([points, probes])[None]
        weight = torch.cat([w, torch.zeros(len(probes), dtype=torch.float64)])[None]
        out = model(x, [points[None]], weight=weight, input_weights=[w[None]])
        return out[0, -len(probes):]

    with torch.no_grad():
        gaps = {(n, w): float((at_probes(n, True, w) - at_probes(n, False, w)).abs().max())
                for n in (16, 32) for w in ("mesh", "uniform")}
    assert gaps[16, "mesh"] / gaps[32, "mesh"] > 3.0  # second order
    assert gaps[32, "uniform"] > 20 * gaps[32, "mesh"]
