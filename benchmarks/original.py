"""The original implementation (``galerkin-transformer`` 0.2.1 on PyPI) as a benchmark baseline.

Install it without its dependencies (its ``__init__`` wants plotting and data packages that the
model classes never use), e.g.::

    pip install --no-deps galerkin-transformer==0.2.1
    pip install --no-deps --target /tmp/original galerkin_transformer-0.2.1-py3-none-any.whl
    PYTHONPATH=/tmp/original python benchmarks/table1.py --impls ours,original ...

Only ``layers.py`` and ``model.py`` are loaded, by file, so the package's ``__init__`` never
runs. Nothing is patched: the original's ``SimpleAttention`` applies ``F.dropout`` (p = 0.5,
``training=True``) to the attention matrix on every call, and that stays as its users run it.

``BURGERS``, ``DARCY`` and ``DARCY_INVERSE`` are the paper's configurations (the original's
``config.yml`` sections ex1_burgers, ex2_darcy and ex3_darcy_inv) as keyword arguments of its
``SimpleTransformer`` (1-D) and ``FourierTransformer2D`` (2-D) classes.

Call signatures of the original models (both return a dict; the prediction is ``"preds"``):

* ``SimpleTransformer(node (B, n, 1), edge=None, pos (B, n, 1), grid (B, n, 1))`` →
  ``preds (B, n, 1)``; the grid is unused by the Burgers decoder (``spacial_fc=False``).
* ``FourierTransformer2D(node (B, n, n, 1), edge=None, pos (B, m*m, 2), grid (B, n, n, 2))`` →
  ``preds (B, n, n, 1)``: ``pos`` are the coarse (attention) grid's coordinates, ``grid`` the
  fine grid's; the output is de-normalised by its ``normalizer`` and gets a zero boundary ring.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from torch import Tensor, nn

__all__ = [
    "BURGERS",
    "DARCY",
    "DARCY_INVERSE",
    "Denormalizer",
    "available",
    "burgers_model",
    "darcy_model",
    "load",
    "package_root",
]

PACKAGE = "galerkin_transformer"
INSTALL_HINT = ("pip install --no-deps galerkin-transformer==0.2.1 (or --target DIR and "
                "PYTHONPATH=DIR)")

BURGERS: dict[str, Any] = dict(  # ex1_burgers: 530,305 parameters with Fourier attention
    node_feats=1, pos_dim=1, n_targets=1, n_hidden=96, num_feat_layers=0, num_encoder_layers=4,
    n_head=1, pred_len=0, n_freq_targets=0, dim_feedforward=192, feat_extract_type=None,
    attention_type="fourier", xavier_init=1e-3, diagonal_weight=1e-2, symmetric_init=False,
    layer_norm=False, attn_norm=True, batch_norm=False, spacial_residual=False,
    return_attn_weight=False, return_latent=False, residual_type="plus", decoder_type="ifft",
    freq_dim=48, num_regressor_layers=2, fourier_modes=16, spacial_dim=1, spacial_fc=False,
    dropout=0.0, encoder_dropout=0.0, ffn_dropout=0.0, decoder_dropout=0.0, edge_feats=None,
    seq_len=None, bulk_regression=False, debug=False,
)

DARCY: dict[str, Any] = dict(  # ex2_darcy: 2,220,829 parameters at 141/43
    node_feats=1, pos_dim=2, n_targets=1, n_hidden=128, num_feat_layers=0, num_encoder_layers=6,
    n_head=4, dim_feedforward=256, feat_extract_type=None, attention_type="galerkin",
    xavier_init=1e-2, diagonal_weight=1e-2, symmetric_init=False, layer_norm=False,
    attn_norm=True, norm_eps=1e-7, batch_norm=False, return_attn_weight=False,
    return_latent=False, decoder_type="ifft2", spacial_dim=2, spacial_fc=True,
    upsample_mode="interp", downsample_mode="interp", freq_dim=32,
    boundary_condition="dirichlet", num_regressor_layers=2, fourier_modes=12,
    regressor_activation="silu", downscaler_activation="relu", upscaler_activation="silu",
    last_activation=True, dropout=0.0, downscaler_dropout=0.05, upscaler_dropout=0.0,
    ffn_dropout=0.05, encoder_dropout=0.05, decoder_dropout=0.0, debug=False,
)

DARCY_INVERSE: dict[str, Any] = dict(  # ex3_darcy_inv: output on the coarse grid
    DARCY, n_hidden=192, dim_feedforward=384, decoder_type="pointwise", boundary_condition="free",
    num_regressor_layers=1, downscaler_activation=None, upscaler_activation=None, dropout=0.05,
    upscaler_dropout=0.05, decoder_dropout=0.05,
)


def package_root() -> Path | None:
    """The installed package's folder, or ``None``. Finding the spec does not run ``__init__``."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return root if (root / "layers.py").is_file() and (root / "model.py").is_file() else None


