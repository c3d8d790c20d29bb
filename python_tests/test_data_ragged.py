"""Ragged data (SPEC-gnot §3): the HDF5 schema, resumable writing, checked reading, the dataset
with its normalisers, padding collation, the size-bucket sampler, the masked loss, and the
heat/elasticity generators and command line."""

import importlib.util
import json

import h5py
import numpy as np
import pytest
import torch

from galerkin_ext.data import generate as gen
from galerkin_ext.data.__main__ import main
from galerkin_ext.data.gnot_datasets import (
    RaggedDataset,
    RaggedNormalizers,
    SizeBucketSampler,
    collate_ragged,
    padding_fraction,
)
from galerkin_ext.data.ragged import (
    RaggedLayout,
    inspect_ragged,
    read_ragged,
    validate_sample,
    write_ragged,
)
from galerkin_ext.data.storage import DataFileError, inspect_h5, partial_path
from galerkin_ext.losses import MaskedRelativeLoss, masked_relative_l2
from galerkin_ext.training import normalizer_config, ragged_metric

HAS_TRIANGLE = importlib.util.find_spec("triangle") is not None


def synthetic(i, seed=0, *, theta=True, cavity=True):
    """A sample of the per-sample interface with random sizes, depending on (seed, i) only."""
    rng = np.random.default_rng([seed, i])
    n, m = int(rng.integers(4, 40)), int(rng.integers(2, 12))
    points = rng.random((n, 2)) * [9.0, 3.0] + [0.0, 1.0]
    inputs = {"g": {"points": rng.random((m, 2)), "values": rng.standard_normal((m, 1)) + 2,
                    "weights": rng.random(m) + 0.1}}
    if cavity:
        inputs["cavity"] = {"points": rng.random((m + 3, 2)), "values": None,
                            "weights": rng.random(m + 3) + 0.1}
    return {
        "query": {"points": points, "weights": rng.random(n) + 0.05,
                  "label": rng.integers(0, 3, n).astype(np.int8)},
        "target": rng.standard_normal((n, 2)) * [1.0, 5.0] + [0.0, 3.0],
        "target_names": ["u", "vm"],
        "inputs": inputs,
        "theta": rng.standard_normal(3) if theta else None,
        "triangles": rng.integers(0, n, (n + 2, 3)).astype(np.int32),
    }


def write(path, n=13, chunk=4, fn=synthetic, **kw):
    return write_ragged(path, fn, generator="synthetic", parameters={"kind": "test"}, seed=0,
                        n_samples=n, chunk_size=chunk, progress=False, **kw)


@pytest.fixture(scope="module")
def ragged_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("ragged") / "r.h5", n=13, chunk=4)


def _same(a, b):
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(np.asarray(a), np.asarray(b))


def _datasets(path):
    """Every dataset of a file (name -> array) and its attributes."""
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...])
                     if isinstance(obj, h5py.Dataset) else None)
        attrs = {k: f.attrs[k] for k in f.attrs}
    return out, attrs


# -- schema, round trip, inspection --------------------------------------------------------------


def test_round_trip_schema_and_inspection(ragged_file):
    data = read_ragged(ragged_file)
    assert len(data) == 13 and data.layout.input_names == ("g", "cavity")
    for j in range(13):
        want, got = synthetic(j), data.sample(j)
        for key in ("points", "weights", "label"):
            assert _same(want["query"][key], got["query"][key])
        assert _same(want["target"], got["target"]) and _same(want["theta"], got["theta"])
        assert _same(want["triangles"], got["triangles"])
        for name in ("g", "cavity"):
            for key in ("points", "values", "weights"):
                assert _same(want["inputs"][name][key], got["inputs"][name][key])
    sub = read_ragged(ragged_file, [9, 2, 3], fields=("query", "target"))
    assert _same(sub.sample(0)["target"], synthetic(9)["target"]) and sub.inputs == {}
    assert sub.theta is None and sub.lengths.tolist() == [
        synthetic(i)["target"].shape[0] for i in (9, 2, 3)]
    with pytest.raises(TypeError, match="fields: expected a sequence of names"):  # not "'q'"
        read_ragged(ragged_file, fields="query")
    with pytest.raises(TypeError, match="path: expected a path"):
        read_ragged(5)
    with h5py.File(ragged_file) as f:
        assert f.attrs["schema"] == "galerkin_ext.ragged/1" and f.attrs["space_dim"] == 2
        assert json.loads(f.attrs["input_names"]) == ["g", "cavity"]
        assert "values" not in f["inputs/cavity"]  # c = 0: no values dataset
        assert f["query/offsets"].shape == (14,) and f["completed"][...].tolist() == [1] * 4
        assert f["query/label"].dtype == np.int8 and f["mesh/triangles"].dtype == np.int32
        for name in ("query/points", "target/values", "inputs/g/values", "theta",
                     "query/offsets", "mesh/triangles", "completed"):
            assert f[name].fletcher32
    info = inspect_ragged(ragged_file)
    n = np.array([synthetic(i)["target"].shape[0] for i in range(13)])
    assert info["complete"] and info["n_done"] == 13 and info["generator"] == "synthetic"
    assert info["sizes"]["N"] == {"min": int(n.min()), "max": int(n.max()),
                                  "mean": float(n.mean()), "total": int(n.sum())}
    targets = np.concatenate([synthetic(i)["target"] for i in range(13)])
    stats = info["statistics"]["target/values"]
    np.testing.assert_allclose(stats["mean"], targets.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], targets.std(0), rtol=1e-12)
    np.testing.assert_array_equal(stats["max"], targets.max(0))
    assert stats["names"] == ["u", "vm"] and info["theta_dim"] == 3
    assert sum(info["statistics"]["query/label"]["values"].values()) == n.sum()
    json.dumps(info)  # printable by `info`


