"""Time and memory of the attention ops against the original-style formulas, side by side.

    python benchmarks/attention.py --out benchmarks/results/attention_cpu.json
    python benchmarks/attention.py --device cuda --impls ours,eager,compiled --sweep --out ...

Ops (``op``): galerkin, fourier, normalized (GNOT's normalised attention, with its skip term),
galerkin_no_norm (Galerkin without its K, V norms, as SimpleAttention runs it with norm='layer',
'instance' or None: identity row maps), fourier_dropout (Fourier attention with dropout p = 0.05,
the Darcy models', on its N×M matrix: the pairwise order, as a training step runs it),
continuum_dropout (the TNO's attention in training: softmax attention with quadrature weights on
the keys, ops.continuum_attention, and dropout p = 0.1 on the probabilities; P = 0).
Shapes are (B, H, N, M, D, P): M keys for N queries (cross-attention where M != N).

Implementations (``impl`` in the JSON):
  ours      galerkin_ext.ops (Fourier with path="auto", i.e. the factored path; with dropout the
            pairwise order, on the CPU the fused op that stores no N×M matrix; continuum_dropout
            on the CPU the fused softmax op)
  eager     galerkin_ext.reference, computed the way the original codes do: a Python loop of
            per-head layer norms, torch.cat of the coordinates, then the matmuls (Fourier through
            the N×M matrix, with dropout a mask from F.dropout); GNOT's feature softmax and
            einsums for normalized; for continuum_dropout PyTorch's
            scaled_dot_product_attention with the weights' log as a mask and its dropout (on the
            CPU its math kernel: the N×M matrix formed, torch's mask)
  compiled  the same reference under torch.compile
  original  the original package (galerkin-transformer 0.2.1, pip install --no-deps): its
            per-head layer norms (nn.LayerNorm's F.layer_norm, head by head, on the same norm
            weights as the others, whose gradients it computes too), pos.repeat + torch.cat, and
            its attention() / linear_attention() functions, with the always-on F.dropout(p=0.5)
            on the attention matrix that its SimpleAttention passes (so it does that extra work,
            as users' runs do)

Repetitions are interleaved over implementations and reported as medians. ``fwd_gbps`` is the
forward's effective bandwidth: the bytes that must move (read q, k, v, pos; write the output)
over the time, to compare with ``copy_gbps``, a copy measured in the same run. Peak memory is the
memory above the baseline during one forward+backward: torch.cuda.max_memory_allocated on CUDA;
on CPU the peak resident set (VmHWM, reset through /proc/self/clear_refs) of a child process
whose glibc mmap threshold is fixed, so that freed tensors go back to the OS there (timings run
with the normal allocator).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import original  # benchmarks/original.py: the script's folder is first on sys.path
import torch
import torch.nn.functional as F

from galerkin_ext import ops, reference
from galerkin_ext._cli import positive_int, writable_file
from galerkin_ext.training import command_line, describe_device, write_json

SHAPES = {  # name: (B, H, N, M, D, P)
    "burgers": (4, 1, 8192, 8192, 96, 1),
    "burgers_quick": (8, 1, 512, 512, 96, 1),  # the quick preset's n and batch, paper width
    "host": (1, 1, 16, 16, 8, 1),  # next to no work: the per-call cost on the host
    "darcy_quick": (4, 4, 29 * 29, 29 * 29, 8, 2),  # the quick preset's 85/29 model
    "darcy_coarse": (4, 4, 43 * 43, 43 * 43, 32, 2),
    "large": (4, 4, 65536, 65536, 32, 2),
    "gnot": (4, 4, 8192, 2048, 32, 0),  # a GNOT-sized cross-attention
    "narrow_heads": (4, 8, 8192, 8192, 12, 0),  # width 96 in 8 heads: rows of 12, no coordinates
    "tno_quick": (8, 2, 32 * 32, 32 * 32, 16, 0),  # the quick Darcy TNO (s = 32, 2 heads of 16)
    "tno_paper": (2, 8, 64 * 64, 64 * 64, 16, 0),  # the paper's Darcy TNO (s = 64, batch 2)
}
SWEEP = [(4, 4, 2**e, 2**e, 32, 2) for e in range(6, 17)]  # B·H·N from 2^10 to 2^20 tokens
OPS = ("galerkin", "fourier", "normalized", "galerkin_no_norm", "fourier_dropout",
       "continuum_dropout")
ATTN_DROPOUT = 0.05  # fourier_dropout's p: the Darcy models' attention dropout
TNO_ATTN_DROPOUT = 0.1  # continuum_dropout's: the TNO authors' attention dropout
# The dropout ops form all B·H·N·M pairs: on the CPU ~1.5 s per 2^28 of them forward and
# backward (the paper TNO's shape), so the large shapes are skipped there.
CPU_MAX_PAIRS = 2**30
_MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=writable_file, metavar="OUT",
                   help="JSON file to write (required, except for the internal --peak-child)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--impls", default="ours,eager",
                   help="comma list of ours, eager, compiled, original")
    p.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    p.add_argument("--shapes", default=",".join(SHAPES),
                   help="comma list of " + ", ".join(SHAPES) + " (empty: the sweep alone)")
    p.add_argument("--sweep", action="store_true", help="add the N sweep of SWEEP")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per measurement")
    p.add_argument("--threads", type=positive_int,
                   help="torch's CPU threads (default: torch's own choice); recorded")
    # Internal: measure the CPU peak memory of one (op, impl, shape) in a child process.
    p.add_argument("--peak-child", nargs=9, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peak_child:
        return args
    if args.out is None:
        p.error("--out: the JSON file to write is required")
    # the comma lists as lists: blanks stripped, repeats dropped (they measured twice)
    args.shapes, args.impls, args.ops = (
        list(dict.fromkeys(item.strip() for item in value.split(",") if item.strip()))
        for value in (args.shapes, args.impls, args.ops))
    for flag, value in (("--impls", args.impls), ("--ops", args.ops)):
        if not value:
            p.error(f"{flag}: expected a comma list of at least one name")
    for name in args.shapes:
        if name not in SHAPES:
            p.error(f"--shapes: unknown shape {name!r}; expected some of {', '.join(SHAPES)}")
    for impl in args.impls:
        if impl not in ("ours", "eager", "compiled", "original"):
            p.error(f"--impls: unknown implementation {impl!r}")
        if impl == "original" and not original.available():
            p.error(f"--impls original: galerkin-transformer is not installed "
                    f"({original.INSTALL_HINT})")
    for op in args.ops:
        if op not in OPS:
            p.error(f"--ops: unknown op {op!r}")
    if args.reps < 1:
        p.error("--reps: expected at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    if args.device == "cpu" and not os.path.exists("/proc/self/clear_refs"):
        p.error("--device cpu: the CPU's free and peak memory are read from Linux's /proc "
                "(MemAvailable, VmHWM), which this system does not have")
    return args


# ----------------------------------------------------------------------------------------------
# Workloads


def make_inputs(shape, device, dtype, gen):
    B, H, N, M, D, P = shape

    def randn(*s, grad=True):
        t = torch.randn(*s, generator=gen, dtype=torch.float32).to(device, dtype)
        return t.requires_grad_(grad)

    q, k, v = randn(B, H, N, D), randn(B, H, M, D), randn(B, H, M, D)
    pos = torch.rand(B, N, P, generator=gen).to(device, dtype) if P else None
    kv_pos = torch.rand(B, M, P, generator=gen).to(device, dtype) if P and M != N else pos
    norms = [(1 + 0.1 * randn(H, D, grad=False), 0.1 * randn(H, D, grad=False)) for _ in "ab"]
    for w, b in norms:
        w.requires_grad_()
        b.requires_grad_()
    weight = 0.5 + torch.rand(B, M, generator=gen).to(device, dtype)  # continuum_dropout's
    return dict(q=q, k=k, v=v, pos=pos, kv_pos=kv_pos, norm_a=norms[0], norm_b=norms[1],
                weight=weight)


def make_original_fn(op: str, shape, device: str, dtype: torch.dtype):
    """The original package's attention path (its layers.py, loaded by original.py)."""
    layers = original.load().layers
    _, H, N, M, D, _ = shape
    dropout = torch.nn.Dropout()  # its presence triggers F.dropout(p_attn), as in the original

    def per_head(norm, t):
        # its _get_layernorm's nn.LayerNorm(D, eps=1e-5) per head, on the workload's weights
        # (its own modules' parameters were not among the leaves: their gradients, which ours
        # and eager compute, were skipped)
        w, b = norm
        return torch.stack([F.layer_norm(t[:, i], (D,), w[i], b[i], 1e-5) for i in range(H)],
                           dim=1)

    def fn(x):
        q, k, v = x["q"], x["k"], x["v"]
        if op == "galerkin":
            k, v = per_head(x["norm_a"], k), per_head(x["norm_b"], v)
        else:
            q, k = per_head(x["norm_a"], q), per_head(x["norm_b"], k)
        pos = x["pos"].to(q.dtype).unsqueeze(1).repeat([1, H, 1, 1])
        q, k, v = (torch.cat([pos, t], dim=-1) for t in (q, k, v))
        if op == "galerkin":
            return layers.linear_attention(q, k, v, attention_type="galerkin", dropout=dropout)[0]
        return layers.attention(q, k, v, attention_type="fourier", dropout=dropout)[0]

    return fn


