"""Original data sets converted to our files (galerkin_ext.data.convert): Geo-FNO's elasticity
arrays and GNOT's pickles (ragged files), the continuum-attention paper's Darcy .mat and
Navier-Stokes .pt files (grids), on small data of their layouts."""

import datetime
import json
import os
import pickle
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
import torch

from galerkin_ext.data import (
    GEOFNO_ELASTICITY,
    GNOT_PICKLE,
    ContinuumDarcyDataset,
    KolmogorovDataset,
    RaggedDataset,
    convert_continuum_darcy,
    convert_continuum_navier_stokes,
    convert_geofno_elasticity,
    convert_gnot_pickle,
    generate_darcy,
    generate_kolmogorov,
    inspect_h5,
    read_h5,
)
from galerkin_ext.data.__main__ import main
from galerkin_ext.data.ragged import read_header, read_ragged
from galerkin_ext.data.storage import DataFileError, partial_path


def geofno_arrays(tmp_path, n_points=7, n_samples=5, seed=0):
    """XY (N, 2, S), sigma (N, S) and rr (42, S) in .npy files, float32 as Geo-FNO's."""
    rng = np.random.default_rng(seed)
    arrays = {"xy": rng.random((n_points, 2, n_samples)),
              "sigma": rng.random((n_points, n_samples)) + 0.5,
              "rr": 0.2 + 0.2 * rng.random((42, n_samples))}
    paths = {}
    for name, value in arrays.items():
        paths[name] = tmp_path / f"Random_UnitCell_{name}_10.npy"
        np.save(paths[name], value.astype(np.float32))
    return {k: v.astype(np.float32) for k, v in arrays.items()}, paths


def test_every_sample_keeps_its_points_stress_and_radii(tmp_path):
    arrays, paths = geofno_arrays(tmp_path)
    out = convert_geofno_elasticity(paths["xy"], paths["sigma"], tmp_path / "e.h5",
                                    rr=paths["rr"], progress=False)
    header = read_header(out)
    assert header["generator"] == GEOFNO_ELASTICITY and header["n_samples"] == 5
    data = read_ragged(out, np.arange(5), fields=("query", "target", "inputs", "theta"))
    for i in range(5):
        sample = data.sample(i)
        np.testing.assert_array_equal(sample["query"]["points"], arrays["xy"][:, :, i])
        np.testing.assert_array_equal(sample["target"][:, 0], arrays["sigma"][:, i])
        np.testing.assert_array_equal(sample["inputs"]["mesh"]["points"], arrays["xy"][:, :, i])
        np.testing.assert_array_equal(sample["theta"], arrays["rr"][:, i])
        assert sample["query"]["weights"] is None and sample["target_names"] == ["vm"]
    # the examples' dataset reads it, with uniform weights only (there is no mesh)
    split = dict(n_train=3, n_test=2, generator=("elasticity", GEOFNO_ELASTICITY),
                 dtype=torch.float64)
    test = RaggedDataset(out, "test", weights="uniform", **split)
    np.testing.assert_allclose(test.decode_target(test[1]["target"]).numpy()[:, 0],
                               arrays["sigma"][:, 4], rtol=1e-12)
    with pytest.raises(ValueError, match="weights: 'mesh' needs stored weights"):
        RaggedDataset(out, "test", weights="mesh", **split)


