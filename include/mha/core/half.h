#pragma once
// Half-precision storage types: bfloat16 and float16 (IEEE binary16), for key/value caches that
// are stored in 16 bits and computed with in float. They hold bits only, no arithmetic: convert
// to float to compute, back to store.
//
//   bfloat16  float's sign, 8-bit exponent and top 7 mantissa bits (float's range, 3 significant
//             digits): float → bfloat16 keeps the top 16 bits, rounded to nearest, ties to even.
//   float16   5-bit exponent, 10-bit mantissa (max 65504, subnormals below 2⁻¹⁴): float → float16
//             rounds to nearest even, overflows to ±inf; the compiler's _Float16 defines it.
// NaN stays NaN (quiet) both ways; ±inf and ±0 are kept. From double (what safetensors writes
// double tensors with), each is rounded once, from the double itself.
//
// The bulk conversions run Highway's best target for this CPU (mha/core/simd.h pins it): F16C's
// vcvtph2ps/vcvtps2ph for float16 on AVX2 and AVX-512, shifts and integer rounding for bfloat16
// (bfloat16 → float is exactly a 16-bit shift; Highway 1.0 has no AVX512-BF16 rounding op), and
// the scalar functions below elsewhere. Every target gives the scalar functions' bits.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mha {

// Each is made from its bits (bfloat16{bits}), never from a number: static_cast<bfloat16>(0.3)
// would store 0 as the bits (C++20 initialises an aggregate from parentheses, narrowing), so a
// floating-point argument is refused at compile time; round with narrow<T> or to_bfloat16.
struct bfloat16 {
  uint16_t bits;
  bfloat16() = default;
  constexpr bfloat16(uint16_t b) : bits(b) {}
  template <class F>
    requires std::is_floating_point_v<F>
  bfloat16(F) = delete;
};
struct float16 {
  uint16_t bits;
  float16() = default;
  constexpr float16(uint16_t b) : bits(b) {}
  template <class F>
    requires std::is_floating_point_v<F>
  float16(F) = delete;
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

// Exact: every float16 is a float. By its bits rather than through _Float16, whose conversion is
// a libgcc call on targets without F16C, ten times slower (safetensors decodes F16 tensors with
// this); the same bits as _Float16 and F16C's vcvtph2ps give, for every one of the 65536.
inline float to_float(float16 x) {
  const uint32_t sign = uint32_t{x.bits & 0x8000u} << 16;
  const int exponent = (x.bits >> 10) & 0x1F;
  uint32_t mantissa = x.bits & 0x3FFu;
  constexpr int kRebias = 127 - 15;
  uint32_t bits = 0;
  if (exponent == 0x1F) {
    // inf, or NaN with its payload kept and the quiet bit set
    bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  } else if (exponent != 0) {
    bits = sign | (static_cast<uint32_t>(exponent + kRebias) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // ±0
  } else {
    // Subnormal m·2^-24 is a normal float: shift the leading one up to the implicit-bit position
    // (bit 10) and lower the exponent by the same amount.
    const int shift = std::countl_zero(mantissa) - 21;
    mantissa = (mantissa << shift) & 0x3FFu;
    bits = sign | (static_cast<uint32_t>(1 - shift + kRebias) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

namespace detail {
// The compiler's IEEE half type, whose conversion from float rounds to nearest even (F16C, or
// Arm's FCVT): GCC 12 has _Float16 in C++ on x86 only, and on 64-bit Arm __fp16 (IEEE format).
#if defined(__aarch64__)
using CompilerFloat16 = __fp16;
#else
using CompilerFloat16 = _Float16;
#endif
}  // namespace detail

inline float16 to_float16(float f) {
  const auto h = static_cast<detail::CompilerFloat16>(f);
  float16 x;
  std::memcpy(&x.bits, &h, sizeof h);
  return x;
}

// double → bfloat16 / float16, rounded once from the double: to nearest, ties to even, overflow to
// ±inf, gradual underflow to subnormals, NaN quiet with the top of its payload. Rounding through
// float would round twice (1 + 2⁻¹¹ + 2⁻⁴⁰ would become 1 in float16, not 1 + 2⁻¹⁰). For a
// double that holds a float, the same bits as the float overloads above.
// (Declared here, before narrow: a double argument must find these overloads, not the float
// ones, which would round it twice.)
// bfloat16's normal range is rounded here, inline, straight from the double's bits (the bfloat16
// LayerNorm rounds every output from double); zeros, subnormals, inf and NaN take the call.
bfloat16 to_bfloat16_outside_normal_range(double value);
inline bfloat16 to_bfloat16(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint64_t magnitude = bits & 0x7fffffffffffffffu;
  // [2⁻¹²⁶, 2¹²⁸): keep 7 of the 52 mantissa bits, to nearest even (add 2⁴⁴ − 1 plus the lowest
  // kept bit, then truncate; a carry into the exponent is the correct rounding up, to inf past the
  // largest bfloat16), and move the exponent from double's bias (1023) to bfloat16's (127).
  if (magnitude < 0x3810000000000000u || magnitude >= 0x47f0000000000000u) return to_bfloat16_outside_normal_range(value);
  const uint64_t rounded = (magnitude + 0x0fffffffffffu + ((magnitude >> 45) & 1u)) >> 45;
  return {static_cast<uint16_t>(((bits >> 48) & 0x8000u) | (rounded - (uint64_t{1023 - 127} << 7)))};
}
float16 to_float16(double value);

// widen(x): x as the type it is computed in, float for the half types (float and double are
// their own); narrow<T>(x): a float result stored as T, rounded once. The one pair the kernels use
// where they read or write an operand that may be float, bfloat16 or float16 (from a float or a
// double x, rounded once).
inline float widen(bfloat16 x) { return to_float(x); }
inline float widen(float16 x) { return to_float(x); }
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }
template <class T>
using widened_t = decltype(widen(T{}));
template <class T, class F>
T narrow(F x) {
  if constexpr (std::is_same_v<T, bfloat16>) return to_bfloat16(x);
  else if constexpr (std::is_same_v<T, float16>) return to_float16(x);
  else return static_cast<T>(x);
}
// into += v for a gradient summed in double: v rounded to T's computing type first (what the float
// layers always did), then added there; a half type's sum is rounded once more as it is stored.
template <class T>
void accumulate(T& into, double v) {
  into = narrow<T>(widen(into) + static_cast<decltype(widen(into))>(v));
}
// Whether T is one of the 16-bit storage types.
template <class T>
constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;


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
template <>
constexpr const char* storage_name<int8_t>() { return "int8"; }

}  // namespace mha
