// decode's Q·Kᵀ on the CPU's bf16 instructions (bf16_kernels.h): VDPBF16PS, compiled for that
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
// the rows' pair in one VDPBF16PS; `mask` covers a last partial vector of 32 numbers.
template <size_t R, size_t K>
MHA_BF16_TARGET inline void qk_block(const bfloat16* q, size_t qs, const bfloat16* k, size_t ks, size_t dim, float* s,
                                     size_t ss) {
  __m512 acc[R][K];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < K; ++j) acc[r][j] = _mm512_setzero_ps();
  for (size_t e = 0; e < dim; e += 32) {
    const __mmask32 mask = dim - e >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (dim - e)) - 1);
    __m512i qv[R];
    for (size_t r = 0; r < R; ++r) qv[r] = _mm512_maskz_loadu_epi16(mask, q + r * qs + e);
    for (size_t j = 0; j < K; ++j) {
      const __m512i kv = _mm512_maskz_loadu_epi16(mask, k + j * ks + e);
      for (size_t r = 0; r < R; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)qv[r], (__m512bh)kv);
    }
  }
  if constexpr (K == 4) {
    for (size_t r = 0; r < R; ++r) _mm_storeu_ps(s + r * ss, sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  } else {
    for (size_t r = 0; r < R; ++r)
      for (size_t j = 0; j < K; ++j) s[r * ss + j] = _mm512_reduce_add_ps(acc[r][j]);
  }
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

}  // namespace

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
