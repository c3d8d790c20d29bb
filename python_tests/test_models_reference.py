"""Fidelity against the original implementation (``galerkin-transformer`` 0.2.1 from PyPI): its
models' weights, read by :func:`galerkin_ext.models.from_original`, must give its outputs, in
evaluation and in training (every dropout drawn from torch's generator in the same order).

* Recorded (runs everywhere): ``data/original_outputs.pt``, small models of the original with
  their inputs and float64 outputs, written by ``data/make_original_outputs.py``.
* Live: the paper's configurations against the installed original, loaded by
  ``benchmarks/original.py`` (skipped where it is not installed, as in CI).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from galerkin_ext.data.datasets import uniform_grid_2d
from galerkin_ext.layers import draw_torch_masks
from galerkin_ext.models import build_model, from_original, original_grid

DATA = Path(__file__).with_name("data") / "original_outputs.pt"
RECORD = torch.load(DATA, weights_only=True)
RECORDED = RECORD["cases"]


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['name']}-{case['overrides']['attention_type']}"


def _converted(case: dict[str, Any], **overrides: Any) -> torch.nn.Module:
    model = from_original(case["name"], case["state_dict"],
                          **{**case["overrides"], **overrides}).double()
    if "mean" in case:
        model.denormalizer.set_statistics(case["mean"].double(), case["std"].double())
    return model


def _inputs(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The recorded inputs and the grid the recording gave both models (one function: any
    common grid shows it; the original's own 2-D grid is the live tests')."""
    x = case["x"].double()
    if case["name"] == "burgers":
        return x, original_grid(x.shape[1], 1)
    return x, uniform_grid_2d(x.shape[1])


def test_original_grid_is_the_one_the_originals_datasets_make():
    """Its BurgersDataset: np.linspace(0, 1, n); its DarcyDataset.get_grid: np.meshgrid of two
    linspaces (the axis-1 coordinate first), stacked last."""
    line = np.linspace(0, 1, 7)
    close = {"rtol": 0, "atol": 1e-15}  # (torch's linspace and NumPy's differ in the last bit)
    np.testing.assert_allclose(original_grid(7, 1).numpy(), line[:, None], **close)
    np.testing.assert_allclose(original_grid(7, 2).numpy(), np.stack(np.meshgrid(line, line), -1),
                               **close)
    with pytest.raises(ValueError, match="dim: expected one of"):
        original_grid(7, 3)


