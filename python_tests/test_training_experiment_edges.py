"""training/experiment.py's argument checks and rarely taken branches: each check reached
through the public API, each branch with its result checked."""

import argparse
import importlib.util
import json
import os
import sys

import pytest
import torch

from galerkin_ext._cli import usable_device, writable_file
from galerkin_ext.data.generate import generate_cde
from galerkin_ext.data.storage import DataMismatchError, data_identity
from galerkin_ext.training import (
    CheckpointError,
    ThresholdError,
    cached_data,
    check_resume,
    default_cache_dir,
    describe_device,
    describe_grid,
    enforce_thresholds,
    evaluation_only,
    experiment_parser,
    normalizer_config,
    plot_1d,
    plot_2d,
    plot_mesh,
    preset_unchanged,
    record_data_files,
    resolve_config,
    run_main,
    save_checkpoint,
    threshold_report,
    write_metrics,
)
from galerkin_ext.training import experiment as E
from galerkin_ext.training.trainer import ConfigError

PRESETS = {"p": {"data": {"n_samples": 3}, "n_train": 4, "n_eval": 2, "model": {},
                 "train": {"epochs": 1}}}


def _args(tmp_path, *flags):
    return experiment_parser("doc", PRESETS).parse_args(["--out", str(tmp_path / "o"), *flags])


def test_parser_checks():
    with pytest.raises(ValueError, match="presets: expected a non-empty dict"):
        experiment_parser("doc", {})
    with pytest.raises(TypeError, match="eval_data_help: expected a str or None, got 3"):
        experiment_parser("doc", PRESETS, eval_data_help=3)


def test_resolve_config_checks_and_raises_a_small_sample_count(tmp_path):
    args = _args(tmp_path)
    cfg = resolve_config(PRESETS, args, experiment="t")
    assert cfg["data"]["n_samples"] == 6  # the preset's 3 is fewer than 4 + 2
    assert PRESETS["p"]["data"]["n_samples"] == 3
    with pytest.raises(ValueError, match=r"args.preset: expected one of \['p'\]"):
        resolve_config(PRESETS, argparse.Namespace(preset="q"), experiment="t")
    with pytest.raises(TypeError, match="experiment: expected the experiment's name, got ''"):
        resolve_config(PRESETS, args, experiment="")
    with pytest.raises(ValueError, match=r"presets\['p'\]: missing keys \['model', 'train'\]"):
        resolve_config({"p": {"data": {}, "n_train": 1, "n_eval": 1}}, args, experiment="t")


def test_n_eval_overrides_the_presets_evaluation_count(tmp_path):
    """--n-eval replaces the preset's n_eval, and the generated data grow to hold it (4 + 5
    samples); without it the preset's 2 stay."""
    cfg = resolve_config(PRESETS, _args(tmp_path, "--n-eval", "5"), experiment="t")
    assert (cfg["n_eval"], cfg["data"]["n_samples"]) == (5, 9)
    assert resolve_config(PRESETS, _args(tmp_path), experiment="t")["n_eval"] == 2


def test_resolve_config_refuses_in_one_line_what_failed_later_with_a_traceback(tmp_path):
    """--n-train 1 failed in the Darcy datasets after the data were generated; a --seed of
    2**63 in TrainConfig; both now raise the ConfigError the scripts end with in one line."""
    with pytest.raises(ConfigError, match=r"^n_train: fitting the normalisers needs >= 2 "
                                          r"training samples \(--n-train\), got 1$"):
        resolve_config(PRESETS, _args(tmp_path, "--n-train", "1", "--batch-size", "1"),
                       experiment="t")
    with pytest.raises(ConfigError, match=r"^seed: expected an int >= 0 and < 2\*\*63"):
        resolve_config(PRESETS, _args(tmp_path, "--seed", str(2**63)), experiment="t")
    assert not (tmp_path / "o").exists()


