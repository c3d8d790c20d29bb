"""What the example scripts share besides the :class:`~galerkin_ext.training.Trainer`.

* :func:`experiment_parser` and :func:`resolve_config` -- the common command line (``--preset``,
  ``--attention``, ``--norm``, ``--data``, ``--device``, ``--out``, ``--resume``, overrides) and
  its merge into a preset's config;
* :func:`cached_data` -- generate a data set once and reuse it, keyed by the generator's
  parameters, under :func:`default_cache_dir`;
* :func:`threshold_report`, :func:`enforce_thresholds`, :func:`preset_unchanged` -- the quick
  presets' accuracy targets, checked at the end of a run;
* :func:`plot_1d`, :func:`plot_2d` -- ``prediction.png`` (needs matplotlib).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import platform
import shlex
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from .._checks import (
    cannot_make_folder,
    cannot_write_in,
    check_bool,
    check_choice,
    check_int,
    check_path,
    recorded_eps,
    recorded_statistics,
    resolve_device,
)
from .._cli import nonnegative_float, nonnegative_int, positive_float, positive_int, usable_device
from .._locks import file_lock
from ..complexity import parameter_count
from ..data.datasets import UNIT_GAUSSIAN_EPS, UnitGaussianNormalizer
from ..data.storage import (
    DamagedPartialFileError,
    DataFileError,
    DataMismatchError,
    data_identity,
    same_draws,
)
from ..layers import ATTENTION_TYPES, auto_quadrature_weights
from ..models import build_model
from ..models.registry import _GRID_PAIRED, _recorded_arguments
from .checkpoint import (
    CheckpointError,
    _load_weights,
    atomic_write,
    load_checkpoint,
    write_json,
)
from .distributed import DistributedContext
from .trainer import (
    _RESUMABLE_CHANGES,
    ConfigError,
    NonFiniteLossError,
    TrainConfig,
    _writable_dir,
    check_precision,
    check_resumable_config,
    default_forward,
    per_sample_errors,
    relative_l2_metric,
    tensorboard_writer_class,
)

__all__ = [
    "DISCRETISATION_KEYS",
    "ThresholdError",
    "VALIDATION_NORMALISED",
    "add_gnot_flags",
    "add_patched_model_flags",
    "baseline_model",
    "build_run_model",
    "cached_data",
    "check_eval_layout",
    "check_model_grid",
    "check_resume",
    "check_zero_shot_law",
    "default_cache_dir",
    "describe_device",
    "describe_grid",
    "enforce_thresholds",
    "error_summary",
    "evaluation_only",
    "experiment_parser",
    "gnot_model_options",
    "load_trained_model",
    "plot_1d",
    "normalizer_config",
    "plot_2d",
    "plot_mesh",
    "plot_ragged_predictions",
    "point_set_forward",
    "ragged_channel_errors",
    "ragged_forward",
    "ragged_metric",
    "patched_model_options",
    "preset_unchanged",
    "record_data_files",
    "recorded_setting",
    "resolve_config",
    "run_main",
    "threshold_report",
    "write_metrics",
    "zero_shot_seed",
]

NORMS = ("attn", "layer")  # --norm: the paper's two rows (layers.NORM_SCHEMES has more)
# cached_data's problems -> their generator in galerkin_ext.data.generate
_PROBLEMS = {"burgers": "generate_burgers", "darcy": "generate_darcy",
             "lorenz63": "generate_lorenz63", "cde": "generate_cde", "heat": "generate_heat",
             "elasticity": "generate_elasticity", "kolmogorov": "generate_kolmogorov"}


class ThresholdError(RuntimeError):
    """A preset's run ended above one of its accuracy thresholds."""


def experiment_parser(description: str, presets: Mapping[str, Any], *,
                      attention_flags: bool = True, mat_files: bool = False,
                      eval_data_help: str | None = None) -> argparse.ArgumentParser:
    """The command line every example shares; scripts add their own resolution flags.

    Overrides (``--epochs``, ``--batch-size``, ``--lr``, ``--n-train``, ``--n-eval``, ``--seed``,
    ``--precision``) default to ``None``: "keep the preset's value".  ``attention_flags``:
    whether the Galerkin Transformer's ``--attention``, ``--norm`` and
    ``--reference-dropout`` exist (the continuum-attention scripts have none of them);
    ``mat_files``: whether ``--data`` and ``--eval-data`` take the original code's ``.mat``
    files too; ``eval_data_help``: the help of ``--eval-data`` where it is not a file of
    evaluation samples that replaces ``--data``'s.
    """
    if not isinstance(presets, Mapping) or not presets:
        raise ValueError("presets: expected a non-empty dict of preset name -> config")
    for name, flag in (("attention_flags", attention_flags), ("mat_files", mat_files)):
        check_bool(flag, name)
    if eval_data_help is not None and not isinstance(eval_data_help, str):
        raise TypeError(f"eval_data_help: expected a str or None, got {eval_data_help!r}")
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(presets), default=next(iter(presets)),
                   help="configuration block at the top of the script (default: %(default)s)")
    if attention_flags:
        p.add_argument("--attention", choices=ATTENTION_TYPES, default=None,
                       help="attention type (default: the preset's)")
        p.add_argument("--norm", choices=NORMS, default=None,
                       help="'attn': layer norm inside the attention (the paper's 'Ln on Q,K / "
                            "K,V' rows); 'layer': regular layer norm on the residual stream "
                            "(default: the preset's)")
        p.add_argument("--reference-dropout", action="store_true",
                       help="the original code's always-on p = 0.5 dropout of the attention "
                            "matrix (in training and evaluation), to compare with its "
                            "published numbers")
    kinds = "a galerkin_ext .h5 or an original .mat" if mat_files else "a galerkin_ext .h5"
    p.add_argument("--data", default=None,
                   help=f"data file: {kinds} (default: generate the preset's data once and "
                        "cache it)")
    p.add_argument("--eval-data", default=None,
                   help=eval_data_help or f"separate file of evaluation samples ({kinds}"
                        f"{', e.g. the original test .mat' if mat_files else ''}); default: "
                        "the last samples of --data")
    p.add_argument("--data-dir", default=None,
                   help="cache folder of generated data (default: $GALERKIN_EXT_CACHE, else "
                        "$XDG_CACHE_HOME/galerkin_ext, else ~/.cache/galerkin_ext)")
    p.add_argument("--device", type=usable_device, default="auto",
                   help="cpu, cuda, cuda:1 or auto (default)")
    p.add_argument("--out", required=True, help="output folder (checkpoints, metrics, plot)")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/last.pt if it exists (same settings)")
    p.add_argument("--epochs", type=positive_int, default=None)
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="samples per optimiser step (of all torchrun processes together)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="learning rate: OneCycle's max_lr, or the initial rate of a 'plateau' "
                        "schedule")
    p.add_argument("--n-train", type=positive_int, default=None, help="training samples")
    p.add_argument("--n-eval", type=positive_int, default=None, help="evaluation samples")
    p.add_argument("--seed", type=nonnegative_int, default=None,
                   help="training seed (model init, order)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                   help="bf16: autocast on CUDA")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads of torch (default: the preset's 'threads', else torch's)")
    p.add_argument("--workers", type=nonnegative_int, default=0,
                   help="DataLoader workers (default 0)")
    p.add_argument("--tensorboard", action="store_true",
                   help="log to OUT/tensorboard (needs the tensorboard package: pip install "
                        "tensorboard)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the training steps (the first step compiles for "
                        "10-40 s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def baseline_model(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   config: dict[str, Any], transformer: str, fno: str) -> str:
    """The registered model a Galerkin Transformer script trains by its ``--model``:
    ``transformer`` (``'transformer'``: the preset's model), or ``fno`` (``'fno'``: the paper's
    FNO baseline of its comparison rows, at the published size of :func:`build_model`'s
    defaults, on the same data with the same loss and trainer).  Records the choice in
    ``config['model_choice']``; ``parser.error`` for the attention flags with the FNO."""
    config["model_choice"] = args.model
    if args.model == "transformer":
        return transformer
    for flag, value in (("--attention", args.attention), ("--norm", args.norm),
                        ("--reference-dropout", args.reference_dropout)):
        if value:
            parser.error(f"{flag}: the FNO baseline (--model fno) has no attention")
    config["model"] = {}  # the preset's are the transformer's
    return fno


def add_patched_model_flags(parser: argparse.ArgumentParser) -> None:
    """``--smoothing EPS ALPHA`` (ViT NO and FANO) and ``--patch-extension periodic`` (FANO):
    the patched models' options of SPEC-continuum §2 (the paper's Figs 18 and 19); read them
    with :func:`patched_model_options`."""
    parser.add_argument("--smoothing", type=nonnegative_float, nargs=2, metavar=("EPS", "ALPHA"),
                        default=None,
                        help="vitno, fano: multiply the output's Fourier mode k by "
                             "(1 + EPS |k|^2)^-ALPHA: the inverse of (I - EPS Laplacian)^ALPHA "
                             "on a 2pi-periodic domain such as Kolmogorov's (the paper's Fig "
                             "18: 1e-3 1.001); elsewhere, e.g. on Darcy's square, a low-pass "
                             "filter that treats the grid as periodic (default: none)")
    parser.add_argument("--patch-extension", choices=("periodic",), default=None,
                        help="fano: its spectral Q, K, V act on each patch extended to a "
                             "periodic one (default: none)")


def patched_model_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                          model: str) -> dict[str, Any]:
    """The settings of :func:`build_model`'s ``model`` that ``--smoothing`` and
    ``--patch-extension`` give (``{}`` without them: the preset's model, whose thresholds then
    apply); ``parser.error`` where ``model`` has no such option."""
    options: dict[str, Any] = {}
    if args.smoothing is not None:
        if model not in ("vitno", "fano"):
            parser.error(f"--smoothing: only the patched models (vitno, fano) smooth their "
                         f"output, not {model}")
        options["smoothing"] = list(args.smoothing)
    if args.patch_extension is not None:
        if model != "fano":
            parser.error(f"--patch-extension: only fano extends its patches, not {model}")
        options["patch_extension"] = args.patch_extension
    return options


