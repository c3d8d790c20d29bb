"""Fidelity against the original implementation (``galerkin-transformer`` 0.2.1 from PyPI) used
as a test-time oracle: the paper's three models with the reference's weights copied into ours
must give the same outputs. Skipped when that package is not installed (CI does not install it).

Only the package's ``layers.py`` and ``model.py`` are loaded, straight from their files: its
``__init__`` pulls in plotting libraries that the model classes do not need.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from galerkin_ext.models import build_model


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ref() -> types.ModuleType:
    spec = importlib.util.find_spec("galerkin_transformer")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the reference package galerkin-transformer==0.2.1 is not installed")
    root = Path(spec.submodule_search_locations[0])
    names = ("layers", "utils_ft", "torchinfo")
    saved = {name: sys.modules.get(name) for name in names}
    try:
        layers = _load("layers", root / "layers.py")
        # model.py star-imports these at import time; its model classes use none of utils_ft.
        sys.modules.update(layers=layers, utils_ft=types.ModuleType("utils_ft"),
                           torchinfo=types.SimpleNamespace(summary=None))
        model = _load("galerkin_transformer_reference_model", root / "model.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    # The reference drops half of every attention matrix on every call (F.dropout with its
    # default p, even in eval); without that the two implementations compute the same function.
    layers.F = types.SimpleNamespace(**{**vars(F), "dropout": lambda x, *args, **kwargs: x})
    return model


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


_BURGERS = dict(  # the reference's config.yml, ex1_burgers
    node_feats=1, pos_dim=1, n_targets=1, n_hidden=96, num_feat_layers=0, num_encoder_layers=4,
    n_head=1, pred_len=0, n_freq_targets=0, dim_feedforward=192, feat_extract_type=None,
    attention_type="fourier", xavier_init=1e-3, diagonal_weight=1e-2, symmetric_init=False,
    layer_norm=False, attn_norm=True, batch_norm=False, spacial_residual=False,
    return_attn_weight=False, return_latent=False, residual_type="plus", decoder_type="ifft",
    freq_dim=48, num_regressor_layers=2, fourier_modes=16, spacial_dim=1, spacial_fc=False,
    dropout=0.0, encoder_dropout=0.0, ffn_dropout=0.0, decoder_dropout=0.0, edge_feats=None,
    seq_len=None, bulk_regression=False, debug=False,
)

_DARCY = dict(  # ex2_darcy
    node_feats=1, pos_dim=2, n_targets=1, n_hidden=128, num_feat_layers=0, num_encoder_layers=6,
    n_head=4, dim_feedforward=256, feat_extract_type=None, attention_type="galerkin",
    xavier_init=1e-2, diagonal_weight=1e-2, symmetric_init=False, layer_norm=False,
    attn_norm=True, norm_eps=1e-7,
    batch_norm=False, return_attn_weight=False, return_latent=False, decoder_type="ifft2",
    spacial_dim=2, spacial_fc=True, upsample_mode="interp", downsample_mode="interp",
    freq_dim=32, boundary_condition="dirichlet", num_regressor_layers=2, fourier_modes=12,
    regressor_activation="silu", downscaler_activation="relu", upscaler_activation="silu",
    last_activation=True, dropout=0.0, downscaler_dropout=0.05, upscaler_dropout=0.0,
    ffn_dropout=0.05, encoder_dropout=0.05, decoder_dropout=0.0, debug=False,
)

_INVERSE = dict(  # ex3_darcy_inv
    _DARCY, n_hidden=192, dim_feedforward=384, decoder_type="pointwise", boundary_condition="free",
    num_regressor_layers=1, downscaler_activation=None, upscaler_activation=None, dropout=0.05,
    upscaler_dropout=0.05, decoder_dropout=0.05,
)


def _grid(n: int) -> torch.Tensor:
    x = torch.linspace(0, 1, n)
    return torch.stack(torch.meshgrid(x, x, indexing="xy"), dim=-1)


@pytest.mark.parametrize(
    ("attention_type", "layer_norm"),
    [("fourier", False), ("galerkin", False), ("galerkin", True), ("softmax", False),
     ("linear", False)],
)
def test_burgers_matches_reference(ref, attention_type, layer_norm):
    reference = ref.SimpleTransformer(**dict(_BURGERS, attention_type=attention_type,
                                             layer_norm=layer_norm, attn_norm=not layer_norm))
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


def _reference_2d(ref, config, fine, coarse, down_middle, up_sizes, mean, std):
    normalizer = types.SimpleNamespace(inverse_transform=lambda y: y * (std + 1e-5) + mean)
    return ref.FourierTransformer2D(**dict(
        config, downscaler_size=((down_middle,) * 2, (coarse,) * 2),
        upscaler_size=tuple((s, s) for s in up_sizes), normalizer=normalizer,
    ))


@pytest.mark.parametrize("attention_type", ["galerkin", "fourier"])
def test_darcy_matches_reference(ref, attention_type):
    fine, coarse = 85, 29
    model = build_model("darcy", fine=fine, coarse=coarse, attention_type=attention_type)
    sizes = model.sizes
    mean, std = torch.randn(fine, fine, 1), torch.rand(fine, fine, 1)
    reference = _reference_2d(ref, dict(_DARCY, attention_type=attention_type), fine, coarse,
                              sizes.down_middle, (sizes.up_middle, fine), mean, std)
    _copy_reference_weights(reference, model)
    model.denormalizer.set_statistics(mean, std)
    reference.eval()
    model.eval()
    x, grid = torch.randn(2, fine, fine, 1), _grid(fine)
    pos = _grid(coarse).reshape(1, coarse * coarse, 2).expand(2, -1, -1)
    with torch.no_grad():
        expected = reference(x, None, pos, grid.expand(2, fine, fine, 2))["preds"]
        torch.testing.assert_close(model(x, grid), expected, rtol=1e-4, atol=1e-5)


def test_darcy_inverse_matches_reference(ref):
    fine, coarse = 141, 36
    model = build_model("darcy_inverse", fine=fine, coarse=coarse)
    mean, std = torch.randn(coarse, coarse, 1), torch.rand(coarse, coarse, 1)
    reference = _reference_2d(ref, _INVERSE, fine, coarse, model.sizes.down_middle,
                              (coarse, coarse), mean, std)
    _copy_reference_weights(reference, model)
    model.denormalizer.set_statistics(mean, std)
    reference.eval()
    model.eval()
    x = torch.randn(1, fine, fine, 1)
    coarse_grid = _grid(coarse)[None]
    with torch.no_grad():
        expected = reference(x, None, coarse_grid.reshape(1, -1, 2), coarse_grid)["preds"]
        torch.testing.assert_close(model(x, _grid(fine)), expected, rtol=1e-4, atol=1e-5)
