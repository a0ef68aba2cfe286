#pragma once
// SIMD kernels of the attention classifier's fused path, on a chunk of kLanes images at a time:
// the attention core (one head) and LayerNorm. Internal to src/models.
//
// For these shapes (L = 28 tokens, head sizes 7 to 32) every matrix product inside attention is
// tiny (28 × 7 by 7 × 28), too small for SIMD along any of its own dimensions. The images of a
// chunk all have the same shapes, so the fused path keeps each chunk in a "lanes" layout with
// the image index innermost:
//     x(position i, feature c) of image m  at  x[(c·L + i)·kLanes + m]
// and every operation here (q·k, the softmax, P·v, and all of backward) is a plain vertical
// vector operation over images, with no reductions across lanes and no transposes. A vector of
// G lanes (16 floats with AVX-512, 8 with AVX2) covers G images; kLanes = 16 is a multiple of
// every G. All 16 lanes are computed; lanes past a partial chunk's end hold zeros and stay finite.
//
// Highway picks the SIMD target at run time (AVX-512, AVX2, SSE4, ... or scalar code; for tests,
// mha::pin_simd_target in mha/core/simd.h pins it), and the exponential is Highway's Exp
// (hwy/contrib/math).
//
// q, k, v, o, dq, dk, dv: a head's d features, each an (L, kLanes) block, so x(i, c) is at
// x[(c·L + i)·kLanes + m] (the head's rows of the chunk's (3E, L, kLanes) projection). probs:
// (L, L, kLanes), probs[(i·L + j)·kLanes + m] = P_m[i][j] for query i and key j.
#include <cstddef>
#include <cstdint>

namespace mha::models::detail {

inline constexpr int64_t kLanes = 16;

// Elements of scratch the kernels need (either of them).
inline int64_t attention_scratch_size(int64_t len) { return len * len * kLanes; }

// o_i = Σ_j P_ij v_j with P = softmax over j of scale·q_i·k_j; fills probs unless it is null.
template <class T>
void attention_chunk_forward(const T* q, const T* k, const T* v, int64_t len, int64_t head_dim, T scale, T* o,
                             T* probs, T* scratch);

// From the forward's operands and probs and the gradient of o, the gradients of q, k and v
// (overwritten).
template <class T>
void attention_chunk_backward(const T* q, const T* k, const T* v, const T* probs, const T* d_o, int64_t len,
                              int64_t head_dim, T scale, T* dq, T* dk, T* dv, T* scratch);

// nn::LayerNorm over the `width` features of each of the `cols` columns of x (width, cols) (cols a
// multiple of kLanes): y = (x − mean)·rstd·weight + bias with the biased variance, keeping the
// normalised values and rstd = 1/sqrt(var + eps) for backward. Statistics are accumulated in T.
template <class T>
void layer_norm_lanes(const T* x, int64_t width, int64_t cols, const T* weight, const T* bias, T eps, T* y,
                      T* normalized, T* rstd);

// Its backward: dx = rstd·(dxhat − mean(dxhat) − xhat·mean(dxhat·xhat)) with dxhat = dy·weight;
// grad_weight += Σ_cols dy·xhat, grad_bias += Σ_cols dy. scratch: 2·cols elements.
template <class T>
void layer_norm_lanes_backward(const T* dy, const T* normalized, const T* rstd, int64_t width, int64_t cols,
                               const T* weight, T* grad_weight, T* grad_bias, T* dx, T* scratch);

}  // namespace mha::models::detail