def test_command_line_and_refusals(tmp_path, capsys):
    arrays, paths = geofno_arrays(tmp_path, n_samples=3)
    out = tmp_path / "cli.h5"
    args = ["convert", "geofno-elasticity", "--xy", str(paths["xy"]), "--sigma",
            str(paths["sigma"]), "--out", str(out), "--no-progress"]
    assert main(args) == 0 and f"wrote {out}" in capsys.readouterr().out
    assert read_header(out)["layout"].theta_dim == 0
    assert main(args) == 1 and "exists" in capsys.readouterr().err  # never silently replaced
    assert main([*args, "--overwrite"]) == 0
    bad = tmp_path / "bad.npy"
    np.save(bad, arrays["sigma"][:, :2])
    with pytest.raises(ValueError, match=r"sigma: expected shape \(N, S\) = \(7, 3\)"):
        convert_geofno_elasticity(paths["xy"], bad, tmp_path / "x.h5", progress=False)
    np.save(bad, arrays["xy"][:, :1])
    with pytest.raises(ValueError, match=r"xy: expected shape \(N, 2, S\)"):
        convert_geofno_elasticity(bad, paths["sigma"], tmp_path / "x.h5", progress=False)
    with pytest.raises(FileNotFoundError, match="rr: no such file"):
        convert_geofno_elasticity(paths["xy"], paths["sigma"], tmp_path / "x.h5",
                                  rr=tmp_path / "missing.npy", progress=False)
    spoiled = arrays["sigma"].copy()
    spoiled[3, 2] = np.nan
    np.save(bad, spoiled)
    with pytest.raises(ValueError, match="sigma: sample 2 has non-finite values"):
        convert_geofno_elasticity(paths["xy"], bad, tmp_path / "x.h5", progress=False)
    # every sample is checked before the output is begun: nothing is left behind that a
    # rerun (which would refuse the same sample) must resume or overwrite
    assert not (tmp_path / "x.h5").exists() and not partial_path(tmp_path / "x.h5").exists()
    rerun = [*args[:5], str(bad), "--out", str(tmp_path / "x.h5"), "--no-progress"]
    assert main(rerun) == 1 and "sigma: sample 2" in capsys.readouterr().err
    np.save(bad, arrays["sigma"])
    assert main(rerun) == 0
    fixed = read_ragged(tmp_path / "x.h5", np.arange(3), fields=("target",))
    np.testing.assert_array_equal(fixed.target[:, 0], arrays["sigma"].T.reshape(-1))


def gnot_samples(rng, n=4):
    """[X, Y, theta, (f_1, f_2)] per sample as GNOT's code pickles them: sizes vary; f_1 has
    one value column, f_2 none (a shape given by its points)."""
    samples = []
    for _ in range(n):
        x = rng.random((int(rng.integers(5, 9)), 2))
        f1 = rng.random((int(rng.integers(2, 6)), 3))
        f2 = rng.random((int(rng.integers(1, 4)), 2))
        samples.append([x, rng.random((len(x), 2)), rng.random(3), (f1, f2)])
    return samples


def test_gnot_pickle_round_trip_and_refusals(tmp_path, capsys):
    rng = np.random.default_rng(1)
    samples = gnot_samples(rng)
    path = tmp_path / "heat.pkl"
    path.write_bytes(pickle.dumps(samples))
    with pytest.raises(ValueError, match="trust_pickle: unpickling runs code"):
        convert_gnot_pickle(path, tmp_path / "g.h5")
    out = convert_gnot_pickle(path, tmp_path / "g.h5", trust_pickle=True, progress=False)
    assert read_header(out)["generator"] == GNOT_PICKLE
    data = read_ragged(out, np.arange(4), fields=("query", "target", "inputs", "theta"))
    for i, (x, y, theta, (f1, f2)) in enumerate(samples):
        s = data.sample(i)
        np.testing.assert_array_equal(s["query"]["points"], x)
        np.testing.assert_array_equal(s["target"], y)
        np.testing.assert_array_equal(s["theta"], theta)
        np.testing.assert_array_equal(s["inputs"]["f1"]["points"], f1[:, :2])
        np.testing.assert_array_equal(s["inputs"]["f1"]["values"], f1[:, 2:])
        np.testing.assert_array_equal(s["inputs"]["f2"]["points"], f2)
        assert s["inputs"]["f2"]["values"] is None and s["target_names"] == ["y1", "y2"]
    ds = RaggedDataset(out, "test", n_train=3, n_test=1, weights="uniform",
                       generator=GNOT_PICKLE, dtype=torch.float64)
    assert ds.input_dims == [3, 2]
    # the command line asks for the trust explicitly
    args = ["convert", "gnot-pickle", "--file", str(path), "--out", str(tmp_path / "c.h5")]
    with pytest.raises(SystemExit):
        main(args)
    assert "--trust-pickle is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--trust-pickle", "--xy", str(path)])
    assert "--xy does not apply to gnot-pickle" in capsys.readouterr().err
    assert main([*args, "--trust-pickle", "--no-progress"]) == 0
    # a sample that does not fit is named
    for spoil, match in [
        (lambda s: s[2].__setitem__(1, s[2][1][:3]), r"sample 2: Y has 3 rows, X"),
        (lambda s: s[1].__setitem__(3, ()), "sample 1: expected the input functions as a "
                                            "non-empty list"),
        (lambda s: s[1].__setitem__(3, np.ones((2, 3))), r"got ndarray of shape \(2, 3\)"),
        (lambda s: s[2].__setitem__(2, [1.0, np.inf]), "sample 2: theta: has non-finite"),
        (lambda s: s[2].__setitem__(2, "abc"), "sample 2: theta: expected real numbers"),
        (lambda s: s[0][3][0].__setitem__((0, 0), np.nan), "sample 0: f1: has non-finite"),
        (lambda s: s.__setitem__(3, [s[3][0], s[3][1]]), r"sample 3: expected \[X, Y, theta"),
    ]:
        bad = gnot_samples(np.random.default_rng(1))
        spoil(bad)
        path.write_bytes(pickle.dumps(bad))
        with pytest.raises(ValueError, match=match):
            convert_gnot_pickle(path, tmp_path / "bad.h5", trust_pickle=True, progress=False)
        assert not partial_path(tmp_path / "bad.h5").exists()
    # a sample of another layout than sample 0 (f2 with a value column) is named up front
    bad = gnot_samples(np.random.default_rng(1))
    bad[3][3] = (bad[3][3][0], np.ones((2, 3)))
    path.write_bytes(pickle.dumps(bad))
    with pytest.raises(ValueError, match="sample 3"):
        convert_gnot_pickle(path, tmp_path / "bad.h5", trust_pickle=True, progress=False)
    assert not partial_path(tmp_path / "bad.h5").exists()
    # a file that is no pickle: one line from the command line, naming it
    path.write_bytes(b"not a pickle at all")
    assert main([*args, "--trust-pickle", "--no-progress", "--overwrite"]) == 1
    assert "heat.pkl' is not a readable pickle" in capsys.readouterr().err


