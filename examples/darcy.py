"""Darcy flow, the paper's experiment 2: learn the map a -> u of -div(a grad u) = 1, u = 0 on
the boundary of the unit square (a piecewise constant, 3 or 12).

    python examples/darcy.py --out runs/darcy                      # quick preset, CPU minutes
    python examples/darcy.py --preset paper --fine 211 --coarse 61 --out runs/darcy211
    torchrun --nproc_per_node=4 examples/darcy.py --preset paper --attention fourier --out runs/ft
    python examples/darcy.py --model fno --out runs/darcy_fno     # the FNO2d comparison row

Data: generated once (SPEC §4; the paper preset solves 2048 samples on 421 x 421 and
subsamples to --fine) and cached, or the original files with
``--data piececonst_r421_N1024_smooth1.mat --eval-data piececonst_r421_N1024_smooth2.mat``.
The model reads the fine grid, attends on the coarse one and de-normalises its output, so the
metric is the relative L2 error of u itself; ``--model fno`` trains the paper's FNO2d baseline
(published size) on the fine grid instead, de-normalised the same way.  Writes
OUT/metrics.json, OUT/best.pt, OUT/last.pt (resume with --resume), OUT/metrics.csv and
OUT/prediction.png.
"""

import sys

import torch

from galerkin_ext._cli import grid_nodes, positive_int
from galerkin_ext.data import DarcyDataset, check_darcy_grids, paired_coarse
from galerkin_ext.data.datasets import DARCY_COARSE
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
# Config.  "paper" is SPEC §5: 1024 train / 100 eval samples at 141 (coarse 43), the
# 2,220,829-parameter model, Adam + OneCycle(max_lr 1e-3, div 1e4, final div 1e4,
# pct_start 0.3), 100 epochs, batch 4, clip 0.999.  "quick": a small model at 85/29 on data
# solved directly on the 85 x 85 grid, for a laptop CPU (what it reaches, and in what time: the
# README, from benchmarks/quick_presets.py).  A run of the quick preset as written (README)
# fails if it misses its threshold.
PRESETS = {
    "quick": {
        "threads": 1,  # small ops: one thread is faster than OpenMP syncs on a busy 2-core CPU
        "data": {"n_samples": 512, "resolution": 85, "seed": 0},  # shared with darcy_inverse.py
        "n_train": 256, "n_eval": 100, "fine": 85, "coarse": 29,
        "model": {"attention_type": "galerkin", "norm": "attn", "d_model": 32, "n_head": 4,
                  "num_layers": 3, "dim_feedforward": 64, "freq_dim": 16, "modes": 12,
                  "decoder_dim_feedforward": 32},
        "train": {"epochs": 20, "batch_size": 4, "max_lr": 1e-3, "div_factor": 1e4,
                  "final_div_factor": 1e4, "pct_start": 0.3, "grad_clip": 0.999, "seed": 0},
        "thresholds": {"test_rel_l2": 5e-2},
    },
    "paper": {
        "data": {"n_samples": 2048, "resolution": 421, "seed": 0},
        "n_train": 1024, "n_eval": 100, "fine": 141, "coarse": 43,
        "model": {"attention_type": "galerkin", "norm": "attn"},  # the rest: the paper's
        "train": {"epochs": 100, "batch_size": 4, "max_lr": 1e-3, "div_factor": 1e4,
                  "final_div_factor": 1e4, "pct_start": 0.3, "grad_clip": 0.999, "seed": 0},
    },
}
GAMMA = 0.5  # H^1 term in the coefficient's energy seminorm: relL2 + sqrt(GAMMA h) relH1_a
LOWER_MAX_LR = {"fourier": 5e-4, "softmax": 5e-4}  # SPEC §5: their peak lr in 2-D
N_PLOT = 3  # evaluation samples drawn in prediction.png


