"""``build_model(name, **overrides)``: the paper's configurations by name."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from ..data.datasets import DARCY_COARSE, INVERSE_COARSE
from .continuum import AFNO, FANO, TNO, FNOChannelMLP, GTEncoder, ViTNO
from .fno import FNO1d, FNO2d
from .gnot import GNOT, GKTransformer, MIONet
from .transformer import SimpleTransformer1d, SimpleTransformer2d

# name -> (class, the paper's settings beyond the class defaults, description)
_MODELS: dict[str, tuple[Callable[..., nn.Module], dict[str, Any], str]] = {
    "burgers": (SimpleTransformer1d, {},
                "1-D Burgers: 4 layers, d=96, 1 head, spectral decoder (530,305 params)"),
    "darcy": (SimpleTransformer2d, {},
              "2-D Darcy 141/43: CiNN, 6 layers, d=128, 4 heads, spectral decoder, zero "
              "boundary ring (2,220,829 params)"),
    "darcy_inverse": (
        SimpleTransformer2d,
        {"coarse": 36, "d_model": 192, "dim_feedforward": 384, "decoder": "pointwise",
         "output_grid": "coarse", "boundary": "free", "num_decoder_layers": 1,
         "downsampler_activation": "silu", "dropout": 0.05, "upsampler_dropout": 0.05,
         "decoder_dropout": 0.05},
        "2-D inverse Darcy 141/36: coefficient on the coarse grid, pointwise decoder "
        "(2,383,873 params)",
    ),
    "fno1d": (FNO1d, {}, "FNO baseline, 1-D: width 64, 16 modes, 4 layers (549,569 params)"),
    "fno2d": (FNO2d, {}, "FNO baseline, 2-D: width 32, modes k₁ ∈ [-12, 12), k₂ ∈ [0, 12), "
              "4 layers (2,368,001 params)"),
    # Continuum attention (SPEC-continuum §2): TNO forward(u (B, N, d_u), x (N, d), weight).
    "tno_l63": (TNO, {"in_dim": 1, "out_dim": 2, "domain_dim": 1, "token0_dim": 4},
                "TNO, Lorenz-63 (a): x and the token [x0, y0, z0, t0] -> (y, z); 128 wide, "
                "8 heads, 6 layers (598,786 params)"),
    "tno_l63_y": (TNO, {"in_dim": 1, "out_dim": 1, "domain_dim": 1},
                  "TNO, Lorenz-63 (b): x -> y (598,017 params)"),
    "tno_cde": (TNO, {"in_dim": 1, "out_dim": 1, "domain_dim": 1},
                "TNO, controlled ODE: u -> z (598,017 params)"),
    "tno_darcy": (TNO, {"in_dim": 1, "out_dim": 1, "domain_dim": 2},
                  "TNO, Darcy 64^2: a -> u on the flattened grid (598,145 params)"),
    "fno_ca": (FNOChannelMLP, {},
               "FNO baseline of the continuum-attention paper (NeuralOperator layout): width "
               "128, n_modes 12 (k₁ ∈ [-6, 6), k₂ ∈ [0, 6]), 4 layers, channel MLPs "
               "(5,671,553 params)"),
    "afno": (AFNO, {}, "AFNO baseline (PhysicsNeMo layout) on a 64^2 grid only: 128 wide, "
             "4 blocks, 8 diagonal blocks (1,088,641 params)"),
    "vitno": (ViTNO, {},
              "ViT NO, Darcy / Kolmogorov 416^2: 13x13 patches, 128 wide, 8 heads, 6 layers, "
              "spectral lift (12 modes), final spectral conv (64 modes) (716,417 params)"),
    "fano": (FANO, {},
             "FANO, Darcy / Kolmogorov 416^2: 13x13 patches, 128 wide, 8 heads, 6 layers, "
             "spectral Q, K, V (9 modes), final spectral conv (64 modes) (48,084,865 params)"),
    "gt_encoder": (GTEncoder, {},
                   "Galerkin Transformer encoder (Fourier attention, 4 layers, 128 wide, "
                   "4 heads) with linear lift and projection, Darcy (534,657 params)"),
    # GNOT (SPEC-gnot §2, §6): model(x (B, N, query_dim), inputs [(B, M_l, b_l)], theta, *,
    # weight, input_weights).
    "gnot_heat": (GNOT, {"space_dim": 2, "query_dim": 2, "input_dims": (3, 2, 2), "out_dim": 1,
                         "theta_dim": 12, "n_hidden": 128, "n_layers": 3, "n_head": 1,
                         "n_experts": 3, "mlp_layers": 3},
                  "GNOT, heat: 3 inputs (top temperature, 2 interfaces), θ the 12 knot heights, "
                  "128 wide, 3 layers, 3 experts (4,101,386 params)"),
    "gnot_elasticity": (GNOT, {"space_dim": 2, "query_dim": 2, "input_dims": (2,),
                               "out_dim": 1, "n_hidden": 128, "n_layers": 3, "n_head": 4,
                               "n_experts": 1, "mlp_layers": 3},
                        "GNOT, elasticity: the mesh as input, 128 wide, 3 layers, 4 heads "
                        "(1,389,441 params)"),
    "mionet_heat": (MIONet, {"space_dim": 2, "query_dim": 2, "input_dims": (3, 2, 2),
                             "out_dim": 1, "theta_dim": 12},
                    "MIONet baseline, heat: 4 branches (3 inputs, θ) and a trunk, 4 layers, "
                    "width 256; needs input_points, the data set's largest input sizes"),
    "mionet_elasticity": (MIONet, {"space_dim": 2, "query_dim": 2, "input_dims": (2,),
                                   "out_dim": 1},
                          "MIONet baseline, elasticity: the mesh as one branch; needs "
                          "input_points"),
    "gk_elasticity": (GKTransformer, {},
                      "Galerkin Transformer baseline, elasticity: 4 layers, 128 wide, 4 heads, "
                      "pointwise decoder (584,321 params)"),
}

# The reference raises the encoder dropout of softmax and linear attention to 0.1.
_BASELINE_ENCODER_DROPOUT = 0.1


def available_models() -> dict[str, str]:
    """Model names accepted by :func:`build_model`, with a one-line description each."""
    return {name: description for name, (_, _, description) in _MODELS.items()}


#: The models whose run records name their coarse grid (training.build_run_model).
_GRID_PAIRED = ("darcy", "darcy_inverse")


def _recorded_arguments(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of model ``name`` that a run recorded, completed as the model
    was built: a Darcy record without ``coarse`` predates build_model's pairing of a fine grid
    with the paper's coarse one, and the model had the preset's coarse grid, whatever its fine
    one (its weights fit any grid, so nothing else would tell)."""
    completed = dict(arguments)
    if name in _GRID_PAIRED and "coarse" not in completed:
        cls, paper, _ = _MODELS[name]
        completed["coarse"] = paper.get("coarse",
                                        inspect.signature(cls).parameters["coarse"].default)
    return completed


