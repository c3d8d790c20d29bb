"""training/trainer.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import math
import shutil
import sys
import types

import numpy as np
import pytest
import torch
from test_training import _Linear1d, _Masked, _PointMLP, _trainer  # noqa: E402

from galerkin_ext.losses import MaskedRelativeLoss, OperatorLoss, relative_l2
from galerkin_ext.training import (
    CheckpointError,
    ConfigError,
    DistributedContext,
    NonFiniteLossError,
    TrainConfig,
    Trainer,
    evaluate,
    load_checkpoint,
    predict,
    save_checkpoint,
)
from galerkin_ext.training.trainer import per_sample_errors, relative_l2_metric


def _config(**kw):
    return TrainConfig(**{"epochs": 1, "batch_size": 4, "progress": False, **kw})


# -- argument checks ---------------------------------------------------------------------

def test_per_sample_errors_and_evaluate_refuse_a_non_module():
    with pytest.raises(TypeError, match="^model: expected a torch.nn.Module, got NoneType"):
        per_sample_errors(None, _Linear1d(4))
    with pytest.raises(TypeError, match="^model: expected a torch.nn.Module, got str"):
        evaluate("m", _Linear1d(4))


def test_predict_refuses_a_forward_that_returns_no_tensor():
    with pytest.raises(TypeError, match="forward: expected it to return the prediction tensor, "
                                        "got list"):
        predict(_PointMLP(), _Linear1d(4), [0, 1], forward=lambda m, b: [1.0])


def test_trainer_refuses_a_run_config_and_ctx_of_the_wrong_type(tmp_path):
    args = (_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(), tmp_path / "o")
    with pytest.raises(TypeError, match="^run_config: expected a dict, got list"):
        Trainer(*args, run_config=[("a", 1)])
    with pytest.raises(TypeError, match="^ctx: expected a DistributedContext, got str"):
        Trainer(*args, ctx="cpu")
    assert not (tmp_path / "o").exists()


def test_a_run_config_with_an_infinite_float_is_refused(tmp_path):
    """run_config is documented JSON-like with finite floats only: inf and -inf are refused at
    once, naming the setting, as NaN is (a check for NaN alone let inf train and be stored
    in the checkpoints with no error; JSON has no infinity, and write_json of that config
    writes the non-standard token Infinity)."""
    args = (_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(), tmp_path / "o")
    for value in (math.inf, -math.inf):
        with pytest.raises(ValueError, match=r"^run_config\['train'\]\['clip'\]: expected a "
                                             r"finite float, got -?inf"):
            Trainer(*args, run_config={"train": {"clip": value}})
    assert Trainer(*args, run_config={"train": {"clip": 1e308}}).run_config["train"]["clip"] \
        == 1e308


def test_a_run_config_holding_a_set_is_refused(tmp_path):
    """run_config holds lists, tuples and dicts, not sets: a set is refused at once, naming
    it (accepted, it trained and was stored in the checkpoints with no error, though JSON has
    no set and write_json of that config fails)."""
    args = (_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(), tmp_path / "o")
    with pytest.raises(TypeError, match=r"^run_config\['data'\]\['fields'\]: expected None, a "
                                        r"bool, int, finite float or str, or a list or dict of "
                                        r"them \(JSON-like\), got builtins\.set"):
        Trainer(*args, run_config={"data": {"fields": {"a", "u"}}})
    assert not (tmp_path / "o").exists()


def test_a_global_batch_not_divisible_by_the_processes_is_refused(tmp_path):
    ctx = DistributedContext(rank=0, world_size=2)  # no process group is needed for the check
    with pytest.raises(ConfigError, match="batch_size: the global batch 3 must be divisible by "
                                          "the 2 processes"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(batch_size=3),
                tmp_path / "o", ctx=ctx)


def test_a_context_of_several_processes_without_a_process_group_is_refused(tmp_path):
    """world_size 2 but no process group: refused by the constructor, naming ctx, not torch's
    'Default process group has not been initialized' there or at the first step."""
    with pytest.raises(ConfigError, match="ctx: rank 0 of world_size = 2, but this process has "
                                          "joined no process group"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(batch_size=2),
                tmp_path / "o", ctx=DistributedContext(rank=0, world_size=2))
    assert not (tmp_path / "o").exists()


def test_a_run_folder_removed_during_the_run_stops_it_at_the_next_checkpoint(tmp_path):
    """atomic_write made the removed folder again: the run trained on to fail at its end for
    want of the first epoch's best.pt, and could not be resumed."""
    out = tmp_path / "o"
    trainer = _trainer(out, epochs=4)
    metric, calls = trainer.metric, []

    def removing(pred, batch):  # the first epoch's evaluation ends with the folder gone
        calls.append(1)
        if len(calls) == 2:  # (1: the check before the first step)
            shutil.rmtree(out)
        return metric(pred, batch)

    trainer.metric = removing
    with pytest.raises(CheckpointError, match="out_dir: the run's folder .* was removed during "
                                              "the run"):
        trainer.fit()
    assert not out.exists()