def add_gnot_flags(parser: argparse.ArgumentParser) -> None:
    """GNOT's ablations of SPEC-gnot §6 as flags: ``--experts``, ``--ffn-norm`` and
    ``--paper-faithful``; read them with :func:`gnot_model_options`."""
    parser.add_argument("--experts", type=positive_int, default=None,
                        help="gnot: its experts K (default: the preset's)")
    parser.add_argument("--ffn-norm", choices=("post", "pre"), default=None,
                        help="gnot: post-norm blocks, or pre-norm ones x + E(LN(x)) "
                             "(default: the preset's)")
    parser.add_argument("--paper-faithful", action="store_true",
                        help="gnot: the paper's forms where the reference code differs: the "
                             "inputs' attention terms averaged (reduce 'mean'), no skip in the "
                             "self-attention, theta as one more input function")


def gnot_model_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       model: str) -> dict[str, Any]:
    """The GNOT settings that :func:`add_gnot_flags`'s flags give (``{}`` without them: the
    preset's model, whose thresholds then apply); ``parser.error`` where ``model`` is not
    ``'gnot'``."""
    options: dict[str, Any] = {}
    flags = []
    if args.experts is not None:
        options["n_experts"] = args.experts
        flags.append("--experts")
    if args.ffn_norm is not None:
        options["ffn_norm"] = args.ffn_norm
        flags.append("--ffn-norm")
    if args.paper_faithful:
        options.update(reduce="mean", self_skip=False, theta_mode="branch")
        flags.append("--paper-faithful")
    if flags and model != "gnot":
        parser.error(f"{flags[0]}: a setting of GNOT, not of {model}")
    return options


def resolve_config(presets: Mapping[str, Any], args: argparse.Namespace, *,
                   experiment: str, parallel: str = "data") -> dict[str, Any]:
    """A deep copy of ``presets[args.preset]`` with the command-line overrides applied, and
    the ``experiment``'s name (the script's, e.g. ``'darcy'``: a run of another experiment is
    not resumed).

    The preset must have the keys ``data`` (generator parameters), ``n_train``, ``n_eval``,
    ``model`` (arguments of :func:`~galerkin_ext.models.build_model`; ``attention_type`` and
    ``norm`` are the defaults of ``--attention`` and ``--norm``) and ``train`` (arguments of
    :class:`~galerkin_ext.training.TrainConfig`), optionally ``threads`` (CPU threads; ``None``:
    torch's default) and ``n_valid`` (a validation split between the training and evaluation
    samples; overridden by ``args.n_valid`` where the script has that flag).  Data generated
    for the preset hold ``n_train + n_valid + n_eval`` samples unless the preset's ``data``
    says more in ``n_samples``.  ``parallel``: the Trainer's (``'data'``: the batch is split
    over the ``torchrun`` processes, so it must be divisible by their number).
    """
    if not isinstance(args, argparse.Namespace) or args.preset not in presets:
        raise ValueError(f"args.preset: expected one of {list(presets)}")
    if not isinstance(experiment, str) or not experiment:
        raise TypeError(f"experiment: expected the experiment's name, got {experiment!r}")
    cfg = copy.deepcopy(dict(presets[args.preset]))
    missing = [k for k in ("data", "n_train", "n_eval", "model", "train") if k not in cfg]
    if missing:
        raise ValueError(f"presets[{args.preset!r}]: missing keys {missing}")
    cfg["experiment"], cfg["preset"] = experiment, args.preset
    cfg["threads"] = args.threads or cfg.get("threads")
    for key in ("n_train", "n_valid", "n_eval"):
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)
    if cfg["n_train"] < 2:  # found now, not as a traceback from the dataset after the data
        raise ConfigError(f"n_train: fitting the normalisers needs >= 2 training samples "
                          f"(--n-train), got {cfg['n_train']}")
    needed = cfg["n_train"] + cfg.get("n_valid", 0) + cfg["n_eval"]
    cfg["data"].setdefault("n_samples", needed)
    if cfg["data"]["n_samples"] < needed:
        cfg["data"]["n_samples"] = needed
    if getattr(args, "attention", None) is not None:
        cfg["model"]["attention_type"] = args.attention
    if getattr(args, "norm", None) is not None:
        cfg["model"]["norm"] = args.norm
    if getattr(args, "reference_dropout", False):
        cfg["model"]["reference_dropout"] = True
    train = cfg["train"]
    for key, name in (("epochs", "epochs"), ("batch_size", "batch_size"), ("max_lr", "lr"),
                      ("seed", "seed"), ("precision", "precision")):
        if getattr(args, name) is not None:
            train[key] = getattr(args, name)
    train.update(num_workers=args.workers, progress=not args.no_progress,
                 tensorboard=args.tensorboard, compile=args.compile)
    # settings that need no data are checked before any is generated
    _check_out(args.out)
    try:
        batch_size = TrainConfig(**train).batch_size  # its own checks, and the default
    except (ValueError, TypeError) as err:  # (e.g. a --seed of 2**63: one line, no traceback)
        raise ConfigError(str(err)) from None
    if batch_size > cfg["n_train"]:
        raise ConfigError(f"batch_size: the batch of {batch_size} is larger than the "
                          f"{cfg['n_train']} training samples (--batch-size, --n-train)")
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # (torchrun's)
    split = check_choice(parallel, "parallel", ("data", "domain")) == "data"
    if split and batch_size % processes:
        raise ConfigError(f"batch_size: the global batch {batch_size} must be divisible by the "
                          f"{processes} processes (--batch-size, torchrun's --nproc_per_node)")
    check_precision(train.get("precision", "fp32"), resolve_device(args.device))
    if args.tensorboard:
        tensorboard_writer_class()
    return cfg


