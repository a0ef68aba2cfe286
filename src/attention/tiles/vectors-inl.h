// Per-target functions of one vector that the tile kernels (kernels-inl.h) are built from, each
// written for a measured reason over Highway's own:
// - the softmax's exponentials (base e and base 2) and the soft-cap's tanh, each with a scalar
//   twin in the reference backend, measured on every compiled target
//   (VariantsTest.SoftCapKernelAgainstTanhInDouble, half_precision_test's exponential against exp
//   in double);
// - stores of float vectors as bfloat16: one vector (StoreBF16), two (StoreBF16Two), the split
//   hi + lo of float16's products (StoreBF16Split, StoreBF16SplitTwo) and bf16_gemm's pairs of rows
//   (StoreBF16Pairs), each rounded to nearest even as mha/core/half.h's to_bfloat16.

// Per-target include guard (Highway's pattern: toggled once per target).
#if defined(MHA_ATTENTION_TILES_VECTORS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_ATTENTION_TILES_VECTORS_INL_H_
#undef MHA_ATTENTION_TILES_VECTORS_INL_H_
#else
#define MHA_ATTENTION_TILES_VECTORS_INL_H_
#endif

#include <cstring>

#include "hwy/highway.h"
#include "mha/core/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace mha::attention::detail::tiles::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// ------------------------------------------------------------------------------------------
// Exponentials and the soft-cap.

constexpr float kLog2e = 1.44269504088896341f;

// The degree-6 polynomial c (highest degree first) at f, times 2ⁿ (n a whole number, as a float;
// t holds n + 127 in its low mantissa bits), and 0 where x < cutoff: the two exponentials' common
// end. On the AVX-512 targets 2ⁿ is VSCALEFPS (one instruction, exact: the same result); elsewhere
// the exponent field is built from t and multiplied (two). The one operation fewer per vector
// took the bfloat16 forward at (4, 8, 2048, 64), causal, from 22.0 to 21.2–21.8 ms (Intel, AMX).
using Coefficients = float[7];
HWY_INLINE VF PolynomialTimesPow2(DF d, VF f, VF n, VF t, const Coefficients& c, VF x, float cutoff) {
  VF poly = hn::Set(d, c[0]);
  poly = hn::MulAdd(poly, f, hn::Set(d, c[1]));
  poly = hn::MulAdd(poly, f, hn::Set(d, c[2]));
  poly = hn::MulAdd(poly, f, hn::Set(d, c[3]));
  poly = hn::MulAdd(poly, f, hn::Set(d, c[4]));
  poly = hn::MulAdd(poly, f, hn::Set(d, c[5]));
  poly = hn::MulAdd(poly, f, hn::Set(d, c[6]));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)t;
  const VF scaled{_mm512_scalef_ps(poly.raw, n.raw)};
#else
  (void)n;
  const hn::RebindToSigned<DF> di;
  const VF scaled = hn::Mul(poly, hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t))));
#endif
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, cutoff)), scaled);
}

constexpr float kMagic = 12583039.0f;  // 1.5·2²³ + 127

// exp(x) for the probabilities, x = s − max (or s − logsumexp): x <= 0 up to rounding, with
// −inf for masked scores and NaN that must reach its row.
//
// Not Highway's Exp, for a measured reason: in the forward pass at d = 64 (B=4, H=8,
// L=S=2048, 2 threads, AVX-512) hn::Exp plus the NaN fix-up it needs (it maps NaN to 0) took a
// quarter of the time: 197 GFLOP/s with it, 231 with the exponential left out altogether, 233
// with this one. Its ~28 vector operations per vector, many of them port-0-only shifts and
// conversions on AVX-512, compete with the FMAs of the matrix products; this one takes 15,
// with the same accuracy (max error 1.03 ulp on [−87, 0] against exp in double; hn::Exp 0.99):
//   n = round(x·log2 e)           by the magic-number trick: t = x·log2 e + (1.5·2²³ + 127)
//                                 holds n + 127 in its low mantissa bits
//   f = x − n·ln 2                Cody–Waite in two steps (ln 2 = hi + lo), |f| <= ln 2 / 2
//   eᶠ ≈ 1 + f·P(f)               degree-6 minimax (relative error 2e-9 on [−ln2/2, ln2/2])
//   2ⁿ = bits (n + 127) << 23     the exponent field, shifted out of t
// Below x = −80 the result is 0 rather than e⁻⁸⁰ ≈ 2e−35 (which no float sum of a 1 can see):
// that gives exp(−inf) = 0 and keeps denormals (microcode assists on x86) out of P·V. NaN
// propagates through the arithmetic, and x < −80 is false for it. Valid for x <= 88.
constexpr Coefficients kExpCoefficients = {0.0013843653723597527f, 0.00837415549904108f, 0.04166800156235695f,
                                           0.16666431725025177f,  0.4999999403953552f,  1.0f,
                                           1.0f};

