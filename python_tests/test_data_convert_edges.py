"""data/convert.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import hashlib
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
import torch
from test_data_convert import geofno_arrays, gnot_samples  # noqa: E402

from galerkin_ext.data import (
    convert_continuum_darcy,
    convert_continuum_navier_stokes,
    convert_geofno_elasticity,
    convert_gnot_pickle,
    read_h5,
)
from galerkin_ext.data.ragged import read_header
from galerkin_ext.data.storage import inspect_h5, partial_path
from galerkin_ext.models import from_original


def test_geofno_sources_that_are_not_npy_arrays_are_named(tmp_path):
    arrays, paths = geofno_arrays(tmp_path)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"these bytes are no array")
    archive = tmp_path / "archive.npz"  # np.load gave an archive object, then an AttributeError
    np.savez(archive, xy=arrays["xy"])
    for bad in (junk, archive):  # (numpy's own message spoke of pickles and allow_pickle)
        with pytest.raises(ValueError, match=rf"^sigma: '.*{bad.name}' is not a \.npy array "
                                             r"file \(it lacks the format's magic string\)$"):
            convert_geofno_elasticity(paths["xy"], bad, tmp_path / "o.h5", progress=False)
    ints = tmp_path / "ints.npy"
    np.save(ints, np.zeros((7, 2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=r"^xy: expected a real array of shape \(N, 2, S\), got "
                                         r"int64 \(7, 2, 5\)"):
        convert_geofno_elasticity(ints, paths["sigma"], tmp_path / "o.h5", progress=False)
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros(5))
    with pytest.raises(ValueError, match=r"^rr: expected a real array of shape \(42, S\)"):
        convert_geofno_elasticity(paths["xy"], paths["sigma"], tmp_path / "o.h5", rr=flat,
                                  progress=False)
    assert not (tmp_path / "o.h5").exists()


def test_geofno_radii_of_another_sample_count_are_refused(tmp_path):
    """Fewer radii than samples, and more: the first S columns of a longer rr would be stored
    as theta without a word, though they may be other samples' cavities."""
    arrays, paths = geofno_arrays(tmp_path)
    for count in (4, 6):
        radii = tmp_path / f"rr{count}.npy"
        np.save(radii, np.resize(arrays["rr"], (42, count)))
        with pytest.raises(ValueError, match=rf"^rr: expected shape \(p, S\) with S = 5 like xy, "
                                             rf"got \(42, {count}\)"):
            convert_geofno_elasticity(paths["xy"], paths["sigma"], tmp_path / "o.h5", rr=radii,
                                      progress=False)
    assert not (tmp_path / "o.h5").exists() and not partial_path(tmp_path / "o.h5").exists()


def test_geofno_non_finite_radii_are_named_as_rr(tmp_path):
    """The refusal names the argument and the sample, as for xy and sigma (the ragged writer's
    own check would speak of a 'theta' the caller never gave)."""
    arrays, paths = geofno_arrays(tmp_path)
    spoiled = arrays["rr"].copy()
    spoiled[10, 3] = np.inf
    np.save(paths["rr"], spoiled)
    with pytest.raises(ValueError, match=r"^rr: sample 3 has non-finite values$"):
        convert_geofno_elasticity(paths["xy"], paths["sigma"], tmp_path / "o.h5",
                                  rr=paths["rr"], progress=False)
    assert not partial_path(tmp_path / "o.h5").exists()


def test_geofno_file_records_the_sha256_of_each_whole_source(tmp_path):
    """What a resume compares: hashlib's SHA-256 of each source's bytes, rr's included, and of
    all its bytes (xy here spans more than the 1 MiB read block, so that a source changed past
    its first block is told apart too)."""
    _, paths = geofno_arrays(tmp_path, n_points=50_000, n_samples=3)
    assert paths["xy"].stat().st_size > 1 << 20
    out = convert_geofno_elasticity(paths["xy"], paths["sigma"], tmp_path / "o.h5",
                                    rr=paths["rr"], progress=False)
    recorded = read_header(out)["parameters"]
    for name in ("xy", "sigma", "rr"):
        assert recorded[f"{name}_sha256"] == hashlib.sha256(paths[name].read_bytes()).hexdigest()


def _pickle(tmp_path, samples):
    path = tmp_path / "data.pkl"
    path.write_bytes(pickle.dumps(samples))
    return path