def main(argv=None):
    parser = experiment_parser(__doc__, PRESETS, mat_files=True)
    parser.add_argument("--fine", type=grid_nodes, default=None,
                        help="input grid n per axis; (stored - 1) / (n - 1) must be an integer "
                             "(paper: 141, 211)")
    parser.add_argument("--coarse", type=positive_int, default=None,
                        help="attention grid per axis (paper: 43 for 141, 61 for 211; default: the "
                             "preset's for its --fine, else the paper's for that --fine; "
                             "--model fno has none)")
    parser.add_argument("--model", choices=("transformer", "fno"), default="transformer",
                        help="the paper's transformer (default) or its FNO2d baseline on the "
                             "--fine grid (the comparison rows: the same data, loss and trainer)")
    args = parser.parse_args(argv)
    cfg = resolve_config(PRESETS, args, experiment="darcy")
    name = baseline_model(parser, args, cfg, "darcy", "fno2d")
    preset_grids = (cfg["fine"], cfg["coarse"])
    cfg["fine"] = args.fine or cfg["fine"]
    if args.model == "fno" and args.coarse is not None:
        parser.error("--coarse: the FNO2d baseline (--model fno) has no coarse grid; it works "
                     "on the --fine grid alone")
    try:  # found now, not after the data are generated (a file's grid: when it is read)
        cfg["coarse"] = (None if args.model == "fno" else
                         args.coarse or paired_coarse(cfg["fine"], preset_grids, DARCY_COARSE))
        check_darcy_grids(cfg["fine"], cfg["coarse"] or cfg["fine"],
                          None if args.data else cfg["data"]["resolution"])
    except ValueError as err:
        parser.error(f"--fine/--coarse: {err}")
    attention = cfg["model"].get("attention_type")  # (None: the FNO)
    if args.lr is None and attention in LOWER_MAX_LR:
        cfg["train"]["max_lr"] = min(cfg["train"]["max_lr"], LOWER_MAX_LR[attention])
    enforced = preset_unchanged(cfg, PRESETS[args.preset], args)
    thresholds = cfg.pop("thresholds", {})  # not part of the run's identity
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    # the model before the data: a grid too small for its Fourier modes fails now (the coarse
    # grid is the transformer's attention grid; the FNO works on the fine one)
    torch.manual_seed(cfg["train"]["seed"])  # the same initial weights in every process
    try:
        model = (build_run_model(cfg, name) if args.model == "fno"
                 else build_run_model(cfg, name, fine=cfg["fine"], coarse=cfg["coarse"]))
        if args.model == "fno":  # (grid-free: it meets its grid in the forward)
            check_model_grid(model, (cfg["fine"], cfg["fine"]), in_channels=1)
    except ValueError as err:
        parser.error(f"{'--fine' if args.model == 'fno' else '--fine/--coarse'}: {err}")
    check_resume(cfg, args)  # before any data are generated
    ctx = setup_distributed(args.device)

    # -- data ----------------------------------------------------------------------------------
    data = args.data or cached_data("darcy", args.data_dir, ctx, **cfg["data"],
                                    progress=not args.no_progress)
    record_data_files(cfg, data, args.eval_data)  # a resumed run must read the same files
    # (the FNO's dataset: its attention grid, which nothing reads, is the fine one)
    grids = {"resolution": cfg["fine"], "coarse_resolution": cfg["coarse"] or cfg["fine"],
             "n_train": cfg["n_train"], "n_test": cfg["n_eval"]}
    train_set = DarcyDataset(data, "train", **grids)
    eval_set = DarcyDataset(args.eval_data or data, "test",
                            **(evaluation_only(grids) if args.eval_data else grids),
                            input_normalizer=train_set.input_normalizer,
                            target_normalizer=train_set.target_normalizer)
    # in checkpoints: per grid point, flattened (fine x fine row-major)
    cfg["normalizers"] = normalizer_config(input=train_set.input_normalizer,
                                           target=train_set.target_normalizer)

    # -- loss, training (the model: built above) --------------------------------------------
    norm = train_set.target_normalizer  # the model outputs u itself: u = out * std + mean
    model.denormalizer.set_statistics(norm.mean[..., None], norm.std[..., None], eps=norm.eps)
    loss = OperatorLoss(gamma=GAMMA, h=1.0 / (cfg["fine"] - 1), coefficient_weighted=True)
    trainer = Trainer(model, loss, train_set, eval_set, TrainConfig(**cfg["train"]), args.out,
                      ctx=ctx, run_config=cfg)
    result = trainer.fit(resume=args.resume)  # ends with the best epoch's weights loaded
    test_rel_l2 = evaluate(model, eval_set, device=ctx.device, ctx=ctx)

    if ctx.is_main:
        pred, batch = predict(model, eval_set, list(range(min(N_PLOT, len(eval_set)))),
                              device=ctx.device)
        plot_2d(f"{args.out}/prediction.png", batch["coeff"][..., 0], pred[..., 0],
                batch["target"][..., 0], input_label="coefficient a",
                title=(f"Darcy {cfg['fine']}, FNO2d" if args.model == "fno" else
                       f"Darcy {cfg['fine']}/{cfg['coarse']}, {attention} attention")
                      + f": evaluation rel. L2 {test_rel_l2:.3e}")
        report = threshold_report({"test_rel_l2": test_rel_l2}, thresholds, enforced=enforced)
        write_metrics(args.out, result, model, ctx, cfg, test_rel_l2, thresholds=report)
    cleanup_distributed(ctx)
    if ctx.is_main:
        enforce_thresholds(report)  # after the group is left: the others do not wait on us


if __name__ == "__main__":
    sys.exit(run_main(main))
