"""Trainer, checkpoints and config checks on tiny synthetic problems (fast, single process).

The end-to-end runs of the example scripts (resume after SIGKILL, torchrun) are in
test_examples.py.
"""

import copy
import errno
import json
import math
import os
import random
import signal
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset, default_collate

from galerkin_ext import models
from galerkin_ext._locks import file_lock
from galerkin_ext.losses import MaskedRelativeLoss, OperatorLoss
from galerkin_ext.training import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    ConfigError,
    DistributedContext,
    NonFiniteLossError,
    TrainConfig,
    Trainer,
    atomic_write,
    cached_data,
    check_model_grid,
    describe_grid,
    evaluate,
    experiment_parser,
    load_checkpoint,
    per_sample_errors,
    predict,
    resolve_config,
    run_main,
    save_checkpoint,
    setup_distributed,
    write_csv,
    write_json,
)


class _Linear1d(Dataset):
    """target = a fixed smoothing of x (a linear operator), on a periodic grid of n points."""

    def __init__(self, count: int, n: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(count, n, 1, generator=g)
        self.target = 0.5 * (self.x.roll(1, 1) + self.x.roll(-1, 1)) + 0.2 * self.x
        self.grid = (torch.arange(n) / n)[:, None]

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "grid": self.grid, "target": self.target[i]}


class _PointMLP(nn.Module):
    """Mixes each point with its neighbours through a conv; enough to learn the operator."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 3, padding=1, padding_mode="circular")
        self.drop = nn.Dropout(0.1)  # exercises the RNG state in resume
        self.out = nn.Conv1d(8, 1, 1)

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.tanh(self.conv(x.transpose(1, 2))))).transpose(1, 2)


def _trainer(out, epochs=4, loss=None, **cfg):
    torch.manual_seed(0)
    config = TrainConfig(epochs=epochs, batch_size=4, max_lr=1e-2, pct_start=0.3,
                         progress=False, **cfg)
    return Trainer(_PointMLP(), loss or OperatorLoss(), _Linear1d(32), _Linear1d(8, seed=1),
                   config, out, run_config={"note": "test"})


def test_fit_converges_and_writes_files(tmp_path):
    trainer = _trainer(tmp_path, epochs=6)
    start = evaluate(trainer.model, trainer.eval_set)
    result = trainer.fit()
    hist = result["history"]
    assert [r["epoch"] for r in hist] == list(range(1, 7))
    assert result["best_metric"] == min(r["eval_rel_l2"] for r in hist)
    assert result["best_metric"] < 0.5 * start
    # the model ends with the best epoch's weights
    assert evaluate(trainer.model, trainer.eval_set) == pytest.approx(result["best_metric"],
                                                                      rel=1e-6)
    # OneCycle stepped once per batch over the whole run, lr far below its peak at the end
    assert trainer.scheduler.last_epoch == trainer.scheduler.total_steps == 6 * 8
    # each row's lr is its last step's: the last one the schedule's end (it recorded the rate
    # one step past the end, which torch's cosine turns back up to)
    fresh = torch.optim.lr_scheduler.OneCycleLR(
        torch.optim.Adam([torch.zeros(1)], lr=1e-2), max_lr=1e-2, total_steps=6 * 8,
        div_factor=trainer.config.div_factor, final_div_factor=trainer.config.final_div_factor,
        pct_start=trainer.config.pct_start)
    rates = []
    for _ in range(6 * 8):
        rates.append(fresh.get_last_lr()[0])
        fresh.optimizer.step()
        fresh.step()
    assert [r["lr"] for r in hist] == pytest.approx(rates[7::8], rel=1e-12)
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    assert best["epoch"] == result["best_epoch"] and last["epoch"] == 6
    assert last["config"]["note"] == "test" and last["config"]["train"]["epochs"] == 6
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,train_loss") and len(rows) == 7
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary files left


def test_an_epochs_train_loss_is_the_mean_of_its_steps(tmp_path):
    """history's train_loss is the mean of the losses its epoch's steps took (SPEC-continuum
    §4's ReduceLROnPlateau defaults, ×0.5 and patience 2, are TrainConfig's)."""
    seen = []
    base = OperatorLoss()

    def recording(*args):
        loss, parts = base(*args)
        seen.append(float(loss.detach()))
        return loss, parts

    history = _trainer(tmp_path, epochs=2, loss=recording).fit()["history"]
    steps = len(seen) // 2
    assert steps == 8
    for epoch, row in enumerate(history):
        assert row["train_loss"] == pytest.approx(
            sum(seen[epoch * steps:(epoch + 1) * steps]) / steps, rel=1e-12)
    assert (TrainConfig().plateau_factor, TrainConfig().plateau_patience) == (0.5, 2)


def test_onecycle_starts_at_max_lr_over_div_factor_and_ends_final_div_factor_below(tmp_path):
    """The schedule starts at max_lr / div_factor and ends at that / final_div_factor (the
    other tests gave the two factors equal values, which a swap passed)."""
    trainer = _trainer(tmp_path, epochs=2, div_factor=10.0, final_div_factor=1000.0)
    rates = [trainer.scheduler.get_last_lr()[0]]
    for _ in range(trainer.scheduler.total_steps - 1):
        trainer.optimizer.step()
        trainer.scheduler.step()
        rates.append(trainer.scheduler.get_last_lr()[0])
    assert rates[0] == pytest.approx(1e-2 / 10, rel=1e-12)
    assert max(rates) == pytest.approx(1e-2, rel=1e-2)
    assert rates[-1] == pytest.approx(1e-2 / 10 / 1000, rel=1e-12)


class _ScaledLoss(nn.Module):
    """OperatorLoss times 1e4: gradients large enough for any clipping to act."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = OperatorLoss()

    def forward(self, *args):
        loss, parts = self.inner(*args)
        return 1e4 * loss, parts


@pytest.mark.parametrize("clip", [{"clip_value": 1e-3, "grad_clip": None}, {"grad_clip": 0.5},
                                  {"grad_clip": None}])
def test_a_step_clips_the_gradients_as_configured(tmp_path, clip):
    """A step's gradients are the loss's, clipped by value (each entry to [-c, c]) and then by
    norm (scaled to at most grad_clip), against an unclipped backward of the same batch."""
    trainer = _trainer(tmp_path, loss=_ScaledLoss(), **clip)
    batch = default_collate([_Linear1d(32)[i] for i in range(4)])
    plain = copy.deepcopy(trainer.model)
    torch.manual_seed(3)  # the same dropout mask in both
    loss, _ = trainer.loss_fn(plain(batch["x"], batch["grid"]), batch["target"])
    loss.backward()
    want = [p.grad for p in plain.parameters()]
    if clip.get("clip_value") is not None:
        want = [g.clamp(-clip["clip_value"], clip["clip_value"]) for g in want]
    if clip["grad_clip"] is not None:
        norm = torch.cat([g.flatten() for g in want]).norm()
        assert norm > 10 * clip["grad_clip"]  # the clipping acts
        want = [g * (clip["grad_clip"] / (norm + 1e-6)) for g in want]
    torch.manual_seed(3)
    trainer._step(trainer.model, batch, 0, 0)
    for p, g in zip(trainer.model.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-9)


def test_resume_refuses_a_best_checkpoint_of_another_run_and_repairs_metrics_csv(tmp_path):
    """A fresh run in the same folder, killed after its first best.pt, leaves that best.pt
    beside the first run's last.pt: the resumption loaded it and returned its model as the best
    epoch's. A kill after last.pt, before metrics.csv, left the CSV a row short for good."""
    _trainer(tmp_path, epochs=2).fit()
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    write_csv(tmp_path / "metrics.csv", load_checkpoint(tmp_path / "last.pt")["history"][:1])
    _trainer(tmp_path, epochs=2).fit(resume=True)  # nothing left to train
    assert (tmp_path / "metrics.csv").read_text().splitlines() == rows
    best = load_checkpoint(tmp_path / "best.pt")
    save_checkpoint(tmp_path / "best.pt", "best", epoch=1, model=best["model"],
                    metric=best["metric"] + 1.0, config=best["config"])
    with pytest.raises(CheckpointError, match=r"best.pt' holds epoch 1 .*, of another run"):
        _trainer(tmp_path, epochs=2).fit(resume=True)


def test_the_trainer_checks_what_it_is_given(tmp_path):
    config = TrainConfig(epochs=2, batch_size=4, progress=False)
    config.grad_clip = 0.0  # set after construction: checked again, not a run that never moves
    with pytest.raises(ValueError, match="grad_clip: expected a finite float > 0"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(32), _Linear1d(8), config, tmp_path / "a")
    config.grad_clip = 0.999
    for arguments, error, match in (
        ({"forward": None}, TypeError, "^forward: expected a callable"),
        ({"metric": 3}, TypeError, "^metric: expected a callable"),
        ({"run_config": {"train": {"epochs": 5}}}, ConfigError,
         r"run_config\['train'\]\['epochs'\]: 5 differs from the TrainConfig's 2"),
        ({"run_config": {"train_samples": 99}}, ConfigError,
         r"run_config\['train_samples'\]: 99 differs"),
    ):
        with pytest.raises(error, match=match):
            Trainer(_PointMLP(), OperatorLoss(), _Linear1d(32), _Linear1d(8), config,
                    tmp_path / "b", **arguments)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

        def __len__(self):
            return 4

    with pytest.raises(ValueError, match="train_set: expected a non-empty map-style"):
        Trainer(_PointMLP(), OperatorLoss(), Stream(), _Linear1d(8), config, tmp_path / "c")
    assert not list(tmp_path.iterdir())  # each refused before its folder was made
    # a setting of the user's own under 'train' is kept and compared on resume
    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(32), _Linear1d(8), config,
                      tmp_path / "d", run_config={"train": {"loss": "l2", "epochs": 2}})
    trainer.fit()
    assert load_checkpoint(tmp_path / "d" / "last.pt")["config"]["train"]["loss"] == "l2"
    with pytest.raises(CheckpointError, match=r"\['train.loss'\]"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(32), _Linear1d(8), config,
                tmp_path / "d", run_config={"train": {"loss": "h1"}}).fit(resume=True)

    def detached(pred, target, *rest):
        loss, parts = OperatorLoss()(pred, target)
        return loss.detach(), parts

    with pytest.raises(TypeError, match="loss_fn: returned a loss without gradient"):
        Trainer(_PointMLP(), detached, _Linear1d(32), _Linear1d(8), config,
                tmp_path / "e").fit()
    with pytest.raises(TypeError, match="^model: expected a torch.nn.Module"):
        predict(None, _Linear1d(8), [0])


class _SpectralMix(nn.Module):
    """A complex weight on each Fourier mode, as the spectral layers have: the smoothing of
    :class:`_Linear1d` is exactly such a multiplier."""

    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.1 * torch.randn(n // 2 + 1, dtype=torch.cfloat))

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        modes = torch.fft.rfft(x, dim=1) * self.weight[:, None]
        return torch.fft.irfft(modes, n=x.shape[1], dim=1)


def test_complex_parameters_train_and_real_ones_take_the_fused_optimizer(tmp_path):
    """The fused Adam takes real parameters only: a model with complex ones gets the plain
    implementation and trains."""
    torch.manual_seed(0)
    config = TrainConfig(epochs=3, batch_size=4, max_lr=1e-1, progress=False)
    trainer = Trainer(_SpectralMix(), OperatorLoss(), _Linear1d(32), _Linear1d(8, seed=1),
                      config, tmp_path / "complex")
    start = evaluate(trainer.model, trainer.eval_set)
    assert not trainer.optimizer.defaults["fused"]
    assert trainer.fit()["best_metric"] < 0.5 * start
    assert _trainer(tmp_path / "real", epochs=1).optimizer.defaults["fused"]


def test_resume_is_exact(tmp_path):
    full = _trainer(tmp_path / "full").fit()
    # stop after two epochs by training a 2-epoch prefix: same schedule needs the same config,
    # so interrupt with an exception from the loss instead
    calls = {"n": 0}
    base = OperatorLoss()

    def interrupting(*args):
        calls["n"] += 1
        if calls["n"] == 8 * 2 + 3:  # 8 steps per epoch: mid third epoch
            raise KeyboardInterrupt
        return base(*args)

    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path / "cut", loss=interrupting).fit()
    assert load_checkpoint(tmp_path / "cut" / "last.pt")["epoch"] == 2
    resumed = _trainer(tmp_path / "cut").fit(resume=True)
    # train_seconds (metrics.json's, the README's timings) sums every epoch, over both sessions
    for result in (full, resumed):
        assert result["train_seconds"] == pytest.approx(
            sum(row["seconds"] for row in result["history"]), rel=1e-12)
    for a, b in zip(full["history"], resumed["history"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6, abs=0)
        assert a["eval_rel_l2"] == pytest.approx(b["eval_rel_l2"], rel=1e-6, abs=0)
    assert resumed["best_metric"] == pytest.approx(full["best_metric"], rel=1e-6)
    # a resumption that would change the model, the data or the schedule is refused, before
    # anything is written; settings that do not change the numbers may change
    last = (tmp_path / "cut" / "last.pt").read_bytes()
    config = {"epochs": 4, "batch_size": 4, "max_lr": 1e-2, "pct_start": 0.3, "progress": False}
    refused = [
        ({"max_lr": 5e-3}, _Linear1d(32), {"note": "test"}, r"\['train.max_lr'\]"),
        ({}, _Linear1d(24), {"note": "test"}, r"\['train_samples'\].*there \{'train_samples': 32"),
        ({}, _Linear1d(32), {"note": "other"}, r"\['note'\]"),
        ({}, _Linear1d(32), {"note": "test", "model": {"d": 3}}, r"\['model.d'\]"),
        ({"parallel": "domain"}, _Linear1d(32), {"note": "test"}, r"\['parallel'\]"),
    ]
    for changes, train_set, run_config, match in refused:
        parallel = changes.pop("parallel", "data")
        trainer = Trainer(_PointMLP(), OperatorLoss(), train_set, _Linear1d(8, seed=1),
                          TrainConfig(**{**config, **changes}), tmp_path / "cut",
                          run_config=run_config, parallel=parallel)
        with pytest.raises(CheckpointError, match=match):
            trainer.fit(resume=True)
        assert (tmp_path / "cut" / "last.pt").read_bytes() == last
    again = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(32), _Linear1d(8, seed=1),
                    TrainConfig(**config, eval_batch_size=3), tmp_path / "cut",
                    run_config={"note": "test", "threads": 2}).fit(resume=True)
    assert again["best_metric"] == pytest.approx(full["best_metric"], rel=1e-6)


