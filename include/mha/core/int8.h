#pragma once
// Symmetric int8 with one float scale per row: how a paged KV cache stores int8 keys and values
// (mha/nn/paged_kv_cache.h) and how attention rounds the queries that meet them
// (mha/attention/attention.h, paged_forward_into).
//
//   scale = max|x| / 127 (in float),  q = round(x / scale) (to nearest, in double),  x ≈ scale·q
//
// so each number is within scale/2 of x (|q| <= 127; a zero row has scale 0 and q = 0). A row
// holding a NaN or an infinity gets scale NaN and q = 0: it stands for NaNs, as it would make
// its products NaN in float.
#include <cstddef>
#include <cstdint>

namespace mha {

// q[0..n) for x[0..n); returns the scale.
float quantize_int8(const float* x, size_t n, int8_t* q);

}  // namespace mha
