"""The compiled extension ``_C``, loaded with a message that says what to do when it cannot be:
most often torch was upgraded (or downgraded) after the build, which shows up as an undefined
C++ symbol, or the package is imported from a source tree that was never built."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType

import torch

REBUILD = "pip install --no-build-isolation --no-deps --force-reinstall ."


def load_error_message(error: ImportError, built_with: str | None, installed: str,
                       folder: Path) -> str:
    """Why ``_C`` failed to import from the package ``folder``, given the torch it was compiled
    against (``None``: no build record, i.e. never built there) and the torch installed now."""
    if built_with is None:
        return (f"galerkin_ext: the compiled extension is missing from {folder}. If that is "
                "the source folder of an installed galerkin_ext, Python took it instead "
                "because it runs in its parent folder (the current folder comes first on "
                "sys.path): run from another folder. Else build and install it from the "
                f"source folder: {REBUILD}")
    if built_with != installed:
        return (f"galerkin_ext was compiled against torch {built_with}, but torch {installed} "
                f"is installed; rebuild it against this torch from the source folder: "
                f"{REBUILD} ({error})")
    return (f"galerkin_ext: cannot load its compiled extension from {folder} ({error}); "
            f"rebuild and reinstall it from the source folder: {REBUILD}")


def load_extension() -> ModuleType:
    """``galerkin_ext._C`` (registering ``torch.ops.galerkin_ext``), or an ImportError saying
    why not and how to fix it."""
    try:
        from . import _C  # type: ignore[attr-defined]  # (compiled; no stub for mypy)
    except ImportError as err:
        built_with: str | None
        try:
            from ._build_info import TORCH_VERSION
            built_with = TORCH_VERSION
        except ImportError:
            built_with = None
        raise ImportError(load_error_message(err, built_with, torch.__version__,
                                             Path(__file__).parent)) from err
    from . import _build_info

    warn_if_single_threaded(getattr(_build_info, "CPU_KERNELS_THREADED", True))
    return _C


def warn_if_single_threaded(threaded: bool) -> None:
    """Warn where the build found no OpenMP for a torch that runs on it (Apple clang has none):
    the CPU kernels' ``at::parallel_for`` then runs on one thread, whatever torch's count."""
    if not threaded:
        warnings.warn("galerkin_ext was compiled without OpenMP, which this torch uses: its CPU "
                      "kernels run on one thread, not torch's "
                      f"{torch.get_num_threads()}. Rebuild it with a compiler that has OpenMP "
                      f"({REBUILD}; the README's Platforms)", stacklevel=3)