@pytest.mark.parametrize("kill", ["before last.pt", "before best.pt"])
def test_a_kill_between_the_best_and_the_last_checkpoint_resumes(tmp_path, monkeypatch, kill):
    """best.pt was written before last.pt: a kill between the two left best.pt an epoch ahead
    of last.pt, and the resumption refused it as "of another run". The new best is staged
    (best.next.pt) until last.pt records it; a resumption settles it either way."""
    import galerkin_ext.training.trainer as trainer_module

    full = _trainer(tmp_path / "full").fit()
    improving = [row["epoch"] for row in full["history"][1:]
                 if row["eval_rel_l2"] < min(r["eval_rel_l2"] for r in full["history"]
                                             if r["epoch"] < row["epoch"])]
    epoch = improving[0]  # an epoch after the first that writes a new best model
    save, replace = trainer_module.save_checkpoint, os.replace

    def save_then_die(path, kind, **state):
        if kill == "before last.pt" and kind == "last" and state["epoch"] == epoch:
            raise KeyboardInterrupt  # (best.next.pt of this epoch is written)
        return save(path, kind, **state)

    def replace_then_die(src, dst):
        if kill == "before best.pt" and Path(src).name == "best.next.pt":
            raise KeyboardInterrupt  # (last.pt of this epoch is written)
        return replace(src, dst)

    monkeypatch.setattr(trainer_module, "save_checkpoint", save_then_die)
    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path / "cut").fit()
    monkeypatch.undo()
    assert (tmp_path / "cut" / "best.next.pt").is_file()
    resumed = _trainer(tmp_path / "cut").fit(resume=True)
    for a, b in zip(full["history"], resumed["history"], strict=True):
        assert (a["train_loss"], a["eval_rel_l2"]) == (b["train_loss"], b["eval_rel_l2"])
    best = load_checkpoint(tmp_path / "cut" / "best.pt", "best")
    assert (best["epoch"], best["metric"]) == (full["best_epoch"], full["best_metric"])
    assert not (tmp_path / "cut" / "best.next.pt").exists()


def test_non_finite_loss_stops_and_keeps_checkpoint(tmp_path):
    calls = {"n": 0}
    base = OperatorLoss()

    def exploding(pred, *rest):
        calls["n"] += 1
        loss, parts = base(pred, *rest)
        return (loss * math.nan if calls["n"] > 8 + 2 else loss), parts

    trainer = _trainer(tmp_path, loss=exploding)
    with pytest.raises(NonFiniteLossError, match=r"epoch 2, step 3.*last\.pt.* is kept"):
        trainer.fit()
    state = load_checkpoint(tmp_path / "last.pt", "last")
    assert state["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    # a fresh run stopped before its first epoch ends: the last.pt there is the older run's
    calls["n"] = 100
    with pytest.raises(NonFiniteLossError, match="no checkpoint of this run was written yet"):
        _trainer(tmp_path, loss=exploding).fit()


def test_a_stop_on_the_loss_names_a_sample_without_a_relative_error(tmp_path):
    """A target that is zero everywhere has no relative error (x/0): the stop says which
    sample of the batch it is, not only "try a lower max_lr"."""
    train = _Linear1d(32)
    train.target[2] = 0.0  # the one batch holds every sample
    torch.manual_seed(0)
    trainer = Trainer(_PointMLP(), OperatorLoss(), train, _Linear1d(8, seed=1),
                      TrainConfig(epochs=1, batch_size=32, progress=False), tmp_path)
    with pytest.raises(NonFiniteLossError, match=r"epoch 1, step 1 \(sample \d+ of the batch "
                                                 r"has a target that is zero everywhere"):
        trainer.fit()


def test_run_main_says_which_process_a_line_comes_from(monkeypatch, capsys):
    """One line per refusal; under torchrun, where every process prints its own, with the
    rank."""
    def refused():
        raise ConfigError("batch_size: 3 does not split over 2 processes")

    assert run_main(refused) == 1
    assert capsys.readouterr().err == "error: batch_size: 3 does not split over 2 processes\n"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_main(refused) == 1
    assert capsys.readouterr().err.startswith("error (rank 1 of 2): batch_size: 3")

    def missing():
        raise FileNotFoundError("path: no such file 'eval.h5'")

    assert run_main(missing) == 1
    assert capsys.readouterr().err == "error (rank 1 of 2): path: no such file 'eval.h5'\n"

    def read_only():  # a folder made read-only mid-run: a traceback before
        raise OSError(30, "Read-only file system", "runs/x/.best.pt.ab12.tmp")

    assert run_main(read_only) == 1
    assert capsys.readouterr().err == ("error (rank 1 of 2): [Errno 30] Read-only file "
                                       "system: 'runs/x/.best.pt.ab12.tmp'\n")


def test_corrupt_checkpoint_gives_clear_error(tmp_path):
    trainer = _trainer(tmp_path, epochs=1)
    trainer.fit()
    data = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(tmp_path / "last.pt")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        _trainer(tmp_path, epochs=1).fit(resume=True)
    # (torch's message for these advised loading them unsafely, weights_only=False)
    (tmp_path / "other.pt").write_bytes(b"not a checkpoint at all")
    (tmp_path / "metrics.json").write_text('{"a": 1}')
    for name in ("other.pt", "metrics.json"):
        with pytest.raises(CheckpointError, match=r"not a galerkin_ext training checkpoint: a "
                                                  r"safe load \(torch.load\(weights_only=True\)\) "
                                                  r"refuses its content$"):
            load_checkpoint(tmp_path / name)
    torch.save({"model": {}}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not a galerkin_ext training checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="'best' checkpoint, expected 'last'"):
        load_checkpoint(tmp_path / "best.pt", "last")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "empty.pt").write_bytes(b"")  # torch's error has no text: its type is said
    with pytest.raises(CheckpointError, match=r"corrupt or truncated\?\): \w+"):
        load_checkpoint(tmp_path / "empty.pt")
    if not torch.cuda.is_available():  # a machine without the device, not a corrupt file
        with pytest.raises(ValueError, match="map_location: 'cuda', but CUDA is not available"):
            load_checkpoint(tmp_path / "best.pt", map_location="cuda")


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "m.json"
    write_json(path, {"a": 1})

    def failing(f):
        f.write(b"{partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, failing)
    assert path.read_text().strip().replace(" ", "").replace("\n", "") == '{"a":1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
    write_csv(tmp_path / "c.csv", [{"a": 1}, {"a": 2, "b": 3}])
    assert (tmp_path / "c.csv").read_text() == "a,b\n1,\n2,3\n"
    with pytest.raises(ValueError, match="needs"):
        save_checkpoint(tmp_path / "x.pt", "best", epoch=1)
    # named: the rename's error named the temporary file, json's no place in the data
    with pytest.raises(IsADirectoryError, match="path: expected a file name, got the folder"):
        write_json(tmp_path, {"a": 1})
    with pytest.raises(TypeError, match=r"^data\['a'\]\[1\]\['b'\]: Object of type int64"):
        write_json(tmp_path / "n.json", {"a": [1, {"b": np.int64(2)}]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv", "m.json"]


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs POSIX file-size limits")
def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path):
    """A checkpoint that does not fit (here a file-size limit, EFBIG; a full disk or a quota
    alike) raises an OSError with its errno naming the file, which keeps its last content.
    torch.save's own writer had turned it into "unexpected pos 1088 vs 982"."""
    path = tmp_path / "last.pt"
    code = f"""
import resource, signal, torch
from galerkin_ext.training.checkpoint import save_checkpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
def save(n):
    save_checkpoint({str(path)!r}, "best", epoch=n, model={{"w": torch.ones(n)}}, config={{}},
                    metric=1.0)
save(10)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
save(100_000)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # not the source folder, whatever runs it
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    assert message == (f"OSError: [Errno {errno.EFBIG}] File too large while writing "
                       f"{str(path)!r}, which is left as it was"), proc.stderr[-2000:]
    assert load_checkpoint(path, "best")["model"]["w"].shape == (10,)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left


@pytest.mark.parametrize("failing", ["mkstemp", "replace"])
def test_a_folder_not_writable_names_the_file_not_the_temporary_one(tmp_path, monkeypatch,
                                                                    failing):
    """Permission errors named atomic_write's temporary file ('.best.next.pt.52n0p9c4.tmp')."""
    import os
    import tempfile

    from galerkin_ext.training.checkpoint import atomic_write

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".a.x.tmp"))

    monkeypatch.setattr(tempfile if failing == "mkstemp" else os, failing, refused)
    path = tmp_path / "a.json"
    with pytest.raises(PermissionError, match=rf"^\[Errno {errno.EACCES}\] Permission denied "
                                              rf"while writing '.*a\.json', which is left as it "
                                              rf"was$"):
        atomic_write(path, lambda f: f.write(b"{}"))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    # the writer's own errors pass as they are (a subclass of the caller's, say)

    class StoreError(OSError):
        pass

    def failing(f):
        raise StoreError(errno.EIO, "remote store failed")

    with pytest.raises(StoreError, match=r"^\[Errno 5\] remote store failed$"):
        atomic_write(path, failing)
    assert list(tmp_path.iterdir()) == []


def test_plots_check_their_fields(tmp_path):
    from galerkin_ext.training import plot_1d, plot_2d, plot_mesh

    grid = torch.linspace(0, 1, 6)
    with pytest.raises(ValueError, match=r"pred, target: expected tensors of one shape .* S >= 1"):
        plot_1d(tmp_path / "a.png", grid, torch.zeros(0, 6, 1), torch.zeros(0, 6, 1))
    with pytest.raises(TypeError, match=r"pred, target: expected tensors, got \['list'"):
        plot_1d(tmp_path / "a.png", grid, [[0.0]], [[0.0]])
    with pytest.raises(TypeError, match="inputs: expected tensors"):
        plot_2d(tmp_path / "a.png", np.zeros((1, 4, 4)), torch.zeros(1, 4, 4), torch.zeros(1, 4, 4))
    points, none = [torch.rand(6, 2)], [None]
    for pred, match in ((torch.rand(7), r"pred\[0\], target\[0\]: expected \(6,\)"),
                        (torch.rand(6, 2), r"pred\[0\], target\[0\]: expected \(6,\)")):
        with pytest.raises(ValueError, match=match):
            plot_mesh(tmp_path / "m.png", points, none, [pred], [pred])
    with pytest.raises(ValueError, match=r"points\[0\], triangles\[0\]: expected \(N, 2\)"):
        plot_mesh(tmp_path / "m.png", points, [torch.zeros(2, 2, dtype=torch.long)],
                  [torch.rand(6)], [torch.rand(6)])
    with pytest.raises(ValueError, match="expected one entry per sample each"):
        plot_mesh(tmp_path / "m.png", torch.rand(1, 6, 2), none, [torch.rand(6)], [torch.rand(6)])
    assert not list(tmp_path.iterdir())


