"""Inverse Darcy problem, the paper's experiment 3: recover the coefficient a (on a coarse grid)
from a noisy solution u of -div(a grad u) = 1.

    python examples/darcy_inverse.py --out runs/inverse            # quick preset, CPU minutes
    python examples/darcy_inverse.py --preset paper --noise 0.01 --out runs/inv141_noise1e-2
    python examples/darcy_inverse.py --preset paper --fine 211 --coarse 71 --noise 0.1 --out ...
    python examples/darcy_inverse.py --model fno --out runs/inverse_fno      # FNO2d (only n_f)
    python examples/darcy_inverse.py --preset paper --model fno --fine 36 --coarse 36 --out ...

``--model fno`` trains the paper's FNO2d baseline of Table 3 on the same data, loss and trainer:
on the --fine grid, its output averaged onto the coarse grid as the target is ("only n_f"); with
``--fine`` equal to ``--coarse``, the input is sampled at the coarse nodes and the FNO works on
that grid alone ("only n_c"; its 12 modes need 24 nodes or more: the paper's 36, 71).

The input is u after the pointwise normaliser plus static noise ``--noise * N(0, 1)`` (drawn once
per sample, for training and evaluation alike); the target is the coefficient on the --fine
grid, block-averaged to the coarse one as the original code does it (``data.block_average``).
Data: generated once and cached (the same files as examples/darcy.py), or the original
``--data ...smooth1.mat --eval-data ...smooth2.mat``.  Writes OUT/metrics.json, OUT/best.pt,
OUT/last.pt (resume with --resume), OUT/metrics.csv and OUT/prediction.png.
"""

import sys

import torch

from galerkin_ext._cli import grid_nodes, nonnegative_float, positive_int
from galerkin_ext.data import (
    DarcyInverseDataset,
    UnitGaussianNormalizer,
    check_darcy_grids,
    paired_coarse,
)
from galerkin_ext.data.datasets import INVERSE_COARSE
from galerkin_ext.losses import OperatorLoss
from galerkin_ext.training import (
    TrainConfig,
    Trainer,
    baseline_model,
    build_run_model,
    cached_data,
    check_model_grid,
    check_resume,
    cleanup_distributed,
    enforce_thresholds,
    evaluate,
    evaluation_only,
    experiment_parser,
    normalizer_config,
    plot_2d,
    predict,
    preset_unchanged,
    record_data_files,
    resolve_config,
    run_main,
    setup_distributed,
    threshold_report,
    write_metrics,
)

# ----------------------------------------------------------------------------------------------
# Config.  "paper" is SPEC §5: 1024 train / 100 eval samples, input 141 -> coefficient on 36 x 36,
# the 2,383,873-parameter model, Adam + OneCycle(max_lr 1e-3, div 1e4, final div 1e4,
# pct_start 0.3), 100 epochs, batch 4, clip 0.999, plain relative L2 loss (gamma = 0).
# "quick": a small model at 85 -> 22 on data solved directly on the 85 x 85 grid, the data of
# examples/darcy.py (what it reaches: the README, from benchmarks/quick_presets.py).  A run of
# the quick preset as written (README) fails if it misses its threshold.
PRESETS = {
    "quick": {
        "threads": 1,  # small ops: one thread is faster than OpenMP syncs on a busy 2-core CPU
        "data": {"n_samples": 512, "resolution": 85, "seed": 0},  # shared with darcy.py
        "n_train": 384, "n_eval": 100, "fine": 85, "coarse": 22, "noise": 0.0,
        "model": {"attention_type": "galerkin", "norm": "attn", "d_model": 32, "n_head": 4,
                  "num_layers": 3, "dim_feedforward": 64},
        "train": {"epochs": 30, "batch_size": 4, "max_lr": 1e-3, "div_factor": 1e4,
                  "final_div_factor": 1e4, "pct_start": 0.3, "grad_clip": 0.999, "seed": 0},
        "thresholds": {"test_rel_l2": 1e-1},
    },
    "paper": {
        "data": {"n_samples": 2048, "resolution": 421, "seed": 0},
        "n_train": 1024, "n_eval": 100, "fine": 141, "coarse": 36, "noise": 0.0,
        "model": {"attention_type": "galerkin", "norm": "attn"},  # the rest: the paper's
        "train": {"epochs": 100, "batch_size": 4, "max_lr": 1e-3, "div_factor": 1e4,
                  "final_div_factor": 1e4, "pct_start": 0.3, "grad_clip": 0.999, "seed": 0},
    },
}
LOWER_MAX_LR = {"fourier": 5e-4, "softmax": 5e-4}  # SPEC §5: their peak lr in 2-D
NOISE_SEED = 0  # seed of the static input noise
N_PLOT = 3  # evaluation samples drawn in prediction.png


def targets_grid(fine, coarse, preset_grids):
    """The grid the targets are averaged from onto the coarse one: the fine grid, or for an
    input on the coarse grid itself (the FNO's "only n_c" row) the fine grid that the preset
    or the paper pairs with it, so that every row learns the same targets."""
    if fine != coarse:
        return fine
    if coarse == preset_grids[1]:
        return preset_grids[0]
    paired = {c: f for f, c in INVERSE_COARSE.items()}
    if coarse not in paired:
        raise ValueError(f"--fine equal to --coarse reads the input on the coarse grid, whose "
                         f"targets are averaged from the fine grid paired with it (the preset's "
                         f"{preset_grids[1]} with {preset_grids[0]}, the paper's "
                         + ", ".join(f"{c} with {f}" for c, f in paired.items())
                         + f"); none is paired with {coarse}")
    return paired[coarse]


