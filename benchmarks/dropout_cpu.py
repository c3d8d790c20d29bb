"""The compiled CPU dropout (``galerkin_ext.ops.dropout``) against torch's: the op at the shapes
the models drop, and training steps of the quick presets' models that drop.

    python benchmarks/dropout_cpu.py --out benchmarks/results/dropout_cpu.json
    python benchmarks/dropout_cpu.py --threads 2 --out benchmarks/results/dropout_cpu_2t.json

The op, forward and forward+backward (float32, p = 0.05, the Darcy model's): the Darcy model's
down-sampler at 85² (the quick preset's grid) and 141² (the paper's), (B, 32, n, n); its
encoder's residual and feed-forward streams at the quick preset's 29² tokens, (B, 841, 32) and
(B, 841, 64), and at the paper's 43² tokens, (B, 1849, 128) and (B, 1849, 256); batch 4.
``torch`` is ``F.dropout`` (a Bernoulli mask drawn element by element, saved for the backward as
a boolean tensor); ``ours`` draws its mask from a counter-based generator and regenerates it in
the backward. Medians of ``--reps`` repetitions interleaved over the two.

Training steps (forward, mean squared error, backward, Adam) of the models of
``examples/darcy.py`` (Galerkin Transformer, 85/29, batch 4, and the same with ``--attention
fourier``) and ``examples/darcy_continuum.py --model tno`` (32², batch 8) and ``--model vitno``
(64², batch 8), configured by those scripts' quick presets, on random data: ``ours`` as built,
``torch`` a copy of it with :func:`~galerkin_ext.layers.draw_torch_masks`; ``darcy_tno`` drops
its attention probabilities with p = 0.1 (its authors'), ``darcy_tno_no_attn`` is the same
model without that dropout. The Fourier type's attention dropout is the fused quadratic op in
``ours``, the TNO's the fused softmax op; in ``torch`` the N×N matrix with torch's mask (SDPA's
for the TNO). Medians over ``--step-reps`` rounds of ``--steps`` steps of each in turn.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from types import ModuleType

import torch
import torch.nn.functional as F
from example_runs import ROOT  # (this folder is on sys.path)
from original import exec_file
from timing import WARMUP, forward_backward_medians, op_parser, write_results
from torch import Tensor, nn

from galerkin_ext import ops
from galerkin_ext._cli import positive_int
from galerkin_ext.layers import draw_torch_masks
from galerkin_ext.models import build_model

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
    return forward_backward_medians({name: partial(impl, x) for name, impl in IMPLS.items()},
                                    (x,), grad, reps)


def _grid(s: int) -> Tensor:
    """The ``(s, s, 2)`` nodes of the unit square."""
    axis = torch.linspace(0, 1, s)
    return torch.stack(torch.meshgrid(axis, axis, indexing="ij"), dim=-1)


def _example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module, for its presets (importing it runs nothing)."""
    return exec_file(name, ROOT / "examples" / f"{name}.py")


def quick_models() -> dict[str, tuple[nn.Module, tuple[Tensor, ...]]]:
    """The quick presets' models that drop, as the examples configure them, each with a batch
    of its inputs at its preset's grid and batch size."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    darcy = _example("darcy").PRESETS["quick"]
    fine, coarse, batch = darcy["fine"], darcy["coarse"], darcy["train"]["batch_size"]
    inputs = (torch.rand(batch, fine, fine, 1, generator=gen), _grid(fine))
    models = {f"darcy_{short}": (build_model("darcy", fine=fine, coarse=coarse,
                                             **{**darcy["model"], "attention_type": attention}),
                                 inputs)
              for short, attention in (("gt", "galerkin"), ("ft", "fourier"))}
    continuum = _example("darcy_continuum")
    preset = continuum.PRESETS["quick"]
    # the TNO also without its attention dropout: what that dropout costs
    for label, name, changes in (("tno", "tno", {}), ("tno_no_attn", "tno", {"attn_dropout": 0.0}),
                                 ("vitno", "vitno", {})):
        spec = continuum.MODELS[name]
        quick = spec["quick"]
        s = quick.get("data", {}).get("resolution", preset["data"]["resolution"])
        batch = preset["train"]["batch_size"]
        model = build_model(spec["name"], **{**preset["model"], **quick["model"], **changes})
        u = torch.rand(batch, s, s, 1, generator=gen)
        # the TNO takes the s² nodes as a point set, the ViT NO the grid
        inputs = ((u.reshape(batch, s * s, 1), _grid(s).reshape(-1, 2)) if name == "tno"
                  else (u, _grid(s)))
        models[f"darcy_{label}"] = (model, inputs)
    return models


def time_steps(model: nn.Module, inputs: tuple[Tensor, ...], steps: int,
               reps: int) -> dict[str, float]:
    """Median milliseconds of a training step of ``model`` (ours) and of a copy drawing torch's
    masks, ``steps`` steps of each in turn per round."""
    models = {"ours": model, "torch": copy.deepcopy(model)}
    draw_torch_masks(models["torch"])
    with torch.no_grad():
        target = torch.randn_like(model(*inputs))
    steppers: dict[str, Callable[[], None]] = {}
    for name, m in models.items():
        m.train()
        optimizer = torch.optim.Adam(m.parameters(), lr=1e-4)

        def step(m: nn.Module = m, optimizer: torch.optim.Optimizer = optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            F.mse_loss(m(*inputs), target).backward()
            optimizer.step()

        steppers[name] = step
    times: dict[str, list[float]] = {name: [] for name in models}
    for rep in range(WARMUP + reps):
        for name, step in steppers.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            if rep >= WARMUP:
                times[name].append((time.perf_counter() - start) / steps * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = op_parser(__doc__, reps=15)
    p.add_argument("--steps", type=positive_int, default=3,
                   help="training steps per round (default: %(default)s)")
    p.add_argument("--step-reps", type=positive_int, default=7,
                   help="rounds of training steps (default: %(default)s)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows, steps = [], []
    print(f"{'shape':10s} {'elements':>9s}   fwd ms torch / ours        fwd+bwd ms torch / ours")
    for name, shape in SHAPES.items():
        t = time_impls(shape, args.reps)
        numel = math.prod(shape)
        rows.append({"shape_name": name, "shape": list(shape), "p": P,
                     "torch_fwd_ms": t["torch"][0], "ours_fwd_ms": t["ours"][0],
                     "torch_fwd_bwd_ms": t["torch"][1], "ours_fwd_bwd_ms": t["ours"][1]})
        print(f"{name:10s} {numel:9d}   {t['torch'][0]:7.3f} / {t['ours'][0]:6.3f} "
              f"({t['torch'][0] / t['ours'][0]:5.1f}x)   {t['torch'][1]:7.3f} / "
              f"{t['ours'][1]:6.3f} ({t['torch'][1] / t['ours'][1]:5.1f}x)")
    print(f"{'model':12s} training step ms torch / ours")
    for name, (model, inputs) in quick_models().items():
        t = time_steps(model, inputs, args.steps, args.step_reps)
        steps.append({"model": name, "steps": args.steps, "rounds": args.step_reps,
                      "torch_step_ms": t["torch"], "ours_step_ms": t["ours"]})
        print(f"{name:12s} {t['torch']:8.2f} / {t['ours']:8.2f} ({t['torch'] / t['ours']:5.2f}x)")
    write_results(args, rows, training_steps=steps)


if __name__ == "__main__":
    main()
