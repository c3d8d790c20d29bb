"""The compiled extension ``_C``, loaded with a message that says what to do when it cannot be:
most often torch was upgraded (or downgraded) after the build, which shows up as an undefined
C++ symbol, or the package is imported from a source tree that was never built."""

from __future__ import annotations

from types import ModuleType

import torch

REBUILD = "pip install --no-build-isolation --no-deps --force-reinstall ."


def load_error_message(error: ImportError, built_with: str | None, installed: str) -> str:
    """Why ``_C`` failed to import, given the torch it was compiled against (``None``: no build
    record, i.e. never built) and the torch installed now."""
    if built_with is None:
        return ("galerkin_ext: the compiled extension is missing (a source tree that was never "
                f"built?); build and install it from the source folder: {REBUILD}")
    if built_with != installed:
        return (f"galerkin_ext was compiled against torch {built_with}, but torch {installed} "
                f"is installed; rebuild it against this torch from the source folder: "
                f"{REBUILD} ({error})")
    return f"galerkin_ext: cannot load its compiled extension: {error}"


def load_extension() -> ModuleType:
    """``galerkin_ext._C`` (registering ``torch.ops.galerkin_ext``), or an ImportError saying
    why not and how to fix it."""
    try:
        from . import _C
    except ImportError as err:
        try:
            from ._build_info import TORCH_VERSION as built_with
        except ImportError:
            built_with = None
        raise ImportError(load_error_message(err, built_with, torch.__version__)) from err
    return _C