def test_layout_variants_without_optional_fields(tmp_path):
    def bare(i):
        s = synthetic(i, theta=False, cavity=False)
        s["query"] = {"points": s["query"]["points"]}
        del s["triangles"]
        s["inputs"]["g"]["weights"] = None
        return s

    out = write(tmp_path / "bare.h5", n=5, chunk=2, fn=bare)
    layout = read_ragged(out).layout
    assert layout == RaggedLayout(2, ("u", "vm"), layout.inputs, 0, False, False, False)
    with pytest.raises(ValueError, match=r"weights: 'mesh' needs stored weights.*\['query', 'g'\]"):
        RaggedDataset(out, "train", n_train=3)
    ds = RaggedDataset(out, "train", n_train=3, weights="uniform")
    assert ds[0]["theta"] is None and "label" not in ds[0]
    batch = collate_ragged([ds[0], ds[1]])
    assert batch["theta"] is None and "label" not in batch


# -- resume ---------------------------------------------------------------------------------------


def test_resume_after_interruption_is_identical(tmp_path, monkeypatch):
    reference = write(tmp_path / "ref.h5")

    def flaky(i):
        if i == 9:
            raise KeyboardInterrupt
        return synthetic(i)

    out = tmp_path / "x.h5"
    with pytest.raises(KeyboardInterrupt):
        write(out, fn=flaky)
    part = partial_path(out)
    assert not out.exists() and part.exists()
    info = inspect_ragged(part)
    assert not info["complete"] and info["n_done"] == 8
    assert info["library_versions"] == {}  # (a writer given no libraries records none)
    with pytest.raises(DataFileError, match="incomplete"):
        read_ragged(part)
    with pytest.raises(FileExistsError, match="resume"):
        write(out)
    # a chunk killed half-way: rows appended and offsets written, but not marked completed
    with h5py.File(part, "r+") as f:
        for name in ("query/points", "target/values", "inputs/g/values", "mesh/triangles"):
            ds = f[name]
            ds.resize(ds.shape[0] + 7, axis=0)
            ds[-7:] = 99
        f["query/offsets"][9:11] = 12345
    with pytest.raises(DataFileError, match="seed"):
        write_ragged(out, synthetic, generator="synthetic", parameters={"kind": "test"}, seed=3,
                     n_samples=13, chunk_size=4, resume=True, progress=False)
    with pytest.raises(ValueError, match="does not match the file's layout"):
        write(out, fn=lambda i: synthetic(i, cavity=False), resume=True)
    # a numpy scalar: json's message named neither the argument nor the file
    with pytest.raises(TypeError, match="parameters: expected JSON values .* float32"):
        write_ragged(out, synthetic, generator="synthetic", parameters={"a": np.float32(1)},
                     seed=0, n_samples=13, chunk_size=4, resume=True, progress=False)
    write(out, resume=True)
    assert not part.exists()
    a, attrs_a = _datasets(reference)
    b, attrs_b = _datasets(out)
    assert sorted(a) == sorted(b)
    for name in a:  # bit-identical datasets
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    assert attrs_a == attrs_b


def test_existing_files_and_a_damaged_completed_record(tmp_path):
    out = write(tmp_path / "a.h5", n=3, chunk=2)
    with pytest.raises(FileExistsError, match="overwrite"):
        write(out, n=3, chunk=2)
    write(out, n=4, chunk=2, overwrite=True)
    assert inspect_ragged(out)["n_samples"] == 4
    with pytest.raises(ValueError, match="mutually exclusive"):
        write(tmp_path / "b.h5", resume=True, overwrite=True)
    with pytest.raises(ValueError, match=".h5"):
        write(tmp_path / "b.txt")
    with h5py.File(out, "r+") as f:
        f["completed"][0] = 0  # chunk 1 completed after a pending chunk 0: not a prefix
    with pytest.raises(DataFileError, match="not a prefix"):
        read_ragged(out)


