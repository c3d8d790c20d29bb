"""Tests of galerkin_ext.models: the paper's configurations, shapes at every resolution,
state_dict round trips and torch.compile."""

from __future__ import annotations

import copy
import io
import re

import numpy as np
import pytest
import torch
from conftest import TORCH_BEFORE_2_6

from galerkin_ext.data import block_average
from galerkin_ext.layers import SimpleAttention
from galerkin_ext.models import (
    FNO1d,
    FNO2d,
    SimpleTransformer1d,
    SimpleTransformer2d,
    available_models,
    build_model,
    zero_boundary,
)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def grid_1d(n: int) -> torch.Tensor:
    return torch.linspace(0, 1, n)[:, None]


def grid_2d(n: int) -> torch.Tensor:
    """``(n, n, 2)`` node coordinates, ``grid[i, j] = (x_j, y_i)`` as in the reference data."""
    x = torch.linspace(0, 1, n)
    return torch.stack(torch.meshgrid(x, x, indexing="xy"), dim=-1)


@pytest.mark.parametrize(
    ("name", "count"),
    [("burgers", 530_305), ("darcy", 2_220_829), ("darcy_inverse", 2_383_873),
     ("fno1d", 549_569), ("fno2d", 2_368_001)],
)
def test_parameter_counts_of_the_paper(name, count):
    assert n_params(build_model(name)) == count


def test_parameter_counts_do_not_depend_on_resolution_or_attention():
    for kwargs in ({"fine": 211, "coarse": 61}, {"fine": 85, "coarse": 29},
                   {"attention_type": "fourier"}, {"attention_type": "softmax"}):
        assert n_params(build_model("darcy", **kwargs)) == 2_220_829
    assert n_params(build_model("darcy_inverse", fine=211, coarse=71)) == 2_383_873
    # "regular Ln": two residual LayerNorms instead of the two per-head norms, same count.
    assert n_params(build_model("burgers", norm="layer")) == 530_305
    assert n_params(build_model("burgers", norm=None)) == 530_305 - 4 * 2 * 2 * 96


def test_build_model_configurations():
    # (the continuum-attention paper's names are checked in test_continuum_models.py)
    assert {"burgers", "darcy", "darcy_inverse", "fno1d", "fno2d"} <= set(available_models())
    burgers = build_model("burgers", attention_type="galerkin", norm="layer", num_layers=2,
                          d_model=32, n_head=2, dim_feedforward=40)
    assert isinstance(burgers, SimpleTransformer1d) and len(burgers.encoder) == 2
    attn = burgers.encoder[0].attn
    assert (attn.attention_type, attn.norm, attn.n_head, attn.d_model) == ("galerkin", "layer",
                                                                            2, 32)
    assert burgers.encoder[0].ffn.linear1.out_features == 40
    darcy = build_model("darcy")
    assert isinstance(darcy, SimpleTransformer2d)
    assert darcy.encoder[0].attn.eps == 1e-7 and darcy.encoder[0].attn.attn_dropout == 0.05
    assert darcy.sizes == (141, 78, 43, 77) and darcy.boundary == "dirichlet"
    assert darcy.upsampler.sizes == (77, 141)
    # The reference's epsilon rule: Galerkin on fine grids >= 211 uses 1e-5.
    assert build_model("darcy", fine=211, coarse=61).encoder[0].attn.eps == 1e-5
    assert build_model("darcy", fine=211, coarse=61,
                       attention_type="fourier").encoder[0].attn.eps == 1e-7
    assert build_model("darcy", fine=211, coarse=61, eps=1e-6).encoder[0].attn.eps == 1e-6
    # the rule reads a numpy integer as the int it is (it took the other epsilon)
    assert build_model("darcy", fine=np.int64(211),
                       coarse=np.int64(61)).encoder[0].attn.eps == 1e-5
    # Softmax and linear attention get the reference's encoder dropout 0.1.
    softmax = build_model("darcy", attention_type="softmax")
    assert softmax.encoder[0].attn.attn_dropout == 0.1 and softmax.encoder[0].dropout1.p == 0.1
    assert softmax.encoder[0].ffn.dropout.p == 0.05
    linear = build_model("burgers", attention_type="linear")
    assert linear.encoder[0].attn.attn_dropout == 0.1 and linear.encoder[0].dropout1.p == 0.1
    assert build_model("burgers", attention_type="linear",
                       encoder_dropout=0.0).encoder[0].attn.attn_dropout == 0.0
    inverse = build_model("darcy_inverse")
    assert inverse.sizes == (141, 71, 36, 71) and inverse.upsampler.sizes == (36, 36)
    # a fine grid alone takes the paper's coarse one (it kept 43, or 36, for any fine grid)
    assert build_model("darcy", fine=211).sizes == (211, 113, 61, 113)
    assert build_model("darcy", fine=85).sizes.coarse == 29
    assert build_model("darcy_inverse", fine=211).sizes == (211, 123, 71, 122)
    with pytest.raises(ValueError, match=r"^coarse: model 'darcy' at fine=101 needs its coarse "
                                         r"grid \(the paper pairs 211 with 61, 141 with 43, 85 "
                                         r"with 29\)"):
        build_model("darcy", fine=101)
    assert build_model("darcy", fine=101, coarse=26).sizes.coarse == 26
    assert inverse.boundary == "free" and inverse.output_grid == "coarse"
    assert isinstance(build_model("fno1d"), FNO1d) and isinstance(build_model("fno2d"), FNO2d)


