"""PyTorch side of the ragged data sets (SPEC-gnot §3): normalisers, dataset, collation and a
size-bucketing batch sampler.

* :class:`RaggedNormalizers` -- z-scores fitted on the training split (unbiased std + 1e-8, as
  the GNOT reference): query coordinates per dimension (the same map serves the input
  functions' coordinates), input values per channel, θ per component, targets per channel.
  An ``nn.Module``: its ``state_dict()`` goes into checkpoints, and
  :meth:`RaggedNormalizers.from_state_dict` rebuilds it.
* :class:`RaggedDataset` -- the samples of a ragged file (:mod:`.ragged`), normalised, with
  per-sample quadrature weights that sum to 1.  Items::

      {"x": (N, d) normalised coordinates, "weight": (N,), "target": (N, o) normalised targets,
       "inputs": [(M_l, d + c_l) normalised [coords | values]], "input_weights": [(M_l,)],
       "theta": (p,) or None, "label": int64 (N,) (if the file has labels), "index": int}

* :func:`collate_ragged` -- pads every set to its batch maximum with zeros and weight 0.
* :class:`SizeBucketSampler` -- batches of similar ``N`` to cut the padding.
"""

from __future__ import annotations

import copy
import logging
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, Sampler

from .._checks import (
    check_bool,
    check_choice,
    check_float,
    check_float_dtype,
    check_index,
    check_int,
    recorded_eps,
    recorded_statistics,
)
from .datasets import UnitGaussianNormalizer, evaluation_indices
from .ragged import RaggedArrays, RaggedLayout, read_header, read_ragged
from .storage import DataFileError, DataMismatchError

__all__ = [
    "WEIGHTINGS",
    "NORMALIZER_EPS",
    "RaggedNormalizers",
    "RaggedDataset",
    "collate_ragged",
    "batch_to",
    "SizeBucketSampler",
    "padding_fraction",
]

#: ``weights=`` choices of :class:`RaggedDataset`.
WEIGHTINGS = ("mesh", "uniform")
#: Added to the std of every normaliser (the GNOT reference's value).
NORMALIZER_EPS = 1e-8

log = logging.getLogger(__name__)


# -- normalisers --------------------------------------------------------------------------------


