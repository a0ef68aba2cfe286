#pragma once
// Half-precision storage types: bfloat16 and float16 (IEEE binary16), for key/value caches that
// are stored in 16 bits and computed with in float. They hold bits only, no arithmetic: convert
// to float to compute, back to store.
//
//   bfloat16  float's sign, 8-bit exponent and top 7 mantissa bits (float's range, 3 significant
//             digits): float → bfloat16 keeps the top 16 bits, rounded to nearest, ties to even.
//   float16   5-bit exponent, 10-bit mantissa (max 65504, subnormals below 2⁻¹⁴): float → float16
//             rounds to nearest even, overflows to ±inf; the compiler's _Float16 defines it.
// NaN stays NaN (quiet) both ways; ±inf and ±0 are kept.
//
// The bulk conversions run Highway's best target for this CPU (mha/core/simd.h pins it): F16C's
// vcvtph2ps/vcvtps2ph for float16 on AVX2 and AVX-512, shifts and integer rounding for bfloat16
// (bfloat16 → float is exactly a 16-bit shift; Highway 1.0 has no AVX512-BF16 rounding op), and
// the scalar functions below elsewhere. Every target gives the scalar functions' bits.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mha {

struct bfloat16 {
  uint16_t bits;
};
struct float16 {
  uint16_t bits;
};

inline float to_float(bfloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline bfloat16 to_bfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((bits >> 16) | 0x0040u)};  // NaN: quiet
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. A carry
  // into the exponent is the correct rounding up (to the next binade, or to inf past the max).
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<uint16_t>(bits >> 16)};
}

inline float to_float(float16 x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, sizeof h);
  return static_cast<float>(h);
}

inline float16 to_float16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  float16 x;
  std::memcpy(&x.bits, &h, sizeof h);
  return x;
}

// out[i] = in[i] converted, for i < count (Highway-dispatched; same bits as the scalar functions).
void convert(const bfloat16* in, float* out, size_t count);
void convert(const float16* in, float* out, size_t count);
void convert(const float* in, bfloat16* out, size_t count);
void convert(const float* in, float16* out, size_t count);
// float → float: a copy, so templates over the storage type need no special case.
inline void convert(const float* in, float* out, size_t count) { std::memmove(out, in, count * sizeof(float)); }

// The name of a storage type, as safetensors and PyTorch spell the dtype.
template <class T>
constexpr const char* storage_name();
template <>
constexpr const char* storage_name<float>() { return "float32"; }
template <>
constexpr const char* storage_name<bfloat16>() { return "bfloat16"; }
template <>
constexpr const char* storage_name<float16>() { return "float16"; }

}  // namespace mha