def test_a_batch_the_torchrun_processes_cannot_share_is_refused_before_the_data(tmp_path,
                                                                                 monkeypatch):
    """The Trainer refused it, after the data were generated; domain parallelism splits the
    points, not the batch, and takes any batch."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = _args(tmp_path, "--batch-size", "3")
    with pytest.raises(ConfigError, match=r"^batch_size: the global batch 3 must be divisible "
                                          r"by the 2 processes \(--batch-size, torchrun's "):
        resolve_config(PRESETS, args, experiment="t")
    assert resolve_config(PRESETS, args, experiment="t", parallel="domain")["train"][
        "batch_size"] == 3
    assert resolve_config(PRESETS, _args(tmp_path, "--batch-size", "2"), experiment="t")


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None,
                    reason="tensorboard is installed")
def test_tensorboard_flag_without_the_package(tmp_path):
    with pytest.raises(ConfigError, match="needs the tensorboard package"):
        resolve_config(PRESETS, _args(tmp_path, "--tensorboard"), experiment="t")
    assert not (tmp_path / "o").exists()


def test_check_resume_branches(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    cfg = {"experiment": "t"}
    args = argparse.Namespace(out=str(out), resume=False)
    (out / "last.pt").write_bytes(b"not a checkpoint")  # unreadable: skipped, not an error
    save_checkpoint(out / "best.pt", "best", epoch=1, model={}, config={"experiment": "t"},
                    metric=1.0)  # same experiment: no refusal
    assert check_resume(cfg, args) is None
    save_checkpoint(out / "best.pt", "best", epoch=1, model={}, config={"experiment": "x"},
                    metric=1.0)
    with pytest.raises(ConfigError, match="holds a run of the 'x' experiment"):
        check_resume(cfg, args)
    (out / "last.pt").unlink()
    # --resume without a last.pt: a fresh start, nothing compared (a best.pt is not resumed)
    assert check_resume(cfg, argparse.Namespace(out=str(out), resume=True)) is None


def test_run_main_on_a_missed_threshold(capsys):
    def main():
        raise ThresholdError("b = 3 > 2")
    assert run_main(main) == 1
    assert "threshold not met: b = 3 > 2" in capsys.readouterr().err


def test_small_argument_checks(tmp_path):
    with pytest.raises(TypeError, match="split: expected a mapping of split sizes, got list"):
        evaluation_only([4])
    with pytest.raises(TypeError, match="result: expected the dict returned by Trainer.fit"):
        write_metrics(tmp_path, {}, torch.nn.Linear(1, 1), None, {}, 0.1)
    assert not (tmp_path / "metrics.json").exists()
    with pytest.raises(TypeError, match="config, preset: expected dicts"):
        preset_unchanged([], {}, argparse.Namespace())
    with pytest.raises(TypeError, match="values, thresholds: expected dicts of name -> number"):
        threshold_report({"a": 1.0}, [("a", 1.0)], enforced=True)
    with pytest.raises(TypeError, match=r"values\['a'\]: expected a number, got \[1.0\]"):
        threshold_report({"a": [1.0]}, {"a": 1.0}, enforced=True)
    with pytest.raises(TypeError, match=r"coords: expected a tensor of shape \(\*grid, d\)"):
        describe_grid(torch.zeros(3))
    with pytest.raises(TypeError, match="weight: expected 'auto', None or a description, got 3"):
        describe_grid(torch.zeros(3, 1), weight=3)
    with pytest.raises(TypeError, match="x: expected a UnitGaussianNormalizer, got Linear"):
        normalizer_config(x=torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="problem: expected one of .*got 'foo'"):
        cached_data("foo", tmp_path)


def test_metrics_json_records_the_best_epoch_not_the_last(tmp_path, capsys):
    """metrics.json's best_epoch is the epoch whose model was kept (Trainer.fit's best_epoch,
    here 2 of 5 epochs), not the number of epochs run."""
    from galerkin_ext.training import DistributedContext

    result = {"best_epoch": 2, "best_metric": 0.1, "epochs": 5, "train_seconds": 3.0,
              "history": [{"epoch": e} for e in range(1, 6)]}
    write_metrics(tmp_path, result, torch.nn.Linear(2, 1), DistributedContext(), {}, 0.2)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert (written["best_epoch"], written["epochs"]) == (2, 5)
    assert "best epoch 2: 1.0000e-01" in capsys.readouterr().out


def test_write_metrics_refuses_an_extra_result_under_a_name_it_writes(tmp_path):
    """An extra key such as 'epochs' overwrote the recorded value (or was overwritten, for
    'history'); the script's own results come before the long config and history."""
    from galerkin_ext.training import DistributedContext

    result = {"best_epoch": 1, "best_metric": 0.1, "epochs": 2, "train_seconds": 3.0,
              "history": [{"epoch": 1}, {"epoch": 2}]}
    for taken in ("epochs", "command", "history"):
        with pytest.raises(ValueError, match=f"^extra: {taken} is written by write_metrics "
                                             "itself"):
            write_metrics(tmp_path, result, torch.nn.Linear(2, 1), DistributedContext(),
                          {"n": 4}, 0.2, **{taken: 7})
        assert not (tmp_path / "metrics.json").exists()
    write_metrics(tmp_path, result, torch.nn.Linear(2, 1), DistributedContext(), {"n": 4}, 0.2,
                  zero_shot={"64": 0.3})
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert list(written)[-3:] == ["zero_shot", "config", "history"]
    assert written["config"] == {"n": 4} and written["epochs"] == 2