class RaggedNormalizers(nn.Module):
    """The z-score normalisers of a ragged data set (module doc); buffers in float64 until
    moved with ``.to()``.

    Attributes:
        query: coordinates, ``(d,)`` statistics (also applied to input coordinates).
        target: ``(o,)``.
        inputs: ``{name: normaliser}`` of the input functions with values, ``(c_l,)`` each
            (submodules ``input_<name>``, so any identifier is a valid name).
        theta: ``(p,)`` or ``None``.
    """

    def __init__(self, query: UnitGaussianNormalizer, target: UnitGaussianNormalizer,
                 inputs: Mapping[str, UnitGaussianNormalizer],
                 theta: UnitGaussianNormalizer | None, eps: float = NORMALIZER_EPS) -> None:
        super().__init__()
        components = (("query", query), ("target", target), ("theta", theta),
                      *((f"inputs[{k!r}]", v) for k, v in inputs.items()))
        for name, norm in components:
            if norm is not None and not isinstance(norm, UnitGaussianNormalizer):
                raise TypeError(f"{name}: expected a UnitGaussianNormalizer, got "
                                f"{type(norm).__name__}")
            if norm is not None and norm.mean.ndim != 1:
                raise ValueError(f"{name}: expected per-channel statistics of shape (c,), got "
                                 f"{tuple(norm.mean.shape)}")
        eps = check_float(eps, "eps")
        # The state dict records one eps for all (from_state_dict gives it to each): another
        # one here would encode otherwise once saved and loaded.
        for name, norm in components:
            if norm is not None and norm.eps != eps:
                raise ValueError(f"{name}: its eps {norm.eps:g} is not eps = {eps:g}, which "
                                 "these normalisers share")
        self.query = query
        self.target = target
        self._input_names = list(inputs)
        for name, norm in inputs.items():
            self.add_module(f"input_{name}", norm)
        self.theta = theta
        self.register_buffer("eps", torch.tensor(eps, dtype=torch.float64))

    @classmethod
    def fit(cls, data: RaggedArrays, eps: float = NORMALIZER_EPS) -> RaggedNormalizers:
        """Fit on the (training) samples ``data`` (from :func:`~.ragged.read_ragged` with the
        fields query, target, inputs and theta)."""
        if not isinstance(data, RaggedArrays):
            raise TypeError(f"data: expected RaggedArrays, got {type(data).__name__}")
        if data.query_points is None or data.target is None:
            raise ValueError("data: the query points and targets must have been read")
        if len(data) < 2:
            raise ValueError(f"data: fitting unbiased statistics needs >= 2 training samples, "
                             f"got {len(data)}")

        def z(values: np.ndarray, offsets: np.ndarray, name: str) -> UnitGaussianNormalizer:
            # (found here, the point row maps to its sample: the normaliser sees rows only)
            bad = ~np.isfinite(values).reshape(len(values), -1).all(axis=1)
            if bad.any():
                j = int(np.searchsorted(offsets, np.argmax(bad), side="right")) - 1
                raise ValueError(f"data: {name} of sample {int(data.indices[j])} has NaN or "
                                 "infinity")
            return UnitGaussianNormalizer(torch.from_numpy(values), eps, correction=1)

        inputs = {}
        for spec in data.layout.inputs:
            if spec.channels:
                if spec.name not in data.inputs:
                    raise ValueError(f"data: the input function {spec.name!r} was not read")
                fn = data.inputs[spec.name]
                assert fn.values is not None
                inputs[spec.name] = z(fn.values, fn.offsets, f"inputs/{spec.name}/values")
        per_sample = np.arange(len(data) + 1)
        theta = None if data.theta is None else z(data.theta, per_sample, "theta")
        target = z(data.target, data.offsets, "target/values")
        # A constant channel normalises to 0 everywhere: its relative error (the loss, on
        # normalised values) is x / 0 in every sample, an inf loss at the first step.
        constant = (target.std == 0).nonzero()
        if len(constant):
            name = data.layout.target_names[int(constant[0])]
            raise ValueError(f"data: target channel {name!r} has one value at every point of "
                             f"the {len(data)} samples fitted on, so its relative error (the "
                             "loss, on normalised values) is undefined; leave it out of the "
                             "targets or fit on samples where it varies")
        return cls(z(data.query_points, data.offsets, "query/points"), target, inputs, theta,
                   eps)

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Tensor]) -> RaggedNormalizers:
        """Rebuild from a :meth:`state_dict` (e.g. saved in a checkpoint)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state: expected a state dict, got {type(state).__name__}")
        for key in ("query.mean", "query.std", "target.mean", "target.std", "eps"):
            if key not in state:
                raise KeyError(f"state: missing {key!r}; not a RaggedNormalizers state dict "
                               f"(keys: {sorted(state)})")
        eps: Tensor | float = state["eps"]
        if isinstance(eps, Tensor):
            if eps.numel() != 1:
                raise ValueError(f"state['eps']: expected one number, got shape "
                                 f"{tuple(eps.shape)}")
            eps = eps.item()
        eps = check_float(eps, "state['eps']")  # > 0, as the constructor's

        def norm(prefix: str) -> UnitGaussianNormalizer:
            if f"{prefix}.std" not in state:
                raise KeyError(f"state: missing {prefix + '.std'!r}")
            return UnitGaussianNormalizer.from_statistics(state[f"{prefix}.mean"],
                                                          state[f"{prefix}.std"], eps)

        names = sorted({k.split(".")[0][len("input_"):] for k in state
                        if k.startswith("input_")})
        theta = norm("theta") if "theta.mean" in state else None
        return cls(norm("query"), norm("target"), {k: norm(f"input_{k}") for k in names},
                   theta, eps)

    @classmethod
    def from_config(cls, config: Mapping[str, Mapping[str, Any]],
                    eps: float = NORMALIZER_EPS) -> RaggedNormalizers:
        """Rebuild from ``{name: {'mean': [...], 'std': [...], 'eps': ...}}`` over the names
        of :meth:`named` (as the examples store them in their run configuration, so that a
        checkpoint says how to normalise). ``eps``: for records without one (written before
        2026-11-30); the records' own, one for all, where they have it."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config: expected a dict of statistics, got {type(config).__name__}")
        eps = check_float(eps, "eps")
        state: dict[str, Tensor] = {}
        recorded = set()
        for name, stats in config.items():
            state[f"{name}.mean"], state[f"{name}.std"] = recorded_statistics(
                stats, f"config[{name!r}]")
            # (> 0, as the constructor takes it: 0 failed there under another name)
            recorded.add(check_float(recorded_eps(stats, f"config[{name!r}]", eps),
                                     f"config[{name!r}]['eps']"))
        if len(recorded) > 1:
            raise ValueError(f"config: its normalisers record different eps {sorted(recorded)}; "
                             "these normalisers share one")
        state["eps"] = torch.tensor(recorded.pop() if recorded else eps, dtype=torch.float64)
        return cls.from_state_dict(state)

    def named(self) -> dict[str, UnitGaussianNormalizer]:
        """Every normaliser by its name in :meth:`state_dict`: ``query``, ``target``,
        ``input_<name>`` per input function with values, ``theta`` if there is one."""
        named = {"query": self.query, "target": self.target,
                 **{f"input_{k}": v for k, v in self.inputs.items()}}
        if self.theta is not None:
            named["theta"] = self.theta
        return named

    @property
    def inputs(self) -> dict[str, UnitGaussianNormalizer]:
        """``{name: normaliser}`` of the input functions with values."""
        return {name: getattr(self, f"input_{name}") for name in self._input_names}

    def check_layout(self, layout: RaggedLayout) -> None:
        """Refuse normalisers that do not fit the samples of ``layout``."""
        problems = []
        if self.query.mean.shape[0] != layout.space_dim:
            problems.append(f"coordinates: {self.query.mean.shape[0]} vs {layout.space_dim}")
        if self.target.mean.shape[0] != layout.out_dim:
            problems.append(f"target channels: {self.target.mean.shape[0]} vs "
                            f"{layout.out_dim}")
        with_values = {s.name: s.channels for s in layout.inputs if s.channels}
        mine = {k: int(v.mean.shape[0]) for k, v in self.inputs.items()}
        if mine != with_values:
            problems.append(f"input values {mine} vs {with_values}")
        p = 0 if self.theta is None else int(self.theta.mean.shape[0])
        if p != layout.theta_dim:
            problems.append(f"theta components: {p} vs {layout.theta_dim}")
        if problems:
            raise ValueError(f"normalizers: fitted on other data than this file holds "
                             f"({'; '.join(problems)}; normalisers first)")


