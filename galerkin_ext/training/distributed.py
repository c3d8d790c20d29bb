"""Device choice and multi-process data parallelism (``torchrun`` + ``DistributedDataParallel``).

Launch a script with ``torchrun --nproc_per_node=K script.py ...``: torchrun sets ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK``, and :func:`setup_distributed` joins the process group (NCCL on
CUDA, each process on ``cuda:LOCAL_RANK``; gloo on CPU).  Without torchrun it returns a
single-process context and nothing else changes.
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .._checks import check_int, resolve_device

__all__ = ["DistributedContext", "resolve_device", "setup_distributed", "cleanup_distributed"]


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits: ``rank`` of ``world_size`` processes, on ``device`` (a
    ``torch.device`` or its name, e.g. ``'cpu'``, as :func:`resolve_device` takes it)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    def __post_init__(self) -> None:
        # frozen: the checked values replace the given ones through object.__setattr__
        for name, minimum in (("rank", 0), ("world_size", 1), ("local_rank", 0)):
            object.__setattr__(self, name, check_int(getattr(self, name), name, minimum))
        if self.rank >= self.world_size:
            raise ValueError(f"rank: expected an int < world_size = {self.world_size}, "
                             f"got {self.rank}")
        # A context that disagrees with the process group it runs in splits the samples wrongly
        # (shares missing or counted twice) without an error.
        if self.world_size > 1 and dist.is_initialized():
            group = (dist.get_rank(), dist.get_world_size())
            if (self.rank, self.world_size) != group:
                raise ValueError(f"rank, world_size: this process is rank {group[0]} of "
                                 f"{group[1]} in the process group, got rank {self.rank} of "
                                 f"{self.world_size}")
        if not isinstance(self.device, str | torch.device):
            raise TypeError(f"device: expected a torch.device or a str such as 'cpu', got "
                            f"{type(self.device).__name__}")
        object.__setattr__(self, "device", resolve_device(self.device))

    @property
    def enabled(self) -> bool:
        """True when running under a process group of more than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and shows progress."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every process (no-op in a single process)."""
        if self.enabled:
            dist.barrier()

    def main_only(self, work: Callable[[], object]) -> None:
        """Run ``work`` (the main process's own work, such as writing its files) on the main
        process only, and raise what it raised on every process: a failure there alone left
        the others waiting in their next collective until the group's timeout. Every process
        calls it, and the others wait there for the main one."""
        failure: Exception | None = None
        if self.is_main:
            try:
                work()
            except Exception as err:  # (re-raised below, on every process)
                failure = err
        if self.enabled:
            shared: list[Any] = [failure]
            try:  # (the others unpickle it)
                pickle.loads(pickle.dumps(failure))
            except Exception:  # (e.g. an argument that cannot be pickled, or passed back)
                shared = [RuntimeError(f"{type(failure).__name__}: {failure}")]
            dist.broadcast_object_list(shared, src=0)
            if shared[0] is not None and not self.is_main:
                raise shared[0]
        if failure is not None:
            raise failure

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the processes, in place, and return it."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an integer, "
                         f"got {value!r}") from None


def launch_place() -> tuple[int, int]:
    """``(world_size, rank)`` of the process group this process has joined, else those
    ``torchrun`` set in the environment (``(1, 0)`` when started alone)."""
    if dist.is_initialized():  # a group joined beforehand (e.g. by torch.multiprocessing.spawn)
        return dist.get_world_size(), dist.get_rank()
    return _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)


def setup_distributed(device: str | torch.device | None = None) -> DistributedContext:
    """Join the ``torchrun`` process group if there is one and pick this process's device.

    ``device`` as in :func:`resolve_device`; under torchrun a CUDA device becomes
    ``cuda:LOCAL_RANK``.  A process group initialised before the call is taken as it is (its
    rank and size; ``LOCAL_RANK``, if unset, is the rank).  Call :func:`cleanup_distributed` at
    the end of the script.
    """
    dev = resolve_device(device)
    world, rank = launch_place()
    if world <= 1:
        return DistributedContext(device=dev)
    local_rank = _env_int("LOCAL_RANK", rank)
    if dev.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} "
                               f"CUDA devices are visible; use --nproc_per_node <= that")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        # torch._dynamo, imported once the group exists (every optimiser imports it), keeps
        # references to the world group: destroy_process_group then left gloo's worker threads
        # running, and one that dropped a collective's tensors while the interpreter shut down
        # aborted the process ("terminate called without an active exception"). Imported
        # first, it holds none, and cleanup_distributed's destroy joins the threads.
        importlib.import_module("torch._dynamo")  # (a plain import would bind torch here)

        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo",
                                rank=rank, world_size=world)
    return DistributedContext(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def cleanup_distributed(ctx: DistributedContext) -> None:
    """Leave the process group (no-op in a single process).

    The processes first wait for each other: the main process often still writes results when
    the others are done, and a gloo group torn down on one side while the other still holds it
    could abort the process ("terminate called without an active exception").
    """
    if not isinstance(ctx, DistributedContext):
        raise TypeError(f"ctx: expected a DistributedContext, got {type(ctx).__name__}")
    if ctx.enabled and dist.is_initialized():
        # Held until the group is gone: gloo frees a work's tensors when the barrier after it
        # is freed, and a worker thread freeing a tensor Python had dropped waits for the GIL,
        # which destroy_process_group holds while it joins that thread (torch 2.5.1: a rank
        # hung at exit in 1 of 24 torchrun runs on busy cores, and in both torchrun tests of a
        # full suite run). Freed here instead, with the GIL.
        barrier = dist.barrier(async_op=True)
        barrier.wait()
        dist.destroy_process_group()
        del barrier
