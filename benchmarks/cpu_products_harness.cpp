// Timing harness of benchmarks/cpu_products.py: the CPU products of csrc/attention/gemm_cpu.h
// against ATen's mm (MKL on x86 wheels) on the same operands, best of `reps` runs each.
#include <torch/extension.h>

#include <algorithm>
#include <chrono>

#include "gemm_cpu.h"

namespace {

template <typename F>
double best_seconds(int64_t reps, F&& f) {
  f();  // warm-up: caches, MKL's buffers
  double best = 1e30;
  for (int64_t r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

// Seconds of out = x · a and of out = xᵀ y, ours and ATen's, for x (m, K), a (K, W), y (m, W).
std::vector<double> time_products(int64_t m, int64_t K, int64_t W, int64_t reps) {
  const torch::Tensor x = torch::randn({m, K}), a = torch::randn({K, W});
  // y's rows padded to whole vectors, as the chunk buffers are (rows_transposed_times_rows).
  const torch::Tensor y = torch::randn({m, galerkin_ext::cpu::vector_width(W)}).narrow(1, 0, W);
  torch::Tensor out = torch::empty({m, W}), reduced = torch::empty({K, W});
  return {
      best_seconds(reps, [&] { galerkin_ext::cpu::rows_times_matrix(out, x, a); }),
      best_seconds(reps, [&] { at::mm_out(out, x, a); }),
      best_seconds(reps, [&] { galerkin_ext::cpu::rows_transposed_times_rows(reduced, x, y); }),
      best_seconds(reps, [&] { at::mm_out(reduced, x.t(), y); }),
  };
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("time_products", &time_products);
}
