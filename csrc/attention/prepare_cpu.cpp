// CPU twin of the fused operand preparation: per-head layer norm, coordinates in front, row
// scale by the quadrature weight (forward), and its backward. One pass over each row.
#include "attention.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace galerkin_ext {
namespace {

// Elements of work per parallel task, as ATen's own element-wise loops use.
constexpr int64_t kGrainElements = 32768;

// Raw pointers and strides of one OperandSpec, resolved once per call.
template <typename scalar_t>
struct Rows {
  int64_t B, H, N, D, P;
  int64_t sb, sh, sn, sd;  // strides of x
  const scalar_t* x;
  const scalar_t* pos;     // null when there are no coordinates
  int64_t pos_sb;          // 0 when pos is shared over the batch
  const scalar_t* weight;  // null when uniform
  int64_t weight_sb;       // 0 when the weight is shared over the batch
  bool weighted;
  const scalar_t* gamma;   // null when the operand has no norm
  const scalar_t* beta;

  explicit Rows(const OperandSpec& s)
      : B(s.x.size(0)), H(s.x.size(1)), N(s.x.size(2)), D(s.x.size(3)),
        P(s.pos ? s.pos->size(-1) : 0),
        sb(s.x.stride(0)), sh(s.x.stride(1)), sn(s.x.stride(2)), sd(s.x.stride(3)),
        x(s.x.const_data_ptr<scalar_t>()),
        pos(s.pos ? s.pos->const_data_ptr<scalar_t>() : nullptr),
        pos_sb(s.pos && s.pos->dim() == 3 ? N * P : 0),
        weight(s.weighted && s.weight ? s.weight->const_data_ptr<scalar_t>() : nullptr),
        weight_sb(s.weight && s.weight->dim() == 2 ? N : 0),
        weighted(s.weighted),
        gamma(s.norm_weight ? s.norm_weight->const_data_ptr<scalar_t>() : nullptr),
        beta(s.norm_bias ? s.norm_bias->const_data_ptr<scalar_t>() : nullptr) {}

