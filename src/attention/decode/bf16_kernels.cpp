// decode's Q·Kᵀ and P·V on the CPU's bf16 instructions (bf16_kernels.h): VDPBF16PS, compiled for that
// instruction set by a function attribute and called only where the CPU has it. (Highway 1.0.3,
// which writes the other kernels, cannot emit it: its bf16 dot product arrived in Highway 1.2.)
#include "attention/decode/bf16_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "mha/core/bf16_gemm.h"

// GCC 12's avx512fintrin.h builds its unpack and extract intrinsics on an "undefined" vector that
// its own (maybe-)uninitialized warnings then report where they are inlined: a false positive of
// the header, silenced for this file's functions.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mha::attention::detail::decode {

namespace {

// This file's functions (their lambdas too) for the bf16 instruction set; called only where the
// CPU has it.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")

#define MHA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

// [Σa, Σb, Σc, Σe]: four sums across lanes at once (decode's Sum4 in kernels.cpp, here in
// intrinsics).
MHA_BF16_TARGET inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 e) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 ce = _mm512_add_ps(_mm512_unpacklo_ps(c, e), _mm512_unpackhi_ps(c, e));
  const __m512 sums = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(ce))),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(ce))));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(sums), _mm512_extractf32x8_ps(sums, 1));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// R rows × K keys: R·K accumulators of 16 lanes, each pair of dimensions of a key multiplied by
// the rows' pair in one VDPBF16PS; `mask` covers a last partial vector of 32 numbers. The
// accumulators are named variables, not an array: GCC 12 kept an array of them in memory as well
// as in registers and stored every one after each VDPBF16PS (two 64-byte stores per instruction,
// the loop's bottleneck: this kernel ran at a third of the instruction's rate).
template <size_t R, size_t K>
MHA_BF16_TARGET inline void qk_block(const bfloat16* q, size_t qs, const bfloat16* k, size_t ks, size_t dim, float* s,
                                     size_t ss) {
  static_assert(R >= 1 && R <= 4 && (K == 1 || K == 4), "rows 1..4, keys 1 or 4");
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  for (size_t e = 0; e < dim; e += 32) {
    const __mmask32 mask = dim - e >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (dim - e)) - 1);
    auto load = [&](const bfloat16* p) { return (__m512bh)_mm512_maskz_loadu_epi16(mask, p + e); };
    const __m512bh k0 = load(k);
    const __m512bh k1 = K == 4 ? load(k + ks) : k0, k2 = K == 4 ? load(k + 2 * ks) : k0, k3 = K == 4 ? load(k + 3 * ks) : k0;
    auto row = [&](const bfloat16* qr, __m512& x0, __m512& x1, __m512& x2, __m512& x3) {
      const __m512bh qv = load(qr);
      x0 = _mm512_dpbf16_ps(x0, qv, k0);
      if constexpr (K == 4) {
        x1 = _mm512_dpbf16_ps(x1, qv, k1);
        x2 = _mm512_dpbf16_ps(x2, qv, k2);
        x3 = _mm512_dpbf16_ps(x3, qv, k3);
      }
    };
    row(q, a00, a01, a02, a03);
    if constexpr (R > 1) row(q + qs, a10, a11, a12, a13);
    if constexpr (R > 2) row(q + 2 * qs, a20, a21, a22, a23);
    if constexpr (R > 3) row(q + 3 * qs, a30, a31, a32, a33);
  }
  auto store = [&](float* sr, __m512 x0, __m512 x1, __m512 x2, __m512 x3) {
    if constexpr (K == 4) _mm_storeu_ps(sr, sum4(x0, x1, x2, x3));
    else *sr = _mm512_reduce_add_ps(x0);
  };
  store(s, a00, a01, a02, a03);
  if constexpr (R > 1) store(s + ss, a10, a11, a12, a13);
  if constexpr (R > 2) store(s + 2 * ss, a20, a21, a22, a23);
  if constexpr (R > 3) store(s + 3 * ss, a30, a31, a32, a33);
}