def test_gnot_pickle_takes_no_theta_as_none_and_functions_as_one_array(tmp_path):
    rng = np.random.default_rng(2)
    samples = [[rng.random((5, 2)), rng.random((5, 1)), None, rng.random((2, 4, 3))]
               for _ in range(3)]
    path = tmp_path / "g.pkl"
    path.write_bytes(pickle.dumps(samples))
    out = convert_gnot_pickle(path, tmp_path / "g.h5", trust_pickle=True, progress=False)
    data = read_ragged(out, np.arange(3), fields=("query", "target", "inputs", "theta"))
    assert read_header(out)["layout"].theta_dim == 0
    for i, (_, _, _, functions) in enumerate(samples):
        s = data.sample(i)
        assert s["theta"] is None and list(s["inputs"]) == ["f1", "f2"]
        np.testing.assert_array_equal(s["inputs"]["f2"]["points"], functions[1][:, :2])
        np.testing.assert_array_equal(s["inputs"]["f2"]["values"], functions[1][:, 2:])


def test_a_resumed_conversion_reads_sources_of_the_same_content(tmp_path, monkeypatch):
    """The file records its sources' SHA-256, not their paths: another spelling of the same
    file resumes, while a source replaced since the interruption is refused, naming it (it
    gave a file of two sources' samples)."""
    import galerkin_ext.data.convert as convert

    arrays, paths = geofno_arrays(tmp_path, n_samples=120)
    write_ragged = convert.write_ragged

    def interrupted(out, sample_fn, **kwargs):  # stops after the first chunk is stored
        def sample(i):
            if i == 60:
                raise KeyboardInterrupt
            return sample_fn(i)
        return write_ragged(out, sample, **kwargs)

    for replace in (False, True):
        out = tmp_path / f"e{int(replace)}.h5"
        monkeypatch.setattr(convert, "write_ragged", interrupted)
        with pytest.raises(KeyboardInterrupt):
            convert_geofno_elasticity(paths["xy"], paths["sigma"], out, progress=False)
        monkeypatch.undo()
        assert partial_path(out).exists()
        if replace:
            np.save(paths["sigma"], arrays["sigma"][::-1].copy())
            with pytest.raises(DataFileError, match=r"its parameters \['sigma_sha256'\] are"):
                convert_geofno_elasticity(paths["xy"], paths["sigma"], out, resume=True,
                                          progress=False)
        else:
            monkeypatch.chdir(tmp_path)
            convert_geofno_elasticity(f"./{paths['xy'].name}", paths["sigma"].name, out,
                                      resume=True, progress=False)
            target = read_ragged(out, np.arange(120), fields=("target",)).target[:, 0]
            np.testing.assert_array_equal(target, arrays["sigma"].T.reshape(-1))