  // Copies row (b, h, n) of x into dst, converted to the accumulation type.
  template <typename acc_t>
  void load(int64_t b, int64_t h, int64_t n, acc_t* dst) const {
    const scalar_t* src = x + b * sb + h * sh + n * sn;
    if (sd == 1) {
      for (int64_t j = 0; j < D; ++j) dst[j] = acc_t(src[j]);
    } else {
      for (int64_t j = 0; j < D; ++j) dst[j] = acc_t(src[j * sd]);
    }
  }
  template <typename acc_t>
  acc_t scale(int64_t b, int64_t n) const {
    if (!weighted) return acc_t(1);
    return weight ? acc_t(weight[b * weight_sb + n]) : acc_t(1) / acc_t(N);
  }
};

template <typename scalar_t>
void prepare_forward_impl(const OperandSpec& spec, double eps, at::Tensor& hat,
                          at::Tensor& stats) {
  using acc_t = at::opmath_type<scalar_t>;
  const Rows<scalar_t> r(spec);
  const int64_t d = r.P + r.D, ld = hat.size(-1);
  scalar_t* out = hat.mutable_data_ptr<scalar_t>();
  acc_t* st = stats.mutable_data_ptr<acc_t>();
  const int64_t rows = r.B * r.H * r.N;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(d, 1));

  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> row(r.D);  // the input row in unit stride, whatever its layout
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i % r.N, h = (i / r.N) % r.H, b = i / (r.N * r.H);
      r.load(b, h, n, row.data());
      scalar_t* o = out + i * ld;
      std::fill(o + d, o + ld, scalar_t(0));
      const acc_t s = r.template scale<acc_t>(b, n);
      if (r.pos) {
        const scalar_t* p = r.pos + b * r.pos_sb + n * r.P;
        for (int64_t j = 0; j < r.P; ++j) o[j] = static_cast<scalar_t>(acc_t(p[j]) * s);
      }
      o += r.P;
      if (!r.gamma) {
        for (int64_t j = 0; j < r.D; ++j) o[j] = static_cast<scalar_t>(row[j] * s);
        continue;
      }
      // Two passes over a row that stays in cache: exact mean, then the biased variance.
      acc_t sum = 0;
      for (int64_t j = 0; j < r.D; ++j) sum += row[j];
      const acc_t mean = sum / acc_t(r.D);
      acc_t sq = 0;
      for (int64_t j = 0; j < r.D; ++j) sq += (row[j] - mean) * (row[j] - mean);
      const acc_t rstd = acc_t(1) / std::sqrt(sq / acc_t(r.D) + acc_t(eps));
      st[2 * i] = mean;
      st[2 * i + 1] = rstd;
      const scalar_t* g = r.gamma + h * r.D;
      const scalar_t* bt = r.beta + h * r.D;
      for (int64_t j = 0; j < r.D; ++j) {
        o[j] = static_cast<scalar_t>(((row[j] - mean) * rstd * acc_t(g[j]) + acc_t(bt[j])) * s);
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
  acc_t* part = nullptr;
  if (norm) {
    partial = at::zeros({blocks, 2, r.H, r.D}, stats.options());
    part = partial.mutable_data_ptr<acc_t>();
  }

  at::parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    std::vector<acc_t> xhat(r.D), dy(r.D);  // one row in unit stride
    for (int64_t blk = block_begin; blk < block_end; ++blk) {
      const int64_t n0 = blk * r.N / blocks, n1 = (blk + 1) * r.N / blocks;
      acc_t* dgamma = norm ? part + blk * 2 * r.H * r.D : nullptr;
      acc_t* dbeta = norm ? dgamma + r.H * r.D : nullptr;
      for (int64_t b = 0; b < r.B; ++b) {
        for (int64_t h = 0; h < r.H; ++h) {
          const scalar_t* gam = norm ? r.gamma + h * r.D : nullptr;
          const scalar_t* bet = norm ? r.beta + h * r.D : nullptr;
          for (int64_t n = n0; n < n1; ++n) {
            const int64_t i = (b * r.H + h) * r.N + n;
            scalar_t* g = gh + i * ld;  // read whole, then overwritten by grad_x at g + P
            const acc_t s = r.template scale<acc_t>(b, n);
            // x̂ (the normalised row, or the row itself without a norm) and dy = s · grad.
            r.load(b, h, n, xhat.data());
            if (norm) {
              const acc_t mean = st[2 * i], rstd = st[2 * i + 1];
              for (int64_t j = 0; j < r.D; ++j) xhat[j] = (xhat[j] - mean) * rstd;
            }
            for (int64_t j = 0; j < r.D; ++j) dy[j] = s * acc_t(g[r.P + j]);
            if (gpos) {
              acc_t* gp = gpos + b * r.pos_sb + n * r.P;
              for (int64_t j = 0; j < r.P; ++j) gp[j] += s * acc_t(g[j]);
            }
            if (gw) {
              // d/dw of w · row: the unscaled row is rebuilt, as w may be zero.
              acc_t dot = 0;
              if (r.pos) {
                const scalar_t* p = r.pos + b * r.pos_sb + n * r.P;
                for (int64_t j = 0; j < r.P; ++j) dot += acc_t(g[j]) * acc_t(p[j]);
              }
              for (int64_t j = 0; j < r.D; ++j) {
                const acc_t y = norm ? xhat[j] * acc_t(gam[j]) + acc_t(bet[j]) : xhat[j];
                dot += acc_t(g[r.P + j]) * y;
              }
              gw[b * r.weight_sb + n] += dot;
            }
            scalar_t* dx = g + r.P;
            if (!norm) {
              for (int64_t j = 0; j < r.D; ++j) dx[j] = static_cast<scalar_t>(dy[j]);
              continue;
            }
            // dx = rstd (γ∘dy − mean(γ∘dy) − x̂ mean(γ∘dy∘x̂))
            const acc_t rstd = st[2 * i + 1];
            acc_t c1 = 0, c2 = 0;
            for (int64_t j = 0; j < r.D; ++j) {
              const acc_t gdy = dy[j] * acc_t(gam[j]);
              c1 += gdy;
              c2 += gdy * xhat[j];
              dgamma[h * r.D + j] += dy[j] * xhat[j];
              dbeta[h * r.D + j] += dy[j];
            }
            c1 /= acc_t(r.D);
            c2 /= acc_t(r.D);
            for (int64_t j = 0; j < r.D; ++j) {
              dx[j] = static_cast<scalar_t>(rstd * (dy[j] * acc_t(gam[j]) - c1 - xhat[j] * c2));
            }
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
