"""One mesh split across processes: Darcy flow (the paper's experiment 2, the map a -> u) learned
by a Galerkin Transformer whose every sample's points are sharded over the processes of a
``torchrun`` group.

    torchrun --standalone --nproc_per_node=2 examples/domain_parallel.py --out runs/domain
    python examples/domain_parallel.py --out runs/domain_1       # the same run in one process
    torchrun --standalone --nproc_per_node=8 examples/domain_parallel.py --preset large \\
        --out runs/domain_421                                   # 177,241 points per sample

Data parallelism (``examples/darcy.py`` under torchrun) splits the samples of a batch; here
every process sees every sample but holds only its contiguous share of the grid points (a
``DomainSplit`` of the flattened grid, handed out by the data loader through ``PointShards``).
The model (``GKTransformer``: a pointwise lift of ``[x, y, a]``, encoder layers with Galerkin
attention and the coordinates in every head, a pointwise decoder) acts pointwise except in its
attention layers, which ``make_domain_parallel`` turns into one all-reduce of the key-side
``d x d`` sums per layer and direction.  The loss of the whole samples is assembled from each
process's sums over its own points (``sum_over_ranks``), and the Trainer
(``parallel="domain"``) sums the parameters' gradients over the processes, so the run equals
one process's up to rounding, at any number of processes.  GNOT's blocks are domain-parallel
in the same way (``make_domain_parallel(GNOT(...))``).

Data: the Darcy set of ``examples/darcy.py`` (generated once and cached), read at
``--resolution``; the model predicts u normalised pointwise and de-normalises it with its own
points' statistics.  Writes OUT/metrics.json (``test_rel_l2``: mean relative L2 of u over the
evaluation samples, each over all of its points, at the best epoch; ``last_epoch_rel_l2``),
OUT/best.pt, OUT/last.pt (resume with --resume, with the same number of processes),
OUT/metrics.csv and OUT/prediction.png (the shards gathered).
"""

import sys

import torch

