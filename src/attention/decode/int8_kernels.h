#pragma once
// decode's Q·Kᵀ for int8 keys on the CPU's int8 dot products (VPDPBUSD: four u8·s8 products into
// each int32 lane, AVX512_VNNI), where widening each key to float would cost more than reading it.
// The queries of an int8 call are int8 too (paged_forward_into rounds them as the keys are,
// mha/core/int8.h), so the sums are exact integers; the twin is decode::qk_scores on the same
// numbers widened (kernels.h), whose float sums of those integer products are exact below 2²⁴.
#include <cstddef>
#include <cstdint>

namespace mha::attention::detail::decode {

// Whether decode's Q·Kᵀ on int8 keys runs on qk_scores_int8: where the CPU has AVX512_VNNI and
// the SIMD target in use allows AVX-512 (mha/core/simd.h: a pin below it takes the float path).
bool int8_scores();

// scores[r·score_stride + c] = Σ_e q[r·q_stride + e] · k[c·k_stride + e]   (r < rows, c < cols)
// as float, from exact int32 sums; any dim up to 2¹⁶ (a last partial vector of 64 is masked);
// rows in groups of 4, keys in blocks of 4. `next` as in qk_scores (prefetched into L2). Only
// where int8_scores().
void qk_scores_int8(const int8_t* q, size_t q_stride, size_t rows, const int8_t* k, size_t k_stride, size_t cols,
                    size_t dim, float* scores, size_t score_stride, const int8_t* next = nullptr,
                    size_t next_stride = 0);

}  // namespace mha::attention::detail::decode
