// Bulk conversions between float and the half-precision storage types (mha/core/half.h), one
// copy per Highway target; each call runs the best target this CPU supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/half.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "mha/core/half-inl.h"
#include "mha/core/half.h"

HWY_BEFORE_NAMESPACE();
namespace mha::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DH = hn::Rebind<hwy::float16_t, DF>;

// bfloat16/float16 → float, LoadAsFloat's vectors (mha/core/half-inl.h), the scalar tail.
template <class Half>
void HalfToFloat(const Half* in, float* out, size_t count) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= count; i += N) hn::StoreU(LoadAsFloat(d, in + i), d, out + i);
  for (; i < count; ++i) out[i] = to_float(in[i]);
}
void BFloat16ToFloat(const bfloat16* in, float* out, size_t count) { HalfToFloat(in, out, count); }
void Float16ToFloat(const float16* in, float* out, size_t count) { HalfToFloat(in, out, count); }

// float → bfloat16, rounded to nearest even as to_bfloat16 does: bits + 0x7fff + (bit 16), then
// the top half; NaN lanes take their top half with the quiet bit set.
void FloatToBFloat16(const float* in, bfloat16* out, size_t count) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= count; i += N) StoreAsBFloat16(d, hn::LoadU(d, in + i), out + i);
  for (; i < count; ++i) out[i] = to_bfloat16(in[i]);
}

// float → float16 in SIMD only where the hardware converts (F16C's vcvtps2ph rounds to nearest
// even, as _Float16 does); the emulated DemoteTo of the other targets truncates.
void FloatToFloat16(const float* in, float16* out, size_t count) {
  size_t i = 0;
  if constexpr (kHardwareFloat16) {
    const DF d;
    const DH dh;
    const size_t N = hn::Lanes(d);
    hwy::float16_t* h = reinterpret_cast<hwy::float16_t*>(out);
    for (; i + N <= count; i += N) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, in + i)), dh, h + i);
  }
  for (; i < count; ++i) out[i] = to_float16(in[i]);
}

}  // namespace mha::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <bit>
#include <cmath>

#include "mha/core/simd.h"

namespace mha {
namespace {

// Rounds a double to a 16-bit IEEE-style format with the given field widths: round to nearest,
// ties to even, overflow to ±inf, gradual underflow to subnormals, NaN stays NaN. Rounding once
// from double is correct for float inputs too, since float -> double is exact.
uint16_t round_to_16_bit_float(double value, int exponent_bits, int mantissa_bits) {
  const auto bits = std::bit_cast<uint64_t>(value);
  const auto sign = static_cast<uint32_t>(bits >> 63) << (exponent_bits + mantissa_bits);
  const uint32_t infinity = ((1u << exponent_bits) - 1) << mantissa_bits;
  constexpr uint64_t kDoubleMantissaMask = (uint64_t{1} << 52) - 1;
  if (std::isnan(value)) {
    // Keep the top of the payload and set the quiet bit, so the result cannot become inf.
    const auto payload = static_cast<uint32_t>((bits & kDoubleMantissaMask) >> (52 - mantissa_bits));
    return static_cast<uint16_t>(sign | infinity | (1u << (mantissa_bits - 1)) | payload);
  }
  if (std::isinf(value)) return static_cast<uint16_t>(sign | infinity);
  const int biased_exponent = static_cast<int>((bits >> 52) & 0x7FF);
  // Double subnormals (and zeros) lie far below half the smallest subnormal of either target.
  if (biased_exponent == 0) return static_cast<uint16_t>(sign);

  // |value| = significand · 2^(biased_exponent − 1075).
  const uint64_t significand = (bits & kDoubleMantissaMask) | (uint64_t{1} << 52);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  // Exponent of the target binade; values below the smallest normal share the subnormal spacing.
  const int binade = std::max(biased_exponent - 1023, 1 - bias);
  // Count |value| in units of the target spacing 2^(binade − mantissa_bits).
  const int shift = binade - mantissa_bits - (biased_exponent - 1075);
  if (shift >= 64) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
  uint64_t units = significand >> shift;
  const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (remainder > half || (remainder == half && (units & 1) != 0)) ++units;
  // Encodings grow monotonically with magnitude, so a carry out of the mantissa lands on the
  // next binade (or on inf) by itself; anything past inf is clamped to inf.
  const uint64_t magnitude = (static_cast<uint64_t>(binade + bias - 1) << mantissa_bits) + units;
  return static_cast<uint16_t>(sign | std::min<uint64_t>(magnitude, infinity));
}

}  // namespace

// Outside bfloat16's normal range (to_bfloat16(double) rounds inside it): rounded to float toward
// odd (truncated, the last bit set when inexact), then to bfloat16 to nearest even: correctly
// rounded once, since float carries more than two bits past bfloat16's (Boldo & Melquiond, "When
// double rounding is odd"), subnormals included (both formats share float's exponent range).
bfloat16 to_bfloat16_outside_normal_range(double value) {
  float f = static_cast<float>(value);
  if (std::isfinite(f) && static_cast<double>(f) != value) {
    uint32_t bits = std::bit_cast<uint32_t>(f);
    if (std::abs(static_cast<double>(f)) > std::abs(value)) bits -= 1;  // rounded away from zero: truncate
    f = std::bit_cast<float>(bits | 1u);
  }
  return to_bfloat16(f);
}
float16 to_float16(double value) { return {round_to_16_bit_float(value, 5, 10)}; }

HWY_EXPORT(BFloat16ToFloat);
HWY_EXPORT(FloatToBFloat16);
HWY_EXPORT(Float16ToFloat);
HWY_EXPORT(FloatToFloat16);

void convert(const bfloat16* in, float* out, size_t count) { HWY_DYNAMIC_DISPATCH(BFloat16ToFloat)(in, out, count); }
void convert(const float* in, bfloat16* out, size_t count) { HWY_DYNAMIC_DISPATCH(FloatToBFloat16)(in, out, count); }
void convert(const float16* in, float* out, size_t count) { HWY_DYNAMIC_DISPATCH(Float16ToFloat)(in, out, count); }
void convert(const float* in, float16* out, size_t count) { HWY_DYNAMIC_DISPATCH(FloatToFloat16)(in, out, count); }

}  // namespace mha

// MHA_CPU_TARGET's ceiling, set while the program starts, before any dispatch (mha/core/simd.h).
[[maybe_unused]] static const bool cpu_target_applied = mha::detail::apply_cpu_target_from_environment();

#endif  // HWY_ONCE