def make_fn(op: str, impl: str, shape, device: str, dtype: torch.dtype = torch.float32):
    if impl == "original":
        return make_original_fn(op, shape, device, dtype)
    module = ops if impl == "ours" else reference
    if op == "galerkin":
        def fn(x):
            return module.galerkin_attention(x["q"], x["k"], x["v"], pos=x["pos"],
                                             kv_pos=x["kv_pos"], k_norm=x["norm_a"],
                                             v_norm=x["norm_b"])
    elif op == "galerkin_no_norm":
        def fn(x):
            return module.galerkin_attention(x["q"], x["k"], x["v"], pos=x["pos"],
                                             kv_pos=x["kv_pos"])
    elif op == "normalized":
        def fn(x):
            return module.normalized_attention(x["q"], x["k"], x["v"], skip=True)
    elif op == "continuum_dropout":
        def fn(x):  # (torch_masks: SDPA with its dropout)
            return ops.continuum_attention(x["q"], x["k"], x["v"], weight=x["weight"],
                                           dropout_p=TNO_ATTN_DROPOUT, torch_masks=impl != "ours")
    else:
        B, H, N, M = shape[:4]

        def fn(x):
            kwargs = dict(pos=x["pos"], kv_pos=x["kv_pos"], q_norm=x["norm_a"],
                          k_norm=x["norm_b"])
            if op == "fourier_dropout" and impl == "ours":
                kwargs["dropout_p"] = ATTN_DROPOUT
            elif op == "fourier_dropout":  # a mask drawn as the original codes' F.dropout draws
                ones = torch.ones(B, H, N, M, device=device, dtype=dtype)
                kwargs["dropout_mask"] = torch.nn.functional.dropout(ones, ATTN_DROPOUT)
            return module.fourier_attention(x["q"], x["k"], x["v"], **kwargs)
    return torch.compile(fn) if impl == "compiled" else fn


