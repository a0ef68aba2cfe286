#pragma once
// The cpu_flash backend: fused, tiled ("flash") attention for float on the CPU.
//
//   forward  FlashAttention-2: each query block walks the key blocks once with an online softmax
//            (running row max m and row sum l), so the L×S score matrix is never stored;
//            logsumexp = m + log l is all backward needs.
//   backward recomputes the probabilities block by block from logsumexp, in tasks that each own
//            a range of keys (and so their dK, dV rows) for all the query heads of a GQA group.
//
// Extra memory: per thread, packed copies of one kv head (O(S·d)) and tiles (forward O(Br·Bc),
// backward O(Br·S)); in the backward of a call with few (b, kv head) pairs, per-chunk partial
// dK, dV (at most 8 copies of their size). Past kLongKeys keys (blocks.h) the forward shares one
// packed kv head and the backward works on key segments, so S no longer multiplies the per-thread
// and per-chunk parts; there a backward cuts its queries into up to 128 chunks (tasks for 128
// threads) as long as their partials, one segment's dK, dV each (4096 × (Dqk + Dv) floats), stay
// within 40 MiB (L = S = 65536, d = 64: 16 chunks). L×S only when the weights are asked for. Results are bitwise
// the same for any number of threads (backward.cpp's split_items, work_split.h).
// The SIMD code is chosen at run time among the targets the CPU supports (Highway dynamic
// dispatch: AVX-512, AVX2, SSE4, ... or portable scalar code); mha::pin_simd_target
// (mha/core/simd.h) pins it, for tests.
#include "../problem.h"
#include "mha/attention/attention.h"

namespace mha::attention::detail {

// T (queries, outputs, masks, gradients): float, bfloat16 or float16, read and written in place
// and computed in float. Keys and values: T, or bfloat16/float16 with float queries (Kv: a KV
// cache's), widened as they are packed.
template <class T, class Kv>
void cpu_flash_forward(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a);

template <class T>
void cpu_flash_backward(const Problem& p, const ScoreAdditions<T>& additions, const BackwardArgs<T>& a);

}  // namespace mha::attention::detail