# -- dataset ------------------------------------------------------------------------------------


def _segment_normalize(w: np.ndarray, offsets: np.ndarray, what: str) -> np.ndarray:
    """``w`` divided by its sum over each sample's rows (every sample has >= 1 row)."""
    sums = np.add.reduceat(w, offsets[:-1])
    if not (sums > 0).all():
        raise DataFileError(f"{what}: sample {int(np.flatnonzero(~(sums > 0))[0])} has weights "
                            "that do not sum to a positive number")
    return w / np.repeat(sums, np.diff(offsets))


def _uniform(offsets: np.ndarray) -> np.ndarray:
    counts = np.diff(offsets)
    return np.repeat(1.0 / counts, counts)


class RaggedDataset(Dataset):
    """Samples of a ragged file (:mod:`.ragged`), normalised (see module doc for the items).

    Args:
        path: a complete file of :func:`~.ragged.write_ragged` (e.g. ``generate heat``).
        split: ``"train"`` (the first ``n_train`` samples), ``"test"`` (the last ``n_test``)
            or a sequence of sample indices.
        n_train: the training split; needed to fit the normalisers (unless ``normalizers`` is
            given) and for ``split="train"``.  A ``"test"`` split must not overlap it: a file
            of evaluation samples only is read without it (or with 0) and with the training
            set's ``normalizers``.
        n_test: the size of the ``"test"`` split.
        normalizers: saved :class:`RaggedNormalizers` (or their ``state_dict``) to use instead
            of fitting (e.g. for a refined evaluation file); not modified.
        weights: ``"mesh"`` (the stored lumped areas / curve weights) or ``"uniform"``
            (``1/N``), normalised to sum to 1 over each sample's points (query points and
            each input function).
        normalize_inputs: normalise the input functions' coordinates (by the query map) and
            values; ``False`` keeps them raw, as the reference code does.
        generator: the generator(s) the file must come from (e.g. ``"heat"``); ``None`` takes
            any ragged file.
        dtype: floating dtype of the items (the normalisation runs in float64).

    Attributes: ``normalizers``, ``layout``, ``indices`` (file indices), ``lengths`` (``N``
    per item), ``input_lengths`` (``{name: M per item}``), ``space_dim``, ``query_dim``,
    ``input_dims`` (``b_l = d + c_l``), ``out_dim``, ``theta_dim``, ``input_names``,
    ``target_names``, ``info`` (the file's metadata), and ``collate_fn``
    (:func:`collate_ragged`, which the :class:`~galerkin_ext.training.Trainer` and a
    ``DataLoader`` use to pad batches).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str | Sequence[int] | np.ndarray = "train",
        *,
        n_train: int | None = None,
        n_test: int | None = None,
        normalizers: RaggedNormalizers | Mapping[str, Tensor] | None = None,
        weights: str = "mesh",
        normalize_inputs: bool = True,
        generator: str | Sequence[str] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path: expected the path of a ragged .h5 file, got "
                            f"{type(path).__name__}")
        if not Path(path).is_file():
            raise FileNotFoundError(f"path: no such file {str(path)!r}")
        check_choice(weights, "weights", WEIGHTINGS)
        check_bool(normalize_inputs, "normalize_inputs")
        check_float_dtype(dtype)
        info = read_header(path)
        if generator is not None:
            wanted = (generator,) if isinstance(generator, str) else (
                tuple(generator) if isinstance(generator, Sequence) else ())
            if not wanted or not all(isinstance(g, str) for g in wanted):
                raise TypeError(f"generator: expected a generator's name or a sequence of "
                                f"names, got {generator!r}")
            if info["generator"] not in wanted:
                raise DataFileError(f"path {str(path)!r} holds {info['generator']} data, "
                                    f"expected {' or '.join(wanted)} data")
        if not info["complete"]:
            raise DataFileError(f"path {str(path)!r} is incomplete ({info['n_done']} of "
                                f"{info['n_samples']} samples); finish it with resume")
        layout: RaggedLayout = info["layout"]
        n = info["n_samples"]
        if n_train is not None:
            n_train = check_int(n_train, "n_train", 0)
            if n_train > n:
                raise DataMismatchError(f"n_train: the file has {n} samples, fewer than {n_train}")
        if n_test is not None:
            n_test = check_int(n_test, "n_test")
            if n_test > n:
                raise DataMismatchError(f"n_test: the file has {n} samples, fewer than {n_test}")
        idx = self._split(split, n, n_train, n_test, fitting=normalizers is None)
        if weights == "mesh":
            missing = ([] if layout.query_weights else ["query"]) + [
                s.name for s in layout.inputs if not s.weights]
            if missing:
                raise DataMismatchError(f"weights: 'mesh' needs stored weights, but the file "
                                        f"has none for {missing}; use weights='uniform' "
                                        "(the example scripts' --weights uniform)")
        data = read_ragged(path, idx, fields=("query", "target", "inputs", "theta"))
        if normalizers is None:
            assert n_train is not None
            train = data if np.array_equal(idx, np.arange(n_train)) else read_ragged(
                path, np.arange(n_train), fields=("query", "target", "inputs", "theta"))
            try:
                normalizers = RaggedNormalizers.fit(train)
            except ValueError as err:  # non-finite values, which only an edited file holds
                raise DataFileError(f"path {str(path)!r}: {err}") from err
        elif isinstance(normalizers, Mapping):
            normalizers = RaggedNormalizers.from_state_dict(normalizers)
        elif not isinstance(normalizers, RaggedNormalizers):
            raise TypeError(f"normalizers: expected RaggedNormalizers, its state_dict or None, "
                            f"got {type(normalizers).__name__}")
        else:
            normalizers = copy.deepcopy(normalizers)  # .to() below works in place
        normalizers.check_layout(layout)
        norm = normalizers.to(torch.float64)
        self.normalizers = norm
        self.layout = layout
        self.info = {k: v for k, v in info.items() if k != "layout"}
        self.indices = idx
        self.weights = weights
        self.normalize_inputs = normalize_inputs
        self.dtype = dtype

        def t(a: np.ndarray) -> Tensor:
            return torch.from_numpy(np.ascontiguousarray(a))

        assert data.query_points is not None and data.target is not None
        self._offsets = data.offsets
        self._x = norm.query.encode(t(data.query_points)).to(dtype)
        self._y = norm.target.encode(t(data.target)).to(dtype)
        w = (_segment_normalize(data.query_weights, data.offsets, "query/weights")
             if weights == "mesh" and data.query_weights is not None else _uniform(data.offsets))
        self._w = t(w).to(dtype)
        self._label = None if data.query_label is None else t(data.query_label).long()
        self._inputs: list[tuple[np.ndarray, Tensor, Tensor]] = []
        for spec in layout.inputs:
            fn = data.inputs[spec.name]
            coords = t(fn.points)
            values = None if fn.values is None else t(fn.values)
            if normalize_inputs:
                coords = norm.query.encode(coords)
                if values is not None:
                    values = norm.inputs[spec.name].encode(values)
            feats = coords if values is None else torch.cat([coords, values], dim=1)
            iw = (_segment_normalize(fn.weights, fn.offsets, f"inputs/{spec.name}/weights")
                  if weights == "mesh" and fn.weights is not None else _uniform(fn.offsets))
            self._inputs.append((fn.offsets, feats.to(dtype), t(iw).to(dtype)))
        # (cast: check_layout matched the theta normaliser to the layout's theta_dim)
        self._theta = (None if data.theta is None else
                       cast(UnitGaussianNormalizer, norm.theta).encode(t(data.theta)).to(dtype))
        self.lengths = data.lengths
        self.input_lengths = {s.name: np.diff(off) for s, (off, _, _) in
                              zip(layout.inputs, self._inputs, strict=True)}

    @staticmethod
    def _split(split: object, n: int, n_train: int | None, n_test: int | None,
               fitting: bool) -> np.ndarray:
        if fitting and n_train is None:
            raise ValueError("n_train: needed to fit the normalisers on the training split "
                             "(or pass the training set's normalizers)")
        if fitting and n_train is not None and n_train < 2:
            raise ValueError(f"n_train: fitting the normalisers needs >= 2 training samples, "
                             f"got {n_train}")
        if isinstance(split, str):
            check_choice(split, "split", ("train", "test"))
            if split == "train":
                if not n_train:
                    raise ValueError(f"n_train: expected >= 1 for split='train', got {n_train}")
                return np.arange(n_train)
            if n_test is None:
                raise ValueError("n_test: needed for split='test'")
            return evaluation_indices(n, {"n_train": n_train or 0}, "n_test", n_test)
        idx = np.asarray(split)
        if isinstance(split, Mapping) or idx.ndim != 1 or idx.size == 0 or (
            idx.dtype == np.bool_ or idx.dtype.kind not in "iu"
        ):
            raise ValueError("split: expected 'train', 'test' or a non-empty sequence of "
                             "sample indices")
        if idx.min() < 0 or idx.max() >= n or np.unique(idx).size != idx.size:
            raise ValueError(f"split: expected distinct sample indices in [0, {n})")
        return idx.astype(np.int64)

    # -- sizes for model construction --
    @property
    def space_dim(self) -> int:
        return self.layout.space_dim

    @property
    def query_dim(self) -> int:
        return self.layout.space_dim

    @property
    def input_dims(self) -> list[int]:
        return [self.layout.space_dim + s.channels for s in self.layout.inputs]

    @property
    def out_dim(self) -> int:
        return self.layout.out_dim

    @property
    def theta_dim(self) -> int:
        return self.layout.theta_dim

    @property
    def input_names(self) -> list[str]:
        return list(self.layout.input_names)

    @property
    def target_names(self) -> list[str]:
        return list(self.layout.target_names)

    def decode_target(self, y: Tensor) -> Tensor:
        """Undo the target normalisation of ``y (..., o)`` (predictions or targets)."""
        return self.normalizers.target.to(y.device).decode(y)  # our own copy: .to is safe

    @staticmethod
    def collate_fn(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """:func:`collate_ragged`: a padded batch of this dataset's items."""
        return collate_ragged(items)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = check_index(i, len(self))
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        item: dict[str, Any] = {
            "x": self._x[a:b],
            "weight": self._w[a:b],
            "target": self._y[a:b],
            "inputs": [f[int(o[i]) : int(o[i + 1])] for o, f, _ in self._inputs],
            "input_weights": [w[int(o[i]) : int(o[i + 1])] for o, _, w in self._inputs],
            "theta": None if self._theta is None else self._theta[i],
            "index": int(self.indices[i]),
        }
        if self._label is not None:
            item["label"] = self._label[a:b]
        return item


