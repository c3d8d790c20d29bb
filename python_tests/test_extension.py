"""Loading the compiled extension: the build records its torch, and an extension that cannot be
loaded (torch changed after the build, or never built) says why and how to rebuild."""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import galerkin_ext
from galerkin_ext import _build_info
from galerkin_ext._extension import REBUILD, load_error_message, warn_if_single_threaded


def test_the_build_records_the_torch_it_was_compiled_against():
    assert _build_info.TORCH_VERSION == torch.__version__
    # and the C++ standard of its headers: C++20 from torch 2.14 on, which C++17 cannot compile
    assert _build_info.CXX_STANDARD == (20 if torch.__version__ >= "2.14" else 17)
    # and whether its CPU kernels run on torch's threads (OpenMP found, as it is here)
    assert _build_info.CPU_KERNELS_THREADED is True


def test_a_build_without_openmp_is_said_at_import():
    """Built by a compiler without OpenMP (Apple clang), the kernels' at::parallel_for runs on
    one thread: CMake's warning was hidden by pip, and nothing else said so."""
    import warnings

    with pytest.warns(UserWarning, match=r"compiled without OpenMP, which this torch uses: its "
                                         r"CPU kernels run on one thread, not torch's \d+"):
        warn_if_single_threaded(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_single_threaded(True)


def test_messages():
    error = ImportError("undefined symbol: _ZN3c108ListType3get")
    folder = Path("/src/galerkin_ext")
    message = load_error_message(error, "2.11.0", "2.13.0+cpu", folder)
    assert "compiled against torch 2.11.0, but torch 2.13.0+cpu is installed" in message
    assert REBUILD in message and "undefined symbol" in message
    # a source folder taken for the installed package (python -c in its parent folder): the
    # rebuild alone did not help; each message says what to do
    missing = load_error_message(error, None, "2.13.0", folder)
    assert f"missing from {folder}" in missing and "run from another folder" in missing
    assert REBUILD in missing
    other = load_error_message(error, "2.13.0", "2.13.0", folder)
    assert str(error) in other and REBUILD in other


def _import_ops_from(package_parent: Path) -> subprocess.CompletedProcess:
    """``import galerkin_ext.ops`` in a fresh interpreter from a copy of the package (an
    editable install's import redirection, if any, is taken out of the way)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'Redirecting' not in type(f).__name__]; "
            "import galerkin_ext.ops")
    return subprocess.run([sys.executable, "-c", code, str(package_parent)],
                          capture_output=True, text=True, timeout=120)


def test_another_torch_or_no_build_is_named_on_import(tmp_path):
    copy = tmp_path / "galerkin_ext"
    shutil.copytree(Path(galerkin_ext.__file__).parent, copy,
                    ignore=shutil.ignore_patterns("_C*", "_build_info.py", "__pycache__"))
    proc = _import_ops_from(tmp_path)
    assert proc.returncode != 0 and "the compiled extension is missing" in proc.stderr, (
        proc.stderr[-2000:])
    # an extension that does not load beside a record of another torch
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (copy / f"_C{suffix}").write_bytes(b"not a shared library")
    (copy / "_build_info.py").write_text('TORCH_VERSION = "1.0.0"\n')
    proc = _import_ops_from(tmp_path)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert f"compiled against torch 1.0.0, but torch {torch.__version__}" in proc.stderr, (
        proc.stderr[-2000:])


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake (the build's own)")
def test_an_unknown_cuda_request_is_refused(tmp_path):
    """GALERKIN_EXT_CUDA=cpu fell through to 'auto', which builds the CUDA kernels wherever
    torch has CUDA."""
    import pybind11

    proc = subprocess.run(
        ["cmake", "-S", str(Path(__file__).resolve().parents[1]), "-B", str(tmp_path),
         "-DGALERKIN_EXT_CUDA=cpu", f"-DPython_EXECUTABLE={sys.executable}",
         f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "GALERKIN_EXT_CUDA must be auto, ON or OFF, got 'cpu'" in proc.stderr, proc.stderr
