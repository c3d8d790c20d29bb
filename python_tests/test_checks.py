"""The package's shared argument checks: accepted values, and the kind and text of each error."""

from __future__ import annotations

import math

import numpy as np
import pytest

from galerkin_ext._checks import check_choice, check_float, check_int, check_probability


def test_check_int():
    assert check_int(3, "n") == 3
    assert check_int(np.int64(0), "seed", 0) == 0 and type(check_int(np.int64(2), "n")) is int
    with pytest.raises(ValueError, match=r"^n: expected an int >= 1, got 0$"):
        check_int(0, "n")
    for bad in (True, 2.0, "3", None):
        with pytest.raises(TypeError, match="n: expected an int >= 1"):
            check_int(bad, "n")


def test_check_float():
    assert check_float(2, "lr") == 2.0 and type(check_float(np.float32(0.5), "lr")) is float
    assert check_float(0, "eps", low_inclusive=True) == 0.0
    assert check_float(1.0, "pct_start", high=1.0) == 1.0
    with pytest.raises(ValueError, match=r"^lr: expected a finite float > 0, got 0$"):
        check_float(0, "lr")
    with pytest.raises(ValueError, match=r"pct_start: expected a finite float > 0 and <= 1"):
        check_float(1.5, "pct_start", high=1.0)
    for bad in (math.inf, math.nan, -1e-9):
        with pytest.raises(ValueError, match="tau: expected a finite float >= 0"):
            check_float(bad, "tau", low_inclusive=True)
    for bad in (False, "1", None):
        with pytest.raises(TypeError, match="lr: expected a finite float"):
            check_float(bad, "lr")


def test_check_probability_and_choice():
    assert check_probability(0, "p") == 0.0 and check_probability(0.5, "p") == 0.5
    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match=r"p: expected a float in \[0, 1\)"):
            check_probability(bad, "p")
    with pytest.raises(TypeError, match="p: expected a float in"):
        check_probability(True, "p")
    assert check_choice("relu", "activation", ["relu", "gelu"]) == "relu"
    with pytest.raises(ValueError, match=r"activation: expected one of \['relu'\], got 'tanh'"):
        check_choice("tanh", "activation", ["relu"])


def _core_arguments(batch_v: int = 2):
    import torch

    g = torch.Generator().manual_seed(3)
    k, q = torch.randn(2, 3, 7, 4, generator=g), torch.randn(2, 3, 5, 4, generator=g)
    v = torch.randn(batch_v, 3, 7, 2, generator=g)
    norm = (torch.ones(3, 4), torch.zeros(3, 4))
    kv = {"kv_pos": torch.rand(7, 2, generator=g), "weight": torch.rand(7, generator=g),
          "k_map": "layer_norm", "k_norm": norm, "v_map": "identity", "v_norm": None,
          "eps": 1e-5, "ones_column": False}
    return k, v, q, norm, kv


@pytest.mark.parametrize("where", ["ops", "functional"])
def test_op_core_halves_check_their_arguments(where):
    """The public kv_reduce and q_apply of both modules: a batch-1 v broadcast against k, a
    misspelt map taken as 'identity', a layer norm without its parameters skipped, a negative
    eps or weight used: each was a silent wrong answer of the formula, or a raw IndexError."""
    import importlib

    import torch

    module = importlib.import_module(f"galerkin_ext.{where}")
    k, v, q, norm, kv = _core_arguments()
    s = module.kv_reduce(k, v, **kv)  # (2, 3, 2 + 4, 2 + 2)
    apply = {"pos": torch.rand(5, 2), "q_map": "identity", "q_norm": None, "eps": 1e-5,
             "normalizers": 0}
    assert module.q_apply(q, s, **apply).shape == (2, 3, 5, 4)
    bad_kv = [
        ({"v": _core_arguments(batch_v=1)[1]}, ValueError, r"v: expected shape \(B, H, M, D_v\)"),
        ({"k": k[0]}, ValueError, r"k: expected shape \(B, H, points, D\)"),
        ({"k": k.numpy()}, TypeError, "k: expected a tensor, got ndarray"),
        ({"k": k.long()}, TypeError, "k: expected a floating-point tensor"),
        ({"k_map": "softmx"}, ValueError, "k_map: expected one of"),
        ({"k_norm": None}, ValueError, "k_norm: k_map='layer_norm' needs a"),
        ({"v_norm": norm}, ValueError, "v_norm: expected None with v_map='identity'"),
        ({"weight": -kv["weight"]}, ValueError, "weight: expected finite, non-negative"),
        ({"kv_pos": torch.rand(6, 2)}, ValueError, r"kv_pos: expected shape \(B, M, P\)"),
        ({"eps": -1.0}, ValueError, "eps: expected a finite float"),
        ({"ones_column": "yes"}, TypeError, "ones_column: expected a bool, got 'yes'"),
    ]
    for change, error, message in bad_kv:
        arguments = {"k": k, "v": v, **kv, **change}
        with pytest.raises(error, match=message):
            module.kv_reduce(arguments.pop("k"), arguments.pop("v"), **arguments)
    bad_apply = [
        ({"s": s[:1]}, ValueError, r"s: expected shape \(B, H, P \+ D, W\) = \(2, 3, 6, W\)"),
        ({"s": s.double()}, TypeError, "s: expected torch.float32"),
        ({"q_map": "soft"}, ValueError, "q_map: expected one of"),
        ({"normalizers": -1}, ValueError, "normalizers: expected an int >= 0"),
        ({"normalizers": 3}, ValueError, "normalizers: 3 blocks"),
        ({"normalizers": 4}, ValueError, "normalizers: 4 blocks"),  # one column each: no d_v
        ({"skip": True}, ValueError, "skip: needs the output width 4 to equal"),
        ({"skip": 1}, TypeError, "skip: expected a bool, got 1"),
    ]
    for change, error, message in bad_apply:
        arguments = {"s": s, **apply, **change}
        with pytest.raises(error, match=message):
            module.q_apply(q, arguments.pop("s"), **arguments)