def test_a_failing_first_sample_leaves_no_file(tmp_path):
    def bad(i):
        s = synthetic(i)
        s["target"][0, 0] = np.nan
        return s

    out = tmp_path / "nan.h5"
    with pytest.raises(ValueError, match=r"sample_fn\(0\): target: contains NaN"):
        write(out, fn=bad)
    assert not out.exists() and not partial_path(out).exists()


# -- damaged and foreign files ---------------------------------------------------------------------


def test_truncated_corrupt_and_foreign_files_are_refused(tmp_path, ragged_file):
    copy = tmp_path / "c.h5"
    copy.write_bytes(ragged_file.read_bytes())
    with h5py.File(copy) as f:
        offset = f["target/values"].id.get_chunk_info(0).byte_offset
    data = bytearray(copy.read_bytes())
    data[offset + 40] ^= 0x10
    copy.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match="'/target/values' is corrupt"):
        read_ragged(copy)
    assert read_ragged(copy, fields=("query",)).query_points.shape[1] == 2
    trunc = tmp_path / "t.h5"
    trunc.write_bytes(ragged_file.read_bytes()[: ragged_file.stat().st_size // 2])
    with pytest.raises(DataFileError, match="corrupt or truncated"):
        read_ragged(trunc)
    with pytest.raises(DataFileError, match="corrupt or truncated"):
        RaggedDataset(trunc, "train", n_train=4)
    other = gen.generate_cde(tmp_path / "cde.h5", 2, dt=0.5, progress=False)
    with pytest.raises(DataFileError, match="not a galerkin_ext ragged data file.*galerkin_ext"):
        read_ragged(other)
    with pytest.raises(DataFileError, match="holds ragged data"):
        inspect_h5(ragged_file)
    with pytest.raises(DataFileError, match="holds synthetic data, expected heat data"):
        RaggedDataset(ragged_file, "train", n_train=4, generator="heat")
    bad = tmp_path / "offsets.h5"
    bad.write_bytes(ragged_file.read_bytes())
    with h5py.File(bad, "r+") as f:
        f["query/offsets"][3] = f["query/offsets"][2]  # an empty sample
    with pytest.raises(DataFileError, match="query/offsets is not increasing"):
        read_ragged(bad)
    with pytest.raises(DataFileError, match="does not exist"):
        read_ragged(tmp_path / "missing.h5")


def _replace(f, name, data):
    del f[name]
    f.create_dataset(name, data=data)


@pytest.mark.parametrize("damage, match", [
    # theta of 5 rows for 13 samples: h5py returned fewer rows, the normalisers fitted on them
    (lambda f: _replace(f, "theta", np.zeros((5, 3))), r"theta has shape \(5, 3\), expected "
                                                       r"\(13, 3\)"),
    # a raw IndexError past the end of a short offsets dataset
    (lambda f: _replace(f, "query/offsets", f["query/offsets"][:8]),
     r"query/offsets has shape \(8,\), expected \(14\)"),
    # columns other than the layout's: blamed on the normalisers the dataset had just fitted
    (lambda f: _replace(f, "query/points", np.zeros((f["query/points"].shape[0], 3))),
     r"query/points has shape \(\d+, 3\), expected \(rows, 2\)"),
    (lambda f: _replace(f, "target/values", f["target/values"][:, :1]),
     r"target/values has shape \(\d+, 1\), expected \(rows, 2\)"),
    # a deleted optional field read as one the file never had (a model without that input)
    (lambda f: f.__delitem__("inputs/g/values"), r"do not hold the layout it records \(input "
                                                 r"'g': 1 channels, weights True vs 0 channels"),
    (lambda f: f.__delitem__("theta"), "do not hold the layout it records .theta_dim 3 vs 0"),
])
def test_a_damaged_layout_is_refused_naming_the_dataset(tmp_path, ragged_file, damage, match):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(ragged_file.read_bytes())
    with h5py.File(bad, "r+") as f:
        damage(f)
    for read in (lambda: read_ragged(bad), lambda: RaggedDataset(bad, "train", n_train=8)):
        with pytest.raises(DataFileError, match=match):
            read()



def test_a_non_finite_value_is_named_by_its_sample(tmp_path, ragged_file):
    bad = tmp_path / "nan.h5"  # (the writer refuses them: only an edited file holds one)
    bad.write_bytes(ragged_file.read_bytes())
    with h5py.File(bad, "r+") as f:
        row = int(f["query/offsets"][3]) + 1  # a point of sample 3
        values = f["target/values"][...]
        values[row, 1] = np.nan
        _replace(f, "target/values", values)
    # (the normaliser named the point row as a sample)
    with pytest.raises(DataFileError, match=r"nan.h5': data: target/values of sample 3 has NaN"):
        RaggedDataset(bad, "train", n_train=8)


def test_files_without_a_recorded_layout_read_as_before(tmp_path, ragged_file):
    old = tmp_path / "old.h5"  # (written before the layout was recorded: inferred)
    old.write_bytes(ragged_file.read_bytes())
    with h5py.File(old, "r+") as f:
        del f.attrs["layout"]
    a, b = read_ragged(old), read_ragged(ragged_file)
    assert a.layout == b.layout and np.array_equal(a.target, b.target)


# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("edit, match", [
    (lambda s: s["query"].__setitem__("points", np.zeros((0, 2))), "an empty sample"),
    (lambda s: s.__setitem__("target", s["target"][:-1]), r"target: expected shape \(\d+, o\)"),
    (lambda s: s["query"]["points"].__setitem__((0, 1), np.inf), "query.points: contains NaN"),
    (lambda s: s["query"].__setitem__("weights", -s["query"]["weights"]), "non-negative"),
    (lambda s: s["inputs"]["g"].__setitem__("points", np.zeros((0, 2))), "needs points"),
    (lambda s: s["inputs"]["g"].__setitem__("values", np.zeros((2, 1))), r"g'\]\.values"),
    (lambda s: s["triangles"].__setitem__((0, 0), 1000), r"triangles: vertex indices"),
    (lambda s: s.__setitem__("target_names", ["u"]), "target_names: expected 2 names"),
    (lambda s: s["query"].__setitem__("label", np.full(len(s["target"]), 300)), "int8"),
    (lambda s: s.pop("inputs"), "missing the key 'inputs'"),
    (lambda s: s["inputs"].__setitem__("bad name", s["inputs"].pop("g")), "identifiers"),
])
def test_bad_samples_are_refused_naming_the_field(edit, match):
    sample = synthetic(1)
    edit(sample)
    with pytest.raises((ValueError, TypeError, KeyError), match=match):
        validate_sample(sample, where="sample 1")