def test_plots_take_any_float_tensors_without_warnings(tmp_path):
    """Fields that require grad or are bfloat16 are plotted, and no tensor reaches matplotlib:
    numpy 2 warned ("__array__ implementation doesn't accept a copy keyword") for each one."""
    from galerkin_ext.training import plot_1d, plot_2d, plot_mesh

    g = torch.Generator().manual_seed(0)
    pred = torch.rand(2, 6, 2, generator=g, requires_grad=True)
    target = torch.rand(2, 6, 2, generator=g).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_1d(tmp_path / "a.png", torch.linspace(0, 1, 6), pred, target)
        plot_2d(tmp_path / "b.png", torch.rand(1, 5, 5, generator=g),
                torch.rand(1, 6, 6, generator=g, requires_grad=True),
                torch.rand(1, 6, 6, generator=g).bfloat16())
        plot_mesh(tmp_path / "c.png", [torch.rand(4, 2, generator=g)],
                  [torch.tensor([[0, 1, 2], [1, 2, 3]])], [pred[0, :4, 0]],
                  [target[0, :4, 0]])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png", "c.png"]


def test_compiled_training_matches_plain_and_resumes_either_way(tmp_path):
    """TrainConfig.compile: the plain run's history to round-off (inductor drawing dropout masks
    as eager does), checkpoints of the plain module's weights, and a resumption may switch it
    (it changes no model, data or schedule)."""
    torch._dynamo.reset()
    plain = _trainer(tmp_path / "plain", epochs=2).fit()
    compiled = _trainer(tmp_path / "compiled", epochs=2, compile=True).fit()
    torch._dynamo.reset()
    for a, b in zip(plain["history"], compiled["history"], strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["eval_rel_l2"] == pytest.approx(a["eval_rel_l2"], rel=1e-4)
    last = load_checkpoint(tmp_path / "compiled" / "last.pt", "last")
    assert last["config"]["train"]["compile"] is True
    assert set(last["model"]) == set(_PointMLP().state_dict())  # no "_orig_mod." prefix
    resumed = _trainer(tmp_path / "compiled", epochs=2).fit(resume=True)  # accepted
    assert resumed["history"] == compiled["history"]

    class MSE(nn.Module):  # a user's loss without the logged relative error
        def forward(self, pred, target, *args):
            loss = (pred - target).square().mean()
            return loss, {"mse": loss.detach()}

    with pytest.raises(TypeError, match="loss_fn: expected .* holding at least 'rel_l2'"):
        _trainer(tmp_path / "mse", epochs=1, loss=MSE()).fit()

    class L2Only(MSE):  # a loss with no H¹ part: no train_rel_h1 is recorded, not a false 0
        def forward(self, pred, target, *args):
            loss, _ = super().forward(pred, target)
            return loss, {"rel_l2": loss.detach().sqrt()}

    history = _trainer(tmp_path / "l2", epochs=1, loss=L2Only()).fit()["history"]
    assert "train_rel_h1" not in history[0] and history[0]["train_rel_l2"] > 0
    assert "train_rel_h1" not in (tmp_path / "l2" / "metrics.csv").read_text()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epochs": 0}, "epochs"),
        ({"compile": "yes"}, "compile"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"max_lr": -1.0}, "max_lr"),
        ({"pct_start": 1.5}, "pct_start"),
        ({"grad_clip": math.inf}, "grad_clip"),
        ({"precision": "fp16"}, "precision"),
        ({"progress": 1}, "progress"),
        ({"scheduler": "cosine"}, "scheduler"),
        ({"plateau_factor": 1.5}, "plateau_factor"),
        ({"early_stopping": 0}, "early_stopping"),
        ({"clip_value": -1.0}, "clip_value"),
        ({"pct_start": 1.0}, "pct_start"),  # OneCycleLR divided by 0 at the last step
        ({"plateau_factor": 1.0}, "plateau_factor"),  # ReduceLROnPlateau needs < 1
        ({"seed": 2**64}, r"seed: expected an int >= 0 and < 2\*\*63"),  # overflowed in fit
        ({"seed": 2**63}, "seed"),
    ],
)
def test_train_config_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TrainConfig(**kwargs)


def test_trainer_argument_errors(tmp_path):
    ok = {"config": TrainConfig(epochs=1, batch_size=4, progress=False), "out_dir": tmp_path}
    with pytest.raises(ValueError, match="bf16"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                TrainConfig(precision="bf16"), tmp_path)
    with pytest.raises(ValueError, match="fewer than one batch"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(3), _Linear1d(4), **ok)
    with pytest.raises(TypeError, match="model"):
        Trainer("model", OperatorLoss(), _Linear1d(8), _Linear1d(4), **ok)
    with pytest.raises(TypeError, match="config"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), {"epochs": 1}, tmp_path)
    with pytest.raises(ValueError, match="eval_set"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), [], **ok)
    with pytest.raises(ValueError, match=r"parallel: expected one of \['data', 'domain'\]"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), **ok, parallel="model")
    # a model whose attention would attend within each process's points only trained to the
    # end without a word (refused before any collective: no process group needed here)
    with pytest.raises(ConfigError, match="parallel='domain' needs a model prepared with"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), **ok, parallel="domain",
                ctx=DistributedContext(rank=0, world_size=2))
    # the default metric scored each process's own points: errors differing between the
    # processes, whose early stopping then parted ways until a collective timed out
    prepared = _PointMLP()
    prepared.domain_parallel = True
    with pytest.raises(ConfigError, match="metric: parallel='domain' gives each process"):
        Trainer(prepared, OperatorLoss(), _Linear1d(8), _Linear1d(4), **ok, parallel="domain",
                ctx=DistributedContext(rank=0, world_size=2))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for out_dir in (blocker, blocker / "sub"):  # found at construction, not after an epoch
        # (a ConfigError, which the scripts end with in one line, where a place their early
        # check let through, e.g. /proc/foo for root, failed with a traceback)
        with pytest.raises(ConfigError, match="out_dir: cannot write to"):
            Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                    **{**ok, "out_dir": out_dir})
    with pytest.raises(TypeError, match="out_dir: expected a path"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), **{**ok, "out_dir": 3})


def test_experiment_flags_reach_the_model_config():
    presets = {"p": {"data": {}, "n_train": 4, "n_eval": 2, "model": {"attention_type": "fourier"},
                     "train": {"epochs": 1}}}
    parser = experiment_parser("doc", presets)
    plain = resolve_config(presets, parser.parse_args(["--out", "o"]), experiment="test")
    # without the flags, the preset's settings (here: build_model's default norm)
    assert plain["model"] == {"attention_type": "fourier"}
    cfg = resolve_config(presets, parser.parse_args(
        ["--out", "o", "--reference-dropout", "--attention", "galerkin", "--norm", "layer"]),
        experiment="test")
    assert cfg["model"] == {"attention_type": "galerkin", "norm": "layer",
                            "reference_dropout": True}
    assert presets["p"]["model"] == {"attention_type": "fourier"}  # the preset is not changed


def test_written_files_respect_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        for path in (write_json(tmp_path / "m.json", {"a": 1}),
                     save_checkpoint(tmp_path / "b.pt", "best", epoch=1, model={}, config={},
                                     metric=1.0)):
            assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
        os.umask(0o002)
        assert stat.S_IMODE(write_csv(tmp_path / "c.csv", [{"a": 1}]).stat().st_mode) == 0o664
    finally:
        os.umask(old)


def test_resume_removes_stray_temporary_files(tmp_path):
    _trainer(tmp_path, epochs=2).fit()
    # what a SIGKILL between creating and renaming a temporary file leaves behind
    strays = [tmp_path / ".metrics.csv.abc123.tmp", tmp_path / ".last.pt.x9.tmp"]
    for stray in strays:
        stray.write_bytes(b"partial")
    keep = tmp_path / ".notes.txt.tmp"  # not one of the trainer's files
    keep.write_bytes(b"mine")
    _trainer(tmp_path, epochs=2).fit(resume=True)
    assert not any(stray.exists() for stray in strays) and keep.exists()


def test_a_gpu_checkpoint_kept_on_its_device_names_map_location(tmp_path, monkeypatch):
    """map_location=None on a machine without CUDA called a GPU-saved checkpoint corrupt."""
    path = save_checkpoint(tmp_path / "b.pt", "best", epoch=1, model={}, config={}, metric=1.0)

    def load_on_a_cpu_machine(*args, **kwargs):  # torch.load's words for a CUDA-saved file
        raise RuntimeError("Attempting to deserialize object on a CUDA device but "
                           "torch.cuda.is_available() is False.")

    monkeypatch.setattr(torch, "load", load_on_a_cpu_machine)
    with pytest.raises(ValueError, match="map_location: None keeps the checkpoint's CUDA"):
        load_checkpoint(path, map_location=None)


def test_predict_keeps_a_float64_models_precision():
    """predict cast every prediction to float32 (5e-8 off for a float64 model)."""
    model, data = _PointMLP().double(), _Linear1d(8)
    data.x, data.target, data.grid = data.x.double(), data.target.double(), data.grid.double()
    pred, _ = predict(model, data, [0, 1])
    assert pred.dtype == torch.float64
    # numpy's integers are indices like Python's (they were refused)
    again, _ = predict(model, data, list(np.arange(2)))
    torch.testing.assert_close(again, pred, rtol=0, atol=0)


def test_checkpoint_checksum_finds_a_flipped_bit(tmp_path):
    """torch.load reads a checkpoint with a flipped bit in a tensor without complaint; the
    stored content digest does not let it through."""
    weight = torch.full((64,), 1.2345)
    path = save_checkpoint(tmp_path / "b.pt", "best", epoch=1, model={"w": weight},
                           config={}, metric=1.0)
    assert torch.equal(load_checkpoint(path)["model"]["w"], weight)
    data = bytearray(path.read_bytes())
    at = data.find(weight[:4].numpy().tobytes())
    assert at > 0
    data[at + 5] ^= 0x01
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["model"]["w"][1] != weight[1]  # loads silently
    with pytest.raises(CheckpointError, match="b.pt' is corrupt: its content does not match"):
        load_checkpoint(path)
    # a checkpoint without a digest (older versions) loads, with a warning
    state = {"format": CHECKPOINT_FORMAT, "kind": "best", "epoch": 1, "model": {},
             "config": {}, "metric": 1.0}
    torch.save(state, tmp_path / "old.pt")
    with pytest.warns(UserWarning, match="no checksum"):
        assert load_checkpoint(tmp_path / "old.pt")["epoch"] == 1


def test_a_checkpoint_holding_sets_loads_back(tmp_path):
    """A set's iteration order may change through pickling (strings hash differently in another
    process); the digest takes its items in a fixed order, so its own checkpoint is not called
    corrupt."""
    extra = {"names": {f"s{i}" for i in range(40)}, "sizes": {3, 1, 2}}
    path = save_checkpoint(tmp_path / "s.pt", "best", epoch=1, model={}, config={"a": 1},
                           metric=0.1, extra=extra)
    assert load_checkpoint(path)["extra"] == extra
    script = ("import sys; from galerkin_ext.training import load_checkpoint; "
              "print(sorted(load_checkpoint(sys.argv[1])['extra']['names'])[:2])")
    for seed in ("1", "2"):  # other string hashes, other set orders
        out = subprocess.run([sys.executable, "-c", script, str(path)], cwd=tmp_path,
                             env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True,
                             text=True, check=True)
        assert out.stdout.strip() == "['s0', 's1']"


def test_plateau_schedule_early_stopping_and_value_clipping(tmp_path):
    """The continuum-attention protocol: ReduceLROnPlateau on the evaluation error (stepped per
    epoch), early stopping, clipping by value; a resumption continues the same schedule."""
    cfg = {"scheduler": "plateau", "plateau_patience": 0, "plateau_factor": 0.5,
           "clip_value": 10.0, "grad_clip": None}
    result = _trainer(tmp_path / "p", epochs=5, **cfg).fit()
    hist = result["history"]
    assert hist[0]["lr"] == hist[1]["lr"] == 1e-2  # the first epoch sets the reference
    for prev, row in zip(hist[1:], hist[2:], strict=False):
        # halved after every epoch without improvement (torch's relative threshold 1e-4);
        # each row holds the rate its epoch trained with
        best = min(r["eval_rel_l2"] for r in hist[: prev["epoch"] - 1])
        improved = prev["eval_rel_l2"] < best * (1 - 1e-4)
        assert row["lr"] == pytest.approx(prev["lr"] * (1.0 if improved else 0.5))
    # early stopping: a constant evaluation error never improves after the first epoch
    calls = {"n": 0}

    def flat_metric(pred, batch):
        calls["n"] += 1
        return torch.ones(pred.shape[0])

    trainer = _trainer(tmp_path / "e", epochs=10, early_stopping=2)
    trainer.metric = flat_metric
    result = trainer.fit()
    assert result["epochs"] == 3 and result["stopped_early"] and result["best_epoch"] == 1
    assert len(result["history"]) == 3
    again = _trainer(tmp_path / "e", epochs=10, early_stopping=2)
    again.metric = flat_metric
    assert again.fit(resume=True)["epochs"] == 3  # a resumed run stays stopped
    # a constant evaluation error: the rate is halved each time `patience` epochs after the
    # best have passed without improvement (the run above improved every epoch, which a wrong
    # patience or factor passed), counted here epoch by epoch
    for patience in (0, 2):
        flat = _trainer(tmp_path / f"flat{patience}", epochs=8, scheduler="plateau",
                        plateau_patience=patience, plateau_factor=0.5)
        flat.metric = flat_metric
        want, rate, bad = [], 1e-2, 0
        for epoch in range(8):
            want.append(rate)  # each row holds the rate its epoch trained with
            bad += epoch > 0
            if bad > patience:
                rate, bad = rate / 2, 0
        assert [row["lr"] for row in flat.fit()["history"]] == pytest.approx(want, rel=1e-12)


