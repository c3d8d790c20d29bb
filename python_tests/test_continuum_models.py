"""Tests of the continuum-attention layers and models (SPEC-continuum §1.1, §1.3, §2, §6):
exact parameter counts, shapes at any N, the quadrature properties (permutation, duplication,
zero-weight padding, averaging) at the layer and model level, weight='auto', the L63 token,
the averaging variant, AFNO's fixed grid, SpectralConv's mode skipping, the quadrature orders
of cross-attention, and clear errors. Small widths except where parameters are counted."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from galerkin_ext import _checks, ops
from galerkin_ext.layers import (
    AFNOBlock,
    AFNOFilter,
    ContinuumAttention,
    ContinuumEncoderLayer,
    PatchedEncoderLayer,
    SpectralConv,
    SpectralConv1d,
    SpectralConv2d,
    auto_quadrature_weights,
)
from galerkin_ext.losses import relative_l2
from galerkin_ext.models import AFNO, TNO, FNOChannelMLP, GTEncoder, available_models, build_model
from galerkin_ext.quadrature import mesh_weights, trapezoid_weights
from galerkin_ext.training import point_set_forward

F64 = torch.float64


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def square_grid(s: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(s, s, 2)`` node coordinates on [0, 1]²."""
    t = torch.linspace(0, 1, s, dtype=dtype)
    return torch.stack(torch.meshgrid(t, t, indexing="ij"), dim=-1)


def small_tno(gen: torch.Generator, **kwargs) -> TNO:
    """A float64 TNO in eval mode with random biases and norm parameters (so nothing is
    trivially symmetric). Without layer norms the parameters are smaller, which keeps the
    outputs O(1), so that absolute tolerances mean the same as with them."""
    config = {"in_dim": 1, "out_dim": 2, "domain_dim": 1, "d_model": 16, "n_head": 2,
              "num_layers": 2, "dim_feedforward": 24, **kwargs}
    model = TNO(**config).to(F64).eval()
    std = 0.5 if model.layer_norm else 0.15
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) * std)
    return model


# ---------------------------------------------------------------------------------------------
# Parameter counts (SPEC-continuum §2 table)


@pytest.mark.parametrize(("name", "count"), [
    ("tno_l63", 598_786), ("tno_l63_y", 598_017), ("tno_cde", 598_017), ("tno_darcy", 598_145),
    ("fno_ca", 5_671_553), ("afno", 1_088_641), ("gt_encoder", 534_657),
])
def test_parameter_counts_of_the_paper(name, count):
    assert name in available_models()
    assert n_params(build_model(name)) == count


def test_encoder_layer_and_variant_counts():
    assert n_params(ContinuumEncoderLayer(128, 8)) == 99_584
    assert n_params(ContinuumEncoderLayer(128, 8, layer_norm=False)) == 99_584 - 2 * 256
    # 6 layers + lift Linear(d_u + d, 128) + projection Linear(128, d_z)
    assert n_params(TNO(1, 1, 2)) == 6 * 99_584 + 4 * 128 + 129
    # the averaging variant: no norms; R₂f(R₁[u,x]+b)+b̃ and P₂f(P₁[v,x]+b)+b̃ of width 128
    lift = (2 + 1) * 128 + 129 * 128
    projection = (128 + 1 + 1) * 128 + 129
    assert n_params(TNO(1, 1, 1, layer_norm=False)) == 6 * 99_072 + lift + projection
    # the Galerkin encoder's 'galerkin' row has the same count as 'fourier'
    assert n_params(build_model("gt_encoder", attention_type="galerkin")) == 534_657


@pytest.mark.parametrize("width", [32, 64, 96, 128])
def test_width_sweep_counts_follow_table_4(width):
    """Figs 10-11 sweep d_model alone: the paper's Table 4 counts a feed-forward block of width
    d_model at every width (6 d² per layer with the attention's 4 d²), so d_model sets it."""
    d = width
    layer = 6 * d * d + 10 * d  # weights of Table 4, plus the 6 Linear biases and 2 norms' 4d
    assert n_params(ContinuumEncoderLayer(d, 8)) == layer
    assert n_params(PatchedEncoderLayer(d, 8)) == layer
    # lift Linear(d_u + d, d_model), projection Linear(d_model, d_z): Darcy d_u = d_z = 1, d = 2
    assert n_params(build_model("tno_darcy", d_model=d)) == 6 * layer + 4 * d + d + 1
    # ViT NO: the spectral lift (two blocks of 12 x 12 complex weights, each counted once, from
    # d_u + 2 = 3 channels) and the final convolution (64 modes, 8,192 weights)
    lift = 2 * 12 * 12 * 3 * d
    assert n_params(build_model("vitno", d_model=d)) == 6 * layer + lift + d + 1 + 8_192


# ---------------------------------------------------------------------------------------------
# Shapes, any N


def test_tno_one_parameter_set_at_any_n(gen):
    model = small_tno(gen)
    for n in (1, 2, 5, 17):
        x = torch.rand(n, 1, generator=gen, dtype=F64)
        u = torch.randn(3, n, 1, generator=gen, dtype=F64)
        out = model(u, x)
        assert out.shape == (3, n, 2) and bool(torch.isfinite(out).all())
        # per-sample coordinates, user weights of either shape, plain softmax
        xb = x.expand(3, n, 1)
        torch.testing.assert_close(model(u, xb), out, rtol=0, atol=1e-13)
        w = trapezoid_weights(x[:, 0].sort().values)[x[:, 0].argsort().argsort()] if n > 1 \
            else torch.ones(1, dtype=F64)
        torch.testing.assert_close(model(u, x, w), out, rtol=0, atol=1e-13)
        torch.testing.assert_close(model(u, x, w.expand(3, n)), out, rtol=0, atol=1e-13)
        assert model(u, x, None).shape == (3, n, 2)


def test_tno_on_a_2d_grid_float32(gen):
    model = TNO(2, 1, 2, d_model=16, n_head=4, num_layers=1, dim_feedforward=16).eval()
    for s in (4, 7):
        x = square_grid(s).reshape(-1, 2)
        out = model(torch.randn(2, s * s, 2, generator=gen), x)
        assert out.shape == (2, s * s, 1) and out.dtype == torch.float32
    # the uniform 'auto' weights of a tensor grid are plain softmax
    u = torch.randn(2, 16, 2, generator=gen)
    x = square_grid(4).reshape(-1, 2)
    torch.testing.assert_close(model(u, x), model(u, x, None))


def test_grid_baselines_and_gt_encoder_shapes(gen):
    fno = FNOChannelMLP(width=8, n_modes=12, lifting=8, projection=8)
    for s in (8, 13, 16):  # mode skipping: any grid
        out = fno(torch.randn(2, s, s, 1, generator=gen), square_grid(s))
        assert out.shape == (2, s, s, 1)
    afno = AFNO(2, 3, grid=(8, 6), d_model=16, num_layers=2, num_blocks=4)
    t = torch.linspace(0, 1, 8)
    grid = torch.stack(torch.meshgrid(t, t[:6], indexing="ij"), dim=-1)
    assert afno(torch.randn(2, 8, 6, 2, generator=gen), grid).shape == (2, 8, 6, 3)
    gt = GTEncoder(d_model=16, n_head=2, num_layers=2, dim_feedforward=16)
    x = square_grid(5).reshape(-1, 2)
    assert gt(torch.randn(2, 25, 1, generator=gen), x).shape == (2, 25, 1)
    assert gt(torch.randn(2, 25, 1, generator=gen), x.expand(2, 25, 2)).shape == (2, 25, 1)


