"""The smaller modules' argument checks and rarely taken branches (continuum models, the
reference forward, the Burgers, Kolmogorov, ODE and .mat data, the layers' reprs and checks,
quadrature, the command lines): each check reached through the public API, each branch with
its result checked."""

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

from galerkin_ext import functional, ops, reference
from galerkin_ext._cli import (
    data_seed,
    grid_nodes,
    nonnegative_float,
    nonnegative_int,
    periodic_points,
    positive_float,
    positive_int,
    writable_file,
)
from galerkin_ext._scaling import fewest_steps
from galerkin_ext.data import ode
from galerkin_ext.data.__main__ import main
from galerkin_ext.data.burgers import default_n_steps, solve_burgers
from galerkin_ext.data.generate import kolmogorov_time_step
from galerkin_ext.data.kolmogorov import resample_periodic, velocity_from_vorticity
from galerkin_ext.data.mat import read_darcy_mat
from galerkin_ext.layers import (
    AFNOFilter,
    CodomainAttention,
    Denormalizer,
    EncoderLayer,
    HeteroNormalizedAttention,
    MixtureFFN,
    PatchedAttention,
    PointwiseRegressor,
    SimpleAttention,
    SpectralConv,
    SpectralConv2d,
    SpectralSmoothing,
    auto_quadrature_weights,
    even_extension,
)
from galerkin_ext.quadrature import mesh_weights

F64 = torch.float64


def test_tno_token0_without_weights_replaces_the_earliest_time(gen):
    from test_continuum_models import small_tno
    model = small_tno(gen, token0_dim=4)
    x = torch.tensor([[0.5], [0.0], [1.0], [0.25]], dtype=F64)
    u = torch.randn(2, 4, 1, generator=gen, dtype=F64)
    token0 = torch.randn(2, 4, generator=gen, dtype=F64)
    out = model(u, x, None, token0)
    u2 = u.clone()
    u2[:, 1] += 1.0  # the earliest time (x = 0) is index 1: its u is replaced by token0
    torch.testing.assert_close(model(u2, x, None, token0), out, rtol=0, atol=1e-13)
    u3 = u.clone()
    u3[:, 0] += 1.0
    assert (model(u3, x, None, token0) - out).abs().max() > 1e-6


def test_gnot_reference_forward_without_theta():
    from galerkin_ext.models import GNOT
    from galerkin_ext.reference import gnot_forward
    torch.manual_seed(0)
    model = GNOT(2, 2, [3], 1, n_hidden=8, n_layers=1, n_head=2, n_experts=2).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2, 5, 2, generator=gen, dtype=F64)
    inputs = [torch.randn(2, 4, 3, generator=gen, dtype=F64)]
    torch.testing.assert_close(model(x, inputs), gnot_forward(model, x, inputs),
                               rtol=1e-12, atol=1e-12)


def test_burgers_empty_batch_is_refused():
    with pytest.raises(ValueError, match=r"u0 must not be empty, got shape \(0, 8\)"):
        solve_burgers(torch.zeros(0, 8), nu=0.1, t_end=0.1)


def test_velocity_on_an_odd_grid():
    s = 5
    t = 2 * math.pi * torch.arange(s, dtype=F64) / s
    omega = torch.sin(t)[:, None].expand(s, s)[None]  # sin of the first axis' coordinate
    uv = velocity_from_vorticity(omega)
    # -Lap psi = sin(x) -> psi = sin(x); (u, v) = (d_y psi, -d_x psi) = (0, -cos(x))
    torch.testing.assert_close(uv[0, 0], torch.zeros(s, s, dtype=F64), rtol=0, atol=1e-13)
    torch.testing.assert_close(uv[0, 1], -torch.cos(t)[:, None].expand(s, s), rtol=0,
                               atol=1e-13)


