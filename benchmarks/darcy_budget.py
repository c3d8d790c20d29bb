"""The continuum-attention paper's lognormal Darcy comparison (its Table 1: TNO, FNO, AFNO and the
Galerkin Transformer encoder) at reduced CPU budgets, to see whether and when its ordering shows.

    python benchmarks/darcy_budget.py --runs runs/darcy_budget
    python benchmarks/darcy_budget.py --runs runs/darcy_budget --table   # print, run nothing

Each budget is one ``examples/darcy_continuum.py`` run per model and training seed (quick
preset data: s = 32, lognormal; ``--epochs`` and ``--n-train`` where the budget sets them) into
``RUNS/<model>_<budget>`` (``RUNS/<model>_<budget>_seed<k>`` for ``--seed k``, k > 0); a run
whose ``metrics.json`` exists is reused when the same command made it (refused otherwise).
Writes ``benchmarks/results/darcy_budget.json`` (``--out``): per run the test median relative
L² in physical units and normalised (the paper's units), the zero-shot 64² median, the last
epoch's training loss and validation error (for the generalisation gap), parameters, training
time, the command and the commit it ran at.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from example_runs import (  # (this folder is on sys.path)
    ROOT,
    made_at,
    print_table,
    run_example,
    runs_folder,
)

from galerkin_ext._cli import writable_file
from galerkin_ext.training import command_line, write_json

RESULTS = ROOT / "benchmarks" / "results" / "darcy_budget.json"
# budget name -> extra flags of examples/darcy_continuum.py, the models run at it and their
# training seeds (0: the preset's; more where one run's seed may decide the ordering)
BUDGETS = {
    "quick": ([], ["tno", "fno", "afno", "gt"], [0]),
    "400x45": (["--n-train", "400", "--epochs", "45"], ["tno", "fno"], [0, 1, 2]),
    "1600x20": (["--n-train", "1600", "--epochs", "20"], ["tno", "fno"], [0]),
}
# SPEC-continuum §5, Table 1 (lognormal, s = 64, normalised units)
PAPER = {"tno": 1.19e-2, "fno": 1.96e-2, "afno": 2.57e-2, "gt": 7.30e-2}


def last_epoch(run: Path) -> dict[str, float]:
    """The last row of ``metrics.csv``: training loss and validation relative L²."""
    lines = (run / "metrics.csv").read_text().strip().splitlines()
    header, last = lines[0].split(","), lines[-1].split(",")
    row = dict(zip(header, last, strict=True))
    return {"train_loss": float(row["train_loss"]), "valid_rel_l2": float(row["eval_rel_l2"])}


def record(run: Path, model: str, budget: str, seed: int, command: list[str]) -> dict[str, Any]:
    metrics = json.loads((run / "metrics.json").read_text())
    zero_shot = metrics["zero_shot"].get("s=64", {})
    return {
        "model": model,
        "budget": budget,
        "seed": seed,
        "epochs": metrics["epochs"],
        "n_train": metrics["config"]["n_train"],
        "test_rel_l2_median": metrics["test_rel_l2_median"],
        "test_rel_l2_median_normalized": metrics["test_rel_l2_median_normalized"],
        "zero_shot_s64_median": zero_shot.get("rel_l2_median"),
        **last_epoch(run),
        "parameters": metrics["n_params"],
        "train_seconds": metrics["train_seconds"],
        "paper_rel_l2": PAPER[model],
        "device": metrics["device_name"],
        "command": " ".join(command[:-2]),  # (without --out)
        "commit": made_at(run),
    }


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| model | parameters | budget | seed | test median (physical) | normalised "
             "| zero-shot 64² | last epoch: train loss / validation | paper (normalised, s = 64) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        zs = "—" if r["zero_shot_s64_median"] is None else f"{r['zero_shot_s64_median']:.2e}"
        lines.append(f"| {r['model']} | {r['parameters']:,} | {r['budget']} ({r['n_train']} "
                     f"samples, {r['epochs']} epochs) | {r['seed']} | "
                     f"{r['test_rel_l2_median']:.2e} | "
                     f"{r['test_rel_l2_median_normalized']:.2e} | {zs} | "
                     f"{r['train_loss']:.3f} / {r['valid_rel_l2']:.3f} | {r['paper_rel_l2']:.2e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=runs_folder, default=None, help="folder of the runs")
    parser.add_argument("--out", type=writable_file, default=RESULTS, help="results JSON")
    parser.add_argument("--table", action="store_true", help="print the table of --out only")
    args = parser.parse_args()
    if args.table:
        print_table(parser, args.out, table)
        return
    if args.runs is None:
        parser.error("--runs: required to run the budgets (only --table runs nothing)")
    records = []
    for budget, (flags, models, seeds) in BUDGETS.items():
        for model in models:
            for seed in seeds:
                run = args.runs / (f"{model}_{budget}" + (f"_seed{seed}" if seed else ""))
                seed_flags = ["--seed", str(seed)] if seed else []
                command = ["python", "examples/darcy_continuum.py", "--model", model, *flags,
                           *seed_flags, "--no-progress", "--out", str(run)]
                run_example(command, run, check=True)
                records.append(record(run, model, budget, seed, command))
    write_json(args.out, {"command": command_line(), "runs": records})
    print(table(records))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