HWY_INLINE VF ExpOfNonPositive(DF d, VF x) {
  const VF magic = hn::Set(d, kMagic);
  const VF t = hn::MulAdd(x, hn::Set(d, kLog2e), magic);
  const VF n = hn::Sub(t, magic);
  VF f = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), x);
  f = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), f);
  return PolynomialTimesPow2(d, f, n, t, kExpCoefficients, x, -80.0f);
}

// 2ˣ for x <= 0 (up to rounding), the same computation with the argument in base 2: the bfloat16
// path's softmax, whose argument is x = (s·scale − m)·log2 e (the scale applied in the FMA that
// subtracts the maximum, then one multiply), so that the range reduction is exact additions
// (n = round(x), f = x − n) instead of the multiply-add and two Cody–Waite FMAs: 9 operations on
// the FMA ports per vector, the scaling included, where ExpOfNonPositive after a separate scaling
// takes 11 (those ports are what the softmax waits on; docs/bfloat16.md). 2ᶠ ≈ P(f) on
// [−1/2, 1/2] is the polynomial above with y = f·ln 2 (its coefficients times ln 2ᵏ: relative
// error 1.5e-8 in exact arithmetic); the multiply by log2 e adds one rounding relative to
// s·scale − m, small where P matters. (Folding log2 e into the scale and the maximum, one FMA
// fewer, was measured: no faster beyond the noise, and its roundings of m·log2 e, |m|·2⁻²⁴ common
// to a row, moved the output's error at scores of 1e4 from 1.01× PyTorch's to 1.16×.) Zero below
// x = −115 (e⁻⁸⁰), NaN propagates, valid for x <= 127.
constexpr Coefficients kExp2Coefficients = {0.00015353361959569156f, 0.0013398875016719103f, 0.00961843691766262f,
                                            0.055503327399492264f,   0.24022647738456726f,   0.6931471824645996f,
                                            1.0f};

HWY_INLINE VF Exp2OfNonPositive(DF d, VF x) {
  const VF magic = hn::Set(d, kMagic);
  const VF t = hn::Add(x, magic);
  const VF n = hn::Sub(t, magic);
  return PolynomialTimesPow2(d, hn::Sub(x, n), n, t, kExp2Coefficients, x, -115.0f);
}

// c·tanh(x / c), the soft-cap (Scoring::softcap; the reference's c * std::tanh(x / c)). Not Highway's
// Tanh, for a measured reason: with it the soft-cap cost 21% of a causal call's time (forward,
// L = 2048, 2 threads, AVX-512), over the 15% the issue allows; this one costs 3-6%. With y = x / c:
//   |y| < 0.625  x·P(y²), P of degree 5 fitted to tanh(y)/y for relative error (1.1e-7 in float),
//                so that the cap's c does not round twice
//   otherwise    ±c·(1 − e)/(1 + e), e = exp(−2|y|) <= 0.29 (ExpOfNonPositive)
// A soft-cap's y is mostly small (Gemma 2's c = 50), so a vector whose lanes are all below 0.625
// takes the polynomial alone. NaN takes the second branch and stays NaN; ±inf gives ±c.
// VariantsTest.SoftCapKernelAgainstTanhInDouble measures it on every target.
HWY_INLINE VF Capped(DF d, VF x, float cap) {
  const VF y = hn::Mul(x, hn::Set(d, 1.0f / cap));
  const VF y2 = hn::Mul(y, y);
  VF p = hn::Set(d, -0.005660261958837509f);
  p = hn::MulAdd(p, y2, hn::Set(d, 0.020591236650943756f));
  p = hn::MulAdd(p, y2, hn::Set(d, -0.053721144795417786f));
  p = hn::MulAdd(p, y2, hn::Set(d, 0.13331128656864166f));
  p = hn::MulAdd(p, y2, hn::Set(d, -0.3333325982093811f));
  p = hn::MulAdd(p, y2, hn::Set(d, 1.0f));
  const VF near_zero = hn::Mul(x, p);
  const auto small = hn::Lt(y2, hn::Set(d, 0.390625f));  // 0.625²
  if (hn::AllTrue(d, small)) return near_zero;
  const VF one = hn::Set(d, 1.0f);
  const VF e = ExpOfNonPositive(d, hn::Mul(hn::Abs(y), hn::Set(d, -2.0f)));
  const VF far = hn::CopySign(hn::Mul(hn::Set(d, cap), hn::Div(hn::Sub(one, e), hn::Add(one, e))), x);
  return hn::IfThenElse(small, near_zero, far);
}

// ------------------------------------------------------------------------------------------
// bfloat16 stores.

