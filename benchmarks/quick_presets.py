"""Every example script's quick preset, run one after another as the README gives them, from an
empty data cache: the figures of the README's quick-preset tables, measured in one go on one
machine.

    python benchmarks/quick_presets.py --runs runs/quick            # ~50 min on 2 CPU cores
    python benchmarks/quick_presets.py --runs runs/again --only heat,elasticity
    python benchmarks/quick_presets.py --table                      # print, run nothing

Each preset runs into ``RUNS/<name>`` with the data cache ``RUNS/data`` (``GALERKIN_EXT_CACHE``):
the first run of each data set generates it, and its wall time includes that (the table names
the runs that generated data). A run whose ``metrics.json`` exists is reused when the same
command made it (refused otherwise), with the wall time and commit this script recorded beside
it when it ran (so one preset is measured again by removing its folder, or with ``--only``, which
runs the named presets and replaces their records in ``--out``, keeping the others). A run
that misses one of its preset's thresholds still counts: the record says which (the script
exits with 1 then, after writing everything, if the threshold was enforced).

Writes ``benchmarks/results/quick_presets.json`` (``--out``): torch's version and per run the
command, the commit it ran at, the device, wall and training seconds, parameters, epochs,
``test_rel_l2`` (the mean; which model it is of is each script's rule, its docstring says),
the median where the script reports it, the thresholds' checks, the zero-shot figures and,
where the script reports them, persistence's error and the rollout's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from example_runs import (  # (this folder is on sys.path)
    ROOT,
    made_at,
    print_table,
    run_example,
    runs_folder,
)

from galerkin_ext._cli import writable_file
from galerkin_ext.training import command_line, write_json

RESULTS = ROOT / "benchmarks" / "results" / "quick_presets.json"
# name -> the command after ``python`` (without --out); in the README's order
PRESETS: dict[str, list[str]] = {
    "burgers": ["examples/burgers.py"],
    "burgers_fno": ["examples/burgers.py", "--model", "fno"],
    "darcy": ["examples/darcy.py"],
    "darcy_fno": ["examples/darcy.py", "--model", "fno"],
    "darcy_inverse": ["examples/darcy_inverse.py"],
    "darcy_inverse_fno": ["examples/darcy_inverse.py", "--model", "fno"],
    "lorenz63_b": ["examples/lorenz63.py", "--task", "b"],
    "lorenz63_a": ["examples/lorenz63.py", "--task", "a"],
    "controlled_ode": ["examples/controlled_ode.py"],
    "darcy_tno_lognormal": ["examples/darcy_continuum.py", "--model", "tno", "--coef",
                            "lognormal"],
    "darcy_tno_piecewise": ["examples/darcy_continuum.py", "--model", "tno", "--coef",
                            "piecewise"],
    "darcy_vitno_lognormal": ["examples/darcy_continuum.py", "--model", "vitno", "--coef",
                              "lognormal"],
    "darcy_fano_lognormal": ["examples/darcy_continuum.py", "--model", "fano", "--coef",
                             "lognormal"],
    "darcy_vitno_piecewise": ["examples/darcy_continuum.py", "--model", "vitno", "--coef",
                              "piecewise"],
    "darcy_fano_piecewise": ["examples/darcy_continuum.py", "--model", "fano", "--coef",
                             "piecewise"],
    "kolmogorov_vitno": ["examples/kolmogorov.py", "--model", "vitno"],
    "kolmogorov_fano": ["examples/kolmogorov.py", "--model", "fano"],
    "kolmogorov_fno": ["examples/kolmogorov.py", "--model", "fno"],
    "kolmogorov_afno": ["examples/kolmogorov.py", "--model", "afno"],
    "heat": ["examples/heat.py"],
    "elasticity": ["examples/elasticity.py"],
    "domain_parallel": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "examples/domain_parallel.py"],
}
TIMING = "quick_preset.json"  # beside metrics.json: what only this script saw of the run


def made_files(cache: Path) -> set[str]:
    """The data files in the cache (not the generators' lock files)."""
    return {p.name for p in cache.iterdir() if not p.name.startswith(".")}


def measure(name: str, runs: Path) -> dict[str, Any]:
    """Run (or reuse) preset ``name`` into ``runs/name``; its record."""
    out = runs / name
    cache = runs / "data"
    command = ["python", *PRESETS[name], "--no-progress", "--out", str(out)]
    timing_file = out / TIMING
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["GALERKIN_EXT_CACHE"] = str(cache)  # the runs inherit it
    fresh = not (out / "metrics.json").exists()
    if fresh:
        before = made_files(cache)
        start = time.perf_counter()
    metrics = run_example(command, out, check=False)  # reused only if the same command made it
    if fresh:
        write_json(timing_file, {"wall_seconds": time.perf_counter() - start,
                                 "generated": sorted(made_files(cache) - before)})
    timing = json.loads(timing_file.read_text()) if timing_file.is_file() else {}
    checks = metrics.get("thresholds", {}).get("checks", {})
    return {
        "name": name,
        "command": " ".join(command[:-2]),
        "commit": made_at(out),
        "wall_seconds": timing.get("wall_seconds"),
        "generated_data": timing.get("generated"),
        "train_seconds": metrics["train_seconds"],
        "epochs": metrics["epochs"],
        "parameters": metrics["n_params"],
        "test_rel_l2": metrics["test_rel_l2"],
        "test_rel_l2_median": metrics.get("test_rel_l2_median"),
        "thresholds_enforced": metrics.get("thresholds", {}).get("enforced"),
        "thresholds": checks,
        "zero_shot": metrics.get("zero_shot"),
        "persistence_rel_l2_median": metrics.get("persistence_rel_l2_median"),  # (Kolmogorov)
        "rollout": metrics.get("rollout"),
        "device": metrics["device_name"],
    }


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| preset | parameters | epochs | wall time | training | test rel. L² mean "
             "(median) | thresholds |", "|---|---|---|---|---|---|---|"]
    for r in records:
        wall = "—" if r["wall_seconds"] is None else f"{r['wall_seconds']:.0f} s"
        if r["generated_data"]:
            wall += " (data made)"
        median = "" if r["test_rel_l2_median"] is None else f" ({r['test_rel_l2_median']:.2e})"
        checks = ", ".join(f"{k} {c['value']:.2e} ≤ {c['threshold']:g} "
                           f"{'met' if c['met'] else 'MISSED'}"
                           for k, c in r["thresholds"].items()) or "—"
        if r["thresholds"] and not r["thresholds_enforced"]:
            checks += " (reported, not enforced)"
        lines.append(f"| {r['name']} | {r['parameters']:,} | {r['epochs']} | {wall} | "
                     f"{r['train_seconds']:.0f} s | {r['test_rel_l2']:.2e}{median} | {checks} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=runs_folder, default=None, help="folder of the runs")
    parser.add_argument("--out", type=writable_file, default=RESULTS, help="results JSON")
    parser.add_argument("--table", action="store_true", help="print the table of --out only")
    parser.add_argument("--only", default=None,
                        help="comma list of presets to measure again, replacing their records "
                             "in --out (of " + ", ".join(PRESETS) + ")")
    args = parser.parse_args()
    only = None if args.only is None else list(dict.fromkeys(
        n.strip() for n in args.only.split(",") if n.strip()))
    for name in only or []:
        if name not in PRESETS:
            parser.error(f"--only: unknown preset {name!r}; expected some of {', '.join(PRESETS)}")
    earlier = None  # (--only: the results whose records it replaces)
    if only is not None:
        if not (only and args.out.is_file()):
            parser.error("--only: needs preset names and an existing --out whose records it "
                         "replaces")
        earlier = json.loads(args.out.read_text())
        # (a record it does not hold would be measured, then dropped)
        missing = sorted(set(only) - {r["name"] for r in earlier["runs"]})
        if missing:
            parser.error(f"--only: {args.out} holds no record of {', '.join(missing)} to replace")
    if args.table:
        print_table(parser, args.out, table)
        return 0
    if args.runs is None:
        parser.error("--runs: required to run the presets (only --table runs nothing)")
    if earlier is not None:  # (--only)
        result = earlier
        for name in only:
            record = measure(name, args.runs)
            result["runs"] = [record if r["name"] == name else r for r in result["runs"]]
            print(table([record]).splitlines()[-1], flush=True)
        result.setdefault("remeasured", []).append({"command": command_line(),
                                                    "torch": torch.__version__,
                                                    "presets": only})
        records = result["runs"]
        write_json(args.out, result)
    else:
        records = []
        for name in PRESETS:
            records.append(measure(name, args.runs))
            print(table(records[-1:]).splitlines()[-1], flush=True)
        write_json(args.out, {"command": command_line(), "torch": torch.__version__,
                              "runs": records})
    print(table(records))
    print(f"wrote {args.out}")
    missed = [r["name"] for r in records  # as the scripts exit: enforced thresholds only
              if r["thresholds_enforced"] and not all(c["met"] for c in r["thresholds"].values())]
    if missed:
        print(f"thresholds missed: {', '.join(missed)}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
