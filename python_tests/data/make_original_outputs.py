"""Write ``original_outputs.pt``: small models of the original implementation
(``galerkin-transformer`` 0.2.1) with their inputs and outputs, the recorded oracle of
``test_models_reference.py`` where the original is not installed (CI).

    pip install --no-deps --target /tmp/original galerkin_transformer-0.2.1-py3-none-any.whl
    PYTHONPATH=/tmp/original python python_tests/data/make_original_outputs.py

Each case is one of the paper's three models, its sizes shrunk (and unlike the paper's, so that
:func:`galerkin_ext.models.from_original` must read them from the weights), built by the
original's own classes with its own initialisation, its weights, inputs and target statistics
rounded to bfloat16 (stored so, and exact in float64). The grids are uniform on [0, 1]
(``torch.linspace``, ``data.datasets.uniform_grid_2d``; not stored). Outputs are in float64:
``eval`` with the original's always-on attention dropout switched off; ``train`` in training mode
with every dropout active (the always-on one included), torch's generator seeded with ``seed``
just before the call.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from galerkin_ext.data.datasets import uniform_grid_2d
from galerkin_ext.layers import cinn_sizes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import original  # noqa: E402  (benchmarks/original.py: the one loader of the original)

OUT = Path(__file__).with_name("original_outputs.pt")
SMALL = dict(n_hidden=8, n_head=2, num_encoder_layers=2, dim_feedforward=12)

# name, attention, the original's settings over the paper's, and ours for from_original beyond
# the attention type: the same dropouts (they only act in training; norm='layer' is read from the
# weights). A decoder dropout only where the decoder has one spectral layer: the original hands
# the later ones its input channel-major in memory, ours keeps it contiguous, and dropout draws
# its mask in memory order (the same distribution, other entries).
CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("burgers", "galerkin", dict(freq_dim=6, fourier_modes=5, encoder_dropout=0.1,
                                 ffn_dropout=0.2, dropout=0.15),
     dict(encoder_dropout=0.1, ffn_dropout=0.2, dropout=0.15)),
    ("burgers", "fourier", dict(freq_dim=6, fourier_modes=4, layer_norm=True, attn_norm=False,
                                encoder_dropout=0.1), dict(encoder_dropout=0.1, ffn_dropout=0.0)),
    ("burgers", "softmax", dict(freq_dim=4, fourier_modes=3, num_regressor_layers=1,
                                decoder_dropout=0.05),  # its encoder's dropout is always 0.1
     dict(encoder_dropout=0.1, ffn_dropout=0.0, decoder_dropout=0.05)),
    ("burgers", "linear", dict(freq_dim=4, fourier_modes=3, encoder_dropout=0.1),
     dict(encoder_dropout=0.1, ffn_dropout=0.0)),
    ("darcy", "galerkin", dict(freq_dim=6, fourier_modes=3), {}),
    ("darcy", "fourier", dict(freq_dim=4, fourier_modes=4, num_regressor_layers=1), {}),
    ("darcy_inverse", "galerkin", {}, {}),
]
FINE, COARSE = 29, 15  # a pair the original's scripts can run (its CiNN reaches 15)
POINTS = 40  # of the 1-D grid


def bfloat16_exact(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bfloat16 values (stored as bfloat16, exact in float64)."""
    return t.to(torch.bfloat16).to(t.dtype)


def build(name: str, attention: str, settings: dict[str, Any], case: dict[str, Any]
          ) -> torch.nn.Module:
    if name == "burgers":
        return original.burgers_model(attention, **SMALL, **settings)
    sizes = cinn_sizes(FINE, COARSE)  # the original's sizes (test_layers checks them)
    inverse = name == "darcy_inverse"
    out = COARSE if inverse else FINE
    case["mean"] = bfloat16_exact(torch.randn(out, out, 1, dtype=torch.float64))
    case["std"] = bfloat16_exact(torch.rand(out, out, 1, dtype=torch.float64))
    return original.darcy_model(
        attention, coarse=COARSE, down_middle=sizes.down_middle,
        up_middle=COARSE if inverse else sizes.up_middle, fine=out, inverse=inverse,
        normalizer=original.Denormalizer(case["mean"], case["std"]),
        **{**SMALL, "n_hidden": 12 if inverse else 8}, **settings)


def run(model: torch.nn.Module, name: str, case: dict[str, Any]) -> torch.Tensor:
    x = case["x"]
    if name == "burgers":
        points = case["grid"][None].expand(x.shape[0], -1, -1)
        return model(x, None, points, points)["preds"]
    coarse = uniform_grid_2d(COARSE)
    pos = coarse.reshape(1, -1, 2).expand(x.shape[0], -1, -1)
    out_grid = coarse if name == "darcy_inverse" else case["grid"]
    return model(x, None, pos, out_grid[None].expand(x.shape[0], -1, -1, -1))["preds"]


def main() -> None:
    torch.manual_seed(20261129)
    torch.set_default_dtype(torch.float64)  # the original makes some tensors in the default dtype
    layers = original.load().layers
    no_attention_dropout = types.SimpleNamespace(**{**vars(F), "dropout": lambda x, *a, **k: x})
    cases = []
    for i, (name, attention, settings, ours) in enumerate(CASES):
        case: dict[str, Any] = {"name": name, "overrides": {"attention_type": attention, **ours}}
        model = build(name, attention, settings, case).double()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(bfloat16_exact(p))
        if name == "burgers":
            case["grid"] = torch.linspace(0, 1, POINTS, dtype=torch.float64)[:, None]
            case["x"] = bfloat16_exact(torch.randn(3, POINTS, 1, dtype=torch.float64))
        else:
            case["overrides"].update(fine=FINE, coarse=COARSE)
            case["grid"] = uniform_grid_2d(FINE)
            case["x"] = bfloat16_exact(torch.randn(1, FINE, FINE, 1, dtype=torch.float64))
        saved, layers.F = layers.F, no_attention_dropout
        try:
            with torch.no_grad():
                case["eval"] = run(model.eval(), name, case)
        finally:
            layers.F = saved
        case["seed"] = 1000 + i
        torch.manual_seed(case["seed"])
        with torch.no_grad():
            case["train"] = run(model.train(), name, case)
        case["state_dict"] = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
        del case["grid"]  # the test makes it as above
        for key in ("x", "mean", "std"):
            if key in case:
                case[key] = case[key].to(torch.bfloat16)
        cases.append(case)
    torch.manual_seed(0)  # torch's dropout draws changed between releases: the test compares
    # training outputs only where these masks come out the same
    probe = F.dropout(torch.ones(64, dtype=torch.float64), 0.5) > 0
    record = {"original": "galerkin-transformer 0.2.1", "torch": str(torch.__version__),
              "dropout_probe": probe, "cases": cases}
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, prefix=f".{OUT.name}.")
    os.close(fd)
    try:
        torch.save(record, tmp, _use_new_zipfile_serialization=False)  # small: no zip padding
        os.replace(tmp, OUT)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