template <size_t R>
MHA_BF16_TARGET void qk_rows(const bfloat16* q, size_t qs, const bfloat16* k, size_t ks, size_t cols, size_t dim,
                             float* s, size_t ss, const bfloat16* next, size_t ns) {
  constexpr size_t kKeys = 4;  // 16 accumulators + 4 query vectors + 1 key vector of the 32 registers
  size_t c = 0;
  for (; c + kKeys <= cols; c += kKeys) {
    if (next)
      for (size_t j = c; j < c + kKeys; ++j)
        for (size_t byte = 0; byte < dim * sizeof(bfloat16); byte += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(next + j * ns) + byte, 0, 2);
    qk_block<R, kKeys>(q, qs, k + c * ks, ks, dim, s + c, ss);
  }
  for (; c < cols; ++c) qk_block<R, 1>(q, qs, k + c * ks, ks, dim, s + c, ss);
}

// O (R rows, dims [e, e + 64) of each) += P·V over `cols` keys, taken in pairs: VDPBF16PS
// multiplies the pair (p_rc, p_r,c+1) (one 32-bit broadcast of two adjacent bfloat16 P values) by
// (v_c,e, v_c+1,e) in each lane, so the value rows are interleaved by 16 bits: unpacklo/unpackhi
// of 32 dims of rows c and c + 1 give, per 128-bit lane L, the pairs of dims 8L..8L+3 (lo) and
// 8L+4..8L+7 (hi). The accumulators keep that order; it is undone once, as they are added to O.
// An odd last key pairs with a zero row. Named accumulators, as in qk_block.
template <size_t R>
MHA_BF16_TARGET void pv_rows(const bfloat16* p, size_t ps, const bfloat16* v, size_t vs, size_t cols, size_t dim,
                             float* o, size_t os, const bfloat16* next, size_t ns) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const auto* pbits = reinterpret_cast<const uint16_t*>(p);
  for (size_t e = 0; e < dim; e += 64) {
    const size_t width = std::min<size_t>(64, dim - e);
    auto mask_of = [](size_t n) { return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << n) - 1); };
    const __mmask32 m0 = mask_of(width), m1 = width > 32 ? mask_of(width - 32) : 0;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    for (size_t c = 0; c < cols; c += 2) {
      if (next && e == 0)
        for (size_t j = c; j < c + 2; ++j)
          for (size_t byte = 0; byte < dim * sizeof(bfloat16); byte += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(next + j * ns) + byte, 0, 2);
      const bool pair = c + 1 < cols;
      const bfloat16* v0 = v + c * vs + e;
      const __m512i x0 = _mm512_maskz_loadu_epi16(m0, v0), x1 = _mm512_maskz_loadu_epi16(m1, v0 + 32);
      const __m512i y0 = pair ? _mm512_maskz_loadu_epi16(m0, v0 + vs) : _mm512_setzero_si512();
      const __m512i y1 = pair ? _mm512_maskz_loadu_epi16(m1, v0 + vs + 32) : _mm512_setzero_si512();
      const __m512bh lo0 = (__m512bh)_mm512_unpacklo_epi16(x0, y0), hi0 = (__m512bh)_mm512_unpackhi_epi16(x0, y0);
      const __m512bh lo1 = (__m512bh)_mm512_unpacklo_epi16(x1, y1), hi1 = (__m512bh)_mm512_unpackhi_epi16(x1, y1);
      auto row = [&](size_t r, __m512& z0, __m512& z1, __m512& z2, __m512& z3) {
        const uint16_t* pr = pbits + r * ps + c;
        const uint32_t bits = pr[0] | (pair ? static_cast<uint32_t>(pr[1]) << 16 : 0u);
        const __m512bh pp = (__m512bh)_mm512_set1_epi32(static_cast<int>(bits));
        z0 = _mm512_dpbf16_ps(z0, lo0, pp);
        z1 = _mm512_dpbf16_ps(z1, hi0, pp);
        z2 = _mm512_dpbf16_ps(z2, lo1, pp);
        z3 = _mm512_dpbf16_ps(z3, hi1, pp);
      };
      row(0, a00, a01, a02, a03);
      if constexpr (R > 1) row(1, a10, a11, a12, a13);
      if constexpr (R > 2) row(2, a20, a21, a22, a23);
      if constexpr (R > 3) row(3, a30, a31, a32, a33);
    }
    // Dims [e, e + 32) from (lo0, hi0), [e + 32, e + 64) from (lo1, hi1), in order, added to O.
    auto add = [&](float* out, __m512 lo, __m512 hi, size_t n) {
      const __mmask16 ma = n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1);
      const __mmask16 mb = n >= 32 ? __mmask16(0xffff) : n > 16 ? static_cast<__mmask16>((1u << (n - 16)) - 1) : 0;
      _mm512_mask_storeu_ps(out, ma, _mm512_add_ps(_mm512_maskz_loadu_ps(ma, out), _mm512_permutex2var_ps(lo, first, hi)));
      _mm512_mask_storeu_ps(out + 16, mb,
                            _mm512_add_ps(_mm512_maskz_loadu_ps(mb, out + 16), _mm512_permutex2var_ps(lo, second, hi)));
    };
    auto store = [&](float* out, __m512 z0, __m512 z1, __m512 z2, __m512 z3) {
      add(out + e, z0, z1, std::min<size_t>(width, 32));
      if (width > 32) add(out + e + 32, z2, z3, width - 32);
    };
    store(o, a00, a01, a02, a03);
    if constexpr (R > 1) store(o + os, a10, a11, a12, a13);
    if constexpr (R > 2) store(o + 2 * os, a20, a21, a22, a23);
    if constexpr (R > 3) store(o + 3 * os, a30, a31, a32, a33);
  }
}

