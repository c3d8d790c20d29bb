// The row-range kernels of prepare_cpu.h, compiled once per element type and cloned per
// instruction set (GALERKIN_EXT_CPU_KERNEL).
#include "prepare_cpu.h"

namespace galerkin_ext::cpu {

template <typename scalar_t, typename acc_t>
GALERKIN_EXT_CPU_KERNEL void prepare_rows(const Rows<scalar_t>& r, int64_t b, int64_t h,
                                          int64_t n0, int64_t m, acc_t eps, acc_t* scratch,
                                          scalar_t* out, int64_t ld, acc_t* stats) {
  for (int64_t i = 0; i < m; ++i) {
    const RowStats<acc_t> s = prepare_row(r, b, h, n0 + i, eps, scratch, out + i * ld);
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

}  // namespace galerkin_ext::cpu