class _NumpyNoise(_Linear1d):
    """Draws per sample from NumPy's global generator and Python's random, as a user's data
    augmentation may."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(i)
        noise = np.random.normal(size=item["x"].shape) * (1 + random.random())  # noqa: NPY002
        return {**item, "x": item["x"] + torch.as_tensor(noise, dtype=item["x"].dtype)}


def test_numpy_and_python_draws_of_a_dataset_repeat_and_resume_exactly(tmp_path):
    """The seed covers NumPy's and Python's generators, and last.pt keeps their states: two
    fresh runs, and a run interrupted mid-epoch and resumed, give the same bits (torch's
    generator alone was seeded and saved: each run differed)."""

    def trainer(out, loss=None):
        torch.manual_seed(0)
        config = TrainConfig(epochs=3, batch_size=4, max_lr=1e-2, progress=False)
        return Trainer(_PointMLP(), loss or OperatorLoss(), _NumpyNoise(16),
                       _Linear1d(8, seed=1), config, out)

    np.random.seed(1)  # noqa: NPY002
    random.seed(1)
    first = trainer(tmp_path / "first").fit()
    np.random.seed(2)  # noqa: NPY002
    random.seed(2)
    second = trainer(tmp_path / "second").fit()
    for a, b in zip(first["history"], second["history"], strict=True):
        assert (a["train_loss"], a["eval_rel_l2"]) == (b["train_loss"], b["eval_rel_l2"])
    calls = {"n": 0}
    base = OperatorLoss()

    def interrupting(*args):
        calls["n"] += 1
        if calls["n"] == 4 + 2:  # 4 steps per epoch: mid second epoch
            raise KeyboardInterrupt
        return base(*args)

    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path / "cut", loss=interrupting).fit()
    np.random.seed(3)  # noqa: NPY002 (what the process did in between does not matter)
    random.seed(3)
    resumed = trainer(tmp_path / "cut").fit(resume=True)
    for a, b in zip(first["history"], resumed["history"], strict=True):
        assert (a["train_loss"], a["eval_rel_l2"]) == (b["train_loss"], b["eval_rel_l2"])
    want = load_checkpoint(tmp_path / "first" / "last.pt", "last")["model"]
    got = load_checkpoint(tmp_path / "cut" / "last.pt", "last")["model"]
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_old_checkpoints_resume_with_the_new_fields_at_their_defaults(tmp_path):
    _trainer(tmp_path, epochs=2).fit()
    state = load_checkpoint(tmp_path / "last.pt", "last")
    for key in ("scheduler", "plateau_factor", "plateau_patience", "early_stopping",
                "clip_value"):
        del state["config"]["train"][key]  # as written before these fields existed
    for rng in state["rng"]:  # nor did they keep NumPy's and Python's generators
        for key in ("numpy", "numpy_gauss", "python", "python_gauss"):
            del rng[key]
    save_checkpoint(tmp_path / "last.pt", **state)
    assert _trainer(tmp_path, epochs=2).fit(resume=True)["epochs"] == 2


def test_per_sample_errors_and_the_weighted_metric():
    from galerkin_ext.data import UnitGaussianNormalizer
    from galerkin_ext.losses import relative_l2
    from galerkin_ext.quadrature import trapezoid_weights
    from galerkin_ext.training import per_sample_errors, relative_l2_metric

    data = _Linear1d(10)
    data.grid = torch.sort(torch.rand(16, 1, generator=torch.Generator().manual_seed(1)),
                           dim=0).values  # a non-uniform grid
    model = _PointMLP()
    errors = per_sample_errors(model, data, batch_size=3)
    assert errors.shape == (10,) and errors.dtype == torch.float64
    with torch.no_grad():
        model.eval()
        pred = model(data.x, data.grid)
    torch.testing.assert_close(errors, relative_l2(pred, data.target, "none").double())
    assert evaluate(model, data, batch_size=4) == pytest.approx(float(errors.mean()))
    # physical units and the grid's trapezoid weights
    norm = UnitGaussianNormalizer(torch.randn(50, 1) * 3 + 2)
    weighted = per_sample_errors(model, data, metric=relative_l2_metric(norm))
    w = trapezoid_weights(data.grid[:, 0].double())
    expected = relative_l2(norm.decode(pred).double(), norm.decode(data.target).double(),
                           "none", weight=w)
    torch.testing.assert_close(weighted, expected, rtol=1e-5, atol=1e-7)
    with pytest.raises(TypeError, match="normalizer"):
        relative_l2_metric("norm")


def test_thresholds_and_preset_identity(capsys):
    from galerkin_ext.training import (
        ThresholdError,
        enforce_thresholds,
        preset_unchanged,
        threshold_report,
    )

    presets = {"quick": {"threads": 1, "data": {"dt": 0.02}, "n_train": 8, "n_valid": 2,
                         "n_eval": 4, "zero_shot": {"dt": [0.01, 0.02]}, "model": {},
                         "train": {"epochs": 3}}}
    parser = experiment_parser("doc", presets, attention_flags=False)
    parser.add_argument("--n-valid", type=int, default=None)
    assert not any("--attention" in a.option_strings for a in parser._actions)
    args = parser.parse_args(["--out", "o"])
    cfg = resolve_config(presets, args, experiment="test")
    assert cfg["data"]["n_samples"] == 14 and "norm" not in cfg["model"]
    assert preset_unchanged(cfg, presets["quick"], args)
    other = parser.parse_args(["--out", "o", "--threads", "2", "--no-progress"])
    assert preset_unchanged(resolve_config(presets, other, experiment="test"), presets["quick"],
                            other)
    for flags in (["--epochs", "4"], ["--n-valid", "3"]):
        other = parser.parse_args(["--out", "o", *flags])
        changed = resolve_config(presets, other, experiment="test")
        assert not preset_unchanged(changed, presets["quick"], other), flags
    # the preset's numbers hold for its own data (heat and elasticity ignored --eval-data)
    for flags in (["--data", "d.h5"], ["--eval-data", "e.h5"]):
        other = parser.parse_args(["--out", "o", *flags])
        assert not preset_unchanged(resolve_config(presets, other, experiment="test"),
                                    presets["quick"], other), flags
    cfg["zero_shot"]["dt"] = [0.01]
    assert not preset_unchanged(cfg, presets["quick"], args)
    report = threshold_report({"a": 0.1, "b": 0.3}, {"a": 0.2, "b": 0.2}, enforced=True)
    assert report["checks"]["a"]["met"] and not report["checks"]["b"]["met"]
    assert "MISSED" in capsys.readouterr().out
    with pytest.raises(ThresholdError, match=r"b = 3\.0000e-01 > 2\.0000e-01"):
        enforce_thresholds(report)
    enforce_thresholds(threshold_report({"b": 0.3}, {"b": 0.2}, enforced=False))  # no raise
    with pytest.raises(ValueError, match="no value for the thresholds"):
        threshold_report({}, {"a": 1.0}, enforced=True)
    # named, not float()'s own message
    for values, thresholds, name in (({"a": "x"}, {"a": 0.2}, "values\\['a'\\]"),
                                     ({"a": None}, {"a": 0.2}, "values\\['a'\\]"),
                                     ({"a": 0.1}, {"a": True}, "thresholds\\['a'\\]")):
        with pytest.raises(TypeError, match=f"^{name}: expected a number"):
            threshold_report(values, thresholds, enforced=True)
    assert not threshold_report({"a": np.float32("nan")}, {"a": 1}, enforced=False)[
        "checks"]["a"]["met"]
    for report in ({"checks": {"a": {}}, "enforced": True}, {"checks": {}}):
        with pytest.raises(TypeError, match="report: expected the dict returned by"):
            enforce_thresholds(report)


def test_evaluate_predict_and_tensorboard_arguments(tmp_path, monkeypatch):
    model, data = _PointMLP(), _Linear1d(8)
    with pytest.raises(ValueError, match="device: expected e.g. 'cpu'"):
        evaluate(model, data, device="gpu")
    with pytest.raises(ValueError, match="indices: expected a non-empty list of ints"):
        predict(model, data, torch.tensor([0, 1]))
    # without the tensorboard package: the error comes before the output folder is made
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match="needs the tensorboard package"):
        _trainer(tmp_path / "tb", tensorboard=True)
    assert not (tmp_path / "tb").exists()


class _StandInWriter:
    """SummaryWriter's interface (the tensorboard package is an extra): one event file per
    writer, named as SummaryWriter names them, and each writer's purge step and scalars in
    ``runs``."""

    runs: list[list] = []

    def __init__(self, log_dir: str, purge_step: int | None) -> None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.runs.append([("purge", purge_step)])
        (Path(log_dir) / f"events.out.tfevents.{len(self.runs)}").write_text("")

    def add_scalar(self, tag, value, step) -> None:
        self.runs[-1].append((tag, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_fresh_run_removes_an_earlier_runs_tensorboard_events(tmp_path, monkeypatch):
    """A fresh run in a folder where another run had logged kept that run's event files:
    TensorBoard showed both runs' epochs as one curve."""
    from galerkin_ext.training import trainer as trainer_module

    _StandInWriter.runs.clear()
    monkeypatch.setattr(trainer_module, "tensorboard_writer_class", lambda: _StandInWriter)
    for _ in range(2):
        _trainer(tmp_path, epochs=1, tensorboard=True).fit()
    assert [p.name for p in (tmp_path / "tensorboard").iterdir()] == ["events.out.tfevents.2"]
    # a resumed run keeps them: its epochs continue the curve
    _trainer(tmp_path, epochs=1, tensorboard=True).fit(resume=True)
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    # a run stopped before its first checkpoint leaves events a fresh run removes too
    (tmp_path / "last.pt").unlink()
    (tmp_path / "best.pt").unlink()
    _trainer(tmp_path, epochs=1, tensorboard=True).fit()
    assert [p.name for p in (tmp_path / "tensorboard").iterdir()] == ["events.out.tfevents.4"]


def test_tensorboard_records_survive_a_kill_and_a_resume(tmp_path, monkeypatch):
    """A resumption logged the stopped run's epoch again after the steps that run had logged
    beyond last.pt (steps 9-12 twice), and a kill after last.pt lost that epoch's scalars,
    written after it. Now the epoch's scalars go before last.pt, at its last step, and the
    resumed writer purges from the first step after last.pt (as SummaryWriter's purge_step
    hides the earlier files' later events)."""
    from galerkin_ext.training import trainer as trainer_module

    logs = _StandInWriter.runs
    logs.clear()

    def shown(runs):  # TensorBoard's view: a purge hides what earlier writers logged from it on
        events = []
        for run in runs:
            purge = run[0][1]
            events = [e for e in events if purge is None or e[1] < purge] + run[1:]
        return events

    monkeypatch.setattr(trainer_module, "tensorboard_writer_class", lambda: _StandInWriter)
    _trainer(tmp_path / "full", tensorboard=True).fit()
    want = shown(logs)
    save, csv = trainer_module.save_checkpoint, trainer_module.write_csv

    def before_last_pt(path, kind, **state):  # a kill just before last.pt of epoch 3
        if kind == "last" and state["epoch"] == 3:
            raise KeyboardInterrupt
        return save(path, kind, **state)

    def after_last_pt(path, rows):  # ... or just after it, before metrics.csv
        if len(rows) == 3:
            raise KeyboardInterrupt
        return csv(path, rows)

    for name, kill in (("save_checkpoint", before_last_pt), ("write_csv", after_last_pt)):
        logs.clear()
        monkeypatch.setattr(trainer_module, name, kill)
        with pytest.raises(KeyboardInterrupt):
            _trainer(tmp_path / name, tensorboard=True).fit()
        monkeypatch.setattr(trainer_module, name, {"save_checkpoint": save, "write_csv": csv}[name])
        _trainer(tmp_path / name, tensorboard=True).fit(resume=True)
        assert shown(logs) == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_describe_grid_tells_uniform_from_nonuniform_time_grids(dtype):
    """A uniform float32 grid t = 0.005 n on [0, 2] has gaps 0.005 +- 3e-7: the round-off of
    its largest times, not of its spacing, says whether it is uniform."""
    from galerkin_ext.data.ode import time_grid

    for dt in (0.005, 0.0075, 0.01, 0.015, 0.02):
        record = describe_grid(torch.tensor(time_grid(dt), dtype=dtype)[:, None], None)
        assert record["uniform"], (dt, record["spacing"])
    record = describe_grid(torch.tensor(time_grid(grid="nonuniform"), dtype=dtype)[:, None])
    assert not record["uniform"]
    assert record["weights"] == "auto: trapezoid, derived from these coordinates"
    shifted = torch.tensor(time_grid(0.01), dtype=dtype)
    shifted[100] += 1e-4  # one time off by 1 % of the step
    assert not describe_grid(shifted[:, None], None)["uniform"]
    # within float32's round-off the TNO's weights call an axis equispaced: so does the record
    # (it used the coordinates' own round-off: a float64 grid was recorded non-uniform)
    near = torch.tensor(time_grid(0.01), dtype=dtype)
    near[100] += 1e-7
    assert describe_grid(near[:, None], "auto")["uniform"]


