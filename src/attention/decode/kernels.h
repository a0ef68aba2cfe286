#pragma once
// The SIMD building blocks of the decode backend (decode.cpp): the two products of a few query
// rows against a block of keys read in place, row by row, with no packing. Each call goes
// through Highway's dynamic dispatch to the best target this CPU supports (mha/core/simd.h pins
// it); kernels.cpp holds the per-target code.
//
// Both take `dim` a multiple of lanes() (decode.cpp pads rows that are not); rows of q and out are
// `dim` floats, rows of k and v `dim` numbers of Kv (float, bfloat16, float16 or int8, converted
// to float as they are loaded: mha/core/half-inl.h; an int8 row's scale is the caller's), each at
// its own stride.
#include <cstddef>
#include <cstdint>

#include "mha/core/half.h"

namespace mha::attention::detail::decode {

// The floats per vector of the target that runs now.
size_t lanes();

// scores[r·score_stride + c] = Σ_e q[r·q_stride + e] · k[c·k_stride + e]   (r < rows, c < cols)
// One multiply-add chain per (row, key), summed across lanes at the end: rows in groups of 4,
// keys in blocks of 2 (AVX2) or 4 (AVX-512), each key row loaded once for the group; the chains'
// lanes summed four at a time.
// `next` (may be null): rows of the same count and size the caller reads next (these keys'
// values), prefetched into L2 as the keys go by, so that they arrive while the scores are computed.
template <class Kv>
void qk_scores(const float* q, size_t q_stride, size_t rows, const Kv* k, size_t k_stride, size_t cols, size_t dim,
               float* scores, size_t score_stride, const Kv* next = nullptr, size_t next_stride = 0);

// out[r·out_stride + e] += Σ_c p[r·p_stride + c] · v[c·v_stride + e]   (r < rows, e < dim)
// Blocks of 4 rows × up to 4 vectors of columns stay in registers while runs of 16 keys go by.
// `next` (may be null): `cols` rows of `dim` the caller reads next (the next block's keys),
// prefetched into L2 as the values go by: the hardware prefetcher follows the keys only while
// they are read, and would leave the memory idle while the values are summed.
template <class Kv>
void pv_accumulate(const float* p, size_t p_stride, size_t rows, const Kv* v, size_t v_stride, size_t cols,
                   size_t dim, float* out, size_t out_stride, const Kv* next = nullptr, size_t next_stride = 0);

}  // namespace mha::attention::detail::decode