def test_resample_non_square_keeps_the_axis_of_the_right_size():
    t4 = 2 * math.pi * torch.arange(4, dtype=F64) / 4
    t6 = 2 * math.pi * torch.arange(6, dtype=F64) / 6
    field = torch.cos(t4)[:, None] + torch.sin(t6)[None, :]
    out = resample_periodic(field, 4)
    torch.testing.assert_close(out, torch.cos(t4)[:, None] + torch.sin(t4)[None, :],
                               rtol=0, atol=1e-13)


def test_resample_to_one_point_is_the_mean(gen):
    field = torch.randn(2, 6, 6, generator=gen, dtype=F64)
    out = resample_periodic(field, 1)
    torch.testing.assert_close(out, field.mean(dim=(-2, -1), keepdim=True), rtol=0, atol=1e-13)


def test_darcy_mat_of_unequal_shapes_is_refused(tmp_path):
    path = tmp_path / "d.mat"
    scipy.io.savemat(path, {"coeff": np.ones((2, 4, 4)), "sol": np.ones((2, 4, 5))})
    with pytest.raises(ValueError, match=r"expected coeff and sol of equal shape \(B, K, K\)"):
        read_darcy_mat(path)


def test_hetero_inputs_of_different_value_widths_are_refused():
    q = torch.randn(1, 2, 3, 4)
    ks = [torch.randn(1, 2, 5, 4), torch.randn(1, 2, 6, 4)]
    vs = [torch.randn(1, 2, 5, 4), torch.randn(1, 2, 6, 3)]
    with pytest.raises(ValueError, match=r"expected D_v = 4 like the first input .*got 3"):
        functional.hetero_normalized_attention(q, ks, vs)


def test_codomain_attention_repr():
    assert "token_dim=4, n_head=2, scale=0.5" in repr(CodomainAttention(4, 2, 3, scale=0.5))


def test_regressor_with_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match=r"^x: expected shape \(B, n, 3\), got \(1, 4, 2\)"):
        PointwiseRegressor(3, 4, 2, spatial_dim=1)(torch.zeros(1, 4, 2))


def test_spectral_conv2d_with_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match=r"in_channels = 3, got \(1, 8, 8, 2\)"):
        SpectralConv2d(3, 3, 2)(torch.zeros(1, 8, 8, 2))


def test_data_submodule_and_unknown_name_in_a_fresh_process(tmp_path):
    code = ("import galerkin_ext.data as d, sys; assert 'galerkin_ext.data.mat' not in sys.modules;"
            "m = d.mat; assert m.__name__ == 'galerkin_ext.data.mat'\n"
            "try:\n d.nope\nexcept AttributeError as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout  # the installed package
    assert "has no attribute 'nope'" in out


def test_hetero_attention_n_head_not_a_divisor():
    with pytest.raises(ValueError, match="^n_head: expected a divisor of d_model = 6, got 4"):
        HeteroNormalizedAttention(6, 4, 1)


def test_mixture_of_one_expert_is_that_expert():
    ffn = MixtureFFN(3, 5, 1)
    x = torch.randn(2, 4, 3)
    torch.testing.assert_close(ffn(x, None), ffn.experts[0](x))


def test_time_grid_with_too_many_digits():
    with pytest.raises(ValueError, match="has too many digits to give exact times"):
        ode.time_grid(dt=0.1000000000000001, t_end=0.3)


def test_rk4_takes_a_list_of_int_times():
    out = ode.rk4(lambda t, y: -y, np.array([1.0]), [0, 1, 2], max_step=0.01)
    np.testing.assert_allclose(out[:, 0], np.exp(-np.arange(3.0)), rtol=1e-9)


def test_lorenz_initial_of_rank_3_is_refused():
    with pytest.raises(ValueError, match=r"^initial: expected shape \(B, 3\) or \(3,\)"):
        ode.solve_lorenz63(np.ones((1, 2, 3)), [0.0, 0.1])


def test_mesh_weights_non_finite_points():
    with pytest.raises(ValueError, match="^points: expected finite coordinates"):
        mesh_weights(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, float("nan")]]))


def test_mesh_weights_all_points_at_the_origin():
    with pytest.raises(ValueError, match="no Delaunay triangulation of these 3 points"):
        mesh_weights(torch.zeros(3, 2))


