// layer_norm_kernels.h's kernel, once per SIMD target (foreach_target), dispatched by Highway.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "nn/layer_norm_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "layer_norm_kernels.h"

#ifndef MHA_NN_LAYER_NORM_KERNELS_ONCE
#define MHA_NN_LAYER_NORM_KERNELS_ONCE
namespace mha::nn::detail {
constexpr int64_t kPartials = 8;  // partial sums per statistic (layer_norm_kernels.h)
inline double as_double(float x) { return x; }
inline double as_double(bfloat16 x) { return to_float(x); }
inline double sum_of_partials(const double* s) { return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])); }
}  // namespace mha::nn::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace mha::nn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<double>;
using DF = hn::Rebind<float, D>;
using DU16 = hn::Rebind<uint16_t, D>;
using DU32 = hn::Rebind<uint32_t, D>;
using DI64 = hn::RebindToSigned<D>;
using DU64 = hn::RebindToUnsigned<D>;

// Lanes(D()) doubles from p.
HWY_INLINE hn::Vec<D> LoadDouble(const float* p) { return hn::PromoteTo(D(), hn::LoadU(DF(), p)); }
HWY_INLINE hn::Vec<D> LoadDouble(const bfloat16* p) {
  const auto bits = hn::PromoteTo(DU32(), hn::LoadU(DU16(), reinterpret_cast<const uint16_t*>(p)));
  return hn::PromoteTo(D(), hn::BitCast(DF(), hn::ShiftLeft<16>(bits)));
}

// v rounded once to float / bfloat16, stored at out.
HWY_INLINE void StoreRounded(hn::Vec<D> v, float* out) { hn::StoreU(hn::DemoteTo(DF(), v), DF(), out); }
HWY_INLINE void StoreRounded(hn::Vec<D> v, bfloat16* out) {
  const DU64 du;
  const auto bits = hn::BitCast(du, v);
  const auto magnitude = hn::And(bits, hn::Set(du, 0x7fffffffffffffffu));
  // bfloat16's normal range [2⁻¹²⁶, 2¹²⁸) in every lane: to_bfloat16(double)'s inline rounding,
  // lane by lane; otherwise the scalar function for all of them.
  const auto m = hn::BitCast(DI64(), magnitude);
  const auto outside = hn::Or(hn::Lt(m, hn::Set(DI64(), 0x3810000000000000)), hn::Lt(hn::Set(DI64(), 0x47efffffffffffff), m));
  if (!hn::AllFalse(DI64(), outside)) {
    HWY_ALIGN double lanes[hn::MaxLanes(D())];
    hn::Store(v, D(), lanes);
    for (size_t j = 0; j < hn::Lanes(D()); ++j) out[j] = to_bfloat16(lanes[j]);
    return;
  }
  const auto lowest_kept = hn::And(hn::ShiftRight<45>(magnitude), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<45>(hn::Add(hn::Add(magnitude, hn::Set(du, 0x0fffffffffffu)), lowest_kept));
  const auto sign = hn::And(hn::ShiftRight<48>(bits), hn::Set(du, 0x8000u));
  const auto result = hn::Or(sign, hn::Sub(rounded, hn::Set(du, uint64_t{1023 - 127} << 7)));
  hn::StoreU(hn::TruncateTo(DU16(), result), DU16(), reinterpret_cast<uint16_t*>(out));
}

// Σ f(x[i]) over the row as layer_norm_kernels.h orders it: partial i mod 8 in vectors of
// Lanes(D()) (8 / Lanes of them), the tail into the same partials.
template <class T, class F>
HWY_INLINE double OrderedSum(const T* x, int64_t n, const F& f) {
  const D d;
  constexpr size_t kMax = hn::MaxLanes(D());
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t vectors = kPartials / lanes;  // 1, 2, 4 or 8
  HWY_ALIGN double partials[kPartials + kMax];
  hn::Vec<D> acc[kPartials];
  for (int64_t k = 0; k < vectors; ++k) acc[k] = hn::Zero(d);
  int64_t i = 0;
  for (; i + kPartials <= n; i += kPartials)
    for (int64_t k = 0; k < vectors; ++k) acc[k] = hn::Add(acc[k], f(LoadDouble(x + i + k * lanes)));
  for (int64_t k = 0; k < vectors; ++k) hn::Store(acc[k], d, partials + k * lanes);
  for (int64_t j = 0; i + j < n; ++j) partials[j] += hn::GetLane(f(hn::Set(d, as_double(x[i + j]))));
  return sum_of_partials(partials);
}

template <class T>
void LayerNormRows(const T* x, int64_t rows, int64_t n, const T* w, const T* b, double eps, T* y, float* normalized,
                   float* rstd) {
  const D d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  static_assert(kPartials % hn::MaxLanes(D()) == 0, "whole vectors of partial sums");
  for (int64_t g = 0; g < rows; ++g) {
    const T* xr = x + g * n;
    const double mean = OrderedSum(xr, n, [](hn::Vec<D> v) { return v; }) / static_cast<double>(n);
    const auto vmean = hn::Set(d, mean);
    const double var = OrderedSum(xr, n, [&](hn::Vec<D> v) {
                         const auto c = hn::Sub(v, vmean);
                         return hn::Mul(c, c);
                       }) / static_cast<double>(n);
    const double r = 1.0 / std::sqrt(var + eps);
    if (rstd != nullptr) rstd[g] = static_cast<float>(r);
    float* nr = normalized != nullptr ? normalized + g * n : nullptr;
    T* yr = y + g * n;
    const auto vr = hn::Set(d, r);
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      const auto xhat = hn::Mul(hn::Sub(LoadDouble(xr + i), vmean), vr);
      if (nr != nullptr) hn::StoreU(hn::DemoteTo(DF(), xhat), DF(), nr + i);
      auto v = xhat;
      if (w != nullptr) v = hn::Mul(v, LoadDouble(w + i));
      if (b != nullptr) v = hn::Add(v, LoadDouble(b + i));
      StoreRounded(v, yr + i);
    }
    for (; i < n; ++i) {
      const double xhat = (as_double(xr[i]) - mean) * r;
      if (nr != nullptr) nr[i] = static_cast<float>(xhat);
      double v = xhat;
      if (w != nullptr) v *= as_double(w[i]);
      if (b != nullptr) v += as_double(b[i]);
      yr[i] = narrow<T>(v);
    }
  }
}