def test_errors_name_the_argument_the_user_gave():
    """A model passes its arguments on to its sub-layers under their names there; the message
    names the model's argument (they named the sub-layer's: 'dropout:' for ffn_dropout)."""
    import torch

    from galerkin_ext.layers import EncoderLayer
    from galerkin_ext.losses import relative_h1_seminorm
    from galerkin_ext.models import build_model
    from galerkin_ext.models.gnot import GNOT

    cases = [
        (lambda: EncoderLayer(8, 2, ffn_dropout=-1), "ffn_dropout: expected a float"),
        (lambda: build_model("burgers", encoder_dropout=1.0), "encoder_dropout: expected"),
        (lambda: build_model("burgers", decoder_activation="x"), "decoder_activation: expected"),
        (lambda: build_model("darcy", fine=29, coarse=11, downsampler_dropout=1.0),
         "downsampler_dropout: expected"),
        (lambda: build_model("darcy", fine=29, coarse=11, upsampler_activation="x"),
         "upsampler_activation: expected"),
        (lambda: build_model("darcy", fine=29, coarse=11, decoder="pointwise",
                             decoder_hidden=0), "decoder_hidden: expected an int >= 1"),
        (lambda: build_model("fno1d", width=-1), "width: expected an int >= 1, got -1"),
        (lambda: build_model("fno2d", width=2.5), "width: expected an int >= 1, got 2.5"),
        (lambda: GNOT(2, 2, [3], 1, act="x"), "act: expected one of"),
        (lambda: GNOT(2, 2, [3], 1, n_hidden=8, n_head=3),
         "n_head: expected a divisor of n_hidden = 8, got 3"),
        (lambda: relative_h1_seminorm(torch.rand(2, 2, 2, 1), torch.rand(2, 2, 2, 2), 0.1),
         r"pred: expected shape \(B, n, n, 1\) with n >= 3"),
    ]
    for make, message in cases:
        with pytest.raises((TypeError, ValueError), match=f"^{message}"):
            make()


def test_small_functions_refuse_what_they_computed_wrongly():
    """Audit 15's remaining cases: a padding share of negative sizes or indices past the end,
    a step count for a negative time, a multiplier of an empty grid (a ZeroDivisionError),
    grid weights given a tensor of lengths (a type error, reported as a count)."""
    import torch

    from galerkin_ext.data.burgers import default_n_steps
    from galerkin_ext.data.gnot_datasets import padding_fraction
    from galerkin_ext.layers.patching import SpectralSmoothing
    from galerkin_ext.quadrature import grid_weights

    assert padding_fraction([3, 4], [[0, 1]]) == 0.125 and padding_fraction([], []) == 0.0
    cases = [
        (lambda: padding_fraction([-3, 4], [[0, 1]]), ValueError, "lengths: expected"),
        (lambda: padding_fraction([3, 4], [[0, 5]]), ValueError, r"batches\[0\]: expected"),
        (lambda: default_n_steps(-1.0, 0.1), ValueError, "t_end: expected a finite float > 0"),
        (lambda: default_n_steps(1.0, 0.0), ValueError, "nu: expected a finite float > 0"),
        (lambda: SpectralSmoothing(0.1, 1).multiplier(0, 4), ValueError, "s1: expected an int"),
        (lambda: grid_weights((3,), torch.tensor([2.0])), TypeError,
         "lengths: expected a sequence of 1 lengths .* got Tensor"),
        (lambda: grid_weights((3,), [1.0, 2.0]), ValueError, "lengths: expected 1 lengths"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=f"^{message}"):
            call()
