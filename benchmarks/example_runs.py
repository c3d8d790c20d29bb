"""Example-script runs of the benchmarks that train (``darcy_budget.py``, ``gnot_claims.py``,
``quick_presets.py``): each made once into its folder and reused afterwards only when the same
command made it, so that a folder of other settings (another preset, other flags) is refused,
never tabulated, with the commit it ran at recorded beside it; and the ``--table`` action of
their results files."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from galerkin_ext.training import write_json

ROOT = Path(__file__).resolve().parent.parent
MADE_AT = "made_at.json"  # beside a run's metrics.json: the commit run_example ran it at


def commit() -> str:
    """``git describe``-like: the commit, ``+dirty`` when the tree has changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def made_at(out: Path) -> str | None:
    """The commit the run in ``out`` was made at (None: not made by :func:`run_example`)."""
    record = out / MADE_AT
    return json.loads(record.read_text())["commit"] if record.is_file() else None


def runs_folder(text: str) -> Path:
    """``--runs`` (an argparse type) as an absolute path: the examples run from the
    repository root, so a relative one would land in the source tree, not the caller's
    folder."""
    return Path(text).resolve()


def _settings(command: list[str]) -> list[str]:
    """The script and its flags, without the interpreter, a launcher before the script
    (``-m torch.distributed.run ...``: the run records its script's command line only) and
    ``--out``."""
    script = next((i for i, arg in enumerate(command) if arg.endswith(".py")), 1)
    args = list(command[script:])
    if "--out" in args:
        at = args.index("--out")
        del args[at : at + 2]
    return args


def run_example(command: list[str], out: Path, *, check: bool) -> dict[str, Any]:
    """``out/metrics.json`` of ``command`` (``['python', 'examples/X.py', ..., '--out',
    str(out)]``, run from the repository root): the existing one when the same command made
    it, else that of a new run, whose commit goes to ``out/made_at.json`` (:func:`made_at`).
    ``check``: a failing run is an error; without it the metrics of a run that exits non-zero
    after writing them (a missed threshold) still count."""
    metrics_file = out / "metrics.json"
    if metrics_file.exists():
        metrics = json.loads(metrics_file.read_text())
        made_by = metrics.get("command", "")
        if _settings(shlex.split(made_by)) != _settings(command):
            raise SystemExit(f"{out} holds a run of `{made_by}`, not of `{shlex.join(command)}`; "
                             "remove it or choose another --runs")
        return metrics
    print(shlex.join(command), flush=True)
    commit_before = commit()  # what the run ran, whatever is committed while it runs
    subprocess.run([sys.executable, *command[1:]], cwd=ROOT, check=check)
    metrics = json.loads(metrics_file.read_text())
    write_json(out / MADE_AT, {"commit": commit_before})
    return metrics


def print_table(parser: argparse.ArgumentParser, results: Path,
                table: Callable[[list[dict[str, Any]]], str]) -> None:
    """``--table``: print the runs of the results file ``results`` (``{"runs": [...]}``, as
    the scripts write it) with ``table``; a missing or foreign file is a one-line error naming
    ``--out``."""
    if not results.is_file():
        parser.error(f"--out: no results file {str(results)!r} to tabulate")
    try:  # (another script's runs lack the keys this table reads)
        text = table(json.loads(results.read_text())["runs"])
    except (ValueError, KeyError, TypeError):
        parser.error(f"--out: {str(results)!r} is not a results file of this script "
                     "(JSON with its 'runs')")
    print(text)
