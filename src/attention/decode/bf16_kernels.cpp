// decode's Q·Kᵀ on the CPU's bf16 instructions (bf16_kernels.h): VDPBF16PS, compiled for that
// instruction set by a function attribute and called only where the CPU has it. (Highway 1.0.3,
// which writes the other kernels, cannot emit it: its bf16 dot product arrived in Highway 1.2.)
#include "attention/decode/bf16_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "mha/core/bf16_gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's avx512fintrin.h builds its unpack and extract intrinsics on an "undefined" vector that
// its own (maybe-)uninitialized warnings then report where they are inlined: a false positive of
// the header, silenced for this file's functions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
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

#pragma GCC pop_options

}  // namespace

}  // namespace mha::attention::detail::decode
#endif  // __x86_64__

namespace mha::attention::detail::decode {

bool bf16_scores() { return bf16_gemm::path() == bf16_gemm::Path::vdpbf16ps; }

#if defined(__x86_64__)

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

#else
void qk_scores_bf16(const bfloat16*, size_t, size_t, const bfloat16*, size_t, size_t, size_t, float*, size_t,
                    const bfloat16*, size_t) {
  std::abort();  // unreachable: bf16_scores() is false on a CPU without VDPBF16PS
}
#endif  // __x86_64__

}  // namespace mha::attention::detail::decode

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