def test_samples_must_match_the_layout():
    layout = RaggedLayout.from_sample(synthetic(0))
    missing = synthetic(1, cavity=False)
    with pytest.raises(ValueError, match=r"input functions \['g'\] vs \['g', 'cavity'\]"):
        validate_sample(missing, where="sample 1", layout=layout)
    no_theta = synthetic(1, theta=False)
    with pytest.raises(ValueError, match="theta_dim 0 vs 3"):
        validate_sample(no_theta, layout=layout)
    with pytest.raises(TypeError, match="expected a dict"):
        validate_sample([1, 2])


# -------------------------------------------------------------------------------------------------


def test_normalisers_are_fitted_on_the_training_split_only(ragged_file):
    train = RaggedDataset(ragged_file, "train", n_train=8, dtype=torch.float64)
    raw = [synthetic(i) for i in range(8)]
    eps = 1e-8
    pts = np.concatenate([s["query"]["points"] for s in raw])
    tgt = np.concatenate([s["target"] for s in raw])
    vals = np.concatenate([s["inputs"]["g"]["values"] for s in raw])
    theta = np.stack([s["theta"] for s in raw])
    norm = train.normalizers
    for fitted, data in ((norm.query, pts), (norm.target, tgt), (norm.inputs["g"], vals),
                         (norm.theta, theta)):
        np.testing.assert_allclose(fitted.mean.numpy(), data.mean(0), rtol=1e-12)
        np.testing.assert_allclose(fitted.std.numpy(), data.std(0, ddof=1), rtol=1e-12)
        assert fitted.eps == eps
    item = train[2]
    np.testing.assert_allclose(item["x"].numpy(), (raw[2]["query"]["points"] - pts.mean(0))
                               / (pts.std(0, ddof=1) + eps), rtol=1e-12)
    # input coordinates by the query map, values by their own; cavity coordinates only
    g = raw[2]["inputs"]["g"]
    expected = np.concatenate([(g["points"] - pts.mean(0)) / (pts.std(0, ddof=1) + eps),
                               (g["values"] - vals.mean(0)) / (vals.std(0, ddof=1) + eps)], 1)
    np.testing.assert_allclose(item["inputs"][0].numpy(), expected, rtol=1e-12)
    assert train.input_dims == [3, 2] and item["inputs"][1].shape[1] == 2
    # the test split uses the training statistics, not its own
    test = RaggedDataset(ragged_file, "test", n_train=8, n_test=5, dtype=torch.float64)
    assert torch.equal(test.normalizers.target.mean, norm.target.mean)
    np.testing.assert_array_equal(test.indices, np.arange(8, 13))
    np.testing.assert_allclose(test.decode_target(test[1]["target"]).numpy(),
                               synthetic(9)["target"], rtol=1e-12, atol=1e-12)
    # a state dict round trip gives the same data; raw input functions on request
    state = {k: v.clone() for k, v in norm.state_dict().items()}
    again = RaggedDataset(ragged_file, "test", n_test=5, normalizers=state,
                          dtype=torch.float64, normalize_inputs=False)
    rebuilt = RaggedNormalizers.from_state_dict(state)
    assert set(rebuilt.state_dict()) == set(state)
    # as the examples record them in their run configuration (JSON): exactly the same numbers
    config = json.loads(json.dumps(normalizer_config(**norm.named())))
    assert sorted(config) == ["input_g", "query", "target", "theta"]
    from_config = RaggedNormalizers.from_config(config).state_dict()  # (the recorded eps)
    assert set(from_config) == set(state)
    assert all(torch.equal(from_config[k], state[k]) for k in state)
    without = {name: {"mean": r["mean"], "std": r["std"]} for name, r in config.items()}
    assert float(RaggedNormalizers.from_config(without, eps=eps).eps) == float(state["eps"])
    with pytest.raises(ValueError, match="record different eps"):
        RaggedNormalizers.from_config({**config, "query": {**config["query"], "eps": 1.0}})
    with pytest.raises(ValueError, match=r"config\['query'\]: expected"):
        RaggedNormalizers.from_config({**config, "query": {"mean": [0.0]}})
    # these were torch's "new(): invalid data type 'str'" and "only one element tensors ..."
    with pytest.raises(ValueError, match=r"config\['query'\]: expected numbers or nested lists "
                       r"of them .*got \{'mean': 'ab'"):
        RaggedNormalizers.from_config({**config, "query": {"mean": "ab", "std": [1.0]}})
    with pytest.raises(ValueError, match=r"state\['eps'\]: expected one number, got shape "
                       r"\(2,\)"):
        RaggedNormalizers.from_state_dict({**state, "eps": torch.ones(2)})
    with pytest.raises(TypeError, match="generator: expected a generator's name"):
        RaggedDataset(ragged_file, "test", n_test=5, normalizers=state, generator=5)
    for a, b in zip(again, test, strict=True):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["target"], b["target"])
        assert torch.equal(a["theta"], b["theta"])
    np.testing.assert_array_equal(again[0]["inputs"][0][:, 2].numpy(),
                                  synthetic(8)["inputs"]["g"]["values"][:, 0])
    # normalisers of another layout are refused, naming what differs
    other = RaggedNormalizers.from_state_dict({**state, "theta.mean": torch.zeros(4),
                                               "theta.std": torch.ones(4)})
    with pytest.raises(ValueError, match="theta components: 4 vs 3"):
        RaggedDataset(ragged_file, "test", n_test=5, normalizers=other)


