"""What the example scripts share besides the :class:`~galerkin_ext.training.Trainer`.

* :func:`experiment_parser` and :func:`resolve_config` -- the common command line (``--preset``,
  ``--attention``, ``--norm``, ``--data``, ``--device``, ``--out``, ``--resume``, overrides) and
  its merge into a preset's config;
* :func:`cached_data` -- generate a data set once and reuse it, keyed by the generator's
  parameters, under :func:`default_cache_dir`;
* :func:`plot_1d`, :func:`plot_2d` -- ``prediction.png`` (needs matplotlib).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._cli import positive_float, positive_int
from .checkpoint import atomic_write, write_json
from .distributed import DistributedContext

__all__ = [
    "ATTENTION_TYPES",
    "cached_data",
    "default_cache_dir",
    "describe_device",
    "experiment_parser",
    "plot_1d",
    "plot_2d",
    "record_data_files",
    "resolve_config",
    "run_main",
    "write_metrics",
]

ATTENTION_TYPES = ("fourier", "galerkin", "softmax", "linear")
NORMS = ("attn", "layer")
_PROBLEMS = ("burgers", "darcy")


def experiment_parser(description: str, presets: Mapping[str, Any]) -> argparse.ArgumentParser:
    """The command line every example shares; scripts add their own resolution flags.

    Overrides (``--epochs``, ``--batch-size``, ``--lr``, ``--n-train``, ``--n-eval``, ``--seed``,
    ``--precision``) default to ``None``: "keep the preset's value".
    """
    if not isinstance(presets, Mapping) or not presets:
        raise ValueError("presets: expected a non-empty dict of preset name -> config")
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(presets), default=next(iter(presets)),
                   help="configuration block at the top of the script (default: %(default)s)")
    p.add_argument("--attention", choices=ATTENTION_TYPES, default=None,
                   help="attention type (default: the preset's)")
    p.add_argument("--norm", choices=NORMS, default="attn",
                   help="'attn': layer norm inside the attention (the paper's 'Ln on Q,K / K,V' "
                        "rows); 'layer': regular layer norm on the residual stream")
    p.add_argument("--reference-dropout", action="store_true",
                   help="the original code's always-on p = 0.5 dropout of the attention matrix "
                        "(in training and evaluation), to compare with its published numbers")
    p.add_argument("--data", default=None,
                   help="data file: a galerkin_ext .h5 or an original .mat (default: generate "
                        "the preset's data once and cache it)")
    p.add_argument("--eval-data", default=None,
                   help="separate evaluation file (e.g. the original test .mat); default --data")
    p.add_argument("--data-dir", default=None,
                   help="cache folder of generated data (default: $GALERKIN_EXT_CACHE or "
                        "~/.cache/galerkin_ext)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto (default)")
    p.add_argument("--out", required=True, help="output folder (checkpoints, metrics, plot)")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/last.pt if it exists (same settings)")
    p.add_argument("--epochs", type=positive_int, default=None)
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="global batch size (split over torchrun processes)")
    p.add_argument("--lr", type=positive_float, default=None, help="OneCycle max_lr")
    p.add_argument("--n-train", type=positive_int, default=None, help="training samples")
    p.add_argument("--n-eval", type=positive_int, default=None, help="evaluation samples")
    p.add_argument("--seed", type=int, default=None, help="training seed (model init, order)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                   help="bf16: autocast on CUDA")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads of torch (default: the preset's 'threads', else torch's)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    p.add_argument("--tensorboard", action="store_true", help="log to OUT/tensorboard")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def resolve_config(presets: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A deep copy of ``presets[args.preset]`` with the command-line overrides applied.

    The preset must have the keys ``data`` (generator parameters), ``n_train``, ``n_eval``,
    ``model`` (arguments of :func:`~galerkin_ext.models.build_model`; ``attention_type`` is the
    default for ``--attention``) and ``train`` (arguments of
    :class:`~galerkin_ext.training.TrainConfig`), optionally ``threads`` (CPU threads; ``None``:
    torch's default).  Data generated for the preset hold
    ``n_train + n_eval`` samples unless the preset's ``data`` says ``n_samples``.
    """
    if not isinstance(args, argparse.Namespace) or args.preset not in presets:
        raise ValueError(f"args.preset: expected one of {list(presets)}")
    cfg = copy.deepcopy(dict(presets[args.preset]))
    missing = [k for k in ("data", "n_train", "n_eval", "model", "train") if k not in cfg]
    if missing:
        raise ValueError(f"presets[{args.preset!r}]: missing keys {missing}")
    cfg["preset"] = args.preset
    cfg["threads"] = args.threads or cfg.get("threads")
    for key in ("n_train", "n_eval"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cfg["data"].setdefault("n_samples", cfg["n_train"] + cfg["n_eval"])
    if cfg["data"]["n_samples"] < cfg["n_train"] + cfg["n_eval"]:
        cfg["data"]["n_samples"] = cfg["n_train"] + cfg["n_eval"]
    if args.attention is not None:
        cfg["model"]["attention_type"] = args.attention
    cfg["model"]["norm"] = args.norm
    if args.reference_dropout:
        cfg["model"]["reference_dropout"] = True
    train = cfg["train"]
    for key, name in (("epochs", "epochs"), ("batch_size", "batch_size"), ("max_lr", "lr"),
                      ("seed", "seed"), ("precision", "precision")):
        if getattr(args, name) is not None:
            train[key] = getattr(args, name)
    train.update(num_workers=args.workers, progress=not args.no_progress,
                 tensorboard=args.tensorboard)
    return cfg


def run_main(main: Callable[[], object]) -> int:
    """Run an example script's ``main()``; Ctrl-C ends it with one line instead of a traceback.

    Returns the exit status: 0, or 130 after an interrupt (``last.pt`` keeps the last finished
    epoch for ``--resume``).
    """
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted; OUT/last.pt holds the last finished epoch: rerun the same command "
              "with --resume to continue", file=sys.stderr)
        return 130
    return 0


