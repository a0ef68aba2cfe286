#pragma once
// decode's two products for bfloat16 queries, keys and values on the CPU's bf16 instructions
// (VDPBF16PS: two bf16 products into each float lane, twice the float FMA's rate), so that a GQA
// group's step reads the cache at the rate the memory gives rather than the rate float products
// on widened rows allow. The scalar twins are decode::qk_scores and decode::pv_accumulate on the
// same values widened (kernels.h): every product of two bfloat16s is exact in float, and only
// the order of the float additions differs. P enters P·V rounded to bfloat16, as in cpu_flash's
// bfloat16 path and PyTorch's CPU kernel (the row sums keep the float P).
#include <cstddef>

#include "mha/core/half.h"

namespace mha::attention::detail::decode {

// Whether this CPU runs qk_scores_bf16 (AVX512_BF16, as bf16_gemm::native: false also under
// bf16_gemm::ScopedFloat32Fallback).
bool bf16_scores();

// scores[r·score_stride + c] = Σ_e q[r·q_stride + e] · k[c·k_stride + e]   (r < rows, c < cols),
// any dim (a last partial vector of 32 is masked); rows in groups of 4, keys in blocks of 4, each
// key row loaded once for the group. `next` as in qk_scores (prefetched into L2). Only where
// bf16_scores().
void qk_scores_bf16(const bfloat16* q, size_t q_stride, size_t rows, const bfloat16* k, size_t k_stride, size_t cols,
                    size_t dim, float* scores, size_t score_stride, const bfloat16* next = nullptr,
                    size_t next_stride = 0);

// out[r·out_stride + e] += Σ_c p[r·p_stride + c] · v[c·v_stride + e]   (r < rows, e < dim, c < cols),
// p the probabilities in bfloat16 (ScoreTile::probs_bf16); any dim (masked), keys in pairs, rows
// in groups of 4 that read each value row once. Only where bf16_scores().
void pv_accumulate_bf16(const bfloat16* p, size_t p_stride, size_t rows, const bfloat16* v, size_t v_stride,
                        size_t cols, size_t dim, float* out, size_t out_stride, const bfloat16* next = nullptr,
                        size_t next_stride = 0);

}  // namespace mha::attention::detail::decode
