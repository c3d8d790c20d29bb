"""The training loop of the paper's protocol (SPEC §5), with exact resume and data or domain
parallelism.

:class:`Trainer` runs Adam (AdamW with ``weight_decay``) with a OneCycle learning rate stepped
per batch (or ``ReduceLROnPlateau`` on the evaluation error, stepped per epoch, the
continuum-attention protocol), gradient clipping by norm and/or by value, an evaluation (mean
per-sample relative L2, or another per-sample ``metric``) after every epoch, optional early
stopping, and keeps in ``out_dir``:

* ``last.pt`` -- everything to resume exactly (model, optimiser, scheduler, every process's RNG
  states, epoch, history), written atomically after each epoch;
* ``best.pt`` -- the model of the epoch with the lowest evaluation error;
* ``metrics.csv`` -- one row per epoch (rewritten atomically from the history);
* ``tensorboard/`` -- with ``TrainConfig.tensorboard`` (needs the ``tensorboard`` package):
  ``step/loss`` at every step, ``epoch/*`` at each epoch's last step; a resumption hides what
  the stopped run logged after its ``last.pt``.

Resuming after any interruption (even ``kill -9`` mid-epoch) restarts the interrupted epoch from
``last.pt``; the shuffling order comes from ``(seed, epoch)`` and dropout from the restored RNG
states, so the resumed run computes exactly what the uninterrupted one would have. Runs of
different seeds draw unrelated shuffles and, process by process, unrelated generators (the seed
is spread over the streams, not added to the epoch or the rank).

Batches are dicts of tensors, as the datasets of :mod:`galerkin_ext.data` give them (a
dataset's ``collate_fn`` attribute, e.g. the ragged sets' padding, batches its samples; else
PyTorch's stacking). ``forward(model, batch)`` maps one to the prediction (default
:func:`default_forward`: ``'x'`` and ``'grid'``) and ``loss_fn`` returns ``(loss, parts)`` like
:class:`~galerkin_ext.losses.OperatorLoss`. Keys the loop reads itself: ``'target'``
(required), ``'target_grad'`` and ``'coeff'`` (passed to ``loss_fn`` when present), ``'mask'``
(a padded ragged batch: ``loss_fn(pred, target, mask=...)``, and the default metric masks) and
``'weight'`` (passed with ``'mask'`` to a loss whose ``weighted`` is True).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Subset,
    default_collate,
)
from tqdm.auto import tqdm

from .._checks import (
    cannot_make_folder,
    cannot_write_in,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_path,
    resolve_device,
)
from .._locks import file_lock
from ..data.gnot_datasets import batch_to
from ..domain import sum_gradients
from ..losses import masked_relative_l2, relative_l2
from ..models.registry import _recorded_arguments
from .checkpoint import (
    CheckpointError,
    _check_loadable,
    _load_weights,
    load_checkpoint,
    save_checkpoint,
    stray_temporary_files,
    write_csv,
)
from .distributed import DistributedContext, launch_place

__all__ = [
    "ConfigError",
    "NonFiniteLossError",
    "TrainConfig",
    "Trainer",
    "default_forward",
    "evaluate",
    "per_sample_errors",
    "predict",
    "relative_l2_metric",
]

Batch = dict[str, Tensor]
Forward = Callable[[nn.Module, Batch], Tensor]
# metric(pred, batch) -> (B,) per-sample errors
Metric = Callable[[Tensor, Batch], Tensor]
_PRECISIONS = ("fp32", "bf16")
_SCHEDULERS = ("onecycle", "plateau")
# torch seeds 64-bit generators with the shuffling's seed + epoch: this bound leaves room for
# it (the streams' seeds below stay under it).
_SEED_LIMIT = 2**63
# Added to the epoch and to the rank, seed 1's shuffles were seed 0's one epoch on, and in
# several processes seed 1's rank 0 drew seed 0's rank 1 dropout: runs meant as independent
# repeats were not. The shuffling's seed is now spread by this odd multiplier (a bijection
# modulo 2**63), and the other ranks' seeds hashed from (seed, rank); seed 0's shuffles and
# every run's rank 0 keep their streams.
_SPREAD = 0x9E3779B97F4A7C15
# Checkpoints record it (``seeding``); a run begun without it shuffles on as it began, with
# seed + epoch.
_SEEDING = 2


def _shuffle_seed(seed: int, seeding: int = _SEEDING) -> int:
    """The seed of the training set's shuffling (``DistributedSampler``, which adds the
    epoch) in a run seeded ``seed``."""
    return seed if seeding < 2 else seed * _SPREAD % _SEED_LIMIT


def _process_seed(seed: int, rank: int) -> int:
    """The seed of the generators of process ``rank`` (its dropout, its dataset's draws)."""
    if rank == 0:
        return seed
    # (hashed, not spread linearly: seed + rank * _SPREAD was the shuffling seed of another
    # run's epoch)
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0]) % _SEED_LIMIT


# Settings that may change between a run and its resumption: they change neither the model, the
# data nor the schedule (compile and the thread count change the rounding only: the op core's
# CPU chunking follows the thread count); keys of the flattened run
# configuration (see Trainer._check_resumable).
_RESUMABLE_CHANGES = ("train.eval_batch_size", "train.num_workers", "train.progress",
                      "train.tensorboard", "train.compile", "threads")
# Top-level blocks of a run configuration that shape only the evaluation after training (the
# example scripts' zero-shot sets and rollouts): a resumption may change them as well, e.g. to
# evaluate a finished run on other grids.  Unlike the settings above they change what is
# measured, so a preset's thresholds no longer apply (see experiment.preset_unchanged).
_EVALUATION_BLOCKS = ("zero_shot", "rollout")
# Top-level records that checkpoints written before them lack: not compared with such a
# checkpoint (the experiment's name; the model's build, derived from settings compared anyway;
# the data files' identity, where the files' paths say which data instead; the Darcy scripts'
# normalisers, fitted on those data).
_LATER_RECORDS = ("experiment", "build", "data_identity", "normalizers")


def check_resumable_config(stored: Mapping[str, Any], current: Mapping[str, Any],
                           path: str | Path, *, partial: bool = False) -> None:
    """``CheckpointError`` unless the run configuration ``current`` equals the one ``stored``
    in the checkpoint ``path`` in every setting but those that change neither the model, the
    data nor the schedule (``_RESUMABLE_CHANGES``, and the blocks ``_EVALUATION_BLOCKS`` of
    settings used only after training).

    ``partial``: ``current`` is not complete yet (the example scripts check before their data
    exist, which add the normalisers and sample counts): settings it lacks are not compared.
    """
    if (stored.get("experiment") is not None and current.get("experiment") is not None
            and stored["experiment"] != current["experiment"]):  # not one setting among many
        raise CheckpointError(
            f"cannot resume from {str(path)!r}: it is a run of the {stored['experiment']!r} "
            f"experiment, this is {current['experiment']!r}; use another out_dir")
    build = stored.get("build")
    if (isinstance(build, Mapping) and isinstance(build.get("name"), str)
            and isinstance(build.get("arguments"), Mapping)):
        # a model recorded without a setting its record now names (a Darcy model's coarse grid)
        stored = {**stored, "build": {**build, "arguments": _recorded_arguments(
            build["name"], build["arguments"])}}
    old, new = _flatten(stored), _flatten(current)
    for record in _LATER_RECORDS:
        if record not in stored:
            new = {k: v for k, v in new.items() if k.split(".")[0] != record}
    # Normalisers recorded before their eps was (2026-11-30) are compared without it.
    new = {k: v for k, v in new.items()
           if k in old or not (k.startswith("normalizers.") and k.endswith(".eps"))}
    # A checkpoint written before a setting existed ran with its default.
    for field in dataclasses.fields(TrainConfig):
        old.setdefault(f"train.{field.name}", field.default)
    old.setdefault("parallel", "data")
    resumable = set(_RESUMABLE_CHANGES)
    if "data_identity" in stored:  # the data files' paths are a record
        resumable |= {"data_files.train", "data_files.eval"}
    keys = new.keys() if partial else old.keys() | new.keys()
    changed = sorted(k for k in keys if k not in resumable
                     and k.split(".")[0] not in _EVALUATION_BLOCKS and old.get(k) != new.get(k))
    if changed:
        raise CheckpointError(
            f"cannot resume from {str(path)!r}: the settings {changed} differ from the "
            f"checkpoint's (there { {k: old.get(k) for k in changed} }, now "
            f"{ {k: new.get(k) for k in changed} }); use the same settings or another out_dir"
        )