@pytest.mark.parametrize("case", RECORDED, ids=_case_id)
def test_original_weights_give_the_originals_outputs(case):
    model = _converted(case)
    assert not model.training
    x, grid = _inputs(case)
    with torch.no_grad():
        torch.testing.assert_close(model(x, grid), case["eval"], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("case", RECORDED, ids=_case_id)
def test_original_weights_train_with_the_originals_dropout_masks(case):
    """In training, with the original's always-on attention dropout, every dropout draws the
    original's mask from the same seed: the same outputs."""
    torch.manual_seed(0)
    if not torch.equal(F.dropout(torch.ones(64, dtype=torch.float64), 0.5) > 0,
                       RECORD["dropout_probe"]):
        pytest.skip(f"this torch draws other dropout masks than {RECORD['torch']}, which "
                    "recorded the outputs")
    model = _converted(case, reference_dropout=True).train()
    x, grid = _inputs(case)
    torch.manual_seed(case["seed"])
    with torch.no_grad():
        torch.testing.assert_close(model(x, grid), case["train"], rtol=1e-12, atol=1e-13)


def test_original_sizes_are_read_from_the_weights():
    by_id = {_case_id(case): case for case in RECORDED}
    model = from_original("burgers", by_id["burgers-galerkin"]["state_dict"],
                          attention_type="galerkin")
    layer = model.encoder[0]
    assert (len(model.encoder), layer.attn.n_head, layer.attn.norm) == (2, 2, "attn")
    assert layer.ffn.linear1.out_features == 12
    fourier = from_original("burgers", by_id["burgers-fourier"]["state_dict"],
                            attention_type="fourier")
    assert fourier.encoder[0].attn.norm == "layer"  # the original's layer_norm=True
    inverse = from_original("darcy_inverse", by_id["darcy_inverse-galerkin"]["state_dict"],
                            attention_type="galerkin", fine=29, coarse=15)
    assert type(inverse.decoder).__name__ == "PointwiseRegressor"
    # the original's norm_type='instance' has the same weights as its layer norms
    instance = from_original("burgers", by_id["burgers-galerkin"]["state_dict"],
                             attention_type="galerkin", norm="instance")
    assert instance.encoder[0].attn.norm == "instance"
    # per-head norms stacked in head order (the recorded weights' heads are alike)
    heads = dict(by_id["burgers-galerkin"]["state_dict"])
    for head in (0, 1):
        key = f"encoder_layers.0.attn.norm_K.{head}.weight"
        heads[key] = torch.full_like(heads[key], float(head))
    stacked = from_original("burgers", heads, attention_type="galerkin")
    assert stacked.encoder[0].attn.k_norm_weight[:, 0].tolist() == [0.0, 1.0]


def test_from_original_refuses_what_the_weights_contradict_or_lack():
    by_id = {_case_id(case): case for case in RECORDED}
    burgers = dict(by_id["burgers-galerkin"]["state_dict"])
    darcy = by_id["darcy-galerkin"]["state_dict"]
    with pytest.raises(ValueError, match="name: expected one of"):
        from_original("fno2d", burgers, attention_type="galerkin")
    with pytest.raises(ValueError, match=r"needs \['attention_type'\]"):
        from_original("burgers", burgers)
    with pytest.raises(ValueError, match=r"needs \['fine', 'coarse'\]"):
        from_original("darcy", darcy, attention_type="galerkin")
    with pytest.raises(ValueError, match="attention_type: the original's weights hold norms of "
                                         "K and V"):
        from_original("burgers", burgers, attention_type="fourier")
    with pytest.raises(ValueError, match="d_model: the original's weights give 8, got 16"):
        from_original("burgers", burgers, attention_type="galerkin", d_model=16)
    with pytest.raises(ValueError, match="norm: the original's weights give 'attn'"):
        from_original("burgers", burgers, attention_type="galerkin", norm="layer")
    with pytest.raises(TypeError, match="pass model.state_dict()"):
        from_original("burgers", torch.nn.Linear(2, 2), attention_type="galerkin")
    with pytest.raises(TypeError, match="mapping of parameter names to tensors"):
        from_original("burgers", [("a", torch.zeros(1))], attention_type="galerkin")
    with pytest.raises(ValueError, match=r"\['feat_extract\.gcn\.weight'\] have no counterpart"):
        from_original("burgers", {**burgers, "feat_extract.gcn.weight": torch.zeros(2)},
                      attention_type="galerkin")
    with pytest.raises(ValueError, match="both attention norms"):
        from_original("burgers", {**burgers, "encoder_layers.0.layer_norm1.weight": torch.ones(8),
                                  "encoder_layers.0.layer_norm1.bias": torch.zeros(8)},
                      attention_type="galerkin")
    with pytest.raises(ValueError, match="miss heads"):
        from_original("burgers", {k: v for k, v in burgers.items()
                                  if k != "encoder_layers.1.attn.norm_K.0.weight"},
                      attention_type="galerkin")
    with pytest.raises(ValueError, match=r"lacks the parameters for \['encoder\.1\.ffn\.linear1"):
        from_original("burgers", {k: v for k, v in burgers.items()
                                  if not k.startswith("encoder_layers.1.ff.lr1")},
                      attention_type="galerkin")
    bad = {**burgers, "encoder_layers.1.ff.lr2.bias": torch.zeros(9)}
    with pytest.raises(ValueError, match=r"encoder\.1\.ffn\.linear2\.bias \(our name\) has shape "
                                         r"\(9,\), .* expects \(8,\)"):
        from_original("burgers", bad, attention_type="galerkin")
    with pytest.raises(ValueError, match="no decoder of SimpleTransformer"):
        from_original("burgers", {k: v for k, v in burgers.items()
                                  if not k.startswith("regressor.")}, attention_type="galerkin")


# ---------------------------------------------------------------------------------------------
# Live: the paper's configurations against the installed original


@pytest.fixture(scope="module")
def original() -> Iterator[types.ModuleType]:
    """benchmarks/original.py, the one loader of the original."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import original as loader
    finally:
        sys.path.pop(0)
    if not loader.available():
        pytest.skip("the original package galerkin-transformer==0.2.1 is not installed")
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the original makes some tensors in the default dtype
    yield loader
    torch.set_default_dtype(saved)


def _both_ways(original, reference, model, run_reference, run_ours) -> None:
    """Evaluation (the original's always-on attention dropout off) and training (every dropout
    on, the same seed) give the same outputs."""
    layers = original.load().layers
    saved = layers.F
    layers.F = types.SimpleNamespace(**{**vars(F), "dropout": lambda x, *args, **kwargs: x})
    try:
        with torch.no_grad():
            expected = run_reference(reference.eval())
    finally:
        layers.F = saved
    with torch.no_grad():
        torch.testing.assert_close(run_ours(model.eval()), expected, rtol=1e-12, atol=1e-13)
        for module in model.modules():  # the original's attention dropout, in training only
            if hasattr(module, "reference_dropout"):
                module.reference_dropout = True
        draw_torch_masks(model)  # and its masks, as reference_dropout=True models draw them
        torch.manual_seed(7)
        expected = run_reference(reference.train())
        torch.manual_seed(7)
        torch.testing.assert_close(run_ours(model.train()), expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(
    ("attention_type", "norm"),
    [("fourier", "attn"), ("galerkin", "attn"), ("galerkin", "layer"), ("galerkin", "instance"),
     ("softmax", "attn"), ("linear", "attn")],
)
def test_burgers_matches_the_original(original, attention_type, norm):
    # its settings: attn_norm (the paper's), layer_norm, attn_norm with norm_type='instance'
    reference = original.burgers_model(
        attention_type, layer_norm=norm == "layer", attn_norm=norm != "layer",
        norm_type="instance" if norm == "instance" else "layer").double()
    # the weights cannot tell the instance norm from the attention's layer norm: it is passed
    model = from_original("burgers", reference.state_dict(), attention_type=attention_type,
                          **({"norm": "instance"} if norm == "instance" else {})).double()
    assert model.encoder[0].attn.norm == norm
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in build_model("burgers", attention_type=attention_type).parameters())
    n = 128
    x, grid = torch.randn(3, n, 1, dtype=torch.float64), original_grid(n, 1)
    points = grid[None].expand(3, n, 1)
    _both_ways(original, reference, model, lambda m: m(x, None, points, points)["preds"],
               lambda m: m(x, grid))


@pytest.mark.parametrize(("name", "attention_type", "fine", "coarse"),
                         [("darcy", "galerkin", 85, 29), ("darcy", "fourier", 85, 29),
                          ("darcy_inverse", "galerkin", 141, 36)])
def test_darcy_matches_the_original(original, name, attention_type, fine, coarse):
    inverse = name == "darcy_inverse"
    sizes = build_model(name, fine=fine, coarse=coarse).sizes
    out = coarse if inverse else fine
    mean = torch.randn(out, out, 1, dtype=torch.float64)
    std = torch.rand(out, out, 1, dtype=torch.float64)
    reference = original.darcy_model(
        attention_type, coarse=coarse, down_middle=sizes.down_middle,
        up_middle=coarse if inverse else sizes.up_middle, fine=out, inverse=inverse,
        normalizer=original.Denormalizer(mean, std)).double()
    model = from_original(name, reference.state_dict(), attention_type=attention_type,
                          fine=fine, coarse=coarse).double()
    model.denormalizer.set_statistics(mean, std)
    # the grids of its DarcyDataset (get_grid: np.meshgrid order); ours, original_grid
    x, grid = torch.randn(1, fine, fine, 1, dtype=torch.float64), original_grid(fine, 2)
    line = np.linspace(0, 1, coarse)
    pos = torch.from_numpy(np.c_[[g.ravel() for g in np.meshgrid(line, line)]].T)[None]
    fine_line = np.linspace(0, 1, fine)
    out_grid = torch.from_numpy(np.stack(np.meshgrid(*(2 * [line if inverse else fine_line])),
                                         -1))[None]
    _both_ways(original, reference, model, lambda m: m(x, None, pos, out_grid)["preds"],
               lambda m: m(x, grid))