def build_model(name: str, **overrides: Any) -> nn.Module:
    """Build one of the paper's models with its published configuration.

    Names: ``'burgers'`` (:class:`SimpleTransformer1d`), ``'darcy'`` and ``'darcy_inverse'``
    (:class:`SimpleTransformer2d`), ``'fno1d'`` (:class:`FNO1d`), ``'fno2d'`` (:class:`FNO2d`);
    the continuum-attention paper's ``'tno_l63'``, ``'tno_l63_y'``, ``'tno_cde'``,
    ``'tno_darcy'`` (:class:`TNO`), ``'vitno'`` (:class:`ViTNO`), ``'fano'`` (:class:`FANO`),
    ``'fno_ca'`` (:class:`FNOChannelMLP`), ``'afno'`` (:class:`AFNO`) and ``'gt_encoder'``
    (:class:`GTEncoder`); GNOT's ``'gnot_heat'``,
    ``'gnot_elasticity'`` (:class:`GNOT`), ``'mionet_heat'``, ``'mionet_elasticity'``
    (:class:`MIONet`, which need ``input_points``) and ``'gk_elasticity'``
    (:class:`GKTransformer`).
    ``overrides`` are constructor arguments of that class, e.g. ``attention_type='galerkin'``,
    ``norm='layer'``, ``d_model``, ``n_head``, ``num_layers``, ``fine=211, coarse=61``; a
    Darcy ``fine`` without ``coarse`` takes the paper's pair (``data.datasets.DARCY_COARSE``,
    ``INVERSE_COARSE``), and a grid the paper pairs with none needs ``coarse``.

    As in the reference code, unless overridden: the Darcy model uses layer-norm epsilon
    ``1e-5`` for Galerkin attention on fine grids ``>= 211`` (``1e-7`` otherwise), and softmax
    or linear attention use encoder dropout 0.1 (the feed-forward dropout keeps the paper's
    value).

    Forward signatures: see the classes; 1-D ``model(x (B, n, 1), grid (n, 1)) → (B, n, 1)``,
    2-D ``model(x (B, n, n, 1), grid (n, n, 2)) → (B, n, n, 1)`` (``'darcy'``) or
    ``(B, m, m, 1)`` on the coarse grid (``'darcy_inverse'``). The TNOs and ``'gt_encoder'``
    take point sets, ``model(u (B, N, d_u), x (N, d)) → (B, N, d_z)`` (the TNO also
    ``weight='auto'`` and, for ``'tno_l63'``, ``token0 (B, 4)``); ``'vitno'``, ``'fano'``,
    ``'fno_ca'`` and ``'afno'`` grids, ``model(u (B, s, s, 1), x (s, s, 2)) → (B, s, s, 1)``
    (the patched models need ``s`` divisible by the patches per axis, 13); GNOT's models
    padded ragged batches, ``model(x (B, N, 2), inputs [(B, M_l, b_l)], theta (B, p) | None, *,
    weight, input_weights) → (B, N, out_dim)``.
    """
    if not isinstance(name, str) or name not in _MODELS:
        raise ValueError(f"name: expected one of {list(_MODELS)}, got {name!r}")
    cls, paper, _ = _MODELS[name]
    allowed = inspect.signature(cls).parameters
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise TypeError(f"overrides: {unknown} are not arguments of {cls.__name__} "
                        f"(model {name!r}); expected some of {list(allowed)}")
    config = {**paper, **overrides}
    missing = [key for key, p in allowed.items()
               if p.default is inspect.Parameter.empty and key not in config]
    if missing:
        raise TypeError(f"overrides: model {name!r} needs {missing} (no published value: it "
                        f"depends on the data)")

    def default(key: str) -> Any:
        return config.get(key, allowed[key].default)

    fine = overrides.get("fine")
    if (name in _GRID_PAIRED and "coarse" not in overrides
            and isinstance(fine, numbers.Integral) and not isinstance(fine, bool)):
        # the paper's pair of grids (the preset's coarse one belongs to fine = 141 only)
        pairs = DARCY_COARSE if name == "darcy" else INVERSE_COARSE
        if fine not in pairs:
            raise ValueError(f"coarse: model {name!r} at fine={fine} needs its coarse grid (the "
                             "paper pairs " + ", ".join(f"{f} with {c}" for f, c in pairs.items())
                             + ")")
        config["coarse"] = pairs[int(fine)]

    if name == "darcy" and "eps" not in overrides:
        fine = default("fine")
        fine_galerkin = (default("attention_type") == "galerkin" and not isinstance(fine, bool)
                         and isinstance(fine, numbers.Integral) and int(fine) >= 211)
        config["eps"] = 1e-5 if fine_galerkin else 1e-7
    if "encoder_dropout" in allowed and default("attention_type") in ("softmax", "linear") and (
        "encoder_dropout" not in overrides
    ):
        config.setdefault("ffn_dropout", default("encoder_dropout"))
        config["encoder_dropout"] = _BASELINE_ENCODER_DROPOUT
    return cls(**config)
