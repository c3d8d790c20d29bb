"""The paper's Table 1, redone: training-step throughput and peak memory of the paper's models.

    python benchmarks/table1.py --device cuda --out benchmarks/results/table1.json
    PYTHONPATH=/tmp/original python benchmarks/table1.py --device cuda --impls ours,original \\
        --out benchmarks/results/table1.json
    python benchmarks/table1.py --device cuda --precision bf16 --models burgers --attention galerkin
    python benchmarks/table1.py --device cpu --n 512 --darcy-fine 85 --darcy-coarse 29 --steps 3

Rows: the Burgers model (n = 8192 points, batch 4) with softmax (ST), Fourier (FT), linear (LT)
and Galerkin (GT) attention, and the Darcy model 141/43 (batch 4) with Galerkin and Fourier
attention, each for

  ours      galerkin_ext.models.build_model("burgers" | "darcy", attention_type=...)
  ours_fft  the same with its spectral convolutions on FFTs (layers.fourier.ffts_only): what
            ours ran on the CPU before those took DFT-matrix products where these are faster
  ours_compiled  ours through torch.compile, as the trainer's --compile takes it (the warm-up
            steps compile it)
  original  the original package (galerkin-transformer 0.2.1): SimpleTransformer (1-D) and
            FourierTransformer2D (2-D) with the paper's configs (benchmarks/original.py),
            including its always-on F.dropout(p=0.5) on every attention matrix (noted in the
            JSON); install it with pip install --no-deps (see benchmarks/original.py)

One iteration is one training step as examples/burgers.py and examples/darcy.py take it:
forward (under torch.autocast for --precision bf16), the paper's loss (OperatorLoss: relative L2
plus the sqrt(gamma h)-weighted relative H^1 term, coefficient-weighted for Darcy), backward,
gradient-norm clip 0.999, Adam step, OneCycle step. Both implementations get the same random
data of the real shapes and the same loss on their predictions. The trainer's per-step host
syncs (loss logging, the finiteness check) are left out for both.

Measurement: ``--warmup`` steps per implementation, then ``--repeats`` rounds that time
``--steps`` steps of each implementation in turn (interleaved, so drift hits all alike), with
the device synchronised before and after each timed block. ``it_per_s`` = steps / the median
round's seconds. ``peak_mem_mb`` (CUDA only; null on CPU) = torch.cuda.max_memory_allocated()
during a timed block minus torch.cuda.memory_allocated() just before it, the largest over the
rounds: what the steps need beyond the resident parameters, Adam state and inputs (gradients are
freed after every step, so they count in the peak, not in the baseline). A configuration that
runs out of GPU memory is recorded with it_per_s null and a note, and the run goes on.

The paper's Table 1 (n = 8192, batch 4, one GPU) has e.g. GT 27.15 it/s and ST 5.02 it/s.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import original  # benchmarks/original.py: the script's folder is first on sys.path
import torch
from torch import Tensor, nn

from galerkin_ext._checks import check_choice, check_int
from galerkin_ext._cli import positive_int, writable_file
from galerkin_ext.layers import cinn_sizes
from galerkin_ext.layers.fourier import ffts_only
from galerkin_ext.losses import OperatorLoss
from galerkin_ext.models import build_model
from galerkin_ext.training import command_line, describe_device, write_json

# ----------------------------------------------------------------------------------------------
# Config (SPEC §5 and the paper's Table 1).
BATCH = 4
BURGERS_N = 8192
DARCY_FINE, DARCY_COARSE = 141, 43
MODELS = ("burgers", "darcy")
IMPLS = ("ours", "ours_fft", "ours_compiled", "original")
ATTENTION = {  # the rows of each model when --attention is not given
    "burgers": ("softmax", "fourier", "linear", "galerkin"),
    "darcy": ("galerkin", "fourier"),
}
LABEL = {"softmax": "ST", "fourier": "FT", "linear": "LT", "galerkin": "GT"}
GAMMA = {"burgers": 0.1, "darcy": 0.5}  # weight of the H^1 term of the loss
PCT_START = {"burgers": 0.2, "darcy": 0.3}
MAX_LR = 1e-3
DARCY_LOWER_MAX_LR = {"fourier": 5e-4, "softmax": 5e-4}
GRAD_CLIP = 0.999
# Smallest grids the spectral decoders accept (16 modes in 1-D, 12 per axis in 2-D).
MIN_BURGERS_N = 2 * 16 - 2
MIN_DARCY_FINE = 2 * 12
ORIGINAL_NOTE = ("original applies F.dropout(p=0.5, training=True) to every attention matrix "
                 "on every call (always on, as its users run it)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, default=20, help="timed steps per round (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved timing rounds; it/s from the median round (default 3)")
    p.add_argument("--out", type=writable_file, help="JSON file to write (optional)")
    p.add_argument("--impls", default="ours", help="comma list of " + ", ".join(IMPLS))
    p.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    p.add_argument("--attention",
                   help="comma list of softmax, fourier, linear, galerkin for every model "
                        "(default: burgers " + ",".join(ATTENTION["burgers"]) + "; darcy "
                        + ",".join(ATTENTION["darcy"]) + ")")
    p.add_argument("--n", type=int, default=BURGERS_N, help=f"Burgers points (default {BURGERS_N})")
    p.add_argument("--darcy-fine", type=int, default=DARCY_FINE,
                   help=f"Darcy input grid per axis (default {DARCY_FINE})")
    p.add_argument("--darcy-coarse", type=int, default=DARCY_COARSE,
                   help=f"Darcy attention grid per axis (default {DARCY_COARSE})")
    p.add_argument("--batch", type=int, default=BATCH, help=f"batch size (default {BATCH})")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: torch.autocast(bfloat16) around the forward, CUDA only")
    p.add_argument("--threads", type=positive_int,
                   help="torch's CPU threads (default: torch's own choice); recorded")
    args = p.parse_args(argv)

    def checked(check: Callable[..., Any], *check_args: Any) -> Any:
        try:
            return check(*check_args)
        except (TypeError, ValueError) as err:
            p.error(str(err))

    checked(check_int, args.steps, "--steps")
    checked(check_int, args.warmup, "--warmup", 0)
    checked(check_int, args.repeats, "--repeats")
    checked(check_int, args.batch, "--batch")
    checked(check_int, args.n, "--n", MIN_BURGERS_N)
    checked(check_int, args.darcy_fine, "--darcy-fine", MIN_DARCY_FINE)
    checked(check_int, args.darcy_coarse, "--darcy-coarse", 2)
    if args.darcy_coarse > args.darcy_fine:
        p.error(f"--darcy-coarse: expected at most --darcy-fine = {args.darcy_fine}, "
                f"got {args.darcy_coarse}")
    args.impls = _split(p, checked, args.impls, "--impls", IMPLS)
    args.models = _split(p, checked, args.models, "--models", MODELS)
    if args.attention is not None:
        args.attention = _split(p, checked, args.attention, "--attention", tuple(LABEL))
    if "original" in args.impls and not original.available():
        p.error(f"--impls original: the original package galerkin-transformer 0.2.1 is not "
                f"importable; {original.INSTALL_HINT}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available (use --device cpu)")
    if args.precision == "bf16" and args.device != "cuda":
        p.error("--precision bf16: autocast to bfloat16 is measured on CUDA only "
                "(use --device cuda or --precision fp32)")
    return args


def _split(p: argparse.ArgumentParser, checked: Callable[..., Any], value: str, name: str,
           choices: tuple[str, ...]) -> list[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        p.error(f"{name}: expected a comma list of {', '.join(choices)}, got {value!r}")
    for item in items:
        checked(check_choice, item, name, choices)
    return list(dict.fromkeys(items))  # drop repeats, keep the order


# ----------------------------------------------------------------------------------------------
# Workloads: a model, its inputs, the loss, the optimiser.


def _grid_2d(n: int) -> Tensor:
    x = torch.linspace(0, 1, n)
    return torch.stack(torch.meshgrid(x, x, indexing="ij"), dim=-1)  # (n, n, 2)


def make_data(model: str, args: argparse.Namespace, device: str) -> dict[str, Tensor]:
    """Random data of the real shapes, shared by both implementations of one row."""
    gen = torch.Generator().manual_seed(0)
    b = args.batch
    if model == "burgers":
        n = args.n
        data = {
            "x": torch.randn(b, n, 1, generator=gen),
            "grid": (torch.arange(n, dtype=torch.float32) / n)[:, None],  # x_j = j / n
            "target": torch.randn(b, n, 1, generator=gen),
            "target_grad": torch.randn(b, n, 1, generator=gen),
        }
    else:
        n, m = args.darcy_fine, args.darcy_coarse
        data = {
            "x": torch.randn(b, n, n, 1, generator=gen),
            "grid": _grid_2d(n),
            "coarse_grid": _grid_2d(m),
            "target": torch.randn(b, n, n, 1, generator=gen),
            "target_grad": torch.randn(b, n, n, 2, generator=gen),
            # The coefficient is 3 or 12 (SPEC §4); it weights the H^1 term.
            "coeff": 3 + 9 * (torch.rand(b, n, n, 1, generator=gen) > 0.5).float(),
            "mean": torch.randn(n, n, 1, generator=gen),
            "std": torch.rand(n, n, 1, generator=gen),
        }
    return {k: v.to(device) for k, v in data.items()}


@dataclass
class Workload:
    """One implementation of one row: ``step()`` runs one training iteration."""

    impl: str
    model: nn.Module
    forward: Callable[[], Tensor]
    loss_fn: OperatorLoss
    data: dict[str, Tensor]
    precision: str
    optimizer: torch.optim.Optimizer = field(init=False)
    scheduler: torch.optim.lr_scheduler.LRScheduler = field(init=False)
    output_shape: tuple[int, ...] | None = None
    seconds: list[float] = field(default_factory=list)
    peak_mb: list[float] = field(default_factory=list)

    def setup(self, max_lr: float, pct_start: float, total_steps: int) -> None:
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=max_lr)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=max_lr, total_steps=total_steps, div_factor=1e4,
            final_div_factor=1e4, pct_start=pct_start,
        )

    def step(self) -> None:
        d = self.data
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if self.precision == "bf16"
                    else nullcontext())
        spectral = ffts_only if self.impl == "ours_fft" else nullcontext
        with spectral(), autocast:
            pred = self.forward()
        if self.output_shape is None:
            self.output_shape = tuple(pred.shape)
        loss, _ = self.loss_fn(pred, d["target"], d["target_grad"], d.get("coeff"))
        with spectral():
            loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.scheduler.step()
        # Gradients go before the next step's baseline is taken, so every timed block counts
        # them in its peak alike.
        self.optimizer.zero_grad(set_to_none=True)


def make_workload(model_name: str, attention: str, impl: str, data: dict[str, Tensor],
                  args: argparse.Namespace) -> Workload:
    torch.manual_seed(0)  # the same initial weights on every run
    if model_name == "burgers":
        loss_fn = OperatorLoss(gamma=GAMMA["burgers"], h=1.0 / args.n)
        if impl != "original":
            model = build_model("burgers", attention_type=attention)
            net = _compiled(model) if impl == "ours_compiled" else model

            def forward() -> Tensor:
                return net(data["x"], data["grid"])
        else:
            model = original.burgers_model(attention)
            # The original takes per-sample coordinates, as its data loader gives them.
            pos = data["grid"].expand(args.batch, -1, -1).contiguous()

            def forward() -> Tensor:
                return model(data["x"], None, pos, pos)["preds"]
    else:
        fine, coarse = args.darcy_fine, args.darcy_coarse
        loss_fn = OperatorLoss(gamma=GAMMA["darcy"], h=1.0 / (fine - 1),
                               coefficient_weighted=True)
        if impl != "original":
            model = build_model("darcy", fine=fine, coarse=coarse, attention_type=attention)
            model.denormalizer.set_statistics(data["mean"], data["std"])
            net = _compiled(model) if impl == "ours_compiled" else model

            def forward() -> Tensor:
                return net(data["x"], data["grid"])
        else:
            sizes = cinn_sizes(fine, coarse)  # the CiNN sizes ours uses: both on the same grids
            model = original.darcy_model(
                attention, coarse=coarse, down_middle=sizes.down_middle,
                up_middle=sizes.up_middle, fine=fine,
                normalizer=original.Denormalizer(data["mean"], data["std"]),
            )
            b = args.batch
            pos = data["coarse_grid"].reshape(1, coarse * coarse, 2).expand(b, -1, -1).contiguous()
            grid = data["grid"].expand(b, -1, -1, -1).contiguous()

            def forward() -> Tensor:
                return model(data["x"], None, pos, grid)["preds"]
    model.to(data["x"].device).train()
    return Workload(impl, model, forward, loss_fn, data, args.precision)


def _compiled(model: nn.Module) -> nn.Module:
    """``model`` through ``torch.compile`` as the trainer's ``compile`` option takes it."""
    return torch.compile(model, options={"fallback_random": True})


