"""Kolmogorov flow of the continuum-attention paper (SPEC-continuum §3-5, its Table 3): learn
the map w(T) -> w(T + 0.1), T = 11, of the vorticity of a forced two-dimensional
Navier-Stokes flow on the periodic square (nu = 1/70, forcing sin(4y) x), with the ViT NO, the
FANO or one of the paper's baselines.

    python examples/kolmogorov.py --out runs/kolmogorov_vitno               # quick preset
    python examples/kolmogorov.py --model fno --out runs/kolmogorov_fno
    python examples/kolmogorov.py --preset paper --model fano --out runs/table3_fano   # GPU

Models (``--model``, see MODELS below): ``vitno`` and ``fano`` (patched attention: the number of
patches is fixed, so one trained model runs on every grid the patches divide), ``fno``
(``fno_ca``) and ``afno`` (tied to its training grid: no zero-shot).  Data: generated once and
cached (``python -m galerkin_ext.data generate kolmogorov``): train, validation and test from one
seed; the zero-shot set is an independent draw (another seed than ``--data``'s, the same law:
another one is refused) solved on a finer grid and read at every ``--eval-resolution`` by exact
spectral resampling (none is generated for ``--eval-resolution`` alone).  Inputs and outputs
are vorticity and share one global scalar normaliser fitted on the training split, so
``--residual`` (the model predicts the change w(T + 0.1) - w(T)) starts from the persistence
forecast.  Loss: relative L2 (quick) or relative H^1 with periodic differences at the physical
spacing (paper).  Writes OUT/metrics.json (``test_rel_l2_median`` -- the paper's statistic,
physical units --, ``persistence_rel_l2_median`` -- the error of predicting no change --,
``test_rel_l2`` (mean), ``test_rel_l2_median_normalized``, ``zero_shot``, ``rollout``, the
config and the normaliser), OUT/best.pt, OUT/last.pt (resume with --resume), OUT/metrics.csv
(its ``eval_rel_l2``, which picks the best epoch, in normalised units) and OUT/prediction.png.
``--rollout K`` (quick 5, paper 10) applies the trained model K times to its own output from
w(T) on the first test samples and compares each step with the solver's trajectory from the
same w(T) (``rollout``: median relative L2 per step, the model's and persistence's).
"""

import argparse
import copy
import math
import sys

import torch

from galerkin_ext._cli import nonnegative_int, periodic_points, positive_int
from galerkin_ext.data import KOLMOGOROV_PRESETS, KolmogorovDataset, inspect_h5
from galerkin_ext.losses import RelativeLoss, relative_l2
from galerkin_ext.training import (
    VALIDATION_NORMALISED,
    TrainConfig,
    Trainer,
    add_patched_model_flags,
    build_run_model,
    cached_data,
    check_resume,
    check_zero_shot_law,
    cleanup_distributed,
    describe_grid,
    enforce_thresholds,
    error_summary,
    experiment_parser,
    normalizer_config,
    patched_model_options,
    plot_2d,
    predict,
    preset_unchanged,
    record_data_files,
    relative_l2_metric,
    resolve_config,
    run_main,
    setup_distributed,
    threshold_report,
    write_metrics,
    zero_shot_seed,
)

# ----------------------------------------------------------------------------------------------
# Config.  "paper" is SPEC-continuum §3-4: 416^2, 9000 train / 500 validation / 500 test,
# zero-shot 100 pairs solved at 832^2 and read at 208, 312, 416, 624 and 832, the paper's
# models (build_model's values, 13 x 13 patches), Adam with ReduceLROnPlateau (x0.5,
# patience 2, on the validation relative L2: see VALIDATION_NORMALISED) at each model's
# learning rate and batch (MODELS), 80 epochs, relative H^1 loss.
# "quick" is SPEC-continuum §7: solved and learned at 32^2 (float32, step 0.025), 1000 train /
# 100 validation / 200 test, 4 x 4 patches, every model 32 wide with 2 layers (d_ff 64),
# residual output, relative L2 loss, Adam + OneCycle (max_lr 5e-3: at 30 epochs 2e-3 gave
# 0.163, 5e-3 0.150), 24 epochs (the FANO 15); zero-shot 50 pairs solved at 64^2 and read at
# 16, 32 and 64 (half, the same and twice the training grid); what they reach: the README, from
# benchmarks/quick_presets.py (the AFNO learns only with PhysicsNeMo's initialisation).  The
# generator's presets without their sample count: the data hold n_train + n_valid + n_eval
# samples (the presets' 1300 and 10000), so a smaller run generates no more than it uses.
DATA = {name: {k: v for k, v in KOLMOGOROV_PRESETS[name].items() if k != "n_samples"}
        for name in ("quick", "paper")}