def test_weights_sum_to_one_per_sample(ragged_file):
    mesh = RaggedDataset(ragged_file, "train", n_train=6, dtype=torch.float64)
    uniform = RaggedDataset(ragged_file, "train", n_train=6, weights="uniform",
                            dtype=torch.float64)
    for j in range(6):
        stored = synthetic(j)
        w = mesh[j]["weight"].numpy()
        np.testing.assert_allclose(w, stored["query"]["weights"] / stored["query"]["weights"].sum(),
                                   rtol=1e-14)
        np.testing.assert_allclose(uniform[j]["weight"].numpy(), 1 / w.size, rtol=1e-15)
        for ds in (mesh, uniform):
            item = ds[j]
            assert abs(float(item["weight"].sum()) - 1) < 1e-14
            for iw in item["input_weights"]:
                assert abs(float(iw.sum()) - 1) < 1e-14
    batch = collate_ragged([mesh[j] for j in range(6)])
    torch.testing.assert_close(batch["weight"].sum(1), torch.ones(6, dtype=torch.float64))
    for iw in batch["input_weights"]:
        torch.testing.assert_close(iw.sum(1), torch.ones(6, dtype=torch.float64))


def test_dataset_arguments_are_checked(ragged_file, tmp_path):
    with pytest.raises(ValueError, match="n_train: needed to fit"):
        RaggedDataset(ragged_file, "test", n_test=3)
    with pytest.raises(ValueError, match="splits would overlap"):
        RaggedDataset(ragged_file, "test", n_train=10, n_test=5)
    # given the training set's normalisers too: its last 5 would still be training samples
    train = RaggedDataset(ragged_file, "train", n_train=10)
    with pytest.raises(ValueError, match=r"n_train \+ n_test = 10 \+ 5, so the splits would"):
        RaggedDataset(ragged_file, "test", n_train=10, n_test=5, normalizers=train.normalizers)
    assert len(RaggedDataset(ragged_file, "test", n_test=5, normalizers=train.normalizers)) == 5
    with pytest.raises(ValueError, match="n_train: expected >= 1 for split='train', got 0"):
        RaggedDataset(ragged_file, "train", n_train=0, normalizers=train.normalizers)
    with pytest.raises(ValueError, match="split: expected one of"):
        RaggedDataset(ragged_file, "valid", n_train=4)
    with pytest.raises(ValueError, match="distinct sample indices"):
        RaggedDataset(ragged_file, [1, 1], n_train=4)
    with pytest.raises(ValueError, match="weights: expected one of"):
        RaggedDataset(ragged_file, n_train=4, weights="area")
    with pytest.raises(ValueError, match="n_train: the file has 13 samples"):
        RaggedDataset(ragged_file, n_train=20)
    with pytest.raises(FileNotFoundError, match="no such file"):
        RaggedDataset(tmp_path / "nope.h5", n_train=4)
    with pytest.raises(TypeError, match="normalizers"):
        RaggedDataset(ragged_file, n_train=4, normalizers="z-score")
    ds = RaggedDataset(ragged_file, [5, 1], n_train=4)
    assert ds[0]["index"] == 5 and ds.lengths[1] == synthetic(1)["target"].shape[0]
    with pytest.raises(IndexError):
        ds[2]