def test_build_model_errors():
    with pytest.raises(ValueError, match="name: expected one of"):
        build_model("navier_stokes")
    with pytest.raises(TypeError, match=r"\['n_heads'\] are not arguments of SimpleTransformer1d"):
        build_model("burgers", n_heads=2)
    with pytest.raises(ValueError, match="attention_type"):
        build_model("darcy", attention_type="cosine")
    with pytest.raises(ValueError, match="coarse: expected at most fine"):
        build_model("darcy", fine=85, coarse=90)
    with pytest.raises(ValueError, match="decoder"):
        build_model("darcy", decoder="conv")
    with pytest.raises(ValueError, match="modes: expected at most 10"):
        build_model("darcy", fine=21, coarse=9)
    # the decoder not built checks its arguments too, then refuses them (they were dropped)
    for name, overrides, message in [
        ("darcy_inverse", {"modes": -1}, "modes: expected an int >= 1, got -1"),
        ("darcy_inverse", {"freq_dim": "wide"}, "freq_dim: expected an int >= 1, got 'wide'"),
        ("darcy_inverse", {"decoder_dim_feedforward": 0.5}, "decoder_dim_feedforward: "),
        ("darcy", {"decoder_hidden": -3}, "decoder_hidden: expected an int >= 1, got -3"),
        ("darcy_inverse", {"modes": 4}, "modes: only the spectral decoder has it, got 4 with "
         "decoder='pointwise'"),
        ("darcy_inverse", {"freq_dim": 8}, "freq_dim: only the spectral decoder has it, got 8 "
         "with decoder='pointwise'"),
        ("darcy_inverse", {"decoder_dim_feedforward": 32}, "decoder_dim_feedforward: only the "
         "spectral decoder has it, got 32 with decoder='pointwise'"),
        ("darcy", {"decoder_hidden": 16}, "decoder_hidden: only the pointwise decoder has it, "
         "got 16 with decoder='spectral'"),
    ]:
        with pytest.raises((TypeError, ValueError), match=f"^{re.escape(message)}"):
            build_model(name, **overrides)
    with pytest.raises(ValueError, match="x: expected shape"):
        zero_boundary(torch.randn(4, 4))


@pytest.mark.parametrize("sides", [(1, 1), (2, 1), (1, 5), (3, 4), (6, 6)])
def test_zero_boundary_keeps_the_shape_and_the_interior(sides):
    """A side of 1 or 2 is all boundary (slicing the ring off and padding it back gave 2)."""
    x = torch.randn(2, *sides, 3)
    out = zero_boundary(x)
    ring = torch.ones(sides, dtype=torch.bool)
    ring[1:-1, 1:-1] = False
    assert out.shape == x.shape
    assert not out[:, ring].any()
    assert torch.equal(out[:, ~ring], x[:, ~ring])