PRESETS = {
    "quick": {
        "threads": None,
        "data": DATA["quick"],
        "n_train": 1000, "n_valid": 100, "n_eval": 200,
        "zero_shot": {"data": {"n_samples": 50, "resolution": 64, "solve_resolution": 64,
                               "solve_dtype": "float32", "seed": 1},
                      "resolution": [16, 32, 64]},
        "rollout": {"steps": 5, "samples": 50},
        "loss": "l2",
        "residual": True,
        "model": {},
        "train": {"epochs": 24, "batch_size": 8, "max_lr": 5e-3, "div_factor": 25.0,
                  "final_div_factor": 1e3, "pct_start": 0.2, "grad_clip": 1.0, "seed": 0},
    },
    "paper": {
        "threads": None,
        "data": DATA["paper"],
        "n_train": 9000, "n_valid": 500, "n_eval": 500,
        "zero_shot": {"data": dict(KOLMOGOROV_PRESETS["zero-shot"]),
                      "resolution": [208, 312, 416, 624, 832]},
        "rollout": {"steps": 10, "samples": 100},
        "loss": "h1",
        "residual": False,
        "model": {},
        "train": {"scheduler": "plateau", "plateau_factor": 0.5, "plateau_patience": 2,
                  "epochs": 80, "grad_clip": None, "seed": 0},
    },
}
# --model -> build_model name, how it weighs the points (for metrics.json), whether it is tied
# to its training grid, and what each preset sets for it (SPEC-continuum §4's learning rates
# and batches for the paper).  A new model is one entry here.
MODELS = {
    "vitno": {"name": "vitno", "weights": "patched: cell weight 1/s^2 of each grid",
              "quick": {"model": {"d_model": 32, "n_head": 4, "num_layers": 2,
                                  "dim_feedforward": 64, "patches": [4, 4], "lift_modes": 4,
                                  "final_modes": 8}},
              "paper": {"model": {"patches": [13, 13]},
                        "train": {"max_lr": 1e-3, "batch_size": 2}}},
    "fano": {"name": "fano", "weights": "patched: cell weight 1/s^2 of each grid",
             "quick": {"model": {"d_model": 32, "n_head": 4, "num_layers": 2,
                                 "dim_feedforward": 64, "patches": [4, 4], "qkv_modes": 4,
                                 "final_modes": 8},
                       # its spectral Q, K, V take 1.7x the ViT NO's time per epoch
                       "train": {"epochs": 15}},
             "paper": {"model": {"patches": [13, 13]},
                       "train": {"max_lr": 1e-3, "batch_size": 2}}},
    "fno": {"name": "fno_ca", "weights": "none: a spectral model",
            "quick": {"model": {"width": 32, "lifting": 32, "projection": 64, "n_modes": 12,
                                "num_layers": 2}},
            "paper": {"train": {"max_lr": 1e-3, "batch_size": 4}}},
    "afno": {"name": "afno", "grid_bound": True,
             "weights": "none: a spectral model with a per-node positional embedding",
             "quick": {"model": {"d_model": 32, "num_layers": 2, "num_blocks": 4,
                                 "mlp_ratio": 2}},
             "paper": {"train": {"max_lr": 1e-3, "batch_size": 1}}},
}
# SPEC-continuum §7: the quick ViT NO must beat persistence by 10 %; the others are not held
# to a threshold.
PERSISTENCE_FACTOR = {"vitno": 0.9}
N_PLOT = 3  # test samples drawn in prediction.png


def presets_for(model):
    """PRESETS with ``model``'s settings merged in (before the command line's overrides)."""
    out = copy.deepcopy(PRESETS)
    for preset, block in out.items():
        for key, values in MODELS[model].get(preset, {}).items():
            block[key].update(values)
    return out


