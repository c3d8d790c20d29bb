"""Models trained with the original implementation (``galerkin-transformer`` 0.2.1, the paper's
code) as this package's models: :func:`from_original`, and the coordinates its datasets give
them: :func:`original_grid`.

The original's ``SimpleTransformer`` (1-D) and ``FourierTransformer2D`` (2-D) are the
architectures of :class:`~galerkin_ext.models.SimpleTransformer1d` and
:class:`~galerkin_ext.models.SimpleTransformer2d` under other parameter names: with the same
weights they compute the same function (``python_tests/test_models_reference.py``). The sizes are
read from the weights; the settings that leave no trace in them come from ``build_model``'s
defaults (the paper's) or the caller.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import check_choice, check_int
from ..data.datasets import uniform_grid_2d
from .registry import build_model

# our model names -> the original's classes
_ORIGINAL_CLASS = {"burgers": "SimpleTransformer", "darcy": "FourierTransformer2D",
                   "darcy_inverse": "FourierTransformer2D"}

# original parameter name -> ours; the per-head attention norms are gathered apart (_NORM)
_RULES: list[tuple[str, str | Callable[[re.Match[str]], str]]] = [
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
    (r"regressor\.regressor\.(\d+)\.", r"decoder.mlp.\1."),
    (r"regressor\.fc\.", "decoder.input.fc."),
    (r"regressor\.ff\.(\d+)\.0\.", r"decoder.layers.\1.0."),
    (r"regressor\.out\.", "decoder.out."),
    (r"downscaler\.downsample\.conv0\.conv\.0\.", "downsampler.lift.0."),
    (r"downscaler\.downsample\.conv([1-3])\.conv\.0\.",
     lambda m: f"downsampler.branches.{int(m[1]) - 1}.0."),
    (r"upscaler\.upsample\.conv\.0\.conv\.0\.", "upsampler.conv.0.0."),
]
_NORM = re.compile(r"encoder_layers\.(\d+)\.attn\.norm_([QKV])\.(\d+)\.(weight|bias)")


def from_original(name: str, state_dict: Mapping[str, Tensor], **overrides: Any) -> nn.Module:
    """``build_model(name, ...)`` carrying the weights of a model trained with the original code.

    ``state_dict``: the original model's ``state_dict()``, as its training scripts save it
    (``torch.load(path, weights_only=True)``): its ``SimpleTransformer`` for ``name='burgers'``,
    its ``FourierTransformer2D`` for ``'darcy'`` and ``'darcy_inverse'``.

    The sizes come from the weights: ``d_model`` (the original's ``n_hidden``), ``n_head``,
    ``num_layers``, ``dim_feedforward``, ``in_channels``/``out_channels``, ``norm`` (``'attn'``
    for the original's ``attn_norm``, ``'layer'`` for ``layer_norm``; pass ``norm='instance'`` for
    its ``norm_type='instance'``), and the decoder's (``decoder``, ``freq_dim``, ``modes``,
    ``num_decoder_layers``, ``decoder_dim_feedforward`` or ``decoder_hidden``). The rest are
    ``overrides`` of :func:`build_model`: ``attention_type`` always (the weights tell Fourier and
    softmax attention apart from Galerkin and linear at most), ``fine`` and ``coarse`` for the
    2-D models (the original's ``downscaler_size``/``upscaler_size`` follow from them), and any
    setting the original run changed from the paper's (activations, ``eps``, ``boundary``,
    dropouts). An override that contradicts the weights is refused. Two of the original's
    settings leave no trace in the weights and have no counterpart here: ``residual_type='minus'``
    and ``spacial_residual=True``; a model trained with them is not converted faithfully.

    The original's outputs are de-normalised outside the weights (the 2-D model's
    ``normalizer``, a ``UnitGaussianNormalizer`` of the training targets): give its statistics to
    ``model.denormalizer.set_statistics(mean, std)``, shaped to broadcast to the output, e.g.
    ``(n, n, 1)``. The inputs are normalised as the original's datasets did it, and the grid is
    theirs, :func:`original_grid`: on this package's grids (``j / n`` in 1-D, the two
    coordinates in the other order in 2-D) the converted model computes another function.

    Returns the model in ``eval()`` mode. The original drops half of every attention matrix on
    every call, evaluation included; ours does that only with ``reference_dropout=True`` (off
    by default: its evaluation is deterministic).

    Raises:
        ValueError: ``name`` is not one of ``'burgers'``, ``'darcy'``, ``'darcy_inverse'``;
            ``attention_type`` (or, for 2-D, ``fine``/``coarse``) is missing; an override
            contradicts the weights; the weights have parameters this package's model has
            not (an original setting it does not build, e.g. a feature extractor, both norms
            at once, a 1-D pointwise decoder), lack some, or have other shapes.
        TypeError: ``state_dict`` is not a mapping of names to tensors.
    """
    if not isinstance(name, str) or name not in _ORIGINAL_CLASS:
        raise ValueError(f"name: expected one of {list(_ORIGINAL_CLASS)}, got {name!r}")
    if isinstance(state_dict, nn.Module):
        raise TypeError("state_dict: expected the original model's state_dict(), got the model "
                        "itself; pass model.state_dict()")
    if not isinstance(state_dict, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state_dict.items()
    ):
        raise TypeError(f"state_dict: expected a mapping of parameter names to tensors, got "
                        f"{type(state_dict).__name__}")
    required = ("attention_type",) if name == "burgers" else ("attention_type", "fine", "coarse")
    missing = [key for key in required if key not in overrides]
    if missing:
        raise ValueError(f"overrides: {name!r} from the original's weights needs {missing} "
                         "(the weights do not record them)")
    weights = _translate(state_dict)
    settings = _settings(name, weights, overrides)
    for key, value in settings.items():
        given = overrides.get(key, value)
        # (the instance norm's weights are the attention norm's: only the caller can tell)
        if given != value and not (key == "norm" and (value, given) == ("attn", "instance")):
            raise ValueError(f"{key}: the original's weights give {value!r}, got {given!r}")
    model = build_model(name, **{**settings, **overrides})
    _check_fits(model, weights)
    model.load_state_dict(weights, strict=False)  # the de-normaliser keeps its identity
    return model.eval()


def original_grid(n: int, dim: int) -> Tensor:
    """The grid the original's datasets give its models, the ``grid`` of a model converted by
    :func:`from_original`: float64, ``linspace(0, 1, n)`` on each axis (both ends, also in the
    periodic 1-D problem), ``(n, 1)`` for ``dim=1`` and ``(n, n, 2)`` for ``dim=2`` with the
    axis-1 coordinate first (NumPy's ``meshgrid`` order;
    :func:`~galerkin_ext.data.datasets.uniform_grid_2d` puts the axis-0 one first)."""
    n = check_int(n, "n", 2)
    if check_choice(check_int(dim, "dim"), "dim", (1, 2)) == 1:
        return torch.linspace(0, 1, n, dtype=torch.float64)[:, None]
    return uniform_grid_2d(n).flip(-1)


def _translate(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The original's parameters under our names; per-head norms ``(D,) × H`` become ``(H, D)``."""
    ours: dict[str, Tensor] = {}
    norms: dict[str, dict[int, Tensor]] = {}
    unknown = []
    for key, value in state_dict.items():
        norm = _NORM.fullmatch(key)
        if norm:
            layer, which, head, kind = norm.groups()
            norms.setdefault(f"encoder.{layer}.attn.{which.lower()}_norm_{kind}", {})[
                int(head)] = value
            continue
        for pattern, replacement in _RULES:
            new, count = re.subn(pattern, replacement, key)
            if count:
                ours[new] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"state_dict: {unknown[:5]}{' …' if len(unknown) > 5 else ''} have no "
                         "counterpart in this package's models (an original setting they do not "
                         "build, e.g. a feature extractor, batch norm or another decoder)")
    for key, heads in norms.items():
        if sorted(heads) != list(range(len(heads))):
            raise ValueError(f"state_dict: the per-head norms behind {key} miss heads (found "
                             f"{sorted(heads)})")
        ours[key] = torch.stack([heads[h] for h in range(len(heads))])
    return ours