def available() -> bool:
    """Whether the original package is installed (its ``layers.py`` and ``model.py`` found)."""
    return package_root() is not None


def exec_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_loaded: types.ModuleType | None = None


def load() -> types.ModuleType:
    """The original ``model.py`` as a module (its ``layers`` as ``.layers``), loaded once.

    ``model.py`` does ``from layers import *`` and ``from utils_ft import *`` (plotting, pandas,
    scipy); its model classes use nothing of ``utils_ft`` and only ``summary`` of ``torchinfo``
    by name, so stand-ins are put into ``sys.modules`` while it loads and taken out afterwards.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    root = package_root()
    if root is None:
        raise ModuleNotFoundError(f"{PACKAGE} 0.2.1 is not installed: {INSTALL_HINT}")
    torchinfo = types.ModuleType("torchinfo")
    torchinfo.summary = None  # type: ignore[attr-defined]
    stand_ins = {"utils_ft": types.ModuleType("utils_ft"), "torchinfo": torchinfo}
    saved = {name: sys.modules.get(name) for name in ("layers", *stand_ins)}
    try:
        layers = exec_file(f"{PACKAGE}_original_layers", root / "layers.py")
        sys.modules.update(layers=layers, **stand_ins)
        model = exec_file(f"{PACKAGE}_original_model", root / "model.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    model.layers = layers
    _loaded = model
    return model


class Denormalizer:
    """``y = x · (std + eps) + mean``: the interface ``FourierTransformer2D`` expects of its
    ``normalizer`` (``inverse_transform``, and ``to``/``cuda``/``cpu`` returning itself)."""

    def __init__(self, mean: Tensor, std: Tensor, eps: float = 1e-5) -> None:
        self.mean, self.std, self.eps = mean, std, eps

    def inverse_transform(self, x: Tensor) -> Tensor:
        return x * (self.std + self.eps) + self.mean

    def to(self, *args: Any, **kwargs: Any) -> Denormalizer:
        self.mean, self.std = self.mean.to(*args, **kwargs), self.std.to(*args, **kwargs)
        return self

    def cuda(self, device: Any = None) -> Denormalizer:
        return self.to("cuda" if device is None else device)

    def cpu(self) -> Denormalizer:
        return self.to("cpu")


def burgers_model(attention_type: str = "fourier", **overrides: Any) -> nn.Module:
    """The original 1-D Burgers model (``SimpleTransformer``) with the paper's configuration."""
    return load().SimpleTransformer(**{**BURGERS, "attention_type": attention_type, **overrides})


def darcy_model(
    attention_type: str = "galerkin",
    *,
    coarse: int,
    down_middle: int,
    up_middle: int,
    fine: int,
    normalizer: Denormalizer | None = None,
    inverse: bool = False,
    **overrides: Any,
) -> nn.Module:
    """The original 2-D model (``FourierTransformer2D``), Darcy or (``inverse=True``) the inverse
    problem, on the CiNN sizes ``fine → down_middle → coarse`` and ``coarse → up_middle → fine``
    (take them from our model's ``sizes`` so that both compute on the same grids). For the
    inverse problem the up path is ``coarse → coarse``: pass ``up_middle = fine = coarse``."""
    config = {
        **(DARCY_INVERSE if inverse else DARCY),
        "attention_type": attention_type,
        "downscaler_size": ((down_middle,) * 2, (coarse,) * 2),
        "upscaler_size": ((up_middle,) * 2, (fine,) * 2),
        "normalizer": normalizer,
        **overrides,
    }
    return load().FourierTransformer2D(**config)