// v's lanes at p as bfloat16, rounded to nearest even, for the bf16 products' operands (P, dS),
// which the kernels write only where the CPU has AVX512_BF16 (ScoreTile::probs_bf16,
// score_gradients_tile's Bf16Operands). On the AVX-512 targets that is VCVTNEPS2BF16, one instruction where
// the integer rounding takes nine, by inline assembly: Highway 1.0.3 has no op for it and these
// targets' compile flags lack the feature. It flushes subnormal inputs to 0 (P or dS below 1.2e-38,
// which weigh nothing next to the rest); the other targets round as to_bfloat16.
HWY_INLINE void StoreBF16(DF d, VF v, bfloat16* p) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)d;
  __m256i bits;
  asm("vcvtneps2bf16 %1, %0" : "=v"(bits) : "v"(v.raw));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
#else
  mha::HWY_NAMESPACE::StoreAsBFloat16(d, v, p);
#endif
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// a's lanes (the low half) and b's (the high half) as bfloat16, each rounded as StoreBF16 rounds
// it: one VCVTNE2PS2BF16.
HWY_INLINE __m512i BF16Halves(VF a, VF b) {
  __m512i halves;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(halves) : "v"(b.raw), "v"(a.raw));
  return halves;
}
#endif

// a's lanes then b's as bfloat16 at p (2N numbers), each rounded as StoreBF16 rounds it: on the
// AVX-512 targets one conversion and one store (BF16Halves), where two StoreBF16 take two of each.
HWY_INLINE void StoreBF16Two(DF d, VF a, VF b, bfloat16* p) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)d;
  _mm512_storeu_si512(p, BF16Halves(a, b));
#else
  StoreBF16(d, a, p);
  StoreBF16(d, b, p + hn::Lanes(d));
#endif
}

// v as hi + lo, two bfloat16s (hi as StoreBF16 rounds v, lo = v − hi rounded the same way: within
// 2⁻¹⁶·|v| of v together; lo = 0 where v is ±inf), for float16's split products (ScoreTile::
// probs_bf16_lo). hi is read back from where it was stored, as the products will read it.
HWY_INLINE VF BF16Rest(DF d, VF v) {  // v − (v as StoreBF16 rounds it), 0 where that is v (±inf)
  HWY_ALIGN bfloat16 rounded[hn::MaxLanes(DF())];
  StoreBF16(d, v, rounded);
  const VF h = mha::HWY_NAMESPACE::LoadAsFloat(d, rounded);
  return hn::IfThenZeroElse(hn::Eq(v, h), hn::Sub(v, h));
}
HWY_INLINE void StoreBF16Split(DF d, VF v, bfloat16* hi, bfloat16* lo) {
  StoreBF16(d, v, hi);
  StoreBF16(d, BF16Rest(d, v), lo);
}

// StoreBF16Split of a's lanes then b's (2N numbers at hi and at lo): on the AVX-512 targets hi from
// one VCVTNE2PS2BF16, widened back in registers, and lo from another.
HWY_INLINE void StoreBF16SplitTwo(DF d, VF a, VF b, bfloat16* hi, bfloat16* lo) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)d;
  const __m512i h = BF16Halves(a, b);
  // (the zero-masked forms: GCC 12 builds the plain ones on an "undefined" vector and warns)
  auto widened = [](__m256i half) {
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, half), 16));
  };
  auto rest = [](VF v, __m512 h32) {
    VF r = v;
    r.raw = _mm512_maskz_sub_ps(_mm512_cmp_ps_mask(v.raw, h32, _CMP_NEQ_UQ), v.raw, h32);
    return r;
  };
  _mm512_storeu_si512(hi, h);
  _mm512_storeu_si512(lo, BF16Halves(rest(a, widened(_mm512_castsi512_si256(h))),
                                     rest(b, widened(_mm512_maskz_extracti64x4_epi64(0xff, h, 1)))));
#else
  StoreBF16Split(d, a, hi, lo);
  StoreBF16Split(d, b, hi + hn::Lanes(d), lo + hn::Lanes(d));
#endif
}

// a's and b's lanes as bfloat16 pairs at p, p[2i] = a[i] and p[2i + 1] = b[i] (bf16_gemm's layout
// of rows 2k and 2k + 1 of a B operand), each rounded as StoreBF16 rounds it. On the AVX-512
// targets BF16Halves and one VPERMW that interleaves the halves.
HWY_INLINE void StoreBF16Pairs(DF d, VF a, VF b, bfloat16* p) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)d;
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  _mm512_storeu_si512(p, _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), BF16Halves(a, b)));
#else
  const size_t N = hn::Lanes(d);
  HWY_ALIGN bfloat16 lanes[2 * hn::MaxLanes(d)];
  StoreBF16Two(d, a, b, lanes);
  for (size_t i = 0; i < N; ++i) {
    p[2 * i] = lanes[i];
    p[2 * i + 1] = lanes[N + i];
  }
#endif
}

}  // namespace mha::attention::detail::tiles::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
