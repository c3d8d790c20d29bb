"""training/checkpoint.py's argument checks and rarely taken branches: each check reached
through the public API, each branch with its result checked."""

import json

import pytest
import torch

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