def make_forward(residual):
    """forward(model, batch) of the Trainer: the model on the grid, plus its input with
    ``residual`` (input and output share one normaliser, so that sum is the next state)."""

    def forward(model, batch):
        out = model(batch["x"], batch["grid"][0])
        return batch["x"] + out if residual else out

    return forward


def rollout(model, dataset, forward, steps, samples, batch_size, device):
    """The model applied ``steps`` times to its own output from w(T), on the first ``samples``
    (at most all) of ``dataset``, against the solver's trajectories from the same w(T)
    (:meth:`KolmogorovDataset.reference_trajectories`): the median relative L2 (physical units)
    of the model and of persistence at each step, and how far the solver's step 1 is from the
    stored target (its round-off when the data were solved on this grid)."""
    count = min(samples, len(dataset))
    truth = dataset.reference_trajectories(steps, count)  # (count, steps, s, s)
    decode = dataset.target_normalizer.decode
    grid = dataset.grid[None].to(device)
    model.eval()
    states = []
    with torch.no_grad():
        for lo in range(0, count, batch_size):
            x, chunk = dataset.x[lo:min(lo + batch_size, count)].to(device), []
            for _ in range(steps):  # input and output share one normaliser: feed it back
                x = forward(model, {"x": x, "grid": grid})
                chunk.append(decode(x)[..., 0].double().cpu())
            states.append(torch.stack(chunk, dim=1))
    pred = torch.cat(states)
    w0 = dataset.input_normalizer.decode(dataset.x[:count, ..., 0]).double()
    stored = decode(dataset.target[:count, ..., 0]).double()

    def step_medians(states):  # the median over the samples of each step's relative L2
        errors = relative_l2(states.flatten(0, 1), truth.flatten(0, 1), reduction="none")
        return errors.view(count, steps).quantile(0.5, dim=0).tolist()

    return {"steps": steps, "samples": count, "dt_out": dataset.parameters["dt_out"],
            "rel_l2_median": step_medians(pred),
            "persistence_rel_l2_median": step_medians(w0[:, None].expand_as(truth)),
            "reference_step1_vs_stored": float(
                relative_l2(truth[:, 0], stored, reduction="none").max())}


