"""Device time per kernel of one attention forward and forward+backward (torch.profiler), to see
where the time goes without a hardware profiler.

    python benchmarks/profile_cuda.py --shapes burgers,large --out profile.json
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from attention import SHAPES, make_fn, workload
from torch.profiler import ProfilerActivity, profile

from galerkin_ext._cli import writable_file
from galerkin_ext.training import command_line, describe_device, write_json


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shapes", default="burgers,large", help="comma list of " + ", ".join(SHAPES))
    p.add_argument("--ops", default="galerkin,fourier", help="comma list of galerkin, fourier")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--reps", type=int, default=5, help="profiled repetitions (after a warm-up)")
    p.add_argument("--out", type=writable_file, required=True, help="JSON file to write")
    args = p.parse_args()
    for name in args.shapes.split(","):
        if name not in SHAPES:
            p.error(f"--shapes: unknown shape {name!r}")
    for name in args.ops.split(","):
        if name not in ("galerkin", "fourier"):
            p.error(f"--ops: expected galerkin or fourier, got {name!r}")
    if args.reps < 1:
        p.error("--reps: expected at least 1")
    if not torch.cuda.is_available():
        p.error("a CUDA device is required")
    return args


def kernel_times(work, reps: int) -> tuple[dict[str, float], float]:
    """Mean device microseconds per call of each kernel, and the mean wall time per call."""
    work()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            work()
        end.record()
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name[:90]] += event.device_time / reps
    return dict(per_kernel), 1e3 * start.elapsed_time(end) / reps


def main() -> None:
    args = parse_args()
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    records = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for op in args.ops.split(","):
            x, leaves, grad = workload(op, shape, "cuda", dtype, gen)
            fn = make_fn(op, "ours", shape, "cuda", dtype)

            def fwd(fn=fn, x=x):
                with torch.no_grad():
                    fn(x)

            def fwd_bwd(fn=fn, x=x, leaves=leaves, grad=grad):
                torch.autograd.grad(fn(x), leaves, grad)

            for kind, work in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
                kernels, wall_us = kernel_times(work, args.reps)
                total = sum(kernels.values())
                print(f"{op} {name} {kind}: wall {wall_us:.1f} us, kernels {total:.1f} us")
                for kernel, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                    print(f"  {us:9.1f} us  {kernel}")
                records.append(dict(op=op, shape=name, kind=kind, dtype=args.dtype,
                                    wall_us=wall_us, kernel_us=kernels))
    result = dict(device=describe_device("cuda"), torch=torch.__version__,
                  command=command_line(), records=records)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
