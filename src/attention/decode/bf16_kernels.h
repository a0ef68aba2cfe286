#pragma once
// decode's Q·Kᵀ for bfloat16 queries and keys on the CPU's bf16 instructions (VDPBF16PS: two
// bf16 products into each float lane), so that a GQA group's step reads the cache at the rate the
// memory gives rather than the rate float products on widened keys allow. The scalar twin is
// decode::qk_scores on the same values widened (kernels.h): every product of two bfloat16s is
// exact in float, and only the order of the float additions differs. (P·V stays on the float
// path, P unrounded: rounding P to bfloat16 for VDPBF16PS, as cpu_flash does, put a module's
// gradients at 2.7× PyTorch's bfloat16 error on a short causal golden case, where decode runs
// the forward and cpu_flash the backward; and the step waits on memory, not on P·V.)
#include <cstddef>

#include "mha/core/half.h"

namespace mha::attention::detail::decode {

// Whether decode's Q·Kᵀ runs on qk_scores_bf16: where VDPBF16PS is the best of the CPU's bf16
// products (bf16_gemm::path() is vdpbf16ps: AMD Zen 4, where it retires twice the float FMA's
// products). Where the CPU has AMX tiles VDPBF16PS retires half the float FMA's products, and the
// keys are widened in registers for the float kernel instead (qk_scores): measured on that Intel
// host (B 8, Hkv 8, S 4 096, bfloat16 cache, 2 threads), the step 6.74 → 6.51 ms, and in L2
// (S 256) 34 → 31 ns a key row. (Q·Kᵀ on the tiles themselves was slower still: docs/bfloat16.md.)
// False also under bf16_gemm::ScopedFloat32Fallback.
bool bf16_scores();

// scores[r·score_stride + c] = Σ_e q[r·q_stride + e] · k[c·k_stride + e]   (r < rows, c < cols),
// any dim (a last partial vector of 32 is masked); rows in groups of 4, keys in blocks of 4, each
// key row loaded once for the group. `next` as in qk_scores (prefetched into L2). Only where
// bf16_scores().
void qk_scores_bf16(const bfloat16* q, size_t q_stride, size_t rows, const bfloat16* k, size_t k_stride, size_t cols,
                    size_t dim, float* scores, size_t score_stride, const bfloat16* next = nullptr,
                    size_t next_stride = 0);

}  // namespace mha::attention::detail::decode