#pragma GCC pop_options

}  // namespace

void pv_accumulate_bf16(const bfloat16* p, size_t p_stride, size_t rows, const bfloat16* v, size_t v_stride,
                        size_t cols, size_t dim, float* out, size_t out_stride, const bfloat16* next,
                        size_t next_stride) {
  for (size_t r = 0; r < rows; r += 4) {
    const bfloat16* pr = p + r * p_stride;
    float* o = out + r * out_stride;
    const bfloat16* nr = r == 0 ? next : nullptr;  // prefetched once
    switch (std::min<size_t>(4, rows - r)) {
      case 4: pv_rows<4>(pr, p_stride, v, v_stride, cols, dim, o, out_stride, nr, next_stride); break;
      case 3: pv_rows<3>(pr, p_stride, v, v_stride, cols, dim, o, out_stride, nr, next_stride); break;
      case 2: pv_rows<2>(pr, p_stride, v, v_stride, cols, dim, o, out_stride, nr, next_stride); break;
      default: pv_rows<1>(pr, p_stride, v, v_stride, cols, dim, o, out_stride, nr, next_stride); break;
    }
  }
}

bool bf16_scores() { return bf16_gemm::native(); }

void qk_scores_bf16(const bfloat16* q, size_t q_stride, size_t rows, const bfloat16* k, size_t k_stride, size_t cols,
                    size_t dim, float* scores, size_t score_stride, const bfloat16* next, size_t next_stride) {
  for (size_t r = 0; r < rows; r += 4) {
    const bfloat16* qr = q + r * q_stride;
    float* sr = scores + r * score_stride;
    const bfloat16* nr = r == 0 ? next : nullptr;  // prefetched once
    switch (std::min<size_t>(4, rows - r)) {
      case 4: qk_rows<4>(qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      case 3: qk_rows<3>(qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      case 2: qk_rows<2>(qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      default: qk_rows<1>(qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
    }
  }
}

}  // namespace mha::attention::detail::decode

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