def prepare(model_name: str, attention: str, impl: str, data: dict[str, Tensor],
            args: argparse.Namespace) -> Workload:
    """Build one implementation of a row and run its warm-up steps."""
    w = make_workload(model_name, attention, impl, data, args)
    max_lr = MAX_LR
    if model_name == "darcy":
        max_lr = DARCY_LOWER_MAX_LR.get(attention, MAX_LR)
    # OneCycle must not be stepped past its end, and its phases need a few steps each (the
    # learning rate does not change the speed).
    w.setup(max_lr, PCT_START[model_name], max(args.warmup + args.repeats * args.steps, 100))
    for _ in range(args.warmup):
        w.step()
    if w.output_shape is None:  # --warmup 0: one forward to learn the shape
        with torch.no_grad():
            w.output_shape = tuple(w.forward().shape)
    return w


# ----------------------------------------------------------------------------------------------
# Measurement


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def attempt(work: Callable[[], None]) -> str | None:
    """Run ``work``; ``None`` if it succeeded, else a note. The exception (and the tensors its
    traceback holds) is gone when this returns, so the caller can free the memory."""
    try:
        work()
    except torch.cuda.OutOfMemoryError as err:
        return f"out of GPU memory: {str(err).splitlines()[0]}"
    except Exception as err:  # noqa: BLE001 -- recorded, the other rows still run
        traceback.print_exc()
        return f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def timed_block(w: Workload, steps: int, device: str) -> None:
    sync(device)
    base = torch.cuda.memory_allocated() if device == "cuda" else 0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        w.step()
    sync(device)
    w.seconds.append(time.perf_counter() - t0)
    if device == "cuda":
        w.peak_mb.append((torch.cuda.max_memory_allocated() - base) / 2**20)