# -------------------------------------------------------------------------------------------------


def test_collation_pads_exactly_and_equals_per_sample_processing(ragged_file):
    ds = RaggedDataset(ragged_file, "train", n_train=10, dtype=torch.float64)
    items = [ds[j] for j in (3, 0, 7, 5)]
    batch = collate_ragged(items)
    n = [it["x"].shape[0] for it in items]
    assert batch["x"].shape == (4, max(n), 2) and batch["lengths"].tolist() == n
    assert batch["theta"].shape == (4, 3) and batch["index"].tolist() == [3, 0, 7, 5]
    for b, it in enumerate(items):
        k = n[b]
        assert torch.equal(batch["x"][b, :k], it["x"])
        assert torch.equal(batch["target"][b, :k], it["target"])
        assert torch.equal(batch["weight"][b, :k], it["weight"])
        assert torch.equal(batch["label"][b, :k], it["label"])
        assert batch["mask"][b, :k].all() and not batch["mask"][b, k:].any()
        assert not batch["x"][b, k:].any() and not batch["weight"][b, k:].any()
        for l_, (f, w) in enumerate(zip(it["inputs"], it["input_weights"], strict=True)):
            m = f.shape[0]
            assert torch.equal(batch["inputs"][l_][b, :m], f)
            assert torch.equal(batch["input_weights"][l_][b, :m], w)
            assert not batch["input_weights"][l_][b, m:].any()
            assert batch["input_mask"][l_][b].sum() == m
    # a weighted pooling and the loss on the padded batch equal the per-sample ones
    pred = torch.sin(batch["x"][..., :1] * torch.tensor([1.0, 2.0], dtype=torch.float64))
    pooled = (batch["weight"][..., None] * batch["x"]).sum(1)
    alone = [masked_relative_l2(torch.sin(it["x"][..., :1] * torch.tensor([1.0, 2.0],
                                                                          dtype=torch.float64))
                                [None], it["target"][None], torch.ones(1, it["x"].shape[0],
                                                                  dtype=torch.bool),
                                reduction="none")[0] for it in items]
    for b, it in enumerate(items):
        torch.testing.assert_close(pooled[b], (it["weight"][:, None] * it["x"]).sum(0),
                                   rtol=1e-13, atol=1e-15)
    pred = torch.where(batch["mask"][..., None], pred, torch.nan)  # garbage at padding
    torch.testing.assert_close(masked_relative_l2(pred, batch["target"], batch["mask"],
                                                  reduction="none"),
                               torch.stack(alone), rtol=1e-13, atol=0)


def test_collation_rejects_bad_items(ragged_file):
    ds = RaggedDataset(ragged_file, "train", n_train=4)
    a, b = ds[0], ds[1]
    with pytest.raises(ValueError, match="non-empty list"):
        collate_ragged([])
    with pytest.raises(ValueError, match="a missing input function"):
        collate_ragged([a, {**b, "inputs": b["inputs"][:1],
                            "input_weights": b["input_weights"][:1]}])
    with pytest.raises(ValueError, match=r"items\[1\]: expected x \(N, d\), weight \(N,\)"):
        collate_ragged([a, {**b, "weight": b["weight"][:-1]}])
    # the message itself raised KeyError: 'y'
    with pytest.raises(ValueError, match=r"items\[1\]: x/target have 3/2 columns, items\[0\] "
                       r"2/2"):
        collate_ragged([a, {**b, "x": torch.zeros(b["x"].shape[0], 3, dtype=b["x"].dtype)}])
    with pytest.raises(KeyError, match=r"items\[0\]: missing 'target'"):
        collate_ragged([{k: v for k, v in a.items() if k != "target"}])
    # padding cast these silently to the batch's dtype
    with pytest.raises(TypeError, match=r"items\[1\]: inputs\[0\], input_weights\[0\]: "
                       "expected x's dtype"):
        collate_ragged([a, {**b, "inputs": [f.long() for f in b["inputs"]]}])
    with pytest.raises(TypeError, match=r"items\[1\]: x is torch.float64, items\[0\]'s"):
        collate_ragged([a, {k: ([t.double() for t in v] if isinstance(v, list) else
                                v.double() if isinstance(v, torch.Tensor) and
                                v.is_floating_point() else v) for k, v in b.items()}])