def test_runs_of_nearby_seeds_draw_unrelated_streams(tmp_path):
    """The seed was added to the epoch (the shuffling) and to the rank (each process's
    generators): seed 1's shuffle of epoch e was seed 0's of epoch e + 1, and seed 1's rank 0
    drew seed 0's rank 1 dropout. Seed 0's shuffles and rank 0's streams are as they were."""
    from galerkin_ext.training.trainer import _process_seed, _shuffle_seed

    def orders(seed):
        trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(32), _Linear1d(4),
                          _config(batch_size=4, seed=seed), tmp_path / f"s{seed}")
        out = []
        for epoch in range(6):
            trainer.sampler.set_epoch(epoch)
            out.append(list(trainer.sampler))
        return out

    zero, one = orders(0), orders(1)
    assert all(one[e] != zero[e + 1] for e in range(5)) and zero != one
    # seed 0 shuffles as torch's sampler seeded with the seed itself did
    assert zero == [torch.randperm(32, generator=torch.Generator().manual_seed(e)).tolist()
                    for e in range(6)]
    seeds = {(s, r): _process_seed(s, r) for s in range(50) for r in range(8)}
    assert len(set(seeds.values())) == len(seeds)
    assert all(_process_seed(s, 0) == s for s in range(50))
    assert all(0 <= v < 2**63 for v in seeds.values()) and _process_seed(2**63 - 1, 7) < 2**63
    # no other rank's generators are a shuffle's (seed + rank * spread was seed rank's shuffle
    # of epoch seed)
    shuffles = {_shuffle_seed(s) + e for s in range(50) for e in range(1000)}
    assert not shuffles & {v for (s, r), v in seeds.items() if r > 0}


def test_a_checkpoint_of_the_added_seeds_resumes_with_its_shuffles(tmp_path):
    """A run begun before the seeds were spread (its last.pt has no 'seeding') shuffles on as
    it began."""
    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(16), _Linear1d(4),
                      _config(batch_size=4, seed=3, epochs=2), tmp_path / "o")
    metric, calls = trainer.metric, []

    def stopping(pred, batch):  # the second epoch's evaluation: after the first's last.pt
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return metric(pred, batch)

    trainer.metric = stopping
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    last = tmp_path / "o" / "last.pt"
    state = load_checkpoint(last, "last")
    assert state.pop("seeding") == 2
    for key in ("format", "kind"):
        state.pop(key)
    save_checkpoint(last, "last", **state)
    again = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(16), _Linear1d(4),
                    _config(batch_size=4, seed=3, epochs=2), tmp_path / "o")
    assert again.sampler.seed != 3
    again.fit(resume=True)
    assert again.sampler.seed == 3
    # and its last.pt says so, for the next resumption (it recorded the new seeding, whose
    # shuffles a second resumption then took)
    assert load_checkpoint(last, "last")["seeding"] == 1


class _Recording(_Linear1d):
    """Records the index of every sample read, in order."""

    def __init__(self, count):
        super().__init__(count)
        self.reads = []

    def __getitem__(self, i):
        self.reads.append(int(i))
        return super().__getitem__(i)


