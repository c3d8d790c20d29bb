// CPU operand preparation (attention.h): the range kernels of prepare_cpu.h, cloned per instruction
// set, and the whole-tensor preparation built on them.
#include "prepare_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>


namespace galerkin_ext {
namespace cpu {

template <typename scalar_t, typename acc_t>
GALERKIN_EXT_CPU_KERNEL void prepare_rows(const Rows<scalar_t>& r, int64_t b, int64_t h,
                                          int64_t n0, int64_t m, acc_t eps, acc_t* scratch,
                                          scalar_t* out, int64_t ld, acc_t* stats) {
  for (int64_t i = 0; i < m; ++i) {
    const RowStats<acc_t> s = prepare_row(r, b, h, n0 + i, eps, scratch, out + i * ld, ld);
    stats[2 * i] = s.mean;
    stats[2 * i + 1] = s.rstd;
  }
}

template <typename scalar_t, typename acc_t>
GALERKIN_EXT_CPU_KERNEL void prepare_rows_backward(const Rows<scalar_t>& r, int64_t b, int64_t h,
                                                   int64_t n0, int64_t m, const acc_t* stats,
                                                   const scalar_t* grad, int64_t ld,
                                                   scalar_t* dx, int64_t ldx, acc_t* xhat,
                                                   acc_t* dy, const RowGradSums<acc_t>& sums) {
  for (int64_t i = 0; i < m; ++i) {
    prepare_row_backward(r, b, h, n0 + i, RowStats<acc_t>{stats[2 * i], stats[2 * i + 1]},
                         grad + i * ld, dx + i * ldx, xhat, dy, sums);
  }
}

#define GALERKIN_EXT_INSTANTIATE(scalar_t)                                                       \
  template void prepare_rows<scalar_t, scalar_t>(const Rows<scalar_t>&, int64_t, int64_t,        \
                                                 int64_t, int64_t, scalar_t, scalar_t*,          \
                                                 scalar_t*, int64_t, scalar_t*);                 \
  template void prepare_rows_backward<scalar_t, scalar_t>(                                      \
      const Rows<scalar_t>&, int64_t, int64_t, int64_t, int64_t, const scalar_t*,               \
      const scalar_t*, int64_t, scalar_t*, int64_t, scalar_t*, scalar_t*,                       \
      const RowGradSums<scalar_t>&);
GALERKIN_EXT_INSTANTIATE(float)
GALERKIN_EXT_INSTANTIATE(double)
#undef GALERKIN_EXT_INSTANTIATE

}  // namespace cpu

namespace {

using cpu::Rows;

// Elements of work per parallel task, as ATen's own element-wise loops use.
constexpr int64_t kGrainElements = 32768;

template <typename scalar_t>
void prepare_forward_impl(const OperandSpec& spec, double eps, at::Tensor& hat,
                          at::Tensor& stats) {
  using acc_t = at::opmath_type<scalar_t>;
  const Rows<scalar_t> r(spec);
  const int64_t ld = hat.size(-1);
  scalar_t* out = hat.mutable_data_ptr<scalar_t>();
  acc_t* st = stats.mutable_data_ptr<acc_t>();
  const int64_t grain = std::max<int64_t>(1, kGrainElements / ld);

  at::parallel_for(0, r.B * r.H * r.N, grain, [&](int64_t begin, int64_t end) {
    cpu::AlignedBuffer<acc_t> scratch(r.D);
    // Row i = (b·H + h)·N + n; the range is cut where (b, h) changes.
    for (int64_t i = begin; i < end;) {
      const int64_t bh = i / r.N, n0 = i % r.N, m = std::min(end - i, r.N - n0);
      cpu::prepare_rows(r, bh / r.H, bh % r.H, n0, m, acc_t(eps), scratch.data(), out + i * ld,
                        ld, st + 2 * i);
      i += m;
    }
  });
}

template <typename scalar_t>
void prepare_backward_impl(const OperandSpec& spec, at::Tensor& grad_hat,
                           const at::Tensor& stats, OperandGrads& grads) {
  using acc_t = at::opmath_type<scalar_t>;
  const Rows<scalar_t> r(spec);
  const int64_t ld = grad_hat.size(-1);
  scalar_t* gh = grad_hat.mutable_data_ptr<scalar_t>();
  const acc_t* st = stats.const_data_ptr<acc_t>();
  acc_t* gpos = grads.grad_pos_acc ? grads.grad_pos_acc->mutable_data_ptr<acc_t>() : nullptr;
  acc_t* gw = grads.grad_weight_acc ? grads.grad_weight_acc->mutable_data_ptr<acc_t>() : nullptr;
  const bool norm = r.gamma != nullptr;
  if (!norm && !r.weighted && !gpos) return;  // grad_x is grad_hat[..., P:] as it stands

  // Parallel over blocks of points: a block owns its rows of grad_pos and grad_weight for every
  // batch and head, so the sums over heads (and over the batch for shared pos/weight) need no
  // atomics. The norm-parameter gradients are summed per block, then over blocks.
  const int64_t blocks = std::min<int64_t>(r.N, 4 * at::get_num_threads());
  at::Tensor partial;
  if (norm) partial = at::zeros({blocks, 2, r.H, r.D}, stats.options());

  at::parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    cpu::AlignedBuffer<acc_t> xhat(r.D), dy(r.D);
    for (int64_t blk = block_begin; blk < block_end; ++blk) {
      const int64_t n0 = blk * r.N / blocks, n1 = (blk + 1) * r.N / blocks;
      acc_t* dgamma = norm ? partial.mutable_data_ptr<acc_t>() + blk * 2 * r.H * r.D : nullptr;
      const cpu::RowGradSums<acc_t> sums{gpos, gw, dgamma, norm ? dgamma + r.H * r.D : nullptr};
      for (int64_t bh = 0; bh < r.B * r.H; ++bh) {
        const int64_t i = bh * r.N + n0;
        scalar_t* g = gh + i * ld;  // grad_x replaces the gradient at g + P, in place
        cpu::prepare_rows_backward(r, bh / r.H, bh % r.H, n0, n1 - n0, st + 2 * i, g, ld,
                                   g + r.P, ld, xhat.data(), dy.data(), sums);
      }
    }
  });

  if (norm) {
    const at::Tensor total = partial.sum(0);  // (2, H, D), summed in a fixed block order
    grads.grad_norm_weight->copy_(total[0]);
    grads.grad_norm_bias->copy_(total[1]);
  }
}

}  // namespace

void prepare_forward_cpu(const OperandSpec& spec, double eps, at::Tensor& hat,
                         at::Tensor& stats) {
  AT_DISPATCH_FLOATING_TYPES(spec.x.scalar_type(), "galerkin_ext_prepare_forward_cpu", [&] {
    prepare_forward_impl<scalar_t>(spec, eps, hat, stats);
  });
}

void prepare_backward_cpu(const OperandSpec& spec, at::Tensor& grad_hat,
                          const at::Tensor& stats, OperandGrads& grads) {
  AT_DISPATCH_FLOATING_TYPES(spec.x.scalar_type(), "galerkin_ext_prepare_backward_cpu", [&] {
    prepare_backward_impl<scalar_t>(spec, grad_hat, stats, grads);
  });
}

}  // namespace galerkin_ext