# -- sampler ---------------------------------------------------------------------------------------


def test_size_bucket_sampler_covers_every_index_and_cuts_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 3000, 1003)
    sampler = SizeBucketSampler(lengths, 4, seed=7)
    assert sampler.bucket == 200 and len(sampler) == 251
    epochs = []
    for _ in range(2):
        batches = list(sampler)
        flat = np.concatenate(batches)
        assert np.array_equal(np.sort(flat), np.arange(1003))  # exactly once per epoch
        assert all(len(b) == 4 for b in batches if len(b) != 3) and len(batches) == 251
        epochs.append(batches)
    assert epochs[0] != epochs[1]
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]  # (seed, epoch) alone fix the order
    # a DataLoader with workers makes an iterator, drops it and makes another: the epoch
    # advanced twice, so each epoch ran the next one's order
    sampler.set_epoch(0)
    iter(sampler)
    assert list(iter(sampler)) == epochs[0] and list(sampler) == epochs[1]
    randomly = [list(c) for c in np.array_split(rng.permutation(1003), 251)]
    # N spread over 50..3000: random batches pad about 40 %, sorted buckets about 1 %
    assert sampler.last_padding_fraction < 0.05
    assert padding_fraction(lengths, randomly) > 0.3
    assert padding_fraction([2, 4], [[0, 1]]) == 0.25
    with pytest.raises(ValueError, match=r"batches\[0\]: expected indices in \[0, 2\)"):
        padding_fraction([3, 4], [[0.5]])  # an IndexError from numpy
    dropped = SizeBucketSampler(lengths, 4, bucket=10, seed=1, drop_last=True)
    assert dropped.bucket == 12 and len(dropped) == 250
    assert all(len(b) == 4 for b in dropped)
    with pytest.raises(ValueError, match="lengths"):
        SizeBucketSampler([3, 0], 2)
    with pytest.raises(TypeError, match="batch_size"):
        SizeBucketSampler([3, 4], 2.0)


# -- loss -----------------------------------------------------------------------------------------


def test_ragged_metric_per_channel_in_physical_units(ragged_file, gen):
    """The examples' metric: per sample, relative L2 of the decoded fields over valid points;
    the mean over channels, or one channel (ragged_channel_errors); in float64 for a float64
    dataset and prediction (it rounded both to float32: 7.0e-9 and 0.0 for errors of 1.4e-10)."""
    data = RaggedDataset(ragged_file, "test", n_train=8, n_test=5, dtype=torch.float64)
    batch = data.collate_fn([data[i] for i in range(3)])
    pred = batch["target"] + 0.1 * torch.randn(batch["target"].shape, generator=gen,
                                               dtype=torch.float64)
    per = torch.stack([ragged_metric(data, channel=c)(pred, batch) for c in range(2)], 1)
    for b, i in enumerate(data.indices[:3]):
        truth = synthetic(int(i))["target"]
        n = truth.shape[0]
        guess = data.decode_target(pred[b, :n]).numpy()
        for c in range(2):
            expected = np.linalg.norm(guess[:, c] - truth[:, c]) / np.linalg.norm(truth[:, c])
            np.testing.assert_allclose(per[b, c].item(), expected, rtol=1e-10)
    torch.testing.assert_close(ragged_metric(data)(pred, batch), per.mean(1))
    with pytest.raises(ValueError, match="channel: expected < 2"):
        ragged_metric(data, channel=2)(pred, batch)
    with pytest.raises(ValueError, match="channel: expected an int >= 0"):
        ragged_metric(data, channel=-1)


def test_masked_relative_l2_ignores_padding_and_matches_its_formula(gen):
    pred = torch.randn(3, 6, 2, dtype=torch.float64, generator=gen)
    target = torch.randn(3, 6, 2, dtype=torch.float64, generator=gen)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4], dtype=torch.bool)
    weight = torch.rand(3, 6, dtype=torch.float64, generator=gen)
    per = masked_relative_l2(pred, target, mask, reduction="none")
    for b, k in enumerate((6, 4, 2)):
        for c in range(2):
            e = (pred[b, :k, c] - target[b, :k, c]).norm() / target[b, :k, c].norm()
            torch.testing.assert_close(per[b, c], e, rtol=1e-14, atol=0)
            w = weight[b, :k]
            ew = ((w * (pred[b, :k, c] - target[b, :k, c]) ** 2).sum()
                  / (w * target[b, :k, c] ** 2).sum()).sqrt()
            torch.testing.assert_close(
                masked_relative_l2(pred, target, mask, weight=weight, reduction="none")[b, c],
                ew, rtol=1e-14, atol=0)
    torch.testing.assert_close(masked_relative_l2(pred, target, mask), per.mean())
    torch.testing.assert_close(masked_relative_l2(pred, target, mask, reduction="channel"),
                               per.mean(0))
    torch.testing.assert_close(masked_relative_l2(pred, target, mask, reduction="sample"),
                               per.mean(1))
    # padded entries never count, even NaN, and get no gradient
    spoiled = pred.clone().requires_grad_()
    noisy = torch.where(mask[..., None], spoiled, torch.nan)
    loss, parts = MaskedRelativeLoss()(noisy, target, mask)
    loss.backward()
    torch.testing.assert_close(loss, per.mean())
    torch.testing.assert_close(parts["rel_l2"], per.mean())
    assert not parts["rel_l2"].requires_grad
    assert torch.isfinite(spoiled.grad).all() and not spoiled.grad[~mask].any()
    with pytest.raises(ValueError, match="mask: sample 2 has no valid point"):
        masked_relative_l2(pred, target, torch.tensor([[1] * 6, [1] * 6, [0] * 6]).bool())
    with pytest.raises(ValueError, match="mask: expected a bool tensor"):
        masked_relative_l2(pred, target, mask.float())
    with pytest.raises(ValueError, match="target: expected the shape"):
        masked_relative_l2(pred, target[:, :5], mask)
    with pytest.raises(ValueError, match="weight: expected finite, non-negative"):
        masked_relative_l2(pred, target, mask, weight=-weight)
    with pytest.raises(ValueError, match="weight: required"):
        MaskedRelativeLoss(weighted=True)(pred, target, mask)