def test_describe_grid_names_the_rule_of_2d_grids():
    """On a tensor grid the record names the rule the weights follow: uniform, or products of
    per-axis cell widths (which the TNO's 'auto' uses, not the tensor trapezoid rule)."""
    from galerkin_ext.layers.continuum import auto_quadrature_weights

    def grid(axis):
        return torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).double()

    record = describe_grid(grid(torch.linspace(0, 1, 5)), "auto")
    assert record["weights"] == "auto: uniform, derived from these coordinates"
    axis = torch.tensor([0, 0.1, 0.3, 0.6, 1])
    record = describe_grid(grid(axis), "auto")
    assert record["weights"] == "auto: products of per-axis cell widths, derived from these " \
                                "coordinates"
    cells = torch.tensor([0.1, 0.15, 0.25, 0.35, 0.4], dtype=torch.float64)  # by hand
    want = (cells[:, None] * cells[None, :]).flatten()
    w = auto_quadrature_weights(grid(axis).reshape(-1, 2))
    torch.testing.assert_close(w / w.sum(), want / want.sum())
    assert record["weight_max"] == pytest.approx(float(want.max() / want.sum()))


def test_darcy_records_name_their_coarse_grid(tmp_path):
    """build_run_model records the coarse grid build_model paired with the fine one; a record
    without one (from before the pairing) was built on the preset's coarse grid and is rebuilt
    on it, not on the paper's pair (its weights fit any grid: another grid went unnoticed)."""
    from galerkin_ext.training import build_run_model, load_trained_model

    small = {"d_model": 8, "n_head": 2, "num_layers": 1, "dim_feedforward": 8, "freq_dim": 4,
             "modes": 2, "num_decoder_layers": 1}
    cfg = {"model": small}
    model = build_run_model(cfg, "darcy", fine=85)
    assert cfg["build"]["arguments"] == {**small, "fine": 85, "coarse": 29}
    save_checkpoint(tmp_path / "new.pt", "best", epoch=1, model=model.state_dict(), config=cfg,
                    metric=0.5)
    assert load_trained_model(tmp_path / "new.pt")[0].sizes.coarse == 29
    # (the inverse model's pointwise decoder has no Fourier modes)
    pointwise = {k: v for k, v in small.items() if k not in ("freq_dim", "modes")}
    for name, coarse, settings in (("darcy", 43, small), ("darcy_inverse", 36, pointwise)):
        old = models.build_model(name, fine=211, coarse=coarse, **settings)
        record = {"model": settings, "build": {"name": name,
                                               "arguments": {**settings, "fine": 211}}}
        save_checkpoint(tmp_path / "old.pt", "best", epoch=1, model=old.state_dict(),
                        config=record, metric=0.5)
        assert load_trained_model(tmp_path / "old.pt")[0].sizes == old.sizes
    # such a run resumes on its own grids, and not on others
    from galerkin_ext.training.trainer import check_resumable_config

    record = {"build": {"name": "darcy", "arguments": {**small, "fine": 211}}}
    check_resumable_config(record, {"build": {"name": "darcy", "arguments": {
        **small, "fine": 211, "coarse": 43}}}, tmp_path / "old.pt", partial=True)
    with pytest.raises(CheckpointError, match=r"build.arguments.coarse.*there \{'build."
                                              r"arguments.coarse': 43\}, now \{'build."
                                              r"arguments.coarse': 61\}"):
        check_resumable_config(record, {"build": {"name": "darcy", "arguments": {
            **small, "fine": 211, "coarse": 61}}}, tmp_path / "old.pt", partial=True)


def test_a_trained_model_is_rebuilt_from_its_checkpoint_alone(tmp_path, monkeypatch):
    from galerkin_ext.training import build_run_model, load_trained_model

    cfg = {"model": {"width": 8, "modes": 3, "num_layers": 1, "dim_feedforward": 8}}
    with pytest.raises(TypeError, match="config: expected the run's config dict"):
        build_run_model({}, "fno1d")
    model = build_run_model(cfg, "fno1d", in_channels=2)
    assert cfg["build"] == {"name": "fno1d", "arguments": {**cfg["model"], "in_channels": 2}}
    save_checkpoint(tmp_path / "best.pt", "best", epoch=1, model=model.state_dict(),
                    config=cfg, metric=0.5)
    rebuilt, state = load_trained_model(tmp_path / "best.pt")
    assert not rebuilt.training and state["metric"] == 0.5
    x, grid = torch.randn(2, 11, 2), torch.linspace(0, 1, 11)[:, None]
    torch.testing.assert_close(rebuilt(x, grid), model.eval()(x, grid), rtol=0, atol=0)
    # weights of another model, a checkpoint that does not say which model, a bad device
    other = {**cfg, "build": {"name": "fno1d", "arguments": {**cfg["model"], "width": 6}}}
    save_checkpoint(tmp_path / "other.pt", "best", epoch=1, model=model.state_dict(),
                    config=other, metric=0.5)
    with pytest.raises(CheckpointError, match=r"other.pt'?: its weights do not fit the model "
                                              r"it records \('fno1d'\): size mismatch for "):
        load_trained_model(tmp_path / "other.pt")
    model_on_cpu0, _ = load_trained_model(tmp_path / "best.pt", device="cpu:0")
    assert next(model_on_cpu0.parameters()).device == torch.device("cpu")
    save_checkpoint(tmp_path / "old.pt", "best", epoch=1, model=model.state_dict(),
                    config={"model": cfg["model"]}, metric=0.5)
    with pytest.raises(CheckpointError, match="does not record which model it holds"):
        load_trained_model(tmp_path / "old.pt")
    with pytest.raises(ValueError, match="device"):
        load_trained_model(tmp_path / "best.pt", device="tpu")
    # a float64 run's model comes back in float64 (it was built as float32, load_state_dict
    # rounding the weights)
    torch.set_default_dtype(torch.float64)
    try:
        model64 = build_run_model(cfg, "fno1d", in_channels=2).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    save_checkpoint(tmp_path / "double.pt", "best", epoch=1, model=model64.state_dict(),
                    config=cfg, metric=0.5)
    calls = []  # the default dtype is the process's: other threads saw it change
    monkeypatch.setattr(torch, "set_default_dtype", lambda dtype: calls.append(dtype))
    rebuilt, _ = load_trained_model(tmp_path / "double.pt")
    assert {p.dtype for p in rebuilt.parameters()} == {torch.float64} and not calls
    assert torch.get_default_dtype() == torch.float32
    x, grid = x.double(), grid.double()
    torch.testing.assert_close(rebuilt(x, grid), model64(x, grid), rtol=0, atol=0)
    monkeypatch.undo()
    torch.set_default_dtype(torch.float64)  # a float32 run's model comes back in float32
    try:
        rebuilt, _ = load_trained_model(tmp_path / "best.pt")
    finally:
        torch.set_default_dtype(torch.float32)
    assert {p.dtype for p in rebuilt.parameters()} == {torch.float32}


def test_resume_of_another_experiment_names_both():
    from galerkin_ext.training.trainer import check_resumable_config

    stored = {"experiment": "burgers", "model": {"d_model": 96}, "n_train": 8}
    with pytest.raises(CheckpointError, match="it is a run of the 'burgers' experiment, this is "
                                              "'darcy'; use another out_dir"):
        check_resumable_config(stored, {**stored, "experiment": "darcy", "n_train": 9},
                               "last.pt", partial=True)
    # checkpoints written before the experiment and the model's build were recorded
    old = {"model": {"d_model": 96}, "n_train": 8}
    check_resumable_config(old, {**old, "experiment": "burgers",
                                 "build": {"name": "burgers", "arguments": {}}}, "last.pt",
                           partial=True)
    with pytest.raises(CheckpointError, match=r"\['build.arguments.d_model'\]"):
        check_resumable_config({**old, "build": {"name": "b", "arguments": {"d_model": 96}}},
                               {**old, "build": {"name": "b", "arguments": {"d_model": 64}}},
                               "last.pt", partial=True)


def test_recorded_normalizers_come_back_in_their_shapes():
    """A run records its normalisers as nested lists in their fitted shapes (a number for a
    scalar one), so the checkpoint alone rebuilds them; a checkpoint that holds them flattened,
    as before, still resumes, and one fitted on other values does not."""
    from galerkin_ext.data import UnitGaussianNormalizer
    from galerkin_ext.training import normalizer_config, normalizers_from_config
    from galerkin_ext.training.trainer import check_resumable_config

    g = torch.Generator().manual_seed(0)
    fitted = {"grid": UnitGaussianNormalizer(torch.randn(6, 5, 3, generator=g)),
              "channels": UnitGaussianNormalizer(torch.randn(6, 2, generator=g)),
              "scalar": UnitGaussianNormalizer(torch.randn(6, generator=g))}
    config = json.loads(json.dumps(normalizer_config(**fitted)))  # as metrics.json holds it
    assert isinstance(config["scalar"]["mean"], float)
    rebuilt = normalizers_from_config(config)
    x = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    for name, norm in fitted.items():
        assert rebuilt[name].mean.shape == norm.mean.shape
        assert torch.equal(rebuilt[name].mean, norm.mean)
        assert torch.equal(rebuilt[name].std, norm.std)
        assert rebuilt[name].eps == norm.eps
    assert torch.equal(rebuilt["grid"].encode(x), fitted["grid"].encode(x))
    with pytest.raises(ValueError, match=r"config\['grid'\]: expected numbers or nested lists "
                                         r"of them of one shape.*std: expected the shape of mean"):
        normalizers_from_config({"grid": {"mean": config["grid"]["mean"], "std": [1.0]}})
    with pytest.raises(ValueError, match=r"config\['grid'\]: expected \{'mean': ..., 'std': "
                                         r"...\} \(and 'eps'\), got \[1.0\]"):
        normalizers_from_config({"grid": [1.0]})
    with pytest.raises(TypeError, match="config: expected a dict of statistics by name, got list"):
        normalizers_from_config([])
    # the recorded eps comes back (GNOT's normalisers fit with 1e-8), and a record without one,
    # written before it was recorded, takes the grid datasets' default
    small = UnitGaussianNormalizer(torch.randn(6, 2, generator=g), eps=1e-8)
    assert normalizers_from_config(normalizer_config(small=small))["small"].eps == 1e-8
    without = {name: {"mean": stats["mean"], "std": stats["std"]}
               for name, stats in config.items()}
    assert normalizers_from_config(without)["grid"].eps == 1e-5
    with pytest.raises(ValueError, match=r"config\['grid'\]\['eps'\]: expected"):
        normalizers_from_config({"grid": {**config["grid"], "eps": -1.0}})
    flat = {name: {key: torch.tensor(stats[key], dtype=torch.float64).reshape(-1).tolist()
                   for key in ("mean", "std")}
            for name, stats in config.items()}  # as runs before recorded them (and no eps)
    run = {"model": {"d_model": 8}, "normalizers": config}
    check_resumable_config({"model": {"d_model": 8}, "normalizers": flat}, run, "last.pt",
                           partial=True)
    with pytest.raises(CheckpointError, match=r"\['normalizers.grid.eps'\]"):
        check_resumable_config({"model": {"d_model": 8}, "normalizers": {
            **config, "grid": {**config["grid"], "eps": 1e-8}}}, run, "last.pt", partial=True)
    flat["grid"]["mean"][7] += 1e-9
    with pytest.raises(CheckpointError, match=r"\['normalizers.grid.mean'\]"):
        check_resumable_config({"model": {"d_model": 8}, "normalizers": flat}, run, "last.pt",
                               partial=True)


def test_write_csv_reads_an_iterator_of_rows_once(tmp_path):
    """The rows' check read a generator to its end, and an empty file was written."""
    path = write_csv(tmp_path / "g.csv", (r for r in [{"a": 1}, {"a": 2}]))
    assert path.read_text() == "a\n1\n2\n"
    with pytest.raises(TypeError, match="rows: expected a sequence of mappings, got int"):
        write_csv(tmp_path / "n.csv", 3)
    assert not (tmp_path / "n.csv").exists()