def test_cuda_built_and_meta_tensors():
    assert ops.cuda_built() in (True, False)
    q = torch.randn(1, 2, 3, 4, device="meta")
    out = ops.galerkin_attention(q, q, q)
    assert out.device.type == "meta" and out.shape == (1, 2, 3, 4)


def test_cli_number_not_a_number():
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive integer, got 'abc'"):
        positive_int("abc")


def test_writable_file(tmp_path):
    assert writable_file(str(tmp_path / "a" / "b" / "c.json")) == tmp_path / "a" / "b" / "c.json"
    (tmp_path / "f").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="cannot write in"):
        writable_file(str(tmp_path / "f" / "c.json"))
    # the permission bits let root write in /proc, which makes no file: the benchmarks found it
    # after all their measurements, as a traceback
    if Path("/proc/self").is_dir():
        with pytest.raises(argparse.ArgumentTypeError, match=r"cannot write in '/proc' \("):
            writable_file("/proc/x.json")


@pytest.mark.parametrize("argv, message", [
    (["generate", "kolmogorov", "--nu", "abc"], "argument --nu: expected a number >= 0, got 'abc'"),
    (["generate", "elasticity", "--targets", "u,,v"], "expected comma-separated names"),
    (["generate", "heat", "--preset", "zero-shot"],
     "--preset zero-shot applies to kolmogorov only"),
])
def test_data_cli_refusals(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main([*argv[:2], "--out", str(tmp_path / "x.h5"), *argv[2:]])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_auto_weights_of_no_points():
    with pytest.raises(ValueError, match=r"^coords: expected N >= 1 points"):
        auto_quadrature_weights(torch.zeros(0, 2))


def test_even_extension_refusals():
    with pytest.raises(TypeError, match="^x: expected a tensor of shape"):
        even_extension("a")
    with pytest.raises(ValueError, match=r"^x: expected shape \(\.\.\., p1, p2, C\), got \(2, 2\)"):
        even_extension(torch.zeros(2, 2))


def test_reprs():
    assert "eps=0.5, alpha=2" in repr(SpectralSmoothing(0.5, 2.0))
    assert "d_model=4, n_head=2, qkv_modes=None" in repr(PatchedAttention(4, 2))
    assert "in_channels=2, out_channels=3, modes=4, last_modes=4" in repr(SpectralConv(2, 3, 4))
    assert "d_model=8, num_blocks=2" in repr(AFNOFilter(8, 2))
    assert "attention_type='galerkin', pos_dim=1" in repr(SimpleAttention(4, 2, pos_dim=1))


def test_afno_filter_width_and_empty_batch():
    f = AFNOFilter(8, 2)
    with pytest.raises(ValueError, match="with d_model = 8, got"):
        f(torch.zeros(1, 4, 4, 6))
    x = torch.zeros(0, 4, 4, 8)
    assert f(x).shape == (0, 4, 4, 8)


def test_simple_attention_pos_not_a_tensor():
    with pytest.raises(TypeError, match="^pos: expected a tensor of shape"):
        SimpleAttention(4, 2, pos_dim=1)(torch.zeros(1, 3, 4), pos="a")


def test_mixture_probs_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"^probs: expected shape \(2, 4, 2\), got \(2, 4, 3\)"):
        MixtureFFN(3, 5, 2)(torch.randn(2, 4, 3), torch.rand(2, 4, 3))


@pytest.mark.parametrize("option", [{"self_skip": False}, {"reduce": "mean"},
                                    {"ffn_norm": "pre"}, {"theta_mode": "branch"},
                                    {"act": "relu"}, {"n_experts": 2, "gate": "given"}])
