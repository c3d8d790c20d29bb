"""The compiled CPU dropout (``galerkin_ext.ops.dropout``) against torch's, forward and
forward+backward, at the shapes the models drop.

    python benchmarks/dropout_cpu.py --out benchmarks/results/dropout_cpu.json
    python benchmarks/dropout_cpu.py --threads 2 --out benchmarks/results/dropout_cpu_2t.json

Shapes (float32): the Darcy model's down-sampler at 85² (the quick preset's grid) and 141²
(the paper's), (B, 32, n, n); its encoder's residual and feed-forward streams at the quick
preset's 29² tokens, (B, 841, 32) and (B, 841, 64), and at the paper's 43² tokens, (B, 1849,
128) and (B, 1849, 256); batch 4. ``torch`` is ``F.dropout`` (a Bernoulli mask drawn element by
element, saved for the backward as a boolean tensor); ``ours`` draws its mask from a
counter-based generator and regenerates it in the backward. Medians of ``--reps`` repetitions
interleaved over the two.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from galerkin_ext import ops
from galerkin_ext._cli import positive_int, writable_file
from galerkin_ext.training import command_line, describe_device, write_json

SHAPES = {
    "down_85": (4, 32, 85, 85),
    "down_141": (4, 32, 141, 141),
    "tokens_29": (4, 841, 32),
    "ffn_29": (4, 841, 64),
    "tokens_43": (4, 1849, 128),
    "ffn_43": (4, 1849, 256),
}
P = 0.05  # the Darcy model's dropout
IMPLS = {"torch": lambda x: F.dropout(x, P, training=True),
         "ours": lambda x: ops.dropout(x, P)}


def time_impls(shape: tuple[int, ...], reps: int) -> dict[str, tuple[float, float]]:
    """Median forward and forward+backward milliseconds of each implementation."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen, requires_grad=True)
    grad = torch.randn(shape, generator=gen)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in IMPLS}
    for rep in range(reps + 2):  # two warm-up rounds
        for name, impl in IMPLS.items():
            start = time.perf_counter()
            with torch.no_grad():
                impl(x)
            middle = time.perf_counter()
            impl(x).backward(grad)
            end = time.perf_counter()
            if rep >= 2:
                times[name][0].append((middle - start) * 1e3)
                times[name][1].append((end - middle) * 1e3)
    return {name: (statistics.median(f), statistics.median(fb))
            for name, (f, fb) in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=writable_file, required=True, help="JSON file to write")
    p.add_argument("--reps", type=positive_int, default=15,
                   help="timed repetitions per measurement (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'shape':10s} {'elements':>9s}   fwd ms torch / ours        fwd+bwd ms torch / ours")
    for name, shape in SHAPES.items():
        t = time_impls(shape, args.reps)
        numel = 1
        for size in shape:
            numel *= size
        rows.append({"shape_name": name, "shape": list(shape), "p": P,
                     "torch_fwd_ms": t["torch"][0], "ours_fwd_ms": t["ours"][0],
                     "torch_fwd_bwd_ms": t["torch"][1], "ours_fwd_bwd_ms": t["ours"][1]})
        print(f"{name:10s} {numel:9d}   {t['torch'][0]:7.3f} / {t['ours'][0]:6.3f} "
              f"({t['torch'][0] / t['ours'][0]:5.1f}x)   {t['torch'][1]:7.3f} / "
              f"{t['ours'][1]:6.3f} ({t['torch'][1] / t['ours'][1]:5.1f}x)")
    write_json(args.out, {"command": command_line(), "device": describe_device("cpu"),
                          "torch": torch.__version__, "threads": args.threads,
                          "reps": args.reps, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
