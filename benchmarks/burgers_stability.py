"""Why the Burgers paper preset scales its output: the paper's protocol with and without.

    python benchmarks/burgers_stability.py --out benchmarks/results/burgers_stability.json

Trains the paper preset of ``examples/burgers.py`` (SPEC §5: the 530,305-parameter model,
1024 samples at ``--n``, Adam + OneCycle over 100 epochs, batch 8, clip 0.999, loss rel. L2 +
sqrt(gamma h) rel. H^1) for its first ``--epochs`` epochs, in two arms with the same initial
weights and batch order:

* ``raw``: the network's output is the prediction, as in the original code;
* ``scaled``: the output is multiplied by the training targets' std (``examples/burgers.py``).

The loss is relative, so it does not change when prediction and target are scaled together:
both arms minimise the same objective and differ only in the scale the network must produce
(std(u(., 1)) ~ 0.01 against std(u0) ~ 0.6) under Adam's steps of fixed size.  Per epoch it
records the learning rate, the training loss (mean and worst batch), the gradient norm before
clipping (median and max), the ratio ||prediction|| / ||target|| and the evaluation rel. L2.
The arms run in parallel processes, one thread each.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import original  # benchmarks/original.py: the script's folder is first on sys.path
import torch
from torch.utils.data import DataLoader

from galerkin_ext._cli import writable_file
from galerkin_ext.data import BurgersDataset
from galerkin_ext.data.storage import DataFileError
from galerkin_ext.layers import ATTENTION_TYPES
from galerkin_ext.losses import OperatorLoss, relative_l2
from galerkin_ext.models import build_model
from galerkin_ext.training import cached_data, check_model_grid, command_line, write_json

ARMS = ("raw", "scaled")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "burgers.py"


def _example() -> Any:
    """``examples/burgers.py`` as a module: its paper preset is the one place of the settings."""
    return original.exec_file("burgers_example", EXAMPLE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=writable_file, required=True, help="JSON file to write")
    p.add_argument("--data", default=None, help="Burgers HDF5/.mat file (default: the paper "
                                                 "preset's generated and cached data)")
    p.add_argument("--n", type=int, default=512, help="training resolution (default 512)")
    p.add_argument("--epochs", type=int, default=16,
                   help="epochs to run of the 100-epoch schedule (default 16: the raw arm "
                        "diverged in epoch 15 at n = 512)")
    p.add_argument("--attention", choices=ATTENTION_TYPES, default="galerkin",
                   help="attention type (default galerkin)")
    p.add_argument("--n-train", type=int, default=None, help="training samples (preset: 1024)")
    p.add_argument("--n-eval", type=int, default=None, help="evaluation samples (preset: 100)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (preset: 8)")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of "
                                                          f"{ARMS}")
    args = p.parse_args(argv)
    args.arms = args.arms.split(",")
    if (not args.arms or any(a not in ARMS for a in args.arms)
            or len(set(args.arms)) < len(args.arms)):  # (an arm twice trained it twice)
        p.error(f"--arms: expected a comma-separated subset of {ARMS}, got {args.arms}")
    for name in ("n", "epochs", "n_train", "n_eval", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got {value}")
    preset = _example().PRESETS["paper"]
    # the model's own check of the grid: its spectral layers need n >= 2 modes - 2 points
    # (--n 16 failed in the workers, after the data were made)
    try:
        check_model_grid(build_model("burgers", **{**preset["model"],
                                                   "attention_type": args.attention}),
                         (args.n,), in_channels=1)
    except ValueError as err:
        p.error(f"--n: {err}")
    if args.epochs > preset["train"]["epochs"]:
        p.error(f"--epochs: at most the schedule's {preset['train']['epochs']}, got {args.epochs}")
    n_train = args.n_train or preset["n_train"]
    args.batch_size = args.batch_size or preset["train"]["batch_size"]
    if args.batch_size > n_train:
        p.error(f"--batch-size: at most the {n_train} training samples (full batches only), "
                f"got {args.batch_size}")
    return args


def datasets(args: argparse.Namespace, data: str) -> tuple[BurgersDataset, BurgersDataset]:
    """The training and evaluation sets of ``data`` at ``args.n`` (the paper preset's split
    unless overridden)."""
    cfg = _example().PRESETS["paper"]
    split = {"n_train": args.n_train or cfg["n_train"], "n_test": args.n_eval or cfg["n_eval"]}
    train_set = BurgersDataset(data, "train", args.n, **split)
    return train_set, BurgersDataset(data, "test", args.n, **split,
                                     target_normalizer=train_set.target_normalizer)


def run_arm(arm: str, args: argparse.Namespace, data: str) -> dict[str, Any]:
    """Train one arm for ``args.epochs`` epochs; one record per epoch."""
    torch.set_num_threads(1)
    example = _example()
    cfg = example.PRESETS["paper"]
    train_cfg = cfg["train"]
    train_set, eval_set = datasets(args, data)
    torch.manual_seed(train_cfg["seed"])
    model = build_model("burgers", **{**cfg["model"], "attention_type": args.attention})
    if arm == "scaled":
        norm = train_set.target_normalizer
        model.denormalizer.set_statistics(norm.mean, norm.std, eps=norm.eps)
    loss_fn = OperatorLoss(gamma=example.GAMMA, h=1.0 / args.n)
    loader = DataLoader(train_set, batch_size=args.batch_size,
                        shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(train_cfg["seed"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=train_cfg["max_lr"])
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=train_cfg["max_lr"], div_factor=train_cfg["div_factor"],
        final_div_factor=train_cfg["final_div_factor"], pct_start=train_cfg["pct_start"],
        epochs=train_cfg["epochs"], steps_per_epoch=len(loader))
    records, start = [], time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        losses, grad_norms, ratios = [], [], []
        for batch in loader:
            pred = model(batch["x"], batch["grid"][0])
            loss, _ = loss_fn(pred, batch["target"], batch["target_grad"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                                   train_cfg["grad_clip"])))
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            ratios.append((pred.detach().flatten(1).norm(dim=1)
                           / batch["target"].flatten(1).norm(dim=1)).mean().item())
        model.eval()
        with torch.no_grad():
            eval_rel_l2 = relative_l2(model(eval_set.x, eval_set.grid), eval_set.target).item()
        records.append({
            "epoch": epoch, "lr": scheduler.get_last_lr()[0],
            "train_loss": statistics.fmean(losses), "train_loss_max": max(losses),
            "grad_norm_median": statistics.median(grad_norms), "grad_norm_max": max(grad_norms),
            "pred_over_target_norm": statistics.fmean(ratios), "eval_rel_l2": eval_rel_l2,
            "seconds": time.perf_counter() - start,
        })
        r = records[-1]
        print(f"{arm:>6} epoch {epoch:3d}  lr {r['lr']:.2e}  train {r['train_loss']:.3e} "
              f"(worst batch {r['train_loss_max']:.2e})  grad norm {r['grad_norm_median']:.2e}  "
              f"|pred|/|target| {r['pred_over_target_norm']:.2f}  eval {eval_rel_l2:.3e}",
              flush=True)
    return {"arm": arm, "output_scale": model.denormalizer.scale.item(), "epochs": records}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = args.data or str(cached_data("burgers", **_example().PRESETS["paper"]["data"]))
    try:  # the data fit the resolution and split before the workers train for hours
        datasets(args, data)
    except FileNotFoundError as err:  # (a traceback before)
        print(f"error: --data: {err}", file=sys.stderr)
        return 2
    except (ValueError, DataFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    spawn = multiprocessing.get_context("spawn")  # no fork of a process that has run torch
    with ProcessPoolExecutor(max_workers=len(args.arms), mp_context=spawn) as pool:
        arms = list(pool.map(run_arm, args.arms, [args] * len(args.arms),
                             [data] * len(args.arms)))
    result = {"command": command_line(), "torch": torch.__version__,
              "device": f"cpu ({os.cpu_count()} cores, one thread per arm)", "n": args.n,
              "attention": args.attention, "arms": arms}
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
