#!/usr/bin/env bash
# Everything a GPU session measures, in one command: build the CUDA extension, run the CUDA and
# CPU op tests, then the attention benchmark on the GPU. Logs and JSON go to $OUT (default
# benchmarks/results). The original package is benchmarked when its wheel is in .whl/:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl galerkin-transformer==0.2.1
# (it is pure Python, so any platform's wheel works; carry .whl to the device).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
GALERKIN_EXT_CUDA=ON pip install --no-build-isolation --no-deps . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
python -P -c "from galerkin_ext import ops; assert ops.cuda_built(), 'built without CUDA'"

impls=ours,eager,compiled
if ls .whl/galerkin_transformer-*.whl > /dev/null 2>&1; then
  pip install -q --no-index --no-deps --target /tmp/original .whl/galerkin_transformer-*.whl
  export PYTHONPATH=/tmp/original${PYTHONPATH:+:$PYTHONPATH}
  impls=$impls,original
fi

pytest python_tests/test_attention_cuda.py python_tests/test_attention_ops.py -q \
  -p no:cacheprovider 2>&1 | tee "$out/tests_cuda.log" | tail -15

gpu=$(python -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
python benchmarks/attention.py --device cuda --impls "$impls" --sweep \
  --out "$out/attention_cuda_$gpu.json" 2>&1 | tee "$out/bench_cuda.log"