def test_rewriting_a_file_keeps_its_mode(tmp_path):
    """A file its owner made private stays private when it is rewritten (new files follow the
    umask, see test_written_files_respect_the_umask)."""
    for path, write in ((tmp_path / "m.json", lambda p: write_json(p, {"a": 1})),
                        (tmp_path / "c.csv", lambda p: write_csv(p, [{"a": 1}])),
                        (tmp_path / "b.pt", lambda p: save_checkpoint(
                            p, "best", epoch=1, model={}, config={}, metric=1.0))):
        write(path)
        path.chmod(0o600)
        write(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@pytest.mark.parametrize("config", [
    {"p": Path("x")},
    {"a": {"b": [1.0, np.float64(1)]}},
    {"t": torch.ones(2)},  # loads, but a resumption cannot compare it
    {"tol": math.nan},  # a resumption never found it equal to itself
    {Path("k"): 1},
])
def test_a_run_config_that_cannot_be_stored_or_compared_is_refused_at_once(tmp_path, config):
    """Such a setting made best.pt unreadable (weights_only) or last.pt never resumable,
    found only after training."""
    ok = {"config": TrainConfig(epochs=1, progress=False), "out_dir": tmp_path}
    with pytest.raises((TypeError, ValueError), match=r"run_config(\[| key)"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), **ok, run_config=config)


def test_save_checkpoint_refuses_what_would_not_load_before_writing(tmp_path):
    path = tmp_path / "b.pt"
    for config, match in (({"p": Path("x")}, r"config\['p'\]: expected .*PosixPath|WindowsPath"),
                          ({"a": [np.float64(1)]}, r"config\['a'\]\[0\]: .*numpy.float64")):
        with pytest.raises(TypeError, match=match):
            save_checkpoint(path, "best", epoch=1, model={}, config=config, metric=1.0)
        assert not path.exists() and not list(tmp_path.iterdir())
    with pytest.raises(TypeError, match=r"metric: .*numpy.float32"):
        save_checkpoint(path, "best", epoch=1, model={}, config={}, metric=np.float32(1))
    for call in (lambda: save_checkpoint(path, ["last"], epoch=1),
                 lambda: load_checkpoint(path, ["last"])):
        with pytest.raises(ValueError, match=r"kind: expected one of \['best', 'last'"):
            call()


@pytest.mark.parametrize("changes", [
    {"max_lr": np.float64(1e-2)}, {"max_lr": np.float32(1e-2)}, {"batch_size": np.int64(4)},
    {"epochs": np.int64(1)}, {"early_stopping": np.int64(3)}, {"seed": np.int64(1)},
    {"grad_clip": np.float64(1.0)}, {"precision": np.str_("fp32")},
])
def test_numpy_settings_become_python_numbers_and_the_run_resumes(tmp_path, changes):
    """Kept as numpy scalars they made best.pt unreadable (weights_only) after the whole run,
    or failed inside torch (batch_size, epochs)."""
    config = TrainConfig(**{"epochs": 1, "batch_size": 4, "progress": False, **changes})
    for name, value in changes.items():
        stored = getattr(config, name)
        assert type(stored) is type(value.item()) and stored == value, name
    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), config, tmp_path)
    first = trainer.fit()
    again = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), config, tmp_path)
    assert again.fit(resume=True)["history"] == first["history"]


def test_a_one_step_warm_up_runs_that_step_at_the_initial_rate(tmp_path):
    """pct_start * steps == 1: OneCycleLR's first phase would have no length (ZeroDivisionError
    while the Trainer was built; then a refusal naming pct_start, which no script has a flag
    for, of runs the sample count, batch and epochs happened to give 1 / pct_start steps)."""
    config = TrainConfig(epochs=2, batch_size=4, pct_start=0.25, max_lr=1e-3, div_factor=10.0,
                         final_div_factor=10.0, progress=False)
    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), config, tmp_path)
    rates = [trainer.scheduler.get_last_lr()[0]]
    for _ in range(3):
        trainer.optimizer.step()
        trainer.scheduler.step()
        rates.append(trainer.scheduler.get_last_lr()[0])
    assert rates[0] == pytest.approx(1e-4)  # the initial rate, then annealed from 1e-3
    assert 1e-3 > rates[1] > rates[2] > rates[3] == pytest.approx(1e-5)
    assert len(Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4), config,
                       tmp_path / "run").fit()["history"]) == 2


def test_an_empty_out_dir_is_refused(tmp_path, monkeypatch):
    """Path('') is the current folder: the checkpoints landed there silently."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="out_dir: expected a folder, got an empty path"):
        Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                TrainConfig(epochs=1, progress=False), "")
    assert not list(tmp_path.iterdir())


def test_a_resumption_without_best_pt_or_of_another_model_fails_before_training(tmp_path):
    """Without best.pt every remaining epoch was trained before loading it failed (last.pt then
    at the final epoch: never finished); another model's weights gave torch's raw error."""
    _trainer(tmp_path, epochs=1).fit()
    last = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "best.pt").rename(tmp_path / "kept.pt")
    with pytest.raises(CheckpointError, match=r"records epoch 1 as the best, but .*best\.pt' "
                                              "is missing"):
        _trainer(tmp_path, epochs=1).fit(resume=True)
    assert (tmp_path / "last.pt").read_bytes() == last
    (tmp_path / "kept.pt").rename(tmp_path / "best.pt")
    other = _trainer(tmp_path, epochs=1)
    other.model.conv = nn.Conv1d(1, 4, 3, padding=1, padding_mode="circular")  # narrower
    other.model.out = nn.Conv1d(4, 1, 1)
    with pytest.raises(CheckpointError, match=r"last\.pt'?: its weights do not fit this "
                                              r"Trainer's model .*size mismatch for conv"):
        other.fit(resume=True)
    assert (tmp_path / "last.pt").read_bytes() == last


class _TwoChannels(_Linear1d):
    def __getitem__(self, i):
        item = super().__getitem__(i)
        return {**item, "target": item["target"].repeat(1, 2)}


def _listed(pred, batch):
    return [0.0] * pred.shape[0]


@pytest.mark.parametrize(("eval_set", "metric", "error", "match"), [
    (TensorDataset(torch.randn(4, 16, 1)), None, TypeError, "batch: expected a dict"),
    (_TwoChannels(4), None, ValueError, "target"),
    (_Linear1d(4), _listed, TypeError, "metric: expected a tensor of per-sample errors, got list"),
    (_Linear1d(4), lambda pred, batch: pred.flatten(1).norm(dim=1)[:2], ValueError,
     r"metric: expected one error per sample, shape \(4,\), got \(2,\)"),
])
def test_eval_set_and_metric_fail_before_the_first_training_step(tmp_path, eval_set, metric,
                                                                   error, match):
    calls = {"n": 0}

    def counting(*args):
        calls["n"] += 1
        return OperatorLoss()(*args)

    trainer = Trainer(_PointMLP(), counting, _Linear1d(8), eval_set,
                      TrainConfig(epochs=2, progress=False), tmp_path,
                      **({"metric": metric} if metric else {}))
    with pytest.raises(error, match=match):
        trainer.fit()
    assert calls["n"] == 0 and trainer.model.training
    assert not (tmp_path / "last.pt").exists()


def test_the_check_of_the_evaluation_changes_nothing_of_the_run(tmp_path, monkeypatch):
    """It runs a DataLoader (which draws its seed from the global RNG) and the model, before
    the RNG states are seeded: a run computes what it did without the check."""
    checked = _trainer(tmp_path / "checked", epochs=2).fit()["history"]
    monkeypatch.setattr(Trainer, "_try_evaluation", lambda self: None)
    plain = _trainer(tmp_path / "plain", epochs=2).fit()["history"]
    for a, b in zip(checked, plain, strict=True):
        assert {**a, "seconds": 0} == {**b, "seconds": 0}


class _Masked(_Linear1d):
    """Padded ragged batches' keys: a mask and quadrature weights (or none)."""

    def __init__(self, count, weights=True, seed=0):
        super().__init__(count, seed=seed)
        self.weights = weights

    def __getitem__(self, i):
        item = {**super().__getitem__(i), "mask": torch.ones(16, dtype=torch.bool)}
        return {**item, "weight": torch.full((16,), 1 / 16)} if self.weights else item


def test_a_weighted_masked_loss_gets_the_batch_weights(tmp_path):
    """MaskedRelativeLoss(weighted=True) was called without them: unusable in the Trainer."""
    seen = []

    class Spy(MaskedRelativeLoss):
        def forward(self, pred, target, mask, weight=None):
            seen.append(weight)
            return super().forward(pred, target, mask, weight)

    def metric(pred, batch):
        return torch.ones(pred.shape[0])

    Trainer(_PointMLP(), Spy(weighted=True), _Masked(8), _Masked(4), TrainConfig(
        epochs=1, progress=False), tmp_path / "w", metric=metric).fit()
    assert len(seen) == 2 and all(torch.equal(w, torch.full((4, 16), 1 / 16)) for w in seen)
    trainer = Trainer(_PointMLP(), MaskedRelativeLoss(weighted=True), _Masked(8, weights=False),
                      _Masked(4, weights=False), TrainConfig(epochs=1, progress=False),
                      tmp_path / "none", metric=metric)
    with pytest.raises(ValueError, match="loss_fn: a weighted loss needs the batch's quadrature "
                                         "weights 'weight'"):
        trainer.fit()
    assert not (tmp_path / "none" / "last.pt").exists()


def test_fit_runs_once(tmp_path):
    """A second fit kept the spent optimiser and schedule: torch's "Tried to step" after a
    step."""
    trainer = _trainer(tmp_path, epochs=1)
    trainer.fit()
    with pytest.raises(RuntimeError, match=r"fit: this Trainer has run fit\(\) already"):
        trainer.fit(resume=True)


class _Float64Data(_Linear1d):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v.double() for k, v in super().__getitem__(i).items()}


def _large_units(pred, target, *rest):
    """A finite float64 loss beyond float32's range (1e40 times a mean square)."""
    loss = 1e40 * (pred - target).square().mean()
    return loss, {"rel_l2": (pred - target).norm() / target.norm()}


def test_a_float64_models_losses_are_recorded_in_float64(tmp_path):
    """The history took each step's loss in float32 (1.5858012437820435 for 1.5858013025874667
    in the audit's run), and a finite float64 loss above float32's range stopped the run as
    'training loss is inf'."""
    torch.manual_seed(0)
    model = nn.Conv1d(1, 1, 3, padding=1, padding_mode="circular").double()
    first = nn.Conv1d(1, 1, 3, padding=1, padding_mode="circular").double()
    first.load_state_dict(model.state_dict())  # the weights of the one step's loss

    class Net(nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.conv = conv

        def forward(self, x, grid):
            return self.conv(x.transpose(1, 2)).transpose(1, 2)

    data = _Float64Data(8)
    result = Trainer(Net(model), _large_units, data, _Float64Data(4, seed=1),
                     TrainConfig(epochs=1, batch_size=8, progress=False), tmp_path).fit()
    batch = {k: torch.stack([data[i][k] for i in range(8)]) for k in ("x", "target")}
    with torch.no_grad():
        want = _large_units(Net(first)(batch["x"], None), batch["target"])[0].item()
    assert math.isfinite(want) and want > 1e38  # (inf in float32)
    assert result["history"][0]["train_loss"] == pytest.approx(want, rel=1e-12)


def _only_loss(pred, target, *rest):
    return (pred - target).square().mean()


def _per_sample(pred, target, *rest):
    loss = (pred - target).square().flatten(1).mean(1)
    return loss, {"rel_l2": loss.detach()}


def _float_part(pred, target, *rest):
    loss = (pred - target).square().mean()
    return loss, {"rel_l2": 0.5}


@pytest.mark.parametrize(("loss_fn", "match"), [
    (_only_loss, r"loss_fn: expected \(loss, parts\).*; got Tensor"),
    (_per_sample, r"loss_fn: expected .*; got loss of shape \(4,\)"),
    (_float_part, r"loss_fn: expected .*; got parts\['rel_l2'\] = 0.5"),
])
def test_the_loss_contract_is_checked_at_the_first_step(tmp_path, loss_fn, match):
    with pytest.raises(TypeError, match=match):
        _trainer(tmp_path, epochs=1, loss=loss_fn).fit()
    assert not (tmp_path / "last.pt").exists()


def test_default_forward_names_a_missing_grid_and_refuses_grids_that_differ(tmp_path):
    class NoGrid(_Linear1d):
        def __getitem__(self, i):
            return {"x": self.x[i], "target": self.target[i]}

    trainer = Trainer(_PointMLP(), OperatorLoss(), NoGrid(8), NoGrid(4),
                      TrainConfig(epochs=1, progress=False), tmp_path / "a")
    with pytest.raises(TypeError, match=r"batch: default_forward needs 'x' .* and 'grid' .*"
                                        r"\['target', 'x'\]; pass forward="):
        trainer.fit()

    class OwnGrids(_Linear1d):  # each sample on points of its own: grid[0] would be wrong
        def __getitem__(self, i):
            return {**super().__getitem__(i), "grid": self.grid + i / 100}

    trainer = Trainer(_PointMLP(), OperatorLoss(), OwnGrids(8), OwnGrids(4),
                      TrainConfig(epochs=1, progress=False), tmp_path / "b")
    with pytest.raises(ValueError, match="the samples' grids differ; pass forward="):
        trainer.fit()
    # a batch of other keys, with its own forward: only 'target' is required
    class Renamed(_Linear1d):
        def __getitem__(self, i):
            return {"u": self.x[i], "target": self.target[i]}

    trainer = Trainer(_PointMLP(), OperatorLoss(), Renamed(8), Renamed(4),
                      TrainConfig(epochs=1, batch_size=4, progress=False), tmp_path / "c",
                      forward=lambda model, batch: model(batch["u"], None))
    assert trainer.fit()["epochs"] == 1


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"rank": -1}, ValueError, "rank: expected an int >= 0"),
    ({"world_size": 0}, ValueError, "world_size: expected an int >= 1"),
    ({"rank": 2, "world_size": 2}, ValueError, "rank: expected an int < world_size = 2"),
    ({"local_rank": 1.0}, TypeError, "local_rank"),
    ({"device": 3}, TypeError, "device: expected a torch.device"),
    ({"device": "tpu"}, ValueError, "device: expected e.g. 'cpu'"),
])
def test_distributed_context_is_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        DistributedContext(**kwargs)


