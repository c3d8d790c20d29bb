"""Smoke tests of the benchmark scripts at tiny sizes on the CPU: table1.py (our implementation
only: CI does not install the original package) and burgers_stability.py write their JSON;
paper_runs.py's records; gnot_claims.py's refined-set analysis."""

import importlib.util
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from galerkin_ext.data import generate_elasticity

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RECORD_KEYS = {"model", "attention", "impl", "it_per_s", "peak_mem_mb", "device", "command",
               "batch", "n"}


def _takes_out(text: str) -> bool:
    """A script with an ``--out`` results file (its own flag, or timing.py's op_parser)."""
    return "__main__" in text and ('"--out", type=writable_file' in text or "op_parser(" in text)


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")
                                           if _takes_out(p.read_text())))
def test_an_unwritable_out_is_refused_before_any_measurement(tmp_path: Path, script) -> None:
    """--out is a results file, written at the end: a folder there is refused at once (it was
    an IsADirectoryError after all the measurements)."""
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "argument --out: " in proc.stderr and "is a folder" in proc.stderr, proc.stderr


def test_table1_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "table1.json"
    # Smallest grids the spectral decoders take; one thread, so 2 CI cores are not oversubscribed
    # (--threads, recorded)
    cmd = [sys.executable, str(BENCHMARKS / "table1.py"), "--device", "cpu", "--impls",
           "ours,ours_fft",
           "--attention", "galerkin,fourier", "--n", "32", "--darcy-fine", "24",
           "--darcy-coarse", "4", "--batch", "2", "--steps", "1", "--warmup", "1",
           "--repeats", "1", "--threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    assert not out.with_name(out.name + ".tmp").exists()
    result = json.loads(out.read_text())
    assert {"device", "torch", "command", "records"} <= set(result) and result["threads"] == 1
    records = result["records"]
    rows = [("burgers", "galerkin"), ("burgers", "fourier"), ("darcy", "galerkin"),
            ("darcy", "fourier")]
    assert [(r["model"], r["attention"], r["impl"]) for r in records] == [
        (*row, impl) for row in rows for impl in ("ours", "ours_fft")]
    for r in records:
        assert RECORD_KEYS <= set(r), RECORD_KEYS - set(r)
        assert r["batch"] == 2 and "note" not in r
        assert math.isfinite(r["it_per_s"]) and r["it_per_s"] > 0
        assert r["peak_mem_mb"] is None  # measured on CUDA only
        assert r["command"] == result["command"] and "table1.py" in r["command"]
    assert [r["n"] for r in records] == [32] * 4 + [24 * 24] * 4
    assert [r["output_shape"] for r in records] == [[2, 32, 1]] * 4 + [[2, 24, 24, 1]] * 4
    assert "ours" in proc.stdout and "it/s" in proc.stdout  # the printed table


def test_dropout_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "dropout.json"
    cmd = [sys.executable, str(BENCHMARKS / "dropout_cpu.py"), "--reps", "1", "--steps", "1",
           "--step-reps", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text())
    assert [r["shape_name"] for r in result["rows"]] == [
        "down_85", "down_141", "tokens_29", "ffn_29", "tokens_43", "ffn_43"]
    for r in result["rows"]:
        assert all(r[f"{impl}_{t}_ms"] > 0 for impl in ("torch", "ours")
                   for t in ("fwd", "fwd_bwd"))
    assert [r["model"] for r in result["training_steps"]] == [
        "darcy_gt", "darcy_ft", "darcy_tno", "darcy_tno_no_attn", "darcy_vitno"]
    assert all(r[f"{impl}_step_ms"] > 0 for r in result["training_steps"]
               for impl in ("torch", "ours"))


def test_table1_compiled_smoke(tmp_path: Path) -> None:
    """ours_compiled: the model through torch.compile (compiled in the warm-up step)."""
    out = tmp_path / "table1.json"
    cmd = [sys.executable, str(BENCHMARKS / "table1.py"), "--device", "cpu", "--impls",
           "ours_compiled", "--models", "burgers", "--attention", "galerkin", "--n", "32",
           "--batch", "2", "--steps", "1", "--warmup", "1", "--repeats", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    (record,) = json.loads(out.read_text())["records"]
    assert record["impl"] == "ours_compiled" and record["it_per_s"] > 0
    assert record["output_shape"] == [2, 32, 1]


def test_spectral_cpu_smoke(tmp_path: Path) -> None:
    """Both paths timed on a small square grid and a line; each row names the rule's pick."""
    out = tmp_path / "spectral.json"
    cmd = [sys.executable, str(BENCHMARKS / "spectral_cpu.py"), "--sizes", "12",
           "--lines", "30", "40", "--reps", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    rows = json.loads(out.read_text())["rows"]
    # 12²: modes 4 (K = 4) and the 6 it resolves at most; the lines: K = 16 (2 K < p2 at 40 only)
    assert [(r["p1"], r["p2"], r["K"]) for r in rows] == [(12, 12, 4), (12, 12, 6), (1, 30, 16),
                                                          (1, 40, 16)]
    assert [r["rule"] for r in rows] == ["matmul", "fft", "fft", "matmul"]
    for r in rows:
        assert all(r[f"{path}_{t}_ms"] > 0 for path in ("fft", "matmul")
                   for t in ("fwd", "fwd_bwd"))
    bad = subprocess.run([sys.executable, str(BENCHMARKS / "spectral_cpu.py"), "--sizes", "0",
                          "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--sizes" in bad.stderr


def test_spectral_cpu_times_the_line_paths_of_spectral_conv_1d(monkeypatch, gen):
    """On the lines the FFT path timed is SpectralConv1d's own (rfft/irfft, not the 2-D one over
    a grid of one row, twice as slow); both paths give its product."""
    bench = _load_benchmark("spectral_cpu", monkeypatch)
    from galerkin_ext.layers import fourier
    x = torch.randn(2, 1, 40, 3, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 4, 1, 16, generator=gen, dtype=torch.complex128)
    expected = fourier.spectral_product_1d(x[:, 0], w[:, :, 0], "ortho")
    for path in bench.LINE_PATHS.values():
        torch.testing.assert_close(path(x, w), expected)
    calls = []
    monkeypatch.setattr(fourier, "_spectral_product_fft", lambda *a: calls.append(a))
    bench.LINE_PATHS["fft"](x, w)
    assert not calls


def test_burgers_stability_smoke(tmp_path: Path) -> None:
    from galerkin_ext.data import generate_burgers

    data = generate_burgers(tmp_path / "b.h5", n_samples=12, resolution=256,
                            solve_resolution=64, progress=False)
    out = tmp_path / "stability.json"
    cmd = [sys.executable, str(BENCHMARKS / "burgers_stability.py"), "--data", str(data),
           "--n", "64", "--epochs", "2", "--n-train", "8", "--n-eval", "4", "--batch-size", "4",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text())
    assert [a["arm"] for a in result["arms"]] == ["raw", "scaled"]
    raw, scaled = result["arms"]
    assert raw["output_scale"] == 1.0 and 0 < scaled["output_scale"] < 1
    for arm in (raw, scaled):
        assert [r["epoch"] for r in arm["epochs"]] == [1, 2]
        for r in arm["epochs"]:
            assert all(math.isfinite(r[k]) and r[k] > 0 for k in (
                "lr", "train_loss", "train_loss_max", "grad_norm_median", "grad_norm_max",
                "pred_over_target_norm", "eval_rel_l2"))
    # same initial weights and batches: the arms differ only by the output scale
    assert raw["epochs"][0]["lr"] == scaled["epochs"][0]["lr"]
    bad = subprocess.run([*cmd[:2], "--arms", "raw,other", "--out", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--arms" in bad.stderr
    # settings the schedule or the data cannot take are refused before any training
    for change, message in ((("--epochs", "101"), "--epochs: at most the schedule's 100"),
                            (("--batch-size", "9"), "--batch-size: at most the 8 training"),
                            (("--n", "100"), "error: resolution")):
        args = list(cmd[2:])
        args[args.index(change[0]) + 1] = change[1]
        bad = subprocess.run([*cmd[:2], *args], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr[-2000:]
        assert "Traceback" not in bad.stderr, bad.stderr[-2000:]


def test_domain_parallel_smoke(tmp_path: Path) -> None:
    out = tmp_path / "domain.json"
    cmd = [sys.executable, str(BENCHMARKS / "domain_parallel.py"), "--n", "8,32", "--heads", "1",
           "--head-dim", "2", "--coordinates", "1", "--warmup", "0", "--repeats", "1",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text())
    assert "1 of" in result["device"]  # the workers' one thread, not the parent's count
    records = result["records"]
    assert [(r["op"], r["N"], r["world_size"]) for r in records] == [
        ("galerkin", 8, 2), ("normalized", 8, 2), ("galerkin", 32, 2), ("normalized", 32, 2)]
    # (B H d d_v numbers each way, float64; plus Galerkin's point count and each form's flag
    # for whether this rank's keys have weights)
    assert [r["bytes_per_layer"] for r in records] == [2 * 9 * 8 + 16, 2 * 12 * 8 + 8] * 2
    for r in records:
        assert r["bytes_independent_of_N"] and r["comm_ms"] >= 0 and r["compute_ms"] > 0
        assert r["max_abs_diff_out"] <= 1e-12 and r["max_abs_diff_grad"] <= 1e-12


def _fake_run(folder: Path, config: dict, test: float, last: float, **keys) -> Path:
    folder.mkdir(parents=True)
    history = [{"epoch": 1, "eval_rel_l2": test}, {"epoch": 2, "eval_rel_l2": last}]
    metrics = {"test_rel_l2": test, "best_epoch": 1, "epochs": 2, "train_seconds": 120.0,
               "config": config, "history": history, **keys}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def test_paper_runs_records_and_table(tmp_path: Path) -> None:
    results = tmp_path / "paper_runs.json"
    script = [sys.executable, str(BENCHMARKS / "paper_runs.py"), "--results", str(results)]
    protocol = {"n_train": 1024, "n_eval": 100}  # SPEC §5's, with the batch of 1-D or 2-D
    schedule = {"epochs": 100, "batch_size": 8, "max_lr": 1e-3, "div_factor": 1e4,
                "final_div_factor": 1e4, "pct_start": 0.2, "grad_clip": 0.999, "seed": 0}
    burgers = {"preset": "paper", "n": 512, **protocol, "train": schedule,
               "model": {"attention_type": "galerkin", "norm": "attn"}}
    schedule_2d = {**schedule, "batch_size": 4, "pct_start": 0.3}
    protocol_2d = {**protocol, "train": schedule_2d}
    inverse = {"preset": "paper", "fine": 141, "coarse": 36, "noise": 0.01, **protocol,
               # (the script's peak rate for Fourier attention in 2-D)
               "train": {**schedule_2d, "max_lr": 5e-4},
               "model": {"attention_type": "fourier", "norm": "attn",
                         "reference_dropout": True}}
    gt = _fake_run(tmp_path / "gt", burgers, 2.406e-3, 2.5e-3, command="python x.py",
                   device_name="cpu model")
    gt2048 = _fake_run(tmp_path / "gt2048", {**burgers, "n": 2048}, 1e-3, 1e-3,
                       command="python x.py", device_name="cpu model")
    inv = _fake_run(tmp_path / "inv", inverse, 3e-2, 3.1e-2)
    # an FNO row (--model fno records an empty model config): "only n_c" of the inverse table
    fno = _fake_run(tmp_path / "fno", {"preset": "paper", "fine": 36, "coarse": 36,
                                       "noise": 0.1, **protocol_2d, "model": {},
                                       "model_choice": "fno"},
                    0.173, 0.18, command="python f.py", device_name="gpu")
    # the Darcy FNO (no coarse grid) is set beside the paper's row of its fine grid
    darcy_fno = _fake_run(tmp_path / "dfno", {"preset": "paper", "fine": 141, "coarse": None,
                                              **protocol_2d, "model": {},
                                              "model_choice": "fno"},
                          1.5e-2, 1.5e-2, command="python d.py", device_name="gpu")
    for cmd in ([*script, "add", str(darcy_fno)],
                [*script, "add", str(gt2048)],
                [*script, "add", str(gt)],
                [*script, "add", str(inv), "--command", "python y.py", "--device", "gpu"],
                [*script, "add", str(fno)],
                [*script, "add", str(gt), "--replace"]):  # the same run replaces its record
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    # ... only when asked; and a run of another preset, or one cut down by its flags (it was
    # recorded as the paper's protocol, 837x the paper's figure), is never recorded
    quick = _fake_run(tmp_path / "quick", {**burgers, "preset": "quick"}, 0.8, 0.8,
                      command="python z.py", device_name="cpu")
    smoke = _fake_run(tmp_path / "smoke", {**burgers, "n_train": 8,
                                           "train": {**schedule, "epochs": 1}}, 1.0, 1.0,
                      command="python z.py", device_name="cpu")
    # another schedule or arithmetic (it was recorded as the paper's protocol, 4.16x its figure)
    faster = _fake_run(tmp_path / "faster", {**burgers, "train": {
        **schedule, "max_lr": 1e-2, "precision": "bf16"}}, 5e-3, 5e-3, command="python z.py",
        device_name="cpu")
    for cmd, message in (([*script, "add", str(gt)], "already holds burgers, galerkin, attn, "
                                                      "n=512, False (2.406e-03 after 2 epochs"),
                         ([*script, "add", str(quick), "--replace"], "preset 'quick'"),
                         ([*script, "add", str(smoke), "--replace"],
                          "not the paper's protocol (n_train 8 (the paper's 1024), "
                          "train.epochs 1 (the paper's 100))"),
                         ([*script, "add", str(faster), "--replace"],
                          "not the paper's protocol (train.max_lr 0.01 (the paper's 0.001), "
                          "train.precision bf16 (the paper's fp32))")):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    records = json.loads(results.read_text())
    assert len(records) == 5
    r = next(r for r in records if r["attention"] == "fno" and r["experiment"] == "darcy")
    assert (r["setting"], r["paper_rel_l2"]) == ("141/43", 1.419e-2)
    r = next(r for r in records if r["attention"] == "fno" and r["experiment"] != "darcy")
    assert (r["norm"], r["setting"], r["paper_rel_l2"]) == (None, "36/36, eps=0.1", 1.730e-1)
    by_experiment = {r["experiment"]: r for r in records
                     if r["attention"] != "fno" and r["setting"] != "n=2048"}
    r = by_experiment["burgers"]
    assert (r["attention"], r["norm"], r["setting"], r["reference_dropout"]) == (
        "galerkin", "attn", "n=512", False)
    assert r["paper_rel_l2"] == 1.203e-3 and math.isclose(r["ratio_to_paper"], 2.0, rel_tol=1e-3)
    assert (r["test_rel_l2"], r["last_epoch_rel_l2"], r["command"], r["device"]) == (
        2.406e-3, 2.5e-3, "python x.py", "cpu model")
    r = by_experiment["darcy_inverse"]
    assert (r["setting"], r["paper_rel_l2"], r["reference_dropout"], r["device"]) == (
        "141/36, eps=0.01", 2.717e-2, True, "gpu")
    table = subprocess.run([*script, "table"], capture_output=True, text=True, timeout=60)
    assert "| burgers | galerkin | n=512 | 1.203e-03 | 2.406e-03 (2.00×) (epoch 1) |" in (
        table.stdout)
    # settings in the paper's order, by their numbers: n=512 before n=2048
    assert table.stdout.index("| n=512 |") < table.stdout.index("| n=2048 |")
    # a run without a recorded command must be given one
    bad = subprocess.run([*script, "add", str(inv)], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--command" in bad.stderr


def test_example_runs_are_reused_only_for_the_same_command(tmp_path: Path, monkeypatch):
    """darcy_budget.py and gnot_claims.py tabulate a folder's earlier run only when the same
    command (apart from --out) made it: a run of another preset is refused, not tabulated."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import example_runs

    out = tmp_path / "run"
    out.mkdir()
    command = ["python", "examples/heat.py", "--preset", "quick", "--no-progress", "--out",
               str(out)]
    made_by = shlex.join([*command[:-1], "runs/elsewhere"])
    (out / "metrics.json").write_text(json.dumps({"command": made_by, "test_rel_l2": 0.5}))
    assert example_runs.run_example(command, out, check=True)["test_rel_l2"] == 0.5
    with pytest.raises(SystemExit, match="holds a run of .*--preset quick.*not of .*paper"):
        example_runs.run_example([*command[:3], "paper", *command[4:]], out, check=True)


def test_gnot_claims_refined_errors(tmp_path: Path, monkeypatch) -> None:
    """The refined-set analysis of gnot_claims.py on a one-epoch elasticity run: the refined
    solve moves the targets at the kept vertices, a barely trained mesh-weighted model does not
    move its predictions, and a file of other geometries is refused."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(BENCHMARKS.parent / "examples" / "elasticity.py"), "--data-dir",
           str(tmp_path / "cache"), "--n-train", "2", "--n-eval", "2", "--epochs", "1",
           "--batch-size", "2", "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "metrics.json").read_text())["config"]
    claims = _load_benchmark("gnot_claims", monkeypatch)
    record = {"out": str(out), "config": config}

    refined = generate_elasticity(tmp_path / "refined.h5", refine=True, progress=False,
                                  **config["data"])
    errors = claims.refined_errors(record, refined)
    assert all(math.isfinite(v) for v in errors.values())
    assert errors["refined_target_shift"] > 1e-2  # the refined solve resolves the cavity better
    assert errors["refined_prediction_shift"] < 1e-2  # quadrature: O(h²) at initialisation
    assert errors["refined_rel_l2"] > 0

    other = generate_elasticity(tmp_path / "other.h5", refine=True, progress=False,
                                **{**config["data"], "seed": config["data"]["seed"] + 1})
    with pytest.raises(RuntimeError, match="does not start with the base mesh's vertices"):
        claims.refined_errors(record, other)


def test_complexity_table(tmp_path: Path) -> None:
    """benchmarks/complexity.py counts every model at 416² on the meta device, and reproduces
    the committed table (counting computes nothing, so it is exact)."""
    out = tmp_path / "complexity.json"
    cmd = [sys.executable, str(BENCHMARKS / "complexity.py"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())["records"]
    committed = json.loads((BENCHMARKS / "results" / "complexity.json").read_text())["records"]
    assert records == committed
    by = {(r["model"], r["width"]): r for r in records}
    assert by["ViT NO", 128]["parameters"] == 716_417 and by["FANO", 128]["parameters"] == (
        48_084_865)  # SPEC-continuum §2
    for width in (32, 64, 96, 128):  # quadratic attention over 416² points dwarfs the rest
        assert by["TNO", width]["forward_flops"] > 100 * by["ViT NO", width]["forward_flops"]
        # the paper's Table 4: lift (d_u + d) d, 6 layers of 6 d^2 + 2 d (feed-forward d -> d
        # -> d), projection d d_z; plus the biases and norms it omits (d_u = d_z = 1, d = 2)
        d = width
        table4 = 3 * d + 6 * (6 * d * d + 2 * d) + d
        assert by["TNO", width]["parameters"] == table4 + d + 6 * (8 * d) + 1


def test_data_generation_records_what_it_compared_and_keeps_existing_files(tmp_path: Path):
    keep, out = tmp_path / "keep", tmp_path / "generation.json"
    cmd = [sys.executable, str(BENCHMARKS / "data_generation.py"), str(out), "--problem",
           "burgers", "--burgers-samples", "2", "--keep", str(keep)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    checks = json.loads(out.read_text())["burgers"]["checks"]
    assert checks["truncated_vs_full_samples"] == 2  # the file's 2 samples, not the 4 asked
    assert checks["truncated_vs_full_solve_max_rel_diff"] < 1e-6
    kept = (keep / "burgers.h5").read_bytes()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode != 0 and "--keep" in again.stderr and "exist" in again.stderr
    assert (keep / "burgers.h5").read_bytes() == kept
    # its positional output is checked at once too, not after the generation
    folder = subprocess.run([*cmd[:2], str(tmp_path), *cmd[3:]], capture_output=True,
                            text=True, timeout=60, env=env)
    assert folder.returncode == 2 and "is a folder" in folder.stderr, folder.stderr


def test_attention_cpu_smoke(tmp_path: Path) -> None:
    """benchmarks/attention.py at the host-cost shape, one repetition: a record per op and
    implementation, with the device and command."""
    out = tmp_path / "attention.json"
    # (blanks and repeats in the lists: an unknown op, and every row measured twice, before)
    cmd = [sys.executable, str(BENCHMARKS / "attention.py"), "--shapes", "host,host", "--reps",
           "1", "--impls", "ours, eager,ours", "--threads", "1", "--out", str(out)]
    # (about 50 s on idle cores, most of it the 12 fresh processes that measure the peak
    # memory, each importing torch; 120 s ran out on busy ones)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert {"device", "command", "rows"} <= set(result) and "attention.py" in result["command"]
    assert result["threads"] == 1
    # an empty list measured nothing and wrote a file of no rows, exit 0
    for flag in ("--impls", "--ops"):
        empty = subprocess.run([*cmd[:2], flag, " ,", "--out", str(tmp_path / "e.json")],
                               capture_output=True, text=True, timeout=60)
        assert empty.returncode == 2 and f"{flag}: expected a comma list" in empty.stderr
    assert sorted((r["op"], r["impl"]) for r in result["rows"]) == [
        (op, impl) for op in ("continuum_dropout", "fourier", "fourier_dropout", "galerkin",
                              "galerkin_no_norm", "normalized")
        for impl in ("eager", "ours")]
    for r in result["rows"]:
        assert (r["B"], r["H"], r["N"], r["D"]) == (1, 1, 16, 8)
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("fwd_ms", "fwd_bwd_ms")), r


def _load_benchmark(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # its sibling example_runs.py
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_benchmarks_record_the_device_and_tabulate(tmp_path: Path, monkeypatch):
    """darcy_budget.py and gnot_claims.py record each run's device (from its metrics.json);
    darcy_budget.py --table prints a results file without any run folder."""
    budget = _load_benchmark("darcy_budget", monkeypatch)
    run = tmp_path / "tno_quick"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({
        "epochs": 2, "config": {"n_train": 400}, "test_rel_l2_median": 0.07,
        "test_rel_l2_median_normalized": 0.12, "zero_shot": {"s=64": {"rel_l2_median": 0.08}},
        "n_params": 17249, "train_seconds": 100.0, "device_name": "cpu model"}))
    (run / "metrics.csv").write_text("epoch,train_loss,eval_rel_l2\n1,0.5,0.3\n2,0.2,0.1\n")
    (run / "made_at.json").write_text(json.dumps({"commit": "abc1234"}))
    record = budget.record(run, "tno", "quick", 2, ["python", "examples/darcy_continuum.py",
                                                    "--seed", "2", "--out", str(run)])
    assert record["device"] == "cpu model" and record["valid_rel_l2"] == 0.1
    assert record["commit"] == "abc1234" and record["seed"] == 2
    assert record["command"] == "python examples/darcy_continuum.py --seed 2"
    results = tmp_path / "budget.json"
    results.write_text(json.dumps({"runs": [record]}))
    script = [sys.executable, str(BENCHMARKS / "darcy_budget.py")]
    proc = subprocess.run([*script, "--table", "--out", str(results)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    row = "| tno | 17,249 | quick (400 samples, 2 epochs) | 2 | 7.00e-02 | 1.20e-01 |"
    assert row in proc.stdout
    for args, message in ((["--out", str(results)], "--runs: required"),
                          (["--table", "--out", str(tmp_path / "none.json")], "no results file")):
        bad = subprocess.run([*script, *args], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr

    claims = _load_benchmark("gnot_claims", monkeypatch)
    script_name, flags = claims.RUNS["heat_gnot"]
    out = tmp_path / "runs" / "heat_gnot"
    out.mkdir(parents=True)
    made_by = ["python", f"examples/{script_name}", "--preset", "quick", *flags, "--no-progress",
               "--out", str(out)]
    (out / "metrics.json").write_text(json.dumps({  # reused: the same command made it
        "command": shlex.join(made_by), "test_rel_l2": 0.05, "best_epoch_rel_l2": 0.04,
        "n_params": 10, "train_seconds": 1.0, "device_name": "gpu model", "config": {}}))
    assert claims.run("heat_gnot", tmp_path / "runs", "quick")["device"] == "gpu model"


def test_gpu_session_stops_without_a_gpu(tmp_path: Path) -> None:
    """Without nvidia-smi the GPU session went on to reinstall the package (an editable install
    too) for a CUDA build; it now stops in one line before the build."""
    bin_dir = tmp_path / "bin"  # a PATH with bash and coreutils but no nvidia-smi
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mkdir", "tail", "cat", "timeout", "python3"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    proc = subprocess.run(["bash", str(BENCHMARKS / "gpu_session.sh")], capture_output=True,
                          text=True, timeout=60,
                          env={"PATH": str(bin_dir), "OUT": str(tmp_path / "out"),
                               "STAGES": "tests"})
    assert proc.returncode == 1 and "gpu_session.sh: no NVIDIA GPU here" in proc.stderr
    assert not (tmp_path / "out" / "build.log").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["paper_runs.py", "--results", "{tmp}/none.json", "table"],
     "--results: no such file"),
    (["paper_runs.py", "--results", "{tmp}/foreign.json", "table"],
     "is not a file of paper_runs.py's records"),
    (["darcy_budget.py", "--table", "--out", "{tmp}/other.json"],
     "is not a results file of this script"),
    (["quick_presets.py", "--table", "--out", "{tmp}/none.json"], "--out: no results file"),
    # another script's runs (a KeyError before)
    (["quick_presets.py", "--table", "--out", "{tmp}/foreign.json"],
     "is not a results file of this script"),
    (["quick_presets.py", "--out", "{tmp}/q.json"], "--runs: required"),
    (["burgers_stability.py", "--data", "{tmp}/none.h5", "--out", "{tmp}/b.json"],
     "error: --data: "),
    (["burgers_stability.py", "--arms", "raw,raw", "--out", "{tmp}/b.json"],
     "--arms: expected a comma-separated subset"),
    (["burgers_stability.py", "--n", "16", "--out", "{tmp}/b.json"],
     "--n: x: 16 points give 9 Fourier modes, fewer than modes = 16; expected n >= 30"),
    (["data_generation.py", "{tmp}/d.json", "--keep", "{tmp}/other.json"],
     "--keep: cannot make the folder"),
])
def test_benchmark_arguments_are_refused_in_one_line(tmp_path: Path, args, message) -> None:
    """A mistyped path or a repeated arm: a traceback, an empty table read as "no records", or
    an arm trained twice before; now one line naming the flag, and nothing run."""
    (tmp_path / "other.json").write_text('{"records": []}')
    (tmp_path / "foreign.json").write_text('{"runs": [{"name": "heat", "test_rel_l2": 0.1}]}')
    cmd = [sys.executable, str(BENCHMARKS / args[0]),
           *(a.format(tmp=tmp_path) for a in args[1:])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_runs_folders_are_the_callers(tmp_path: Path, monkeypatch) -> None:
    """darcy_budget/gnot_claims run the examples from the repository root: a relative --runs
    put their runs in the source tree, and the metrics were then looked for in the caller's
    folder. The folder is now made absolute where it is parsed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_runs", BENCHMARKS / "example_runs.py")
    example_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example_runs)
    monkeypatch.chdir(tmp_path)
    assert example_runs.runs_folder("runs/x") == tmp_path.resolve() / "runs" / "x"
    for script in ("darcy_budget.py", "gnot_claims.py"):
        assert '"--runs", type=runs_folder' in (BENCHMARKS / script).read_text(), script


def test_quick_presets_time_run_and_reuse(tmp_path: Path, monkeypatch, capsys) -> None:
    """quick_presets.py records a run's wall time, commit and the data it generated, reuses the
    run afterwards (without running it again), tabulates a missed threshold as missed, and
    fails the set, as the examples fail, only for a missed threshold that was enforced."""
    quick = _load_benchmark("quick_presets", monkeypatch)
    script = tmp_path / "fake_example.py"
    text = (
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "os.makedirs(out, exist_ok=True)\n"
        "with open(os.path.join(os.environ['GALERKIN_EXT_CACHE'], 'set.h5'), 'w') as f:\n"
        "    f.write('data')\n"
        "with open(os.path.join(out, 'metrics.json'), 'w') as f:\n"
        "    json.dump({'command': 'python ' + ' '.join(sys.argv), 'test_rel_l2': 0.25,\n"
        "               'train_seconds': 3.0, 'epochs': 2, 'n_params': 1234,\n"
        "               'device_name': 'cpu model', 'thresholds': {'enforced':\n"
        "               '--reported' not in sys.argv, 'checks':\n"
        "               {'test_rel_l2': {'value': 0.25, 'threshold': 0.2, 'met': False}}}}, f)\n"
        "sys.exit(1)  # a missed threshold, as the examples exit\n")
    script.write_text(text)
    monkeypatch.setattr(quick, "PRESETS", {"fake": [str(script)]})
    monkeypatch.setenv("GALERKIN_EXT_CACHE", str(tmp_path / "elsewhere"))  # restored after
    runs = tmp_path / "runs"
    first = quick.measure("fake", runs)
    assert first["wall_seconds"] > 0 and first["generated_data"] == ["set.h5"]
    assert first["device"] == "cpu model" and first["test_rel_l2"] == 0.25
    assert first["commit"] == quick.run_example.__globals__["commit"]()  # the one it ran at
    assert not first["thresholds"]["test_rel_l2"]["met"]
    script.write_text("raise SystemExit('ran again')\n")  # a reuse must not run it
    assert quick.measure("fake", runs) == first
    line = quick.table([first]).splitlines()[-1]
    assert line.startswith("| fake | 1,234 | 2 | ") and "(data made)" in line
    assert "test_rel_l2 2.50e-01 ≤ 0.2 MISSED" in line

    # the whole set: a missed threshold that is only reported does not fail it
    monkeypatch.setattr(quick, "PRESETS", {"fake": [str(script)],
                                           "reported": [str(script), "--reported"]})
    script.write_text(text)
    results = tmp_path / "quick.json"
    monkeypatch.setattr(sys, "argv", ["quick_presets.py", "--runs", str(runs), "--out",
                                      str(results)])
    assert quick.main() == 1  # fake's enforced threshold
    assert "thresholds missed: fake\n" in capsys.readouterr().err
    records = json.loads(results.read_text())["runs"]
    assert [r["thresholds_enforced"] for r in records] == [True, False]
    monkeypatch.setattr(quick, "PRESETS", {"reported": [str(script), "--reported"]})
    assert quick.main() == 0

    # a run under torchrun records its script's command line: it is reused all the same
    settings = quick.run_example.__globals__["_settings"]
    assert settings(["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "x.py",
                     "--a", "--out", "o"]) == settings(["python", "x.py", "--a", "--out", "p"])