def main(argv=None):
    parser = experiment_parser(__doc__, PRESETS, mat_files=True)
    parser.add_argument("--fine", type=grid_nodes, default=None,
                        help="input grid n per axis (paper: 141, 211)")
    parser.add_argument("--coarse", type=positive_int, default=None,
                        help="coefficient grid per axis (paper: 36 for 141, 71 for 211; default: "
                             "the preset's for its --fine, else the paper's for that --fine)")
    parser.add_argument("--noise", type=nonnegative_float, default=None,
                        help="std of the static noise on the normalised input (paper: 0, 0.01, "
                             "0.1; default: the preset's, 0)")
    parser.add_argument("--model", choices=("transformer", "fno"), default="transformer",
                        help="the paper's transformer (default) or its FNO2d baseline on the "
                             "--fine grid, output averaged onto the coarse one (the comparison "
                             "rows: the same data, loss and trainer)")
    args = parser.parse_args(argv)
    cfg = resolve_config(PRESETS, args, experiment="darcy_inverse")
    name = baseline_model(parser, args, cfg, "darcy_inverse", "fno2d")
    preset_grids = (cfg["fine"], cfg["coarse"])
    cfg["fine"] = args.fine or cfg["fine"]
    try:  # found now, not after the data are generated (a file's grid: when it is read)
        cfg["coarse"] = args.coarse or paired_coarse(cfg["fine"], preset_grids, INVERSE_COARSE)
        target_resolution = targets_grid(cfg["fine"], cfg["coarse"], preset_grids)
        check_darcy_grids(cfg["fine"], cfg["coarse"],
                          None if args.data else cfg["data"]["resolution"],
                          target_resolution=target_resolution)
    except ValueError as err:
        parser.error(f"--fine/--coarse: {err}")
    if args.noise is not None:
        cfg["noise"] = args.noise
    attention = cfg["model"].get("attention_type")  # (None: the FNO)
    if args.lr is None and attention in LOWER_MAX_LR:
        cfg["train"]["max_lr"] = min(cfg["train"]["max_lr"], LOWER_MAX_LR[attention])
    enforced = preset_unchanged(cfg, PRESETS[args.preset], args)
    thresholds = cfg.pop("thresholds", {})  # not part of the run's identity
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    # the model before the data: a grid too small for its Fourier modes fails now
    torch.manual_seed(cfg["train"]["seed"])  # the same initial weights in every process
    try:
        model = (build_run_model(cfg, name, coarse=cfg["coarse"]) if args.model == "fno"
                 else build_run_model(cfg, name, fine=cfg["fine"], coarse=cfg["coarse"]))
        if args.model == "fno":  # (grid-free: it meets its grid in the forward)
            check_model_grid(model, (cfg["fine"], cfg["fine"]), in_channels=1)
    except ValueError as err:
        parser.error(f"--fine/--coarse: {err}")
    check_resume(cfg, args)  # before any data are generated
    ctx = setup_distributed(args.device)

    # -- data ----------------------------------------------------------------------------------
    data = args.data or cached_data("darcy", args.data_dir, ctx, **cfg["data"],
                                    progress=not args.no_progress)
    record_data_files(cfg, data, args.eval_data)  # a resumed run must read the same files
    grids = {"resolution": cfg["fine"], "coarse_resolution": cfg["coarse"], "noise": cfg["noise"],
             "noise_seed": NOISE_SEED, "n_train": cfg["n_train"], "n_test": cfg["n_eval"],
             "target_resolution": target_resolution}
    train_set = DarcyInverseDataset(data, "train", **grids)
    # Another file's samples draw their noise from another seed: the draws depend on the index
    # alone, so its sample k would carry training sample k's noise.
    eval_grids = ({**evaluation_only(grids), "noise_seed": NOISE_SEED + 1} if args.eval_data
                  else grids)
    eval_set = DarcyInverseDataset(args.eval_data or data, "test", **eval_grids,
                                   input_normalizer=train_set.input_normalizer)
    # in checkpoints: per grid point, flattened (fine x fine row-major)
    cfg["normalizers"] = normalizer_config(input=train_set.input_normalizer)

    # -- loss, training (the model: built above) --------------------------------------------
    norm = UnitGaussianNormalizer(train_set.target)  # the model outputs a: out * std + mean
    model.denormalizer.set_statistics(norm.mean[..., None], norm.std[..., None], eps=norm.eps)
    loss = OperatorLoss(gamma=0.0)
    trainer = Trainer(model, loss, train_set, eval_set, TrainConfig(**cfg["train"]), args.out,
                      ctx=ctx, run_config=cfg)
    result = trainer.fit(resume=args.resume)  # ends with the best epoch's weights loaded
    test_rel_l2 = evaluate(model, eval_set, device=ctx.device, ctx=ctx)

    if ctx.is_main:
        pred, batch = predict(model, eval_set, list(range(min(N_PLOT, len(eval_set)))),
                              device=ctx.device)
        plot_2d(f"{args.out}/prediction.png", batch["x"][..., 0], pred[..., 0],
                batch["target"][..., 0],
                input_label=f"input: normalised u + noise {cfg['noise']:g}",
                title=f"Inverse Darcy {cfg['fine']} -> {cfg['coarse']}, "
                      + ("FNO2d" if args.model == "fno" else f"{attention} attention")
                      + f": evaluation rel. L2 {test_rel_l2:.3e}")
        report = threshold_report({"test_rel_l2": test_rel_l2}, thresholds, enforced=enforced)
        write_metrics(args.out, result, model, ctx, cfg, test_rel_l2, thresholds=report)
    cleanup_distributed(ctx)
    if ctx.is_main:
        enforce_thresholds(report)  # after the group is left: the others do not wait on us


if __name__ == "__main__":
    sys.exit(run_main(main))