def forward_bytes(shape, element_size: int) -> int:
    """Bytes a forward must move at least: read q, k, v, pos, kv_pos; write (B, H, N, D + P)."""
    B, H, N, M, D, P = shape
    return element_size * (B * H * (N + 2 * M) * D + B * (N + M) * P + B * H * N * (D + P))


def quadratic_bytes(shape, element_size: int) -> int:
    B, H, N, M, _, _ = shape
    return 3 * B * H * N * M * element_size  # scores, the scaled copy, and its gradient


# ----------------------------------------------------------------------------------------------
# Measurement


class Device:
    def __init__(self, name: str):
        self.name = name
        self.cuda = name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def free_bytes(self) -> int:
        if self.cuda:
            return torch.cuda.mem_get_info()[0]
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024

    def peak_mb(self, work, child_args: list[str]) -> float:
        """Memory above the baseline at the peak of ``work()``, in MiB."""
        if not self.cuda:
            return _cpu_peak_in_child(child_args)
        self.sync()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        work()
        self.sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    def copy_gbps(self) -> float:
        """Read + write bandwidth of a 256 MiB tensor copy, median of 5."""
        src = torch.empty(2**26, dtype=torch.float32, device=self.name).uniform_()
        dst = torch.empty_like(src)
        times = []
        for _ in range(6):
            self.sync()
            t0 = time.perf_counter()
            dst.copy_(src)
            self.sync()
            times.append(time.perf_counter() - t0)
        return 2 * src.nbytes / statistics.median(times[1:]) / 1e9


