// Per-target loads of float, bfloat16, float16 (and int8) rows as float vectors, for mha's Highway kernels
// (the bulk conversions of src/core/half.cpp, the decode backend's products). Include it from a
// file that Highway re-includes per target (foreach_target.h), after hwy/highway.h.
//
//   LoadAsFloat(d, p)  the Lanes(d) numbers at p, as floats, exactly as to_float gives them
//   StoreAsBFloat16(d, v, p)  v's lanes at p as bfloat16, exactly as to_bfloat16 gives them
//   BFloat16Bits(d, v)        the same bfloat16s' bits, one in each 32-bit lane
//
// bfloat16 → float is a 16-bit shift on every target. float16 uses F16C's vcvtph2ps where the
// target has it (AVX2, AVX-512); elsewhere Highway 1.0's emulated PromoteTo gets infinities wrong
// (0x7c00 → 65536), so those targets convert lane by lane with the scalar to_float.

// Per-target include guard (Highway's pattern: toggled once per target).
#if defined(MHA_CORE_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_CORE_HALF_INL_H_
#undef MHA_CORE_HALF_INL_H_
#else
#define MHA_CORE_HALF_INL_H_
#endif

#include "hwy/highway.h"
#include "mha/core/half.h"

HWY_BEFORE_NAMESPACE();
namespace mha::HWY_NAMESPACE {

// Whether this target converts float16 in hardware (F16C), exactly and with rounding to nearest
// even both ways.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr bool kHardwareFloat16 = true;
#else
constexpr bool kHardwareFloat16 = false;
#endif

template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::VFromD<DF> LoadAsFloat(DF d, const float* p) {
  return hwy::HWY_NAMESPACE::LoadU(d, p);
}

template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::VFromD<DF> LoadAsFloat(DF d, const bfloat16* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p));
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, bits)));
}

template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::VFromD<DF> LoadAsFloat(DF d, const float16* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  if constexpr (kHardwareFloat16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  } else {
    HWY_ALIGN float lanes[hn::MaxLanes(DF())];
    for (size_t i = 0; i < hn::Lanes(d); ++i) lanes[i] = to_float(p[i]);
    return hn::Load(d, lanes);
  }
}

// int8 (a quantized KV cache's numbers, their scale applied by the caller): sign-extended to 32
// bits and converted, exactly.
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::VFromD<DF> LoadAsFloat(DF d, const int8_t* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToSigned<DF> di32;
  const hn::Rebind<int8_t, DF> di8;
  return hn::ConvertTo(d, hn::PromoteTo(di32, hn::LoadU(di8, p)));
}

// BFloat16Bits(d, v): the Lanes(d) floats of v rounded to bfloat16 as to_bfloat16 does (bits +
// 0x7fff + bit 16, then the top half; NaN lanes keep their top half with the quiet bit set), each
// bfloat16's bits in the low half of a 32-bit lane.
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::VFromD<hwy::HWY_NAMESPACE::RebindToUnsigned<DF>> BFloat16Bits(
    DF /*d*/, hwy::HWY_NAMESPACE::VFromD<DF> x) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToUnsigned<DF> du32;
  const auto u = hn::BitCast(du32, x);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(lsb, hn::Set(du32, 0x7fffu))));
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du32, 0x0040u));
  return hn::IfThenElse(hn::RebindMask(du32, hn::IsNaN(x)), quiet_nan, rounded);
}

// StoreAsBFloat16(d, v, p): the Lanes(d) floats of v at p as bfloat16 (BFloat16Bits).
template <class DF>
HWY_INLINE void StoreAsBFloat16(DF d, hwy::HWY_NAMESPACE::VFromD<DF> x, bfloat16* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  // Each lane holds 16 bits: the signed-to-unsigned demotion (saturating) keeps them as they are.
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<decltype(du32)>(), BFloat16Bits(d, x))), du16,
             reinterpret_cast<uint16_t*>(p));
}

}  // namespace mha::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