# ---------------------------------------------------------------------------------------------
# SPEC §6 properties at the layer and model level


def test_tno_without_layer_norms_lifts_and_projects_as_the_authors_code(gen):
    """Lift ``L₂ GELU(L₁ [u, x])``, the encoder layers, projection ``P₂ GELU(P₁ [v, x])``
    (SPEC-continuum §2), composed by hand from the model's own layers."""
    import torch.nn.functional as F

    model = small_tno(gen, layer_norm=False)
    x = torch.rand(9, 1, generator=gen, dtype=F64)
    u = torch.randn(3, 9, 1, generator=gen, dtype=F64)
    points = x.expand(3, 9, 1)
    lift_1, _, lift_2 = model.lift
    h = lift_2(F.gelu(lift_1(torch.cat([u, points], dim=-1))))
    weight = trapezoid_weights(x[:, 0].sort().values)[x[:, 0].argsort().argsort()]
    for layer in model.encoder:
        h = layer(h, weight=weight)
    want = model.project(F.gelu(model.project_hidden(torch.cat([h, points], dim=-1))))
    torch.testing.assert_close(model(u, x), want, rtol=1e-12, atol=1e-12)


def test_fno_channel_mlp_is_the_neuraloperator_layout(gen):
    """Lift MLP, blocks ``h = GELU(K x + b + W x)``, ``x' = MLP(h) + g ⊙ x`` with GELU after
    all but the last, projection MLP (the docstring's rule), composed by hand from the model's
    own layers with non-zero biases and gates."""
    import torch.nn.functional as F

    model = FNOChannelMLP(width=6, n_modes=4, num_layers=2, lifting=5, projection=7).to(F64)
    with torch.no_grad():
        for layer in model.layers:
            layer.bias.normal_(generator=gen)
            layer.gate.normal_(generator=gen)
    x = torch.stack(torch.meshgrid(torch.linspace(0, 1, 8, dtype=F64),
                                   torch.linspace(0, 1, 10, dtype=F64), indexing="ij"), -1)
    u = torch.randn(2, 8, 10, 1, generator=gen, dtype=F64)
    h = model.lift[2](F.gelu(model.lift[0](torch.cat([u, x.expand(2, 8, 10, 2)], dim=-1))))
    for i, layer in enumerate(model.layers):
        mixed = F.gelu(layer.spectral(h) + layer.bias + h @ layer.skip.weight.T)
        hidden = layer.channel_mlp[2](F.gelu(layer.channel_mlp[0](mixed)))
        h = hidden + layer.gate * h
        h = h if i == len(model.layers) - 1 else F.gelu(h)
    want = model.project[2](F.gelu(model.project[0](h)))
    torch.testing.assert_close(model(u, x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["vitno", "fano"])
def test_patched_models_end_with_a_residual_spectral_convolution(name, gen):
    """After un-patching and the projection, y ← y + SpectralConv(y) (SPEC-continuum §2,
    step 4), checked on the projection's output."""
    model = build_model(name, d_model=8, n_head=2, num_layers=1, patches=4, final_modes=3,
                        dim_feedforward=16).double()
    projected = {}
    model.project.register_forward_hook(lambda module, args, out: projected.update(y=out))
    axis = torch.linspace(0, 1, 16, dtype=F64)
    x = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1)
    u = torch.randn(2, 16, 16, 1, generator=gen, dtype=F64)
    with torch.no_grad():
        out = model(u, x)
        y = projected["y"]
        assert model.final(y).abs().max() > 1e-3  # (far above the tolerance below)
        want = y + model.final(y)
        want = want if model.smoothing is None else model.smoothing(want)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_tno_permutation_equivariance(gen):
    """weight='auto' follows the sorted order, so a joint permutation of (u, x) permutes the
    output (float64, 1e-12), also with the averaging variant."""
    for model in (small_tno(gen), small_tno(gen, layer_norm=False)):
        n = 23
        x = torch.rand(n, 1, generator=gen, dtype=F64) * 3 - 1
        u = torch.randn(2, n, 1, generator=gen, dtype=F64)
        perm = torch.randperm(n, generator=gen)
        out = model(u, x)
        torch.testing.assert_close(model(u[:, perm], x[perm]), out[:, perm], rtol=0, atol=1e-12)
        # per-sample point sets, permuted differently per sample
        xb = torch.rand(2, n, 1, generator=gen, dtype=F64)
        perms = torch.stack([torch.randperm(n, generator=gen) for _ in range(2)])
        out = model(u, xb)
        gathered = [(u[b, perms[b]], xb[b, perms[b]], out[b, perms[b]]) for b in range(2)]
        moved = model(torch.stack([g[0] for g in gathered]), torch.stack([g[1] for g in gathered]))
        torch.testing.assert_close(moved, torch.stack([g[2] for g in gathered]), rtol=0,
                                   atol=1e-12)
    # the 'auto' weights are not the plain softmax: the grid matters
    x = torch.linspace(0, 1, 9, dtype=F64)[:, None] ** 3
    u = torch.randn(1, 9, 1, generator=gen, dtype=F64)
    assert (model(u, x) - model(u, x, None)).abs().max() > 1e-6
    # 2-D tensor grids, uniform (5 × 4) and graded (4 × 3), given in a shuffled order
    model = small_tno(gen, domain_dim=2)
    for a, b in ((torch.linspace(0, 1, 5), torch.linspace(0, 2, 4)),
                 (torch.linspace(0, 1, 4) ** 2, torch.tensor([0.0, 0.3, 1.0]))):
        x = torch.cartesian_prod(a.to(F64), b.to(F64))
        u = torch.randn(2, len(x), 1, generator=gen, dtype=F64)
        perm = torch.randperm(len(x), generator=gen)
        torch.testing.assert_close(model(u[:, perm], x[perm]), model(u, x)[:, perm], rtol=0,
                                   atol=1e-12)


def test_duplicated_key_with_half_weight_changes_nothing(gen):
    attn = ContinuumAttention(12, 3).to(F64)
    x = torch.randn(2, 5, 12, generator=gen, dtype=F64)
    ctx = torch.randn(2, 7, 12, generator=gen, dtype=F64)
    w = torch.rand(2, 7, generator=gen, dtype=F64) + 0.1
    out = attn(x, ctx, weight=w)
    split_ctx = torch.cat([ctx, ctx[:, 3:4]], dim=1)
    split_w = torch.cat([w, w[:, 3:4] / 2], dim=1)
    split_w[:, 3] /= 2
    torch.testing.assert_close(attn(x, split_ctx, weight=split_w), out, rtol=0, atol=1e-12)
    # plain softmax counts the copy twice
    assert (attn(x, split_ctx) - attn(x, ctx)).abs().max() > 1e-6
    # the TNO with 'auto': a repeated point shares its trapezoid weight with its copy
    model = small_tno(gen)
    xs = torch.linspace(0, 1, 9, dtype=F64)[:, None] ** 2
    u = torch.randn(2, 9, 1, generator=gen, dtype=F64)
    out = model(u, xs)
    idx = torch.tensor([*range(9), 4])
    doubled = model(u[:, idx], xs[idx])
    torch.testing.assert_close(doubled[:, :9], out, rtol=0, atol=1e-12)
    torch.testing.assert_close(doubled[:, 9], out[:, 4], rtol=0, atol=1e-12)


