// decode's Q·Kᵀ on the CPU's int8 dot products (int8_kernels.h): VPDPBUSD, compiled for that
// instruction set by a function attribute and called only where the CPU has it (Highway 1.0.3,
// which writes the other kernels, has no int8 dot product).
#include "attention/decode/int8_kernels.h"

#include <algorithm>
#include <cstdlib>

#include "mha/core/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

// As in bf16_kernels.cpp: GCC 12's AVX-512 headers' own uninitialized-vector warnings.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mha::attention::detail::decode {
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#define MHA_INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

// [Σa, Σb, Σc, Σe] of four int32 vectors (bf16_kernels.cpp's sum4, on integers).
MHA_INT8_TARGET inline __m128i sum4(__m512i a, __m512i b, __m512i c, __m512i e) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i ce = _mm512_add_epi32(_mm512_unpacklo_epi32(c, e), _mm512_unpackhi_epi32(c, e));
  const __m512i sums = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, ce), _mm512_unpackhi_epi64(ab, ce));
  const __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(sums), _mm512_extracti64x4_epi64(sums, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

// R rows × K keys: R·K int32 accumulators of Σ q·k', k' = k + 128 (the key's bytes with the top
// bit flipped, unsigned, as VPDPBUSD wants its first operand), from which Σ q·k = Σ q·k' − 128·Σ q,
// the row's offset (`offsets`, worked out once). Named variables and no lambdas over them: GCC 12
// kept them in memory otherwise (bf16_kernels.cpp). A last partial vector of 64 is read masked
// (zeros in both operands: k' = 128 there, times q = 0).
#define MHA_DP(acc, a, b) acc = _mm512_dpbusd_epi32(acc, a, b)
#define MHA_INT8_STEP(LOAD)                                                                          \
  {                                                                                                  \
    const __m512i k0 = _mm512_xor_si512(LOAD(k), flip);                                             \
    const __m512i k1 = K == 4 ? _mm512_xor_si512(LOAD(k + ks), flip) : k0;                          \
    const __m512i k2 = K == 4 ? _mm512_xor_si512(LOAD(k + 2 * ks), flip) : k0;                      \
    const __m512i k3 = K == 4 ? _mm512_xor_si512(LOAD(k + 3 * ks), flip) : k0;                      \
    {                                                                                                \
      const __m512i qv = LOAD(q);                                                                    \
      MHA_DP(a00, k0, qv);                                                                           \
      if constexpr (K == 4) { MHA_DP(a01, k1, qv); MHA_DP(a02, k2, qv); MHA_DP(a03, k3, qv); }       \
    }                                                                                                \
    if constexpr (R > 1) {                                                                           \
      const __m512i qv = LOAD(q + qs);                                                               \
      MHA_DP(a10, k0, qv);                                                                           \
      if constexpr (K == 4) { MHA_DP(a11, k1, qv); MHA_DP(a12, k2, qv); MHA_DP(a13, k3, qv); }       \
    }                                                                                                \
    if constexpr (R > 2) {                                                                           \
      const __m512i qv = LOAD(q + 2 * qs);                                                           \
      MHA_DP(a20, k0, qv);                                                                           \
      if constexpr (K == 4) { MHA_DP(a21, k1, qv); MHA_DP(a22, k2, qv); MHA_DP(a23, k3, qv); }       \
    }                                                                                                \
    if constexpr (R > 3) {                                                                           \
      const __m512i qv = LOAD(q + 3 * qs);                                                           \
      MHA_DP(a30, k0, qv);                                                                           \
      if constexpr (K == 4) { MHA_DP(a31, k1, qv); MHA_DP(a32, k2, qv); MHA_DP(a33, k3, qv); }       \
    }                                                                                                \
  }

template <size_t R, size_t K>
MHA_INT8_TARGET inline void qk_block(const int8_t* q, size_t qs, const int32_t* offsets, const int8_t* k, size_t ks,
                                     size_t dim, float* s, size_t ss) {
  static_assert(R >= 1 && R <= 4 && (K == 1 || K == 4), "rows 1..4, keys 1 or 4");
  __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m512i a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  size_t e = 0;
#define MHA_LOAD_FULL(p) _mm512_loadu_si512(reinterpret_cast<const char*>(p) + e)
  for (; e + 64 <= dim; e += 64) MHA_INT8_STEP(MHA_LOAD_FULL)
#undef MHA_LOAD_FULL
  if (e < dim) {
    const __mmask64 mask = (__mmask64{1} << (dim - e)) - 1;
#define MHA_LOAD_PART(p) _mm512_maskz_loadu_epi8(mask, reinterpret_cast<const char*>(p) + e)
    MHA_INT8_STEP(MHA_LOAD_PART)
#undef MHA_LOAD_PART
  }
  if constexpr (K == 4) {
    auto store = [&](size_t r, __m128i sums) {
      _mm_storeu_ps(s + r * ss, _mm_cvtepi32_ps(_mm_sub_epi32(sums, _mm_set1_epi32(offsets[r]))));
    };
    store(0, sum4(a00, a01, a02, a03));
    if constexpr (R > 1) store(1, sum4(a10, a11, a12, a13));
    if constexpr (R > 2) store(2, sum4(a20, a21, a22, a23));
    if constexpr (R > 3) store(3, sum4(a30, a31, a32, a33));
  } else {
    s[0] = static_cast<float>(_mm512_reduce_add_epi32(a00) - offsets[0]);
    if constexpr (R > 1) s[ss] = static_cast<float>(_mm512_reduce_add_epi32(a10) - offsets[1]);
    if constexpr (R > 2) s[2 * ss] = static_cast<float>(_mm512_reduce_add_epi32(a20) - offsets[2]);
    if constexpr (R > 3) s[3 * ss] = static_cast<float>(_mm512_reduce_add_epi32(a30) - offsets[3]);
  }
}
#undef MHA_INT8_STEP
#undef MHA_DP

template <size_t R>
MHA_INT8_TARGET void qk_rows(const int8_t* q, size_t qs, const int32_t* offsets, const int8_t* k, size_t ks,
                             size_t cols, size_t dim, float* s, size_t ss, const int8_t* next, size_t ns) {
  constexpr size_t kKeys = 4;  // 16 accumulators + 4 key vectors + 1 query vector of the 32 registers
  size_t c = 0;
  for (; c + kKeys <= cols; c += kKeys) {
    if (next)
      for (size_t j = c; j < c + kKeys; ++j)
        for (size_t byte = 0; byte < dim; byte += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(next + j * ns) + byte, 0, 2);
    qk_block<R, kKeys>(q, qs, offsets, k + c * ks, ks, dim, s + c, ss);
  }
  for (; c < cols; ++c) qk_block<R, 1>(q, qs, offsets, k + c * ks, ks, dim, s + c, ss);
}

#pragma GCC pop_options

}  // namespace
}  // namespace mha::attention::detail::decode
#endif  // __x86_64__