def test_each_epoch_shuffles_the_training_set_anew(tmp_path):
    """The sampler is told each epoch's number: epoch e reads the samples in seed 0's order of
    epoch e, torch's randperm seeded with e (not epoch 0's order again every epoch)."""
    train = _Recording(8)
    Trainer(_PointMLP(), OperatorLoss(), train, _Linear1d(4),
            _config(epochs=2, batch_size=4, seed=0), tmp_path).fit()
    assert train.reads == [i for e in range(2) for i in torch.randperm(
        8, generator=torch.Generator().manual_seed(e)).tolist()]


def test_a_seed_beyond_32_bits_seeds_numpy_with_both_of_its_words():
    """NumPy's legacy generator takes 32-bit words: a seed of 2**40 + 5 (any int below 2**63
    is a valid seed) seeds it with its low and high word, [5, 2**8]; the int itself is refused
    by np.random.seed, and the low word alone gave seed 5's dataset draws."""
    import random

    from galerkin_ext.training.trainer import _seed_rngs

    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()  # noqa: NPY002
    try:
        draws = {}
        for seed in (5, 2**40 + 5, 2**41 + 5):
            _seed_rngs(seed)
            draws[seed] = np.random.random_sample(4).tolist()  # noqa: NPY002
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])  # noqa: NPY002
        random.setstate(saved[2])
    assert len({tuple(d) for d in draws.values()}) == 3
    words = np.random.RandomState([5, 2**8])  # noqa: NPY002 (the legacy generator, as seeded)
    assert draws[2**40 + 5] == words.random_sample(4).tolist()


def test_the_weighted_metric_names_a_missing_grid_key():
    metric = relative_l2_metric(grid_key="coords")
    with pytest.raises(KeyError, match=r"grid_key: the batch has no 'coords' \(keys \['grid', "
                                       r"'target', 'x'\]\)"):
        metric(torch.ones(2, 16, 1), {"x": torch.ones(2, 16, 1), "grid": torch.ones(2, 16, 1),
                                      "target": torch.ones(2, 16, 1)})


def test_resume_refuses_a_checkpoint_of_another_number_of_processes(tmp_path):
    _trainer(tmp_path, epochs=1).fit()
    state = load_checkpoint(tmp_path / "last.pt", "last")
    content = {k: v for k, v in state.items() if k not in ("format", "kind", "sha256")}
    save_checkpoint(tmp_path / "last.pt", "last", **{**content, "world_size": 2,
                                                     "rng": state["rng"] * 2})
    with pytest.raises(CheckpointError, match="it was written by 2 processes, this run has 1"):
        _trainer(tmp_path, epochs=1).fit(resume=True)


def _small(out):  # (the same settings each time: a resumption compares them)
    torch.manual_seed(0)
    return Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(), out)


def test_a_staged_best_of_the_recorded_epoch_with_another_error_is_not_taken(tmp_path):
    """best.next.pt is settled into best.pt only if it is the (epoch, error) last.pt records:
    one of the same epoch with another error (another run's) is dropped, and the resumption
    keeps the recorded best.pt (taken, it made the run refuse to resume)."""
    _small(tmp_path).fit()
    best = load_checkpoint(tmp_path / "best.pt", "best")
    kept = (tmp_path / "best.pt").read_bytes()
    save_checkpoint(tmp_path / "best.next.pt", "best", epoch=best["epoch"],
                    model=best["model"], metric=best["metric"] + 0.5, config=best["config"])
    result = _small(tmp_path).fit(resume=True)
    assert (tmp_path / "best.pt").read_bytes() == kept
    assert result["best_metric"] == best["metric"]
    assert not (tmp_path / "best.next.pt").exists()


def test_a_resumption_refuses_a_best_pt_of_the_recorded_epoch_with_another_error(tmp_path):
    """best.pt must be the (epoch, error) last.pt records: a fresh run in the folder, killed
    after its first best.pt, leaves one of the same epoch 1 with its own error, which the
    resumption would have returned as this run's best model (the epoch alone matches)."""
    _small(tmp_path).fit()
    best = load_checkpoint(tmp_path / "best.pt", "best")
    save_checkpoint(tmp_path / "best.pt", "best", epoch=1, model=best["model"],
                    metric=best["metric"] + 0.5, config=best["config"])
    with pytest.raises(CheckpointError, match=r"records epoch 1 \(error .*\) as the best, "
                                              r"but .*best\.pt' holds epoch 1 \(error .*, of "
                                              r"another run"):
        _small(tmp_path).fit(resume=True)