def test_grids_on_another_device_or_of_integers_are_named():
    """Named "grid" (they were torch's device error from inside, or "pos" from the attention
    layer the model passes them to)."""
    model = build_model("burgers", d_model=8, dim_feedforward=8, num_layers=1, freq_dim=8,
                        modes=4, decoder_dim_feedforward=8)
    x = torch.randn(2, 16, 1)
    with pytest.raises(ValueError, match="^grid: expected a tensor on cpu like x, got one on meta"):
        model(x, grid_1d(16).to("meta"))
    with pytest.raises(TypeError, match="^grid: expected floating-point coordinates"):
        model(x, torch.arange(16)[:, None])
    fno = build_model("fno1d", width=4, modes=2, num_layers=1)
    with pytest.raises(ValueError, match="^grid: expected a tensor on cpu like x"):
        fno(x, grid_1d(16).to("meta"))


def test_burgers_same_weights_at_every_resolution(gen):
    model = build_model("burgers").eval()
    for n in (512, 2048, 8192):
        x = torch.randn(2, n, 1, generator=gen)
        with torch.no_grad():
            out = model(x, grid_1d(n))
            assert out.shape == (2, n, 1) and torch.isfinite(out).all()
            torch.testing.assert_close(model(x, grid_1d(n).expand(2, n, 1)), out)
    with pytest.raises(ValueError, match=r"grid: expected shape .* got \(65, 1\)$"):
        model(torch.randn(2, 64, 1), grid_1d(65))  # the shape given, not an unsqueezed one
    with pytest.raises(ValueError, match="in_channels = 1"):
        model(torch.randn(2, 64, 2), grid_1d(64))


@pytest.mark.parametrize(("fine", "coarse"), [(85, 29), (141, 43), (211, 61)])
def test_darcy_shapes_and_boundary(fine, coarse, gen):
    model = build_model("darcy", fine=fine, coarse=coarse).eval()
    seen = []
    model.encoder[0].attn.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
    x = torch.randn(1, fine, fine, 1, generator=gen)
    with torch.no_grad():
        out = model(x, grid_2d(fine))
    assert out.shape == (1, fine, fine, 1)
    # Zero Dirichlet ring, and a non-trivial interior.
    ring = torch.ones(fine, fine, dtype=torch.bool)
    ring[1:-1, 1:-1] = False
    assert (out[0, ring] == 0).all() and (out[0, ~ring] != 0).all()
    # The attention sees the coarse grid's coordinates, one token per coarse node, row-major.
    torch.testing.assert_close(seen[0], grid_2d(coarse).reshape(coarse * coarse, 2))


@pytest.mark.parametrize(("fine", "coarse"), [(141, 36), (211, 71)])
def test_inverse_outputs_on_the_coarse_grid(fine, coarse, gen):
    model = build_model("darcy_inverse", fine=fine, coarse=coarse).eval()
    x = torch.randn(2, fine, fine, 1, generator=gen)
    with torch.no_grad():
        out = model(x, grid_2d(fine))
        assert out.shape == (2, coarse, coarse, 1) and (out[:, 0] != 0).all()  # no zero ring
        torch.testing.assert_close(model(x, grid_2d(fine).expand(2, fine, fine, 2)), out)