@pytest.mark.parametrize(("name", "value"), [("WORLD_SIZE", "two"), ("RANK", "1.0")])
def test_torchruns_variables_that_are_not_integers_are_refused(name, value, monkeypatch,
                                                               tmp_path):
    """A launch script's typo in WORLD_SIZE or RANK is an error naming the variable, not "started
    alone" (each process then trained alone on all the data, silently)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(name, value)
    message = f"environment variable {name}: expected an integer, got '{value}'"
    for call in (setup_distributed, lambda: Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8),
                                                    _Linear1d(4), TrainConfig(), tmp_path)):
        with pytest.raises(ValueError, match=message):
            call()


def test_a_folder_in_use_by_another_run_is_refused(tmp_path):
    """Two runs writing one folder at once mixed their checkpoints (the reported metric was the
    other run's model) and a starting run deleted the live one's temporary files. A run holds
    an advisory lock on its folder; here another holder stands in for a live run."""
    import fcntl

    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                      TrainConfig(epochs=1, progress=False), tmp_path)
    with open(tmp_path / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="out_dir: another run is writing to"):
            trainer.fit()
        assert not (tmp_path / "last.pt").exists()
    again = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                    TrainConfig(epochs=1, progress=False), tmp_path)
    assert again.fit()["epochs"] == 1  # released: the folder is free


def test_a_distributed_context_takes_a_device_name(tmp_path):
    """device='cpu' failed inside the Trainer ('str' has no attribute 'type')."""
    ctx = DistributedContext(device="cpu")
    assert ctx.device == torch.device("cpu")
    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                      TrainConfig(epochs=1, progress=False), tmp_path, ctx=ctx)
    assert trainer.fit()["epochs"] == 1
    with pytest.raises(TypeError, match="ctx: expected a DistributedContext or None, got str"):
        evaluate(_PointMLP(), _Linear1d(4), ctx="x")


def test_a_fresh_run_removes_the_earlier_runs_results(tmp_path, capsys):
    """An interrupted fresh run in a finished run's folder left that run's metrics.json and
    prediction.png beside its own checkpoints, the old figures passing for the new run's."""
    results = [tmp_path / "metrics.json", tmp_path / "prediction.png"]
    for path in results:  # a folder without a run: nothing is removed
        path.write_text("the user's")
    assert _trainer(tmp_path, epochs=1).fit()["epochs"] == 1
    assert all(path.read_text() == "the user's" for path in results)
    assert _trainer(tmp_path, epochs=1).fit(resume=True)["epochs"] == 1  # nor on a resume
    assert all(path.exists() for path in results)
    _trainer(tmp_path, epochs=1).fit()
    assert "note: starting afresh" in capsys.readouterr().out
    assert not any(path.exists() for path in results)


def test_an_indexed_cpu_is_the_cpu(tmp_path):
    """--device cpu:0 trained to the end, then failed to load its own best.pt (torch.load
    cannot map a checkpoint to 'cpu:0') and called it corrupt; no metrics were written."""
    ctx = DistributedContext(device="cpu:0")
    assert ctx.device == torch.device("cpu") and ctx.device.index is None
    trainer = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                      TrainConfig(epochs=2, progress=False), tmp_path, ctx=ctx)
    assert trainer.fit()["epochs"] == 2
    resumed = Trainer(_PointMLP(), OperatorLoss(), _Linear1d(8), _Linear1d(4),
                      TrainConfig(epochs=2, progress=False), tmp_path,
                      ctx=DistributedContext(device="cpu:1"))
    assert resumed.fit(resume=True)["epochs"] == 2


def test_cached_data_names_a_cache_dir_it_cannot_use(tmp_path):
    """--data-dir below a file ended in pathlib's NotADirectoryError traceback."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"cache_dir: cannot create the folder .*a_file/x"):
        cached_data("burgers", blocker / "x", n_samples=2, resolution=16)
    with pytest.raises(TypeError, match="cache_dir: expected a path"):
        cached_data("burgers", 5)
    # tried, not judged from the permission bits (which root passes on /proc)
    with pytest.raises(ConfigError, match=r"cache_dir: the folder '/proc' is not writable \("):
        cached_data("burgers", "/proc", n_samples=2, resolution=16)


def test_cached_data_progress_is_not_a_parameter_of_the_file(tmp_path, capsys):
    """The scripts' --no-progress left the data generation's bar on: passing it to the
    generator as a data parameter would have named another file."""
    params = {"n_samples": 2, "resolution": 16, "solve_resolution": 16, "n_steps": 4}
    quiet = cached_data("burgers", tmp_path / "a", progress=False, **params)
    assert "burgers:" not in capsys.readouterr().err
    shown = cached_data("burgers", tmp_path / "b", **params)
    assert "burgers:" in capsys.readouterr().err and shown.name == quiet.name


def test_cached_data_makes_again_a_partial_file_it_cannot_resume(tmp_path, capsys):
    """An unreadable partial file in the package's own cache blocked every later run, with
    advice to pass an --overwrite the example scripts do not have."""
    from galerkin_ext.data.storage import partial_path

    params = {"n_samples": 2, "resolution": 16, "solve_resolution": 16, "n_steps": 4,
              "progress": False}
    reference = cached_data("burgers", tmp_path / "a", **params)
    folder = tmp_path / "b"
    folder.mkdir()
    partial_path(folder / reference.name).write_bytes(b"not HDF5")  # a generation cut short
    made = cached_data("burgers", folder, **params)
    assert "cannot resume the interrupted generation" in capsys.readouterr().out
    assert made.read_bytes() == reference.read_bytes()


def test_cached_data_waits_for_a_process_generating_the_same_file(tmp_path, capsys):
    """Two example runs needing one uncached file wrote into one partial file, or the second
    called it corrupt. The second now waits for the first's lock, then reuses its file."""
    import shutil
    import threading

    from galerkin_ext._locks import file_lock

    params = {"n_samples": 2, "resolution": 16, "solve_resolution": 16, "n_steps": 4,
              "progress": False}
    made = cached_data("burgers", tmp_path / "elsewhere", **params)
    folder = tmp_path / "cache"
    folder.mkdir()
    found = []
    with file_lock(folder / f".{made.name}.lock", wait=False) as held:  # the other process
        assert held
        waiter = threading.Thread(target=lambda: found.append(
            cached_data("burgers", folder, **params)))
        waiter.start()
        waiter.join(timeout=2)
        assert waiter.is_alive()  # waiting, not generating
        shutil.copy(made, folder / made.name)  # the other process's file, published
    waiter.join(timeout=60)
    assert found == [folder / made.name]
    assert (folder / made.name).read_bytes() == made.read_bytes()  # reused, not regenerated
    assert "waiting for another process to finish generating" in capsys.readouterr().out


def test_an_evaluation_file_of_the_training_draws_is_refused(tmp_path):
    """Sample i of the package's generators depends on (seed, i) alone: a separate evaluation
    file of the training file's generator and seed holds training draws at those indices."""
    from galerkin_ext.data import generate
    from galerkin_ext.data.storage import DataMismatchError
    from galerkin_ext.training import record_data_files

    train = generate.generate_cde(tmp_path / "train.h5", 12, dt=0.5, progress=False)
    again = generate.generate_cde(tmp_path / "again.h5", 12, dt=0.25, progress=False)
    small = generate.generate_cde(tmp_path / "small.h5", 3, dt=0.5, progress=False)
    other = generate.generate_cde(tmp_path / "other.h5", 12, seed=1, dt=0.5, progress=False)
    config = {"n_train": 6, "n_valid": 2, "n_eval": 4}
    record_data_files(dict(config), train, again)  # its last 4 samples were never trained on
    record_data_files(dict(config), train, other, evaluated=12)  # other draws
    with pytest.raises(DataMismatchError, match=r"--eval-data: its samples 0 to 7 are training "
                                                 r"and validation samples of --data: both come "
                                                 r"from the cde generator with seed 0"):
        record_data_files(dict(config), train, again, evaluated=12)  # (kolmogorov's zero-shot)
    with pytest.raises(DataMismatchError, match="its samples 0 to 2 are training samples"):
        record_data_files(dict(config), train, small)  # (it named samples -1 to 2)


def test_an_evaluation_file_of_another_law_is_refused(tmp_path):
    """An --eval-data file of the training file's generator drawn by another law (the
    controlled ODE's decaying control: a test median of 0.29) was taken, as a zero-shot file
    of another law given to kolmogorov.py; files that differ in their grid alone are one law."""
    from galerkin_ext.data import generate
    from galerkin_ext.data.storage import DataMismatchError
    from galerkin_ext.training import DISCRETISATION_KEYS, check_zero_shot_law, record_data_files

    assert {"dt", "grid", "n_times", "resolution"} <= DISCRETISATION_KEYS
    train = generate.generate_cde(tmp_path / "train.h5", 12, dt=0.5, progress=False)
    finer = generate.generate_cde(tmp_path / "finer.h5", 4, seed=1, dt=0.25, progress=False)
    decay = generate.generate_cde(tmp_path / "decay.h5", 4, seed=1, dt=0.5, decay=True,
                                  progress=False)
    config = {"n_train": 6, "n_valid": 2, "n_eval": 4, "zero_shot": {}}
    record_data_files(dict(config), train, finer)
    check_zero_shot_law(train, finer, "--eval-dt")
    for zero_shot in (False, True):
        with pytest.raises(DataMismatchError, match=r"^--eval-data: its samples follow another "
                                                     r"law than --data's \(decay False vs True\)"):
            record_data_files(dict(config), train, decay, zero_shot=zero_shot)
    with pytest.raises(ConfigError, match=r"another law than the zero-shot sets, which are drawn "
                                          r"with the preset's \(decay False vs True\)"):
        check_zero_shot_law(train, decay, "--eval-dt")


def test_zero_shot_sets_beside_a_converted_file_are_said_to_follow_the_presets_law(tmp_path):
    """A file converted from the authors' data records no law to compare with the zero-shot
    sets the scripts draw with their preset's: their figures were reported without a word, on
    samples of possibly another law (a sigma = 3 set against the preset's 12)."""
    import scipy.io

    from galerkin_ext.data import generate
    from galerkin_ext.data.convert import convert_continuum_darcy
    from galerkin_ext.data.storage import read_h5
    from galerkin_ext.training import check_zero_shot_law

    ours = generate.generate_darcy(tmp_path / "ours.h5", 3, 9, coef="lognormal", sigma=3.0,
                                   progress=False)
    arrays = read_h5(ours)
    scipy.io.savemat(tmp_path / "theirs.mat", {"x": np.moveaxis(arrays["a"], 0, -1),
                                              "y": np.moveaxis(arrays["u"], 0, -1)})
    converted = convert_continuum_darcy(tmp_path / "theirs.mat", tmp_path / "theirs.h5",
                                        progress=False)
    zero_shot = generate.generate_darcy(tmp_path / "zs.h5", 2, 17, coef="lognormal", seed=1,
                                        progress=False)
    with pytest.raises(ConfigError, match=r"\(sigma 3\.0 vs 12\.0\)"):
        check_zero_shot_law(ours, zero_shot, "--eval-resolution")
    with pytest.warns(UserWarning, match=r"--data: 'theirs\.h5' was converted from another "
                                         r"code's data and records no law, so the zero-shot "
                                         r"sets, drawn with the preset's \(alpha 2\.0, coef "
                                         r"'lognormal', f 1\.0, sigma 12\.0, tau 6\.0\), may "
                                         r"follow another one"):
        check_zero_shot_law(converted, zero_shot, "--eval-resolution")


def _run_on_two_processes(source: str, tmp_path: Path, *args: str) -> None:
    """The script ``source`` (with ``args``) under torchrun on 2 gloo processes; it must exit
    with 0. torchrun's logs go to ``tmp_path`` (by default a /tmp folder a run, never removed)."""
    script = tmp_path / "script.py"
    script.write_text(source)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", "--log-dir", str(tmp_path / "logs"),
                           str(script), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]


