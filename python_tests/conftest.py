"""Shared fixtures. Random inputs are fresh every run; the seed is printed in the header and can
be fixed with GALERKIN_TEST_SEED=<int> to reproduce a failure."""

import atexit
import os
import random
import shutil
import tempfile
import zlib

# A private inductor cache: the on-disk FX-graph cache does not key on custom ops' fake kernels,
# so graphs compiled against an older build of this package could be reused. Removed at exit,
# so that test runs leave no folders behind in /tmp.
_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="galerkin_ext_inductor_")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
atexit.register(shutil.rmtree, _INDUCTOR_CACHE, ignore_errors=True)
# Under pytest-xdist (the README's `-n auto`) each worker runs on one core: one torch thread per
# worker, and for the scripts it starts, since two threads stall while another process holds a
# core. Set before torch is imported, which reads it once.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
# A suite run inside a launcher's job (torchrun's, a cluster's) inherits its WORLD_SIZE and RANK:
# every test, and every script a test starts, would take itself for one process of a group
# (the Trainer then refuses to run without a ctx). The tests that need them set them.
for _name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
    os.environ.pop(_name, None)

import pytest  # noqa: E402
import torch  # noqa: E402

SEED = int(os.environ.get("GALERKIN_TEST_SEED", random.SystemRandom().randrange(2**31)))
os.environ["GALERKIN_TEST_SEED"] = str(SEED)  # the xdist workers, started later, inherit it
# torch 2.5, the oldest admitted, cannot trace an FFT at symbolic sizes (export and dynamo)
TORCH_BEFORE_2_6 = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 6)


def skip_where_subnormals_flush() -> None:
    """Skip the calling test in a process that flushes subnormals to zero: once torch 2.5's
    inductor has loaded compiled code, 1e-40 * 1 is 0 and a subnormal compares equal to 0."""
    if float(torch.tensor(1e-40) * 1.0) == 0.0:  # (float32's subnormals)
        pytest.skip("this process flushes subnormals to zero (e.g. once torch 2.5's inductor has "
                    "loaded compiled code)")


def pytest_report_header(config):
    return f"galerkin_ext test seed: GALERKIN_TEST_SEED={SEED}"


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded from the session seed and the test's id: fresh per run, reproducible."""
    g = torch.Generator()
    g.manual_seed(SEED ^ zlib.crc32(request.node.nodeid.encode()))
    return g


def record_fsyncs_and_renames(monkeypatch) -> list[tuple]:
    """From now on, os.fsync and os.replace recorded in order, as ``("fsync", inode, size)`` and
    ``("replace", source inode, destination)``: a file put under its name by a rename must be
    fsync-ed whole before it (no test crashes the machine, so only the calls show it)."""
    events: list[tuple] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino, os.fstat(fd).st_size))
        return fsync(fd)

    def spy_replace(src, dst, *args, **kwargs):
        events.append(("replace", os.stat(src).st_ino, os.fspath(dst)))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    return events


def run_processes(worker, args: tuple, nprocs: int, timeout_s: float) -> None:
    """``worker(rank, *args)`` in ``nprocs`` spawned processes, joined; a test failure naming
    the timeout where they are not done in ``timeout_s`` (a stuck collective would otherwise
    hang the suite), their exceptions re-raised by torch."""
    import time

    import torch.multiprocessing as mp

    context = mp.start_processes(worker, args=args, nprocs=nprocs, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{nprocs} processes did not finish in {timeout_s} s")


class InterruptAt:
    """``real`` wrapped to raise KeyboardInterrupt, as Ctrl-C would, at its ``at``-th call (the
    generators' tests patch a solver with it to stop a run mid-way); ``calls`` counts them."""

    def __init__(self, real, at: int) -> None:
        self.real, self.at, self.calls = real, at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.real(*args, **kwargs)