def _check_out(path: str) -> None:
    """The Trainer's check that ``--out`` can be written, made before any data are generated
    and without creating it (a later refusal would leave an empty folder): an existing folder
    takes a temporary file, a new one needs a writable folder above it."""
    folder = Path(path)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    try:
        if existing == folder:
            _writable_dir(path)
        elif cannot_write_in(existing) is not None:  # (tried: root passes os.access on /proc)
            raise ValueError(f"out_dir: cannot write to {str(folder)!r} ({str(existing)!r} "
                             "is not a folder this process can write to)")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_resume(cfg: Mapping[str, Any], args: argparse.Namespace, *,
                 zero_shot: bool = False) -> None:
    """With ``--resume`` and an ``OUT/last.pt``: refuse now, before any data are generated, a
    setting of ``cfg`` that differs from the checkpoint's, or a ``--data`` or ``--eval-data``
    file that holds other data than the run read (``CheckpointError``); without ``--resume``,
    an ``OUT/last.pt`` or ``OUT/best.pt`` of another experiment, which the run would overwrite
    (``ConfigError``).

    Scripts call it once ``cfg`` holds every setting of the command line.  The
    :class:`~galerkin_ext.training.Trainer` compares the whole configuration again once the
    data are read (normalisers, sample counts, data files).  ``zero_shot``: ``--eval-data`` is
    a zero-shot set, which a resumption may change (:func:`record_data_files`).
    """
    out = Path(args.out)
    if not args.resume:  # a fresh run overwrites them: refused for another experiment's run
        for kind in ("last", "best"):
            if not (out / f"{kind}.pt").is_file():
                continue
            try:
                stored = load_checkpoint(out / f"{kind}.pt", kind)["config"]
            except CheckpointError:  # unreadable: nothing to keep
                continue
            if stored.get("experiment", cfg["experiment"]) != cfg["experiment"]:
                raise ConfigError(
                    f"--out: {str(out)!r} holds a run of the {stored['experiment']!r} "
                    f"experiment ({kind}.pt), which this {cfg['experiment']!r} run would "
                    "overwrite; choose another --out (or delete that folder)")
        return
    last = out / "last.pt"
    if not last.is_file():
        return
    stored = load_checkpoint(last, "last")["config"]
    current = {**cfg, "train": dataclasses.asdict(TrainConfig(**cfg["train"]))}
    check_resumable_config(stored, current, last, partial=True)
    # The files the command line names exist already (the generated ones: once made).
    recorded = stored.get("data_identity") or {}
    files = {"train": ("--data", args.data)}
    if not zero_shot:  # (without --eval-data the evaluation split is --data's)
        files["eval"] = ("--eval-data", args.eval_data) if args.eval_data else files["train"]
    for split, (flag, path) in files.items():
        if (path is not None and split in recorded and Path(path).is_file()
                and data_identity(path) != recorded[split]):
            raise CheckpointError(
                f"cannot resume from {str(last)!r}: {flag} {str(path)!r} holds other data than "
                f"the run's {'training' if split == 'train' else 'evaluation'} file (recorded "
                f"in its data_files); use that file or another out_dir")


def run_main(main: Callable[[], object]) -> int:
    """Run an example script's ``main()``; Ctrl-C and the package's own account of a bad data
    file, checkpoint, setting or run end it with one line instead of a traceback.

    Returns the exit status: 0, 130 after an interrupt (the generated data chunks and
    ``last.pt``, the last finished epoch, are kept for ``--resume``), or 1 when a preset's
    accuracy threshold was missed (:class:`ThresholdError`; the outputs are written) or on a
    :class:`DataFileError`, :class:`CheckpointError`, :class:`ConfigError`,
    :class:`NonFiniteLossError` or an error of the operating system (a missing file, a full
    disk, a folder made read-only: the run's files stay those of its last finished epoch).
    """
    # Under torchrun every process prints its own line: say whose it is.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    who = f" (rank {os.environ.get('RANK', '?')} of {world})" if world > 1 else ""
    try:
        main()
    except KeyboardInterrupt:
        print(f"\ninterrupted{who}; rerun the same command with --resume to continue from what "
              "is kept (the data generated so far, and OUT/last.pt once an epoch has finished)",
              file=sys.stderr)
        return 130
    except ThresholdError as err:
        print(f"threshold not met{who}: {err}", file=sys.stderr)
        return 1
    except (DataFileError, CheckpointError, ConfigError, NonFiniteLossError,
            OSError) as err:  # (the package's FileNotFoundErrors name the file; errno's do)
        print(f"error{who}: {err}", file=sys.stderr)
        return 1
    return 0


def check_eval_layout(train_set: Any, eval_set: Any) -> None:
    """``ConfigError`` unless the ragged ``eval_set`` (from ``--eval-data``) holds samples of
    ``train_set``'s layout: the model takes its input functions by position, and one that the
    normalisers do not cover (coordinates only: a mesh, a cavity) failed inside the first
    evaluation with a traceback."""
    differences = train_set.layout.differences(eval_set.layout)
    if differences:
        raise ConfigError(f"--eval-data: its samples differ from the training data's "
                          f"({'; '.join(differences)})")


