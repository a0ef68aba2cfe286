// Compiles kernels-inl.h once per SIMD target and dispatches each call of kernels.h to the best
// target this CPU supports (chosen once, at the first call).
//
// Scalable-vector targets (SVE, RVV) are left out: the micro-kernel keeps its accumulators in an
// array of vectors, which sizeless vector types do not allow. Fixed-width targets cover x86
// (AVX-512, AVX2, SSE4, SSSE3) and Arm (NEON), with portable scalar code as the fallback.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/cpu_flash/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "attention/cpu_flash/kernels-inl.h"

#if HWY_ONCE
#include <string>
#include <vector>

#include "attention/cpu_flash/cpu_flash.h"
#include "mha/core/error.h"

namespace mha::attention::detail::cpu_flash {

HWY_EXPORT(PanelWidth);
HWY_EXPORT(Gemm);
HWY_EXPORT(PackRows);
HWY_EXPORT(PackTransposed);
HWY_EXPORT(OnlineSoftmaxTile);
HWY_EXPORT(ProbabilitiesTile);
HWY_EXPORT(ScoreGradientsTile);
HWY_EXPORT(DropoutTile);

size_t panel_width() { return HWY_DYNAMIC_DISPATCH(PanelWidth)(); }

void gemm(size_t m, size_t n, size_t k, MatrixA a, PanelsB b, MatrixC c, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(Gemm)(m, n, k, a, b, c, accumulate);
}

void pack_rows(const float* x, size_t ld, size_t k, size_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(PackRows)(x, ld, k, n, dst);
}

void pack_transposed(const float* x, size_t ld, size_t n, size_t k, float* dst) {
  HWY_DYNAMIC_DISPATCH(PackTransposed)(x, ld, n, k, dst);
}

void online_softmax_tile(const ScoreTile& tile, float* row_max, double* row_sum, float* out, size_t out_stride,
                         size_t out_cols) {
  HWY_DYNAMIC_DISPATCH(OnlineSoftmaxTile)(tile, row_max, row_sum, out, out_stride, out_cols);
}

void probabilities_tile(const ScoreTile& tile, const float* lse_hi, const float* lse_lo, float* dprob,
                        double* row_dot, double* row_mass) {
  HWY_DYNAMIC_DISPATCH(ProbabilitiesTile)(tile, lse_hi, lse_lo, dprob, row_dot, row_mass);
}

void score_gradients_tile(float* probs, float* dprob, size_t stride, size_t rows, size_t cols, const float* delta,
                          const float* dropout, const float* renormalize) {
  HWY_DYNAMIC_DISPATCH(ScoreGradientsTile)(probs, dprob, stride, rows, cols, delta, dropout, renormalize);
}

void dropout_tile(uint64_t seed, uint64_t batch_head, uint32_t i0, size_t rows, uint32_t j0, size_t cols, double p,
                  float kept, float* factor, size_t stride) {
  HWY_DYNAMIC_DISPATCH(DropoutTile)(seed, batch_head, i0, rows, j0, cols, p, kept, factor, stride);
}

}  // namespace mha::attention::detail::cpu_flash

namespace mha::attention::detail {
namespace {
// The targets compiled in (HWY_TARGETS) that this CPU supports, best first, whatever is pinned.
std::vector<int64_t> available_targets(int64_t pinned) {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  hwy::SetSupportedTargetsForTest(pinned);
  return targets;
}
int64_t pinned_target = 0;  // 0: none
}  // namespace

std::vector<std::string> cpu_flash_targets() {
  std::vector<std::string> names;
  for (int64_t target : available_targets(pinned_target)) names.push_back(hwy::TargetName(target));
  return names;
}

void force_cpu_flash_target(const std::string& name) {
  int64_t target = 0;
  for (int64_t t : available_targets(0))
    if (name == hwy::TargetName(t)) target = t;
  check(name.empty() || target != 0, "force_cpu_flash_target: no target named '", name, "' here");
  pinned_target = target;
  hwy::SetSupportedTargetsForTest(target);  // 0: back to the CPU's own best target
}

}  // namespace mha::attention::detail
#endif  // HWY_ONCE
