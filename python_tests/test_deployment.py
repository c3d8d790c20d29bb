"""Every registered model, small, through the deployment paths a user takes after training:
``torch.export`` (run through its module) and the deprecated but still used
``torch.jit.trace``, each against eager; and the dtypes of their inputs."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
from conftest import TORCH_BEFORE_2_6

from galerkin_ext.layers import auto_quadrature_weights
from galerkin_ext.models import available_models, build_model


def _line(n: int) -> torch.Tensor:
    return torch.linspace(0, 1, n)[:, None]


def _square(s: int) -> torch.Tensor:
    t = torch.linspace(0, 1, s)
    return torch.stack(torch.meshgrid(t, t, indexing="ij"), dim=-1)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def _rand(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(sum(shape)))


_TNO = {"d_model": 16, "n_head": 2, "num_layers": 1, "dim_feedforward": 16}
_PATCHED = {"d_model": 16, "n_head": 2, "num_layers": 1, "dim_feedforward": 16,
            "patches": (4, 4), "final_modes": 4}
_GNOT = {"n_hidden": 16, "n_head": 2, "n_layers": 1, "mlp_layers": 1}

# name -> (overrides, positional inputs); a TNO gets explicit weights (weight='auto' is
# refused under export, see test_continuum_models.test_export_needs_explicit_weights).
CASES = {
    "burgers": ({"d_model": 16, "n_head": 2, "num_layers": 1, "dim_feedforward": 16,
                 "freq_dim": 8, "modes": 4}, lambda: (_randn(2, 32, 1), _line(32))),
    "darcy": ({"fine": 29, "coarse": 11, "d_model": 12, "n_head": 2, "num_layers": 1},
              lambda: (_randn(2, 29, 29, 1), _square(29))),
    "darcy_inverse": ({"fine": 29, "coarse": 11, "d_model": 12, "n_head": 2, "num_layers": 1},
                      lambda: (_randn(2, 29, 29, 1), _square(29))),
    "fno1d": ({"width": 8, "modes": 4}, lambda: (_randn(2, 32, 1), _line(32))),
    "fno2d": ({"width": 8, "modes": 4}, lambda: (_randn(2, 16, 16, 1), _square(16))),
    "tno_l63": (_TNO, lambda: (_randn(2, 20, 1), _line(20), auto_quadrature_weights(_line(20)),
                               _randn(2, 4))),
    "tno_l63_y": (_TNO, lambda: (_randn(2, 20, 1), _line(20),
                                 auto_quadrature_weights(_line(20)))),
    "tno_cde": (_TNO, lambda: (_randn(2, 17, 1), _rand(17, 1),
                               auto_quadrature_weights(_rand(17, 1)))),
    "tno_darcy": (_TNO, lambda: (_randn(2, 64, 1), _square(8).reshape(64, 2),
                                 auto_quadrature_weights(_square(8).reshape(64, 2)))),
    "fno_ca": ({"width": 8, "n_modes": 4, "lifting": 8, "projection": 8},
               lambda: (_randn(2, 16, 16, 1), _square(16))),
    "afno": ({"grid": (16, 16), "d_model": 16, "num_layers": 1, "num_blocks": 2},
             lambda: (_randn(2, 16, 16, 1), _square(16))),
    "vitno": ({**_PATCHED, "lift_modes": 2}, lambda: (_randn(2, 16, 16, 1), _square(16))),
    "fano": ({**_PATCHED, "qkv_modes": 2}, lambda: (_randn(2, 16, 16, 1), _square(16))),
    "gt_encoder": ({"d_model": 16, "n_head": 2, "num_layers": 1, "dim_feedforward": 16},
                   lambda: (_randn(2, 64, 1), _square(8).reshape(64, 2))),
    "gnot_heat": ({**_GNOT, "n_head": 1}, lambda: (
        _rand(2, 30, 2), [_rand(2, 10, 3), _rand(2, 7, 2), _rand(2, 5, 2)], _rand(2, 12))),
    "gnot_elasticity": (_GNOT, lambda: (_rand(2, 30, 2), [_rand(2, 10, 2)])),
    "mionet_heat": ({"input_points": (10, 7, 5), "width": 16, "latent": 16, "n_layers": 2},
                    lambda: (_rand(2, 30, 2), [_rand(2, 10, 3), _rand(2, 7, 2), _rand(2, 5, 2)],
                             _rand(2, 12))),
    "mionet_elasticity": ({"input_points": (10,), "width": 16, "latent": 16, "n_layers": 2},
                          lambda: (_rand(2, 30, 2), [_rand(2, 10, 2)])),
    "gk_elasticity": ({"d_model": 16, "n_head": 2, "num_layers": 1, "dim_feedforward": 16,
                       "decoder_hidden": 16}, lambda: (_rand(2, 30, 2),)),
}


def test_every_registered_model_is_covered():
    assert set(CASES) == set(available_models())


# torch 2.5's export fails inside rfft2 of a permuted input ("illegal argument '-1]'"), and
# in rfft at symbolic sizes ("unsupported operator: aten._fft_r2c"): its bugs
_EXPORT_BROKEN = ({"darcy", "fno2d", "fno_ca", "afno", "vitno", "fano"}
                  if TORCH_BEFORE_2_6 else set())
_DYNAMIC_EXPORT_BROKEN = _EXPORT_BROKEN | ({"burgers", "fno1d"} if TORCH_BEFORE_2_6 else set())


@pytest.mark.parametrize("name", sorted(CASES))
def test_export_and_trace_match_eager(name):
    overrides, make_inputs = CASES[name]
    model = build_model(name, **overrides).eval()
    inputs = make_inputs()
    with torch.no_grad():
        expected = model(*inputs)
        if name not in _EXPORT_BROKEN:
            exported = torch.export.export(model, inputs).module()
            torch.testing.assert_close(exported(*inputs), expected, rtol=1e-5, atol=1e-6)
        with warnings.catch_warnings():  # its deprecation, and the models' shape checks
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(model, inputs, check_trace=False)
        torch.testing.assert_close(traced(*inputs), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_input_of_another_dtype_is_named(name):
    """A float64 input into float32 weights fails naming the model's input argument (its first
    layer's message named its own operands); the converted model takes it."""
    overrides, make_inputs = CASES[name]
    model = build_model(name, **overrides).eval()
    inputs = list(make_inputs())
    inputs[0] = inputs[0].double()
    argument = next(iter(inspect.signature(model.forward).parameters))
    with pytest.raises(TypeError, match=f"^{argument}: expected torch.float32 like the "
                                        "model's parameters, got torch.float64"):
        model(*inputs)
    # under autocast too, where float16 also failed in torch's messages about its operands
    accepted = re.escape(f"{argument}: expected torch.float32 like the model's parameters (or, "
                         "under autocast, torch.bfloat16), got")
    for dtype in (torch.float64, torch.float16):
        inputs[0] = inputs[0].to(dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(
                TypeError, match=f"^{accepted} {dtype}"):
            model(*inputs)
    model.double()
    with torch.no_grad():  # (the GNOT models take a list of input functions)
        out = model(*(t.double() if isinstance(t, torch.Tensor) else
                      None if t is None else [f.double() for f in t] for t in inputs))
    assert out.dtype == torch.float64 and bool(torch.isfinite(out).all())


# The models on a grid, whose coordinates are their second input (GNOT's, MIONet's and GK's
# query points are their data).
_GRID_MODELS = sorted(name for name in CASES if not name.startswith(("gnot", "mionet", "gk")))


@pytest.mark.parametrize("name", _GRID_MODELS)
def test_coordinates_in_float64_are_taken_by_every_model_on_a_grid(name):
    """One rule for every model: coordinates made in float64 (numpy's default) meet float32
    data and are cast to the data's dtype. The continuum models refused what the transformer
    and FNO models took."""
    overrides, make_inputs = CASES[name]
    model = build_model(name, **overrides).eval()
    inputs = list(make_inputs())
    with torch.no_grad():
        expected = model(*inputs)
        inputs[1] = inputs[1].double()  # (exact: the coordinates were made in float32)
        torch.testing.assert_close(model(*inputs), expected, rtol=0, atol=0)


# -- torch.export with dynamic sizes: an exported operator at other resolutions ---------------
_B = torch.export.Dim("batch", min=1, max=1024)
_N = torch.export.Dim("points", min=16, max=1 << 20)  # above the FFT models' 2 x modes
_S = torch.export.Dim("side", min=16, max=4096)
_PS = 4 * torch.export.Dim("patch_side", min=6, max=1024)  # 4 x 4 patches of >= 2 modes
_M, _M2, _M3 = (torch.export.Dim(f"input_points_{i}", min=2, max=1 << 20) for i in range(3))
_LINE = ({0: _B, 1: _N}, {0: _N})
_LINE_W = ({0: _B, 1: _N}, {0: _N}, {0: _N})

# name -> (inputs of batch b at size k, their dynamic sizes, (k exported, k run)).  The other
# models are tied to one grid: a Darcy model to its fine and coarse grids, AFNO to its grid.
# MIONet's query points are free, its input functions' points fixed (its branch nets' width).
DYNAMIC = {
    "burgers": (lambda b, k: (_randn(b, k, 1), _line(k)), _LINE, (32, 50)),
    "fno1d": (lambda b, k: (_randn(b, k, 1), _line(k)), _LINE, (32, 50)),
    "fno2d": (lambda b, k: (_randn(b, k, k, 1), _square(k)),
              ({0: _B, 1: _S, 2: _S}, {0: _S, 1: _S}), (16, 23)),
    "fno_ca": (lambda b, k: (_randn(b, k, k, 1), _square(k)),
               ({0: _B, 1: _S, 2: _S}, {0: _S, 1: _S}), (16, 23)),
    "vitno": (lambda b, k: (_randn(b, k, k, 1), _square(k)),
              ({0: _B, 1: _PS, 2: _PS}, {0: _PS, 1: _PS}), (24, 32)),
    "fano": (lambda b, k: (_randn(b, k, k, 1), _square(k)),
             ({0: _B, 1: _PS, 2: _PS}, {0: _PS, 1: _PS}), (24, 32)),
    "tno_l63": (lambda b, k: (_randn(b, k, 1), _line(k), auto_quadrature_weights(_line(k)),
                              _randn(b, 4)), (*_LINE_W, {0: _B}), (20, 33)),
    "tno_l63_y": (lambda b, k: (_randn(b, k, 1), _line(k), auto_quadrature_weights(_line(k))),
                  _LINE_W, (20, 33)),
    "tno_cde": (lambda b, k: (_randn(b, k, 1), _rand(k, 1),
                              auto_quadrature_weights(_rand(k, 1))), _LINE_W, (17, 30)),
    "tno_darcy": (lambda b, k: (_randn(b, k * k, 1), _square(k).reshape(-1, 2),
                                auto_quadrature_weights(_square(k).reshape(-1, 2))),
                  _LINE_W, (8, 11)),
    "gt_encoder": (lambda b, k: (_randn(b, k * k, 1), _square(k).reshape(-1, 2)), _LINE,
                   (8, 11)),
    "gnot_elasticity": (lambda b, k: (_rand(b, k, 2), [_rand(b, k // 3, 2)]),
                        ({0: _B, 1: _N}, [{0: _B, 1: _M}]), (30, 45)),
    "gnot_heat": (lambda b, k: (_rand(b, k, 2), [_rand(b, k // 3, 3), _rand(b, k // 4, 2),
                                                 _rand(b, k // 5, 2)], _rand(b, 12)),
                  ({0: _B, 1: _N}, [{0: _B, 1: _M}, {0: _B, 1: _M2}, {0: _B, 1: _M3}],
                   {0: _B}), (30, 45)),
    "gk_elasticity": (lambda b, k: (_rand(b, k, 2),), ({0: _B, 1: _N},), (30, 45)),
    "mionet_heat": (lambda b, k: (_rand(b, k, 2), [_rand(b, 10, 3), _rand(b, 7, 2),
                                                   _rand(b, 5, 2)], _rand(b, 12)),
                    ({0: _B, 1: _N}, [{0: _B}, {0: _B}, {0: _B}], {0: _B}), (30, 45)),
    "mionet_elasticity": (lambda b, k: (_rand(b, k, 2), [_rand(b, 10, 2)]),
                          ({0: _B, 1: _N}, [{0: _B}]), (30, 45)),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_export_with_dynamic_sizes_runs_at_other_resolutions(name):
    """A neural operator exported once runs at any batch and resolution in its declared range
    (the README's recipe).  Before: a symbolic min() in the spectral layers and F.one_hot in the
    TNO's initial token fixed the size, and a cell volume derived from the sizes was refused."""
    if name in _DYNAMIC_EXPORT_BROKEN:
        pytest.skip("torch < 2.6 cannot export the FFT models at dynamic sizes")
    make_inputs, dynamic_shapes, (k_export, k_other) = DYNAMIC[name]
    model = build_model(name, **CASES[name][0]).eval()
    exported = torch.export.export(model, make_inputs(2, k_export),
                                   dynamic_shapes=dynamic_shapes).module()
    with torch.no_grad():
        for inputs in (make_inputs(3, k_other), make_inputs(1, k_export)):
            torch.testing.assert_close(exported(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)


def test_the_readme_export_recipe_runs_as_written():
    """The README's dynamic-size export of the Burgers model (its default size), with the range
    the README gives: a minimum of 16 was below the 2 x 16 Fourier modes, which export refused."""
    if "burgers" in _DYNAMIC_EXPORT_BROKEN:
        pytest.skip("torch < 2.6 cannot export the FFT models at dynamic sizes")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    low = int(re.search(r'Dim\("n", min=(\d+), max=2\*\*20\)', readme).group(1))
    model = build_model("burgers").eval()
    n = torch.export.Dim("n", min=low, max=2**20)
    exported = torch.export.export(
        model, (_randn(2, 64, 1), _line(64)),
        dynamic_shapes=({0: torch.export.Dim("batch"), 1: n}, {0: n})).module()
    with torch.no_grad():
        for u, x in ((_randn(3, 100, 1), _line(100)), (_randn(1, low, 1), _line(low))):
            torch.testing.assert_close(exported(u, x), model(u, x), rtol=1e-5, atol=1e-6)


def test_the_readme_patched_export_range_keeps_every_mode():
    """The README's range for the quick ViT NO (6 lift modes, 16 final ones): from its minimum
    patch side every patch holds all of its modes, so the program runs at every size of the
    range (with min=12 or 13 it failed on its own guards at k = 12 and 13)."""
    if "vitno" in _DYNAMIC_EXPORT_BROKEN:
        pytest.skip("torch < 2.6 cannot export the FFT models at dynamic sizes")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    low = int(re.search(r'4 \* torch\.export\.Dim\("k",\s+min=(\d+)\)', readme).group(1))
    torch.manual_seed(0)
    model = build_model("vitno", d_model=8, n_head=2, num_layers=1, dim_feedforward=8,
                        patches=4, lift_modes=6, final_modes=16).eval()
    side = 4 * torch.export.Dim("k", min=low)
    exported = torch.export.export(model, (_randn(1, 4 * low + 8, 4 * low + 8, 1),
                                           _square(4 * low + 8)),
                                   dynamic_shapes=({1: side, 2: side}, {0: side, 1: side}))
    with torch.no_grad():
        for k in (low, low + 1):
            u, x = _randn(1, 4 * k, 4 * k, 1), _square(4 * k)
            torch.testing.assert_close(exported.module()(u, x), model(u, x), rtol=1e-5,
                                       atol=1e-6)


def test_the_tno_query_head_exports_and_compiles_with_free_point_counts():
    """The query head's model exported once runs at any batch, number of input points and of
    query points in the declared ranges, and compiles to one graph, with eager's values."""
    from galerkin_ext.models import TNO

    model = TNO(1, 1, 2, query_head=True, **_TNO).eval()

    def call(b, n, n_q):
        return ((_randn(b, n, 1), _rand(n, 2), torch.full((n,), 1.0 / n)),
                {"query": _rand(n_q, 2)})

    queries = torch.export.Dim("query_points", min=2, max=1 << 20)
    dynamic = {"u": {0: _B, 1: _N}, "x": {0: _N}, "weight": {0: _N}, "query": {0: queries}}
    args, kwargs = call(2, 20, 7)
    exported = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic).module()
    # (one graph for dynamo; inductor's code for the op is test_models.py's)
    compiled = torch.compile(model, backend="eager", dynamic=True, fullgraph=True)
    with torch.no_grad():
        for args, kwargs in (call(3, 33, 5), call(1, 20, 40)):
            expected = model(*args, **kwargs)
            assert expected.shape == (args[0].shape[0], kwargs["query"].shape[0], 1)
            torch.testing.assert_close(exported(*args, **kwargs), expected, rtol=1e-5,
                                       atol=1e-6)
            torch.testing.assert_close(compiled(*args, **kwargs), expected, rtol=1e-5,
                                       atol=1e-6)