# -- the continuum-attention paper's grids ----------------------------------------------------


def matlab_darcy(tmp_path, coef, n=6, s=9):
    """A generated Darcy set and the same fields as the authors' .mat files hold them: x and y
    of MATLAB shape (s, s, N), written as v7.3 (HDF5, which stores MATLAB's axes reversed) and
    as v5."""
    source = generate_darcy(tmp_path / f"{coef}.h5", n, s, coef=coef, workers=1, progress=False)
    fields = read_h5(source, np.arange(n), keys=("a", "u"))
    x, y = (fields[k].transpose(1, 2, 0) for k in ("a", "u"))  # (s, s, N), x(i, j, n)
    with h5py.File(tmp_path / f"{coef}_v73.mat", "w") as f:
        f["x"], f["y"] = x.transpose(2, 1, 0), y.transpose(2, 1, 0)
    scipy.io.savemat(tmp_path / f"{coef}_v5.mat", {"x": x, "y": y})
    return source, fields


@pytest.mark.parametrize("coef", ["lognormal", "piecewise"])
def test_continuum_darcy_mat_files_convert_to_the_generated_arrays(tmp_path, coef):
    source, fields = matlab_darcy(tmp_path, coef)
    for version in ("v73", "v5"):
        out = convert_continuum_darcy(tmp_path / f"{coef}_{version}.mat",
                                      tmp_path / f"{version}.h5", chunk_size=4, progress=False)
        stored = read_h5(out, np.arange(6), keys=("a", "u"))
        for key in ("a", "u"):
            np.testing.assert_array_equal(stored[key], fields[key])
        info = inspect_h5(out)
        assert info["generator"] == "darcy" and info["parameters"]["coef"] == coef
        assert info["parameters"]["source"] == "continuum-attention Darcy .mat"
        expected = inspect_h5(source)["statistics"]  # what `info` prints, summed by chunks
        assert info["statistics"].keys() == expected.keys()
        for name, stats in expected.items():
            assert info["statistics"][name] == pytest.approx(stats, rel=1e-12), name
        data = ContinuumDarcyDataset(out, "train", n_train=4, n_valid=1, n_test=1)
        assert data.coef == coef and data.x.shape == (4, 9, 9, 1)
    # MATLAB single precision stays float32 from either version
    single = {k: v.astype(np.float32) for k, v in fields.items()}
    x, y = (single[k].transpose(1, 2, 0) for k in ("a", "u"))
    with h5py.File(tmp_path / "single_v73.mat", "w") as f:
        f["x"], f["y"] = x.transpose(2, 1, 0), y.transpose(2, 1, 0)
    scipy.io.savemat(tmp_path / "single_v5.mat", {"x": x, "y": y})
    for version in ("v73", "v5"):
        out = convert_continuum_darcy(tmp_path / f"single_{version}.mat",
                                      tmp_path / f"single_{version}.h5", progress=False)
        stored = read_h5(out, np.arange(6), keys=("a", "u"))
        for key in ("a", "u"):
            assert stored[key].dtype == np.float32, (version, key)
            np.testing.assert_array_equal(stored[key], single[key])


def test_continuum_darcy_statistics_of_values_float32_cannot_hold(tmp_path):
    """12.1 in float64 is not float32(12.1): the share of the high value came out 0."""
    rng = np.random.default_rng(0)
    x = np.where(rng.random((9, 9, 4)) < 0.4, 12.1, 1.0)
    scipy.io.savemat(tmp_path / "p.mat", {"x": x, "y": rng.random((9, 9, 4))})
    out = convert_continuum_darcy(tmp_path / "p.mat", tmp_path / "p.h5", progress=False)
    share = inspect_h5(out)["statistics"]["a_at_high"]
    assert share["mean"] == pytest.approx(float((x == 12.1).mean()), rel=1e-12)