# -------------------------------------------------------------------------------------------------


def test_missing_triangle_gives_the_install_hint(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triangle" else real(name, *a))
    out = tmp_path / "h.h5"
    with pytest.raises(ModuleNotFoundError, match=r'pip install "galerkin_ext\[fem\]"'):
        gen.generate_heat(out, n_samples=2, h=1.0, progress=False)
    assert main(["generate", "elasticity", "--preset", "quick", "--out", str(out)]) == 1
    assert "galerkin_ext[fem]" in capsys.readouterr().err
    assert not out.exists() and not partial_path(out).exists()


@pytest.mark.skipif(not HAS_TRIANGLE, reason="needs the optional package triangle")
def test_generate_heat_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "heat.h5"
    args = ["generate", "heat", "--preset", "quick", "--n-samples", "4", "--chunk-size", "2",
            "--seed", "3", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert info["generator"] == "heat" and info["parameters"] == {"h": 0.5, "refine": False}
    assert info["input_names"] == ["top_temperature", "interface_1", "interface_2"]
    assert info["theta_dim"] == 12 and info["n_done"] == 4 and info["sizes"]["N"]["min"] > 100
    ds = RaggedDataset(out, "train", n_train=3, generator="heat")
    assert ds.input_dims == [3, 2, 2] and ds.out_dim == 1 and ds.theta_dim == 12
    batch = collate_ragged([ds[0], ds[2]])
    assert batch["label"].max() <= 2 and batch["theta"].shape == (2, 12)
    # resumed in another process layout: the same datasets
    interrupted = tmp_path / "cut.h5"
    state = {"n": 0}
    from galerkin_ext.data.heat import heat_sample

    def flaky(i):
        state["n"] += 1
        if state["n"] == 3:
            raise KeyboardInterrupt
        return heat_sample(i, seed=3, h=0.5)

    with pytest.raises(KeyboardInterrupt):
        write_ragged(interrupted, flaky, generator="heat", parameters={"h": 0.5, "refine": False},
                     seed=3, n_samples=4, chunk_size=2, progress=False)
    gen.generate_heat(interrupted, n_samples=4, seed=3, h=0.5, chunk_size=2, resume=True,
                      progress=False)
    a, _ = _datasets(out)
    b, _ = _datasets(interrupted)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a) and sorted(a) == sorted(b)
    with pytest.raises(SystemExit):
        main(["generate", "burgers", "--preset", "quick", "--out", str(tmp_path / "b.h5")])
    assert main(["generate", "elasticity", "--preset", "quick", "--targets", "u,w",
                 "--n-samples", "2", "--out", str(tmp_path / "e.h5")]) == 1
    assert "targets:" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_TRIANGLE, reason="needs the optional package triangle")
def test_elasticity_with_worker_processes_equals_serial(tmp_path):
    kw = {"n_samples": 3, "h": 0.1, "targets": ("u", "vm"), "with_cavity": True,
          "with_theta": True, "chunk_size": 2, "progress": False}
    serial = gen.generate_elasticity(tmp_path / "s.h5", workers=1, **kw)
    pooled = gen.generate_elasticity(tmp_path / "p.h5", workers=2, **kw)
    a, attrs_a = _datasets(serial)
    b, attrs_b = _datasets(pooled)
    assert sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert attrs_a == attrs_b and b["theta"].shape == (3, 42)
    ds = RaggedDataset(pooled, "train", n_train=2, generator="elasticity")
    assert ds.input_names == ["mesh", "cavity"] and ds.target_names == ["u", "vm"]
    assert ds.input_dims == [2, 2] and ds.theta_dim == 42
