"""training/checkpoint.py's argument checks and rarely taken branches: each check reached
through the public API, each branch with its result checked."""

import errno
import json
import math
import os

import pytest
import torch
from conftest import record_fsyncs_and_renames

from galerkin_ext.training import atomic_write, write_csv, write_json
from galerkin_ext.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    content_digest,
    load_checkpoint,
    save_checkpoint,
)


def test_atomic_write_needs_a_callable(tmp_path):
    with pytest.raises(TypeError, match="^write: expected a callable taking a binary file, "
                                        "got b'data'"):
        atomic_write(tmp_path / "f", b"data")
    assert not list(tmp_path.iterdir())


def test_atomic_write_fsyncs_the_temporary_file_before_the_rename(tmp_path, monkeypatch):
    """The promise "flushed and fsync-ed before the rename": the temporary file, holding all
    its bytes, is fsync-ed before os.replace puts it under the name (else a crash soon after
    the rename can leave the name on an empty or partial file; no test crashes the machine,
    so only a spy on the calls sees a missing fsync)."""
    events = record_fsyncs_and_renames(monkeypatch)
    path = atomic_write(tmp_path / "f.bin", lambda f: f.write(b"x" * 1000))
    renames = [i for i, event in enumerate(events) if event[0] == "replace"]
    assert len(renames) == 1 and events[renames[0]][2] == str(path)
    inode = events[renames[0]][1]
    assert ("fsync", inode, 1000) in events[:renames[0]]
    assert path.read_bytes() == b"x" * 1000


def test_write_json_and_csv_check_their_data(tmp_path):
    with pytest.raises(TypeError, match="^data: expected a mapping or a list, got tuple"):
        write_json(tmp_path / "a.json", (1, 2))
    with pytest.raises(TypeError, match="^rows: expected a sequence of mappings$"):
        write_csv(tmp_path / "a.csv", [{"a": 1}, [("a", 2)]])
    assert not list(tmp_path.iterdir())


def test_write_json_indents_a_list_of_objects(tmp_path):
    data = {"rows": [{"a": 1}, {"b": [1.5, None]}], "flat": [1, 2]}
    path = write_json(tmp_path / "a.json", data)
    text = path.read_text()
    assert json.loads(text) == data
    assert '"rows": [\n' in text and '"flat": [1, 2]' in text


def test_write_json_writes_nan_and_reads_it_back(tmp_path):
    """A NaN metric (a diverged run's error, a missed threshold's value) is written as
    Python's json writes it, the token NaN, and read back as NaN: write_json does not fail,
    nor turn it into null, inside objects or in one-line arrays of numbers."""
    nan = float("nan")
    path = write_json(tmp_path / "m.json", {"test_rel_l2": nan, "history": [1.5, nan],
                                           "checks": {"a": {"value": nan, "met": False}}})
    text = path.read_text()
    assert '"test_rel_l2": NaN' in text and '"history": [1.5, NaN]' in text
    back = json.loads(text)
    assert math.isnan(back["test_rel_l2"]) and math.isnan(back["checks"]["a"]["value"])
    assert back["history"][0] == 1.5 and math.isnan(back["history"][1])


def test_the_digest_covers_each_tensors_shape(tmp_path):
    """Tensors of the same bytes and other shapes differ (a normaliser's (n, 1) statistics
    reshaped to (1, n) broadcast otherwise): a checkpoint reshaped after saving is refused."""
    mean = torch.arange(4.0)
    assert content_digest({"m": mean[:, None]}) != content_digest({"m": mean[None, :]})
    path = tmp_path / "c.pt"
    save_checkpoint(path, "best", epoch=1, model={"shift": mean[:, None]}, config={}, metric=0.5)
    state = torch.load(path, weights_only=True)
    state["model"]["shift"] = state["model"]["shift"].reshape(1, 4)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="c.pt"):
        load_checkpoint(path, "best")


def test_the_digest_covers_keys_named_sha256_below_the_top():
    """Only the checkpoint's own field is left out (load_checkpoint removes it before
    recomputing); a value a user stored under a nested "sha256" key was not covered."""
    assert content_digest({"a": {"sha256": "x"}}) != content_digest({"a": {"sha256": "y"}})
    assert content_digest({"a": [{"sha256": 1}]}) != content_digest({"a": [{"sha256": 2}]})