def bench_row(model_name: str, attention: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """All implementations of one (model, attention) row, interleaved."""
    device = args.device
    data = make_data(model_name, args, device)
    live: dict[str, Workload] = {}
    notes: dict[str, str] = {}
    for impl in args.impls:
        built: list[Workload] = []
        failure = attempt(lambda impl=impl, built=built: built.append(
            prepare(model_name, attention, impl, data, args)))
        if failure is None:
            live[impl] = built[0]
        else:
            notes[impl] = failure
            free_memory(device)
        print(f"  {model_name} {attention} {impl}: "
              + ("warmed up" if impl in live else notes[impl]), flush=True)
    params = {impl: sum(p.numel() for p in w.model.parameters()) for impl, w in live.items()}

    shapes = {impl: w.output_shape for impl, w in live.items()}
    if len(set(shapes.values())) > 1:
        raise RuntimeError(f"{model_name} {attention}: the implementations' outputs differ in "
                           f"shape: {shapes}")

    for _ in range(args.repeats):
        for impl in list(live):
            failure = attempt(lambda w=live[impl]: timed_block(w, args.steps, device))
            if failure is not None:
                notes[impl] = failure
                del live[impl]
                free_memory(device)

    rows = []
    for impl in args.impls:
        w = live.get(impl)
        row: dict[str, Any] = {
            "model": model_name,
            "attention": attention,
            "impl": impl,
            "it_per_s": args.steps / statistics.median(w.seconds) if w else None,
            "peak_mem_mb": max(w.peak_mb) if w and w.peak_mb else None,
            "device": describe_device(device),
            "command": command_line(),
            "batch": args.batch,
            "n": args.n if model_name == "burgers" else args.darcy_fine ** 2,
            "attention_tokens": args.n if model_name == "burgers" else args.darcy_coarse ** 2,
            "precision": args.precision,
            "steps": args.steps,
            "repeats": args.repeats,
            "seconds": w.seconds if w else None,
            "output_shape": list(shapes[impl]) if impl in shapes else None,
            "params": params.get(impl),
        }
        if model_name == "darcy":
            row.update(fine=args.darcy_fine, coarse=args.darcy_coarse)
        note = "; ".join(s for s in (notes.get(impl), ORIGINAL_NOTE if impl == "original"
                                     else None) if s)
        if note:
            row["note"] = note
        rows.append(row)
    by_impl = {r["impl"]: r for r in rows}
    if all(impl in by_impl and by_impl[impl]["it_per_s"] for impl in ("ours", "original")):
        by_impl["ours"]["speedup_vs_original"] = (by_impl["ours"]["it_per_s"]
                                                  / by_impl["original"]["it_per_s"])
    live.clear()
    free_memory(device)
    return rows


# ----------------------------------------------------------------------------------------------
# Output


def print_table(records: list[dict[str, Any]]) -> None:
    print(f"{'model':8s} {'attention':12s} {'impl':13s} {'it/s':>9s} {'peak MiB':>10s} "
          f"{'ours/original':>14s}  note")
    for r in records:
        speedup = f"{r['speedup_vs_original']:.2f}x" if "speedup_vs_original" in r else ""
        its = f"{r['it_per_s']:.3f}" if r["it_per_s"] is not None else "-"
        mem = f"{r['peak_mem_mb']:.1f}" if r["peak_mem_mb"] is not None else "-"
        note = r.get("note", "").replace(ORIGINAL_NOTE, "always-on attention dropout")
        print(f"{r['model']:8s} {LABEL[r['attention']] + ' ' + r['attention']:12s} "
              f"{r['impl']:13s} {its:>9s} {mem:>10s} {speedup:>14s}  {note}")
    print("it/s: training steps per second (forward, loss, backward, clip, Adam); peak MiB: "
          "CUDA memory above the resident model, optimiser and inputs during the steps")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"device: {describe_device(args.device)}; torch {torch.__version__}; "
          f"precision {args.precision}; impls {','.join(args.impls)}", flush=True)
    records: list[dict[str, Any]] = []
    for model_name in args.models:
        for attention in args.attention or ATTENTION[model_name]:
            records += bench_row(model_name, attention, args)
    print_table(records)
    result = {
        "device": describe_device(args.device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": command_line(),
        "precision": args.precision,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "records": records,
    }
    if args.out is not None:
        write_json(args.out, result)
        print(f"wrote {args.out}")
    # OOM is a result; any other failure makes the exit status say so (the JSON is written).
    failed = [r for r in records if r.get("note", "").startswith("error:")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