def test_a_resumption_removes_a_staged_best_that_last_pt_does_not_record(tmp_path):
    """A kill after best.next.pt, before last.pt, leaves a staged model of an epoch last.pt
    does not record: the resumption deletes it (that epoch runs again) and keeps best.pt."""
    _small(tmp_path).fit()
    best = load_checkpoint(tmp_path / "best.pt", "best")
    kept = (tmp_path / "best.pt").read_bytes()
    save_checkpoint(tmp_path / "best.next.pt", "best", epoch=best["epoch"] + 1,
                    model=best["model"], metric=best["metric"] / 2, config=best["config"])
    _small(tmp_path).fit(resume=True)  # (nothing left to train)
    assert not (tmp_path / "best.next.pt").exists()
    assert (tmp_path / "best.pt").read_bytes() == kept


def test_a_fresh_run_removes_a_staged_best_before_its_first_epoch(tmp_path):
    """A run stopped before its first last.pt leaves its staged best.next.pt: the next run
    started afresh deletes it at once, before any epoch (not left beside the new run's files
    until an improving epoch overwrites it)."""
    _small(tmp_path).fit()
    best = load_checkpoint(tmp_path / "best.pt", "best")
    save_checkpoint(tmp_path / "best.next.pt", "best", epoch=3, model=best["model"],
                    metric=best["metric"] / 2, config=best["config"])
    fresh, calls = _small(tmp_path), []

    def stopping(pred, batch):  # the first epoch's evaluation (1: the check before training)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return torch.ones(pred.shape[0])

    fresh.metric = stopping
    with pytest.raises(KeyboardInterrupt):
        fresh.fit()
    assert not (tmp_path / "best.next.pt").exists()


def test_a_resumption_under_another_torch_says_so(tmp_path, capsys):
    """last.pt records the torch that wrote it; a resumption under another one (or of a
    checkpoint that records none) goes on, with a note that its numbers now agree with the
    uninterrupted run's to rounding only; under the same torch it says nothing. (A finished
    run, resumed: it evaluates again.)"""
    _trainer(tmp_path, epochs=1).fit()
    state = load_checkpoint(tmp_path / "last.pt", "last")
    assert state["torch_version"] == torch.__version__
    content = {k: v for k, v in state.items()
               if k not in ("format", "kind", "sha256", "torch_version")}
    for begun, said in (("2.5.1", "torch 2.5.1"), (None, "torch an unrecorded version"),
                        (state["torch_version"], None)):
        save_checkpoint(tmp_path / "last.pt", "last", **content,
                        **({} if begun is None else {"torch_version": begun}))
        capsys.readouterr()
        _trainer(tmp_path, epochs=1).fit(resume=True)
        out = capsys.readouterr().out
        assert (f"note: resuming a run of {said} under torch {torch.__version__}: from here on "
                "its numbers agree" in out) if said else "note: resuming" not in out


def test_a_non_finite_gradient_with_a_finite_loss_stops_the_run(tmp_path):
    def forward(model, batch):  # sqrt'(0) = inf: the gradient is NaN, the prediction is not
        zero = model.out.bias - model.out.bias
        return model(batch["x"], batch["grid"][0]) + 0 * torch.sqrt(zero).sum()

    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(),
                      tmp_path, forward=forward)
    with pytest.raises(NonFiniteLossError, match=r"gradient norm is nan at epoch 1, step 1.*no "
                                                 r"checkpoint of this run was written yet"):
        trainer.fit()
    assert not (tmp_path / "last.pt").exists()


def test_a_non_finite_evaluation_error_stops_the_run(tmp_path):
    calls = {"n": 0}

    def metric(pred, batch):  # finite in the check before training, NaN after the epoch
        calls["n"] += 1
        return torch.full((pred.shape[0],), math.nan if calls["n"] > 1 else 1.0)

    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(),
                      tmp_path, metric=metric)
    with pytest.raises(NonFiniteLossError, match="evaluation error is nan after epoch 1"):
        trainer.fit()
    assert not (tmp_path / "last.pt").exists()


# -- behaviour branches -----------------------------------------------------------------

