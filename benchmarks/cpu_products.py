"""The CPU products of the op core (``csrc/attention/gemm_cpu.cpp``) against ATen's mm.

    python benchmarks/cpu_products.py --out benchmarks/results/cpu_products.json

Compiles a small harness (``cpu_products_harness.cpp``) with ``gemm_cpu.cpp`` through
``torch.utils.cpp_extension`` and times, on one thread, best of ``--reps``:

  rows × matrix   out (m, W) = x (m, K) · a (K, W)      q_apply's Q̂ S, the backwards' G Sᵀ
  reduction       out (K, W) = xᵀ (K, m) · y (m, W)     kv_reduce's K̂ᵀ V̂, q_apply's Q̂ᵀ G

for chunk-sized m (in cache: the fused kernels' case) and for m large enough that x streams
from memory, at the widths of the benchmarked shapes (32: Darcy, GNOT; 97 × 98: Burgers with
its coordinate and normaliser columns). GF/s = 2 m K W / seconds.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.utils import cpp_extension

from galerkin_ext._cli import writable_file
from galerkin_ext.training import command_line, describe_device, write_json

CASES = [  # (m, K, W)
    (2048, 32, 32), (131072, 32, 32), (2048, 33, 33),
    (1024, 97, 98), (65536, 97, 98), (1024, 104, 104),
]
HERE = Path(__file__).resolve().parent
SOURCES = HERE.parent / "csrc" / "attention"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=writable_file, required=True, help="JSON file to write")
    p.add_argument("--reps", type=int, default=20, help="timed runs per measurement (best)")
    args = p.parse_args()
    if args.reps < 1:
        p.error("--reps: expected at least 1")
    torch.set_num_threads(1)
    harness = cpp_extension.load(
        "galerkin_ext_cpu_products",
        [str(HERE / "cpu_products_harness.cpp"), str(SOURCES / "gemm_cpu.cpp")],
        extra_include_paths=[str(SOURCES)], extra_cflags=["-O3"], verbose=False)
    rows = []
    print(f"{'m':>7} {'K':>4} {'W':>4}   rows×matrix GF/s ours / ATen   reduction ours / ATen")
    for m, k, w in CASES:
        seconds = harness.time_products(m, k, w, args.reps)
        gflops = [2 * m * k * w / s / 1e9 for s in seconds]
        rows.append({"m": m, "K": k, "W": w, "rows_times_matrix_gflops": gflops[0],
                     "aten_mm_gflops": gflops[1], "reduction_gflops": gflops[2],
                     "aten_mm_transposed_gflops": gflops[3]})
        print(f"{m:7d} {k:4d} {w:4d}   {gflops[0]:8.1f} / {gflops[1]:5.1f}"
              f"                {gflops[2]:6.1f} / {gflops[3]:5.1f}")
    # "default" or "avx2" keeps our kernels at 32-byte vectors on AVX-512 machines
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    write_json(args.out, {"command": command_line(), "device": describe_device("cpu"),
                          "torch": torch.__version__, "threads": 1,
                          "aten_cpu_capability": capability, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