def test_continuum_darcy_refusals(tmp_path, capsys):
    _, fields = matlab_darcy(tmp_path, "lognormal")
    x, y = (fields[k].transpose(1, 2, 0) for k in ("a", "u"))
    bad = tmp_path / "bad.mat"
    scipy.io.savemat(bad, {"x": x, "y": y[:, :, :4]})
    with pytest.raises(ValueError, match=r"variable 'y': expected the shape of 'x', \(6, 9, 9\)"):
        convert_continuum_darcy(bad, tmp_path / "o.h5", progress=False)
    scipy.io.savemat(bad, {"x": x})
    with pytest.raises(ValueError, match=r"lacks \['y'\]; it holds \['x'\]"):
        convert_continuum_darcy(bad, tmp_path / "o.h5", progress=False)
    scipy.io.savemat(bad, {"x": np.rint(x).astype(np.int32), "y": y})  # as from v7.3 files
    with pytest.raises(ValueError, match="variable 'x'.*expected real floating-point values"):
        convert_continuum_darcy(bad, tmp_path / "o.h5", progress=False)
    # damaged or foreign files: one line each, no traceback, from the command line too
    v73 = (tmp_path / "lognormal_v73.mat").read_bytes()
    for content, message in ((v73[:len(v73) // 2], "is not a readable MATLAB v7.3 file"),
                             (b"garbage", "is not a readable MATLAB file")):
        bad.write_bytes(content)
        assert main(["convert", "continuum-darcy", "--file", str(bad), "--out",
                     str(tmp_path / "o.h5"), "--no-progress"]) == 1
        assert message in capsys.readouterr().err
    # one sample: MATLAB stores (s, s, 1) as (s, s), in v5 and in v7.3 (HDF5, axes reversed)
    scipy.io.savemat(bad, {"x": x[:, :, 0], "y": y[:, :, 0]})
    one_v73 = tmp_path / "one_v73.mat"
    with h5py.File(one_v73, "w") as f:
        f["x"], f["y"] = x[:, :, 0].T, y[:, :, 0].T
    for source in (bad, one_v73):
        one = convert_continuum_darcy(source, tmp_path / f"{source.stem}.h5", progress=False)
        stored = read_h5(one, np.arange(1), keys=("a", "u"))
        np.testing.assert_array_equal(stored["a"][0], x[:, :, 0])
        np.testing.assert_array_equal(stored["u"][0], y[:, :, 0])
    # Darcy's equation needs a > 0: a piecewise +-1 coefficient was converted, and a lognormal
    # one with a -1 got NaN log a statistics; a constant one was recorded as 'lognormal'
    signs = np.where(x > np.median(x), 1.0, -1.0)
    spoiled = x.copy()
    spoiled[0, 0, 3] = -1.0
    for coefficient, message in ((signs, "variable 'x': sample 0 has a coefficient <= 0"),
                                 (spoiled, "variable 'x': sample 3 has a coefficient <= 0"),
                                 (np.full_like(x, 2.0), "variable 'x': every coefficient is 2")):
        scipy.io.savemat(bad, {"x": coefficient, "y": y})
        with pytest.raises(ValueError, match=message):
            convert_continuum_darcy(bad, tmp_path / "o.h5", progress=False)
    spoiled = y.copy()
    spoiled[2, 3, 4] = np.inf
    scipy.io.savemat(bad, {"x": x, "y": spoiled})
    with pytest.raises(ValueError, match="variable 'y': sample 4 has non-finite values"):
        convert_continuum_darcy(bad, tmp_path / "o.h5", progress=False)
    assert not (tmp_path / "o.h5").exists() and not partial_path(tmp_path / "o.h5").exists()
    out = tmp_path / "cli.h5"
    args = ["convert", "continuum-darcy", "--file", str(tmp_path / "lognormal_v73.mat"),
            "--out", str(out), "--no-progress"]
    assert main(args) == 0 and f"wrote {out}" in capsys.readouterr().out


def test_continuum_darcy_cli_refuses_axes(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["convert", "continuum-darcy", "--file", "f.mat", "--axes", "xy", "--out",
              str(tmp_path / "o.h5")])
    assert "--axes does not apply to continuum-darcy" in capsys.readouterr().err


@pytest.fixture(scope="module")
def kolmogorov_pairs(tmp_path_factory):
    """A generated Kolmogorov set (32^2, T = 1) and its pairs as the authors' .pt tensor
    (N, s, s, 2)."""
    folder = tmp_path_factory.mktemp("ns")
    source = generate_kolmogorov(folder / "k.h5", 12, 32, time=1.0, dt_out=0.1,
                                 solve_dtype="float32", progress=False)
    fields = read_h5(source, np.arange(12), keys=("input", "output"))
    return source, fields, torch.from_numpy(np.stack([fields["input"], fields["output"]], -1))


@pytest.mark.parametrize("transposed", [False, True])
def test_navier_stokes_pt_files_convert_with_x_and_y_found(tmp_path, kolmogorov_pairs,
                                                           transposed):
    """The forcing's mode tells y from x: a file with the axes swapped is put back, and the
    recorded physics re-solves each input to its stored target (the rollout's reference)."""
    source, fields, pairs = kolmogorov_pairs
    pt = tmp_path / "ns.pt"
    torch.save(pairs.transpose(1, 2).contiguous() if transposed else pairs, pt)
    out = convert_continuum_navier_stokes(pt, tmp_path / "ns.h5", time=1.0, chunk_size=5,
                                          progress=False)
    stored = read_h5(out, np.arange(12), keys=("input", "output"))
    for key in ("input", "output"):
        np.testing.assert_array_equal(stored[key], fields[key])
    info = inspect_h5(out)
    assert info["parameters"]["axes"] == ("yx" if transposed else "xy")
    # (the generator measures the CFL numbers on its float32 states, here they are float64)
    cfl = inspect_h5(source)["statistics"]["cfl"]
    assert info["statistics"]["cfl"]["mean"] == pytest.approx(cfl["mean"], rel=1e-6)
    data = KolmogorovDataset(out, "test", n_train=8, n_valid=0, n_test=4)
    target = data.target_normalizer.decode(data.target[..., 0]).double()
    step1 = data.reference_trajectories(1)[:, 0]
    assert float((step1 - target).norm() / target.norm()) < 1e-5
    # axes given: taken as they are (with a warning where the forcing says otherwise)
    with pytest.warns(UserWarning, match="along x") if transposed else nullcontext():
        kept = convert_continuum_navier_stokes(pt, tmp_path / "kept.h5", axes="xy", time=1.0,
                                               progress=False)
    swapped = read_h5(kept, np.arange(12), keys=("input",))["input"]
    np.testing.assert_array_equal(swapped, fields["input"].transpose(0, 2, 1) if transposed
                                  else fields["input"])


def test_navier_stokes_refusals(tmp_path, kolmogorov_pairs):
    _, _, pairs = kolmogorov_pairs
    pt = tmp_path / "bad.pt"
    out = tmp_path / "o.h5"
    cases = [
        (pairs[..., :1], r"expected a tensor \(N, s, s, 2\) of input and target vorticity"),
        (pairs.to(torch.float16), "expected float32 or float64 vorticity, got torch.float16"),
        ({"pairs": pairs}, "expected one tensor"),
        # isotropic noise: neither axis carries the forcing's mode
        (torch.randn(8, 32, 32, 2, generator=torch.Generator().manual_seed(0)),
         "axes='auto' cannot tell x from y"),
    ]
    for content, message in cases:
        torch.save(content, pt)
        with pytest.raises(ValueError, match=message):
            convert_continuum_navier_stokes(pt, out, progress=False)
    spoiled = pairs.clone()
    spoiled[5, 1, 2, 1] = float("nan")
    torch.save(spoiled, pt)
    with pytest.raises(ValueError, match=r"\[\.\.\., 1\]: sample 5 has non-finite values"):
        convert_continuum_navier_stokes(pt, out, progress=False)
    assert not out.exists() and not partial_path(out).exists()
    torch.save(torch.zeros(3, 8, 8, 2), pt)
    pt.write_bytes(pt.read_bytes()[:-100])  # truncated
    with pytest.raises(ValueError, match=r"is not a readable .pt tensor file \(\w+: "):
        convert_continuum_navier_stokes(pt, out, progress=False)
    # torch's own message for these advised unsafe loading (random bytes: since torch 2.6)
    for content in (b"not a torch file", datetime.date(2020, 1, 1)):
        if isinstance(content, bytes):
            pt.write_bytes(content)
        else:
            torch.save(content, pt)
        with pytest.raises(ValueError, match=r"a safe load \(torch.load\(weights_only=True\)\) "
                                             r"refuses its content; expected one tensor"):
            convert_continuum_navier_stokes(pt, out, progress=False)
    # torch's message for a .mat suggested loading it with weights_only=False
    scipy.io.savemat(tmp_path / "ns.mat", {"u": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="ns.mat' is a MATLAB or HDF5 file, expected a .pt"):
        convert_continuum_navier_stokes(tmp_path / "ns.mat", out, progress=False)
    # the legacy (non-zip) format, which cannot be memory-mapped, is read whole
    torch.save(pairs, pt, _use_new_zipfile_serialization=False)
    legacy = convert_continuum_navier_stokes(pt, tmp_path / "legacy.h5", time=1.0,
                                             progress=False)
    assert inspect_h5(legacy)["parameters"]["axes"] == "xy"
    # axes given against what the forcing shows: kept, with a warning
    with pytest.warns(UserWarning, match="axes='yx' given, but then the mean vorticity carries"):
        convert_continuum_navier_stokes(pt, tmp_path / "forced.h5", axes="yx", progress=False)
    with pytest.raises(ValueError, match="axes"):
        convert_continuum_navier_stokes(pt, out, axes="zz", progress=False)
    for convert in (convert_continuum_navier_stokes, convert_continuum_darcy):
        with pytest.raises(FileNotFoundError, match="^file: no such file"):
            convert(tmp_path / "missing", out, progress=False)
        with pytest.raises(TypeError, match="^file: expected a path"):
            convert(123, out, progress=False)


def test_converters_check_their_output_before_reading_the_source(tmp_path, kolmogorov_pairs):
    """A wrong ``out`` or flag used to be found only after the whole source was read and
    checked (or, for a bad sample, not at all: that sample was reported instead)."""
    pt = tmp_path / "pairs.pt"
    torch.save(kolmogorov_pairs[2], pt)
    pickled = tmp_path / "bad.pkl"
    pickled.write_bytes(pickle.dumps([[np.zeros((2, 2)), np.full((2, 1), np.nan), None,
                                       [np.zeros((2, 3))]]] * 4))
    (tmp_path / "done.h5").write_bytes(b"")
    for convert, source, kwargs in (
        (convert_continuum_navier_stokes, pt, {}),
        (convert_gnot_pickle, pickled, {"trust_pickle": True}),
    ):
        for out, flags, err, message in (
            (tmp_path / "o.txt", {}, ValueError, "out must name an HDF5 file"),
            (tmp_path / "o.h5", {"resume": True, "overwrite": True}, ValueError,
             "mutually exclusive"),
            (tmp_path / "done.h5", {}, FileExistsError, "already exists"),
            (tmp_path / "o.h5", {"overwrite": 1}, TypeError, "overwrite"),
            (tmp_path / "o.h5", {"progress": "no"}, TypeError, "progress"),
        ):
            with pytest.raises(err, match=message):
                convert(source, out, **kwargs, **flags)


def test_converted_darcy_file_trains_in_the_continuum_example(tmp_path, capsys):
    """`convert continuum-darcy` on the command line, then examples/darcy_continuum.py --data,
    which takes the coefficient's kind from the file (a piecewise one was refused unless
    --coef piecewise was given too, which the README's commands do not say)."""
    matlab_darcy(tmp_path, "piecewise", n=8)
    data = tmp_path / "authors.h5"
    assert main(["convert", "continuum-darcy", "--file", str(tmp_path / "piecewise_v73.mat"),
                 "--out", str(data), "--no-progress"]) == 0
    script = Path(__file__).resolve().parents[1] / "examples" / "darcy_continuum.py"
    out = tmp_path / "run"

    def run(*flags):
        return subprocess.run(
            [sys.executable, str(script), "--out", str(out), "--device", "cpu", "--no-progress",
             "--data", str(data), "--data-dir", str(tmp_path / "cache"), "--eval-resolution",
             "9", "--n-zero-shot", "2", "--n-train", "4", "--n-valid", "2", "--n-eval", "2",
             "--epochs", "1", "--batch-size", "2", *flags],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"})

    refused = run("--coef", "lognormal")
    assert refused.returncode == 2 and ("--coef: --data holds piecewise coefficients, got "
                                        "lognormal") in refused.stderr, refused.stderr[-2000:]
    proc = run()
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["data"]["coef"] == "piecewise"
    identity = metrics["config"]["data_identity"]["train"]
    assert identity["generator"] == "darcy"
    assert "continuum-attention Darcy .mat" in json.dumps(identity["parameters"])