# -- collation ----------------------------------------------------------------------------------


def _check_item(item: object, j: int, first: Mapping[str, Any] | None) -> None:
    where = f"items[{j}]"
    if not isinstance(item, Mapping):
        raise TypeError(f"{where}: expected a dict of RaggedDataset, got {type(item).__name__}")
    for key in ("x", "weight", "target", "inputs", "input_weights"):
        if key not in item:
            raise KeyError(f"{where}: missing {key!r} (keys: {sorted(item)})")
    x, w, y = item["x"], item["weight"], item["target"]
    for key, t, nd in (("x", x, 2), ("weight", w, 1), ("target", y, 2)):
        if not isinstance(t, Tensor) or t.ndim != nd or not t.is_floating_point():
            raise TypeError(f"{where}: {key}: expected a floating tensor of rank {nd}, got "
                            f"{getattr(t, 'dtype', type(t).__name__)} "
                            f"{tuple(getattr(t, 'shape', ()))}")
    n = x.shape[0]
    if n < 1 or w.shape != (n,) or y.shape[0] != n:
        raise ValueError(f"{where}: expected x (N, d), weight (N,), target (N, o) with N >= 1, got "
                         f"{tuple(x.shape)}, {tuple(w.shape)}, {tuple(y.shape)}")
    inputs, iws = item["inputs"], item["input_weights"]
    if not isinstance(inputs, list | tuple) or not isinstance(iws, list | tuple) or len(
        inputs) != len(iws):
        raise TypeError(f"{where}: inputs and input_weights: expected lists of equal length")
    for l_, (f, iw) in enumerate(zip(inputs, iws, strict=True)):
        if not isinstance(f, Tensor) or f.ndim != 2 or f.shape[0] < 1 or not isinstance(
            iw, Tensor) or iw.shape != (f.shape[0],):
            raise ValueError(f"{where}: inputs[{l_}]: expected (M, b) with M >= 1 and "
                             f"input_weights[{l_}] (M,), got "
                             f"{tuple(getattr(f, 'shape', ()))}, "
                             f"{tuple(getattr(iw, 'shape', ()))}")
        if f.dtype != x.dtype or iw.dtype != x.dtype:  # (padding would cast them silently)
            raise TypeError(f"{where}: inputs[{l_}], input_weights[{l_}]: expected x's dtype "
                            f"{x.dtype}, got {f.dtype} and {iw.dtype}")
    if w.dtype != x.dtype or y.dtype != x.dtype:
        raise TypeError(f"{where}: weight, target: expected x's dtype {x.dtype}, got {w.dtype} "
                        f"and {y.dtype}")
    if first is None:
        return
    if x.dtype != first["x"].dtype:
        raise TypeError(f"{where}: x is {x.dtype}, items[0]'s {first['x'].dtype}")
    if x.shape[1] != first["x"].shape[1] or y.shape[1] != first["target"].shape[1]:
        raise ValueError(f"{where}: x/target have {x.shape[1]}/{y.shape[1]} columns, items[0] "
                         f"{first['x'].shape[1]}/{first['target'].shape[1]}")
    if len(inputs) != len(first["inputs"]) or any(
        f.shape[1] != g.shape[1] for f, g in zip(inputs, first["inputs"], strict=True)
    ):
        raise ValueError(f"{where}: its input functions differ in number or width from "
                         "items[0]'s (a missing input function?)")
    if (item.get("theta") is None) != (first.get("theta") is None) or (
        item.get("theta") is not None and item["theta"].shape != first["theta"].shape
    ):
        raise ValueError(f"{where}: theta differs in presence or shape from items[0]'s")
    if ("label" in item) != ("label" in first):
        raise ValueError(f"{where}: has a label where items[0] has none, or vice versa")


