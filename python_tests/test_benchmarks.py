"""Smoke test of the benchmark scripts: benchmarks/table1.py runs on the CPU at tiny sizes and
writes its JSON records (our implementation only: CI does not install the original package)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RECORD_KEYS = {"model", "attention", "impl", "it_per_s", "peak_mem_mb", "device", "command",
               "batch", "n"}


def test_table1_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "table1.json"
    # Smallest grids the spectral decoders take; one thread, so 2 CI cores are not oversubscribed.
    cmd = [sys.executable, str(BENCHMARKS / "table1.py"), "--device", "cpu", "--impls", "ours",
           "--attention", "galerkin,fourier", "--n", "32", "--darcy-fine", "24",
           "--darcy-coarse", "4", "--batch", "2", "--steps", "1", "--warmup", "1",
           "--repeats", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    assert not out.with_name(out.name + ".tmp").exists()
    result = json.loads(out.read_text())
    assert {"device", "torch", "command", "records"} <= set(result)
    records = result["records"]
    assert [(r["model"], r["attention"]) for r in records] == [
        ("burgers", "galerkin"), ("burgers", "fourier"), ("darcy", "galerkin"),
        ("darcy", "fourier")]
    for r in records:
        assert RECORD_KEYS <= set(r), RECORD_KEYS - set(r)
        assert r["impl"] == "ours" and r["batch"] == 2 and "note" not in r
        assert math.isfinite(r["it_per_s"]) and r["it_per_s"] > 0
        assert r["peak_mem_mb"] is None  # measured on CUDA only
        assert r["command"] == result["command"] and "table1.py" in r["command"]
    assert [r["n"] for r in records] == [32, 32, 24 * 24, 24 * 24]
    assert [r["output_shape"] for r in records] == [[2, 32, 1]] * 2 + [[2, 24, 24, 1]] * 2
    assert "ours" in proc.stdout and "it/s" in proc.stdout  # the printed table