def _cpu_peak_in_child(child_args: list[str]) -> float:
    # (the child runs on as many threads as the timings: per-thread buffers count)
    env = dict(os.environ, **{_MMAP_ENV: str(2**16),
                              "OMP_NUM_THREADS": str(torch.get_num_threads())})
    cmd = [sys.executable, os.path.abspath(__file__), "--peak-child", *child_args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def _cpu_peak_child(op: str, impl: str, shape: list[str], dtype: str) -> None:
    """In the child: one warm-up, then the peak resident set of one forward+backward."""
    x, leaves, grad = workload(op, tuple(int(v) for v in shape), "cpu", getattr(torch, dtype),
                                torch.Generator().manual_seed(0))
    fn = make_fn(op, impl, tuple(int(v) for v in shape), "cpu", getattr(torch, dtype))
    torch.autograd.grad(fn(x), leaves, grad, allow_unused=True)
    base = _proc_status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    torch.autograd.grad(fn(x), leaves, grad, allow_unused=True)
    print((_proc_status_kb("VmHWM") - base) / 1024)


def _proc_status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not found in /proc/self/status")


def op_shape(op: str, shape):
    """The shape an op runs: normalised and continuum attention take no coordinates here (P = 0:
    no pos to read, an output of width D)."""
    return (*shape[:5], 0) if op in ("normalized", "continuum_dropout") else tuple(shape)


def workload(op, shape, device, dtype, gen):
    """Inputs, the leaves to differentiate, and the upstream gradient of one measurement."""
    shape = op_shape(op, shape)
    x = make_inputs(shape, device, dtype, gen)
    leaves = [x["q"], x["k"], x["v"], *x["norm_a"], *x["norm_b"]]
    B, H, N, M, D, P = shape
    grad = torch.randn(B, H, N, D + P, generator=gen).to(device, dtype)
    return x, leaves, grad


def bench_shape(dev: Device, op: str, shape, impls, dtype, reps: int, gen) -> list[dict]:
    shape = op_shape(op, shape)
    x, leaves, grad = workload(op, shape, dev.name, dtype, gen)
    B, H, N, M, D, P = shape
    element = torch.empty((), dtype=dtype).element_size()
    runnable, skipped = {}, {}
    for impl in impls:
        if op.endswith("_dropout") and not dev.cuda and B * H * N * M > CPU_MAX_PAIRS:
            skipped[impl] = (f"{B * H * N * M:.1e} pairs: minutes a call on the CPU (more than "
                             f"{CPU_MAX_PAIRS:.1e})")
            continue
        if impl == "original" and (op in ("normalized", "galerkin_no_norm", "continuum_dropout")
                                   or M != N):
            skipped[impl] = ("measured for the original's two normed types of self-attention "
                             "only")
            continue
        quadratic = (op.startswith("fourier") or op == "continuum_dropout") and (
            impl != "ours" or (op.endswith("_dropout") and dev.cuda))
        needed = quadratic_bytes(shape, element) * (4 / 3 if impl == "original" else 1) \
            if quadratic else 0  # the original also keeps its dropout mask
        if needed > 0.6 * dev.free_bytes():
            skipped[impl] = f"needs about {needed / 2**30:.0f} GiB for the N×N matrices"
        else:
            runnable[impl] = make_fn(op, impl, shape, dev.name, dtype)

    def fwd(fn):
        with torch.no_grad():
            fn(x)

    def fwd_bwd(fn):  # "original" uses its own norm parameters, hence allow_unused
        torch.autograd.grad(fn(x), leaves, grad, allow_unused=True)

    for fn in runnable.values():  # warm-up (and compilation)
        fwd(fn)
        fwd_bwd(fn)
    times = {impl: {"fwd": [], "fwd_bwd": []} for impl in runnable}
    for _ in range(reps):  # interleaved, so drift affects every implementation alike
        for impl, fn in runnable.items():
            for kind, work in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
                dev.sync()
                t0 = time.perf_counter()
                work(fn)
                dev.sync()
                times[impl][kind].append(time.perf_counter() - t0)
    rows = []
    for impl in impls:
        row = dict(op=op, impl=impl, B=B, H=H, N=N, M=M, D=D, P=P,
                   dtype=str(dtype).split(".")[1])
        if impl in skipped:
            row.update(fwd_ms=None, fwd_bwd_ms=None, peak_mem_mb=None, fwd_gbps=None,
                       skipped=skipped[impl])
        else:
            fn = runnable[impl]
            fwd_s = statistics.median(times[impl]["fwd"])
            row.update(
                fwd_ms=1e3 * fwd_s,
                fwd_bwd_ms=1e3 * statistics.median(times[impl]["fwd_bwd"]),
                peak_mem_mb=dev.peak_mb(lambda fn=fn: fwd_bwd(fn),
                                        [op, impl, *map(str, shape), row["dtype"]]),
                fwd_gbps=forward_bytes(shape, element) / fwd_s / 1e9,
            )
        rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    header = f"{'op':16s} {'impl':9s} {'B':>2s} {'H':>2s} {'N':>7s} {'M':>7s} {'D':>3s} " \
             f"{'P':>2s} " \
             f"{'fwd ms':>9s} {'fwd+bwd ms':>11s} {'peak MiB':>9s} {'fwd GB/s':>9s} {'speedup':>8s}"
    print(header)
    base = {}
    for r in rows:
        if r["impl"] == "eager" and r["fwd_bwd_ms"]:
            base[(r["op"], r["N"], r["M"], r["D"], r["H"])] = r["fwd_bwd_ms"]
    for r in rows:
        if r["fwd_ms"] is None:
            print(f"{r['op']:16s} {r['impl']:9s} {r['B']:2d} {r['H']:2d} {r['N']:7d} {r['M']:7d} "
                  f"{r['D']:3d} {r['P']:2d}   skipped: {r['skipped']}")
            continue
        ref = base.get((r["op"], r["N"], r["M"], r["D"], r["H"]))
        speedup = f"{ref / r['fwd_bwd_ms']:7.2f}x" if ref else "       -"
        print(f"{r['op']:16s} {r['impl']:9s} {r['B']:2d} {r['H']:2d} {r['N']:7d} {r['M']:7d} "
              f"{r['D']:3d} {r['P']:2d} {r['fwd_ms']:9.3f} {r['fwd_bwd_ms']:11.3f} "
              f"{r['peak_mem_mb']:9.1f} "
              f"{r['fwd_gbps']:9.2f} {speedup}")
    print("speedup: fwd+bwd time of eager over this row's, same op and shape")


def main() -> None:
    args = parse_args()
    if args.peak_child:
        op, impl, *shape, dtype = args.peak_child
        _cpu_peak_child(op, impl, shape, dtype)
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dev = Device(args.device)
    dtype = getattr(torch, args.dtype)
    impls = args.impls
    shapes = [SHAPES[name] for name in args.shapes] + (SWEEP if args.sweep else [])
    if not shapes:
        sys.exit("--shapes: no shapes to measure (name some, or add --sweep)")
    gen = torch.Generator().manual_seed(0)
    copy_gbps = dev.copy_gbps()
    print(f"device: {describe_device(dev.name)}; torch {torch.__version__}; threads "
          f"{torch.get_num_threads()}; copy {copy_gbps:.1f} GB/s")
    rows = []
    for shape in shapes:
        for op in args.ops:
            rows += bench_shape(dev, op, shape, impls, dtype, args.reps, gen)
    print_rows(rows)
    result = dict(
        device=describe_device(dev.name),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        command=command_line(),
        copy_gbps=copy_gbps,
        threads=torch.get_num_threads(),
        rows=rows,
    )
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
