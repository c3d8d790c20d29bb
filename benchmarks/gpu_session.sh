#!/usr/bin/env bash
# What a GPU session runs, in few device calls: build the CUDA extension, then the stages named
# in $STAGES (required; run in this order), each under its own time limit so that one call stays
# inside the device's 10 minutes. Logs and JSON go to $OUT (default benchmarks/results).
#   tests      the CUDA op tests (float64 references, poisoned outputs, graphs, compile)
#   table1     benchmarks/table1.py, the paper's Table 1 ($TABLE1_ARGS: more of its options)
#   sanitize   compute-sanitizer memcheck over the CUDA test file, racecheck over a subset
#   bench      benchmarks/attention.py on the GPU: float32 (also the N sweep) and bfloat16
#   profile    device time per kernel (torch.profiler), and Nsight Compute's counters of ours
# At most 8 files come back from one device call and the stages' time limits add up to 1,940 s:
# choose the stages of each call accordingly (e.g. STAGES="tests table1 sanitize", then
# "bench profile").
# Each stage reports its commands' exit status (of the last that failed, if any did).
# The original package is benchmarked when its wheel is in .whl/ (carry .whl to the device):
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl galerkin-transformer==0.2.1
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results}
stages=${STAGES:?"set it to the stages of this call, e.g. STAGES='tests table1 sanitize'"}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py="python3 -P"  # -P: import the installed package, not the source folder (nor the script's)
export PYTHONPATH=$PWD/benchmarks  # the benchmarks import each other

stage() {  # stage NAME SECONDS COMMAND...: run when NAME is in $stages, report its time
  local name=$1 limit=$2
  shift 2
  [[ " $stages " == *" $name "* ]] || return 0
  local t0=$SECONDS
  timeout "$limit" "$@"
  echo "== $name: exit $?, $((SECONDS - t0)) s"
}

# no GPU: stop before the build reinstalls the package (an editable install too) for CUDA
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" \
  2>&1 || { echo "gpu_session.sh: no NVIDIA GPU here (nvidia-smi: $(tail -1 "$out/gpu.txt"))" >&2
            exit 1; }
cat "$out/gpu.txt"
t0=$SECONDS
GALERKIN_EXT_CUDA=ON python3 -m pip install --no-build-isolation --no-deps . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
echo "== build: $((SECONDS - t0)) s"
$py -c "from galerkin_ext import ops; assert ops.cuda_built(), 'built without CUDA'" || exit 1

impls=ours,eager,compiled
if ls .whl/galerkin_transformer-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/original .whl/galerkin_transformer-*.whl
  export PYTHONPATH=/tmp/original:$PYTHONPATH
  impls=$impls,original
fi
gpu=$($py -c "import torch; print(torch.cuda.get_device_name().split()[1].lower())")
cuda_tests="python_tests/test_op_core_cuda.py python_tests/test_attention_cuda.py"
# pytest -q hides the header with the inputs' seed: fix it here, so a failure can be rerun.
export GALERKIN_TEST_SEED=${GALERKIN_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "GALERKIN_TEST_SEED=$GALERKIN_TEST_SEED"

# the continuum attention's memory bound (SPEC-continuum §1.1), PyTorch's kernels: not sanitised
continuum_memory=python_tests/test_continuum_attention.py::test_cuda_memory_stays_linear_in_the_keys
stage tests 300 bash -c "{ echo GALERKIN_TEST_SEED=\$GALERKIN_TEST_SEED; $py -m pytest $cuda_tests $continuum_memory -q \
  -p no:cacheprovider -rf --tb=short; } > $out/tests_cuda.log 2>&1; rc=\$?; tail -25 $out/tests_cuda.log; exit \$rc"
stage table1 ${TABLE1_LIMIT:-560} bash -c "$py benchmarks/table1.py --device cuda ${TABLE1_ARGS:-} --impls ${impls/,eager,compiled/} \
  --out $out/table1.json \
  > $out/table1.log 2>&1; rc=\$?; tail -30 $out/table1.log; exit \$rc"
stage sanitize 420 bash -c "rc=0
  timeout ${MEMCHECK_LIMIT:-300} compute-sanitizer --tool memcheck $py -m pytest $cuda_tests -q \
    -p no:cacheprovider > $out/memcheck.log 2>&1 || rc=\$?; tail -4 $out/memcheck.log
  timeout 100 compute-sanitizer --tool racecheck $py -m pytest $cuda_tests -q -p no:cacheprovider \
    -k 'match_explicit_sums and float32 and (65 or 2100)' > $out/racecheck.log 2>&1 || rc=\$?
  tail -4 $out/racecheck.log; exit \$rc"
# (not continuum_dropout nor the TNO shapes: on CUDA that op is SDPA on both sides)
gpu_ops=galerkin,fourier,normalized,galerkin_no_norm,fourier_dropout
gpu_shapes=burgers,burgers_quick,host,darcy_quick,darcy_coarse,large,gnot,narrow_heads
stage bench 420 bash -c "rc=0
  $py benchmarks/attention.py --device cuda --impls $impls --reps 20 --ops $gpu_ops \
    --shapes $gpu_shapes --out $out/attention_cuda_${gpu}_float32.json \
    > $out/bench_float32.log 2>&1 || rc=\$?
  $py benchmarks/attention.py --device cuda --impls ${impls/,compiled/} --shapes '' --sweep \
    --ops $gpu_ops --reps 10 --out $out/attention_cuda_${gpu}_float32_sweep.json \
    > $out/bench_sweep.log 2>&1 || rc=\$?
  $py benchmarks/attention.py --device cuda --impls $impls --dtype bfloat16 --reps 20 \
    --ops $gpu_ops --shapes burgers,darcy_coarse,large,gnot \
    --out $out/attention_cuda_${gpu}_bfloat16.json > $out/bench_bfloat16.log 2>&1 || rc=\$?
  cat $out/bench_float32.log $out/bench_sweep.log $out/bench_bfloat16.log | grep -v Warn
  exit \$rc"
stage profile 240 bash -c "rc=0
  $py benchmarks/profile_cuda.py --shapes burgers,darcy_coarse,large --out $out/profile.json \
    > $out/profile.log 2>&1 || rc=\$?; cat $out/profile.log
  ncu --clock-control none -k regex:'reduce_kernel|apply_|sum_kernel' --launch-count 12 \
    --metrics gpu__time_duration.sum,dram__bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
    $py benchmarks/profile_cuda.py --shapes large --ops galerkin --reps 1 --out $out/ncu.json \
    > $out/ncu.log 2>&1 || rc=\$?
  grep -E '^  [a-z_]+|duration|dram__|sm__|registers' $out/ncu.log | head -90; exit \$rc"