def test_gnot_reference_forward_refuses_other_configurations(option):
    """The oracle fixes the reference code's configuration instead of reading the model's
    layers (it took the cross-attention's skip from the model, so a model without it passed)."""
    from galerkin_ext.models import GNOT
    from galerkin_ext.reference import gnot_forward

    model = GNOT(2, 2, [3], 1, theta_dim=2, n_hidden=8, n_layers=1, n_head=2, **option)
    with pytest.raises(ValueError, match="^model: the reference forward is the reference "
                                         "code's configuration"):
        gnot_forward(model, torch.rand(1, 5, 2), [torch.randn(1, 4, 3)], torch.randn(1, 2))
    model = GNOT(2, 2, [3], 1, theta_dim=2, n_hidden=8, n_layers=1, n_head=2)
    model.blocks[0].cross.skip = False
    with pytest.raises(ValueError, match="^model: the reference forward"):
        gnot_forward(model, torch.rand(1, 5, 2), [torch.randn(1, 4, 3)], torch.randn(1, 2))
    # one expert has no gate, of either kind: the same model
    model = GNOT(2, 2, [3], 1, theta_dim=2, n_hidden=8, n_layers=1, n_head=2, gate="given")
    x, inputs, theta = torch.rand(1, 5, 2), [torch.randn(1, 4, 3)], torch.randn(1, 2)
    torch.testing.assert_close(gnot_forward(model, x, inputs, theta), model(x, inputs, theta))


def test_forward_ad_through_the_op_runs_the_formula():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, 4, generator=gen, dtype=torch.float64)
    k, v = torch.randn_like(q), torch.randn_like(q)
    t = torch.randn_like(q)
    _, jvp = torch.func.jvp(lambda a: ops.galerkin_attention(a, k, v), (q,), (t,))
    # linear in q: the directional derivative is the op applied to the tangent
    torch.testing.assert_close(jvp, ops.galerkin_attention(t, k, v), rtol=1e-10, atol=1e-10)


def test_decoders_without_spatial_fc_check_the_inputs_dtype_and_device():
    """Without spatial_fc the decoders' input step has no parameters of its own: the check
    compared x with none, and torch's matmul said 'mat1 and mat2 must have the same dtype'."""
    model = PointwiseRegressor(3, 4, 2, spatial_dim=1)
    with pytest.raises(TypeError, match=r"^x: expected torch.float32 like the model's "
                                        r"parameters, got torch.float64"):
        model(torch.zeros(1, 4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^x: expected a tensor on cpu like the model's "
                                         r"parameters, got one on meta"):
        model(torch.zeros(1, 4, 3, device="meta"))


def test_softmax_attention_matrix_with_weights_matches_the_op():
    """return_attention computes softmax(QKᵀ/√d + log w) itself: its output equals the op's,
    each row sums to 1, a zero-weight key gets no attention, and a sample with no keys is an
    error as in continuum_attention."""
    from galerkin_ext.layers import SimpleAttention

    layer = SimpleAttention(8, 2, attention_type="softmax", pos_dim=1).double().eval()
    x, pos = torch.randn(2, 6, 8, dtype=torch.float64), torch.rand(6, 1, dtype=torch.float64)
    weight = torch.rand(2, 6, dtype=torch.float64) + 0.1
    weight[1, 4] = 0.0
    out, attn = layer(x, pos, weight, return_attention=True)
    torch.testing.assert_close(out, layer(x, pos, weight), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 2, 6, dtype=torch.float64))
    assert torch.all(attn[1, :, :, 4] == 0) and torch.all(attn[0, :, :, 4] > 0)
    with pytest.raises(ValueError, match="weight"):
        layer(x, pos, torch.zeros(2, 6, dtype=torch.float64), return_attention=True)