from galerkin_ext._cli import grid_nodes
from galerkin_ext.data import DarcyDataset, UnitGaussianNormalizer, check_darcy_grids
from galerkin_ext.domain import (
    DomainSplit,
    PointShards,
    make_domain_parallel,
    sum_over_ranks,
)
from galerkin_ext.training import (
    TrainConfig,
    Trainer,
    build_run_model,
    cached_data,
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
# Config.  "quick": the Darcy data of examples/darcy.py's quick preset (512 samples solved on
# 85 x 85), all 7,225 points of each sample, 256 train / 100 evaluation samples, a 32-wide
# 2-layer model, Adam + OneCycle, 30 epochs; on the CPU with gloo, one thread per process.
# "large": the paper's 421 x 421 data (2048 samples) at full resolution, 177,241 points per
# sample, 1024 / 100 samples, GKTransformer's default size: for several GPUs (not run here).
PRESETS = {
    "quick": {
        "threads": 1,
        "data": {"n_samples": 512, "resolution": 85, "seed": 0},
        "n_train": 256, "n_eval": 100, "resolution": 85,
        "model": {"d_model": 32, "n_head": 4, "num_layers": 2, "dim_feedforward": 64,
                  "decoder_hidden": 32},
        "train": {"epochs": 30, "batch_size": 4, "max_lr": 3e-3, "div_factor": 1e2,
                  "final_div_factor": 1e3, "pct_start": 0.2, "grad_clip": 1.0, "seed": 0},
    },
    "large": {
        "data": {"n_samples": 2048, "resolution": 421, "seed": 0},
        "n_train": 1024, "n_eval": 100, "resolution": 421,
        "model": {},  # GKTransformer's defaults: 4 layers, 128 wide, 4 heads
        "train": {"epochs": 100, "batch_size": 4, "max_lr": 1e-3, "div_factor": 1e2,
                  "final_div_factor": 1e3, "pct_start": 0.2, "grad_clip": 1.0, "seed": 0},
    },
}
THRESHOLD = {"quick": 0.1}  # evaluation rel. L2 the quick preset must reach (measured: README)
N_PLOT = 3  # evaluation samples drawn in prediction.png


def point_features(dataset, split):
    """``dataset``'s samples cut to this process's points: ``x`` the query points' features
    ``[x, y, a]`` (``(local_n, 3)``, ``a`` normalised), ``target`` u (``(local_n, 1)``)."""

    class Features(torch.utils.data.Dataset):
        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            item = dataset[i]
            return {"x": torch.cat([item["grid"], item["x"]], dim=-1),
                    "coeff": item["coeff"], "target": item["target"]}

    return PointShards(Features(), split, {"x": 2, "coeff": 2, "target": 2})


def make_forward(target_normalizer, split):
    """forward(model, batch) of the Trainer: the model on this process's points, de-normalised
    with their own pointwise statistics."""
    local = UnitGaussianNormalizer.from_statistics(
        split.shard(target_normalizer.mean.flatten(), dim=0)[:, None],
        split.shard(target_normalizer.std.flatten(), dim=0)[:, None], eps=target_normalizer.eps)

    def forward(model, batch):
        x = batch["x"]
        return local.to(x.device).decode(model(x))

    return forward


def whole_sample_errors(pred, target):
    """Per-sample relative L2 errors ``(B,)`` over all points of each sample, from this
    process's points ``(B, local_n, 1)``: its sums of squares, summed over the processes."""
    sums = torch.stack([((pred - target) ** 2).sum(dim=(1, 2)), (target ** 2).sum(dim=(1, 2))])
    err, ref = sum_over_ranks(sums)
    return (err / ref).sqrt()


def domain_loss(world_size):
    """loss_fn of the Trainer (``parallel="domain"``): the mean relative L2 error of the whole
    samples, and this process's share of it (its backward then yields the gradient through its
    own points)."""

    def loss_fn(pred, target, target_grad=None, coeff=None):
        rel = whole_sample_errors(pred, target).mean()
        return rel / world_size, {"rel_l2": rel.detach()}

    return loss_fn


def main(argv=None):
    parser = experiment_parser(__doc__, PRESETS, attention_flags=False, mat_files=True)
    parser.add_argument("--resolution", type=grid_nodes, default=None,
                        help="grid points per axis read from the data; (stored - 1) / "
                             "(resolution - 1) must be an integer (quick: 85, large: 421)")
    args = parser.parse_args(argv)
    cfg = resolve_config(PRESETS, args, experiment="domain_parallel", parallel="domain")
    cfg["model"].update(space_dim=2, query_dim=3, out_dim=1)  # query points: [x, y, a(x, y)]
    cfg["resolution"] = args.resolution or cfg["resolution"]
    if args.data is None:  # found now, not after the data are generated
        try:
            check_darcy_grids(cfg["resolution"], cfg["resolution"], cfg["data"]["resolution"])
        except ValueError as err:
            parser.error(f"--resolution: {err}")
    enforced = preset_unchanged(cfg, PRESETS[args.preset], args)
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    check_resume(cfg, args)  # before any data are generated
    ctx = setup_distributed(args.device)

    # -- data: every process reads every sample and keeps its own points ---------------------
    data = args.data or cached_data("darcy", args.data_dir, ctx, **cfg["data"],
                                    progress=not args.no_progress)
    record_data_files(cfg, data, args.eval_data)
    # (coarse_resolution: the CiNN models' attention grid, which this model does not read)
    grids = {"resolution": cfg["resolution"], "coarse_resolution": cfg["resolution"],
             "n_train": cfg["n_train"], "n_test": cfg["n_eval"]}
    train_full = DarcyDataset(data, "train", **grids)
    eval_full = DarcyDataset(args.eval_data or data, "test",
                             **(evaluation_only(grids) if args.eval_data else grids),
                             input_normalizer=train_full.input_normalizer,
                             target_normalizer=train_full.target_normalizer)
    # in checkpoints: per grid point, flattened (resolution x resolution row-major); the model
    # reads a normalised and predicts u normalised (make_forward de-normalises it)
    cfg["normalizers"] = normalizer_config(input=train_full.input_normalizer,
                                           target=train_full.target_normalizer)
    split = DomainSplit.even(cfg["resolution"] ** 2)  # contiguous runs of grid rows
    cfg["points"] = {"n": split.n, "per_process": list(split.counts)}
    train_set, eval_set = point_features(train_full, split), point_features(eval_full, split)

    # -- model, loss, training -----------------------------------------------------------------
    torch.manual_seed(cfg["train"]["seed"])  # the same initial weights in every process
    # build_model's GKTransformer (its published values are the class defaults)
    model = make_domain_parallel(build_run_model(cfg, "gk_elasticity"))
    forward = make_forward(train_full.target_normalizer, split)
    trainer = Trainer(model, domain_loss(ctx.world_size), train_set, eval_set,
                      TrainConfig(**cfg["train"]), args.out, ctx=ctx, forward=forward,
                      metric=lambda pred, batch: whole_sample_errors(pred, batch["target"]),
                      run_config=cfg, parallel="domain")
    result = trainer.fit(resume=args.resume)  # ends with the best epoch's weights loaded
    last_rel_l2 = result["history"][-1]["eval_rel_l2"]
    best_rel_l2 = evaluate(model, eval_set, device=ctx.device, forward=forward,
                           metric=lambda pred, batch: whole_sample_errors(pred, batch["target"]))

    # -- outputs: the shards put back together -------------------------------------------------
    n_plot = min(N_PLOT, len(eval_set))
    pred, batch = predict(model, eval_set, list(range(n_plot)), device=ctx.device,
                          forward=forward)
    s = cfg["resolution"]
    fields = [split.gather(t)[..., 0].reshape(n_plot, s, s)
              for t in (batch["coeff"], pred, batch["target"])]
    if ctx.is_main:
        plot_2d(f"{args.out}/prediction.png", *fields, input_label="coefficient a",
                title=f"Darcy {s}x{s}, Galerkin attention, points split over {ctx.world_size} "
                      f"process(es): evaluation rel. L2 {best_rel_l2:.3e}")
        thresholds = {"test_rel_l2": THRESHOLD[args.preset]} if args.preset in THRESHOLD else {}
        report = threshold_report({"test_rel_l2": best_rel_l2}, thresholds, enforced=enforced)
        write_metrics(args.out, result, model, ctx, cfg, best_rel_l2,
                      last_epoch_rel_l2=last_rel_l2, thresholds=report)
    cleanup_distributed(ctx)
    if ctx.is_main:
        enforce_thresholds(report)  # after the group is left: the others do not wait on us


if __name__ == "__main__":
    sys.exit(run_main(main))