def test_reference_dropout_is_never_the_presets_run(tmp_path):
    """--reference-dropout (the original code's always-on attention dropout) makes a run other
    than the preset's, whose thresholds then do not apply: even where the preset names no
    reference_dropout, so that the setting is not compared, and where it names it True."""
    preset = {"data": {}, "n_train": 4, "n_eval": 2, "model": {}, "train": {"epochs": 1}}
    parser = experiment_parser("doc", {"p": preset})

    def run(*flags):
        args = parser.parse_args(["--out", str(tmp_path / "o"), *flags])
        return resolve_config({"p": preset}, args, experiment="t"), args

    cfg, args = run()
    assert preset_unchanged(cfg, preset, args)  # without the flag: the preset's run
    cfg, args = run("--reference-dropout")
    assert cfg["model"]["reference_dropout"] is True
    assert not preset_unchanged(cfg, preset, args)
    assert not preset_unchanged(cfg, {**preset, "model": {"reference_dropout": True}}, args)


def test_a_value_equal_to_its_threshold_meets_it(capsys):
    """Met means value <= threshold: a run that reaches its target exactly passes."""
    report = threshold_report({"a": 0.25}, {"a": 0.25}, enforced=True)
    assert report["checks"]["a"]["met"] is True
    enforce_thresholds(report)  # no ThresholdError
    assert "threshold a: 2.5000e-01 <= 2.5000e-01? ok" in capsys.readouterr().out


def test_describe_device_without_proc_cpuinfo(monkeypatch):
    def no_file(*a, **k):
        raise OSError("no /proc")
    monkeypatch.setattr(E, "open", no_file, raising=False)
    monkeypatch.setattr(E.platform, "processor", lambda: "")
    assert describe_device("cpu") == (f"CPU, {torch.get_num_threads()} of {os.cpu_count()} "
                                      "cores (torch threads)")


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GALERKIN_EXT_CACHE", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.setenv("GALERKIN_EXT_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "galerkin_ext"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert default_cache_dir() == tmp_path / "h" / ".cache" / "galerkin_ext"


def test_cached_data_refuses_a_read_only_folder(monkeypatch, tmp_path):
    # (as root every folder is writable: the trial file is made to fail)
    monkeypatch.setattr(E, "cannot_write_in", lambda folder: "Read-only file system")
    with pytest.raises(ConfigError, match="cache_dir: the folder .* is not writable"):
        cached_data("burgers", tmp_path, n_samples=2)


def test_plots_need_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    p = torch.zeros(1, 3, 1)
    with pytest.raises(RuntimeError, match="prediction.png needs matplotlib"):
        plot_1d(tmp_path / "a.png", torch.arange(3.0), p, p)
    assert not (tmp_path / "a.png").exists()


def test_plot_argument_checks(tmp_path):
    p = torch.zeros(1, 3, 1)
    with pytest.raises(ValueError, match="grid: expected 3 points, got 4"):
        plot_1d(tmp_path / "a.png", torch.arange(4.0), p, p)
    with pytest.raises(TypeError, match=r"grid: expected a tensor of shape \(n,\) or \(n, 1\), "
                                        "got list"):
        plot_1d(tmp_path / "a.png", [0.0, 1.0, 2.0], p, p)
    with pytest.raises(ValueError, match=r"grid: expected shape \(n,\) or \(n, 1\), got \(3, 2\)"):
        plot_1d(tmp_path / "a.png", torch.zeros(3, 2), p, p)
    with pytest.raises(ValueError, match="components: expected 1 names, got 'u'"):
        plot_1d(tmp_path / "a.png", torch.arange(3.0), p, p, components="u")
    with pytest.raises(TypeError, match=r"points\[0\], triangles\[0\], pred\[0\], target\[0\]: "
                                        "expected tensors"):
        plot_mesh(tmp_path / "m.png", [torch.zeros(3, 2)], [None], [[0.0, 1, 2]],
                  [torch.zeros(3)])
    with pytest.raises(ValueError, match="inputs: expected 1 samples, got 2"):
        plot_2d(tmp_path / "b.png", torch.zeros(2, 4, 4), torch.zeros(1, 4, 4),
                torch.zeros(1, 4, 4))
    assert list(tmp_path.iterdir()) == []