void LayerNormRowsFloat(const float* x, int64_t rows, int64_t n, const float* w, const float* b, double eps, float* y,
                        float* normalized, float* rstd) {
  LayerNormRows(x, rows, n, w, b, eps, y, normalized, rstd);
}
void LayerNormRowsBfloat16(const bfloat16* x, int64_t rows, int64_t n, const bfloat16* w, const bfloat16* b, double eps,
                           bfloat16* y, float* normalized, float* rstd) {
  LayerNormRows(x, rows, n, w, b, eps, y, normalized, rstd);
}

}  // namespace HWY_NAMESPACE
}  // namespace mha::nn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "mha/core/simd.h"

namespace mha::nn::detail {
HWY_EXPORT(LayerNormRowsFloat);
HWY_EXPORT(LayerNormRowsBfloat16);

void layer_norm_rows(const float* x, int64_t rows, int64_t n, const float* w, const float* b, double eps, float* y,
                     float* normalized, float* rstd) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowsFloat)(x, rows, n, w, b, eps, y, normalized, rstd);
}
void layer_norm_rows(const bfloat16* x, int64_t rows, int64_t n, const bfloat16* w, const bfloat16* b, double eps,
                     bfloat16* y, float* normalized, float* rstd) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowsBfloat16)(x, rows, n, w, b, eps, y, normalized, rstd);
}
}  // namespace mha::nn::detail

// MHA_CPU_TARGET's ceiling, set while the program starts, before any dispatch (mha/core/simd.h).
[[maybe_unused]] static const bool cpu_target_applied = mha::detail::apply_cpu_target_from_environment();

#endif  // HWY_ONCE