def test_the_stop_names_a_nan_in_the_batch(tmp_path):
    train = _Linear1d(4)
    train.x[1, 3] = math.nan
    trainer = Trainer(_PointMLP(), OperatorLoss(), train, _Linear1d(4), _config(), tmp_path)
    with pytest.raises(NonFiniteLossError, match=r"step 1 \(the batch's 'x' holds NaN or inf\)"):
        trainer.fit()


class _WithCoeff(_Linear1d):
    def __getitem__(self, i):
        return {**super().__getitem__(i), "coeff": torch.full((16, 1), -1.0 if i == 2 else 1.0)}


def test_the_stop_names_a_negative_coefficient(tmp_path):
    def forward(model, batch):
        return model(batch["x"] * batch["coeff"].sqrt(), batch["grid"][0])

    trainer = Trainer(_PointMLP(), OperatorLoss(), _WithCoeff(4), _Linear1d(4), _config(),
                      tmp_path, forward=lambda m, b: forward(m, b) if "coeff" in b else
                      m(b["x"], b["grid"][0]))
    with pytest.raises(NonFiniteLossError, match=r"\(the batch's 'coeff' has negative values\)"):
        trainer.fit()


def test_the_stop_names_a_masked_sample_whose_valid_target_is_zero(tmp_path):
    train = _Masked(4, weights=False)
    train.target[1] = 0.0
    trainer = Trainer(_PointMLP(), MaskedRelativeLoss(), train, _Masked(4, weights=False),
                      _config(), tmp_path, metric=lambda p, b: torch.ones(p.shape[0]))
    with pytest.raises(NonFiniteLossError, match=r"sample 1 of the batch has a target that is "
                                                 r"zero everywhere"):
        trainer.fit()


def test_a_run_config_repeating_what_the_trainer_records_is_accepted(tmp_path):
    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), _config(),
                      tmp_path, run_config={"parallel": "data", "train_samples": 8,
                                            "eval_samples": 4, "note": "x"})
    trainer.fit()
    config = load_checkpoint(tmp_path / "last.pt", "last")["config"]
    assert (config["parallel"], config["train_samples"], config["eval_samples"],
            config["note"]) == ("data", 8, 4, "x")


def test_the_metric_decodes_with_a_plain_normalizer_and_unweighted_norms():
    class Affine:  # not an nn.Module: used as it is
        def decode(self, t):
            return 2.0 * t + 1.0

    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(3, 16, 2, generator=g), torch.randn(3, 16, 2, generator=g)
    got = relative_l2_metric(Affine(), weighted=False)(pred, {"target": target})
    p, t = (2.0 * pred.double() + 1.0), (2.0 * target.double() + 1.0)
    # float64 reference: per sample ||p - t|| / ||t|| over points, averaged over channels?
    ref = relative_l2(p, t, reduction="none")
    assert torch.allclose(got.double(), ref, rtol=1e-5)
    plain = relative_l2_metric(None, weighted=False)(pred, {"target": target})
    assert not torch.allclose(plain, got)  # the decoding mattered


def test_the_default_metric_of_a_padded_ragged_batch_averages_its_channels():
    """With a 'mask' the default metric is, per sample, the mean over the target's channels of
    each channel's relative L2 over the valid points (a sum, or channel 0 alone, picked the
    best epoch on another number); written out here with norms over the valid points."""
    g = torch.Generator().manual_seed(0)
    count, n = 3, 10
    target = torch.randn(count, n, 2, generator=g, dtype=torch.float64)
    noise = torch.randn(count, n, 2, generator=g, dtype=torch.float64)
    pred = target + noise * torch.tensor([0.1, 0.7], dtype=torch.float64)  # unlike channels
    valid = torch.arange(n) < torch.tensor([10, 7, 4])[:, None]
    pred[~valid] = 1e3  # padding: not counted

    class Padded(torch.utils.data.Dataset):
        def __len__(self):
            return count

        def __getitem__(self, i):
            return {"pred": pred[i], "target": target[i], "mask": valid[i]}

    errors = per_sample_errors(torch.nn.Identity(), Padded(), forward=lambda m, b: b["pred"])
    want = torch.stack([((pred[i, valid[i]] - target[i, valid[i]]).norm(dim=0)
                         / target[i, valid[i]].norm(dim=0)).mean() for i in range(count)])
    torch.testing.assert_close(errors, want, rtol=1e-12, atol=0)


