"""Records of the paper-protocol runs, beside the paper's numbers (SPEC §5).

    python benchmarks/paper_runs.py add runs/gt512 [--command "..."] [--device "..."] [--replace]
    python benchmarks/paper_runs.py table

(``--results FILE`` before the action reads and writes another file.)

``add`` reads a finished run's ``metrics.json`` (written by ``examples/burgers.py``,
``darcy.py`` or ``darcy_inverse.py`` with ``--preset paper`` and its sample counts, epochs and
batch; other presets and cut-down runs are refused) and
puts one record into ``benchmarks/results/paper_runs.json`` (a list; a record with the same
``experiment``, ``attention``, ``norm``, ``setting`` and ``reference_dropout`` is replaced only
with ``--replace``: a committed record can cost hours).  ``command`` and
``device`` come from ``metrics.json``; runs that predate those keys give them on the command
line.  ``table`` prints the records as the README's markdown table.

Two figures per run, so nobody mistakes selection on the evaluation set for generalisation:
``test_rel_l2`` is the paper's protocol (the best epoch on the evaluation set, as the original
code selects it) and ``last_epoch_rel_l2`` the model after the last epoch.  A run of
``--model fno`` is recorded with ``attention`` ``"fno"`` and ``norm`` ``None``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from original import exec_file

from galerkin_ext.data.datasets import DARCY_COARSE
from galerkin_ext.training import write_json

RESULTS = Path(__file__).resolve().parent / "results" / "paper_runs.json"

# SPEC §5: relative L2 on the evaluation set, rows "Ln on Q,K / K,V" (norm = 'attn').
PAPER = {
    ("burgers", "fourier"): {"n=512": 1.135e-3, "n=2048": 1.123e-3, "n=8192": 1.071e-3},
    ("burgers", "galerkin"): {"n=512": 1.203e-3, "n=2048": 1.150e-3, "n=8192": 1.025e-3},
    ("darcy", "fourier"): {"141/43": 8.73e-3, "211/61": 9.21e-3},
    ("darcy", "galerkin"): {"141/43": 8.39e-3, "211/61": 8.44e-3},
    ("darcy_inverse", "fourier"): {
        "141/36, eps=0": 1.921e-2, "141/36, eps=0.01": 2.717e-2, "141/36, eps=0.1": 6.725e-2,
        "211/71, eps=0": 1.523e-2, "211/71, eps=0.01": 2.691e-2, "211/71, eps=0.1": 8.286e-2},
    ("darcy_inverse", "galerkin"): {
        "141/36, eps=0": 1.944e-2, "141/36, eps=0.01": 2.552e-2, "141/36, eps=0.1": 6.689e-2,
        "211/71, eps=0": 1.651e-2, "211/71, eps=0.01": 2.729e-2, "211/71, eps=0.1": 7.903e-2},
    # The FNO rows (``--model fno``): FNO1d / FNO2d "1cycle", trained as the transformers; the
    # inverse problem's "only n_f" on the fine grid and "only n_c" with --fine = --coarse.
    ("burgers", "fno"): {"n=512": 4.373e-3, "n=2048": 4.126e-3, "n=8192": 4.151e-3},
    ("darcy", "fno"): {"141/43": 1.419e-2, "211/61": 1.424e-2},
    ("darcy_inverse", "fno"): {
        "141/36, eps=0": 1.371e-1, "141/36, eps=0.01": 1.378e-1, "141/36, eps=0.1": 1.512e-1,
        "211/71, eps=0": 1.393e-1, "211/71, eps=0.01": 1.396e-1, "211/71, eps=0.1": 1.504e-1,
        "36/36, eps=0": 1.417e-1, "36/36, eps=0.01": 1.431e-1, "36/36, eps=0.1": 1.730e-1,
        "71/71, eps=0": 1.360e-1, "71/71, eps=0.01": 1.369e-1, "71/71, eps=0.1": 1.604e-1},
}
KEY = ("experiment", "attention", "norm", "setting", "reference_dropout")


def experiment_and_setting(config: dict[str, Any]) -> tuple[str, str]:
    """The experiment (from the keys its script writes into the config) and the table's
    setting: ``n=512``, ``141/43`` or ``141/36, eps=0.01``."""
    if "noise" in config:
        return "darcy_inverse", f"{config['fine']}/{config['coarse']}, eps={config['noise']:g}"
    if "fine" in config:
        # the FNO has no coarse grid: the paper's row is that of its fine grid's pair
        coarse = config["coarse"] if config["coarse"] is not None else \
            DARCY_COARSE.get(config["fine"])
        return "darcy", f"{config['fine']}/{coarse}"
    if "n" in config:
        return "burgers", f"n={config['n']}"
    raise ValueError("metrics.json: its config is not one of examples/burgers.py, darcy.py or "
                     "darcy_inverse.py")


def paper_protocol(experiment: str, attention: str | None) -> dict[str, Any]:
    """What a run of the ``"paper"`` preset of ``examples/<experiment>.py`` trains with, as
    ``{setting: value}``: the sizes and every training setting of the preset, the peak rate
    the script lowers for ``attention`` (SPEC §5: 5e-4 for Fourier and softmax in 2-D), and
    float32 arithmetic."""
    path = Path(__file__).resolve().parents[1] / "examples" / f"{experiment}.py"
    example = exec_file(f"_paper_{experiment}", path)
    preset = example.PRESETS["paper"]
    protocol = {"n_train": preset["n_train"], "n_eval": preset["n_eval"],
                **{f"train.{k}": v for k, v in preset["train"].items()},
                "train.precision": "fp32"}
    lower = getattr(example, "LOWER_MAX_LR", {})
    if attention in lower:
        protocol["train.max_lr"] = min(protocol["train.max_lr"], lower[attention])
    return protocol


def record(run: Path, command: str | None, device: str | None) -> dict[str, Any]:
    metrics_file = run / "metrics.json"
    if not metrics_file.is_file():
        raise FileNotFoundError(f"run: {metrics_file} not found (is the run finished?)")
    m = json.loads(metrics_file.read_text())
    command = command or m.get("command")
    device = device or m.get("device_name")
    if not command or not device:
        raise ValueError(f"{metrics_file} has no command/device_name: give --command and "
                         "--device")
    config = m["config"]
    if config.get("preset") != "paper":
        raise ValueError(f"{metrics_file}: a run of preset {config.get('preset')!r}; only "
                         "--preset paper runs are recorded beside the paper's numbers")
    experiment, setting = experiment_and_setting(config)
    # the protocol's sizes and schedule, which the flags can change (a smoke test of --preset
    # paper, another --lr or --precision)
    model = config["model"]
    wanted = paper_protocol(experiment, model.get("attention_type"))
    train = {"precision": "fp32", **config["train"]}
    ran = {k: config[k] if k in config else train.get(k.removeprefix("train."))
           for k in wanted}
    differ = [f"{k} {ran[k]} (the paper's {wanted[k]})" for k in wanted if ran[k] != wanted[k]]
    if differ:
        raise ValueError(f"{metrics_file}: not the paper's protocol ({', '.join(differ)}); "
                         "only runs of it are recorded beside the paper's numbers")
    if config.get("model_choice") == "fno":  # no attention, no norm: the paper's FNO row
        attention, norm = "fno", None
    else:
        attention, norm = model["attention_type"], model["norm"]
    paper = PAPER.get((experiment, attention), {}).get(setting) if norm in ("attn", None) \
        else None
    return {
        "experiment": experiment, "attention": attention, "norm": norm,
        "setting": setting, "reference_dropout": bool(model.get("reference_dropout", False)),
        "test_rel_l2": m["test_rel_l2"], "best_epoch": m["best_epoch"],
        "last_epoch_rel_l2": m["history"][-1]["eval_rel_l2"], "paper_rel_l2": paper,
        "ratio_to_paper": None if paper is None else m["test_rel_l2"] / paper,
        "epochs": m["epochs"], "train_seconds": m["train_seconds"], "device": device,
        "command": command,
    }


def order(r: dict[str, Any]) -> tuple[Any, ...]:
    """Records by experiment and model, then by the numbers of the setting (n=512 before
    n=2048, as the paper's tables run)."""
    numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", r["setting"])]
    return (r["experiment"], r["attention"], str(r["norm"]), numbers, r["reference_dropout"])


def load(results: Path) -> list[dict[str, Any]]:
    return json.loads(results.read_text()) if results.is_file() else []


def add(results: Path, run: Path, command: str | None, device: str | None,
        replace: bool = False) -> dict[str, Any]:
    new = record(run, command, device)
    records = load(results)
    same = [r for r in records if tuple(r[k] for k in KEY) == tuple(new[k] for k in KEY)]
    if same and not replace:
        old = same[0]
        raise ValueError(f"{results} already holds {', '.join(str(new[k]) for k in KEY)} "
                         f"({old['test_rel_l2']:.3e} after {old['epochs']} epochs, "
                         f"{old['train_seconds'] / 60:.0f} min); --replace replaces it")
    records = [r for r in records if r not in same]
    records.append(new)
    records.sort(key=order)
    write_json(results, records)  # atomic: a reader never sees half a file
    return new


def table(records: list[dict[str, Any]]) -> str:
    rows = ["| experiment | attention | setting | paper | ours, best epoch (paper's protocol) "
            "| ours, last epoch | epochs | device | training time |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in records:  # in add's order
        paper = "—" if r["paper_rel_l2"] is None else f"{r['paper_rel_l2']:.3e}"
        ratio = "" if r["ratio_to_paper"] is None else f" ({r['ratio_to_paper']:.2f}×)"
        attention = r["attention"] + (", original's p = 0.5 dropout" if r["reference_dropout"]
                                      else "")
        rows.append(f"| {r['experiment']} | {attention} | {r['setting']} | {paper} | "
                    f"{r['test_rel_l2']:.3e}{ratio} (epoch {r['best_epoch']}) | "
                    f"{r['last_epoch_rel_l2']:.3e} | {r['epochs']} | {r['device']} | "
                    f"{r['train_seconds'] / 60:.0f} min |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help=f"default {RESULTS}")
    sub = p.add_subparsers(dest="action", required=True)
    a = sub.add_parser("add", help="record a finished run")
    a.add_argument("run", type=Path, help="the run's output folder (with metrics.json)")
    a.add_argument("--command", default=None, help="the command that ran it (default: "
                                                   "metrics.json's)")
    a.add_argument("--device", default=None, help="what it ran on (default: metrics.json's)")
    a.add_argument("--replace", action="store_true",
                   help="replace the record of the same experiment and setting")
    sub.add_parser("table", help="print the records as a markdown table")
    args = p.parse_args(argv)
    if args.action == "add":
        try:
            r = add(args.results, args.run, args.command, args.device, args.replace)
        except (OSError, ValueError) as e:
            p.error(str(e))
        print(json.dumps(r, indent=1))
    else:
        if not args.results.is_file():  # (a mistyped path read as "no records" before)
            p.error(f"--results: no such file {str(args.results)!r}")
        try:  # (another script's results: a TypeError before)
            text = table(load(args.results))
        except (ValueError, KeyError, TypeError):
            p.error(f"--results: {str(args.results)!r} is not a file of paper_runs.py's "
                    "records (a JSON list)")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