# What the example scripts write into a run's folder when it ends (experiment.write_metrics,
# the plots), removed when a new run starts afresh there.
_EARLIER_RESULTS = ("metrics.json", "prediction.png")


class ConfigError(ValueError):
    """The run's settings cannot work together or with its device, data, process count or
    installed packages; found before any epoch."""


def check_precision(precision: str, device: torch.device) -> None:
    """``ConfigError`` unless ``precision`` (``'fp32'`` or ``'bf16'``) can run on ``device``
    (bf16: CUDA with bfloat16)."""
    if precision == "bf16" and not (device.type == "cuda" and torch.cuda.is_bf16_supported()):
        raise ConfigError(f"precision: 'bf16' needs a CUDA device with bfloat16 support, got "
                          f"device {device}")


def tensorboard_writer_class() -> Any:
    """TensorBoard's ``SummaryWriter`` (``tensorboard=True``), or a ``ConfigError`` without
    the package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ConfigError("tensorboard=True (--tensorboard) needs the tensorboard package (the "
                          "tensorboard extra): pip install tensorboard") from err
    return SummaryWriter


class NonFiniteLossError(RuntimeError):
    """The training loss or gradient became NaN/inf; the last good checkpoint is kept."""


@dataclass
class TrainConfig:
    """Optimisation settings; defaults are the paper's 2-D protocol (SPEC §5).

    Attributes:
        epochs: passes over the training set (at most, with ``early_stopping``): the full
            batches of a shuffled pass, as in the original code (``drop_last``); the
            ``n_train mod batch_size`` samples left over, different ones every epoch, wait for
            the next.
        batch_size: global batch size, split evenly over the ``torchrun`` processes.
        max_lr, div_factor, final_div_factor, pct_start: the OneCycle schedule (Adam's learning
            rate starts at ``max_lr / div_factor``, rises to ``max_lr`` over the first
            ``pct_start`` of the steps and ends at ``max_lr / div_factor / final_div_factor``).
            A run of fewer than ``1 / pct_start`` steps in all (a smoke test) has a warm-up
            shorter than one step: torch's OneCycleLR then starts in its annealing phase, near
            ``max_lr`` (a warm-up of exactly one step: that step at the initial rate).
        scheduler: ``'onecycle'`` (above, stepped per batch) or ``'plateau'``
            (``ReduceLROnPlateau`` on the evaluation error, stepped per epoch: the rate starts
            at ``max_lr`` and is multiplied by ``plateau_factor`` once more than
            ``plateau_patience`` epochs in a row have not improved on the best error by 1e-4 of
            it, torch's rule; ``div_factor``, ``final_div_factor`` and ``pct_start`` are
            unused).
        plateau_factor, plateau_patience: see ``scheduler``.
        early_stopping: stop after this many epochs without a better evaluation error, any
            improvement counting (``None``: never).
        weight_decay: decoupled weight decay (AdamW) when ``> 0``; plain Adam at 0.
        grad_clip: maximum gradient 2-norm (``None``: no norm clipping).
        clip_value: clip every gradient entry to ``[-clip_value, clip_value]`` before the norm
            clipping (``None``: no value clipping).
        eval_batch_size: batch size of the evaluation (per process).
        precision: ``'fp32'`` or ``'bf16'`` (autocast of the forward pass, CUDA only; the loss,
            the evaluation and the weights stay in the model's precision).
        seed: seeds the shuffling (with the epoch) and the generators of each process (with
            its rank): torch's, NumPy's global one and Python's ``random``, all three saved in
            ``last.pt`` for an exact resume; below 2**63.
        num_workers: DataLoader worker processes. A resumption may change it; exactly so for
            datasets that draw no random numbers per sample (the package's own): a
            ``__getitem__`` that draws takes the main process's generators at 0 and the
            workers' (seeded from torch's) otherwise.
        progress: show a tqdm bar (rank 0 only).
        tensorboard: also log to ``out_dir/tensorboard`` (needs the ``tensorboard`` package).
        compile: run the training steps' forward and backward through ``torch.compile``
            (inductor) after a first step that waits for the compilation (10-40 s on a CPU).
            Padded batches of varying shapes (the ragged sets) compile once more for each
            size that first varies (torch's automatic dynamic shapes), then run at any size:
            1-2 more on GNOT's heat and elasticity sets. The evaluation and the checkpoints use
            the plain module; the numbers agree with an uncompiled run to round-off, not bit for
            bit (dropout included: its masks come from torch's generator, as in the plain run).
            On one CPU thread it did not pay on grids (the Burgers quick model ran 14.2 steps/s
            compiled against 16.0 plain, the Darcy quick model 1.44 against 1.96:
            benchmarks/table1.py --impls ours,ours_compiled) and made GNOT's quick epochs
            1.2-1.3x faster after 51-72 s of compiling (README).
    """

    epochs: int = 100
    batch_size: int = 4
    max_lr: float = 1e-3
    div_factor: float = 1e4
    final_div_factor: float = 1e4
    pct_start: float = 0.3
    scheduler: str = "onecycle"
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    early_stopping: int | None = None
    weight_decay: float = 0.0
    grad_clip: float | None = 0.999
    clip_value: float | None = None
    eval_batch_size: int = 16
    precision: str = "fp32"
    seed: int = 0
    num_workers: int = 0
    progress: bool = True
    tensorboard: bool = False
    compile: bool = False

    def __post_init__(self) -> None:
        # The checked values replace the given ones: a numpy scalar kept here would reach the
        # checkpoints, which torch.load(weights_only=True) does not read back.
        for name in ("epochs", "batch_size", "eval_batch_size"):
            setattr(self, name, check_int(getattr(self, name), name))
        for name in ("max_lr", "div_factor", "final_div_factor"):
            setattr(self, name, check_float(getattr(self, name), name))
        self.pct_start = _open_fraction(self.pct_start, "pct_start")
        self.scheduler = str(check_choice(self.scheduler, "scheduler", _SCHEDULERS))
        self.plateau_factor = _open_fraction(self.plateau_factor, "plateau_factor")
        self.plateau_patience = check_int(self.plateau_patience, "plateau_patience", 0)
        if self.early_stopping is not None:
            self.early_stopping = check_int(self.early_stopping, "early_stopping")
        self.weight_decay = check_float(self.weight_decay, "weight_decay", low_inclusive=True)
        for name in ("grad_clip", "clip_value"):
            if getattr(self, name) is not None:
                setattr(self, name, check_float(getattr(self, name), name))
        self.seed = check_int(self.seed, "seed", 0)
        if self.seed >= _SEED_LIMIT:
            raise ValueError(f"seed: expected an int >= 0 and < 2**63, got {self.seed}")
        self.num_workers = check_int(self.num_workers, "num_workers", 0)
        self.precision = str(check_choice(self.precision, "precision", _PRECISIONS))
        for name in ("progress", "tensorboard", "compile"):
            check_bool(getattr(self, name), name)


def _open_fraction(value: object, name: str) -> float:
    """``value`` as a float in (0, 1): OneCycleLR's warm-up share divides by the steps after
    it, ReduceLROnPlateau's factor must shrink the rate."""
    number = check_float(value, name)
    if number >= 1.0:
        raise ValueError(f"{name}: expected a finite float > 0 and < 1, got {value!r}")
    return number


def _check_out_dir(path: object) -> Path:
    """``path`` as the output folder's :class:`~pathlib.Path`; an empty one is refused, which
    ``Path`` would turn into the current folder."""
    folder = check_path(path, "out_dir")
    if not os.fspath(path):  # type: ignore[call-overload]
        raise ValueError("out_dir: expected a folder, got an empty path (pass '.' for the "
                         "current folder)")
    return folder


def _writable_dir(path: object) -> Path:
    """``path`` as a folder this process can write to (created if missing), checked now rather
    than after the first epoch."""
    folder = _check_out_dir(path)
    why = cannot_make_folder(folder) or cannot_write_in(folder)
    if why is not None:  # (a ConfigError: the example scripts end with its one line)
        raise ConfigError(f"out_dir: cannot write to {str(folder)!r} ({why})")
    return folder


def _check_recorded(run_config: Mapping[str, Any], recorded: Mapping[str, Any]) -> None:
    """``run_config`` may hold what the Trainer records (e.g. a checkpoint's config passed
    again, or a preset's ``train`` settings) only with the same values: another value would be
    overwritten, and a resumption would not compare the user's setting."""
    for key, value in recorded.items():
        given = run_config.get(key)
        if given is None:
            continue
        if key == "train" and isinstance(given, Mapping):
            for field, setting in given.items():
                if field in value and setting != value[field]:
                    raise ConfigError(f"run_config['train'][{field!r}]: {setting!r} differs "
                                      f"from the TrainConfig's {value[field]!r}")
        elif given != value:
            raise ConfigError(f"run_config[{key!r}]: {given!r} differs from what the Trainer "
                              f"records there, {value!r} (choose another key)")


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'model': {'norm': 'attn'}}`` -> ``{'model.norm': 'attn'}``; lists become tuples of
    their entries in row-major order and one-entry lists their entry, so that a normaliser's
    statistics recorded in their shape (a number for a scalar one) compare equal to the
    flattened lists that earlier checkpoints hold."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            entries = tuple(_entries(value)) if isinstance(value, list) else (value,)
            flat[name] = entries[0] if len(entries) == 1 else entries
    return flat


def _entries(values: list) -> Iterator[Any]:
    """The entries of nested lists, row-major."""
    for value in values:
        if isinstance(value, list):
            yield from _entries(value)
        else:
            yield value


def default_forward(model: nn.Module, batch: Batch) -> Tensor:
    """``model(batch['x'], batch['grid'][0])``: the datasets give every sample the same grid,
    so one copy of it is passed (the models broadcast it, which is cheaper than a batch).
    Samples on grids of their own are refused: pass ``forward=`` that hands the model the
    whole ``(B, ...)`` grid."""
    if "x" not in batch or "grid" not in batch:
        raise TypeError(f"batch: default_forward needs 'x' (the input values) and 'grid' (the "
                        f"points' coordinates), got the keys {sorted(batch)}; pass forward= "
                        "for other batches")
    grid = batch["grid"]
    # one comparison per batch: the loop already waits on every step's loss
    if grid.shape[0] > 1 and not torch.equal(grid, grid[:1].expand_as(grid)):
        raise ValueError("batch: default_forward passes the first sample's 'grid' for the whole "
                         "batch, but the samples' grids differ; pass forward=lambda model, "
                         "batch: model(batch['x'], batch['grid'])")
    return model(batch["x"], grid[0])


def _to(batch: Mapping[str, Any], device: torch.device) -> Batch:
    if not isinstance(batch, Mapping) or "target" not in batch:
        raise TypeError("batch: expected a dict of tensors with at least 'target' (see "
                        "galerkin_ext.training.trainer's module doc for the keys it reads)")
    return batch_to(batch, device, non_blocking=True)  # ragged batches hold lists of tensors


def _collate(dataset: Dataset) -> Callable[[list[Any]], Any] | None:
    """The dataset's own ``collate_fn`` (e.g. padding of ragged samples), looking through
    ``Subset``; ``None``: PyTorch's default stacking."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return getattr(dataset, "collate_fn", None)


def _check_dataset(dataset: object, name: str) -> Dataset:
    """A non-empty map-style dataset (its samples are shuffled, split and indexed by number)."""
    if not isinstance(dataset, Dataset) or isinstance(dataset, IterableDataset) or not hasattr(
            dataset, "__len__") or len(dataset) < 1:
        raise ValueError(f"{name}: expected a non-empty map-style torch Dataset (__len__ and "
                         f"__getitem__ by index), got {type(dataset).__name__}")
    return dataset


def _check_same_lengths(ctx: DistributedContext, **datasets: Dataset) -> None:
    """``ConfigError`` on every process unless each of ``datasets`` (by argument name) has as
    many samples on all processes: they split (or, domain-parallel, share) the samples by
    number, and unequal lengths reused or dropped samples silently, or left a process waiting
    for another's steps until the group's timeout."""
    if not ctx.enabled:
        return
    lengths: list[Any] = [None] * ctx.world_size
    # (cast: torch's Dataset declares no __len__; _check_dataset took map-style ones only)
    dist.all_gather_object(lengths, {name: len(cast(Sized, d)) for name, d in datasets.items()})
    for name in datasets:
        counts = [per_rank[name] for per_rank in lengths]
        if len(set(counts)) > 1:
            found = ", ".join(f"{n} on rank {rank}" for rank, n in enumerate(counts))
            raise ConfigError(f"{name}: every process needs the same samples, got {found}")


def _check_callables(**functions: object) -> None:
    """Each of ``functions`` (by argument name) callable."""
    for name, function in functions.items():
        if not callable(function):
            raise TypeError(f"{name}: expected a callable, got {type(function).__name__}")


def _loader(dataset: Dataset, batch_size: int, device: torch.device, **kwargs: Any) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, pin_memory=device.type == "cuda",
                      collate_fn=_collate(dataset), **kwargs)


def _default_metric(pred: Tensor, batch: Batch) -> Tensor:
    """Per-sample relative L2; over each sample's own points in a padded ragged batch (its
    ``'mask'``), the mean over the target channels, as :func:`masked_relative_l2` takes it."""
    if "mask" in batch:
        return masked_relative_l2(pred, batch["target"], batch["mask"], reduction="none").mean(1)
    return relative_l2(pred, batch["target"], reduction="none")


def relative_l2_metric(
    normalizer: nn.Module | None = None, *, weighted: bool = True, grid_key: str = "grid"
) -> Metric:
    """The continuum-attention metric as a ``metric(pred, batch) -> (B,)`` for
    :func:`evaluate`, :func:`per_sample_errors` and the :class:`Trainer`: per-sample relative
    L2 error of ``pred`` against ``batch['target']`` (SPEC-continuum §4).

    Args:
        normalizer: ``None`` (compare as they are) or the targets' normaliser (e.g. a
            :class:`~galerkin_ext.data.UnitGaussianNormalizer`): both are decoded first, so
            the error is in physical units.
        weighted: the norms carry the quadrature weights of the batch's points,
            :func:`~galerkin_ext.layers.auto_quadrature_weights` of ``batch[grid_key][0]``
            (trapezoid in 1-D, uniform on equispaced tensor grids, products of per-axis cell
            widths on other tensor grids), derived per batch so that every
            evaluation grid gets its own.
        grid_key: the batch's coordinates, ``(B, *grid, d)``, shared by the batch.
    """
    if normalizer is not None and not callable(getattr(normalizer, "decode", None)):
        raise TypeError(f"normalizer: expected None or an object with decode(), got "
                        f"{type(normalizer).__name__}")
    check_bool(weighted, "weighted")
    from ..layers.continuum import auto_quadrature_weights  # the TNO's own rule

    # A private copy that can follow the predictions to their device (Module.to is in place).
    # (Any: what it needs is decode(), which nn.Module.__getattr__ would type as Tensor | Module)
    norm: Any = copy.deepcopy(normalizer) if isinstance(normalizer, nn.Module) else normalizer

    def metric(pred: Tensor, batch: Batch) -> Tensor:
        target = batch["target"]
        if norm is not None:
            if isinstance(norm, nn.Module):
                norm.to(pred.device)
            pred, target = norm.decode(pred), norm.decode(target)
        weight = None
        if weighted:
            if grid_key not in batch:
                raise KeyError(f"grid_key: the batch has no {grid_key!r} (keys "
                               f"{sorted(batch)}) to derive quadrature weights from")
            coords = batch[grid_key][0]
            # in the coordinates' own dtype, as the model derives its weights: what counts
            # as equispaced depends on that precision
            flat = coords.reshape(-1, coords.shape[-1])
            weight = auto_quadrature_weights(flat, grid_key).reshape(coords.shape[:-1])
        return relative_l2(pred, target, reduction="none", weight=weight)

    return metric


def _batch_errors(model: nn.Module, batch: Any, device: torch.device, forward: Forward,
                  metric: Metric) -> Tensor:
    """``metric(forward(model, batch), batch)`` for one batch of a DataLoader, checked: one
    error per sample."""
    batch = _to(batch, device)
    err = metric(forward(model, batch), batch)
    if not isinstance(err, Tensor):
        raise TypeError(f"metric: expected a tensor of per-sample errors, got "
                        f"{type(err).__name__}")
    if err.shape != (batch["target"].shape[0],):
        raise ValueError(f"metric: expected one error per sample, shape "
                         f"({batch['target'].shape[0]},), got {tuple(err.shape)}")
    return err


@torch.no_grad()
def per_sample_errors(
    model: nn.Module,
    dataset: Dataset,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 16,
    forward: Forward = default_forward,
    metric: Metric = _default_metric,
    ctx: DistributedContext | None = None,
) -> Tensor:
    """``metric(forward(model, batch), batch)`` of every sample of ``dataset``: a float64
    ``(len(dataset),)`` CPU tensor in the dataset's order (for means, medians, maxima).

    ``metric`` defaults to the relative L2 error against ``batch['target']``, compared as it
    is (see :func:`relative_l2_metric` for physical units and quadrature weights).  Under
    ``torchrun`` pass ``ctx``: each process evaluates a disjoint share and every process gets
    all errors (``ConfigError`` if ``dataset`` holds another number of samples on some
    process).  In the model's precision, no autocast; ``model`` is put in ``eval()`` mode.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    _check_dataset(dataset, "dataset")
    check_int(batch_size, "batch_size")
    _check_callables(forward=forward, metric=metric)
    if ctx is not None and not isinstance(ctx, DistributedContext):
        raise TypeError(f"ctx: expected a DistributedContext or None, got {type(ctx).__name__}")
    dev = resolve_device(device)
    ctx = ctx or DistributedContext(device=dev)
    dev = ctx.device if ctx.enabled else dev
    _check_same_lengths(ctx, dataset=dataset)
    # (cast: torch's Dataset declares no __len__; _check_dataset took map-style ones only)
    indices = range(ctx.rank, len(cast(Sized, dataset)), ctx.world_size)
    shard = Subset(dataset, indices)
    model.eval()
    # Each process fills its own entries; the sum over processes assembles the whole vector.
    errors = torch.zeros(len(cast(Sized, dataset)), dtype=torch.float64, device=dev)
    done = 0
    for batch in _loader(shard, batch_size, dev, shuffle=False):
        err = _batch_errors(model, batch, dev, forward, metric)
        rows = torch.as_tensor(indices[done : done + err.numel()], device=dev)
        errors[rows] = err.double()
        done += err.numel()
    ctx.all_reduce_sum(errors)
    return errors.cpu()


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 16,
    forward: Forward = default_forward,
    metric: Metric = _default_metric,
    ctx: DistributedContext | None = None,
) -> float:
    """Mean per-sample relative L2 error of ``forward(model, batch)`` against ``batch['target']``
    (or the mean of another per-sample ``metric``, see :func:`per_sample_errors`).

    The model's outputs are compared as they are: the paper's models de-normalise inside, so
    this is the error in physical units.  Under ``torchrun`` pass ``ctx``: each process
    evaluates a disjoint share and the result is the mean over the whole ``dataset``.
    In the model's precision, no autocast; ``model`` is put in ``eval()`` mode.
    """
    return float(per_sample_errors(model, dataset, device=device, batch_size=batch_size,
                                   forward=forward, metric=metric, ctx=ctx).mean())


