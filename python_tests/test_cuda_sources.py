"""Compile-checks of the CUDA sources, so a machine without a GPU still catches their errors.

Every ``.cu`` file under ``csrc/`` is compiled with ``nvcc``; the ATen glue (``*_cuda.cpp``) and
the device-agnostic orchestration as a CUDA build compiles it are syntax-checked with the host
compiler against torch's headers and the CUDA runtime headers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from galerkin_ext._build_info import CXX_STANDARD
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
CU_FILES = sorted(CSRC.rglob("*.cu"))
GLUE_FILES = [*sorted(CSRC.rglob("*_cuda.cpp")), CSRC / "attention" / "core.cpp"]
NVCC = shutil.which("nvcc")
STD = f"-std=c++{CXX_STANDARD}"  # the build's, which follows torch's headers (CMakeLists.txt)


def _cuda_include() -> Path | None:
    candidates = [Path(os.environ[key]) / "include" for key in ("CUDA_HOME", "CUDA_PATH")
                  if key in os.environ]
    if NVCC:
        candidates.append(Path(NVCC).resolve().parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return next((p for p in candidates if (p / "cuda_runtime.h").exists()), None)


def test_cuda_sources_exist():
    assert CU_FILES and GLUE_FILES, "the CUDA kernels and their glue belong in csrc/"


@pytest.fixture(scope="module")
def nvcc_runs(tmp_path_factory) -> dict[Path, subprocess.Popen]:
    """Every ``.cu`` file compiling at once; each test waits for its own.

    ``-Xcicc -O0`` turns off only the device-code optimiser (NVVM): the C++ front end, the
    template instantiations and ptxas still run, so the build's errors and front-end warnings
    are caught, in ~20 s per file instead of ~3 minutes."""
    out = tmp_path_factory.mktemp("nvcc")
    return {source: subprocess.Popen(
        [NVCC, STD, "-O2", "-arch=sm_90", "-Xcicc", "-O0", "-I", str(CSRC),
         "-Xcompiler", "-Wall", "-Werror", "all-warnings", "-c", str(source),
         "-o", str(out / f"{i}.o")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, source in enumerate(CU_FILES)}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: CUDA sources not compile-checked")
@pytest.mark.parametrize("source", CU_FILES, ids=lambda p: str(p.relative_to(CSRC)))
def test_cu_file_compiles_with_nvcc(source, nvcc_runs):
    process = nvcc_runs[source]
    _, stderr = process.communicate()
    assert process.returncode == 0 and not stderr.strip(), stderr


@pytest.mark.skipif(_cuda_include() is None, reason="CUDA runtime headers not found")
@pytest.mark.parametrize("source", GLUE_FILES, ids=lambda p: str(p.relative_to(CSRC)))
def test_cuda_glue_compiles(source, tmp_path):
    # CPU wheels of torch lack one generated CUDA header; an empty-enough stand-in is placed
    # after torch's include dirs, so a CUDA torch's real header wins.
    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
    compiler = sysconfig.get_config_var("CXX") or "c++"
    includes = [flag for path in cpp_extension.include_paths() for flag in ("-isystem", path)]
    cmd = [*compiler.split()[:1], STD, "-fsyntax-only", "-Wall", "-Wextra",
           "-Wno-unused-parameter", "-Werror", "-DGALERKIN_EXT_WITH_CUDA", "-I", str(CSRC),
           *includes, "-isystem", str(tmp_path), "-isystem", str(_cuda_include()), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