def main(argv=None):
    parser = experiment_parser(
        __doc__, PRESETS, attention_flags=False,
        eval_data_help="the zero-shot set's file, a galerkin_ext .h5 of kolmogorov data read at "
                       "every --eval-resolution (default: generate the preset's once and cache "
                       "it); the test split is always the last samples of --data")
    parser.add_argument("--model", choices=list(MODELS), default="vitno",
                        help="a patched model or a baseline of the paper's Table 3 (default: "
                             "%(default)s)")
    parser.add_argument("--n-valid", type=positive_int, default=None,
                        help="validation samples (pick the best epoch, drive the schedule)")
    parser.add_argument("--eval-resolution", type=periodic_points, nargs="*", default=None,
                        help="grids s per axis at which the zero-shot set is read (default: "
                             "the preset's; quick 16 32 64, paper 208 312 416 624 832); give "
                             "the flag alone for none")
    parser.add_argument("--loss", choices=("l2", "h1", "h1-code"), default=None,
                        help="'l2' (quick); 'h1': relative H^1 with periodic differences at "
                             "the physical spacing (paper); 'h1-code': the authors' (|e| + "
                             "|grad e|) / (|y| + |grad y|) at index spacing")
    parser.add_argument("--rollout", type=nonnegative_int, default=None,
                        help="steps of dt_out the trained model is applied to its own output "
                             "from w(T), against the solver (default: the preset's; quick 5, "
                             "paper 10; 0: none)")
    parser.add_argument("--residual", action=argparse.BooleanOptionalAction, default=None,
                        help="predict the change of the vorticity (quick) or the vorticity "
                             "itself (paper)")
    add_patched_model_flags(parser)
    args = parser.parse_args(argv)
    presets = presets_for(args.model)
    cfg = resolve_config(presets, args, experiment="kolmogorov")
    spec = MODELS[args.model]
    cfg["model_choice"] = args.model
    if args.eval_resolution is not None:
        cfg["zero_shot"]["resolution"] = args.eval_resolution
    if args.loss is not None:
        cfg["loss"] = args.loss
    if args.residual is not None:
        cfg["residual"] = args.residual
    if args.rollout is not None:
        cfg["rollout"]["steps"] = args.rollout

    def stored_size(path, flag, preset):
        """(samples, grid) of a given file (--data, --eval-data) or of the preset's."""
        if path is None:
            return preset["n_samples"], preset["resolution"]
        info = inspect_h5(path)
        if info["generator"] != "kolmogorov":
            parser.error(f"{flag}: {path} holds {info['generator']} data, expected kolmogorov "
                         f"data")
        return info["n_samples"], info["parameters"]["resolution"]

    s = stored_size(args.data, "--data", cfg["data"])[1]
    zero_shot_res = cfg["zero_shot"]["resolution"]
    if args.eval_data is not None and not zero_shot_res:
        parser.error("--eval-data: the zero-shot set is read at no grid (--eval-resolution "
                     "alone); leave out one of the two flags")
    # The zero-shot set is read at each grid no finer than it is stored: reading it finer
    # would interpolate, not test a finer grid.
    n_zero_shot, stored = stored_size(args.eval_data, "--eval-data", cfg["zero_shot"]["data"])
    if any(res > stored for res in zero_shot_res):
        parser.error(f"--eval-resolution: the zero-shot set is stored at {stored}^2, got "
                     f"{zero_shot_res}")
    patches = cfg["model"].get("patches")
    if patches is not None:  # found now, not after the data are generated
        for res in (s, *zero_shot_res):
            if res % patches[0] or res % patches[1]:
                parser.error(f"--data/--eval-resolution: {args.model}'s {patches[0]} x "
                             f"{patches[1]} patches must divide every grid, got s = {res}")
    if spec.get("grid_bound"):
        cfg["model"]["grid"] = [s, s]  # its positional embedding has one row per node
    options = patched_model_options(parser, args, spec["name"])
    cfg["model"].update(options)
    enforced = not options and preset_unchanged(cfg, presets[args.preset], args)
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    check_resume(cfg, args, zero_shot=True)  # before any data are generated
    ctx = setup_distributed(args.device)

    # -- data: train/validation/test from one file, one scalar normaliser from the training split
    data = args.data or cached_data("kolmogorov", args.data_dir, ctx, **cfg["data"],
                                    progress=not args.no_progress)
    # (read before the zero-shot set is generated: a --data file of too few samples was found
    # after it, hours at the paper's size)
    split = {"n_train": cfg["n_train"], "n_valid": cfg["n_valid"], "n_test": cfg["n_eval"]}
    train_set = KolmogorovDataset(data, "train", **split)
    norms = {"input_normalizer": train_set.input_normalizer,
             "target_normalizer": train_set.target_normalizer}
    valid_set = KolmogorovDataset(data, "valid", **split, **norms)
    test_set = KolmogorovDataset(data, "test", **split, **norms)
    zero_shot_data = args.eval_data
    if zero_shot_data is None and zero_shot_res:  # the preset's set, drawn by --data's law
        zs_data = cfg["zero_shot"]["data"]
        zs_data["seed"] = zero_shot_seed(data, "kolmogorov", zs_data["seed"])  # other draws
        zero_shot_data = cached_data("kolmogorov", args.data_dir, ctx, **zs_data,
                                     progress=not args.no_progress)
        check_zero_shot_law(data, zero_shot_data, "--eval-resolution")
    # (a resumed run must read the same --data, and may take another zero-shot set or none;
    # every zero-shot sample is evaluated)
    record_data_files(cfg, data, zero_shot_data, evaluated=n_zero_shot, zero_shot=True)
    zero_shot_sets, skipped = {}, {}
    for res in zero_shot_res:
        if spec.get("grid_bound") and res != s:
            skipped[f"s={res}"] = (f"{args.model}: its learned positional embedding ties it to "
                                   f"the {s}x{s} training grid (not a neural operator)")
            continue
        zero_shot_sets[f"s={res}"] = KolmogorovDataset(
            zero_shot_data, "test", resolution=res, n_train=0, n_valid=0, n_test=n_zero_shot,
            **norms)
    cfg["normalizers"] = normalizer_config(vorticity=norms["input_normalizer"])

    # -- model, loss, training -----------------------------------------------------------------
    torch.manual_seed(cfg["train"]["seed"])  # the same initial weights in every process
    model = build_run_model(cfg, spec["name"])
    # [0, 2 pi)^2 on s points per axis: the physical spacing of the periodic differences
    # ('h1-code' is the authors' loss, with their non-periodic differences)
    loss = RelativeLoss(cfg["loss"], h=2 * math.pi / s, periodic=cfg["loss"] == "h1")
    forward = make_forward(cfg["residual"])
    trainer = Trainer(model, loss, train_set, valid_set, TrainConfig(**cfg["train"]), args.out,
                      ctx=ctx, forward=forward, metric=relative_l2_metric(), run_config=cfg)
    result = trainer.fit(resume=args.resume)  # ends with the best epoch's weights loaded

    # -- evaluation: test set, persistence, then zero-shot on other grids ----------------------
    def summary(dataset):
        return error_summary(model, dataset, normalizer=norms["target_normalizer"],
                             forward=forward, device=ctx.device, ctx=ctx)

    def persistence(dataset):
        errors = dataset.persistence_errors()
        return {"persistence_rel_l2_median": float(errors.quantile(0.5)),
                "persistence_rel_l2": float(errors.mean())}

    test = summary(test_set)
    zero_shot = {name: {**describe_grid(ds.grid, spec["weights"]), **summary(ds),
                        **persistence(ds)}
                 for name, ds in zero_shot_sets.items()}
    zero_shot.update({name: {"skipped": why} for name, why in skipped.items()})

    if ctx.is_main:
        steps = cfg["rollout"]["steps"]
        roll = (rollout(model, test_set, forward, steps, cfg["rollout"]["samples"],
                        trainer.config.eval_batch_size, ctx.device) if steps else None)
        baseline = persistence(test_set)
        values = {"test_rel_l2_median": test["rel_l2_median"]}
        thresholds = {}
        if args.model in PERSISTENCE_FACTOR and args.preset == "quick":
            thresholds["test_rel_l2_median"] = (PERSISTENCE_FACTOR[args.model]
                                                * baseline["persistence_rel_l2_median"])
        report = threshold_report(values, thresholds, enforced=enforced)
        pred, batch = predict(model, test_set, list(range(min(N_PLOT, len(test_set)))),
                              device=ctx.device, forward=forward)
        decode = norms["target_normalizer"].decode
        plot_2d(f"{args.out}/prediction.png", decode(batch["x"])[..., 0], decode(pred)[..., 0],
                decode(batch["target"])[..., 0], input_label="vorticity w(T)",
                title=f"Kolmogorov flow {s}x{s}, {args.model}: w(T + 0.1), test median rel. "
                      f"L2 {test['rel_l2_median']:.3e} (persistence "
                      f"{baseline['persistence_rel_l2_median']:.3e})")
        write_metrics(args.out, result, model, ctx, cfg, test["rel_l2"],
                      selection=VALIDATION_NORMALISED,
                      test_rel_l2_median=test["rel_l2_median"],
                      test_rel_l2_median_normalized=test["rel_l2_median_normalized"],
                      test_rel_l2_max=test["rel_l2_max"], test=test, **baseline,
                      train_grid=describe_grid(train_set.grid, spec["weights"]),
                      zero_shot=zero_shot, rollout=roll, thresholds=report,
                      stopped_early=result["stopped_early"])
        print(f"test median relative L2 {test['rel_l2_median']:.4e} (physical units; "
              f"persistence {baseline['persistence_rel_l2_median']:.4e})")
        for name, z in zero_shot.items():
            print(f"zero-shot {name}: " + (z["skipped"] if "skipped" in z else
                                           f"median {z['rel_l2_median']:.4e} (persistence "
                                           f"{z['persistence_rel_l2_median']:.4e})"))
        if roll:
            for k, (err, base) in enumerate(zip(roll["rel_l2_median"],
                                                roll["persistence_rel_l2_median"], strict=True),
                                            start=1):
                print(f"rollout step {k} (t = T + {k * roll['dt_out']:g}): median {err:.4e} "
                      f"(persistence {base:.4e})")
    cleanup_distributed(ctx)
    if ctx.is_main:
        enforce_thresholds(report)  # after the group is left: the others do not wait on us


if __name__ == "__main__":
    sys.exit(run_main(main))