def test_auto_weights_of_a_batch_on_different_grids_and_of_degenerate_axes():
    """Per sample where the point sets differ; an axis of one value carries no width, and an
    axis of two values counts as equispaced."""
    uniform = torch.stack(torch.meshgrid(torch.linspace(0, 1, 3), torch.linspace(0, 1, 4),
                                         indexing="ij"), dim=-1).reshape(-1, 2).double()
    graded = uniform.clone()
    graded[:, 1] = graded[:, 1] ** 2  # 0, 1/9, 4/9, 1: cells of unequal width
    both = auto_quadrature_weights(torch.stack([uniform, graded]))
    torch.testing.assert_close(both[0], auto_quadrature_weights(uniform))
    torch.testing.assert_close(both[1], auto_quadrature_weights(graded))
    assert not torch.allclose(both[0], both[1])
    # a single column x = 0.5 of the graded axis: the weights are its cells' widths (the
    # trapezoid weights with whole gaps at the ends)
    line = torch.stack([torch.full((4,), 0.5, dtype=torch.float64), graded[:4, 1]], dim=-1)
    widths = torch.tensor([1 / 9, 2 / 9, 4 / 9, 5 / 9], dtype=torch.float64)
    torch.testing.assert_close(auto_quadrature_weights(line), widths)
    # two values per axis: a uniform 2 × 2 grid, whatever the gaps
    corners = torch.tensor([[0.0, 0.0], [0.0, 5.0], [1.0, 0.0], [1.0, 5.0]])
    torch.testing.assert_close(auto_quadrature_weights(corners), torch.ones(4))


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
def test_spectral_weights_convert_to_a_complex_dtype_and_into_new_parameters():
    """An explicit complex target dtype converts the complex weights directly; with torch's
    overwrite-on-conversion switch they become new Parameters (gradients carried)."""
    layer = SpectralConv(2, 3, 4)
    before = layer.weight_pos.detach().clone()
    layer.to(torch.complex128)
    assert layer.weight_pos.dtype == torch.complex128
    torch.testing.assert_close(layer.weight_pos.detach(), before.to(torch.complex128))
    layer = SpectralConv(2, 3, 4)
    old = layer.weight_pos
    old.grad = torch.ones_like(old)
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        layer.double()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert layer.weight_pos is not old and layer.weight_pos.dtype == torch.complex128
    torch.testing.assert_close(layer.weight_pos.detach(), old.detach().to(torch.complex128))
    assert layer.weight_pos.grad.dtype == torch.complex128


def test_kolmogorov_generation_takes_a_torch_dtype_and_warns_past_cfl_one(tmp_path):
    """solve_dtype as a torch dtype is its name (the same file as the string gives); a step
    that breaks SPEC-continuum's CFL <= 1 is generated with a warning naming the number."""
    from galerkin_ext.data import inspect_h5, read_h5
    from galerkin_ext.data.generate import generate_kolmogorov

    small = dict(n_samples=2, resolution=16, time=0.5, dt_out=0.25, chunk_size=2,
                 progress=False)
    by_dtype = generate_kolmogorov(tmp_path / "a.h5", solve_dtype=torch.float64,
                                   max_step=0.25, **small)
    by_name = generate_kolmogorov(tmp_path / "b.h5", solve_dtype="float64", max_step=0.25,
                                  **small)
    assert inspect_h5(by_dtype)["parameters"]["solve_dtype"] == "float64"
    for key in ("input", "output"):
        np.testing.assert_array_equal(read_h5(by_dtype)[key], read_h5(by_name)[key])
    with pytest.warns(RuntimeWarning, match=r"kolmogorov: CFL number \d\.\d+ > 1 at max_step = 1"):
        coarse = generate_kolmogorov(tmp_path / "c.h5", solve_dtype="float64", max_step=1.0,
                                     **(small | {"time": 1.0, "dt_out": 1.0}))
    assert inspect_h5(coarse)["statistics"]["cfl"]["mean"] > 1