@torch.no_grad()
def predict(
    model: nn.Module,
    dataset: Dataset,
    indices: Sequence[int],
    *,
    device: torch.device | str = "cpu",
    forward: Forward = default_forward,
) -> tuple[Tensor, Batch]:
    """Predictions for ``dataset[indices]`` (e.g. for plots): ``(pred, batch)`` on the CPU.

    ``pred`` is what ``forward`` returns (half types as float32), in the units the model works
    in: physical for the Galerkin Transformer models (they de-normalise inside), normalised
    for the ragged GNOT models and their batches' targets (``dataset.decode_target`` gives
    physical units).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    _check_dataset(dataset, "dataset")
    _check_callables(forward=forward)
    dev = resolve_device(device)
    # (cast: torch's Dataset declares no __len__; _check_dataset took map-style ones only)
    size = len(cast(Sized, dataset))
    if not isinstance(indices, Sequence) or not indices or any(
        isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < size
        for i in indices
    ):
        raise ValueError(f"indices: expected a non-empty list of ints in [0, {size}), "
                         f"got {indices!r}")
    items = [dataset[int(i)] for i in indices]
    collate = _collate(dataset)
    batch = collate(items) if collate is not None else {
        k: torch.stack([it[k] for it in items]) for k in items[0]}
    model.eval()
    pred = forward(model, _to(batch, dev))
    if not isinstance(pred, Tensor):
        raise TypeError(f"forward: expected it to return the prediction tensor, got "
                        f"{type(pred).__name__}")
    # (half types as float32, for numpy and plots; float64 stays float64)
    keep = pred.dtype in (torch.float32, torch.float64)
    return (pred if keep else pred.float()).cpu(), _to(batch, torch.device("cpu"))


def _data_cause(batch: Batch) -> str:
    """What in ``batch`` makes a relative loss non-finite whatever the model does, as a clause
    for the stop message: a non-finite value, a negative coefficient, or a target that is zero
    everywhere (its relative error divides by 0). Run only once the loss is non-finite."""
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.is_floating_point() and not bool(
                torch.isfinite(value).all()):
            return f" (the batch's {key!r} holds NaN or inf)"
    if "coeff" in batch and bool((batch["coeff"] < 0).any()):
        return " (the batch's 'coeff' has negative values)"
    target = batch["target"]
    if "mask" in batch:  # per sample and channel over the valid points
        zero = torch.where(batch["mask"][..., None], target, 0).eq(0).all(1).any(1)
    else:
        zero = target.flatten(1).eq(0).all(1)
    if bool(zero.any()):
        return (f" (sample {int(zero.nonzero()[0])} of the batch has a target that is zero "
                "everywhere: its relative error divides by 0)")
    return ""


def _loss_result(result: object) -> tuple[Tensor, Mapping[str, Tensor]]:
    """``loss_fn``'s ``(loss, parts)``, checked: ``loss`` a 0-d tensor, ``parts`` a dict of 0-d
    tensors holding ``'rel_l2'`` (and optionally ``'rel_h1'``), as OperatorLoss returns."""
    expected = ("loss_fn: expected (loss, parts), loss a 0-d tensor and parts a dict of 0-d "
                "tensors holding at least 'rel_l2' (and optionally 'rel_h1'), the logged "
                "relative errors, as OperatorLoss returns")
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(f"{expected}; got {type(result).__name__}")
    loss, parts = result
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise TypeError(f"{expected}; got loss "
                        + (f"of shape {tuple(loss.shape)} (reduce it to the batch's mean)"
                           if isinstance(loss, Tensor) else type(loss).__name__))
    if not loss.requires_grad:
        raise TypeError("loss_fn: returned a loss without gradient (computed from detached "
                        "tensors, or under torch.no_grad?)")
    if not isinstance(parts, Mapping) or "rel_l2" not in parts:
        raise TypeError(f"{expected}; got parts {parts!r}")
    for key in ("rel_l2", "rel_h1"):
        if key in parts and not (isinstance(parts[key], Tensor) and parts[key].dim() == 0):
            raise TypeError(f"{expected}; got parts[{key!r}] = {parts[key]!r}")
    return loss, parts


def _seed_rngs(seed: int) -> None:
    """Seed torch's generator, NumPy's global one and Python's ``random``: a dataset's own
    draws in ``__getitem__`` repeat too (DataLoader workers seed theirs from torch's)."""
    torch.manual_seed(seed)
    # (the global generator is the one a dataset's np.random calls draw from; 32-bit words)
    np.random.seed([seed & 0xFFFFFFFF, seed >> 32])  # noqa: NPY002
    random.seed(seed)


def _rng_state(device: torch.device) -> dict[str, Tensor]:
    """Every generator :func:`_seed_rngs` seeds, as tensors (what a safe load reads back)."""
    _, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)  # noqa: NPY002
    version, words, python_gauss = random.getstate()
    state = {"cpu": torch.get_rng_state(),
             "numpy": torch.tensor([*np.asarray(keys).tolist(), position, has_gauss],
                                   dtype=torch.int64),
             "numpy_gauss": torch.tensor(gauss, dtype=torch.float64),
             "python": torch.tensor([version, *words], dtype=torch.int64),
             "python_gauss": torch.tensor([] if python_gauss is None else [python_gauss],
                                          dtype=torch.float64)}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: Mapping[str, Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:  # (checkpoints of galerkin_ext before 2026-11-30 hold torch's only)
        *keys, position, has_gauss = state["numpy"].tolist()
        np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32),  # noqa: NPY002
                             position, has_gauss, state["numpy_gauss"].item()))
        version, *words = state["python"].tolist()
        gauss = state["python_gauss"].tolist()
        random.setstate((version, tuple(words), gauss[0] if gauss else None))