def record_data_files(config: dict[str, Any], data: str | os.PathLike[str],
                      eval_data: str | os.PathLike[str] | None) -> None:
    """Store the absolute paths of the training and evaluation data files in ``config`` as
    ``data_files``: the run configuration a resumed run must match (another file is other
    data)."""
    config["data_files"] = {"train": str(Path(data).resolve()),
                            "eval": str(Path(eval_data or data).resolve())}


def write_metrics(
    out_dir: str | os.PathLike[str],
    result: Mapping[str, Any],
    model: torch.nn.Module,
    ctx: DistributedContext,
    config: Mapping[str, Any],
    test_rel_l2: float,
    **extra: Any,
) -> dict[str, Any]:
    """Write ``out_dir/metrics.json`` (atomically) and print the result line; returns the dict.

    Keys: ``test_rel_l2``, ``best_epoch``, ``epochs``, ``train_seconds`` (summed over resumed
    sessions), ``n_params``, ``device``, ``device_name`` (:func:`describe_device`),
    ``world_size``, ``command`` (this process's command line), ``config``, ``history``, then
    ``extra``.  ``result`` is what :meth:`~galerkin_ext.training.Trainer.fit` returned.
    """
    if not isinstance(result, Mapping) or "history" not in result:
        raise TypeError("result: expected the dict returned by Trainer.fit")
    metrics = {
        "test_rel_l2": float(test_rel_l2), "best_epoch": result["best_epoch"],
        "epochs": result["epochs"], "train_seconds": result["train_seconds"],
        "n_params": sum(p.numel() for p in model.parameters()), "device": str(ctx.device),
        "device_name": describe_device(ctx.device), "world_size": ctx.world_size,
        "command": command_line(), **extra, "config": dict(config),
        "history": result["history"],
    }
    write_json(Path(out_dir) / "metrics.json", metrics)
    print(f"evaluation relative L2: {test_rel_l2:.4e} (best epoch {result['best_epoch']} of "
          f"{result['epochs']}, {result['train_seconds']:.0f} s of training)", flush=True)
    return metrics


def command_line() -> str:
    """This process's command line, as a shell would take it back: ``python script.py ...``."""
    return shlex.join(["python", *sys.argv])


