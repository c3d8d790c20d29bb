"""training/distributed.py's helpers on their own: which process is the main one, that
``barrier`` waits for the main process, that ``all_reduce_sum`` sums in place over 2 gloo
processes (spawned once) and that ``cleanup_distributed`` leaves the group it joined and only
that one. The torchrun runs of whole scripts are in test_training.py and test_examples.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import run_processes

from galerkin_ext.training import DistributedContext, cleanup_distributed, setup_distributed

WORLD = 2
SPAWN_TIMEOUT_S = 120
# How long the main process works before its barrier: the other reaches its own at once, so
# without the wait it would look for the main's file well within this time.
MAIN_DELAY_S = 1.0


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # the processes share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    try:
        ctx = DistributedContext(rank=rank, world_size=WORLD)
        marker = Path(out_dir) / "written_by_main"
        if ctx.is_main:
            time.sleep(MAIN_DELAY_S)
            marker.write_text("done")
        ctx.barrier()
        saw_marker = marker.exists()
        # (the first entries differ between the ranks: a max or a mean is not their sum)
        values = torch.tensor([rank + 1.0, 10.0 * rank])
        summed = ctx.all_reduce_sum(values)
        results = {"saw_main_file": saw_marker, "in_place": summed is values,
                   "sum": values.tolist()}
        cleanup_distributed(ctx)
        results["left_group"] = not dist.is_initialized()
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        if dist.is_initialized():  # failed on the way: leave without waiting for the other
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Each rank's results, from 2 gloo processes spawned once."""
    folder = tmp_path_factory.mktemp("distributed")
    run_processes(_worker, (str(folder / "init"), str(folder)), WORLD, SPAWN_TIMEOUT_S)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_barrier_waits_for_the_main_process(ranks: list[dict]) -> None:
    """What the main process wrote before the barrier is there for every process after it."""
    assert [r["saw_main_file"] for r in ranks] == [True] * WORLD


def test_all_reduce_sum_sums_over_the_processes_in_place(ranks: list[dict]) -> None:
    assert [r["sum"] for r in ranks] == [[1.0 + 2.0, 0.0 + 10.0]] * WORLD
    assert all(r["in_place"] for r in ranks)


def test_cleanup_leaves_the_group(ranks: list[dict]) -> None:
    assert all(r["left_group"] for r in ranks)


def test_the_main_process_is_rank_0_not_each_nodes_first() -> None:
    """On several nodes every node has a local rank 0; only global rank 0 writes the run's
    files and shows progress."""
    for rank, local_rank, main in ((0, 0, True), (1, 0, False), (2, 0, False), (3, 1, False)):
        ctx = DistributedContext(rank=rank, world_size=4, local_rank=local_rank)
        assert ctx.is_main == main, (rank, local_rank)


def test_cleanup_of_a_single_process_context_keeps_the_callers_group(tmp_path: Path) -> None:
    """A group of one, initialised by the caller, gives a single-process context; its cleanup
    is a no-op and leaves the caller's group as it was."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1)
    try:
        ctx = setup_distributed("cpu")
        assert not ctx.enabled
        cleanup_distributed(ctx)
        assert dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