def collate_ragged(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pad a list of :class:`RaggedDataset` items to a batch (``collate_fn`` of a DataLoader).

    Every set is padded to its batch maximum with zeros and weight 0.  Returns::

        {"x": (B, N_max, d), "weight": (B, N_max) (each row sums to 1 over its valid points),
         "mask": bool (B, N_max), "target": (B, N_max, o), "lengths": int64 (B,),
         "inputs": [(B, M_l_max, b_l)], "input_weights": [(B, M_l_max)],
         "input_mask": [bool (B, M_l_max)], "input_lengths": [int64 (B,)],
         "theta": (B, p) or None, "index": int64 (B,), "label": int64 (B, N_max) if present}
    """
    if isinstance(items, Mapping) or not isinstance(items, Sequence) or len(items) == 0:
        raise ValueError("items: expected a non-empty list of RaggedDataset items")
    for j, item in enumerate(items):
        _check_item(item, j, items[0] if j else None)

    def lengths(ts: list[Tensor]) -> Tensor:
        return torch.tensor([t.shape[0] for t in ts], dtype=torch.int64)

    def mask(n: Tensor) -> Tensor:
        return torch.arange(int(n.max())) < n[:, None]

    def pad(ts: list[Tensor]) -> Tensor:
        return pad_sequence(ts, batch_first=True, padding_value=0)

    n = lengths([it["x"] for it in items])
    batch: dict[str, Any] = {
        "x": pad([it["x"] for it in items]),
        "weight": pad([it["weight"] for it in items]),
        "mask": mask(n),
        "target": pad([it["target"] for it in items]),
        "lengths": n,
        "inputs": [],
        "input_weights": [],
        "input_mask": [],
        "input_lengths": [],
        "theta": None if items[0].get("theta") is None else torch.stack(
            [it["theta"] for it in items]),
        "index": torch.tensor([int(it.get("index", -1)) for it in items], dtype=torch.int64),
    }
    for l_ in range(len(items[0]["inputs"])):
        feats = [it["inputs"][l_] for it in items]
        m = lengths(feats)
        batch["inputs"].append(pad(feats))
        batch["input_weights"].append(pad([it["input_weights"][l_] for it in items]))
        batch["input_mask"].append(mask(m))
        batch["input_lengths"].append(m)
    if "label" in items[0]:
        batch["label"] = pad([it["label"] for it in items])
    return batch


def batch_to(batch: Mapping[str, Any], device: torch.device | str,
             non_blocking: bool = False) -> dict[str, Any]:
    """A collated batch with every tensor (also inside the lists) on ``device``."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch: expected a dict from collate_ragged, got {type(batch).__name__}")

    def move(v: Any) -> Any:
        if isinstance(v, Tensor):
            return v.to(device, non_blocking=non_blocking)
        if isinstance(v, list | tuple):
            return [move(u) for u in v]
        return v

    return {k: move(v) for k, v in batch.items()}