def test_generators_refuse_a_wrong_executor_and_a_str_of_targets(tmp_path):
    from galerkin_ext.data.generate import generate_darcy, generate_elasticity

    with pytest.raises(TypeError, match="executor must be a concurrent.futures.Executor"):
        generate_darcy(tmp_path / "d.h5", 2, 8, executor="pool", progress=False)
    with pytest.raises(TypeError, match=r"targets: expected a sequence of names such as"):
        generate_elasticity(tmp_path / "e.h5", n_samples=2, targets="vm", progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("parse, valid, refused", [
    (positive_int, {"1": 1}, ["0", "-1", "1.5", "inf", "abc"]),
    (nonnegative_int, {"0": 0}, ["-1", "0.5", "nan", "abc"]),
    (grid_nodes, {"3": 3}, ["2", "3.0", "inf", "abc"]),
    (periodic_points, {"4": 4}, ["3", "4.0", "inf", "abc"]),
    (data_seed, {"0": 0, str(2**64 - 1): 2**64 - 1}, ["-1", str(2**64), "1e3", "abc"]),
    (nonnegative_float, {"0": 0.0, "1e-300": 1e-300},
     ["-1e-300", "inf", "-inf", "nan", "abc"]),
    # (not 5e-324: a process that has run inductor under torch 2.5 flushes subnormals to 0)
    (positive_float, {"1e-300": 1e-300}, ["0", "-0.0", "-1", "inf", "nan", "abc"]),
])
def test_cli_types_take_their_bound_and_refuse_past_it(parse, valid, refused):
    """Each bounded argparse type takes its smallest valid value (data_seed also its largest,
    2**64 - 1) and refuses the value just past the bound, non-finite values and other text."""
    for text, value in valid.items():
        assert parse(text) == value and type(parse(text)) is type(value)
    for text in refused:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_fewest_steps_counts_up_to_a_relative_rounding():
    """Whole steps of at most max_step covering length, at least 1: a quotient's rounding
    error (relative to the quotient, so larger than 1e-9 for a large one) adds no step, a
    true remainder adds one."""
    assert 10000.001100000001 / 1e-4 > 100000011  # rounding: 100000011.00000001
    assert fewest_steps(10000.001100000001, 1e-4) == 100000011
    assert 0.07 / 0.01 > 7 and 16.1 / 1e-3 > 16100  # the docstring's examples
    assert fewest_steps(0.07, 0.01) == 7 and fewest_steps(16.1, 1e-3) == 16100
    assert fewest_steps(1.0000001, 1e-3) == 1001 and fewest_steps(1.0, 1e-3) == 1000
    # a length far below one step still takes one
    assert fewest_steps(1e-13, 1.0) == 1 and fewest_steps(0.5, 1.0) == 1
    assert default_n_steps(1e-13, 0.1) == 1
    # dt_out below the bound 2.5e-3 * 416 / 32 = 0.0325 is one step of dt_out
    assert kolmogorov_time_step(32, 1e-12) == 1e-12


def test_denormalizer_loads_statistics_of_another_dtype_and_shape_in_its_own_dtype():
    """A float32 Denormalizer loading float64 statistics of shape (3,) takes that shape, keeps
    float32 buffers and gives float32 outputs x * scale + shift."""
    shift = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    scale = torch.tensor([2.0, 0.25, 3.0], dtype=F64)
    layer = Denormalizer()
    layer.load_state_dict({"shift": shift, "scale": scale})
    for name, stored in (("shift", shift), ("scale", scale)):
        buffer = getattr(layer, name)
        assert buffer.dtype == torch.float32 and buffer.shape == (3,)
        torch.testing.assert_close(buffer, stored.float(), rtol=0, atol=0)
    x = torch.tensor([[1.0, 4.0, -1.0], [0.0, 1.0, 2.0]])
    out = layer(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[3.0, -1.0, -2.5], [1.0, -1.75, 6.5]]),
                               rtol=0, atol=0)


def test_encoder_layer_norms_use_its_eps():
    """With norm='layer' both residual layer norms are (z - mean) / sqrt(var + eps) at the
    layer's eps (0.5 here, which moves the result far past rounding)."""
    torch.manual_seed(0)
    eps = 0.5
    layer = EncoderLayer(4, 2, norm="layer", eps=eps).double()
    x = torch.randn(2, 5, 4, dtype=F64)

    def written_out_layer_norm(z):
        mean = z.sum(-1, keepdim=True) / z.shape[-1]
        var = ((z - mean) ** 2).sum(-1, keepdim=True) / z.shape[-1]
        return (z - mean) / torch.sqrt(var + eps)  # LayerNorm's initial weight 1, bias 0

    with torch.no_grad():
        h = written_out_layer_norm(x + layer.attn(x))
        want = written_out_layer_norm(h + layer.ffn(h))
        torch.testing.assert_close(layer(x), want, rtol=1e-12, atol=1e-12)
    assert [m.eps for m in layer.modules() if isinstance(m, torch.nn.LayerNorm)] == [eps, eps]