def test_zero_shot_sets_never_repeat_the_training_draws(tmp_path):
    """The ODE scripts drew their zero-shot sets with seed 1 whatever --data held: a training
    file of seed 1 made every zero-shot sample a training sample on another time grid."""
    from galerkin_ext.data.generate import generate_cde, generate_lorenz63
    from galerkin_ext.training import zero_shot_seed

    seed1 = generate_lorenz63(tmp_path / "l63.h5", 2, seed=1, dt=0.1, progress=False)
    assert zero_shot_seed(seed1, "lorenz63", 1) == 2
    assert zero_shot_seed(seed1, "lorenz63", 0) == 0
    assert zero_shot_seed(seed1, "cde", 1) == 1  # another generator's draws
    other = generate_cde(tmp_path / "cde.h5", 2, seed=0, dt=0.1, progress=False)
    assert zero_shot_seed(other, "cde", 1) == 1
    foreign = tmp_path / "foreign.h5"
    foreign.write_bytes(b"not ours")
    assert zero_shot_seed(foreign, "cde", 1) == 1
    with pytest.raises(ValueError, match="seed"):
        zero_shot_seed(seed1, "lorenz63", -1)


def test_the_ode_scripts_take_the_time_step_of_their_data_file(tmp_path, capsys):
    """With --data, --dt was ignored (the file's grid was trained on) and metrics.json and the
    plot recorded --dt, or the preset's dt without it."""
    import importlib.util
    from pathlib import Path

    from galerkin_ext.data.generate import generate_lorenz63

    data = generate_lorenz63(tmp_path / "l63.h5", 2, dt=0.1, progress=False)
    examples = Path(__file__).resolve().parent.parent / "examples"
    for name in ("lorenz63", "controlled_ode"):
        spec = importlib.util.spec_from_file_location(f"example_{name}", examples / f"{name}.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        with pytest.raises(SystemExit):
            script.main(["--out", str(tmp_path / "o"), "--data", str(data), "--dt", "0.02"])
        assert "--dt: --data holds samples of dt = 0.1, got 0.02 (leave --dt out)" in \
            capsys.readouterr().err
        # a missing file has no record: the scripts' own check names it (not open's Errno 2)
        with pytest.raises(FileNotFoundError, match=r"^--data: no such file"):
            script.main(["--out", str(tmp_path / "o"), "--data", str(tmp_path / "missing.h5"),
                         "--dt", "0.02"])


def test_eval_data_of_another_layout_is_refused_in_one_line(tmp_path):
    """The GNOT scripts' --eval-data without the training data's cavity (an input of
    coordinates only, which the normalisers do not cover) failed inside the first evaluation
    with a traceback."""
    from test_data_ragged import synthetic, write

    from galerkin_ext.data.gnot_datasets import RaggedDataset
    from galerkin_ext.training import check_eval_layout

    train_file = write(tmp_path / "train.h5", n=6, chunk=3)
    other = write(tmp_path / "other.h5", n=2, chunk=2,
                  fn=lambda i: synthetic(i, seed=1, cavity=False))
    train_set = RaggedDataset(train_file, "train", n_train=4, n_test=2)
    same = RaggedDataset(train_file, "test", n_train=4, n_test=2,
                         normalizers=train_set.normalizers)
    check_eval_layout(train_set, same)
    eval_set = RaggedDataset(other, "test", n_train=0, n_test=2,
                             normalizers=train_set.normalizers)
    with pytest.raises(ConfigError, match=r"^--eval-data: its samples differ from the "
                                          r"training data's \(.*cavity"):
        check_eval_layout(train_set, eval_set)


@pytest.mark.parametrize("count", [5, 4])
def test_error_summary_reports_physical_and_normalised_errors(count):
    """Medians, mean and maximum of the per-sample relative L2 errors, in physical units (the
    targets' normaliser decodes prediction and target) and in normalised ones, written out
    here with plain sums on a uniform grid (unweighted norms). Over an even count the median
    is the mean of the two middle errors (torch's median() gives the lower one)."""
    from galerkin_ext.data import UnitGaussianNormalizer
    from galerkin_ext.training import error_summary

    gen = torch.Generator().manual_seed(count)
    n = 16
    grid = torch.linspace(0, 1, n, dtype=torch.float64)[:, None]
    xs, targets = (torch.randn(count, n, 1, generator=gen, dtype=torch.float64) for _ in "ab")

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return count

        def __getitem__(self, i):
            return {"x": xs[i], "grid": grid, "target": targets[i]}

    class Scaled(torch.nn.Module):
        def forward(self, x, grid):
            return 0.3 * x

    norm = UnitGaussianNormalizer(5 + 2 * torch.randn(50, n, 1, generator=gen,
                                                      dtype=torch.float64))
    summary = error_summary(Scaled(), Pairs(), normalizer=norm, weighted=False, batch_size=2)
    pred = 0.3 * xs

    def relative(p, t):
        return ((p - t).square().sum((1, 2)) / t.square().sum((1, 2))).sqrt()

    def median(errors):
        ordered = sorted(errors.tolist())
        lower, upper = ordered[(count - 1) // 2], ordered[count // 2]
        assert count % 2 or upper - lower > 1e-3  # (two different middle values)
        return (lower + upper) / 2

    physical = relative(norm.decode(pred), norm.decode(targets))
    normalised = relative(pred, targets)
    assert summary["n_samples"] == count
    for key, want in (("rel_l2_median", median(physical)), ("rel_l2", physical.mean()),
                      ("rel_l2_max", physical.max()),
                      ("rel_l2_median_normalized", median(normalised)),
                      ("rel_l2_normalized", normalised.mean())):
        assert summary[key] == pytest.approx(float(want), rel=1e-10), key
    assert abs(summary["rel_l2_median"] - summary["rel_l2_median_normalized"]) > 0.1


def test_command_line_threads_beat_the_presets(tmp_path):
    """--threads overrides a preset's 'threads' (1 against its 4); without it the preset's
    value applies, and without either torch's default (None)."""
    presets = {"p": PRESETS["p"] | {"threads": 4}}
    parser = experiment_parser("doc", presets)

    def threads(*flags):
        args = parser.parse_args(["--out", str(tmp_path / "o"), *flags])
        return resolve_config(presets, args, experiment="t")["threads"]

    assert threads("--threads", "1") == 1
    assert threads("--threads", "7") == 7
    assert threads() == 4
    assert resolve_config(PRESETS, _args(tmp_path, "--threads", "2"), experiment="t")[
        "threads"] == 2
    assert resolve_config(PRESETS, _args(tmp_path), experiment="t")["threads"] is None


def _cde_files(tmp_path):
    """A 12-sample training file, and a 4-sample file of the same law drawn with another seed."""
    train = generate_cde(tmp_path / "train.h5", 12, dt=0.5, progress=False)
    other = generate_cde(tmp_path / "other.h5", 4, seed=1, dt=0.5, progress=False)
    return train, other


def _save_last(out, config):
    out.mkdir(exist_ok=True)
    save_checkpoint(out / "last.pt", "last", epoch=1, model={}, config=config, optimizer={},
                    scheduler={}, rng=[], best_metric=1.0, best_epoch=1, history=[],
                    train_seconds=0.0, world_size=1)


def _resume(out, data, eval_data, **kwargs):
    args = argparse.Namespace(out=str(out), resume=True, data=str(data),
                              eval_data=None if eval_data is None else str(eval_data))
    return check_resume({"experiment": "t", "train": {}}, args, **kwargs)


def test_a_run_with_an_eval_file_resumed_without_it_is_refused(tmp_path):
    """Without --eval-data the evaluation split is --data's: a run that evaluated on a separate
    file, resumed without it, would evaluate (and pick its best.pt) on other data."""
    train, other = _cde_files(tmp_path)
    config = {"experiment": "t", "n_train": 6, "n_valid": 2, "n_eval": 4}
    record_data_files(config, train, other)
    _save_last(tmp_path / "o", config)
    assert _resume(tmp_path / "o", train, other) is None
    with pytest.raises(CheckpointError, match=r"--data '.*train\.h5' holds other data than the "
                                              r"run's evaluation file"):
        _resume(tmp_path / "o", train, None)


def test_a_zero_shot_run_resumes_with_its_zero_shot_file(tmp_path):
    """A zero-shot --eval-data is no evaluation split (that is --data's): resumed with the same
    file, or another zero-shot set, the run goes on; another --data is still refused."""
    train, other = _cde_files(tmp_path)
    config = {"experiment": "t", "n_train": 6, "n_valid": 2, "n_eval": 4, "zero_shot": {}}
    record_data_files(config, train, other, zero_shot=True)
    _save_last(tmp_path / "o", config)
    assert _resume(tmp_path / "o", train, other, zero_shot=True) is None
    assert _resume(tmp_path / "o", train, None, zero_shot=True) is None
    with pytest.raises(CheckpointError, match=r"--data '.*other\.h5' holds other data than the "
                                              r"run's training file"):
        _resume(tmp_path / "o", other, other, zero_shot=True)


def test_an_eval_file_reaching_into_the_validation_draws_is_refused(tmp_path):
    """Samples 0-5 train and 6-7 validate (n_train 6, n_valid 2): of a 12-sample file of the
    same generator and seed, the last 5 start at sample 7, a validation draw; the last 4 do
    not."""
    train = generate_cde(tmp_path / "train.h5", 12, dt=0.5, progress=False)
    again = generate_cde(tmp_path / "again.h5", 12, dt=0.25, progress=False)
    with pytest.raises(DataMismatchError, match=r"^--eval-data: its samples 7 to 7 are "
                                                r"validation samples of --data"):
        record_data_files({"n_train": 6, "n_valid": 2, "n_eval": 5}, train, again)
    record_data_files({"n_train": 6, "n_valid": 2, "n_eval": 4}, train, again)
    # a count of evaluated samples below 1 is refused, not read as an empty range
    for evaluated in (0, -3):
        with pytest.raises(ValueError, match=rf"^evaluated: expected an int >= 1, got "
                                             rf"{evaluated}"):
            record_data_files({"n_train": 6, "n_valid": 2, "n_eval": 4}, train, again,
                              evaluated=evaluated)


def test_a_zero_shot_file_is_recorded_apart_from_the_evaluation_split(tmp_path):
    """With zero_shot the evaluation split is --data's: data_files and data_identity are those
    of a run without --eval-data, and the zero-shot file's path and identity go into
    config['zero_shot'], the settings a resumption may change."""
    train, other = _cde_files(tmp_path)
    plain = {"n_train": 6, "n_valid": 2, "n_eval": 4}
    record_data_files(plain, train, None)
    config = {"n_train": 6, "n_valid": 2, "n_eval": 4, "zero_shot": {"n": 4}}
    record_data_files(config, train, other, zero_shot=True)
    assert config["data_files"] == plain["data_files"] == {
        "train": str(train.resolve()), "eval": str(train.resolve())}
    assert config["data_identity"] == plain["data_identity"]
    assert config["zero_shot"] == {"n": 4, "data_file": str(other.resolve()),
                                   "data_identity": data_identity(other)}
    assert data_identity(other)["seed"] == 1


def test_cli_usable_device_refuses_a_device_the_run_cannot_use():
    """--device is checked as it is parsed: a device torch does not know, one of a kind the
    package does not run on (Apple's mps), or CUDA on a torch or machine without it."""
    assert usable_device("cpu") == "cpu" and usable_device("auto") == "auto"
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected e\.g\. 'cpu', 'cuda', "
                                                         r"'cuda:1' or 'auto', got 'tpu'"):
        usable_device("tpu")
    with pytest.raises(argparse.ArgumentTypeError, match="expected a CPU or CUDA device, got "
                                                         "'mps'"):
        usable_device("mps")
    if torch.cuda.is_available():
        assert usable_device("cuda:0") == "cuda:0"
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="'cuda:0' requested but CUDA is "
                                                             "not available"):
            usable_device("cuda:0")


def test_cli_writable_file_refuses_a_folder(tmp_path):
    """A results file named by a folder: refused as the command line is parsed, not when the
    run ends and its write fails."""
    with pytest.raises(argparse.ArgumentTypeError, match=r"is a folder; expected a file to "
                                                         r"write$") as info:
        writable_file(str(tmp_path))
    assert repr(str(tmp_path)) in str(info.value)
    assert writable_file(str(tmp_path / "new" / "r.json")) == tmp_path / "new" / "r.json"