@pytest.mark.parametrize("samples, match", [
    ([], r"^file: expected a non-empty list of samples, got list"),
    ({"a": 1}, r"^file: expected a non-empty list of samples, got dict"),
    ("abc", r"^file: expected a non-empty list of samples, got str"),
])
def test_a_pickle_that_holds_no_list_of_samples_is_refused(tmp_path, samples, match):
    with pytest.raises(ValueError, match=match):
        convert_gnot_pickle(_pickle(tmp_path, samples), tmp_path / "o.h5", trust_pickle=True,
                            progress=False)


def test_gnot_sample_fields_that_are_no_matrices_are_named(tmp_path):
    rng = np.random.default_rng(0)
    for change, match in (
        (lambda s: s.__setitem__(0, "abc"), r"sample 1: X: expected a real array, got str"),
        (lambda s: s.__setitem__(1, s[1][:, 0]), r"sample 1: Y: expected shape \(rows >= 1, "
                                                 r"columns\), got \(\d+,\)"),
        (lambda s: s.__setitem__(3, (s[3][0], s[3][1][:, :1])),
         r"sample 1: f2 has 1 columns, fewer than the 2 coordinates of X"),
    ):
        samples = gnot_samples(rng)
        change(samples[1])
        with pytest.raises(ValueError, match=match):
            convert_gnot_pickle(_pickle(tmp_path, samples), tmp_path / "o.h5", trust_pickle=True,
                                progress=False)
        assert not (tmp_path / "o.h5").exists()


def _fields(n=4, s=9):
    rng = np.random.default_rng(0)
    return 1.0 + rng.random((s, s, n)), rng.random((s, s, n))


def test_continuum_darcy_v73_without_y_is_refused(tmp_path):
    x, _ = _fields()
    with h5py.File(tmp_path / "d.mat", "w") as f:
        f["x"] = x.transpose(2, 1, 0)
        f["z"] = x.transpose(2, 1, 0)
    with pytest.raises(ValueError, match=r"d.mat' lacks \['y'\]; it holds \['x', 'z'\]"):
        convert_continuum_darcy(tmp_path / "d.mat", tmp_path / "o.h5", progress=False)


def test_continuum_darcy_fields_of_the_wrong_rank_or_shape_are_refused(tmp_path):
    x, y = _fields()
    scipy.io.savemat(tmp_path / "d4.mat", {"x": x[..., None], "y": y})
    with pytest.raises(ValueError, match=r"variable 'x': expected shape \(s, s, N\), got "
                                         r"\(9, 9, 4, 1\)"):
        convert_continuum_darcy(tmp_path / "d4.mat", tmp_path / "o.h5", progress=False)
    scipy.io.savemat(tmp_path / "rect.mat", {"x": x[:, :8], "y": y[:, :8]})
    with pytest.raises(ValueError, match=r"variable 'x' \(samples first\): expected N >= 1 square "
                                         r"fields of at least 3 x 3 points, got shape \(4, 9, 8\)"):
        convert_continuum_darcy(tmp_path / "rect.mat", tmp_path / "o.h5", progress=False)
    assert not (tmp_path / "o.h5").exists()


def _coef(tmp_path, x, y, **kw):
    scipy.io.savemat(tmp_path / "d.mat", {"x": x, "y": y})
    out = convert_continuum_darcy(tmp_path / "d.mat", tmp_path / "o.h5", progress=False, **kw)
    info = inspect_h5(out)
    return info["parameters"]["coef"], sorted(info["statistics"])


def test_continuum_darcy_coefficient_kind_is_decided_over_every_chunk(tmp_path):
    """Two distinct coefficient values in the whole file make it 'piecewise', more
    'lognormal': a first chunk of two values (samples 0 and 1) followed by one of many is
    lognormal; stopping the count at the first chunk's two values recorded 'piecewise' and
    the a_at_high statistic instead of log_a, silently."""
    x, y = _fields()
    x[..., :2] = np.where(x[..., :2] > 1.5, 12.0, 3.0)
    assert np.unique(x[..., :2]).tolist() == [3.0, 12.0]
    assert _coef(tmp_path, x, y, chunk_size=2) == ("lognormal", ["log_a", "u"])


def test_continuum_darcy_lognormal_in_one_chunk_is_lognormal(tmp_path):
    """A file converted in one chunk is lognormal where that chunk holds three distinct values
    or more: taking fewer than three of a chunk's values could never tell more than two apart,
    and recorded 'piecewise' for any one-chunk file."""
    x, y = _fields()
    assert _coef(tmp_path, x, y) == ("lognormal", ["log_a", "u"])
    two = np.where(x > 1.5, 12.0, 3.0)
    assert _coef(tmp_path, two, y, overwrite=True) == ("piecewise", ["a_at_high", "u"])


