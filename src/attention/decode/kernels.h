#pragma once
// The SIMD building blocks of the decode backend (decode.cpp): the two products of a few query
// rows against a block of keys read in place, row by row, with no packing. Each call goes
// through Highway's dynamic dispatch to the best target this CPU supports (mha/core/simd.h pins
// it); kernels.cpp holds the per-target code.
//
// Both take `dim` a multiple of lanes() (decode.cpp pads rows that are not); rows of q, k, v and
// out are `dim` floats at their own strides.
#include <cstddef>

namespace mha::attention::detail::decode {

// The floats per vector of the target that runs now.
size_t lanes();

// scores[r·score_stride + c] = Σ_e q[r·q_stride + e] · k[c·k_stride + e]   (r < rows, c < cols)
// One multiply-add chain per (row, key), summed across lanes at the end: the keys are read in
// blocks of 4, each from memory once for all the rows.
void qk_scores(const float* q, size_t q_stride, size_t rows, const float* k, size_t k_stride, size_t cols, size_t dim,
               float* scores, size_t score_stride);

// out[r·out_stride + e] += Σ_c p[r·p_stride + c] · v[c·v_stride + e]   (r < rows, e < dim)
// Blocks of 4 rows × up to 4 vectors of columns stay in registers while the keys stream by.
void pv_accumulate(const float* p, size_t p_stride, size_t rows, const float* v, size_t v_stride, size_t cols,
                   size_t dim, float* out, size_t out_stride);

}  // namespace mha::attention::detail::decode