@pytest.mark.parametrize("dim", [1, 2])
def test_fno_against_its_written_out_form(gen, dim):
    """The FNO is its lift, Fourier layers act(K x + W x) with no activation after the last,
    the MLP, then the de-normalisation; a Dirichlet FNO2d zeroes the boundary ring after it
    (the mean of 3 would otherwise sit there)."""
    n = 9
    if dim == 1:
        model = FNO1d(width=8, modes=3, dim_feedforward=16).double()
        grid = torch.linspace(0, 1, n, dtype=torch.float64)[:, None]
    else:
        model = FNO2d(width=8, modes=3, dim_feedforward=16, boundary="dirichlet").double()
        grid = grid_2d(n).double()
    model.denormalizer.set_statistics(torch.full((1,), 3.0, dtype=torch.float64),
                                      torch.full((1,), 2.0, dtype=torch.float64))
    x = torch.randn(2, *(n,) * dim, 1, generator=gen, dtype=torch.float64)
    net = model.net
    with torch.no_grad():
        h = net.input(x, grid, net)
        for layer in net.spectral[:-1]:
            h = layer(h)
        last = copy.deepcopy(net.spectral[-1])
        last.activation = torch.nn.Identity()
        h = last(h)
        assert (h < 0).any()  # an activation there would change it
        expected = model.denormalizer(net.mlp(h))
        out = model(x, grid)
    if dim == 2:
        ring = torch.ones(n, n, dtype=torch.bool)
        ring[1:-1, 1:-1] = False
        assert (out[:, ring] == 0).all()
        expected = expected.masked_fill(ring[:, :, None], 0.0)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_fno_on_the_inverse_problem_averages_its_output_as_the_target(gen):
    """FNO2d(coarse=m): the plain FNO's output, block-averaged onto m nodes per axis exactly as
    the inverse problem's target is (the numpy average of the data, in float64), differentiable,
    with the published parameter count; coarse = n is the identity ("only n_c")."""
    model = build_model("fno2d", coarse=7, width=8, modes=4, dim_feedforward=16).double()
    plain = build_model("fno2d", width=8, modes=4, dim_feedforward=16).double()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(3, 25, 25, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    out = model(x, grid_2d(25).double())
    assert out.shape == (3, 7, 7, 1)
    expected = block_average(plain(x, grid_2d(25).double())[..., 0].detach().numpy(), 7)
    np.testing.assert_allclose(out[..., 0].detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    same = build_model("fno2d", coarse=25, width=8, modes=4, dim_feedforward=16).double()
    same.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(same(x, grid_2d(25).double()),
                                   plain(x, grid_2d(25).double()), rtol=1e-14, atol=1e-14)
    assert n_params(build_model("fno2d", coarse=36)) == 2_368_001
    # refused before the network's work (the grid is not even looked at), also n = 1 < coarse
    for n in (24, 1):
        with pytest.raises(ValueError, match=f"coarse - 1 dividing n - 1, got {n}×{n}"):
            model(torch.randn(1, n, n, 1, dtype=torch.float64), None)
    # and a grid that is not square, though coarse - 1 divides each side's n - 1
    with pytest.raises(ValueError, match=r"needs a square grid of n nodes .* got 13×25"):
        model(torch.randn(1, 13, 25, 1, dtype=torch.float64), grid_2d(25).double()[:13])
    with pytest.raises(ValueError, match="coarse: expected an int >= 2, got 1"):
        build_model("fno2d", coarse=1)


def test_2d_model_input_errors():
    model = build_model("darcy", fine=29, coarse=11, d_model=12, n_head=2, num_layers=1)
    with pytest.raises(ValueError, match=r"x: expected shape \(B, 29, 29, 1\) \(fine = 29\)"):
        model(torch.randn(1, 31, 31, 1), grid_2d(31))
    with pytest.raises(ValueError, match="x: expected shape"):
        model(torch.randn(29, 29, 1), grid_2d(29))
    with pytest.raises(ValueError, match="grid: expected shape"):
        model(torch.randn(2, 29, 29, 1), grid_2d(29)[..., :1])
    with pytest.raises(TypeError, match="grid: expected a tensor"):
        model(torch.randn(2, 29, 29, 1), None)


def test_denormalisation_inside_the_model(gen):
    model = build_model("darcy", fine=29, coarse=11, d_model=12, n_head=2, num_layers=1).eval()
    x, grid = torch.randn(2, 29, 29, 1, generator=gen), grid_2d(29)
    with torch.no_grad():
        plain = model(x, grid)
        mean = torch.randn(29, 29, 1, generator=gen)
        std = torch.rand(29, 29, 1, generator=gen)
        model.denormalizer.set_statistics(mean, std)
        out = model(x, grid)
    expected = plain * (std + 1e-5) + mean
    expected[:, [0, -1]] = 0
    expected[:, :, [0, -1]] = 0
    torch.testing.assert_close(out, expected)


def test_burgers_output_scale_applies_at_every_resolution(gen):
    """Scalar statistics (what the Burgers example fits) scale the output at any grid size."""
    model = build_model("burgers", d_model=16, num_layers=1, freq_dim=8, modes=4).eval()
    xs = {n: torch.randn(2, n, 1, generator=gen) for n in (32, 128)}
    with torch.no_grad():
        plain = {n: model(x, grid_1d(n)) for n, x in xs.items()}
        model.denormalizer.set_statistics(torch.tensor(0.25), torch.tensor(0.01), eps=0.0)
        for n, x in xs.items():
            torch.testing.assert_close(model(x, grid_1d(n)), plain[n] * 0.01 + 0.25)


def test_models_are_deterministic_in_eval_and_random_in_training(gen):
    model = build_model("darcy_inverse", fine=29, coarse=11, d_model=12, n_head=2, num_layers=1)
    x, grid = torch.randn(2, 29, 29, 1, generator=gen), grid_2d(29)
    model.eval()
    with torch.no_grad():
        out = model(x, grid)
        torch.testing.assert_close(model(x, grid), out, rtol=0, atol=0)
        model.train()
        assert not torch.allclose(model(x, grid), out)


# Small versions of every model (fast on CPU) and inputs for them.
_SMALL = {
    "burgers": ({"d_model": 16, "n_head": 2, "num_layers": 2, "dim_feedforward": 24,
                 "freq_dim": 8, "modes": 4}, (32,)),
    "darcy": ({"fine": 29, "coarse": 11, "d_model": 12, "n_head": 2, "num_layers": 2,
               "attention_type": "fourier"}, (29, 29)),
    "darcy_inverse": ({"fine": 29, "coarse": 11, "d_model": 12, "n_head": 2, "num_layers": 1},
                      (29, 29)),
    "fno1d": ({"width": 8, "modes": 4}, (32,)),
    "fno2d": ({"width": 8, "modes": 4}, (16, 16)),
}


def _small(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    kwargs, spatial = _SMALL[name]
    grid = grid_1d(spatial[0]) if len(spatial) == 1 else grid_2d(spatial[0])
    return build_model(name, **kwargs), (torch.randn(2, *spatial, 1), grid)


def test_state_dict_round_trip_with_weights_only():
    for name in _SMALL:
        model, inputs = _small(name)
        model.eval()
        if hasattr(model, "denormalizer"):
            shape = model(*inputs).shape[1:]
            model.denormalizer.set_statistics(torch.randn(shape), torch.rand(shape))
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        buffer.seek(0)
        state = torch.load(buffer, weights_only=True)
        fresh = build_model(name, **_SMALL[name][0]).eval()  # other random weights...
        with torch.no_grad():
            assert not torch.allclose(fresh(*inputs), model(*inputs))
            fresh.load_state_dict(state)  # ...until the saved ones are loaded
            torch.testing.assert_close(fresh(*inputs), model(*inputs), rtol=0, atol=0)


# Inductor falls back to eager kernels for the complex products of the spectral layers.
@pytest.mark.filterwarnings("ignore:Torchinductor does not support code generation for complex")
@pytest.mark.parametrize("name", ["burgers", "darcy"])
def test_torch_compile_matches_eager(name):
    torch._dynamo.reset()
    model, inputs = _small(name)
    model.eval()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:Torchinductor does not support code generation for complex")
def test_torch_compile_with_dynamic_sizes_runs_at_two_resolutions():
    """dynamic=True traces the sizes symbolically: the grid check's message, built before the
    check, failed on them (a TypeError at the first call)."""
    torch._dynamo.reset()
    model = build_model("burgers", d_model=16, num_layers=2, dim_feedforward=16, freq_dim=8,
                        modes=4, decoder_dim_feedforward=8).eval()
    compiled = torch.compile(model, dynamic=True)
    with torch.no_grad():
        for n in (32, 48):
            u, x = torch.randn(2, n, 1), torch.linspace(0, 1, n)[:, None]
            torch.testing.assert_close(compiled(u, x), model(u, x), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_compiled_layers_take_new_resolutions_in_one_graph():
    """Under symbolic sizes the attention's coordinate check built its message first: dynamo
    took the valid shape for a failing one (fullgraph=True raised, else the layer ran eagerly)
    and formatting the sizes pinned them, a recompilation at every new resolution. The
    patched layer's default cell weight, a symbolic float, broke the graph in its value check."""
    from torch._dynamo.testing import CompileCounter

    from galerkin_ext.layers import PatchedAttention, SimpleAttention

    for attention_type in ("galerkin", "softmax"):
        torch._dynamo.reset()
        layer = SimpleAttention(8, 2, attention_type=attention_type, pos_dim=1)
        compiled = torch.compile(layer, backend="eager", dynamic=True, fullgraph=True)
        x, pos = torch.randn(2, 5, 8), torch.rand(5, 1)
        torch.testing.assert_close(compiled(x, pos), layer(x, pos))
    torch._dynamo.reset()
    compiled = torch.compile(PatchedAttention(8, 2), backend="eager", fullgraph=True)
    for s in (5, 6, 7):
        compiled(torch.randn(2, 4, s, s, 8))
    if TORCH_BEFORE_2_6:
        return  # torch 2.5's dynamo breaks the graph at an rfft of symbolic size
    torch._dynamo.reset()
    model, _ = _small("burgers")
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    for n in (32, 40, 48, 56):
        compiled(torch.randn(2, n, 1), grid_1d(n))
    assert counter.frame_count == 2  # the first size static, then one graph for every size
    torch._dynamo.reset()


def test_compiled_calls_still_check_their_float_arguments():
    """The checks of float arguments trace (no math.isfinite) instead of being skipped while
    compiling: a skip let an infinite h, a NaN scale or a negative cell volume through."""
    from galerkin_ext import ops
    from galerkin_ext.losses import relative_h1

    p, t = torch.randn(2, 5, 5, 1), torch.randn(2, 5, 5, 1)
    q = torch.randn(1, 2, 3, 4, 4)  # (B, H, O, n, D): 3 patches of 4 points
    calls = [(lambda: relative_h1(p, t, float("inf")), "h: expected a finite float"),
             (lambda: ops.kernel_attention(q[:, :, 0], q[:, :, 0], q[:, :, 0],
                                           scale=float("nan")), "scale: expected a finite"),
             (lambda: ops.patched_attention(q, q, q, -0.5), "cell_weight: expected a finite")]
    for call, match in calls:
        torch._dynamo.reset()
        with pytest.raises(ValueError, match=match):
            torch.compile(call, backend="eager")()
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:Torchinductor does not support code generation for complex")
def test_compiled_spectral_layers_give_eager_gradients():
    """Inductor gets ``torch.complex`` wrong, silently: torch 2.13 the AFNO filter's w2 gradient
    (off by up to 6 for a largest of 4.7), torch 2.5 its forward and every gradient (input
    gradients 0.0065 off); and it failed a stride assertion in the backward of SpectralConv's
    padded spectrum at dynamic sizes: both layers now avoid those paths."""
    from galerkin_ext.layers.fourier import AFNOFilter, SpectralConv

    gen = torch.Generator().manual_seed(0)
    for layer, sizes, options in ((AFNOFilter(8, 2, 0.01), (8,), {"fullgraph": True}),
                                  (SpectralConv(3, 4, 2), (4, 6), {"dynamic": True})):
        torch._dynamo.reset()
        compiled = torch.compile(layer, **options)
        for s in sizes:
            x = torch.randn(2, s, s, layer.d_model if isinstance(layer, AFNOFilter) else 3,
                            generator=gen, requires_grad=True)
            grads = []
            for module in (layer, compiled):
                out = module(x)
                weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(s))
                grads.append((out.detach(), *torch.autograd.grad((out * weight).sum(),
                                                                 [x, *layer.parameters()])))
            for eager, ours in zip(*grads, strict=True):
                torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("attention", ["galerkin", "fourier", "softmax", "linear"])
@pytest.mark.parametrize("name", ["burgers", "darcy", "darcy_inverse"])
def test_bfloat16_autocast_runs_close_to_float32(name, attention):
    """Under autocast (the Trainer's precision='bf16', here on the CPU) the float32 grids meet
    bfloat16 activations in every attention layer; the output stays near float32's."""
    torch.manual_seed(0)  # the error depends on the initialisation: not on the tests before
    kwargs, spatial = _SMALL[name]
    model = build_model(name, **{**kwargs, "attention_type": attention}).eval()
    _, inputs = _small(name)
    with torch.no_grad():
        ref = model(*inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(*inputs)
    assert low.dtype in (torch.bfloat16, torch.float32)
    assert ((low.float() - ref).norm() / ref.norm()).item() < 5e-2


def test_gradients_reach_every_parameter():
    for name in _SMALL:
        model, inputs = _small(name)
        model.train()
        model(*inputs).square().mean().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or
                   not torch.isfinite(p.grad).all()]
        assert not missing, (name, missing)


def test_layers_are_reusable_in_user_models(gen):
    """The attention works as a plain nn.Module inside someone else's network."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 8))
    attn = SimpleAttention(8, 2, "galerkin", pos_dim=0)
    x = torch.randn(4, 10, 3, generator=gen)
    assert attn(net(x)).shape == (4, 10, 8)


@pytest.mark.parametrize("name", list(_SMALL))
def test_empty_batch(name):
    """B = 0 gives an empty output of the right shape and gradients, like torch's own layers."""
    model, (x, grid) = _small(name)
    shape = model(x, grid).shape[1:]
    empty = torch.zeros(0, *x.shape[1:], requires_grad=True)
    for g in (grid, grid.expand(0, *grid.shape)):  # a shared grid, and one per sample
        out = model(empty, g)
        assert out.shape == (0, *shape)
        out.sum().backward()
        assert empty.grad.shape == empty.shape



def _threaded_calls(model: torch.nn.Module, x: torch.Tensor, grid: torch.Tensor,
                    threads: int, calls: int) -> tuple[list[list[torch.Tensor]], list]:
    """Every thread's outputs (no_grad) and gradients (forward and backward in its own copy
    of ``model``) of ``calls`` inputs, made alone, one thread after the other, and then by
    ``threads`` threads at once while another counts FLOPs of ``model``."""
    import copy
    import threading

    from galerkin_ext.complexity import forward_flops

    inputs = [torch.randn(calls, *x.shape, generator=torch.Generator().manual_seed(t))
              for t in range(threads)]
    copies = [copy.deepcopy(model) for _ in range(threads)]

    def run(t: int) -> list[torch.Tensor]:
        out = []
        for u in inputs[t]:
            with torch.no_grad():
                out.append(model(u, grid))
            u = u.clone().requires_grad_()
            copies[t].zero_grad()
            copies[t](u, grid).square().sum().backward()
            out += [u.grad, *(p.grad for p in copies[t].parameters())]
        return out

    alone = [run(t) for t in range(threads)]
    together: list = [None] * threads
    counting = threading.Event()

    def count() -> None:
        while not counting.is_set():
            forward_flops(model, x, grid)

    def work(t: int) -> None:
        together[t] = run(t)

    counter = threading.Thread(target=count)
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    counter.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    counting.set()
    counter.join()
    return alone, together


def test_models_called_from_threads_at_once_give_the_bits_of_a_call_alone():
    """An inference server's pattern: each model called from three Python threads at once, on
    their own inputs, while a fourth counts FLOPs (its FFT-only switch of the spectral
    products is per thread; shared, it would move the others' products onto the FFTs), then
    forward and backward in per-thread copies: every output and gradient is bitwise that of
    the same call made alone."""
    for name in _SMALL:
        model, (x, grid) = _small(name)
        alone, together = _threaded_calls(model.eval(), x, grid, threads=3, calls=4)
        for t, (ours, theirs) in enumerate(zip(together, alone, strict=True)):
            assert ours is not None, (name, t)  # (a thread that raised)
            differing = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                         if not torch.equal(a, b)]
            assert not differing, (name, t, differing)
