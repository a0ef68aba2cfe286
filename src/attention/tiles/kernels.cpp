// Compiles kernels-inl.h once per SIMD target and dispatches each call of kernels.h to the best
// target this CPU supports (chosen once, at the first call; mha::pin_simd_target in
// mha/core/simd.h pins it). The targets are the library's (HWY_DISABLED_TARGETS, set for every mha
// library in CMakeLists.txt): the micro-kernel keeps its accumulators in an array of vectors,
// which the scalable-vector targets (SVE, RVV) left out there do not allow.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/tiles/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "attention/tiles/kernels-inl.h"

#if HWY_ONCE
#include "attention/tiles/kernels.h"
#include "mha/core/simd.h"

namespace mha::attention::detail::tiles {

HWY_EXPORT(OnlineSoftmaxTile);
HWY_EXPORT(ProbabilitiesTile);
HWY_EXPORT(ScoreGradientsTile);
HWY_EXPORT(DropoutTile);

void online_softmax_tile(const ScoreTile& tile, double* row_max, double* row_sum, float* out, size_t out_stride,
                         size_t out_cols) {
  HWY_DYNAMIC_DISPATCH(OnlineSoftmaxTile)(tile, row_max, row_sum, out, out_stride, out_cols);
}

void probabilities_tile(const ScoreTile& tile, const float* lse_hi, const float* lse_lo, float* dprob,
                        double* row_dot, double* row_mass) {
  HWY_DYNAMIC_DISPATCH(ProbabilitiesTile)(tile, lse_hi, lse_lo, dprob, row_dot, row_mass);
}

void score_gradients_tile(float* probs, float* dprob, size_t stride, size_t rows, size_t cols, const float* delta,
                          const float* dropout, const float* renormalize, const float* cap_slope,
                          const Bf16Operands* bf16) {
  HWY_DYNAMIC_DISPATCH(ScoreGradientsTile)(probs, dprob, stride, rows, cols, delta, dropout, renormalize, cap_slope,
                                           bf16);
}

void dropout_tile(uint64_t seed, uint64_t batch_head, uint32_t i0, size_t rows, uint32_t j0, size_t cols, double p,
                  float kept, float* factor, size_t stride) {
  HWY_DYNAMIC_DISPATCH(DropoutTile)(seed, batch_head, i0, rows, j0, cols, p, kept, factor, stride);
}

}  // namespace mha::attention::detail::tiles

// MHA_CPU_TARGET's ceiling, set while the program starts, before any dispatch (mha/core/simd.h).
[[maybe_unused]] static const bool cpu_target_applied = mha::detail::apply_cpu_target_from_environment();

#endif  // HWY_ONCE