def test_log_weight_bias_is_the_log_of_the_ratio_to_the_largest_weight():
    """continuum_attention's key bias is log(w_j / max_j w), not log(w_j): constant weights give
    an exact 0 (plain softmax attention, bit for bit), a zero weight -inf, and a sample without
    keys 0 with has_keys false."""
    weight = torch.tensor([[0.3] * 4, [0.5, 0.0, 2.0, 1e-3], [0.0] * 4], dtype=F64)
    bias, has_keys = functional.log_weight_bias(weight, 3, 4)
    expected = torch.tensor([[0.0] * 4,
                             [math.log(0.25), -math.inf, 0.0, math.log(5e-4)],
                             [0.0] * 4], dtype=F64)
    torch.testing.assert_close(bias, expected, rtol=1e-15, atol=0)
    assert torch.equal(bias[0], torch.zeros(4, dtype=F64))
    assert has_keys.flatten().tolist() == [True, True, False]


def test_fourier_attention_with_torch_masks_drops_the_n_by_n_matrix():
    """With torch's masks (draw_torch_masks) the Fourier type still drops entries of its N × N
    matrix in training, as the original code's F.dropout(attn), not of the factored d × d
    product: the output against reference.fourier_attention, ((Q Kᵀ / sqrt(D) / N) ∘ mask) V,
    with torch's mask from the same seed."""
    from galerkin_ext.layers import draw_torch_masks

    layer = SimpleAttention(8, 2, "fourier", norm=None, attn_dropout=0.5).double().train()
    draw_torch_masks(layer)
    x = torch.randn(2, 7, 8, dtype=F64)
    torch.manual_seed(5)
    got = layer(x)
    q, k, v = (lin(x).view(2, 7, 2, 4).transpose(1, 2).detach()
               for lin in (layer.query, layer.key, layer.value))
    torch.manual_seed(5)
    mask = torch.nn.functional.dropout(torch.ones(2, 2, 7, 7, dtype=F64), 0.5)
    heads = reference.fourier_attention(q, k, v, dropout_mask=mask)
    torch.testing.assert_close(got.detach(), heads.transpose(1, 2).reshape(2, 7, 8), rtol=1e-12,
                               atol=1e-12)


def test_encoder_layer_drops_both_residual_branches_in_training():
    """EncoderLayer's ``dropout`` acts on the attention branch and on the feed-forward branch
    (dropout1, dropout2), with ops.dropout's masks in that order; the sublayers themselves
    drop nothing here (attn_dropout = ffn_dropout = 0)."""
    layer = EncoderLayer(8, 2, norm=None, dropout=0.5, attn_dropout=0.0,
                         ffn_dropout=0.0).double().train()
    x = torch.randn(2, 6, 8, dtype=F64)
    torch.manual_seed(9)
    got = layer(x)
    torch.manual_seed(9)
    first, second = (ops.dropout(torch.ones(2, 6, 8, dtype=F64), 0.5) for _ in range(2))
    with torch.no_grad():
        mid = x + first * layer.attn(x)
        expected = mid + second * layer.ffn(mid)
    torch.testing.assert_close(got.detach(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", [functional, ops])
def test_normalized_attention_weights_near_float32_max_are_equal_weights(impl):
    """Only the weights' ratios matter: float32 weights of 3e38 on 16 keys (each product
    w_j k̃_j v_j summed over the keys overflows unless the weights are scaled first) give the
    uniform result, reference.normalized_attention's in float64."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 5, 4, generator=gen)
    k, v = torch.randn(1, 2, 16, 4, generator=gen), 4 + torch.rand(1, 2, 16, 4, generator=gen)
    got = impl.normalized_attention(q, k, v, weight=torch.full((16,), 3e38))
    expected = reference.normalized_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