def _recorded_parameters(data: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The generator parameters the data file ``data`` records, or ``None`` (no such file, or
    not one of the package's generators')."""
    if not Path(data).is_file():
        return None
    identity = data_identity(data)
    return json.loads(identity["parameters"]) if "parameters" in identity else None


def recorded_setting(parser: argparse.ArgumentParser, data: str | os.PathLike[str] | None,
                     key: str, given: Any, flag: str, default: Any) -> Any:
    """The generator parameter ``key`` that the ``--data`` file ``data`` records, which the
    command line cannot change: ``flag``'s ``given`` value must equal it (else the parser's
    one-line error). A recorded ``None`` counts: an ODE file on a non-uniform grid records
    ``dt`` None, and a ``--dt`` must then be left out. Where there is no such file or record:
    ``given``, or ``default`` where that is ``None``."""
    recorded = None if data is None else _recorded_parameters(data)
    if recorded is None or key not in recorded:
        return default if given is None else given
    stored = recorded[key]
    if given is not None and given != stored:
        shown = "None" if stored is None else f"{stored:g}"
        parser.error(f"{flag}: --data holds samples of {key} = {shown}, got {given:g} "
                     f"(leave {flag} out)")
    return stored


#: Recorded generator parameters that set a data set's discretisation (its grid, time steps,
#: mesh or solver), not the law of its samples: sets that differ in these alone are draws of
#: one law, which a zero-shot set or an ``--eval-data`` file must be.
DISCRETISATION_KEYS = frozenset({"resolution", "solve_resolution", "n_steps", "max_step",
                                 "solve_dtype", "method", "dt", "grid", "n_times", "h", "refine"})


def _law_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """The recorded law parameters in which the files of the :func:`data_identity` records
    ``a`` and ``b`` of one generator differ (``'key a vs b; ...'``), or ``''``.  Files of other
    generators (which the datasets refuse by name) and files converted from other codes' data
    (they record their source, not a law) are not compared."""
    if a.get("generator") != b.get("generator") or not ("parameters" in a and "parameters" in b):
        return ""
    mine, theirs = json.loads(a["parameters"]), json.loads(b["parameters"])
    if "source" in mine or "source" in theirs:
        return ""
    differ = sorted(k for k in (set(mine) | set(theirs)) - DISCRETISATION_KEYS
                    if mine.get(k) != theirs.get(k))
    return "; ".join(f"{k} {mine.get(k)!r} vs {theirs.get(k)!r}" for k in differ)


def check_zero_shot_law(data: str | os.PathLike[str], zero_shot: str | os.PathLike[str],
                        flags: str) -> None:
    """``ConfigError`` where the training file ``data`` (``--data``) was drawn by another law
    than the zero-shot file ``zero_shot``, which the script generates with its preset's law on
    another grid: its figures would measure the other law (a Darcy coefficient's length scale,
    an ODE's horizon), not the grid.  The law: every recorded parameter but
    :data:`DISCRETISATION_KEYS`.  ``flags``: those that, given alone, leave the zero-shot sets
    out.  A file converted from another code's data records no law to compare: a warning says
    that the zero-shot sets may follow another law than its samples."""
    if not (Path(data).is_file() and Path(zero_shot).is_file()):
        return
    mine, theirs = data_identity(data), data_identity(zero_shot)
    found = _law_differences(mine, theirs)
    if found:
        raise ConfigError(f"--data: its samples follow another law than the zero-shot sets, "
                          f"which are drawn with the preset's ({found}); give {flags} alone "
                          "to leave them out")
    if "source" in json.loads(mine.get("parameters", "{}")) and "parameters" in theirs:
        law = {k: v for k, v in json.loads(theirs["parameters"]).items()
               if k not in DISCRETISATION_KEYS}
        warnings.warn(f"--data: {Path(data).name!r} was converted from another code's data and "
                      f"records no law, so the zero-shot sets, drawn with the preset's "
                      f"({', '.join(f'{k} {v!r}' for k, v in sorted(law.items()))}), may follow "
                      "another one: their errors would then measure a change of law with the "
                      f"change of grid (give {flags} alone to leave them out)", stacklevel=2)


def zero_shot_seed(data: str | os.PathLike[str], generator: str, seed: int) -> int:
    """The seed of zero-shot sets that ``generator`` draws with ``seed`` for a run trained on
    the file ``data``: ``seed``, or ``seed + 1`` where ``data`` holds that generator's draws of
    ``seed`` (sample ``i`` depends on ``(seed, i)`` alone, so the zero-shot samples were the
    training samples on another grid, or, for Darcy fields, draws correlated with them)."""
    check_int(seed, "seed", 0)
    identity = data_identity(data)
    repeats = identity.get("generator") == generator and identity.get("seed") == seed
    return seed + 1 if repeats else seed


def record_data_files(config: dict[str, Any], data: str | os.PathLike[str],
                      eval_data: str | os.PathLike[str] | None, *,
                      evaluated: int | None = None, zero_shot: bool = False) -> None:
    """Store in ``config`` the training and evaluation data files: ``data_files``, their
    absolute paths (a record: a resumed run may find them elsewhere, e.g. in another cache), and
    ``data_identity``, what a resumed run must find again in them (another file is other data;
    :func:`~galerkin_ext.data.storage.data_identity`).

    ``zero_shot``: ``eval_data`` is a zero-shot set only, the evaluation split being ``data``'s:
    its path and identity go into ``config['zero_shot']`` (``data_file``, ``data_identity``),
    the evaluation settings a resumption may change (e.g. to another set, or to none).

    A separate ``eval_data`` whose last ``evaluated`` samples (default ``config['n_eval']``)
    include the draws of training samples (``config['n_train']`` and ``n_valid``: the same
    generator and seed, :func:`~galerkin_ext.data.storage.same_draws`) is refused, and so is
    one of the same generator drawn by another law (its parameters but
    :data:`DISCRETISATION_KEYS`).
    """
    check_bool(zero_shot, "zero_shot")
    if evaluated is not None:
        check_int(evaluated, "evaluated", 1)
    other = None if eval_data is None else Path(eval_data)
    for flag, path in (("--data", Path(data)), ("--eval-data", other)):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{flag}: no such file {str(path)!r}")
    files = {"train": Path(data), "eval": other if other and not zero_shot else Path(data)}
    config["data_files"] = {k: str(v.resolve()) for k, v in files.items()}
    config["data_identity"] = {k: data_identity(v) for k, v in files.items()}
    if other is None:
        return
    train = config["data_identity"]["train"]
    evaluation = data_identity(other) if zero_shot else config["data_identity"]["eval"]
    if zero_shot:
        config["zero_shot"].update(data_file=str(other.resolve()), data_identity=evaluation)
    found = _law_differences(train, evaluation)
    if found:
        raise DataMismatchError(
            f"--eval-data: its samples follow another law than --data's ({found}): its errors "
            "would measure that law, not the trained model's; evaluate a trained model on it "
            "through training.load_trained_model")
    if same_draws(train, evaluation):
        used = config["n_train"] + config.get("n_valid", 0)
        count = config["n_eval"] if evaluated is None else evaluated
        first = max(0, evaluation["n_samples"] - count)  # the evaluated samples are the last
        if first < used:
            last, n_train = min(used, evaluation["n_samples"]) - 1, config["n_train"]
            kind = ("training" if last < n_train else "validation" if first >= n_train
                    else "training and validation")
            raise DataMismatchError(
                f"--eval-data: its samples {first} to {last} are {kind} samples of --data: both "
                f"come from the {train['generator']} generator with seed {train['seed']}, "
                "whose sample i depends on (seed, i) "
                "alone (on another grid the same draws, or, for a Darcy field, whose K x K "
                "normals are drawn in row order, correlated ones); generate it with another "
                "--seed")


def build_run_model(config: dict[str, Any], name: str, **arguments: Any) -> torch.nn.Module:
    """``build_model(name, **config['model'], **arguments)``, recorded in ``config['build']``
    (``{'name': name, 'arguments': {...}}``) so that :func:`load_trained_model` rebuilds the
    model from a checkpoint alone.  ``arguments``: those kept elsewhere in ``config`` (e.g.
    Darcy's ``fine`` and ``coarse`` grids)."""
    if not isinstance(config, dict) or not isinstance(config.get("model"), Mapping):
        raise TypeError("config: expected the run's config dict, with the model's arguments "
                        "under 'model' (e.g. {'model': {}})")
    arguments = {**config["model"], **arguments}
    model = build_model(name, **arguments)
    if name in _GRID_PAIRED:  # the coarse grid build_model paired with the fine one, if any
        arguments["coarse"] = cast(Any, model).sizes.coarse  # (a SimpleTransformer2d)
    config["build"] = {"name": name, "arguments": arguments}
    return model


def check_model_grid(model: torch.nn.Module, points: Sequence[int], in_channels: int) -> None:
    """Run an empty batch on a grid of ``points`` nodes per axis (``x (0, *points,
    in_channels)``, ``grid (*points, len(points))``) through ``model`` in ``eval()`` mode (no
    work, no random draw): a model that meets its grid only in its forward (an FNO's Fourier
    modes need a fine enough one) raises its ``ValueError`` now, before any data are made."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(points, Sequence) or not points:
        raise TypeError(f"points: expected a sequence of node counts per axis, got {points!r}")
    shape = tuple(check_int(n, f"points[{i}]") for i, n in enumerate(points))
    in_channels = check_int(in_channels, "in_channels")
    mode = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(0, *shape, in_channels), torch.zeros(*shape, len(shape)))
    finally:
        model.train(mode)


def load_trained_model(path: str | os.PathLike[str], device: torch.device | str = "cpu"
                       ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A trained model of an example script, rebuilt from its checkpoint (``OUT/best.pt`` or
    ``OUT/last.pt``) alone: ``(model, checkpoint)``.

    ``model`` is :func:`~galerkin_ext.models.build_model`'s model under the name and arguments
    the run recorded, with the checkpoint's weights, in their precision (float64 if they all
    are, else float32), on ``device``, in ``eval()`` mode;
    ``checkpoint`` is :func:`~galerkin_ext.training.load_checkpoint`'s dict (``config`` holds
    the run's settings and, where its script records them, the data's normalisers).  A run of
    your own with a registered model records it the same way: ``config = {"model": {...}}``,
    ``model = build_run_model(config, name)``, then ``Trainer(..., run_config=config)``.

    Raises:
        FileNotFoundError, CheckpointError: see :func:`load_checkpoint`; also a checkpoint that
            does not record its model (of an older galerkin_ext, or of a Trainer run outside
            the example scripts), or whose weights do not fit it.
        ValueError: ``device`` is not a device torch has here.
    """
    device = resolve_device(device)
    state = load_checkpoint(path)  # on the CPU: torch.load takes few device spellings
    build = state["config"].get("build") if isinstance(state["config"], Mapping) else None
    if not (isinstance(build, Mapping) and isinstance(build.get("name"), str)
            and isinstance(build.get("arguments"), Mapping)):
        raise CheckpointError(
            f"{str(path)!r} does not record which model it holds (a checkpoint of an older "
            "galerkin_ext, or of a Trainer run outside the example scripts): build the model "
            "as its run did and load the checkpoint's 'model' state_dict")
    # in the weights' precision, set by a conversion (complex parameters follow it), not by the
    # default dtype, which is the whole process's (other threads would make float64 tensors)
    floating = {t.dtype for t in state["model"].values()
                if isinstance(t, torch.Tensor) and t.is_floating_point()}
    model = build_model(build["name"], **_recorded_arguments(build["name"], build["arguments"]))
    model = model.double() if floating == {torch.float64} else model.float()
    _load_weights(model, state["model"], path, f"the model it records ({build['name']!r})")
    return model.to(device).eval(), state


def evaluation_only(split: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset arguments ``split`` for a file that holds only test samples: the sizes of
    the splits before them (``n_train``, ``n_valid``) set to 0, as the datasets expect of such
    a file (a nonzero size says the file starts with those splits, and a test split reaching
    into them is refused)."""
    if not isinstance(split, Mapping):
        raise TypeError(f"split: expected a mapping of split sizes, got {type(split).__name__}")
    return {**split, **{name: 0 for name in ("n_train", "n_valid") if name in split}}


#: What the continuum scripts pick their best epoch on and step ReduceLROnPlateau with
#: (``write_metrics``' ``selection``): the validation split's relative L2 of the normalised
#: fields.  SPEC-continuum §4 says "the validation loss"; the authors' code monitors the
#: validation MSE of the normalised fields (``loss/val/mse``), not its H^1 training loss of the
#: 2-D runs, and the relative L2 is that error scaled per sample as the reported metric is.
#: Their test figures are in physical units.
VALIDATION_NORMALISED = "the validation split, in normalised units"


def write_metrics(
    out_dir: str | os.PathLike[str],
    result: Mapping[str, Any],
    model: torch.nn.Module,
    ctx: DistributedContext,
    config: Mapping[str, Any],
    test_rel_l2: float,
    *,
    selection: str = "the set that picked it",
    **extra: Any,
) -> dict[str, Any]:
    """Write ``out_dir/metrics.json`` (atomically) and print the result line; returns the dict.

    ``selection``: what the best epoch's figure in that line (the Trainer's metric, as in
    ``metrics.csv``) was measured on, e.g. normalised fields of a validation split.

    Keys: ``test_rel_l2``, ``best_epoch``, ``epochs``, ``train_seconds`` (summed over resumed
    sessions), ``n_params``, ``device``, ``device_name`` (:func:`describe_device`),
    ``world_size``, ``command`` (this process's command line), then ``extra`` (the script's own
    results, ahead of the long entries), ``config`` and ``history``.  ``result`` is what
    :meth:`~galerkin_ext.training.Trainer.fit` returned.
    """
    if not isinstance(result, Mapping) or "history" not in result:
        raise TypeError("result: expected the dict returned by Trainer.fit")
    metrics = {
        "test_rel_l2": float(test_rel_l2), "best_epoch": result["best_epoch"],
        "epochs": result["epochs"], "train_seconds": result["train_seconds"],
        "n_params": parameter_count(model), "device": str(ctx.device),
        "device_name": describe_device(ctx.device), "world_size": ctx.world_size,
        "command": command_line(),
    }
    taken = sorted(set(extra) & {*metrics, "history"})
    if taken:  # one of the two values would be lost without a word
        raise ValueError(f"extra: {', '.join(taken)} is written by write_metrics itself")
    metrics.update(extra, config=dict(config), history=result["history"])
    write_json(Path(out_dir) / "metrics.json", metrics)
    # the best epoch's figure is on the set that picked it (a validation split where the
    # script has one), which need not be the set, nor the units, of test_rel_l2
    print(f"test_rel_l2 {test_rel_l2:.4e} ({result['epochs']} epochs, "
          f"{result['train_seconds']:.0f} s of training; best epoch {result['best_epoch']}: "
          f"{result['best_metric']:.4e} on {selection})", flush=True)
    return metrics


def _leaves(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def preset_unchanged(config: Mapping[str, Any], preset: Mapping[str, Any],
                     args: argparse.Namespace) -> bool:
    """Whether ``config`` (from :func:`resolve_config`) runs ``preset`` as written, on the
    preset's own generated data (no ``--data`` or ``--eval-data`` in ``args``) and without the
    original code's attention dropout (``--reference-dropout``): every setting the preset names
    has its value (settings that change neither the model, the data nor the schedule, such as
    ``threads``, may differ).  A preset's thresholds apply only then, so call it once
    ``config`` holds every setting of the command line."""
    if not isinstance(config, Mapping) or not isinstance(preset, Mapping):
        raise TypeError("config, preset: expected dicts")
    if any(getattr(args, flag, None) not in (None, False)
           for flag in ("data", "eval_data", "reference_dropout")):
        return False
    have = _leaves(config)
    # the settings a resumption may change are those that leave the model, data and schedule
    return all(key in _RESUMABLE_CHANGES or key in have and have[key] == value
               for key, value in _leaves(preset).items())


def threshold_report(values: Mapping[str, float], thresholds: Mapping[str, float], *,
                     enforced: bool) -> dict[str, Any]:
    """Compare each ``values[name]`` with ``thresholds[name]`` (met: ``value <= threshold``)
    and print one line each; returns ``{"enforced": enforced, "checks": {name: {"value",
    "threshold", "met"}}}`` for ``metrics.json``.  Pass the result to
    :func:`enforce_thresholds` once the outputs are written."""
    if not isinstance(values, Mapping) or not isinstance(thresholds, Mapping):
        raise TypeError("values, thresholds: expected dicts of name -> number")
    missing = sorted(set(thresholds) - set(values))
    if missing:
        raise ValueError(f"values: no value for the thresholds {missing}")
    check_bool(enforced, "enforced")
    checks = {}
    for name, limit in thresholds.items():
        value = _number(values[name], f"values[{name!r}]")
        limit = _number(limit, f"thresholds[{name!r}]")
        met = value <= limit  # NaN is never met
        checks[name] = {"value": value, "threshold": limit, "met": met}
        state = ("ok" if met else "MISSED") if enforced else (
            "met" if met else "missed") + " (not enforced: settings differ from the preset)"
        print(f"threshold {name}: {value:.4e} <= {limit:.4e}? {state}", flush=True)
    return {"enforced": enforced, "checks": checks}


def _number(value: object, name: str) -> float:
    """A metric or threshold as a float (NaN allowed: a NaN metric misses every threshold)."""
    if value is None or isinstance(value, (bool, str)):
        raise TypeError(f"{name}: expected a number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {value!r}") from None


def enforce_thresholds(report: Mapping[str, Any]) -> None:
    """Raise :class:`ThresholdError` naming the missed thresholds of a
    :func:`threshold_report` if it is ``enforced`` (the example scripts then exit with 1)."""
    if not (isinstance(report, Mapping) and isinstance(report.get("enforced"), bool)
            and isinstance(report.get("checks"), Mapping)
            and all(isinstance(c, Mapping) and {"value", "threshold", "met"} <= set(c)
                    for c in report["checks"].values())):
        raise TypeError("report: expected the dict returned by threshold_report")
    missed = [f"{name} = {c['value']:.4e} > {c['threshold']:.4e}"
              for name, c in report["checks"].items() if not c["met"]]
    if report["enforced"] and missed:
        raise ThresholdError("; ".join(missed))


def error_summary(
    model: torch.nn.Module,
    dataset: Any,
    *,
    normalizer: torch.nn.Module,
    forward: Callable[..., torch.Tensor] | None = None,
    weighted: bool = True,
    device: torch.device | str = "cpu",
    batch_size: int = 16,
    ctx: DistributedContext | None = None,
) -> dict[str, float]:
    """The continuum-attention paper's statistics of ``model`` on ``dataset`` (SPEC-continuum
    §4): per-sample relative L2 errors, in physical units (``normalizer``, the targets', decodes
    prediction and target) and in the normalised units the authors' code reports.

    Returns ``{'rel_l2_median', 'rel_l2', 'rel_l2_max', 'rel_l2_median_normalized',
    'rel_l2_normalized', 'n_samples'}`` (``rel_l2`` is the mean).  ``weighted``: the norms carry
    the points' quadrature weights (:func:`~galerkin_ext.training.relative_l2_metric`).
    ``forward`` as for :func:`~galerkin_ext.training.evaluate`.
    """
    common: dict[str, Any] = {"device": device, "batch_size": batch_size, "ctx": ctx,
                              "forward": forward or default_forward}
    physical = per_sample_errors(model, dataset, **common,
                                 metric=relative_l2_metric(normalizer, weighted=weighted))
    normalized = per_sample_errors(model, dataset, **common,
                                   metric=relative_l2_metric(None, weighted=weighted))
    return {
        "rel_l2_median": float(physical.quantile(0.5)), "rel_l2": float(physical.mean()),
        "rel_l2_max": float(physical.max()),
        "rel_l2_median_normalized": float(normalized.quantile(0.5)),
        "rel_l2_normalized": float(normalized.mean()), "n_samples": int(physical.numel()),
    }


def describe_grid(coords: torch.Tensor, weight: str | None = "auto") -> dict[str, Any]:
    """What a point set and its quadrature weights were, for ``metrics.json``: ``n_points``,
    ``shape`` (the grid axes), per-axis ``spacing`` (min, max), ``uniform``, ``weights`` (how
    the model's weights were derived) and the range of the normalised weights ``w / sum w``.

    ``coords``: ``(*grid, d)``; ``weight``: the model's ``'auto'``, ``None`` (plain softmax),
    or any other string: how a model without quadrature weights treats the points (recorded as
    it is, e.g. ``'none: a spectral model'``).
    """
    from ..layers.continuum import _equispaced, auto_quadrature_weights  # the TNO's own rules

    if not isinstance(coords, torch.Tensor) or coords.ndim < 2:
        raise TypeError("coords: expected a tensor of shape (*grid, d)")
    if weight is not None and not isinstance(weight, str):
        raise TypeError(f"weight: expected 'auto', None or a description, got {weight!r}")
    flat = coords.reshape(-1, coords.shape[-1])  # in its dtype, as the model sees it
    spacing, uniform = [], True
    for axis in range(flat.shape[1]):
        values = torch.unique(flat[:, axis].double())
        gaps = values.diff()
        spacing.append([float(gaps.min()), float(gaps.max())] if gaps.numel() else [0.0, 0.0])
        uniform = uniform and _equispaced(values)  # as the weights below decide it
    record: dict[str, Any] = {"n_points": int(flat.shape[0]),
                              "shape": list(coords.shape[:-1]), "spacing": spacing,
                              "uniform": uniform}
    if weight != "auto":
        record["weights"] = "none (plain softmax)" if weight is None else weight
        return record
    w = auto_quadrature_weights(flat, "coords").double()
    w = w / w.sum()
    kind = ("trapezoid" if flat.shape[1] == 1
            else "uniform" if bool((w == w[0]).all()) else "products of per-axis cell widths")
    record.update(weights=f"auto: {kind}, derived from these coordinates",
                  weight_min=float(w.min()), weight_max=float(w.max()))
    return record


def normalizer_config(**normalizers: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """``{name: {'mean': ..., 'std': ..., 'eps': ...}}`` of unit-Gaussian normalisers, each
    statistic as nested lists in its fitted shape (a float for a scalar one): stored in the run
    configuration, so the checkpoints say how to normalise; :func:`normalizers_from_config`
    rebuilds them."""
    out = {}
    for name, norm in normalizers.items():
        if not isinstance(norm, UnitGaussianNormalizer):
            raise TypeError(f"{name}: expected a UnitGaussianNormalizer, got "
                            f"{type(norm).__name__}")
        out[name] = {"mean": norm.mean.tolist(), "std": norm.std.tolist(), "eps": norm.eps}
    return out


def normalizers_from_config(config: Mapping[str, Mapping[str, Any]]
                            ) -> dict[str, UnitGaussianNormalizer]:
    """The normalisers that :func:`normalizer_config` recorded, by name, in float64 and their
    fitted shapes and with their ``eps`` (``checkpoint["config"]["normalizers"]`` of an
    example script's run): e.g. ``DarcyDataset(..., input_normalizer=normalizers["input"])``.
    (Records written before 2026-11-30 lack ``eps``: theirs is the grid datasets' default,
    1e-5; the GNOT scripts' normalisers took 1e-8, which :meth:`RaggedNormalizers.from_config
    <galerkin_ext.data.RaggedNormalizers.from_config>` gives them. Records written before
    2026-11-29 hold flattened statistics: a grid's come back 1-D; reshape them with
    :meth:`UnitGaussianNormalizer.from_statistics`.)"""
    if not isinstance(config, Mapping):
        raise TypeError(f"config: expected a dict of statistics by name, got "
                        f"{type(config).__name__}")
    rebuilt = {}
    for name, stats in config.items():
        mean, std = recorded_statistics(stats, f"config[{name!r}]")
        rebuilt[name] = UnitGaussianNormalizer.from_statistics(
            mean, std, recorded_eps(stats, f"config[{name!r}]", UNIT_GAUSSIAN_EPS))
    return rebuilt


def command_line() -> str:
    """This process's command line, as a shell would take it back: ``python script.py ...``."""
    return shlex.join(["python", *sys.argv])


def describe_device(device: torch.device | str) -> str:
    """What a run ran on, for its records: the GPU's name, or the CPU's model and torch's
    thread count (e.g. ``'AMD EPYC 7B13, 1 of 2 cores (torch threads)'``)."""
    device = resolve_device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass  # not Linux: platform's answer
    return f"{model}, {torch.get_num_threads()} of {os.cpu_count()} cores (torch threads)"


def default_cache_dir() -> Path:
    """``$GALERKIN_EXT_CACHE``, else ``$XDG_CACHE_HOME/galerkin_ext``, else
    ``~/.cache/galerkin_ext``."""
    if os.environ.get("GALERKIN_EXT_CACHE"):
        return Path(os.environ["GALERKIN_EXT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "galerkin_ext"


def cached_data(
    problem: str,
    cache_dir: str | os.PathLike[str] | None = None,
    ctx: DistributedContext | None = None,
    *,
    progress: bool = True,
    **params: Any,
) -> Path:
    """Path of a generated ``problem`` data set (``'burgers'``, ``'darcy'``, ``'lorenz63'``,
    ``'cde'``, ``'heat'``, ``'elasticity'``, ``'kolmogorov'``), generated if needed.

    ``params`` are keyword arguments of that problem's generator
    (:func:`~galerkin_ext.data.generate_burgers`, :func:`~galerkin_ext.data.generate_darcy`,
    :func:`~galerkin_ext.data.generate_lorenz63`, :func:`~galerkin_ext.data.generate_cde`,
    :func:`~galerkin_ext.data.generate_kolmogorov`, ...;
    e.g. ``n_samples``, ``resolution``, ``coef``, ``dt``, ``grid``, ``seed``); the file name
    holds a hash of them, so other parameters give another file.  An interrupted generation
    resumes.  Under ``torchrun`` only rank 0 generates while the others wait.  ``progress``:
    the generator's progress bar (not a parameter of the data: the same file either way).
    """
    if problem not in _PROBLEMS:
        raise ValueError(f"problem: expected one of {list(_PROBLEMS)}, got {problem!r}")
    from ..data import generate  # lazy: the solvers are only needed when data are generated

    fn = getattr(generate, _PROBLEMS[problem])
    key = json.dumps(params, sort_keys=True, default=str)
    digest = hashlib.sha256(f"{problem}:{key}".encode()).hexdigest()[:12]
    folder = check_path(cache_dir, "cache_dir") if cache_dir is not None else default_cache_dir()
    if problem in ("lorenz63", "cde"):  # time grids: the spacing or the grid's name
        grid = ("nonuniform" if params.get("grid") == "nonuniform"
                else f"dt{params.get('dt', 'default')}")
    elif problem in ("heat", "elasticity"):  # meshes: their spacing
        grid = f"h{params.get('h', 'default')}{'_refined' if params.get('refine') else ''}"
    else:
        grid = f"r{params.get('resolution', 'default')}"
    kind = f"_{params['coef']}" if params.get("coef") else ""
    path = folder / (f"{problem}{kind}_n{params.get('n_samples', 'default')}_{grid}_"
                     f"{digest}.h5")
    ctx = ctx or DistributedContext()
    if ctx.is_main and not path.is_file():
        why = cannot_make_folder(folder)  # e.g. a file on the way
        if why is not None:
            raise ConfigError(f"cache_dir: cannot create the folder {str(folder)!r} ({why})")
        why = cannot_write_in(folder)  # (tried: root passes os.access where /proc refuses)
        if why is not None:
            raise ConfigError(f"cache_dir: the folder {str(folder)!r} is not writable ({why})")
        # One process generates a cached file; another that needs it waits, then reuses it
        # (two at once both wrote into the one partial file, or one called it corrupt).
        def waiting() -> None:
            print(f"waiting for another process to finish generating {path}", flush=True)

        with file_lock(folder / f".{path.name}.lock", wait=True, on_wait=waiting):
            if not path.is_file():
                print(f"generating {problem} data into {path} (once; later runs reuse it)",
                      flush=True)
                partial = path.with_name(path.name + ".partial")
                try:
                    fn(path, resume=partial.is_file(), progress=progress, **params)
                except DamagedPartialFileError as err:  # (the cache's own: made again)
                    print(f"cannot resume the interrupted generation ({err}); starting it "
                          "again", flush=True)
                    fn(path, overwrite=True, progress=progress, **params)
    ctx.barrier()
    return path


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; works without a display
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("prediction.png needs matplotlib: pip install matplotlib") from err
    return plt


def _save_figure(fig: Any, path: str | os.PathLike[str]) -> Path:
    plt = _pyplot()
    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)


def _check_fields(fields: Sequence[object], what: str) -> None:
    """The plots' fields, ``(S, n, C)`` or ``(S, n, n)``: tensors of three axes and one shape,
    some samples."""
    if not all(isinstance(f, torch.Tensor) for f in fields):
        raise TypeError(f"{what}: expected tensors, got {[type(f).__name__ for f in fields]}")
    # (ignore: all() of isinstance narrows no item of fields)
    shapes = {tuple(f.shape) for f in fields}  # type: ignore[attr-defined]
    if len(shapes) != 1 or any(len(s) != 3 or s[0] == 0 for s in shapes):
        raise ValueError(f"{what}: expected tensors of one shape (S, ., .) with S >= 1 "
                         f"samples, got {sorted(shapes)}")


def _arrays(*tensors: torch.Tensor) -> list:
    """The tensors as numpy arrays for matplotlib (detached, on the CPU, floats as float64):
    given tensors, numpy 2 warns for each (a tensor's ``__array__`` takes no ``copy``), and one
    that requires grad or is bfloat16 (no numpy dtype) fails."""
    return [(t.detach().cpu().double() if t.is_floating_point() else t.detach().cpu()).numpy()
            for t in tensors]


def plot_1d(
    path: str | os.PathLike[str],
    grid: torch.Tensor,
    pred: torch.Tensor,
    target: torch.Tensor,
    title: str = "",
    components: Sequence[str] | None = None,
    xlabel: str = "x",
) -> Path:
    """Truth and prediction (top) and their difference (bottom) for each sample.

    ``grid (n,)`` or ``(n, 1)``, any increasing points; ``pred``, ``target`` ``(S, n, C)`` for
    ``S`` samples of ``C`` components (one colour each; ``components`` names them);
    ``xlabel`` names the grid's variable (e.g. ``'t'``).
    """
    _check_fields([pred, target], "pred, target")
    if not isinstance(grid, torch.Tensor):
        raise TypeError(f"grid: expected a tensor of shape (n,) or (n, 1), got "
                        f"{type(grid).__name__}")
    if grid.dim() not in (1, 2) or grid.dim() == 2 and grid.shape[1] != 1:
        raise ValueError(f"grid: expected shape (n,) or (n, 1), got {tuple(grid.shape)}")
    if grid.numel() != pred.shape[1]:
        raise ValueError(f"grid: expected {pred.shape[1]} points, got {grid.numel()}")
    grid, pred, target = _arrays(grid.reshape(-1), pred, target)
    n_comp = pred.shape[2]
    if components is None:
        components = [""] * n_comp if n_comp == 1 else [f"c{c}" for c in range(n_comp)]
    if isinstance(components, str) or len(components) != n_comp:
        raise ValueError(f"components: expected {n_comp} names, got {components!r}")
    plt = _pyplot()
    s = pred.shape[0]
    fig, axes = plt.subplots(2, s, figsize=(4 * s, 5), sharex=True, squeeze=False)
    truth_colors, pred_colors = ("k", "tab:gray", "tab:brown"), ("r", "tab:orange", "m")
    for i in range(s):
        top, bottom = axes[0, i], axes[1, i]
        for c, name in enumerate(components):
            label = f" {name}" if name else ""
            top.plot(grid, target[i, :, c], "-", color=truth_colors[c % 3], lw=2,
                     label=f"truth{label}")
            top.plot(grid, pred[i, :, c], "--", color=pred_colors[c % 3], lw=1.5,
                     label=f"prediction{label}")
            bottom.plot(grid, pred[i, :, c] - target[i, :, c], "-", lw=1, label=name or None)
        top.set_title(f"sample {i}")
        bottom.set_xlabel(xlabel)
    axes[0, 0].legend()
    if n_comp > 1:
        axes[1, 0].legend()
    axes[1, 0].set_ylabel("prediction - truth")
    fig.suptitle(title)
    fig.tight_layout()
    return _save_figure(fig, path)


def plot_mesh(
    path: str | os.PathLike[str],
    points: Sequence[torch.Tensor],
    triangles: Sequence[torch.Tensor | None],
    pred: Sequence[torch.Tensor],
    target: Sequence[torch.Tensor],
    title: str = "",
    label: str = "",
) -> Path:
    """One row per sample on its triangle mesh (``tripcolor``): truth, prediction, difference.

    Per sample ``points (N, 2)``, ``triangles (T, 3)`` vertex indices or ``None`` (points
    without a mesh, e.g. converted Geo-FNO data: drawn as coloured dots, since a triangulation
    of the points would fill holes), ``pred`` and ``target`` ``(N,)`` values at the vertices;
    ``label`` names the field.
    """
    if not all(isinstance(a, Sequence) for a in (points, triangles, pred, target)) or not (
            len(points) == len(triangles) == len(pred) == len(target)) or not points:
        raise ValueError("points, triangles, pred, target: expected one entry per sample each "
                         "(lists)")
    for i, (xy, tri, guess, truth) in enumerate(zip(points, triangles, pred, target,
                                                    strict=True)):
        if not all(isinstance(t, torch.Tensor) for t in (xy, guess, truth)) or (
                tri is not None and not isinstance(tri, torch.Tensor)):
            raise TypeError(f"points[{i}], triangles[{i}], pred[{i}], target[{i}]: expected "
                            "tensors (triangles may be None)")
        n = xy.shape[0]
        if xy.shape != (n, 2) or (tri is not None and (tri.ndim != 2 or tri.shape[1] != 3)):
            raise ValueError(f"points[{i}], triangles[{i}]: expected (N, 2) and (T, 3) or None, "
                             f"got {tuple(xy.shape)} and "
                             f"{None if tri is None else tuple(tri.shape)}")
        if guess.shape != (n,) or truth.shape != (n,):
            raise ValueError(f"pred[{i}], target[{i}]: expected ({n},), one value per point, "
                             f"got {tuple(guess.shape)} and {tuple(truth.shape)}")
    plt = _pyplot()
    s = len(points)
    fig, axes = plt.subplots(s, 3, figsize=(11, 3.2 * s), squeeze=False)
    for i in range(s):
        xy, truth, guess = _arrays(points[i], target[i], pred[i])
        # (cast: mypy narrows no item indexed by a variable)
        tri = None if triangles[i] is None else _arrays(cast(torch.Tensor, triangles[i]))[0]
        low, high = float(min(truth.min(), guess.min())), float(max(truth.max(), guess.max()))
        for ax, values, name, limits in ((axes[i, 0], truth, f"truth {label}", (low, high)),
                                         (axes[i, 1], guess, "prediction", (low, high)),
                                         (axes[i, 2], guess - truth, "prediction - truth",
                                          (None, None))):
            if tri is None:
                image = ax.scatter(xy[:, 0], xy[:, 1], c=values, s=8, vmin=limits[0],
                                   vmax=limits[1])
            else:
                image = ax.tripcolor(xy[:, 0], xy[:, 1], tri, values, shading="gouraud",
                                     vmin=limits[0], vmax=limits[1])
            ax.set_aspect("equal")
            ax.set_title(f"sample {i}: {name}")
            fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    return _save_figure(fig, path)


def point_set_forward(weight: str | None,
                      ) -> Callable[[torch.nn.Module, Mapping[str, Any]], torch.Tensor]:
    """``forward(model, batch)`` of the :class:`~galerkin_ext.training.Trainer` for a
    :class:`~galerkin_ext.models.TNO` on ``batch['x'] (B, N, c)`` at the batch's shared points
    ``batch['grid'][0] (N, d)``, with ``batch['token0']`` where the batch has one.

    ``weight='auto'``: the quadrature weights are derived here
    (:func:`~galerkin_ext.layers.auto_quadrature_weights`), outside the model, so that a
    compiled model is one graph (inside it the rule, which branches on the points' values,
    broke a compiled TNO's graph five times, and ``fullgraph=True`` refused it); ``None``:
    plain softmax attention.
    """
    check_choice(weight, "weight", ("auto", None))

    def forward(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        points = batch["grid"][0]
        w = None if weight is None else auto_quadrature_weights(points)
        return model(batch["x"], points, weight=w, token0=batch.get("token0"))

    return forward


def ragged_forward(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """``forward(model, batch)`` of the :class:`~galerkin_ext.training.Trainer` for padded
    ragged batches (:func:`~galerkin_ext.data.collate_ragged`) and GNOT's models:
    ``model(x, inputs, theta, weight=, input_weights=)``."""
    return model(batch["x"], batch["inputs"], batch["theta"], weight=batch["weight"],
                 input_weights=batch["input_weights"])


def ragged_metric(dataset: Any, channel: int | None = None,
                  ) -> Callable[[torch.Tensor, Mapping[str, Any]], torch.Tensor]:
    """``metric(pred, batch) -> (B,)``: per-sample relative L2 over the valid points in
    physical units (``dataset.decode_target``), the mean over the target channels
    (SPEC-gnot §3), or that of target channel ``channel`` alone."""
    from ..losses import masked_relative_l2

    if channel is not None:
        check_int(channel, "channel", minimum=0)

    def metric(pred: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
        decode = dataset.decode_target
        # (in the model's precision: half types rise to float32 in the decode and the norms)
        errors = masked_relative_l2(decode(pred), decode(batch["target"]), batch["mask"],
                                    reduction="none")  # (B, C)
        if channel is None:
            return errors.mean(dim=1)
        if channel >= errors.shape[1]:
            raise ValueError(f"channel: expected < {errors.shape[1]} (the target channels), "
                             f"got {channel}")
        return errors[:, channel]

    return metric


def ragged_channel_errors(model: torch.nn.Module, dataset: Any, *, batch_size: int,
                          device: torch.device | str = "cpu") -> list[float]:
    """The mean relative L2 (physical units) of each target channel of ``model`` over
    ``dataset`` (a :class:`~galerkin_ext.data.RaggedDataset`): SPEC-gnot §5's per-channel
    errors, whose mean is the overall figure."""
    channels = int(dataset.normalizers.target.mean.shape[0])
    return [float(per_sample_errors(model, dataset, device=device, batch_size=batch_size,
                                    forward=ragged_forward,
                                    metric=ragged_metric(dataset, channel=c)).mean())
            for c in range(channels)]


def plot_ragged_predictions(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    dataset: Any,
    data_file: str | os.PathLike[str],
    n_samples: int,
    *,
    device: torch.device | str = "cpu",
    title: str = "",
) -> Path:
    """:func:`plot_mesh` of ``model``'s predictions (first target channel, physical units)
    for the first ``n_samples`` items of a :class:`~galerkin_ext.data.RaggedDataset` read from
    ``data_file`` (whose meshes are drawn, or the points where the file has none)."""
    from ..data import read_ragged
    from .trainer import predict

    shown = list(range(min(n_samples, len(dataset))))
    pred, batch = predict(model, dataset, shown, device=device, forward=ragged_forward)
    raw = read_ragged(data_file, [int(i) for i in dataset.indices[shown]])
    samples = [raw.sample(j) for j in range(len(shown))]
    lengths = batch["lengths"].tolist()
    return plot_mesh(path, [torch.as_tensor(s["query"]["points"]) for s in samples],
                     [None if s["triangles"] is None else torch.as_tensor(s["triangles"])
                      for s in samples],
                     [dataset.decode_target(pred[j, :n])[:, 0] for j, n in enumerate(lengths)],
                     [torch.as_tensor(s["target"][:, 0]) for s in samples], title=title,
                     label=dataset.target_names[0])


def plot_2d(
    path: str | os.PathLike[str],
    inputs: torch.Tensor,
    pred: torch.Tensor,
    target: torch.Tensor,
    input_label: str = "input",
    title: str = "",
) -> Path:
    """One row per sample: input, truth, prediction, difference (images on ``[0, 1]^2``).

    ``inputs (S, n, n)``, ``pred`` and ``target`` ``(S, m, m)`` (``m`` may differ from ``n``).
    """
    _check_fields([pred, target], "pred, target")
    _check_fields([inputs], "inputs")
    if inputs.shape[0] != pred.shape[0]:
        raise ValueError(f"inputs: expected {pred.shape[0]} samples, got {inputs.shape[0]}")
    inputs, pred, target = _arrays(inputs, pred, target)
    plt = _pyplot()
    s = pred.shape[0]
    fig, axes = plt.subplots(s, 4, figsize=(14, 3.2 * s), squeeze=False)
    for i in range(s):
        panels = (
            (inputs[i], input_label, "viridis"),
            (target[i], "truth", "viridis"),
            (pred[i], "prediction", "viridis"),
            (pred[i] - target[i], "prediction - truth", "RdBu_r"),
        )
        for ax, (field, label, cmap) in zip(axes[i], panels, strict=True):
            # Row index i of a field is x_i: transpose so x runs left to right, y upwards.
            # The difference gets limits symmetric about 0, so white means "no error".
            lim = float(abs(field).max()) if cmap == "RdBu_r" else None
            img = ax.imshow(field.T, origin="lower", extent=(0, 1, 0, 1), cmap=cmap,
                            vmin=-lim if lim else None, vmax=lim)
            fig.colorbar(img, ax=ax, shrink=0.8)
            ax.set_title(f"{label} (sample {i})", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title)
    fig.tight_layout()
    return _save_figure(fig, path)
