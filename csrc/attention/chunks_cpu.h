// Chunks of prepared rows for the fused CPU kernels (kv_reduce_cpu.cpp, q_apply_cpu.cpp): the row
// kernels (prepare_cpu.h) build a chunk, the products of gemm_cpu.h consume it while it is still
// in cache, and no operand-sized buffer is ever written. Against whole prepared operands this
// removes most of the memory traffic. Chunk buffers have rows of vector_width (chunk_buffer), so
// the products load whole vectors.
#pragma once

#include "prepare_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace galerkin_ext::cpu {

// Points per chunk: a chunk operand takes at most 256 KiB, so the few a task holds stay in L2
// or near it (on this 2-core EPYC, 512 KiB of L2 per core, 256 KiB chunks beat 128 KiB at D =
// 32: GNOT-shaped normalised attention 1.55x eager against 1.26x, in one run each of
// benchmarks/attention.py), and the chunk count is about a multiple of the thread count (the
// loops are statically split). Sums over the points (S, dS) go to one partial sum per slot, a
// run of consecutive chunks, one slot per thread, each chunk added in order: the partials take
// slots · B·H·dk·dv, where one per chunk took (N·ld / 64 Ki) · B·H·dk·dv, 8× the operands at
// dk = dv = 1024. A result depends on the chunking and the slots (set by the sizes and the
// thread count), never on which thread ran what.
struct Chunking {
  int64_t rows, count, slots;
  Chunking(int64_t n, int64_t ld, int64_t element_size) {
    TORCH_INTERNAL_ASSERT(n > 0, "Chunking: no points (core.cpp answers those calls)");
    const int64_t cache_rows = std::max<int64_t>(8, 256 * 1024 / element_size / ld / 8 * 8);
    const int64_t threads = at::get_num_threads();
    const int64_t per_thread = ((n + cache_rows - 1) / cache_rows + threads - 1) / threads;
    const int64_t target = per_thread * threads;
    rows = ((n + target - 1) / target + 7) / 8 * 8;
    count = (n + rows - 1) / rows;
    slots = std::min(threads, count);
  }
  int64_t first(int64_t c) const { return c * rows; }
  int64_t size(int64_t c, int64_t n) const { return std::min(rows, n - c * rows); }
  // The chunks of slot s are [slot_first(s), slot_first(s + 1)).
  int64_t slot_first(int64_t s) const { return count * s / slots; }
};

// A chunk buffer of `rows` rows of ld elements, zeroed once: the rows' builders and products
// write only each row's own columns, and the padding beyond, which the products' vector loads
// read into lanes they discard, stays zero (no uninitialised reads, no denormals met by chance).
inline at::Tensor chunk_buffer(int64_t rows, int64_t ld, const at::TensorOptions& options) {
  return at::zeros({rows, ld}, options);
}

// Σ over dim 0 of per-slot partial sums (slots, ...), in slot order.
inline at::Tensor sum_slots(const at::Tensor& partial) {
  return partial.size(0) == 1 ? partial.select(0, 0) : partial.sum(0);
}

// Builds rows [n0, n0 + m) of operand (b, h) into chunk (rows, ld), their statistics into stats.
template <typename scalar_t, typename acc_t>
void build_chunk(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n0, int64_t m,
                 acc_t eps, acc_t* scratch, at::Tensor& chunk, acc_t* stats) {
  prepare_rows(r, b, h, n0, m, eps, scratch, chunk.mutable_data_ptr<scalar_t>(), chunk.size(1),
               stats);
}

// Row backward of rows [n0, n0 + m) of operand (b, h): the gradients w.r.t. the prepared rows
// are in chunk (rows, ld); grad_x rows go to grad_x (B, H, N, D) contiguous.
template <typename scalar_t, typename acc_t>
void chunk_backward(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n0, int64_t m,
                    const at::Tensor& chunk, const acc_t* stats, at::Tensor& grad_x, acc_t* xhat,
                    acc_t* dy, const RowGradSums<acc_t>& sums) {
  scalar_t* dx = grad_x.mutable_data_ptr<scalar_t>() + ((b * r.H + h) * r.N + n0) * r.D;
  prepare_rows_backward(r, b, h, n0, m, stats, chunk.const_data_ptr<scalar_t>(), chunk.size(1),
                        dx, r.D, xhat, dy, sums);
}

}  // namespace galerkin_ext::cpu