def _settings(name: str, weights: Mapping[str, Tensor], overrides: Mapping[str, Any]
              ) -> dict[str, Any]:
    """The constructor arguments the weights fix."""
    def shape(key: str) -> tuple[int, ...]:
        if key not in weights:
            raise ValueError(f"state_dict: expected the original's parameters of "
                             f"{_ORIGINAL_CLASS[name]}, found none for {key!r} (ours)")
        return tuple(weights[key].shape)

    layers = _indices(weights, "encoder")
    if layers != list(range(len(layers))) or not layers:
        raise ValueError(f"state_dict: expected encoder layers 0, 1, …, found {layers}")
    d_model = shape("encoder.0.attn.query.weight")[0]
    pos_dim = 1 if name == "burgers" else 2
    extra = shape("encoder.0.attn.out_proj.weight")[1] - d_model
    if extra <= 0 or extra % pos_dim:
        raise ValueError(f"state_dict: the attention's output layer takes {extra + d_model} "
                         f"features, not d_model + n_head * {pos_dim} (coordinates in every "
                         f"head) with d_model = {d_model}")
    attn_norms = {k.split(".")[3][0] for k in weights
                  if re.fullmatch(r"encoder\.0\.attn\.[qkv]_norm_weight", k)}
    residual_norms = "encoder.0.norm1.weight" in weights
    if attn_norms and residual_norms:
        raise ValueError("state_dict: the original model has both attention norms (attn_norm) "
                         "and residual layer norms (layer_norm); this package builds one or the "
                         "other")
    settings: dict[str, Any] = {
        "d_model": d_model, "n_head": extra // pos_dim, "num_layers": len(layers),
        "dim_feedforward": shape("encoder.0.ffn.linear1.weight")[0],
        "norm": "attn" if attn_norms else "layer" if residual_norms else None,
    }
    normed = "".join(sorted(attn_norms))
    family = {"kq": ("fourier", "softmax"), "kv": ("galerkin", "linear")}.get(normed)
    if family and overrides["attention_type"] not in family:
        raise ValueError(f"attention_type: the original's weights hold norms of "
                         f"{normed[0].upper()} and {normed[1].upper()}, as {family[0]!r} and "
                         f"{family[1]!r} attention have, got {overrides['attention_type']!r}")
    lift = "lift.weight" if name == "burgers" else "downsampler.lift.0.weight"
    settings["in_channels"] = shape(lift)[1]
    if "decoder.spectral.0.linear.weight" in weights:
        mlp = _indices(weights, "decoder.mlp")
        fourier = "weight" if name == "burgers" else "weight_pos"
        settings.update(
            freq_dim=shape("decoder.spectral.0.linear.weight")[0],
            modes=shape(f"decoder.spectral.0.{fourier}")[2],
            num_decoder_layers=len(_indices(weights, "decoder.spectral")),
            decoder_dim_feedforward=shape("decoder.mlp.0.weight")[0],
            out_channels=shape(f"decoder.mlp.{mlp[-1]}.weight")[0])
        if name != "burgers":
            settings["decoder"] = "spectral"
    elif name != "burgers" and "decoder.out.weight" in weights:
        settings.update(decoder="pointwise", decoder_hidden=shape("decoder.input.fc.weight")[0],
                        num_decoder_layers=len(_indices(weights, "decoder.layers")),
                        out_channels=shape("decoder.out.weight")[0])
    else:
        expected = "regressor.spectral_conv" + ("" if name == "burgers" else " or regressor.out")
        raise ValueError(f"state_dict: no decoder of {_ORIGINAL_CLASS[name]} found (expected "
                         f"{expected} parameters)")
    return settings


def _indices(weights: Mapping[str, Tensor], prefix: str) -> list[int]:
    """The indices ``i`` of the parameters named ``{prefix}.{i}.…``, sorted."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    return sorted({int(m[1]) for key in weights if (m := pattern.match(key))})


def _check_fits(model: nn.Module, weights: Mapping[str, Tensor]) -> None:
    """Every parameter of ``model`` (its de-normaliser aside) given once, in its shape."""
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("denormalizer.")}
    unexpected = sorted(set(weights) - set(own))
    if unexpected:
        raise ValueError(f"state_dict: parameters {unexpected[:5]} (our names) have no place in "
                         f"the model built with these settings ({type(model).__name__})")
    absent = sorted(set(own) - set(weights))
    if absent:
        raise ValueError(f"state_dict: lacks the parameters for {absent[:5]} (our names) of the "
                         f"model built with these settings ({type(model).__name__})")
    for key, value in weights.items():
        if value.shape != own[key].shape:
            raise ValueError(f"state_dict: {key} (our name) has shape {tuple(value.shape)}, the "
                             f"model built with these settings expects {tuple(own[key].shape)}")