def test_zero_weight_padding_changes_no_real_output(gen):
    """A variable-N batch padded with junk points of weight 0 (float64, 1e-12)."""
    model = small_tno(gen)
    sizes = (6, 9)
    xs = [torch.rand(n, 1, generator=gen, dtype=F64).sort(dim=0).values for n in sizes]
    us = [torch.randn(1, n, 1, generator=gen, dtype=F64) for n in sizes]
    alone = [model(u, x) for u, x in zip(us, xs, strict=True)]
    n_max = max(sizes) + 3
    x_pad = 5 * torch.randn(2, n_max, 1, generator=gen, dtype=F64)  # junk everywhere
    u_pad = 5 * torch.randn(2, n_max, 1, generator=gen, dtype=F64)
    w_pad = torch.zeros(2, n_max, dtype=F64)
    for b, (u, x) in enumerate(zip(us, xs, strict=True)):
        n = x.shape[0]
        x_pad[b, :n], u_pad[b, :n] = x, u[0]
        w_pad[b, :n] = trapezoid_weights(x[:, 0])
    padded = model(u_pad, x_pad, w_pad)
    for b, n in enumerate(sizes):
        torch.testing.assert_close(padded[b, :n], alone[b][0], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# The TNO's query head: output at arbitrary query points (SPEC-continuum §8)


def test_query_head_counts_and_defaults(gen):
    # one more encoder layer and the query lift Linear(d, 128) -> GELU -> Linear(128, 128)
    assert n_params(TNO(1, 1, 2, query_head=True)) == n_params(TNO(1, 1, 2)) + 99_584 + (
        3 * 128 + 129 * 128)
    model = small_tno(gen, query_head=True)
    x = torch.rand(11, 1, generator=gen, dtype=F64)
    u = torch.randn(3, 11, 1, generator=gen, dtype=F64)
    torch.testing.assert_close(model(u, x), model(u, x, query=x), rtol=0, atol=0)
    # the averaging variant's projection reads the query points' coordinates
    variant = small_tno(gen, query_head=True, layer_norm=False)
    assert variant(u, x, query=torch.rand(4, 1, generator=gen, dtype=F64)).shape == (3, 4, 2)


def test_query_points_are_free_and_independent(gen):
    """Any number of query points anywhere; each one's output depends on its coordinates and
    the input alone (float64, 1e-12): a subset, a permutation and per-sample query points give
    the same values; the input's points permuted together with their weights change nothing,
    and a key split into two copies of half its weight neither."""
    model = small_tno(gen, query_head=True)
    x = torch.rand(9, 1, generator=gen, dtype=F64)
    w = torch.rand(9, generator=gen, dtype=F64) + 0.1
    u = torch.randn(2, 9, 1, generator=gen, dtype=F64)
    query = 2 * torch.rand(13, 1, generator=gen, dtype=F64) - 0.5  # outside [0, 1] too
    out = model(u, x, w, query=query)
    assert out.shape == (2, 13, 2)
    torch.testing.assert_close(model(u, x, w, query=query[4:5]), out[:, 4:5], rtol=0,
                               atol=1e-12)
    perm = torch.randperm(13, generator=gen)
    torch.testing.assert_close(model(u, x, w, query=query[perm]), out[:, perm], rtol=0,
                               atol=1e-12)
    own = torch.stack([query, query.flip(0)])  # (B, N_q, d)
    both = model(u, x, w, query=own)
    torch.testing.assert_close(both[0], out[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(both[1], out[1].flip(0), rtol=0, atol=1e-12)
    keys = torch.randperm(9, generator=gen)
    torch.testing.assert_close(model(u[:, keys], x[keys], w[keys], query=query), out, rtol=0,
                               atol=1e-12)
    idx = torch.tensor([*range(9), 2])
    halved = w[idx].clone()
    halved[2] /= 2
    halved[9] /= 2
    torch.testing.assert_close(model(u[:, idx], x[idx], halved, query=query), out, rtol=0,
                               atol=1e-12)


def test_query_head_learns_values_between_the_input_points():
    """Trained to give u between its samples (three random Fourier modes on [0, 1], read at
    48 random points, asked at 40 others), the head's median relative L2 on fresh functions
    falls from 1.17 (untrained) to below 0.5 (0.29 measured on one thread) in 600 steps."""
    def draw(batch, gen):
        x = torch.rand(batch, 48, 1, generator=gen).sort(dim=1).values
        query = torch.rand(batch, 40, 1, generator=gen)
        c = torch.randn(batch, 1, 3, 2, generator=gen)
        k = 2 * math.pi * torch.arange(1, 4.0)

        def f(t):
            return (c[..., 0] * torch.sin(k * t) + c[..., 1] * torch.cos(k * t)).sum(
                -1, keepdim=True)
        return f(x), x, f(query), query

    torch.manual_seed(0)
    model = TNO(1, 1, 1, d_model=32, n_head=4, num_layers=2, dim_feedforward=64, dropout=0.0,
                query_head=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(600):
        u, x, y, query = draw(16, gen)
        loss = relative_l2(model(u, x, query=query), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    u, x, y, query = draw(64, torch.Generator().manual_seed(9))
    with torch.no_grad():
        errors = relative_l2(model.eval()(u, x, query=query), y, reduction="none")
    assert float(errors.median()) < 0.5


def test_averaging_reduction():
    """Q = K = 0, V = W_o = I: every query gets Σ w_j v_j / Σ w_j (paper eq. 36)."""
    attn = ContinuumAttention(6, 2).to(F64)
    with torch.no_grad():
        for linear in (attn.query, attn.key):
            linear.weight.zero_()
            linear.bias.zero_()
        for linear in (attn.value, attn.out_proj):
            linear.weight.copy_(torch.eye(6, dtype=F64))
            linear.bias.zero_()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 6, generator=g, dtype=F64)
    ctx = torch.randn(2, 9, 6, generator=g, dtype=F64)
    w = torch.rand(2, 9, generator=g, dtype=F64)
    mean = (w[..., None] * ctx).sum(1) / w.sum(1)[:, None]
    torch.testing.assert_close(attn(x, ctx, weight=w), mean[:, None].expand(2, 4, 6),
                               rtol=0, atol=1e-13)
    # self-attention with 'auto' on a graded 1-D grid: the trapezoid average
    coords = torch.linspace(0, 1, 9, dtype=F64)[:, None] ** 2
    w = trapezoid_weights(coords[:, 0])
    mean = (w[:, None] * ctx).sum(1) / w.sum()
    torch.testing.assert_close(attn(ctx, weight="auto", coords=coords),
                               mean[:, None].expand(2, 9, 6), rtol=0, atol=1e-13)


def test_point_set_forward_gives_the_auto_weights_and_one_compiled_graph(gen):
    """The TNO scripts' forward derives the weights outside the model: the same output as the
    model's weight='auto', bit for bit, and a compiled TNO is one graph (fullgraph=True failed
    on the rule's data-dependent branches, a plain compile broke the graph at them)."""
    tno = TNO(1, 1, 1, d_model=8, n_head=2, num_layers=1, token0_dim=2).eval()
    times = torch.sort(torch.rand(9, generator=gen)).values[:, None]
    batch = {"x": torch.randn(2, 9, 1, generator=gen), "grid": times.expand(2, 9, 1),
             "token0": torch.randn(2, 2, generator=gen)}
    with torch.no_grad():
        expected = tno(batch["x"], times, token0=batch["token0"])
        assert torch.equal(point_set_forward("auto")(tno, batch), expected)
        assert torch.equal(point_set_forward(None)(tno, batch),
                           tno(batch["x"], times, weight=None, token0=batch["token0"]))
        compiled = torch.compile(tno, fullgraph=True, backend="eager")
        torch.testing.assert_close(point_set_forward("auto")(compiled, batch), expected)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="weight: expected one of"):
        point_set_forward("trapezoid")


def test_auto_weights(gen):
    # 1-D, any order, batched, N = 1
    x = torch.rand(2, 8, generator=gen, dtype=F64)
    w = auto_quadrature_weights(x[..., None])
    for b in range(2):
        order = x[b].argsort()
        torch.testing.assert_close(w[b, order], trapezoid_weights(x[b, order]))
    torch.testing.assert_close(auto_quadrature_weights(torch.tensor([[0.3]])), torch.ones(1))
    # a tensor grid in any order: uniform if equispaced ...
    grid = square_grid(5, F64).reshape(-1, 2)[torch.randperm(25, generator=gen)]
    torch.testing.assert_close(auto_quadrature_weights(grid), torch.ones(25, dtype=F64))
    # ... the same grid in float32 cast to float64 too (its spacing is float32's): the same
    # weights, so a model gives the same output in both precisions
    t = torch.linspace(0, 1, 32)
    grid32 = torch.stack(torch.meshgrid(t, t, indexing="ij"), dim=-1).reshape(-1, 2)
    torch.testing.assert_close(auto_quadrature_weights(grid32.double()),
                               torch.ones(1024, dtype=F64))
    tno = TNO(1, 1, 2, d_model=8, n_head=2, num_layers=1).eval()
    u = torch.randn(1, 1024, 1, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(tno.double()(u.double(), grid32.double()).float(),
                                   tno.float()(u, grid32), rtol=1e-5, atol=1e-6)
    # ... else the product of the per-axis cell widths (whole gaps at the ends), wherever the
    # grid lies (at 1e5 the tolerance for float32 round-off once called it uniform); a batch of
    # different grids
    a, c = torch.tensor([0.0, 0.1, 0.5, 1.0], dtype=F64), torch.tensor([0.0, 1.0, 3.0], dtype=F64)
    graded = torch.stack(torch.meshgrid(a, c, indexing="ij"), dim=-1).reshape(-1, 2)
    widths_a = torch.tensor([0.1, 0.25, 0.45, 0.5], dtype=F64)
    widths_c = torch.tensor([1.0, 1.5, 2.0], dtype=F64)
    expected = torch.outer(widths_a, widths_c).reshape(-1)
    torch.testing.assert_close(auto_quadrature_weights(graded), expected)
    torch.testing.assert_close(auto_quadrature_weights(graded + 1e5), expected)
    # float32 grids far from the origin are still uniform
    for offset in (1e3, 1e5):
        steps = offset + torch.arange(64, dtype=torch.float32) * 0.5
        far = torch.stack(torch.meshgrid(steps, torch.linspace(offset, offset + 1, 17),
                                         indexing="ij"), dim=-1).reshape(-1, 2)
        torch.testing.assert_close(auto_quadrature_weights(far), torch.ones(64 * 17))
    both = auto_quadrature_weights(torch.stack([graded, graded.flip(0)]))
    torch.testing.assert_close(both, torch.stack([expected, expected.flip(0)]))
    # an empty batch of grids (B = 0) has no weights, in 1-D and d >= 2 (the batch's shared
    # grid was looked for in its first element), and a TNO passes it through
    for points in (graded, graded[:, :1]):
        assert auto_quadrature_weights(points.expand(0, *points.shape)).shape == (0, 12)
    tno = TNO(1, 1, 2, d_model=8, n_head=2, num_layers=1)
    assert tno(torch.zeros(0, 12, 1), graded.float().expand(0, 12, 2)).shape == (0, 12, 1)
    # a grid nudged off equispacing changes the weights by the nudge (the trapezoid product,
    # halving the ends, jumped by the whole gap between the rules: 1e-3 in a TNO's output)
    nudged = t.double().clone()
    nudged[1:-1] += 1e-4 * torch.sin(torch.arange(30, dtype=F64))
    near = torch.stack(torch.meshgrid(nudged, nudged, indexing="ij"), dim=-1).reshape(-1, 2)
    w = auto_quadrature_weights(near)
    assert float((w / w.mean() - 1).abs().max()) < 0.02
    # scattered points in 2-D: a clear error that names the cure
    scattered = torch.rand(10, 2, generator=gen)
    with pytest.raises(ValueError, match=r"x: weight='auto'.*scattered.*mesh_weights"):
        TNO(1, 1, 2, d_model=8, n_head=2, num_layers=1)(torch.randn(1, 10, 1), scattered)
    with pytest.raises(ValueError, match=r"coords\[1\]: .*scattered"):
        auto_quadrature_weights(torch.stack([square_grid(3).reshape(-1, 2),
                                             torch.rand(9, 2, generator=gen)]))
    # every axis value of a 3 × 2 grid present and 6 points, but one node twice: not the grid
    grid = torch.stack(torch.meshgrid(torch.arange(3.0), torch.arange(2.0), indexing="ij"),
                       dim=-1).reshape(-1, 2)
    grid[5] = grid[0]  # (2, 1) → (0, 0); (2, 0) and (1, 1) keep the values 2 and 1
    with pytest.raises(ValueError, match="these 6 points in d = 2 are scattered"):
        auto_quadrature_weights(grid[torch.randperm(6, generator=gen)])
    # ... while explicit weights work on them
    out = TNO(1, 1, 2, d_model=8, n_head=2, num_layers=1)(torch.randn(1, 10, 1), scattered,
                                                          torch.rand(10, generator=gen) + 0.1)
    assert out.shape == (1, 10, 1)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning",
                            "ignore:`torch.jit:DeprecationWarning")
def test_a_tno_built_without_quadrature_attends_without_weights(gen):
    """quadrature=False is the model's own setting (the "vanilla transformer"): its default
    weight='auto' attends as weight=None does, so a model rebuilt from its arguments runs as it
    was trained; weights it was not trained with are refused by name."""
    torch.manual_seed(0)
    plain = TNO(1, 1, 1, d_model=8, n_head=2, num_layers=1, quadrature=False).eval()
    weighted = TNO(1, 1, 1, d_model=8, n_head=2, num_layers=1).eval()
    weighted.load_state_dict(plain.state_dict())
    t = torch.rand(9, 1, generator=gen, dtype=F64).float()  # non-uniform: trapezoid != uniform
    u = torch.randn(2, 9, 1, generator=gen)
    with torch.no_grad():
        vanilla = weighted(u, t, weight=None)
        assert torch.equal(plain(u, t), vanilla) and torch.equal(plain(u, t, None), vanilla)
        assert not torch.allclose(weighted(u, t), vanilla)
    for bad in (torch.ones(9), "trapezoid"):
        with pytest.raises(ValueError, match=r"^weight: this TNO attends without quadrature "
                                             r"weights \(built with quadrature=False\)"):
            plain(u, t, bad)
    assert "quadrature=False" in repr(plain) and "quadrature=True" in repr(weighted)
    with pytest.raises(TypeError, match=r"^quadrature: expected a bool"):
        TNO(1, 1, 1, quadrature=0)


def test_export_needs_explicit_weights(gen):
    """weight='auto' chooses its rule from the coordinates' values: torch.export cannot branch
    on them and torch.jit.trace would bake the branch in, so both are refused with the cure,
    which exports and traces exactly."""
    tno = small_tno(gen)
    u, x = torch.randn(2, 9, 1, generator=gen, dtype=F64), torch.rand(9, 1, dtype=F64,
                                                                       generator=gen)
    if _checks.EXPORT_DETECTABLE:  # not in torch 2.5, 2.6: torch's own error
        with pytest.raises(ValueError, match=r"x: weight='auto'.*torch.export.*auto_quadrature"):
            torch.export.export(tno, (u, x))
    with pytest.raises(ValueError, match=r"x: weight='auto'.*torch.jit.trace"):
        torch.jit.trace(tno, (u, x))
    weight = auto_quadrature_weights(x)
    exported = torch.export.export(tno, (u, x, weight)).module()
    traced = torch.jit.trace(tno, (u, x, weight))
    with torch.no_grad():
        expected = tno(u, x)
        torch.testing.assert_close(exported(u, x, weight), expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(traced(u, x, weight), expected, rtol=1e-12, atol=1e-12)


def test_l63_initial_condition_token(gen):
    """token0 replaces the lifted token of the initial time: u there is ignored, token0 is
    not, the point may sit anywhere in the sequence, and the length is unchanged."""
    model = small_tno(gen, token0_dim=4)
    x = torch.linspace(0, 2, 11, dtype=F64)[:, None]
    u = torch.randn(2, 11, 1, generator=gen, dtype=F64)
    token0 = torch.randn(2, 4, generator=gen, dtype=F64)
    out = model(u, x, token0=token0)
    assert out.shape == (2, 11, 2)
    u_changed = u.clone()
    u_changed[:, 0] += 1.0
    torch.testing.assert_close(model(u_changed, x, token0=token0), out, rtol=0, atol=1e-13)
    assert (model(u, x, token0=token0 + 1.0) - out).abs().max() > 1e-6
    perm = torch.randperm(11, generator=gen)
    torch.testing.assert_close(model(u[:, perm], x[perm], token0=token0), out[:, perm],
                               rtol=0, atol=1e-12)
    # zero-weight padding at earlier times is not the initial time
    x_pad = torch.cat([x, torch.tensor([[-1.0], [-2.0]], dtype=F64)])
    u_pad = torch.cat([u, torch.randn(2, 2, 1, generator=gen, dtype=F64)], dim=1)
    w_pad = torch.cat([trapezoid_weights(x[:, 0]), torch.zeros(2, dtype=F64)])
    torch.testing.assert_close(model(u_pad, x_pad, w_pad, token0)[:, :11], out, rtol=0,
                               atol=1e-12)
    with pytest.raises(ValueError, match="token0: expected a tensor of shape"):
        model(u, x)
    with pytest.raises(ValueError, match=r"token0: expected shape \(2, 4\), got \(2, 3\)"):
        model(u, x, token0=token0[:, :3])
    with pytest.raises(ValueError, match="token0: expected None"):
        small_tno(gen)(u, x, token0=token0)
    with pytest.raises(ValueError, match="token0_dim: .*domain_dim = 1"):
        TNO(1, 1, 2, token0_dim=4)


def test_averaging_variant_forward(gen):
    model = small_tno(gen, layer_norm=False)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    x = torch.rand(7, 1, generator=gen, dtype=F64)
    out = model(torch.randn(3, 7, 1, generator=gen, dtype=F64), x)
    assert out.shape == (3, 7, 2) and bool(torch.isfinite(out).all())


def test_afno_is_tied_to_its_grid(gen):
    afno = AFNO(d_model=16, grid=(8, 8), num_layers=1, num_blocks=2)
    assert afno(torch.randn(1, 8, 8, 1), square_grid(8)).shape == (1, 8, 8, 1)
    with pytest.raises(ValueError, match="not a neural operator"):
        afno(torch.randn(1, 16, 16, 1), square_grid(16))


def test_afno_is_initialised_as_physicsnemo_s():
    torch.manual_seed(0)
    afno = AFNO()
    linears = [m for m in (*afno.blocks.modules(), afno.head) if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 9  # two a block's MLP, the head
    for linear in linears:
        assert abs(linear.weight.std() - 0.02) < 2e-3  # (truncated at +-2: 100 sigma)
        assert not linear.bias.any()
    assert {m.eps for m in afno.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-6}
    bound = 1 / math.sqrt(3)  # the embedding keeps the default of the convolution it stands for
    assert afno.embed.weight.abs().max() <= bound and afno.embed.weight.std() > 0.2


def test_afno_filter_matches_its_definition(gen):
    """The block-diagonal complex MLP written out per block with complex matrices."""
    filt = AFNOFilter(8, num_blocks=2, sparsity_threshold=0.01).to(F64)
    with torch.no_grad():
        for p in filt.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) * 0.3)
    x = torch.randn(2, 6, 5, 8, generator=gen, dtype=F64)
    spec = torch.fft.rfft2(x, dim=(1, 2), norm="ortho")
    out = torch.zeros_like(spec)
    for blk in range(2):
        cols = slice(4 * blk, 4 * blk + 4)
        w1 = torch.complex(filt.w1[0, blk], filt.w1[1, blk])
        w2 = torch.complex(filt.w2[0, blk], filt.w2[1, blk])
        b1 = torch.complex(filt.b1[0, blk], filt.b1[1, blk])
        b2 = torch.complex(filt.b2[0, blk], filt.b2[1, blk])
        h = spec[..., cols] @ w1 + b1
        h = torch.complex(h.real.relu(), h.imag.relu())
        o = h @ w2 + b2
        shrink = torch.nn.functional.softshrink
        out[..., cols] = torch.complex(shrink(o.real, 0.01), shrink(o.imag, 0.01))
    expected = torch.fft.irfft2(out, s=(6, 5), dim=(1, 2), norm="ortho") + x
    torch.testing.assert_close(filt(x), expected, rtol=0, atol=1e-12)
    # the block around it: x + F(LN₁ x), then + MLP(LN₂ ·), F adding its own input
    block = AFNOBlock(8, num_blocks=2).to(F64)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) * 0.3)
    norm1, norm2, (lin1, _, lin2) = block.norm1, block.norm2, block.mlp
    h = x + block.filter(torch.nn.functional.layer_norm(x, (8,), norm1.weight, norm1.bias))
    h2 = torch.nn.functional.layer_norm(h, (8,), norm2.weight, norm2.bias)
    mlp = torch.nn.functional.gelu(h2 @ lin1.weight.T + lin1.bias) @ lin2.weight.T + lin2.bias
    torch.testing.assert_close(block(x), h + mlp, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# SpectralConv (§6.8)


def _trig_polynomial(s: int, coeffs: dict, dtype=F64) -> torch.Tensor:
    """``u (1, s, s, C)`` = Σ_k Re(c_k e^{i k·x}) on the periodic grid x = 2π (i, j) / s."""
    t = 2 * math.pi * torch.arange(s, dtype=F64) / s
    x1, x2 = torch.meshgrid(t, t, indexing="ij")
    u = 0
    for (k1, k2), c in coeffs.items():
        u = u + (c[None, None, :] * torch.exp(1j * (k1 * x1 + k2 * x2))[..., None]).real
    return u[None].to(dtype)


def test_spectral_conv_mode_skipping_agrees_across_grids(gen):
    """A trigonometric polynomial with |k| <= 3 through SpectralConv(m=6) on 16², 32², 64²:
    the outputs agree on the shared points (1e-12 in float64, 1e-5 in float32)."""
    conv = SpectralConv(2, 3, 6)
    coeffs = {(k1, k2): torch.randn(2, generator=gen, dtype=torch.complex128)
              for k1 in range(-3, 4) for k2 in range(0, 4)}
    for dtype, tol in ((F64, 1e-12), (torch.float32, 1e-5)):
        outs = {s: conv(_trig_polynomial(s, coeffs, dtype)) for s in (16, 32, 64)}
        for s in (32, 64):
            step = s // 16
            torch.testing.assert_close(outs[s][:, ::step, ::step], outs[16], rtol=0, atol=tol)
    # patches coarser than the modes run (p = 8, m = 12), odd and single-point grids too
    big = SpectralConv(3, 2, 12)
    for shape in ((8, 8), (7, 5), (1, 1), (2, 3)):
        assert big(torch.randn(2, *shape, 3, generator=gen)).shape == (2, *shape, 2)
    # and skip the unpaired Nyquist row and column of an even grid: (-1)^j along either axis
    # (times any function of the other) gives 0, while the next-lower modes pass
    big = big.double()
    j1, j2 = torch.arange(8, dtype=F64)[:, None], torch.arange(6, dtype=F64)
    a = torch.randn(3, generator=gen, dtype=F64)
    for field in ((-1) ** j1 * torch.cos(2 * math.pi * j2 / 6), (-1) ** j2 * torch.sin(
            2 * math.pi * j1 / 8)):
        assert big((field[..., None] * a)[None]).abs().max() < 1e-13
    lower = torch.cos(3 * 2 * math.pi * j1 / 8) + torch.cos(2 * 2 * math.pi * j2 / 6)
    assert big((lower[..., None] * a)[None]).abs().max() > 1e-3


@pytest.mark.parametrize("s, k_max", [(12, 3), (5, 2)])
def test_spectral_conv_against_explicit_modes(gen, s, k_max):
    """Each mode k is multiplied by its own matrix: weight_pos holds k₁ ∈ [0, m), weight_neg
    k₁ = j - m; the real FFT's k₂ = 0 column keeps the real part (its conjugate pairs). On the
    5² grid only |k| <= 2 resolve: k₁ = -2, -1 take weight_neg's last two rows, not its first."""
    m = 4
    conv = SpectralConv(2, 2, m)
    coeffs = {(k1, k2): torch.randn(2, generator=gen, dtype=torch.complex128)
              for k1 in range(-k_max, k_max + 1) for k2 in range(0, k_max + 1)}
    u = _trig_polynomial(s, coeffs)

    def matrix(k1, k2):
        w = conv.weight_pos[:, :, k1, k2] if k1 >= 0 else conv.weight_neg[:, :, m + k1, k2]
        return w.to(torch.complex128)

    t = 2 * math.pi * torch.arange(s, dtype=F64) / s
    x1, x2 = torch.meshgrid(t, t, indexing="ij")
    expected = torch.zeros(s, s, 2, dtype=F64)
    for k1 in range(-k_max, k_max + 1):
        for k2 in range(0, k_max + 1):
            # u's FFT coefficient of mode (k1, k2): Re(c e^{ik·x}) puts c/2 at +k; on the
            # k2 = 0 column the conjugate of mode (-k1, 0) lands on (k1, 0) too
            if k2:
                c = coeffs[(k1, k2)] / 2
            else:
                c = (coeffs[(k1, 0)] + coeffs[(-k1, 0)].conj()) / 2
            wave = torch.exp(1j * (k1 * x1 + k2 * x2))[..., None]
            term = (c @ matrix(k1, k2))[None, None, :] * wave
            expected += (2 * term.real) if k2 else term.real
    torch.testing.assert_close(conv(u)[0], expected, rtol=0, atol=1e-10)


def test_spectral_conv_init_count_and_dtype_conversions():
    conv = SpectralConv(3, 4, 5, last_modes=2)
    assert n_params(conv) == 2 * 3 * 4 * 5 * 2  # complex entries count once
    parts = torch.view_as_real(conv.weight_pos)
    assert float(parts.detach().min()) >= 0 and float(parts.detach().max()) <= 1 / 12
    imag = conv.weight_neg.imag.clone()
    conv.to(F64)  # nn.Module.to would otherwise drop the imaginary parts
    assert conv.weight_neg.dtype == torch.complex128
    torch.testing.assert_close(conv.weight_neg.imag, imag.to(F64))
    assert list(conv.state_dict()) == ["weight_pos", "weight_neg"]
    assert conv.float().weight_pos.dtype == torch.complex64
    assert conv.double().weight_pos.dtype == torch.complex128


def test_tno_is_initialised_and_drops_attention_as_the_authors_code():
    """The authors' TNO: Q, K, V and W_o with nn.Linear's initialisation (weights and biases
    U(±1/√d)), and each attention probability dropped with probability 0.1 in training (their
    attention's own default, which their runs never set). Here they were Glorot weights with
    zero biases, and no attention dropout."""
    torch.manual_seed(0)
    model = TNO(1, 1, 1, d_model=64, n_head=4, num_layers=2, dropout=0.0, query_head=True)
    layers = [*model.encoder, model.query_layer]
    for layer in layers:
        attn = layer.attn
        assert attn.attn_dropout == 0.1
        for linear in (attn.query, attn.key, attn.value, attn.out_proj):
            for parameter in (linear.weight, linear.bias):
                assert 0.9 / 8 < float(parameter.detach().abs().max()) <= 1 / 8
    u, x = torch.randn(2, 9, 1), torch.linspace(0, 1, 9)[:, None]
    plain = model.eval()(u, x)
    assert not torch.allclose(model.train()(u, x), plain)  # only the attention drops
    quiet = TNO(1, 1, 1, d_model=64, n_head=4, num_layers=2, dropout=0.0, attn_dropout=0.0)
    torch.testing.assert_close(quiet.train()(u, x), quiet.eval()(u, x), rtol=0, atol=0)


def test_spectral_weights_follow_the_default_dtype_and_take_channels_last(gen):
    """Under torch.set_default_dtype(float64) the complex weights are complex128 like every
    real parameter (they stayed complex64: a float64 run trained them in float32), and
    to(memory_format=channels_last) converts a model with them (it failed: 'required rank 4
    tensor', the weights' real view being 5-D)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        model = build_model("vitno", d_model=8, n_head=2, num_layers=1, patches=2, lift_modes=2,
                            final_modes=3).eval()  # (no dropout between the two calls)
    finally:
        torch.set_default_dtype(previous)
    assert {p.dtype for p in model.parameters()} == {F64, torch.complex128}
    assert SpectralConv(2, 3, 2).weight_pos.dtype == torch.complex64  # float32 default
    u, x = torch.randn(2, 8, 8, 1, generator=gen, dtype=F64), square_grid(8, F64)
    expected = model(u, x)
    before = {name: p.clone() for name, p in model.named_parameters()}
    model.to(memory_format=torch.channels_last)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, before[name], rtol=0, atol=0)
    torch.testing.assert_close(model(u, x), expected, rtol=1e-12, atol=1e-12)


def test_coordinates_that_require_grad_raise_no_warning(gen):
    """weight='auto' decides its rule from the coordinates' values: with coordinates that
    require grad (to differentiate in x) it warned 'Converting a tensor with requires_grad=True
    to a scalar'."""
    model = TNO(1, 1, 2, d_model=8, n_head=2, num_layers=1).double()
    x = square_grid(5, F64).reshape(-1, 2).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model(torch.randn(1, 25, 1, generator=gen, dtype=F64), x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(grad).all()


def test_complex_parameters_move_to_and_from_meta_and_vmap_over_weights(gen):
    """Build on 'meta', then to_empty + load_state_dict (the pattern for large models); an
    ensemble's stacked weights through torch.func.vmap."""
    conv = SpectralConv(3, 2, 4)
    x = torch.randn(2, 9, 8, 3, generator=gen)
    with torch.device("meta"):
        empty = SpectralConv(3, 2, 4)
    empty.to_empty(device="cpu").load_state_dict(conv.state_dict())
    assert empty.weight_pos.dtype == torch.complex64
    torch.testing.assert_close(empty(x), conv(x), rtol=0, atol=0)
    assert conv.to("meta").weight_neg.device.type == "meta"
    with torch.device("meta"):
        model = build_model("fano", d_model=16, n_head=2, num_layers=1, qkv_modes=3)
    model.to_empty(device="cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    members = [SpectralConv(2, 3, 3) for _ in range(3)]
    weights, _ = torch.func.stack_module_state(members)
    u = torch.randn(2, 7, 6, 2, generator=gen)
    outs = torch.func.vmap(lambda w: torch.func.functional_call(members[0], w, (u,)))(weights)
    for out, member in zip(outs, members, strict=True):
        torch.testing.assert_close(out, member(u), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Quadrature orders (§6.6): self-attention, whose queries are the mesh's own points, and
# cross-attention at M = 7 fixed points (M != N)


def _attention_setup():
    """``attend(queries (M,), y (B, N), weight)`` and the 2¹⁴-point trapezoid reference
    ``exact(queries)``."""
    g = torch.Generator().manual_seed(17)
    wq, wk, wv = (torch.randn(3, 4, generator=g, dtype=F64) for _ in range(3))

    def features(y: torch.Tensor) -> torch.Tensor:  # a smooth u: [0, 1] → R³
        return torch.stack([torch.sin(2 * math.pi * y), torch.cos(3 * y), y * y], dim=-1)

    def attend(queries: torch.Tensor, y: torch.Tensor,
               weight: torch.Tensor | None) -> torch.Tensor:
        """Keys and values at points ``y (B, N)``."""
        q = (features(queries) @ wq)[None, None].expand(y.shape[0], 1, len(queries), 4)
        f = features(y)
        return ops.continuum_attention(q, (f @ wk)[:, None], (f @ wv)[:, None],
                                       weight=weight)[:, 0]

    fine = torch.linspace(0, 1, 2**14 + 1, dtype=F64)[None]
    return attend, lambda queries: attend(queries, fine, trapezoid_weights(fine))


def _slope(ns, errors) -> float:
    logs = torch.log(torch.tensor(ns, dtype=F64)), torch.log(torch.tensor(errors, dtype=F64))
    centred = logs[0] - logs[0].mean()
    return float((centred * (logs[1] - logs[1].mean())).sum() / (centred**2).sum())


@pytest.mark.parametrize("queries", ["self", "cross"])
@pytest.mark.parametrize("mesh", ["uniform", "graded"])
def test_trapezoid_is_second_order(mesh, queries):
    """Order 2 ± 0.2 on the uniform and the graded mesh x = ξ + 0.15 sin 2πξ, N = 2⁵…2¹⁰;
    unweighted softmax on the graded mesh plateaus more than 10× above."""
    attend, exact = _attention_setup()
    fixed = torch.linspace(0.05, 0.95, 7, dtype=F64)
    ns = [2**p for p in range(5, 11)]
    errors, plain = [], []
    for n in ns:
        xi = torch.linspace(0, 1, n, dtype=F64)
        y = (xi + 0.15 * torch.sin(2 * math.pi * xi) if mesh == "graded" else xi)[None]
        at = y[0] if queries == "self" else fixed
        reference = exact(at)
        errors.append(float((attend(at, y, trapezoid_weights(y)) - reference).abs().max()))
        plain.append(float((attend(at, y, None) - reference).abs().max()))
    assert abs(_slope(ns, errors) + 2) < 0.2
    if mesh == "graded":  # unweighted softmax converges to another operator
        assert min(plain) > 10 * errors[-1] and plain[-1] > 0.5 * plain[-2]


def test_cross_attention_monte_carlo_is_half_order():
    attend, exact = _attention_setup()
    queries = torch.linspace(0.05, 0.95, 7, dtype=F64)
    reference = exact(queries)
    g = torch.Generator().manual_seed(3)
    ns = [2**p for p in range(5, 11)]
    rms = []
    for n in ns:
        y = torch.rand(64, n, generator=g, dtype=F64)  # 64 seeds, weights volume / n
        err = attend(queries, y, torch.full((n,), 1.0 / n, dtype=F64)) - reference
        rms.append(float(err.square().mean().sqrt()))
    assert abs(_slope(ns, rms) + 0.5) < 0.1


# ---------------------------------------------------------------------------------------------
# Errors name the argument


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_spectral_layers_run_in_half_precision_modules(dtype):
    """A model converted with .bfloat16()/.half() runs its FFT layers: the FFTs and spectral
    weights in float32 (half FFTs are missing or power-of-two only), the result in the
    module's dtype, close to the float32 module's."""
    with torch.random.fork_rng():  # the later tests' draws stay as they were
        torch.manual_seed(0)
        _check_half_precision_module(dtype)


def _check_half_precision_module(dtype):
    layers = [(SpectralConv(3, 4, 3), (2, 9, 8, 3)), (AFNOFilter(8, num_blocks=2), (2, 9, 8, 8)),
              (SpectralConv1d(3, 4, 4), (2, 12, 3)), (SpectralConv2d(3, 4, 3), (2, 8, 8, 3))]
    for layer, shape in layers:
        x = torch.randn(shape)
        expected = layer(x)
        half = copy.deepcopy(layer).to(dtype)
        out = half(x.to(dtype))
        assert out.dtype == dtype, type(layer).__name__
        torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize(("build", "error", "match"), [
    (lambda: TNO(0, 1, 1), ValueError, "in_dim: expected an int >= 1"),
    (lambda: TNO(1, 1, 1, d_model=12, n_head=5), ValueError, "n_head: expected a divisor"),
    (lambda: TNO(1, 1, 1, layer_norm=1), TypeError, "layer_norm: expected a bool"),
    (lambda: TNO(1, 1, 1, dropout=1.5), ValueError, "dropout: expected a float in"),
    (lambda: TNO(1, 1, 1, query_head=1), TypeError, "query_head: expected a bool"),
    (lambda: SpectralConv(2, 2, 0), ValueError, "modes: expected an int >= 1"),
    (lambda: AFNOFilter(10, num_blocks=4), ValueError, "num_blocks: expected a divisor"),
    (lambda: AFNO(grid=64), ValueError, "grid: expected"),
    (lambda: FNOChannelMLP(n_modes=7), ValueError, "n_modes: expected an even int"),
    (lambda: FNOChannelMLP(expansion=float("inf")), ValueError, "expansion: expected a finite"),
    (lambda: FNOChannelMLP(expansion="2"), TypeError, "expansion: expected a finite"),
    (lambda: ContinuumEncoderLayer(8, 2, dim_feedforward=0), ValueError, "dim_feedforward"),
    (lambda: ContinuumEncoderLayer(8, 2, eps=-1.0), ValueError, "eps: expected a finite float"),
    (lambda: ContinuumEncoderLayer(8, 2, eps="a"), TypeError, "eps: expected a finite float"),
    (lambda: build_model("tno_nope"), ValueError, "name: expected one of"),
])
def test_constructor_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_forward_errors():
    model = TNO(2, 1, 1, d_model=8, n_head=2, num_layers=1)
    head = TNO(2, 1, 1, d_model=8, n_head=2, num_layers=1, query_head=True)
    u, x = torch.randn(2, 5, 2), torch.linspace(0, 1, 5)[:, None]
    cases = [
        (lambda: model(u[..., :1], x), ValueError, r"u: expected shape \(B, N, in_dim\)"),
        (lambda: model(u[:, :0], x[:0]), ValueError, "N >= 1"),
        (lambda: model(u, x[:4]), ValueError, r"x: expected shape \(5, 1\) or \(B, 5, 1\)"),
        (lambda: model(u, x, "trapezoid"), ValueError, r"weight: expected one of \['auto'\]"),
        (lambda: model(u, x, [1.0] * 5), TypeError, "weight: expected 'auto', None or a tensor"),
        (lambda: model(u, x, torch.rand(4)), ValueError, r"weight: expected shape"),
        (lambda: model(u, x, -torch.rand(5)), ValueError, "weight: expected finite, non-neg"),
        (lambda: model(u, x, query=x), ValueError, "query: the model outputs at its input "
                                                   "points only; build it with query_head=True"),
        (lambda: head(u, x, query=x[None, None]), ValueError,
         r"query: expected shape \(N_q, 1\) or \(B, N_q, 1\) with N_q >= 1, got \(1, 1, 5, 1\)"),
        (lambda: head(u, x, query=x[:0]), ValueError, "with N_q >= 1, got \\(0, 1\\)"),
        (lambda: head(u, x, query=torch.rand(3, 2)), ValueError, r"query: expected shape"),
        (lambda: head(u, x, query=torch.rand(3, 4, 1)), ValueError, "with B = 2"),
        (lambda: head(u, x, query=torch.arange(3)[:, None]), TypeError,
         "query: expected floating-point coordinates"),
        (lambda: head(u, x, query=[[0.5]]), TypeError, "query: expected a tensor"),
        (lambda: ContinuumAttention(8, 2)(u), ValueError, r"x: expected shape \(B, N, d_model\)"),
        (lambda: ContinuumAttention(8, 2)(torch.randn(2, 3, 8), torch.randn(1, 4, 8)),
         ValueError, "context: expected shape"),
        (lambda: ContinuumAttention(8, 2)(torch.randn(2, 3, 8), weight="auto"), ValueError,
         "weight: 'auto' derives the weights from the key points' coordinates"),
        (lambda: auto_quadrature_weights(torch.rand(5)), ValueError,
         r"coords: expected shape \(N, d\) or \(B, N, d\)"),
        (lambda: auto_quadrature_weights(torch.tensor([[0.0], [float("nan")]])), ValueError,
         "coords: expected finite"),
        (lambda: SpectralConv(2, 2, 3)(torch.randn(1, 4, 4, 3)), ValueError,
         r"x: expected shape \(B, p1, p2, in_channels\)"),
        (lambda: FNOChannelMLP(width=4, lifting=4, projection=4)(torch.randn(1, 8, 8, 1),
                                                                 square_grid(6)),
         ValueError, r"x: expected shape \(8, 8, 2\)"),
        (lambda: GTEncoder(d_model=8, n_head=2, num_layers=1)(torch.randn(1, 9, 2),
                                                              square_grid(3).reshape(-1, 2)),
         ValueError, "u: expected shape"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


def test_quadrature_weights_of_another_float_dtype_are_cast_as_the_coordinates_are():
    """mesh_weights of a float64 point cloud (numpy data) is float64: the TNO and the GT encoder
    took float64 coordinates but refused such weights, naming the op's inner 'k'."""
    torch.manual_seed(0)
    x = torch.rand(40, 2, dtype=torch.float64)
    weight = mesh_weights(x)
    u = torch.sin(3 * x[:, :1]).float()[None]
    for model in (TNO(in_dim=1, out_dim=1, domain_dim=2, d_model=16, n_head=2, num_layers=1),
                  build_model("gt_encoder", d_model=16, n_head=2, num_layers=1)):
        model.eval()
        torch.testing.assert_close(model(u, x, weight), model(u, x.float(), weight.float()),
                                   rtol=0, atol=0)


@pytest.mark.parametrize(("name", "extra"), [("vitno", {"lift_modes": 3}),
                                             ("fano", {"qkv_modes": 3})])
def test_patched_models_give_every_layer_the_given_heads(name, extra, gen):
    """n_head reaches every encoder layer: the same parameters with one head give another
    output (the heads split the softmax over the patches)."""
    config = {"d_model": 8, "num_layers": 2, "patches": 2, "final_modes": None,
              "dim_feedforward": 16, **extra}
    model = build_model(name, n_head=4, **config).double().eval()
    one_head = build_model(name, n_head=1, **config).double().eval()
    one_head.load_state_dict(model.state_dict())
    assert [layer.attn.n_head for layer in model.encoder] == [4, 4]
    u = torch.randn(2, 8, 8, 1, generator=gen, dtype=F64)
    x = square_grid(8, F64)
    with torch.no_grad():
        assert (model(u, x) - one_head(u, x)).abs().max() > 1e-6


def test_tno_passes_its_scale_to_every_attention(gen):
    """TNO(scale=s) scales the logits of every encoder layer and of the query head by s: the
    same parameters with the default 1/sqrt(d_model / n_head) give the same output at
    s = 1/sqrt(8) and another one at s = 0.7."""
    model = small_tno(gen, scale=0.7, query_head=True)
    default = small_tno(gen, query_head=True)
    same = small_tno(gen, scale=1 / math.sqrt(8), query_head=True)
    default.load_state_dict(model.state_dict())
    same.load_state_dict(model.state_dict())
    assert [layer.attn.scale for layer in [*model.encoder, model.query_layer]] == [0.7] * 3
    x = torch.rand(9, 1, generator=gen, dtype=F64)
    u = torch.randn(2, 9, 1, generator=gen, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(same(u, x), default(u, x), rtol=1e-12, atol=1e-12)
        assert (model(u, x) - default(u, x)).abs().max() > 1e-6
