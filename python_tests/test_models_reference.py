"""Fidelity against the original implementation (``galerkin-transformer`` 0.2.1 from PyPI) used
as a test-time oracle: the paper's three models with the reference's weights copied into ours
must give the same outputs. Skipped when that package is not installed (CI does not install it).

The reference is loaded and configured by ``benchmarks/original.py`` (only its ``layers.py`` and
``model.py``, by file: its ``__init__`` pulls in plotting libraries the models do not need).
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from galerkin_ext.models import build_model


@pytest.fixture(scope="module")
def original() -> Iterator[types.ModuleType]:
    """benchmarks/original.py, the one loader of the reference, with its attention dropout off."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import original as loader
    finally:
        sys.path.pop(0)
    if not loader.available():
        pytest.skip("the reference package galerkin-transformer==0.2.1 is not installed")
    layers = loader.load().layers
    # The reference drops half of every attention matrix on every call (F.dropout with its
    # default p, even in eval); without that the two implementations compute the same function.
    saved = layers.F
    layers.F = types.SimpleNamespace(**{**vars(F), "dropout": lambda x, *args, **kwargs: x})
    yield loader
    layers.F = saved


_RULES = [  # reference parameter name -> ours
    (r"feat_extract\.id\.", "lift."),
    (r"encoder_layers\.(\d+)\.attn\.linears\.0\.", r"encoder.\1.attn.query."),
    (r"encoder_layers\.(\d+)\.attn\.linears\.1\.", r"encoder.\1.attn.key."),
    (r"encoder_layers\.(\d+)\.attn\.linears\.2\.", r"encoder.\1.attn.value."),
    (r"encoder_layers\.(\d+)\.attn\.fc\.", r"encoder.\1.attn.out_proj."),
    (r"encoder_layers\.(\d+)\.ff\.lr1\.", r"encoder.\1.ffn.linear1."),
    (r"encoder_layers\.(\d+)\.ff\.lr2\.", r"encoder.\1.ffn.linear2."),
    (r"encoder_layers\.(\d+)\.layer_norm(\d)\.", r"encoder.\1.norm\2."),
    (r"regressor\.spectral_conv\.(\d+)\.linear\.", r"decoder.spectral.\1.linear."),
    (r"regressor\.spectral_conv\.(\d+)\.fourier_weight$", r"decoder.spectral.\1.weight"),
    (r"regressor\.spectral_conv\.(\d+)\.fourier_weight\.0$", r"decoder.spectral.\1.weight_pos"),
    (r"regressor\.spectral_conv\.(\d+)\.fourier_weight\.1$", r"decoder.spectral.\1.weight_neg"),
    (r"regressor\.regressor\.(\d)\.", r"decoder.mlp.\1."),
    (r"regressor\.fc\.", "decoder.input.fc."),
    (r"regressor\.ff\.(\d+)\.0\.", r"decoder.layers.\1.0."),
    (r"regressor\.out\.", "decoder.out."),
    (r"downscaler\.downsample\.conv0\.conv\.0\.", "downsampler.lift.0."),
    (r"downscaler\.downsample\.conv(\d)\.conv\.0\.",
     lambda m: f"downsampler.branches.{int(m[1]) - 1}.0."),
    (r"upscaler\.upsample\.conv\.0\.conv\.0\.", "upsampler.conv.0.0."),
]


def _translate(reference_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reference's state dict in our names; per-head norms ``(D,) × H`` become ``(H, D)``."""
    ours, norms = {}, {}
    for key, value in reference_state.items():
        norm = re.fullmatch(r"encoder_layers\.(\d+)\.attn\.norm_([QKV])\.(\d+)\.(weight|bias)", key)
        if norm:
            layer, which, head, kind = norm.groups()
            name = f"encoder.{layer}.attn.{which.lower()}_norm_{kind}"
            norms.setdefault(name, {})[int(head)] = value
            continue
        for pattern, replacement in _RULES:
            new, count = re.subn(pattern, replacement, key)
            if count:
                ours[new] = value
                break
        else:
            raise KeyError(f"no rule for the reference parameter {key}")
    for name, heads in norms.items():
        ours[name] = torch.stack([heads[h] for h in sorted(heads)])
    return ours


def _copy_reference_weights(reference_model, model) -> None:
    state = _translate(reference_model.state_dict())
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected
    assert set(missing) <= {"denormalizer.shift", "denormalizer.scale"}


def _grid(n: int) -> torch.Tensor:
    x = torch.linspace(0, 1, n)
    return torch.stack(torch.meshgrid(x, x, indexing="xy"), dim=-1)


@pytest.mark.parametrize(
    ("attention_type", "layer_norm"),
    [("fourier", False), ("galerkin", False), ("galerkin", True), ("softmax", False),
     ("linear", False)],
)
def test_burgers_matches_reference(original, attention_type, layer_norm):
    reference = original.burgers_model(attention_type, layer_norm=layer_norm,
                                       attn_norm=not layer_norm)
    model = build_model("burgers", attention_type=attention_type,
                        norm="layer" if layer_norm else "attn")
    _copy_reference_weights(reference, model)
    reference.eval()
    model.eval()
    n = 128
    x, grid = torch.randn(3, n, 1), torch.linspace(0, 1, n)[None, :, None].expand(3, n, 1)
    with torch.no_grad():
        expected = reference(x, None, grid, grid)["preds"]
        torch.testing.assert_close(model(x, grid[0]), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attention_type", ["galerkin", "fourier"])
def test_darcy_matches_reference(original, attention_type):
    fine, coarse = 85, 29
    model = build_model("darcy", fine=fine, coarse=coarse, attention_type=attention_type)
    sizes = model.sizes
    mean, std = torch.randn(fine, fine, 1), torch.rand(fine, fine, 1)
    reference = original.darcy_model(attention_type, coarse=coarse, down_middle=sizes.down_middle,
                                     up_middle=sizes.up_middle, fine=fine,
                                     normalizer=original.Denormalizer(mean, std))
    _copy_reference_weights(reference, model)
    model.denormalizer.set_statistics(mean, std)
    reference.eval()
    model.eval()
    x, grid = torch.randn(2, fine, fine, 1), _grid(fine)
    pos = _grid(coarse).reshape(1, coarse * coarse, 2).expand(2, -1, -1)
    with torch.no_grad():
        expected = reference(x, None, pos, grid.expand(2, fine, fine, 2))["preds"]
        torch.testing.assert_close(model(x, grid), expected, rtol=1e-4, atol=1e-5)


def test_darcy_inverse_matches_reference(original):
    fine, coarse = 141, 36
    model = build_model("darcy_inverse", fine=fine, coarse=coarse)
    mean, std = torch.randn(coarse, coarse, 1), torch.rand(coarse, coarse, 1)
    reference = original.darcy_model(
        "galerkin", coarse=coarse, down_middle=model.sizes.down_middle, up_middle=coarse,
        fine=coarse, normalizer=original.Denormalizer(mean, std), inverse=True)
    _copy_reference_weights(reference, model)
    model.denormalizer.set_statistics(mean, std)
    reference.eval()
    model.eval()
    x = torch.randn(1, fine, fine, 1)
    coarse_grid = _grid(coarse)[None]
    with torch.no_grad():
        expected = reference(x, None, coarse_grid.reshape(1, -1, 2), coarse_grid)["preds"]
        torch.testing.assert_close(model(x, _grid(fine)), expected, rtol=1e-4, atol=1e-5)