def test_continuum_darcy_names_a_non_finite_sample_by_its_index_in_the_file(tmp_path):
    """The source is scanned chunk by chunk: a non-finite value in sample 3 (the second of
    chunk 1, chunk_size 2) is named as sample 3, not by its place in its chunk (1)."""
    x, y = _fields()
    y[2, 3, 3] = np.nan
    scipy.io.savemat(tmp_path / "d.mat", {"x": x, "y": y})
    with pytest.raises(ValueError, match=r"variable 'y': sample 3 has non-finite values"):
        convert_continuum_darcy(tmp_path / "d.mat", tmp_path / "o.h5", chunk_size=2,
                                progress=False)


def test_continuum_darcy_refuses_a_zero_coefficient(tmp_path):
    """Darcy's equation needs a > 0: a = 0 on a cell makes the system singular there (and
    log a -inf), like the negative values refused beside it."""
    x, y = _fields()
    x[4, 5, 2] = 0.0
    scipy.io.savemat(tmp_path / "d.mat", {"x": x, "y": y})
    with pytest.raises(ValueError, match=r"variable 'x': sample 2 has a coefficient <= 0"):
        convert_continuum_darcy(tmp_path / "d.mat", tmp_path / "o.h5", progress=False)
    assert not partial_path(tmp_path / "o.h5").exists()


def _forced_pairs(s: int, dtype: torch.dtype) -> torch.Tensor:
    """Pairs (3, s, s, 2) whose mean carries the default forcing's mode 4 along y (axis 2),
    with a little noise: what axes='auto' reads as 'xy'."""
    g = torch.Generator().manual_seed(0)
    y = 2 * torch.pi * torch.arange(s, dtype=torch.float64) / s
    mean = torch.cos(4 * y).expand(s, s)[None, :, :, None]
    return (mean + 0.01 * torch.randn(3, s, s, 2, generator=g, dtype=torch.float64)).to(dtype)


def test_navier_stokes_grid_must_resolve_the_forcing(tmp_path):
    """The forcing cos(4 y) needs more than 8 points per axis (as generate_kolmogorov requires
    of its grid): an 8 x 8 file, whose mode 4 is the Nyquist mode, is refused, a 9 x 9 one
    converted."""
    pt = tmp_path / "ns.pt"
    torch.save(_forced_pairs(8, torch.float64), pt)
    with pytest.raises(ValueError, match=r"expected N >= 1 square fields of at least 9 x 9 "
                                         r"points, got shape \(3, 8, 8\)"):
        convert_continuum_navier_stokes(pt, tmp_path / "o.h5", progress=False)
    assert not partial_path(tmp_path / "o.h5").exists()
    torch.save(_forced_pairs(9, torch.float64), pt)
    out = convert_continuum_navier_stokes(pt, tmp_path / "o.h5", progress=False)
    assert inspect_h5(out)["parameters"]["resolution"] == 9


def test_navier_stokes_float32_pairs_stay_float32(tmp_path):
    """The file stores the source's dtype and records it as solve_dtype, the dtype the
    rollout's reference solves in: float32 pairs stay float32 (their values alone would not
    show a widening to float64)."""
    pairs = _forced_pairs(9, torch.float32)
    torch.save(pairs, tmp_path / "ns.pt")
    out = convert_continuum_navier_stokes(tmp_path / "ns.pt", tmp_path / "o.h5", progress=False)
    assert inspect_h5(out)["parameters"]["solve_dtype"] == "float32"
    stored = read_h5(out, np.arange(3), keys=("input", "output"))
    for key, channel in (("input", 0), ("output", 1)):
        assert stored[key].dtype == np.float32
        np.testing.assert_array_equal(stored[key], pairs[..., channel].numpy())


def test_from_original_names_the_attention_of_query_and_key_norms():
    """Weights with per-head norms of K and Q are those of Fourier or softmax attention; asked
    for Galerkin attention, the refusal says so (not that q_norm parameters have no place)."""
    record = torch.load(Path(__file__).with_name("data") / "original_outputs.pt",
                        weights_only=True)
    fourier = next(case for case in record["cases"]
                   if case["name"] == "darcy" and case["overrides"]["attention_type"] == "fourier")
    for attention in ("galerkin", "linear"):
        with pytest.raises(ValueError, match=r"^attention_type: the original's weights hold "
                                             r"norms of K and Q, as 'fourier' and 'softmax' "
                                             rf"attention have, got '{attention}'$"):
            from_original("darcy", fourier["state_dict"], attention_type=attention, fine=29,
                          coarse=15)