def describe_device(device: torch.device | str) -> str:
    """What a run ran on, for its records: the GPU's name, or the CPU's model and torch's
    thread count (e.g. ``'AMD EPYC 7B13, 1 of 2 cores (torch threads)'``)."""
    device = torch.device(device)
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
    **params: Any,
) -> Path:
    """Path of a generated ``problem`` (``'burgers'``/``'darcy'``) data set, generated if needed.

    ``params`` are keyword arguments of :func:`~galerkin_ext.data.generate_burgers` /
    :func:`~galerkin_ext.data.generate_darcy` (e.g. ``n_samples``, ``resolution``, ``seed``);
    the file name holds a hash of them, so other parameters give another file.  An interrupted
    generation resumes.  Under ``torchrun`` only rank 0 generates while the others wait.
    """
    if problem not in _PROBLEMS:
        raise ValueError(f"problem: expected one of {_PROBLEMS}, got {problem!r}")
    from ..data import generate  # lazy: the solvers are only needed when data are generated

    fn = generate.generate_burgers if problem == "burgers" else generate.generate_darcy
    key = json.dumps(params, sort_keys=True, default=str)
    digest = hashlib.sha256(f"{problem}:{key}".encode()).hexdigest()[:12]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = folder / (f"{problem}_n{params.get('n_samples', 'default')}_"
                     f"r{params.get('resolution', 'default')}_{digest}.h5")
    ctx = ctx or DistributedContext()
    if ctx.is_main and not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        print(f"generating {problem} data into {path} (once; later runs reuse it)", flush=True)
        partial = path.with_name(path.name + ".partial")
        fn(path, resume=partial.is_file(), **params)
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


def _check_fields(fields: Sequence[torch.Tensor], ndim: int, what: str) -> None:
    shapes = {tuple(f.shape) for f in fields}
    if len(shapes) != 1 or any(f.ndim != ndim for f in fields):
        raise ValueError(f"{what}: expected tensors of one shape with {ndim} axes, "
                         f"got {[tuple(f.shape) for f in fields]}")


def plot_1d(
    path: str | os.PathLike[str],
    grid: torch.Tensor,
    pred: torch.Tensor,
    target: torch.Tensor,
    title: str = "",
) -> Path:
    """Truth and prediction (top) and their difference (bottom) for each sample.

    ``grid (n,)`` or ``(n, 1)``; ``pred``, ``target`` ``(S, n, 1)`` for ``S`` samples.
    """
    _check_fields([pred, target], 3, "pred, target")
    grid = grid.reshape(-1).cpu()
    if grid.numel() != pred.shape[1]:
        raise ValueError(f"grid: expected {pred.shape[1]} points, got {grid.numel()}")
    plt = _pyplot()
    s = pred.shape[0]
    fig, axes = plt.subplots(2, s, figsize=(4 * s, 5), sharex=True, squeeze=False)
    for i in range(s):
        top, bottom = axes[0, i], axes[1, i]
        top.plot(grid, target[i, :, 0].cpu(), "k-", lw=2, label="truth")
        top.plot(grid, pred[i, :, 0].cpu(), "r--", lw=1.5, label="prediction")
        bottom.plot(grid, (pred[i, :, 0] - target[i, :, 0]).cpu(), "b-", lw=1)
        top.set_title(f"sample {i}")
        bottom.set_xlabel("x")
    axes[0, 0].legend()
    axes[1, 0].set_ylabel("prediction - truth")
    fig.suptitle(title)
    fig.tight_layout()
    return _save_figure(fig, path)


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
    _check_fields([pred, target], 3, "pred, target")
    _check_fields([inputs], 3, "inputs")
    if inputs.shape[0] != pred.shape[0]:
        raise ValueError(f"inputs: expected {pred.shape[0]} samples, got {inputs.shape[0]}")
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
            lim = float(field.abs().max()) if cmap == "RdBu_r" else None
            img = ax.imshow(field.cpu().T, origin="lower", extent=(0, 1, 0, 1), cmap=cmap,
                            vmin=-lim if lim else None, vmax=lim)
            fig.colorbar(img, ax=ax, shrink=0.8)
            ax.set_title(f"{label} (sample {i})", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title)
    fig.tight_layout()
    return _save_figure(fig, path)