def test_an_epoch_trains_on_full_batches_only(tmp_path):
    """The training loader drops the last, partial batch (the original code's drop_last): 10
    samples in batches of 4 are 2 steps of 4 per epoch, never a third step of 2."""
    sizes = []

    def loss(pred, *rest):
        sizes.append(pred.shape[0])
        return OperatorLoss()(pred, *rest)

    trainer = Trainer(_PointMLP(), loss, _Linear1d(10), _Linear1d(4),
                      _config(epochs=2, batch_size=4), tmp_path)
    assert trainer.steps_per_epoch == 2
    trainer.fit()
    assert sizes == [4] * 4


def test_weight_decay_reaches_adamw(tmp_path):
    """weight_decay > 0 trains with AdamW at that decay (not AdamW's default 0.01); 0 with
    plain Adam."""
    def optimizer(decay):
        return Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                       _config(weight_decay=decay), tmp_path / str(decay)).optimizer

    decayed = optimizer(0.05)
    assert type(decayed) is torch.optim.AdamW
    assert [group["weight_decay"] for group in decayed.param_groups] == [0.05]
    assert type(optimizer(0.0)) is torch.optim.Adam


class _FakeWriter:
    made = []

    def __init__(self, log_dir, purge_step):
        self.log_dir, self.scalars, self.flushes, self.closed = log_dir, [], 0, False
        self.purge_step = purge_step
        _FakeWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, float(value), step))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True


def test_tensorboard_logs_every_step_and_epoch(tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _FakeWriter.made.clear()
    result = _trainer(tmp_path, epochs=2, tensorboard=True).fit()
    (writer,) = _FakeWriter.made
    assert writer.log_dir == str(tmp_path / "tensorboard") and writer.closed
    assert writer.flushes == 2 and writer.purge_step is None  # (a fresh run purges nothing)
    steps = [(s, v) for tag, v, s in writer.scalars if tag == "step/loss"]
    assert [s for s, _ in steps] == list(range(1, 2 * 8 + 1))  # 32 samples / batch 4
    for row in result["history"]:  # at the epoch's last step
        logged = {tag[6:]: v for tag, v, s in writer.scalars
                  if tag.startswith("epoch/") and s == row["epoch"] * 8}
        assert "epoch" not in logged
        assert logged == pytest.approx({k: v for k, v in row.items() if k != "epoch"})


class _OddNormals(_Linear1d):
    """Adds one normal from NumPy's global generator to each sample (two for sample 0): an
    odd number per epoch, so each epoch ends with the legacy generator holding the cached
    second normal of a Box-Muller pair."""

    def __getitem__(self, i):
        item = super().__getitem__(i)
        shift = np.random.standard_normal(2 if i == 0 else 1).sum()  # noqa: NPY002
        return {**item, "x": item["x"] + float(shift)}


def test_a_resume_restores_numpys_cached_normal(tmp_path):
    """last.pt keeps NumPy's cached normal (has_gauss, gauss) with its key and position: a run
    interrupted mid-epoch and resumed from an epoch that ended with a normal cached draws the
    same normals as a run not interrupted (restoring the key alone would draw a new pair, and
    the resumed run would train on other data, with no error)."""
    base, calls = OperatorLoss(), {"n": 0}

    def interrupting(*args):
        calls["n"] += 1
        if calls["n"] == 2 + 1:  # 2 steps per epoch: mid second epoch
            raise KeyboardInterrupt
        return base(*args)

    def trainer(out, loss=None):
        torch.manual_seed(0)
        return Trainer(_PointMLP(), loss or OperatorLoss(), _OddNormals(8),
                       _Linear1d(8, seed=1), _config(epochs=2, max_lr=1e-2), out)

    first = trainer(tmp_path / "first").fit()
    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path / "cut", loss=interrupting).fit()
    np.random.seed(3)  # noqa: NPY002 (what the process did in between does not matter)
    resumed = trainer(tmp_path / "cut").fit(resume=True)
    for a, b in zip(first["history"], resumed["history"], strict=True):
        assert (a["train_loss"], a["eval_rel_l2"]) == (b["train_loss"], b["eval_rel_l2"])