namespace mha::attention::detail::decode {

bool int8_scores() {
#if defined(__x86_64__)
  static const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
  return vnni && mha::detail::pin_allows_avx512();
#else
  return false;
#endif
}

#if defined(__x86_64__)
void qk_scores_int8(const int8_t* q, size_t q_stride, size_t rows, const int8_t* k, size_t k_stride, size_t cols,
                    size_t dim, float* scores, size_t score_stride, const int8_t* next, size_t next_stride) {
  for (size_t r = 0; r < rows; r += 4) {
    const int8_t* qr = q + r * q_stride;
    int32_t offsets[4] = {};  // 128·Σ q of each row
    for (size_t i = 0; i < 4 && r + i < rows; ++i)
      for (size_t e = 0; e < dim; ++e) offsets[i] += 128 * qr[i * q_stride + e];
    float* sr = scores + r * score_stride;
    const int8_t* nr = r == 0 ? next : nullptr;  // prefetched once
    switch (std::min<size_t>(4, rows - r)) {
      case 4: qk_rows<4>(qr, q_stride, offsets, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      case 3: qk_rows<3>(qr, q_stride, offsets, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      case 2: qk_rows<2>(qr, q_stride, offsets, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      default: qk_rows<1>(qr, q_stride, offsets, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
    }
  }
}
#else
void qk_scores_int8(const int8_t*, size_t, size_t, const int8_t*, size_t, size_t, size_t, float*, size_t,
                    const int8_t*, size_t) {
  std::abort();  // unreachable: int8_scores() is false off x86
}
#endif

}  // namespace mha::attention::detail::decode

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