_LEAVE_GROUP = """
import gc, os, torch
from galerkin_ext.training import cleanup_distributed, setup_distributed
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
ctx = setup_distributed("cpu")
torch.optim.Adam([torch.nn.Parameter(torch.ones(2))])  # imports torch._dynamo, as training does
ctx.all_reduce_sum(torch.ones(2))
cleanup_distributed(ctx)
gc.collect()
assert threads() == before, f"{threads() - before} threads of the group left running"
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_cleanup_distributed_stops_the_group_threads(tmp_path):
    """torch._dynamo, imported once the group existed (by the optimiser), kept the gloo group
    alive past destroy_process_group; one of its worker threads then freed a collective's
    tensors while the interpreter shut down, and the process aborted ("terminate called
    without an active exception"), about one torchrun run in ten here."""
    _run_on_two_processes(_LEAVE_GROUP, tmp_path)


_ERRORS_OVER_RANKS = """
import torch
from galerkin_ext.training import cleanup_distributed, per_sample_errors, setup_distributed

class Samples(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(5, 6, 1, generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"x": self.x[i], "target": self.x[i] ** 2 + 1}

ctx = setup_distributed("cpu")
torch.manual_seed(0)
model = torch.nn.Linear(1, 1)
data = Samples()
errors = per_sample_errors(model, data, forward=lambda m, b: m(b["x"]), ctx=ctx)
with torch.no_grad():
    truth = torch.stack([(model(d["x"]) - d["target"]).norm() / d["target"].norm()
                         for d in (data[i] for i in range(5))])
cleanup_distributed(ctx)
torch.testing.assert_close(errors.float(), truth, rtol=1e-6, atol=0)
"""


def test_per_sample_errors_over_two_processes_are_each_samples_once(tmp_path):
    """Under torchrun each process evaluates every other sample and all get the whole vector,
    in the samples' order: equal to the errors written out, each sample counted once."""
    _run_on_two_processes(_ERRORS_OVER_RANKS, tmp_path)


_REFUSED_TOGETHER = """
import os, shutil, sys, torch
from pathlib import Path
from torch import nn
from galerkin_ext.losses import RelativeLoss
from galerkin_ext.training import (CheckpointError, ConfigError, TrainConfig, Trainer,
                                   cleanup_distributed, per_sample_errors, setup_distributed)

class Samples(torch.utils.data.Dataset):
    def __init__(self, count):
        self.x = torch.randn(count, 6, 1, generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"x": self.x[i], "grid": torch.zeros(6, 1), "target": self.x[i] ** 2 + 1}

class Pointwise(nn.Linear):
    def forward(self, x, grid):
        return super().forward(x)

class RemovingLoss(RelativeLoss):  # rank 0 removes the run's folder at its third step
    steps = 0
    def forward(self, *args, **kwargs):
        self.steps += 1
        if self.steps == 3 and ctx.is_main:
            shutil.rmtree(f"{sys.argv[1]}/removed")
        return super().forward(*args, **kwargs)

def say(line):  # (the processes' prints interleave within lines on one pipe)
    with open(f"{sys.argv[1]}/said.{ctx.rank}", "a") as f:
        print(f"rank {ctx.rank} {line}".replace(sys.argv[1], "OUT"), file=f)

def fit(case, train=8, evals=4, loss=RelativeLoss, gone=False):
    try:
        trainer = Trainer(Pointwise(1, 1), loss(), Samples(train), Samples(evals),
                          TrainConfig(epochs=2, batch_size=2, progress=False),
                          f"{sys.argv[1]}/{case}", ctx=ctx)
        if gone and ctx.is_main:  # the folder removed before fit: its lock cannot be made
            shutil.rmtree(trainer.out_dir)
        trainer.fit()
        say(f"{case}: trained")
    except (CheckpointError, ConfigError, OSError) as e:
        say(f"{case}: {type(e).__name__}: {e}")

ctx = setup_distributed("cpu")
try:
    Trainer(Pointwise(1, 1), RelativeLoss(), Samples(8), Samples(4), TrainConfig(batch_size=2),
            f"{sys.argv[1]}/alone")
except ConfigError as e:
    say(f"alone: {e}")
extra = ctx.rank  # rank 1 holds one sample more
fit("train", train=8 + extra)
fit("eval", evals=4 + extra)
try:
    per_sample_errors(Pointwise(1, 1), Samples(4 + extra), ctx=ctx)
    say("errors: evaluated")
except ConfigError as e:
    say(f"errors: {e}")
fit("locked")  # the test holds its lock
fit("removed", loss=RemovingLoss)
fit("gone", gone=True)
fit("unwritable")  # a file: rank 0 alone checks that it can write there

import galerkin_ext.training.trainer as trainer_module

def missing():  # tensorboard absent (checked by rank 0 alone, the others went on to wait)
    raise ConfigError("tensorboard=True needs the tensorboard package (simulated)")

trainer_module.tensorboard_writer_class = missing
try:
    Trainer(Pointwise(1, 1), RelativeLoss(), Samples(8), Samples(4),
            TrainConfig(batch_size=2, tensorboard=True, progress=False), f"{sys.argv[1]}/tb",
            ctx=ctx)
except ConfigError as e:
    say(f"tensorboard: {e}")

class TwoArguments(Exception):  # (pickled, it cannot be rebuilt from its message alone)
    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")

def fail():
    raise TwoArguments(1, 2)

try:
    ctx.main_only(fail)
except Exception as e:
    say(f"unpicklable: {type(e).__name__}: {e}")
ctx.main_only(lambda: say("main only: ran"))
cleanup_distributed(ctx)
say("left the group")
# (past the checks: a group that saw refused collectives aborted rank 0 once every check had
# passed, in cleanup_distributed or at interpreter exit, "terminate called without an active
# exception", about 1 run in 10 on busy cores; "left the group" tells which, and teardown is
# test_cleanup_distributed_stops_the_group_threads' concern)
os._exit(0)
"""


def test_torchrun_processes_refuse_together(tmp_path):
    """What one process refuses, all do, with the same message. The processes split the
    samples by number: with 8 training samples on rank 0 and 9 on rank 1, sample 1 was trained
    twice and sample 6 never, silently; unequal step counts hung until the group's timeout,
    and unequal evaluation sets aborted in gloo. A Trainer given no ctx trained rank 0 alone
    on all the data, and rank 1 failed on the folder's lock. A folder in use, removed during
    the run, or one rank 0 cannot write (checked by the Trainer's constructor), stopped rank 0
    only (its lock and its files), and left rank 1 waiting in its next collective."""
    (tmp_path / "locked").mkdir()
    (tmp_path / "unwritable").write_text("a file, not a folder")
    with file_lock(tmp_path / "locked" / ".lock", wait=False) as held:
        assert held
        _run_on_two_processes(_REFUSED_TOGETHER, tmp_path, str(tmp_path))
    lines = sorted((tmp_path / "said.0").read_text().splitlines()
                   + (tmp_path / "said.1").read_text().splitlines())
    each = [("alone", "ctx: this process is rank {rank} of 2 started together (torchrun); pass "
                      "ctx=setup_distributed() to train on them together, or "
                      "ctx=DistributedContext() for a run of its own"),
            ("locked", "ConfigError: out_dir: another run is writing to 'OUT/locked' (it holds "
                       "its .lock); wait for it to end, or give another folder"),
            ("removed", "CheckpointError: out_dir: the run's folder 'OUT/removed' was removed "
                        "during the run, with its checkpoints; start the run again"),
            ("gone", "FileNotFoundError: [Errno 2] No such file or directory: 'OUT/gone/.lock'"),
            ("unwritable", "ConfigError: out_dir: cannot write to 'OUT/unwritable' (File exists)"),
            ("tensorboard", "tensorboard=True needs the tensorboard package (simulated)")]
    each += [(what, f"{'' if what == 'errors' else 'ConfigError: '}{name}: every process needs "
                    f"the same samples, got {count} on rank 0, {count + 1} on rank 1")
             for what, name, count in (("errors", "dataset", 4), ("eval", "eval_set", 4),
                                       ("train", "train_set", 8))]
    each += [("unpicklable", "{kind}: 1 and 2")]  # (rank 1 gets its name and message)
    kinds = ("TwoArguments", "RuntimeError: TwoArguments")
    assert lines == sorted(["rank 0 main only: ran", "rank 0 left the group",
                            "rank 1 left the group"] + [
        f"rank {rank} {what}: {message.format(rank=rank, kind=kinds[rank])}"
        for rank in (0, 1) for what, message in each])
    assert not (tmp_path / "train" / "last.pt").exists()


def test_check_model_grid_runs_an_empty_batch_without_side_effects():
    """check_model_grid: a grid too coarse for an FNO's modes is its ValueError; a fitting one
    passes; the model's mode and torch's generator are as they were (a run's draws unchanged)."""
    from galerkin_ext.models import build_model

    model = build_model("fno2d", modes=6, width=8)
    state = torch.get_rng_state()
    check_model_grid(model, (12, 11), in_channels=1)
    assert model.training and torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="a 11×11 grid is too coarse for modes = 6"):
        check_model_grid(model.eval(), (11, 11), in_channels=1)
    assert not model.training
    for args, error, message in (((None, (12, 12), 1), TypeError, "model: expected"),
                                 ((model, 12, 1), TypeError, "points: expected a sequence"),
                                 ((model, (12, 0), 1), ValueError, r"points\[1\]: expected"),
                                 ((model, (12, 12), 0), ValueError, "in_channels: expected")):
        with pytest.raises(error, match=message):
            check_model_grid(*args)


def test_an_eval_set_the_model_cannot_take_is_a_config_error_before_training(tmp_path):
    """fit() evaluates one batch of eval_set first: a grid the model's layers refuse (too few
    points for an FNO's modes) is a ConfigError naming eval_set, before any training step."""
    from galerkin_ext.models import build_model

    trainer = Trainer(build_model("fno1d", modes=8, width=8), OperatorLoss(), _Linear1d(8),
                      _Linear1d(4, n=8), TrainConfig(epochs=1, batch_size=4, progress=False),
                      tmp_path)
    with pytest.raises(ConfigError, match=r"eval_set: its first batch does not fit the model: "
                                          r"x: 8 points give 5 Fourier modes"):
        trainer.fit()
    assert not (tmp_path / "last.pt").exists()


def test_the_default_metric_masks_a_padded_ragged_batch():
    """The default metric took padded points into each sample's norms: a pointwise model's
    errors then changed with the evaluation batch (6 % in a Trainer's eval_rel_l2, which picks
    best.pt). Now each sample's error is over its own points, whatever the batch."""
    from galerkin_ext.data.gnot_datasets import collate_ragged

    class Ragged(Dataset):
        collate_fn = staticmethod(collate_ragged)

        def __init__(self, sizes):
            g = torch.Generator().manual_seed(1)
            self.items = []
            for i, n in enumerate(sizes):
                x = torch.rand(n, 2, generator=g)
                self.items.append({"x": x, "weight": torch.full((n,), 1.0 / n),
                                   "target": torch.sin(3 * x[:, :1]) + x[:, 1:], "inputs": [],
                                   "input_weights": [], "theta": None, "index": i})

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))  # nonzero on padding
    data = Ragged([5, 40, 7, 33, 12])
    with torch.no_grad():
        truth = torch.stack([(model(it["x"]) - it["target"]).norm() / it["target"].norm()
                             for it in data.items])
    for batch_size in (1, 2, 5):
        errors = per_sample_errors(model, data, batch_size=batch_size,
                                   forward=lambda m, b: m(b["x"]))
        torch.testing.assert_close(errors.float(), truth, rtol=1e-6, atol=0)


def test_samples_that_do_not_stack_are_a_config_error_naming_collate_fn(tmp_path):
    """Point sets of different sizes without a collate_fn ended in torch's raw 'stack expects
    each tensor to be equal size', from inside the first evaluation batch."""

    class Clouds(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            x = torch.rand(10 + i, 1)
            return {"x": x, "grid": x, "target": x}

    trainer = Trainer(_PointMLP(), OperatorLoss(), Clouds(), Clouds(),
                      TrainConfig(epochs=1, batch_size=2, progress=False), tmp_path)
    with pytest.raises(ConfigError, match=r"^eval_set: its samples do not stack into a batch "
                                          r"\(.*\); .*collate_ragged"):
        trainer.fit()
    assert not (tmp_path / "last.pt").exists()


def test_a_datasets_own_error_is_not_called_a_stacking_error(tmp_path):
    """Only the collation's errors get the collate_fn hint: a sample that cannot be read
    reaches the user with its own message."""

    class Broken(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise RuntimeError("sample 0 is on a disk that is gone")

    trainer = Trainer(_PointMLP(), OperatorLoss(), Broken(), Broken(),
                      TrainConfig(epochs=1, batch_size=2, progress=False), tmp_path)
    with pytest.raises(RuntimeError, match=r"^sample 0 is on a disk that is gone$"):
        trainer.fit()
