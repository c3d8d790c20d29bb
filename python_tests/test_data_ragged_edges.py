"""data/ragged.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import threading
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
import pytest
from test_data_ragged import synthetic, write

from galerkin_ext.data import ragged
from galerkin_ext.data.ragged import (
    InputSpec,
    RaggedLayout,
    RaggedWriter,
    inspect_ragged,
    is_ragged_file,
    read_header,
    read_ragged,
    validate_sample,
)
from galerkin_ext.data.storage import DataFileError, partial_path

KW = dict(generator="synthetic", parameters={"kind": "test"}, seed=0)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return write(tmp_path_factory.mktemp("cov") / "s.h5", n=5, chunk=2)


def _copy(src, dst):
    dst.write_bytes(src.read_bytes())
    return dst


def _flip(path, dataset, chunk=0):
    with h5py.File(path) as f:
        offset = f[dataset].id.get_chunk_info(chunk).byte_offset
    data = bytearray(path.read_bytes())
    data[offset + 3] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("edit, err, match", [
    (lambda s: s["query"].__setitem__("points", None), TypeError,
     r"query.points: expected a real array of shape \(N, d\), got NoneType"),
    (lambda s: s.__setitem__("target", np.array(["a", "b"])), TypeError,
     r"target: expected a real array of shape \(N, o\), got <U1"),
    (lambda s: s.__setitem__("target", s["target"][:, 0]), ValueError,
     r"target: expected shape \(N, o\), got \(\d+,\)"),
    (lambda s: s["query"].__setitem__("label", s["query"]["label"].astype(float)), TypeError,
     r"query.label: expected an integer array"),
    (lambda s: s.__setitem__("target_names", "uv"), TypeError,
     "target_names: expected a list of names, got 'uv'"),
    (lambda s: s.__setitem__("target_names", ["u", "u"]), ValueError,
     r"target_names: names must be unique, got \['u', 'u'\]"),
    (lambda s: s["query"].__setitem__("weights", s["query"]["weights"][:-1]), ValueError,
     r"query.weights: expected shape \(\d+,\), got \(\d+,\)"),
    (lambda s: s.__setitem__("query", [1, 2]), TypeError,
     "query: expected a dict with points, weights, label"),
    (lambda s: s["query"].__setitem__("label", s["query"]["label"][:-1]), ValueError,
     r"query.label: expected shape \(\d+,\), got"),
    (lambda s: s.__setitem__("inputs", [1]), TypeError,
     "inputs: expected a dict .name: .points, values, weights.., got list"),
    (lambda s: s["inputs"].__setitem__("g", 5), TypeError,
     r"inputs\['g'\]: expected a dict with points, values, weights"),
    (lambda s: s.__setitem__("triangles", s["triangles"][:, :2]), ValueError,
     r"triangles: expected shape \(T, 3\) with T >= 1, got \(\d+, 2\)"),
    (lambda s: s.__setitem__("triangles", np.zeros((0, 3), np.int32)), ValueError,
     r"triangles: expected shape \(T, 3\) with T >= 1, got \(0, 3\)"),
    # misspelt optional keys were dropped from the file without a word
    (lambda s: s.__setitem__("thetas", s.pop("theta")), ValueError,
     r"s2: unknown keys \['thetas'\] \(expected some of \['query', "),
    (lambda s: s["query"].__setitem__("weight", s["query"].pop("weights")), ValueError,
     r"s2: query: unknown keys \['weight'\]"),
    (lambda s: s["inputs"]["g"].__setitem__("value", s["inputs"]["g"].pop("values")),
     ValueError, r"inputs\['g'\]: unknown keys \['value'\] \(expected some of \['points', "),
])
def test_sample_checks(edit, err, match):
    sample = synthetic(2)
    edit(sample)
    with pytest.raises(err, match=match):
        validate_sample(sample, where="s2")


def test_zero_column_values_and_empty_theta_become_none():
    sample = synthetic(3)
    sample["inputs"]["g"]["values"] = np.zeros((len(sample["inputs"]["g"]["points"]), 0))
    sample["theta"] = np.zeros(0)
    checked = validate_sample(sample)
    assert checked["inputs"]["g"]["values"] is None and checked["theta"] is None
    layout = RaggedLayout.from_sample(sample)
    assert layout.theta_dim == 0 and layout.inputs[0] == InputSpec("g", 0, True)


def _open(path, **kw):
    args = dict(KW, n_samples=4, chunk_size=2, layout=RaggedLayout.from_sample(synthetic(0)))
    args.update(kw)
    return RaggedWriter.open(path, **args)


def test_writer_open_argument_checks(tmp_path):
    out = tmp_path / "w.h5"
    with pytest.raises(TypeError, match="generator: expected a non-empty str, got ''"):
        _open(out, generator="")
    with pytest.raises(TypeError, match="layout: expected a RaggedLayout or a function "
                                        "returning one, got int"):
        _open(out, layout=5)
    with pytest.raises(TypeError, match="layout: the function returned dict, not a RaggedLayout"):
        _open(out, layout=lambda: {})
    assert not partial_path(out).exists()


def test_writer_with_a_given_layout_orders_and_finishes(tmp_path):
    out = tmp_path / "w.h5"
    w = _open(out)  # a RaggedLayout given directly (not a function)
    assert w.pending_chunks() == [(0, 0, 2), (1, 2, 4)]
    with pytest.raises(ValueError, match="chunks are appended in order; the next is 0, got 1"):
        w.write_chunk(1, [synthetic(2), synthetic(3)])
    with pytest.raises(ValueError, match=r"samples: chunk 0 needs a list of 2 samples \(0 to 1\)"):
        w.write_chunk(0, [synthetic(0)])
    w.write_chunk(0, [synthetic(0), synthetic(1)])
    with pytest.raises(DataFileError, match="cannot finish: some chunks have not been written"):
        w.finish()
    w.write_chunk(1, [synthetic(2), synthetic(3)])
    with pytest.raises(ValueError, match="the next is None, got 2"):
        w.write_chunk(2, [])
    assert w.finish() == out
    data = read_ragged(out)
    assert len(data) == 4 and np.array_equal(data.sample(3)["target"], synthetic(3)["target"])


def test_a_ragged_writer_keeps_a_second_writer_out_until_it_ends(tmp_path):
    """The lock of storage.prepare_output (HDF5's own may be off): refused while one writes,
    released when it closes or fails to open."""
    out = tmp_path / "w.h5"
    w = _open(out, layout=lambda: RaggedLayout.from_sample(synthetic(0)))
    with pytest.raises(FileExistsError, match="is being written by another process"):
        _open(out, resume=True)
    w.write_chunk(0, [synthetic(0), synthetic(1)])
    w.close()
    with pytest.raises(DataFileError, match="cannot resume"):
        _open(out, resume=True, seed=3)
    w = _open(out, resume=True)
    assert w.n_done() == 2
    w.close()


def test_a_failure_while_creating_leaves_no_partial_file(tmp_path, monkeypatch):
    from galerkin_ext.data import ragged

    def broken(*args, **kwargs):
        raise OSError("disk full")

    out = tmp_path / "dup.h5"
    monkeypatch.setattr(ragged, "_create", broken)  # after the partial file was created
    with pytest.raises(DataFileError, match=r"dup\.h5\.partial'?: creating it failed \(a full "
                                            r"disk, a file-size limit or no permission\?\): "
                                            r"disk full"):
        _open(out)
    assert not partial_path(out).exists() and not out.exists()


def test_a_file_size_limit_stops_a_ragged_set_before_the_chunk_that_does_not_fit(
        tmp_path, monkeypatch):
    """A ragged set's size is not known beforehand: each store is checked against the limit
    (ulimit -f), with room for the HDF5 chunk it may begin in every growing data set; the set
    resumes once the limit is raised. Under a limit too low to create the file, none is left."""
    import resource

    reference = write(tmp_path / "reference.h5", n=40, chunk=4)
    real = resource.getrlimit
    limit = 1 << 10

    def limited(which):
        return (limit, resource.RLIM_INFINITY) if which == resource.RLIMIT_FSIZE else real(which)

    monkeypatch.setattr(resource, "getrlimit", limited)
    out = tmp_path / "x.h5"
    with pytest.raises(DataFileError, match=r"x\.h5\.partial'?: creating it needs about 0\.25 "
                                            r"MiB with a margin for HDF5's records, and the "
                                            r"file-size limit \(ulimit -f\) of 0\.000977 MiB"):
        write(out, n=40, chunk=4)
    assert not partial_path(out).exists()
    limit = int(1.2 * 2**20)  # the first chunk and its HDF5 chunks, not a second
    with pytest.raises(DataFileError, match=r"x\.h5\.partial'?: storing samples 4 to 7 needs "
                                            r"about .* MiB with a margin for HDF5's records, and "
                                            r"the file-size limit \(ulimit -f\) of 1\.2 MiB "
                                            r"leaves .* MiB; raise it, then resume=True "
                                            r"\(--resume\) continues from the samples"):
        write(out, n=40, chunk=4)
    monkeypatch.undo()
    assert write(out, n=40, chunk=4, resume=True) == out
    got, want = _datasets(out), _datasets(reference)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("fields, error, match", [
    ({"space_dim": -1}, ValueError, r"layout.space_dim: expected an int >= 1, got -1"),
    ({"space_dim": "x"}, TypeError, "layout.space_dim: expected an int"),
    ({"target_names": ()}, ValueError, "layout.target_names: expected at least one"),
    ({"target_names": ("u", "u")}, ValueError, "layout.target_names: names must be unique"),
    ({"inputs": (InputSpec("g", 1, True), InputSpec("g", 0, False))}, ValueError,
     r"layout.inputs: names must be unique, got \['g', 'g'\]"),
    ({"inputs": ("g",)}, TypeError, "layout.inputs: expected a sequence of InputSpec"),
    ({"theta_dim": -2}, ValueError, "layout.theta_dim: expected an int >= 0"),
    ({"mesh": 1}, TypeError, "layout.mesh: expected a bool, got 1"),
])
def test_a_layout_given_to_the_writer_is_checked_when_made(fields, error, match):
    """A layout given directly (not read from a sample) used to reach h5py unchecked: a negative
    space_dim failed there, a repeated input name only at the first chunk, after the partial
    file was made."""
    good = dict(space_dim=2, target_names=("u",), inputs=(InputSpec("g", 1, True),),
                theta_dim=0, query_weights=False, query_label=False, mesh=False)
    with pytest.raises(error, match=match):
        RaggedLayout(**(good | fields))


def test_a_layout_given_with_lists_equals_the_samples_layout():
    """Lists where the fields are tuples: kept as tuples, so the samples of that layout match
    it (a list made every sample 'not match the file's layout (target_names (...) vs [...])')."""
    layout = RaggedLayout.from_sample(synthetic(0))
    listed = RaggedLayout(layout.space_dim, list(layout.target_names), list(layout.inputs),
                          layout.theta_dim, layout.query_weights, layout.query_label,
                          layout.mesh)
    assert listed == layout and not listed.differences(layout)
    assert isinstance(listed.target_names, tuple) and isinstance(listed.inputs, tuple)


def test_an_input_spec_is_checked_when_made():
    with pytest.raises(ValueError, match="InputSpec\\('g'\\).channels: expected an int >= 0"):
        InputSpec("g", -1, True)
    with pytest.raises(ValueError, match="InputSpec.name: expected identifiers"):
        InputSpec("a b", 1, True)
    with pytest.raises(TypeError, match="InputSpec\\('g'\\).weights: expected a bool"):
        InputSpec("g", 1, "yes")


def _interrupted(tmp_path, n=5, chunk=2, stop=2, fn=synthetic):
    out = tmp_path / "x.h5"

    def flaky(i):
        if i == stop:
            raise KeyboardInterrupt
        return fn(i)
    with pytest.raises(KeyboardInterrupt):
        write(out, n=n, chunk=chunk, fn=flaky)
    return out, partial_path(out)


def _no_room_for_a_copy(monkeypatch):
    """The disk as one without room to copy a partial file: a resume goes on in place."""
    import shutil
    from collections import namedtuple

    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: namedtuple("usage", "total used free")(1 << 30, 0, 1000))


def _datasets(path):
    with h5py.File(path) as f:
        found = {}
        f.visititems(lambda name, obj: found.__setitem__(name, obj[...])
                     if isinstance(obj, h5py.Dataset) else None)
    return found


def _damaged(part, how):
    if how == "rows":  # fewer rows than the completed chunk's offsets
        with h5py.File(part, "r+") as f:
            f["target/values"].resize(1, axis=0)
    else:
        _flip(part, "query/offsets")


def test_a_resume_refuses_another_layout(tmp_path):
    out, part = _interrupted(tmp_path)
    other = RaggedLayout.from_sample(synthetic(0, theta=False))
    with pytest.raises(DataFileError, match=r"its layout differs from this run's \(theta_dim 3 "
                                            r"vs 0\)"):
        _open(out, n_samples=5, layout=other, resume=True)


@pytest.mark.parametrize("how", ["rows", "checksum"])
def test_a_resume_generates_again_the_chunks_it_cannot_read_whole(tmp_path, how):
    """A resume copies the completed chunks into a new file (HDF5 is not crash-safe: a file
    killed mid-write failed or crashed when written again); a chunk whose rows are missing or
    whose checksum fails is generated again, with what follows it."""
    reference = write(tmp_path / "reference.h5", n=5, chunk=2)
    out, part = _interrupted(tmp_path)
    _damaged(part, how)
    assert write(out, n=5, chunk=2, resume=True) == out
    got, want = _datasets(out), _datasets(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize(("how", "match"), [
    ("rows", r"cannot resume .*: target/values has 1 rows, its offsets say \d+"),
    ("checksum", r"cannot resume .*: a stored chunk fails its checksum .*; overwrite=True "
                 r"\(--overwrite\) starts again$")])
def test_a_resume_in_place_refuses_a_damaged_file(tmp_path, monkeypatch, how, match):
    """Without room for the copy, the file is resumed in place, as before: a damaged chunk is
    refused, and --overwrite named."""
    out, part = _interrupted(tmp_path)
    _damaged(part, how)
    _no_room_for_a_copy(monkeypatch)
    with pytest.raises(DataFileError, match=match):
        write(out, n=5, chunk=2, resume=True)


def test_a_resume_in_place_cuts_the_rows_of_an_interrupted_chunk(tmp_path, monkeypatch):
    """Without room for the copy, a resume in place cuts every ragged dataset back to the
    rows of its completed chunks: a chunk killed after appending its rows, before its record,
    would else leave them in front of the rows written again, and the samples after them would
    read another sample's rows (the offsets, rewritten, still check)."""
    reference = write(tmp_path / "reference.h5", n=5, chunk=2)
    out, part = _interrupted(tmp_path, stop=4)  # chunks 0 and 1 stored
    with h5py.File(part, "r+") as f:  # killed after chunk 1's rows, before its record
        f["completed"][1] = 0
    monkeypatch.setattr(ragged, "_room_to_copy", lambda part: False)
    assert write(out, n=5, chunk=2, resume=True) == out
    got, want = _datasets(out), _datasets(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _sized(sizes):
    """Samples of ``sizes[i]`` query points and no other ragged field: large ones put a
    chunk's rows across two of HDF5's chunks of query/points (4096 rows)."""
    def fn(i):
        rng = np.random.default_rng([0, i])
        return {"query": {"points": rng.random((sizes[i], 2)) + 1, "weights": None,
                          "label": None},
                "target": rng.standard_normal((sizes[i], 1)), "target_names": ["u"],
                "inputs": {}, "theta": None, "triangles": None}
    return fn


def _lose_chunks(part, name, keep):
    """HDF5 lost every chunk of the dataset ``name`` but those starting at the rows ``keep``:
    the lost rows read back as zeros, without an error (unallocated chunks)."""
    with h5py.File(part, "r+") as f:
        ds = f[name]
        kept = {row: ds.id.read_direct_chunk((row, 0)) for row in keep}
        shape, maxshape, chunks, dtype = ds.shape, ds.maxshape, ds.chunks, ds.dtype
        assert chunks[0] == 4096
        del f[name]
        new = f.create_dataset(name, shape=shape, maxshape=maxshape, chunks=chunks, dtype=dtype,
                               fletcher32=True)
        for row, (mask, raw) in kept.items():
            new.id.write_direct_chunk((row, 0), raw, mask)


def _resumed_equals_uninterrupted(tmp_path, out, sizes):
    reference = write(tmp_path / "reference.h5", n=len(sizes), chunk=2, fn=_sized(sizes))
    write(out, n=len(sizes), chunk=2, fn=_sized(sizes), resume=True)
    want, got = read_ragged(reference), read_ragged(out)
    assert not (got.query_points == 0).all(axis=1).any()
    np.testing.assert_array_equal(got.query_points, want.query_points)
    np.testing.assert_array_equal(got.target, want.target)


def test_a_resume_checks_every_hdf5_chunk_a_chunks_rows_lie_in(tmp_path):
    """A completed chunk whose rows start inside one HDF5 chunk (rows 4090 to 4097: HDF5
    chunks 0 and 1) is copied only where both HDF5 chunks were stored; the scan for lost HDF5
    chunks starts at the HDF5 chunk holding the first row, not at the row (which, its step
    4096, would check only HDF5 chunk 0 and copy rows 4096 to 4097 as zeros)."""
    sizes = [2000, 2090, 4, 4, 5, 5]
    out, part = _interrupted(tmp_path, n=6, stop=4, fn=_sized(sizes))  # chunks 0, 1 stored
    _lose_chunks(part, "query/points", keep=[0])  # rows 4096.. lost
    _resumed_equals_uninterrupted(tmp_path, out, sizes)


def test_a_resume_stops_copying_at_the_first_lost_chunk(tmp_path):
    """Chunks are appended in order: the copy stops at the first completed chunk HDF5 lost
    (chunk 1, rows 4090 to 8191) and generates it again with all after it, though chunk 2
    (rows 8192 to 8201) was stored whole; copying chunk 2 past the gap would append its rows
    where chunk 1's belong, and the resumed file would read other samples' rows."""
    sizes = [2000, 2090, 6, 4096, 5, 5, 3, 3]
    out, part = _interrupted(tmp_path, n=8, stop=6, fn=_sized(sizes))  # chunks 0 to 2 stored
    _lose_chunks(part, "query/points", keep=[0, 8192])  # rows 4096 to 8191 lost
    _resumed_equals_uninterrupted(tmp_path, out, sizes)


def test_write_ragged_argument_checks(tmp_path):
    out = tmp_path / "a.h5"
    with pytest.raises(TypeError, match="executor: expected a concurrent.futures.Executor, got "
                                        "int"):
        write(out, executor=4)
    with pytest.raises(TypeError, match="sample_fn: expected a function index -> sample dict, "
                                        "got int"):
        write(out, fn=7)
    assert not out.exists() and not partial_path(out).exists()


def test_an_executor_used_from_a_worker_thread(tmp_path, small):
    out, result = tmp_path / "t.h5", {}

    def run():
        with ThreadPoolExecutor(2) as pool:
            result["path"] = write(out, n=5, chunk=2, executor=pool)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert result["path"] == out
    a, b = read_ragged(out), read_ragged(small)
    assert np.array_equal(a.target, b.target) and np.array_equal(a.offsets, b.offsets)


def test_read_variants(small):
    data = read_ragged(small, slice(1, 4))
    assert data.indices.tolist() == [1, 2, 3]
    n = [len(synthetic(i)["target"]) for i in (1, 2, 3)]
    assert data.lengths.tolist() == n
    assert data.inputs["g"].lengths.tolist() == [len(synthetic(i)["inputs"]["g"]["points"])
                                                 for i in (1, 2, 3)]
    with pytest.raises(IndexError, match="j: 3 is out of range for 3 samples"):
        data.sample(3)
    empty = read_ragged(small, [])
    assert len(empty) == 0 and empty.target.shape == (0, 2) and empty.theta.shape == (0, 3)
    assert empty.triangles.shape == (0, 3) and empty.triangles.dtype == np.int32


@pytest.mark.parametrize("indices, match", [
    ([[0, 1]], "indices: expected a 1-D sequence of integers or a slice"),
    ([0.5], "indices: expected a 1-D sequence of integers or a slice"),
    ([0, 5], r"indices: expected values in \[0, 5\), got min 0 and max 5"),
    ([-1], r"indices: expected values in \[0, 5\), got min -1"),
    ([1, 1], "indices: expected no repeated sample"),
])
def test_read_index_checks(small, indices, match):
    with pytest.raises(ValueError, match=match):
        read_ragged(small, indices)


def test_read_field_and_missing_file_checks(small, tmp_path):
    with pytest.raises(ValueError, match=r"fields: expected names among .*got 'label'"):
        read_ragged(small, fields=("query", "label"))
    for fn in (is_ragged_file, read_header, inspect_ragged):
        with pytest.raises(DataFileError, match="does not exist or is not a file"):
            fn(tmp_path / "none.h5")


def test_damaged_files(small, tmp_path):
    short = _copy(small, tmp_path / "short.h5")
    with h5py.File(short, "r+") as f:
        f["target/values"].resize(3, axis=0)
    with pytest.raises(DataFileError, match=r"target/values has 3 rows, fewer than its offsets "
                                            r"need \(\d+\); the file is damaged"):
        read_ragged(short)
    tri = _copy(small, tmp_path / "tri.h5")
    with h5py.File(tri, "r+") as f:
        n0 = int(f["query/offsets"][1])
        f["mesh/triangles"][0, 0] = n0  # a vertex of sample 1, listed in sample 0
    with pytest.raises(DataFileError, match="mesh/triangles has vertex indices outside their "
                                            "samples"):
        read_ragged(tri)
    nocompleted = _copy(small, tmp_path / "nc.h5")
    with h5py.File(nocompleted, "r+") as f:
        del f["completed"]
    with pytest.raises(DataFileError, match="is damaged or lacks schema fields: .*completed"):
        read_header(nocompleted)
    broken = _copy(small, tmp_path / "layout.h5")
    with h5py.File(broken, "r+") as f:
        f.attrs["layout"] = "{not json"
    with pytest.raises(DataFileError, match="lacks ragged schema fields or records a broken "
                                            "layout"):
        read_ragged(broken)
    corrupt = _copy(small, tmp_path / "off.h5")
    _flip(corrupt, "query/offsets")
    with pytest.raises(DataFileError, match="off.h5' is damaged or lacks schema fields"):
        read_ragged(corrupt)
    stats = _copy(small, tmp_path / "stats.h5")
    _flip(stats, "target/values")
    with pytest.raises(DataFileError, match="stats.h5' is damaged or cannot be read"):
        inspect_ragged(stats)


def test_inspect_a_partial_file_with_nothing_written(tmp_path):
    out = tmp_path / "e.h5"
    _open(out, layout=RaggedLayout.from_sample(synthetic(0)), n_samples=4).close()
    info = inspect_ragged(partial_path(out))
    assert info["n_done"] == 0 and not info["complete"]
    assert info["sizes"]["N"] == {"min": None, "max": None, "mean": None, "total": 0}
    assert info["statistics"]["target/values"] == {"count": 0, "names": ["u", "vm"]}
    assert info["statistics"]["theta"] == {"count": 0} and "query/label" not in info["statistics"]


def test_inspect_without_theta(tmp_path):
    out = write(tmp_path / "nt.h5", n=3, chunk=2, fn=lambda i: synthetic(i, theta=False))
    info = inspect_ragged(out)
    assert info["theta_dim"] == 0 and "theta" not in info["statistics"]
    labels = np.concatenate([synthetic(i)["query"]["label"] for i in range(3)])
    assert info["statistics"]["query/label"]["count"] == labels.size


def test_a_file_marked_complete_with_a_chunk_missing_is_incomplete(small, tmp_path):
    """``complete`` needs the file's attribute and every chunk in its completed-chunk record:
    a file whose record lacks its last chunk (sample 4) is incomplete, and read_ragged refuses
    it, though the attribute says complete (trusting the attribute alone would read that
    chunk's samples from rows that may never have been written)."""
    path = _copy(small, tmp_path / "c.h5")
    with h5py.File(path, "r+") as f:
        assert f.attrs["complete"]
        f["completed"][2] = 0
    header = read_header(path)
    assert not header["complete"] and header["n_done"] == 4
    with pytest.raises(DataFileError, match=r"is incomplete \(4 of 5 samples written\)"):
        read_ragged(path)


def test_offsets_not_starting_at_row_0_are_refused(small, tmp_path):
    """Sample 0's rows begin at row 0: offsets beginning at 1 (still increasing) are damage,
    refused, not read as sample 0 without its first row."""
    path = _copy(small, tmp_path / "o.h5")
    with h5py.File(path, "r+") as f:
        f["query/offsets"][0] = 1
    with pytest.raises(DataFileError, match=r"o\.h5'?: query/offsets is not increasing from 0 "
                                            r"\(an empty sample\?\); the file is damaged"):
        read_ragged(path, fields=["query", "target"])


def test_inspect_counts_only_the_rows_of_completed_chunks(tmp_path):
    """A partial file killed after a chunk appended its rows, before its record: inspect's
    statistics are those of the completed chunks' samples, not of every row stored."""
    out, part = _interrupted(tmp_path, stop=4)  # chunks 0 and 1 stored
    with h5py.File(part, "r+") as f:
        f["completed"][1] = 0  # chunk 1's rows appended, its record not
    info = inspect_ragged(part)
    assert info["n_done"] == 2
    target = np.concatenate([synthetic(i)["target"] for i in (0, 1)])
    stats = info["statistics"]["target/values"]
    assert stats["count"] == len(target)
    np.testing.assert_allclose(stats["mean"], target.mean(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(stats["max"], target.max(axis=0))
    weights = np.concatenate([synthetic(i)["query"]["weights"] for i in (0, 1)])
    assert info["statistics"]["query/weights"]["count"] == len(weights)


def test_a_resume_generates_again_a_chunk_whose_last_offset_was_lost(tmp_path):
    """Chunk 0 of 8192 one-point samples ends at query/offsets[8192], the first entry of the
    offsets' second HDF5 chunk (8192 entries): HDF5 lost that one, and the entry reads 0. The
    resume checks every offset of the chunk, its end too, and generates it again (checking
    offsets 0 to 8191 only kept it, with its end lost, and the resumed file was damaged)."""
    layout = RaggedLayout(space_dim=1, target_names=("u",), inputs=(), theta_dim=0,
                          query_weights=False, query_label=False, mesh=False)

    def one_point(i):
        return {"query": {"points": [[float(i)]]}, "target": [[i + 0.5]], "target_names": ["u"],
                "inputs": {}}

    out = tmp_path / "x.h5"
    kw = dict(KW, n_samples=8200, chunk_size=8192, layout=layout)
    w = RaggedWriter.open(out, **kw)
    w.write_chunk(0, [one_point(i) for i in range(8192)])
    w.close()
    with h5py.File(partial_path(out), "r+") as f:  # keep only the offsets' HDF5 chunk 0
        ds = f["query/offsets"]
        mask, raw = ds.id.read_direct_chunk((0,))
        shape, maxshape, chunks, dtype = ds.shape, ds.maxshape, ds.chunks, ds.dtype
        assert chunks == (8192,) and shape[0] > 8192
        del f["query/offsets"]
        new = f.create_dataset("query/offsets", shape=shape, maxshape=maxshape, chunks=chunks,
                               dtype=dtype, fletcher32=True)
        new.id.write_direct_chunk((0,), raw, mask)
        assert new[8192] == 0 and new[8191] == 8191
    w = RaggedWriter.open(out, resume=True, **kw)
    assert w.pending_chunks() == [(0, 0, 8192), (1, 8192, 8200)]
    for chunk, start, stop in w.pending_chunks():
        w.write_chunk(chunk, [one_point(i) for i in range(start, stop)])
    data = read_ragged(w.finish())
    np.testing.assert_array_equal(data.query_points[:, 0], np.arange(8200.0))
    np.testing.assert_array_equal(data.target[:, 0], np.arange(8200.0) + 0.5)
