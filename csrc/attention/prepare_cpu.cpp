// CPU twin of the whole-tensor operand preparation (attention.h): the row kernels of
// prepare_cpu.h applied to every row of an operand in parallel.
#include "prepare_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>

#include <vector>

namespace galerkin_ext {
namespace {

using cpu::RowStats;
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
  const int64_t rows = r.B * r.H * r.N;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / ld);

  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> row(r.D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i % r.N, h = (i / r.N) % r.H, b = i / (r.N * r.H);
      const RowStats<acc_t> s = cpu::prepare_row(r, b, h, n, acc_t(eps), row.data(),
                                                 out + i * ld, ld);
      if (r.gamma) {
        st[2 * i] = s.mean;
        st[2 * i + 1] = s.rstd;
      }
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
    std::vector<acc_t> xhat(r.D), dy(r.D);
    for (int64_t blk = block_begin; blk < block_end; ++blk) {
      const int64_t n0 = blk * r.N / blocks, n1 = (blk + 1) * r.N / blocks;
      acc_t* dgamma = norm ? partial.mutable_data_ptr<acc_t>() + blk * 2 * r.H * r.D : nullptr;
      const cpu::RowGradSums<acc_t> sums{gpos, gw, dgamma, norm ? dgamma + r.H * r.D : nullptr};
      for (int64_t b = 0; b < r.B; ++b) {
        for (int64_t h = 0; h < r.H; ++h) {
          for (int64_t n = n0; n < n1; ++n) {
            const int64_t i = (b * r.H + h) * r.N + n;
            const RowStats<acc_t> s = norm ? RowStats<acc_t>{st[2 * i], st[2 * i + 1]}
                                           : RowStats<acc_t>{acc_t(0), acc_t(1)};
            scalar_t* g = gh + i * ld;  // grad_x replaces the gradient at g + P
            cpu::prepare_row_backward(r, b, h, n, s, g, g + r.P, xhat.data(), dy.data(), sums);
          }
        }
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