def test_checkpoints_with_nested_sha256_keys_load_whichever_version_wrote_them(tmp_path):
    """Before 2026-11-25 the digest left out nested keys named sha256 too: such checkpoints (a
    user's run_config holding a file's hash, say) still load, and a flipped nested value in a
    new one is still found."""
    from galerkin_ext.training.checkpoint import _digest

    config = {"data": {"source": "x", "sha256": "abc"}}
    old = {"format": CHECKPOINT_FORMAT, "kind": "best", "epoch": 1,
           "model": {"w": torch.ones(3)}, "metric": 0.5, "config": config}
    old["sha256"] = _digest(old, skip_sha256_keys=True)  # as the older version wrote it
    torch.save(old, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt", "best")["config"] == config
    save_checkpoint(tmp_path / "new.pt", "best", epoch=1, model={"w": torch.ones(3)},
                    metric=0.5, config=config)
    state = torch.load(tmp_path / "new.pt", weights_only=True)
    state["config"]["data"]["sha256"] = "abd"
    torch.save(state, tmp_path / "new.pt")
    with pytest.raises(CheckpointError, match="is corrupt"):
        load_checkpoint(tmp_path / "new.pt", "best")


def test_a_checkpoint_of_an_unknown_kind_is_refused_when_any_kind_is_asked_for(tmp_path):
    """load_checkpoint(path) (kind=None: either kind) refuses a file whose kind is neither
    'last' nor 'best' with a CheckpointError naming the file; without the check the fields of
    that kind were looked up, a bare KeyError('weird') naming neither file nor problem."""
    path = tmp_path / "x.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "kind": "weird", "epoch": 1}, path)
    with pytest.raises(CheckpointError, match=r"x\.pt' is a 'weird' checkpoint, expected None"):
        load_checkpoint(path)


def test_a_checkpoint_lacking_fields_of_its_kind_is_refused(tmp_path):
    """A 'last' checkpoint without the fields a resumption reads (optimizer, scheduler, rng,
    ...) is refused on load, naming them, even with a checksum that matches its content;
    loaded, the missing fields would be found only when a resumption looked them up, with
    an error naming neither the file nor the fields."""
    state = {"format": CHECKPOINT_FORMAT, "kind": "last", "epoch": 3, "model": {}, "config": {}}
    state["sha256"] = content_digest(state)
    path = tmp_path / "x.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"x\.pt' lacks the fields \[.*'optimizer'.*'rng'"
                                              r".*\] of a 'last' checkpoint"):
        load_checkpoint(path, "last")


def test_a_full_disk_while_writing_names_the_target_and_leaves_it_as_it_was(tmp_path):
    """An ENOSPC (or EFBIG: a file-size limit) raised by ``write`` keeps its errno and names
    the file being written, not the temporary one, whose removal leaves the old content; the
    bare "No space left on device" of the write named neither."""
    path = tmp_path / "m.json"
    path.write_bytes(b"old")
    for number in (errno.ENOSPC, errno.EFBIG):
        def full(f, number=number):
            f.write(b"new, partly")
            raise OSError(number, os.strerror(number))

        with pytest.raises(OSError) as info:
            atomic_write(path, full)
        assert info.value.errno == number
        assert f"while writing {str(path)!r}, which is left as it was" in str(info.value)
        assert path.read_bytes() == b"old"
        assert list(tmp_path.iterdir()) == [path]


def test_the_digest_covers_each_tensors_dtype(tmp_path):
    """A float32 tensor and its int32 view hold the same bytes in the same shape: only the
    dtype tells them apart, and a checkpoint whose tensor was so reinterpreted is refused."""
    weight = torch.tensor([1.0, -2.5, 3.0])
    same_bytes = weight.view(torch.int32)
    assert same_bytes.numpy().tobytes() == weight.numpy().tobytes()
    assert content_digest({"w": weight}) != content_digest({"w": same_bytes})
    path = tmp_path / "c.pt"
    save_checkpoint(path, "best", epoch=1, model={"w": weight}, config={}, metric=0.5)
    state = torch.load(path, weights_only=True)
    state["model"]["w"] = state["model"]["w"].view(torch.int32)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="is corrupt"):
        load_checkpoint(path, "best")


def test_the_digest_covers_the_key_names(tmp_path):
    """The same values under other names differ (a layer's weights under another layer's
    name, a renamed setting): a checkpoint whose key was renamed is refused."""
    assert content_digest({"a": 1}) != content_digest({"b": 1})
    weight = torch.ones(2)
    assert content_digest({"m": {"encoder.w": weight}}) != \
        content_digest({"m": {"decoder.w": weight}})
    path = tmp_path / "c.pt"
    save_checkpoint(path, "best", epoch=1, model={"w": torch.ones(3)},
                    config={"lr": 0.1}, metric=0.5)
    state = torch.load(path, weights_only=True)
    state["config"] = {"weight_decay": state["config"]["lr"]}
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="is corrupt"):
        load_checkpoint(path, "best")