# -- sampler ------------------------------------------------------------------------------------


def padding_fraction(lengths: Sequence[int] | np.ndarray,
                     batches: Sequence[Sequence[int]]) -> float:
    """Share of padded slots when each batch is padded to its longest sample:
    ``1 - Σ N / Σ_batches |batch| · max N``."""
    n = np.asarray(lengths)
    if n.ndim != 1 or (n.size and (n.dtype.kind not in "iu" or (n < 0).any())):
        raise ValueError(f"lengths: expected a sequence of sample sizes N >= 0, got {lengths!r}")
    for i, batch in enumerate(batches):
        if isinstance(batch, str) or not isinstance(batch, Sequence | np.ndarray) or any(
            isinstance(j, bool) or not isinstance(j, numbers.Integral) or not 0 <= j < len(n)
            for j in batch
        ):
            raise ValueError(f"batches[{i}]: expected indices in [0, {len(n)}), got "
                             f"{list(batch)!r}")
    total = sum(len(b) * int(n[list(b)].max()) for b in batches if len(b))
    return 0.0 if total == 0 else 1.0 - sum(int(n[list(b)].sum()) for b in batches) / total


class SizeBucketSampler(Sampler[list[int]]):
    """Batches of samples of similar size ``N`` (a ``batch_sampler`` for a DataLoader).

    Each epoch: shuffle all indices, cut them into buckets of ``bucket`` samples (rounded up
    to a multiple of ``batch_size``; default ``50 · batch_size``), sort each bucket by ``N``,
    cut it into batches, shuffle the batches.  Every index appears exactly once per epoch
    (with ``drop_last``, the one incomplete batch is left out).  The order depends on
    ``(seed, epoch)`` only: :meth:`set_epoch` before each epoch reproduces a run (without it
    the epoch counter advances by one per pass gone through to its end).  The padding fraction
    of the last epoch (:func:`padding_fraction`) is kept in ``last_padding_fraction`` and
    logged at INFO.
    """

    def __init__(self, lengths: Sequence[int] | np.ndarray, batch_size: int,
                 bucket: int | None = None, seed: int = 0, drop_last: bool = False) -> None:
        n = np.asarray(lengths)
        if n.ndim != 1 or n.size == 0 or n.dtype == np.bool_ or n.dtype.kind not in "iu":
            raise ValueError("lengths: expected a non-empty 1-D sequence of ints (N per sample)")
        if (n < 1).any():
            raise ValueError("lengths: expected every sample to have N >= 1 points")
        self.lengths = n.astype(np.int64)
        self.batch_size = check_int(batch_size, "batch_size")
        bucket = 50 * self.batch_size if bucket is None else check_int(bucket, "bucket")
        self.bucket = -(-bucket // self.batch_size) * self.batch_size
        self.seed = check_int(seed, "seed", 0)
        check_bool(drop_last, "drop_last")
        self.drop_last = drop_last
        self.epoch = 0
        self.last_padding_fraction: float | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iteration gives."""
        self.epoch = check_int(epoch, "epoch", 0)

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches of ``epoch``, in order."""
        rng = np.random.default_rng([self.seed, check_int(epoch, "epoch", 0)])
        perm = rng.permutation(self.lengths.size)
        out: list[list[int]] = []
        for start in range(0, perm.size, self.bucket):
            chunk = perm[start : start + self.bucket]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            out.extend(chunk[i : i + self.batch_size].tolist()
                       for i in range(0, chunk.size, self.batch_size))
        if self.drop_last and len(out[-1]) < self.batch_size:
            out.pop()
        order = rng.permutation(len(out))
        return [out[i] for i in order]

    def __iter__(self) -> Iterator[list[int]]:
        # The epoch advances at the end of a pass, not when an iterator is made: a DataLoader
        # with workers makes two on its first pass and drops the first (which had advanced it,
        # so every epoch ran the next one's order).
        epoch = self.epoch
        batches = self.batches(epoch)
        self.last_padding_fraction = padding_fraction(self.lengths, batches)
        log.info("SizeBucketSampler epoch %d: padding fraction %.3f", epoch,
                 self.last_padding_fraction)
        yield from batches
        if self.epoch == epoch:  # (unless set_epoch chose another meanwhile)
            self.epoch = epoch + 1

    def __len__(self) -> int:
        full, rest = divmod(self.lengths.size, self.batch_size)
        return full + (rest > 0 and not self.drop_last)
