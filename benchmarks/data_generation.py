"""Time the generation of the paper-sized data sets and check their statistics.

Usage (run it niced on a shared machine)::

    nice -n 19 python benchmarks/data_generation.py RESULTS.json \\
        [--problem burgers|darcy|all] [--darcy-samples N] [--burgers-samples N] [--keep DIR]

By default the full sets are generated (Burgers 2048 x 8192, Darcy 2048 x 421^2).  With
``--darcy-samples N`` / ``--burgers-samples N`` only the first N samples are generated and the
full-set time is *extrapolated* linearly from the measured rate; the JSON says so
(``"extrapolated": true``).  Wall time, the CPU time of this process and of its worker
processes, and the load average (other users of the cores) are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from galerkin_ext._checks import cannot_make_folder, cannot_write_in
from galerkin_ext._cli import writable_file
from galerkin_ext.data.burgers import solve_burgers
from galerkin_ext.data.generate import generate_burgers, generate_darcy
from galerkin_ext.data.storage import read_h5
from galerkin_ext.training import command_line, describe_device, write_json

FULL = {"burgers": 2048, "darcy": 2048}
TARGET_S = {"burgers": 180.0, "darcy": 1200.0}


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _timed(problem: str, n: int, out: Path) -> dict:
    load0 = os.getloadavg()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    if problem == "burgers":
        generate_burgers(out, n, progress=False)
    else:
        generate_darcy(out, n, progress=False)
    wall = time.perf_counter() - t0
    cpu1 = _cpu_seconds()
    full_wall = wall * FULL[problem] / n
    return {
        "n_samples": n,
        "wall_s": round(wall, 2),
        "cpu_s_main": round(cpu1[0] - cpu0[0], 2),
        "cpu_s_workers": round(cpu1[1] - cpu0[1], 2),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "file_bytes": out.stat().st_size,
        "extrapolated": n != FULL[problem],
        "full_set_wall_s": round(full_wall, 1),
        "full_set_wall_s_note": (
            "measured" if n == FULL[problem]
            else f"EXTRAPOLATED linearly from {n} of {FULL[problem]} samples"
        ),
        # Secondary estimate robust to other users of the cores: total CPU time spread evenly
        # over the usable cores (assumes they would be free and the work parallel).
        "full_set_cpu_bound_wall_s_estimate": round(
            (cpu1[0] - cpu0[0] + cpu1[1] - cpu0[1]) * FULL[problem] / n / _cores(), 1
        ),
        "target_s": TARGET_S[problem],
        "meets_target": bool(full_wall <= TARGET_S[problem]),
    }


def burgers_checks(path: Path, n_compare: int = 4) -> dict:
    """Statistics, and the 1024-point solve against the full 8192-point solve."""
    data = read_h5(path)
    u0 = data["a"][:n_compare]  # fewer when the file holds fewer
    full = solve_burgers(u0, n_steps=1000)
    diff = np.abs(full - data["u"][:n_compare]).max() / np.abs(full).max()
    return {
        "std_u0": float(data["a"].std()),
        "std_u1": float(data["u"].std()),
        "truncated_vs_full_solve_max_rel_diff": float(diff),
        "truncated_vs_full_samples": len(u0),
    }


def darcy_checks(path: Path) -> dict:
    data = read_h5(path)
    peak = data["u"].max(axis=(1, 2))
    return {
        "fraction_of_12": float((data["a"] == 12).mean()),
        "max_u_mean": float(peak.mean()),
        "max_u_range": [float(peak.min()), float(peak.max())],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json_out", type=writable_file, help="where to write the results (JSON)")
    parser.add_argument("--problem", choices=("burgers", "darcy", "all"), default="all")
    parser.add_argument("--burgers-samples", type=int, default=FULL["burgers"])
    parser.add_argument("--darcy-samples", type=int, default=FULL["darcy"])
    parser.add_argument("--keep", default=None, help="keep the generated files in this folder")
    args = parser.parse_args()
    for name in ("burgers_samples", "darcy_samples"):
        if not 1 <= getattr(args, name) <= 2048:
            parser.error(f"--{name.replace('_', '-')} must be in [1, 2048]")
    json_out = args.json_out

    problems = ("burgers", "darcy") if args.problem == "all" else (args.problem,)
    if args.keep:
        existing = [str(Path(args.keep) / f"{p}.h5") for p in problems
                    if (Path(args.keep) / f"{p}.h5").exists()]
        if existing:
            parser.error(f"--keep: {existing} exist; the timed generation would replace them")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gext_data_"))
    why = cannot_make_folder(work)  # a file in the way, a place that makes no folder
    if why is not None:
        parser.error(f"--keep: cannot make the folder {str(work)!r} ({why})")
    why = cannot_write_in(work)
    if why is not None:
        parser.error(f"--keep: cannot write in {str(work)!r} ({why})")
    results: dict = {
        "machine": {
            "device": describe_device("cpu"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "command": command_line(),
    }
    try:
        for problem in problems:
            n = args.burgers_samples if problem == "burgers" else args.darcy_samples
            out = work / f"{problem}.h5"
            res = _timed(problem, n, out)
            res["checks"] = burgers_checks(out) if problem == "burgers" else darcy_checks(out)
            results[problem] = res
            print(json.dumps({problem: res}, indent=2), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    write_json(json_out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