class Trainer:
    """Train ``model`` on ``train_set``, evaluating on ``eval_set`` after every epoch.

    Args:
        model: the network (on any device; it is moved to ``ctx.device``).
        loss_fn: ``loss_fn(pred, target, target_grad, coeff) -> (loss, parts)``, e.g.
            :class:`~galerkin_ext.losses.OperatorLoss` (``target_grad``/``coeff`` are ``None``
            when the batch has no such key; ``parts`` holds the detached ``'rel_l2'`` and
            optionally ``'rel_h1'`` that are logged); for padded ragged batches (a ``mask`` key)
            ``loss_fn(pred, target, mask=mask)``, e.g.
            :class:`~galerkin_ext.losses.MaskedRelativeLoss`, with ``weight=batch['weight']``
            too for a loss whose ``weighted`` is True.
        train_set, eval_set: datasets of dicts (see module doc).
        config: :class:`TrainConfig`.
        out_dir: folder of the checkpoints and logs (created); a run started afresh where
            another ran removes that run's ``metrics.json`` and ``prediction.png``.
        ctx: from :func:`~galerkin_ext.training.setup_distributed` (default: one CPU process;
            under ``torchrun``, where that would train each process alone, it is refused).
            Under ``torchrun`` every process builds its Trainer, in the same order, as it
            calls ``fit``: both are collectives (a ``ConfigError`` on every process where
            ``train_set`` or ``eval_set`` holds another number of samples on one).
        forward: ``forward(model, batch) -> pred`` (default :func:`default_forward`).
        metric: ``metric(pred, batch) -> (B,)`` per-sample evaluation errors, whose mean picks
            the best epoch (and drives ``'plateau'``); default: relative L2 against
            ``batch['target']``.
        run_config: JSON-like dict (None, bools, ints, finite floats, strings, in lists and
            dicts) stored in the checkpoints next to ``config`` (e.g. the
            example's model and data settings), so a checkpoint documents its run.
        parallel: what the processes of a ``torchrun`` group split. ``'data'``: the samples;
            each process trains on its share of every batch (DDP averages the gradients) and
            evaluates its share of the samples. ``'domain'``: the points of each sample; every
            process sees every sample, but ``train_set`` and ``eval_set`` hand it only its own
            points (see :class:`~galerkin_ext.domain.DomainSplit`) and ``model`` is
            domain-parallel (:func:`~galerkin_ext.domain.make_domain_parallel`). Then
            ``loss_fn`` returns this process's share of the batch's loss (the shares sum to
            it, e.g. a loss of :func:`~galerkin_ext.domain.sum_over_ranks` sums divided by the
            number of processes) with ``parts`` of the whole batch, ``metric`` the whole
            samples' errors, and the gradients are summed over the processes
            (:func:`~galerkin_ext.domain.sum_gradients`).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., tuple[Tensor, Mapping[str, Tensor]]],
        train_set: Dataset,
        eval_set: Dataset,
        config: TrainConfig,
        out_dir: str | Path,
        *,
        ctx: DistributedContext | None = None,
        forward: Forward = default_forward,
        metric: Metric = _default_metric,
        run_config: Mapping[str, Any] | None = None,
        parallel: str = "data",
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        _check_callables(loss_fn=loss_fn, forward=forward, metric=metric)
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config: expected a TrainConfig, got {type(config).__name__}")
        # a checked copy: fields set after construction are checked again, and the run keeps
        # its settings whatever happens to the caller's object
        config = TrainConfig(**dataclasses.asdict(config))
        if run_config is not None and not isinstance(run_config, Mapping):
            raise TypeError(f"run_config: expected a dict, got {type(run_config).__name__}")
        if ctx is None and (place := launch_place())[0] > 1:
            # each process would train alone on all the data, into the same folder
            raise ConfigError(f"ctx: this process is rank {place[1]} of {place[0]} started "
                              "together (torchrun); pass ctx=setup_distributed() to train on "
                              "them together, or ctx=DistributedContext() for a run of its own")
        self.ctx = ctx if ctx is not None else DistributedContext()
        if not isinstance(self.ctx, DistributedContext):
            raise TypeError(f"ctx: expected a DistributedContext, got {type(ctx).__name__}")
        check_precision(config.precision, self.ctx.device)
        self.parallel = check_choice(parallel, "parallel", ("data", "domain"))
        if parallel == "domain" and self.ctx.world_size > 1 and not getattr(
                model, "domain_parallel", False):
            # its attention would attend within each process's points only: wrong, no error
            raise ConfigError("model: parallel='domain' needs a model prepared with "
                              "galerkin_ext.domain.make_domain_parallel")
        if parallel == "domain" and self.ctx.world_size > 1 and metric is _default_metric:
            # it would score each process's own points: a different error on every process,
            # whose early stopping and plateau schedules would then part ways (and deadlock)
            raise ConfigError("metric: parallel='domain' gives each process a part of every "
                              "sample's points; pass a metric of the whole samples (e.g. sums "
                              "over the points through galerkin_ext.domain.sum_over_ranks, as "
                              "examples/domain_parallel.py does)")
        # how many processes the samples are split over, and this process's place among them
        sample_ranks, sample_rank = ((1, 0) if parallel == "domain"
                                     else (self.ctx.world_size, self.ctx.rank))
        if config.batch_size % sample_ranks:
            raise ConfigError(f"batch_size: the global batch {config.batch_size} must be "
                              f"divisible by the {sample_ranks} processes")
        self.train_set = _check_dataset(train_set, "train_set")
        self.eval_set = _check_dataset(eval_set, "eval_set")
        if self.ctx.enabled and not dist.is_initialized():  # (else torch's error in the next line)
            raise ConfigError(f"ctx: rank {self.ctx.rank} of world_size = {self.ctx.world_size}, "
                              "but this process has joined no process group; build the context "
                              "with setup_distributed() (or torch.distributed."
                              "init_process_group first)")
        # the constructor's first collective: what follows refuses on every process or none
        _check_same_lengths(self.ctx, train_set=self.train_set, eval_set=self.eval_set)
        per_rank = config.batch_size // sample_ranks
        # (cast: torch's Dataset declares no __len__; _check_dataset took map-style ones only)
        if len(cast(Sized, train_set)) // sample_ranks < per_rank:
            raise ConfigError(f"train_set: {len(cast(Sized, train_set))} samples are fewer than "
                              f"one batch of {config.batch_size}")
        self.config, self.loss_fn, self.forward, self.metric = config, loss_fn, forward, metric
        # the package's presence checked on every process (one refusing alone left the others
        # waiting) before the folder is made; the writer made by fit(), on the main process,
        # once an earlier run's event files are gone
        writer_class = tensorboard_writer_class() if config.tensorboard else None
        self.run_config = dict(run_config or {})
        # checked now: a setting that cannot be stored and compared on resume is found before
        # training, not in a checkpoint that cannot be read back
        _check_loadable(self.run_config, "run_config", json_like=True)
        self.model = model.to(self.ctx.device)
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            train_set, num_replicas=sample_ranks, rank=sample_rank, shuffle=True,
            seed=_shuffle_seed(config.seed), drop_last=True,
        )
        self.loader = _loader(train_set, per_rank, self.ctx.device, sampler=self.sampler,
                              drop_last=True, num_workers=config.num_workers)
        self.steps_per_epoch = len(self.loader)
        # fused: one kernel over all parameters, not a Python loop over them (on the CPU the
        # loop took 13 % of a 44k-parameter GNOT's step); it takes real parameters only (the
        # spectral layers' weights are complex)
        fused = self.ctx.device.type in ("cpu", "cuda") and all(
            p.is_floating_point() for p in self.model.parameters())
        self.optimizer = (
            torch.optim.AdamW(self.model.parameters(), lr=config.max_lr,
                              weight_decay=config.weight_decay, fused=fused)
            if config.weight_decay > 0 else torch.optim.Adam(self.model.parameters(),
                                                              lr=config.max_lr, fused=fused))
        self.scheduler: Any
        if config.scheduler == "plateau":
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer, mode="min", factor=config.plateau_factor,
                patience=config.plateau_patience)
        else:
            total, pct_start = config.epochs * self.steps_per_epoch, config.pct_start
            # A warm-up of exactly one step is a first phase of no length to OneCycleLR (0 / 0
            # at step 0); a hair longer, that step runs at the initial rate, and the annealing
            # starts from max_lr after it.
            while pct_start * total == 1.0:
                pct_start = math.nextafter(pct_start, 1.0)
            self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
                self.optimizer, max_lr=config.max_lr, epochs=config.epochs,
                steps_per_epoch=self.steps_per_epoch, div_factor=config.div_factor,
                final_div_factor=config.final_div_factor, pct_start=pct_start,
            )
        _check_recorded(self.run_config, self._recorded())
        # made last: a refusal above leaves no folder behind; inside main_only: a folder that
        # cannot be written is refused on every process (the others went on to wait in fit)
        self.out_dir = _check_out_dir(out_dir)
        self.ctx.main_only(partial(_writable_dir, self.out_dir))
        self._writer_class = writer_class if self.ctx.is_main else None
        self.tb_writer: Any = None
        self._owns_last = False  # whether last.pt is this run's (resumed or written by it)
        self._fitted = False  # fit() runs once: it spends the optimiser and the schedule
        self._seeding = _SEEDING  # (a resumed run keeps the one it began with)

    # -- files ----------------------------------------------------------------------------

    @property
    def last_path(self) -> Path:
        """``out_dir/last.pt``: the state to resume from."""
        return self.out_dir / "last.pt"

    @property
    def best_path(self) -> Path:
        """``out_dir/best.pt``: the best model so far."""
        return self.out_dir / "best.pt"

    @property
    def _staged_best_path(self) -> Path:
        """``out_dir/best.next.pt``: a new best model until ``last.pt`` records it."""
        return self.out_dir / "best.next.pt"

    def _prepare_folder(self, history: list[dict[str, Any]], resumed_at: int | None) -> None:
        """The folder as the run's first epoch finds it, and its TensorBoard writer. For a
        resumption after epoch ``resumed_at`` (``history`` from ``last.pt``): ``metrics.csv``
        of that history (a kill after last.pt, before metrics.csv, left it a row short); for a
        fresh run (``None``): no earlier run's results."""
        if resumed_at is not None:
            write_csv(self.out_dir / "metrics.csv", history)
        else:
            if self.last_path.is_file() or self.best_path.is_file():
                print(f"note: starting afresh; the run in {str(self.out_dir)!r} (last.pt, "
                      "best.pt) will be overwritten (pass resume=True / --resume to continue "
                      "it)")
                # Its results go now: an interrupted new run left them beside its own
                # checkpoints, the old figures passing for the new run's.
                for name in _EARLIER_RESULTS:
                    (self.out_dir / name).unlink(missing_ok=True)
            # Also what a run stopped before its first last.pt left: its staged best model,
            # and its TensorBoard events (TensorBoard showed the two runs' curves as one).
            self._staged_best_path.unlink(missing_ok=True)
            for events in (self.out_dir / "tensorboard").glob("events.out.tfevents.*"):
                events.unlink()
        if self._writer_class is not None:
            # A resumption purges what the stopped run logged after last.pt (TensorBoard hides
            # the earlier files' events from this step on): its epoch runs again.
            self.tb_writer = self._writer_class(
                log_dir=str(self.out_dir / "tensorboard"),
                purge_step=None if resumed_at is None else resumed_at * self.steps_per_epoch + 1)

    def _record_epoch(self, history: list[dict[str, Any]], improved: bool, *,
                      rng: list[dict[str, Tensor]], best_metric: float, best_epoch: int,
                      train_seconds: float) -> None:
        """Log and checkpoint the epoch that ends ``history`` (the main process's files)."""
        epoch = history[-1]["epoch"]  # (counted from 1)
        if self.tb_writer is not None:
            # before last.pt, at the epoch's last step (so that a resumption's purge covers
            # them): a kill after last.pt lost them, one before doubled them
            for key, value in history[-1].items():
                if key != "epoch":
                    self.tb_writer.add_scalar(f"epoch/{key}", value, epoch * self.steps_per_epoch)
            self.tb_writer.flush()
        # (atomic_write would make a removed folder again, empty: the run went on to fail at
        # its end for want of best.pt)
        if not self.out_dir.is_dir():
            raise CheckpointError(f"out_dir: the run's folder {str(self.out_dir)!r} was removed "
                                  "during the run, with its checkpoints; start the run again")
        # The new best model is staged, then last.pt records it, then it replaces best.pt: a
        # kill anywhere leaves best.pt the best model last.pt records, or one a resumption
        # settles (_settle_staged_best). (best.pt written first had it ahead of last.pt, and
        # such a run could not be resumed.)
        if improved:
            save_checkpoint(self._staged_best_path, "best", epoch=epoch,
                            model=self.model.state_dict(), metric=best_metric,
                            config=self._full_config())
        save_checkpoint(
            self.last_path, "last", epoch=epoch, model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(),
            rng=rng, best_metric=best_metric, best_epoch=best_epoch, history=history,
            train_seconds=train_seconds, world_size=self.ctx.world_size,
            seeding=self._seeding, torch_version=str(torch.__version__),
            config=self._full_config(),
        )
        if improved:
            os.replace(self._staged_best_path, self.best_path)
        write_csv(self.out_dir / "metrics.csv", history)

    def _settle_staged_best(self, best_epoch: int, best_metric: float) -> None:
        """A staged best model that ``last.pt`` records (a kill came between the two) becomes
        ``best.pt``; one it does not (a kill before ``last.pt``) is dropped: that epoch runs
        again."""
        staged = self._staged_best_path
        if not staged.is_file():
            return
        best = load_checkpoint(staged, "best")
        if (best["epoch"], best["metric"]) == (best_epoch, best_metric):
            os.replace(staged, self.best_path)
        else:
            staged.unlink()

    def _recorded(self) -> dict[str, Any]:
        """What the Trainer records in the run's config beside ``run_config``."""
        # (cast: torch's Dataset declares no __len__; _check_dataset took map-style ones only)
        return {"parallel": self.parallel, "train": dataclasses.asdict(self.config),
                "train_samples": len(cast(Sized, self.train_set)),
                "eval_samples": len(cast(Sized, self.eval_set))}

    def _full_config(self) -> dict[str, Any]:
        recorded = self._recorded()
        return {**self.run_config, **recorded,
                "train": {**self.run_config.get("train", {}), **recorded["train"]}}

    def _check_resumable(self, stored: Mapping[str, Any], world_size: int) -> None:
        """Refuse a resumption that would change the model, the data or the schedule (see
        :func:`check_resumable_config`), or the number of processes."""
        check_resumable_config(stored, self._full_config(), self.last_path)
        if world_size != self.ctx.world_size:
            raise CheckpointError(
                f"cannot resume from {str(self.last_path)!r} exactly: it was written by "
                f"{world_size} processes, this run has {self.ctx.world_size}"
            )

    def _gather_rng(self) -> list[dict[str, Tensor]]:
        state = _rng_state(self.ctx.device)
        if not self.ctx.enabled:
            return [state]
        states: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(states, {k: v.cpu() for k, v in state.items()})
        return states

    # -- training -------------------------------------------------------------------------

    def _step(self, model: nn.Module, batch: Batch, epoch: int, step: int) -> Tensor:
        """One optimiser step; returns ``[loss, rel_l2, rel_h1]`` averaged over processes."""
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                    if self.config.precision == "bf16" else nullcontext())
        with autocast:
            pred = self.forward(model, batch)
        if "mask" in batch:  # a padded ragged batch: loss_fn(pred, target, mask=[, weight=])
            masked = {"mask": batch["mask"]}
            if getattr(self.loss_fn, "weighted", False) is True:  # MaskedRelativeLoss(True)
                if "weight" not in batch:
                    raise ValueError(f"loss_fn: a weighted loss needs the batch's quadrature "
                                     f"weights 'weight', got the keys {sorted(batch)}")
                masked["weight"] = batch["weight"]
            loss, parts = _loss_result(self.loss_fn(pred, batch["target"], **masked))
        else:
            loss, parts = _loss_result(self.loss_fn(pred, batch["target"],
                                                    batch.get("target_grad"), batch.get("coeff")))
        # NaN marks a loss without an H¹ part: the epoch's record then has no train_rel_h1
        rel_h1 = parts.get("rel_h1", torch.full((), math.nan, device=loss.device))
        # float64: a float64 model's loss is recorded, and tested for finiteness, as it is
        stats = torch.stack([t.detach().double() for t in (loss, parts["rel_l2"], rel_h1)])
        self.ctx.all_reduce_sum(stats)
        # data: every process's batch share is averaged; domain: the loss shares add up and
        # the parts are the whole batch's in every process
        (stats[1:] if self.parallel == "domain" else stats).div_(self.ctx.world_size)
        where = f"epoch {epoch + 1}, step {step + 1}"
        if not math.isfinite(float(stats[0])):
            self._stop(f"training loss is {float(stats[0])} at {where}{_data_cause(batch)}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.parallel == "domain":
            sum_gradients(model)  # each process holds the part through its own points
        if self.config.clip_value is not None:
            nn.utils.clip_grad_value_(model.parameters(), self.config.clip_value)
        # The norm is computed either way: a non-finite gradient stops the run.
        clip = self.config.grad_clip if self.config.grad_clip is not None else math.inf
        norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
        if not math.isfinite(float(norm)):
            self._stop(f"gradient norm is {float(norm)} at {where}")
        self.optimizer.step()
        if self.config.scheduler == "onecycle":
            self.scheduler.step()
        return stats

    def _stop(self, what: str) -> None:
        kept = (f"the last good checkpoint {str(self.last_path)!r} is kept" if self._owns_last
                else "no checkpoint of this run was written yet")
        raise NonFiniteLossError(f"non-finite values: {what}; the run is stopped and {kept}. "
                                 f"Try a lower max_lr, fp32 precision, or check the data.")

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _stops_early(self, epochs_done: int, best_epoch: int) -> bool:
        patience = self.config.early_stopping
        return patience is not None and epochs_done - best_epoch >= patience

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train for ``config.epochs`` epochs (continuing from ``last.pt`` if ``resume`` and it
        exists; fewer if ``config.early_stopping`` ends the run), then load the best epoch's
        weights into ``self.model``.

        Returns ``{'best_metric', 'best_epoch', 'epochs', 'stopped_early', 'train_seconds',
        'history'}``; ``epochs`` is the number of epochs run, ``history`` a list of per-epoch
        dicts (``epoch``, ``train_loss``, ``train_rel_l2``, ``train_rel_h1`` (only when the loss
        reports an H¹ part: the seminorm error of :class:`~galerkin_ext.losses.OperatorLoss`,
        the full norm's of ``RelativeLoss('h1')``), ``eval_rel_l2``
        -- the mean of the ``metric`` --, ``lr``, the rate of the epoch's last step,
        ``seconds``).

        Before the first step, one batch of ``eval_set`` is evaluated (``forward`` and
        ``metric``), so that they fail now if they cannot work, not after an epoch.  A Trainer
        fits once; a second call is refused (build a new one, with ``resume=True`` to go on).

        Raises:
            NonFiniteLossError: the loss or gradient became NaN/inf (nothing is overwritten).
            CheckpointError: ``last.pt`` is corrupt, or was written with settings that
                change the model, the data or the schedule, or by another number of processes,
                or for a model its weights do not fit; or its ``best.pt`` is missing or corrupt.
            RuntimeError: ``fit`` was called before on this Trainer.
        """
        check_bool(resume, "resume")
        if self._fitted:
            raise RuntimeError("fit: this Trainer has run fit() already, and its model, "
                               "optimiser and schedule hold that run's state; build a new "
                               "Trainer (with resume=True to continue from last.pt)")
        with ExitStack() as held:  # (the folder's lock, on the main process)
            self.ctx.main_only(partial(self._hold_folder, held))
            return self._fit(resume)

    def _hold_folder(self, stack: ExitStack) -> None:
        """Lock the run's folder for the run (released with ``stack``), and remove what a run
        killed while writing left (temporary files would pile up otherwise)."""
        # Two runs writing one folder at once mixed their checkpoints and metrics, and a
        # starting run deleted the temporary files a live one was writing.
        if not stack.enter_context(file_lock(self.out_dir / ".lock", wait=False)):
            raise ConfigError(f"out_dir: another run is writing to {str(self.out_dir)!r} (it "
                              "holds its .lock); wait for it to end, or give another folder")
        for name in ("last.pt", "best.pt", "best.next.pt", "metrics.csv"):
            for stray in stray_temporary_files(self.out_dir / name):
                stray.unlink(missing_ok=True)

    def _fit(self, resume: bool) -> dict[str, Any]:
        """:meth:`fit`, with the folder held."""
        cfg, ctx = self.config, self.ctx
        history: list[dict[str, Any]] = []
        start, best_metric, best_epoch, train_seconds = 0, math.inf, 0, 0.0
        state = None
        if resume and self.last_path.is_file():
            state = load_checkpoint(self.last_path, "last", map_location=ctx.device)
            self._check_resumable(state["config"], state["world_size"])
        if state is not None:
            # (the other processes read best.pt next: they wait for the main one)
            ctx.main_only(partial(self._settle_staged_best, state["best_epoch"],
                                  state["best_metric"]))
            self._check_best(state["best_epoch"], state["best_metric"])
            _load_weights(self.model, state["model"], self.last_path,
                          "this Trainer's model (a resumption needs the model of its run)")
        self._try_evaluation()  # before the RNG states are set: it draws from them
        self._fitted = True  # from here on the optimiser and the schedule change
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            _set_rng_state(state["rng"][ctx.rank], ctx.device)
            # (a run shuffles on as it began: before 2026-11-30, with seed + epoch)
            self._seeding = state.get("seeding", 1)
            self.sampler.seed = _shuffle_seed(cfg.seed, self._seeding)
            start, history = state["epoch"], list(state["history"])
            best_metric, best_epoch = state["best_metric"], state["best_epoch"]
            train_seconds = state["train_seconds"]
            self._owns_last = True
            begun = state.get("torch_version", "an unrecorded version")  # (before 2026-12-01)
            if begun != torch.__version__ and ctx.is_main:
                print(f"note: resuming a run of torch {begun} under torch {torch.__version__}: "
                      "from here on its numbers agree with the uninterrupted run's to rounding "
                      "only, not bit for bit")
        else:
            _seed_rngs(_process_seed(cfg.seed, ctx.rank))  # dropout differs between processes
        ctx.main_only(partial(self._prepare_folder, history, None if state is None else start))
        model: nn.Module = self.model
        if ctx.enabled and self.parallel == "data":
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            model = DistributedDataParallel(self.model, device_ids=ids)
        if cfg.compile:  # the same parameters: the optimiser and checkpoints see no difference
            # fallback_random: dropout draws its masks from torch's generator, as eager does
            # (inductor's own stream made a compiled run, or a resumption that switches
            # compile, another random experiment rather than a re-rounding of the plain one)
            # (cast: torch types its result as a callable; for a module it is an OptimizedModule)
            model = cast(nn.Module, torch.compile(model, options={"fallback_random": True}))
        bar = tqdm(total=cfg.epochs * self.steps_per_epoch, initial=start * self.steps_per_epoch,
                   unit="step", disable=not (cfg.progress and ctx.is_main), dynamic_ncols=True)
        try:
            for epoch in range(start, cfg.epochs):
                if self._stops_early(epoch, best_epoch):  # also after a resumption
                    break
                row = self._epoch(model, epoch, bar)
                if not math.isfinite(row["eval_rel_l2"]):
                    self._stop(f"evaluation error is {row['eval_rel_l2']} after epoch {epoch + 1}")
                history.append(row)
                train_seconds += row["seconds"]
                improved = row["eval_rel_l2"] < best_metric
                if improved:
                    best_metric, best_epoch = row["eval_rel_l2"], epoch + 1
                if cfg.scheduler == "plateau":
                    self.scheduler.step(row["eval_rel_l2"])
                rng = self._gather_rng()
                ctx.main_only(partial(self._record_epoch, history, improved, rng=rng,
                                      best_metric=best_metric, best_epoch=best_epoch,
                                      train_seconds=train_seconds))
                self._owns_last = True  # (written by the main process)
                bar.set_postfix(epoch=epoch + 1, loss=f"{row['train_loss']:.3e}",
                                eval=f"{row['eval_rel_l2']:.3e}", best=f"{best_metric:.3e}")
        finally:
            bar.close()
            if self.tb_writer is not None:
                self.tb_writer.close()
        ctx.barrier()  # best.pt is complete before any process reads it
        best = load_checkpoint(self.best_path, "best", map_location=ctx.device)
        _load_weights(self.model, best["model"], self.best_path, "this Trainer's model")
        stopped = len(history) < cfg.epochs
        if stopped and ctx.is_main:
            print(f"early stopping after epoch {len(history)}: no better evaluation error "
                  f"in {cfg.early_stopping} epochs (best: epoch {best_epoch})", flush=True)
        return {"best_metric": best_metric, "best_epoch": best_epoch, "epochs": len(history),
                "stopped_early": stopped, "train_seconds": train_seconds, "history": history}

    def _check_best(self, best_epoch: int, best_metric: float) -> None:
        """``CheckpointError`` unless ``best.pt``, which a resumption loads at its end, is
        there, readable and the best epoch ``last.pt`` records (a fresh run in the same folder,
        killed after its first best.pt, leaves another run's): found before training, not after
        every remaining epoch."""
        if not self.best_path.is_file():
            raise CheckpointError(
                f"cannot resume from {str(self.last_path)!r}: it records epoch {best_epoch} as "
                f"the best, but {str(self.best_path)!r} is missing; restore it, or start "
                "afresh (without resume) or in another out_dir")
        best = load_checkpoint(self.best_path, "best")
        if (best["epoch"], best["metric"]) != (best_epoch, best_metric):
            raise CheckpointError(
                f"cannot resume from {str(self.last_path)!r}: it records epoch {best_epoch} "
                f"(error {best_metric:.6g}) as the best, but {str(self.best_path)!r} holds "
                f"epoch {best['epoch']} (error {best['metric']:.6g}), of another run; start "
                "afresh (without resume) or in another out_dir")

    def _try_evaluation(self) -> None:
        """Evaluate one batch of ``eval_set`` as after an epoch, so that an ``eval_set``,
        ``forward`` or ``metric`` that cannot work together fails before any training step.

        Without gradients, in eval mode (the model's mode is restored); called before the RNG
        states are seeded or restored, since the DataLoader draws its base seed from them.
        """
        # (cast: torch's Dataset declares no __len__; _check_dataset took map-style ones only)
        count = min(self.config.eval_batch_size, len(cast(Sized, self.eval_set)))
        # the samples are read first, so that the dataset's own errors reach the user as
        # they are, and only the collation's get the hint below
        samples = [self.eval_set[i] for i in range(count)]
        device = self.ctx.device
        mode = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                try:
                    batch = (_collate(self.eval_set) or default_collate)(samples)
                except RuntimeError as err:  # (torch's collate: samples of other shapes)
                    raise ConfigError(
                        f"eval_set: its samples do not stack into a batch ({err}); samples of "
                        "different point counts need the dataset's collate_fn, e.g. "
                        "galerkin_ext.data.collate_ragged (RaggedDataset has it)") from err
                try:
                    _batch_errors(self.model, batch, device, self.forward, self.metric)
                except ValueError as err:  # e.g. a grid too coarse for an FNO's modes: a
                    # ConfigError, which the scripts report in one line (a ValueError still)
                    raise ConfigError(f"eval_set: its first batch does not fit the model: "
                                      f"{err}") from err
        finally:
            self.model.train(mode)

    def _epoch(self, model: nn.Module, epoch: int, bar: Any) -> dict[str, Any]:
        """Train one epoch, evaluate, return the history row."""
        t0 = time.perf_counter()
        model.train()
        self.sampler.set_epoch(epoch)  # the shuffling order depends on (seed, epoch) only
        total = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
        for step, batch in enumerate(self.loader):
            lr = self._lr()  # (OneCycle steps past it in _step)
            stats = self._step(model, _to(batch, self.ctx.device), epoch, step)
            total += stats
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{float(stats[0]):.3e}",
                            lr=f"{self._lr():.2e}", refresh=False)
            if self.tb_writer is not None:
                self.tb_writer.add_scalar("step/loss", float(stats[0]),
                                          epoch * self.steps_per_epoch + step + 1)
        mean = (total / self.steps_per_epoch).tolist()
        eval_err = evaluate(self.model, self.eval_set, batch_size=self.config.eval_batch_size,
                            forward=self.forward, metric=self.metric,
                            ctx=self.ctx if self.parallel == "data" else None,
                            device=self.ctx.device)
        h1 = {} if math.isnan(mean[2]) else {"train_rel_h1": mean[2]}
        # lr: the rate of the epoch's last step (after the last one, OneCycle has stepped past
        # the end of its schedule, to a rate it never uses)
        return {"epoch": epoch + 1, "train_loss": mean[0], "train_rel_l2": mean[1], **h1,
                "eval_rel_l2": eval_err, "lr": lr, "seconds": time.perf_counter() - t0}
