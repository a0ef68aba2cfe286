// The fused path's SIMD kernels (lanes_kernels.h), compiled once per SIMD target by Highway and
// dispatched at run time to the best one this CPU supports (mha::pin_simd_target in
// mha/core/simd.h pins it). The targets are those of every mha library (HWY_DISABLED_TARGETS in
// CMakeLists.txt).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "models/lanes_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

#include <algorithm>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace mha::models::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kLanesHere = 16;  // = kLanes (lanes_kernels.h is included only once)

// The products inside attention are tiny matrix products per image lane; they are computed in
// register blocks of R rows (queries, or keys) × NB columns, R·NB independent FMA chains, so
// each operand loaded from memory feeds several FMAs (the loads, not the FMAs, are what limits
// these loops: a head's operands do not all fit in the L1 cache).
constexpr int kBlock = 4;  // columns per block
constexpr int kRows = 2;   // rows per block

// R·NB dot products of length d: for row r < R and column t < NB,
//   s_r[t·16] = factor · Σ_c a_r[c·cs] · b[t·16 + c·cs].
template <int R, int NB, class D, class T>
HWY_INLINE void DotBlock(D df, const T* const* a, const T* b, int64_t cs, int64_t d, hn::Vec<D> factor,
                         T* const* s) {
  hn::Vec<D> acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NB; ++t) acc[r][t] = hn::Zero(df);
  for (int64_t c = 0; c < d; ++c) {
    hn::Vec<D> x[R];
    for (int r = 0; r < R; ++r) x[r] = hn::LoadU(df, a[r] + c * cs);
    for (int t = 0; t < NB; ++t) {
      const auto y = hn::LoadU(df, b + t * kLanesHere + c * cs);
      for (int r = 0; r < R; ++r) acc[r][t] = hn::MulAdd(x[r], y, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NB; ++t) hn::StoreU(hn::Mul(acc[r][t], factor), df, s[r] + t * kLanesHere);
}

// R·NB columns of weighted sums of `rows` positions of a head's (d, L) block: for r < R, t < NB,
//   out_r[t·cs] = factor · Σ_p w_r[p·w_step] · m[t·cs + p·16].
template <int R, int NB, class D, class T>
HWY_INLINE void WeightedBlock(D df, const T* const* w, int64_t w_step, const T* m, int64_t cs, int64_t rows,
                              hn::Vec<D> factor, T* const* out) {
  hn::Vec<D> acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NB; ++t) acc[r][t] = hn::Zero(df);
  for (int64_t p = 0; p < rows; ++p) {
    hn::Vec<D> x[R];
    for (int r = 0; r < R; ++r) x[r] = hn::LoadU(df, w[r] + p * w_step);
    for (int t = 0; t < NB; ++t) {
      const auto y = hn::LoadU(df, m + t * cs + p * kLanesHere);
      for (int r = 0; r < R; ++r) acc[r][t] = hn::MulAdd(x[r], y, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NB; ++t) hn::StoreU(hn::Mul(acc[r][t], factor), df, out[r] + t * cs);
}

// Calls body.template operator()<NB>(offset) over [0, n) in blocks of kBlock, then the remainder.
template <class Body>
HWY_INLINE void InBlocks(int64_t n, Body&& body) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) body.template operator()<kBlock>(i);
  switch (n - i) {
    case 3: body.template operator()<3>(i); break;
    case 2: body.template operator()<2>(i); break;
    case 1: body.template operator()<1>(i); break;
    default: break;
  }
  static_assert(kBlock == 4, "InBlocks handles remainders up to 3");
}

// For R rows at once: s_r[j·16] = factor · Σ_c a_r[c·cs] · b[j·16 + c·cs] for every j < len (rows
// of scores, or of dP).
template <int R, class D, class T>
HWY_INLINE void RowDots(D df, const T* const* a, const T* b, int64_t cs, int64_t len, int64_t d, T factor,
                        T* const* s) {
  const auto f = hn::Set(df, factor);
  InBlocks(len, [&]<int NB>(int64_t j) {
    T* out[R];
    for (int r = 0; r < R; ++r) out[r] = s[r] + j * kLanesHere;
    DotBlock<R, NB>(df, a, b + j * kLanesHere, cs, d, f, out);
  });
}

// For R rows at once: out_r[c·cs] = factor · Σ_p w_r[p·w_step] · m[p·16 + c·cs] for every c < d.
template <int R, class D, class T>
HWY_INLINE void WeightedRows(D df, const T* const* w, int64_t w_step, const T* m, int64_t cs, int64_t rows,
                             int64_t d, T factor, T* const* out) {
  const auto f = hn::Set(df, factor);
  InBlocks(d, [&]<int NB>(int64_t c) {
    T* o[R];
    for (int r = 0; r < R; ++r) o[r] = out[r] + c * cs;
    WeightedBlock<R, NB>(df, w, w_step, m + c * cs, cs, rows, f, o);
  });
}

// Runs body.template operator()<R>(i) for i = 0, R, 2R, ... over [0, n): pairs of rows, then a
// single last row when n is odd.
template <class Body>
HWY_INLINE void InRowPairs(int64_t n, Body&& body) {
  int64_t i = 0;
  for (; i + kRows <= n; i += kRows) body.template operator()<kRows>(i);
  if (i < n) body.template operator()<1>(i);
  static_assert(kRows == 2, "InRowPairs handles one odd row");
}

// The softmax over the keys of one row of scores, in place (maximum subtracted first).
template <class D, class T>
HWY_INLINE void SoftmaxRow(D df, T* p_row, int64_t len) {
  const int64_t W = kLanesHere;
  auto m0 = hn::Set(df, hwy::LowestValue<T>()), m1 = m0;
  int64_t j = 0;
  for (; j + 2 <= len; j += 2) {
    m0 = hn::Max(m0, hn::LoadU(df, p_row + j * W));
    m1 = hn::Max(m1, hn::LoadU(df, p_row + (j + 1) * W));
  }
  if (j < len) m0 = hn::Max(m0, hn::LoadU(df, p_row + j * W));
  const auto row_max = hn::Max(m0, m1);
  auto sum0 = hn::Zero(df), sum1 = sum0;
  for (j = 0; j + 2 <= len; j += 2) {
    const auto e0 = hn::Exp(df, hn::Sub(hn::LoadU(df, p_row + j * W), row_max));
    const auto e1 = hn::Exp(df, hn::Sub(hn::LoadU(df, p_row + (j + 1) * W), row_max));
    hn::StoreU(e0, df, p_row + j * W);
    hn::StoreU(e1, df, p_row + (j + 1) * W);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  if (j < len) {
    const auto e0 = hn::Exp(df, hn::Sub(hn::LoadU(df, p_row + j * W), row_max));
    hn::StoreU(e0, df, p_row + j * W);
    sum0 = hn::Add(sum0, e0);
  }
  const auto inverse = hn::Div(hn::Set(df, T(1)), hn::Add(sum0, sum1));
  for (j = 0; j < len; ++j) hn::StoreU(hn::Mul(hn::LoadU(df, p_row + j * W), inverse), df, p_row + j * W);
}

template <class T>
HWY_INLINE void Forward(const T* q, const T* k, const T* v, int64_t len, int64_t head_dim, T scale, T* o, T* probs,
                        T* scratch) {
  const hn::ScalableTag<T> df;
  const int64_t G = static_cast<int64_t>(hn::Lanes(df));
  const int64_t L = len, d = head_dim, W = kLanesHere, cs = L * W;
  T* p = probs != nullptr ? probs : scratch;  // (L, L, 16)
  for (int64_t g = 0; g < W; g += G) {
    InRowPairs(L, [&]<int R>(int64_t i0) {
      const T* q_rows[R];
      T* p_rows[R];
      T* o_rows[R];
      for (int r = 0; r < R; ++r) {
        q_rows[r] = q + (i0 + r) * W + g;
        p_rows[r] = p + (i0 + r) * L * W + g;
        o_rows[r] = o + (i0 + r) * W + g;
      }
      // Scores of queries i0.. against every key, the softmax over the keys, then o_i = Σ_j P_ij v_j.
      RowDots<R>(df, q_rows, k + g, cs, L, d, scale, p_rows);
      for (int r = 0; r < R; ++r) SoftmaxRow(df, p_rows[r], L);
      const T* w_rows[R];
      for (int r = 0; r < R; ++r) w_rows[r] = p_rows[r];
      WeightedRows<R>(df, w_rows, W, v + g, cs, L, d, T(1), o_rows);
    });
  }
}

template <class T>
HWY_INLINE void Backward(const T* q, const T* k, const T* v, const T* probs, const T* d_o, int64_t len,
                         int64_t head_dim, T scale, T* dq, T* dk, T* dv, T* scratch) {
  const hn::ScalableTag<T> df;
  const int64_t G = static_cast<int64_t>(hn::Lanes(df));
  const int64_t L = len, d = head_dim, W = kLanesHere, cs = L * W;
  T* ds = scratch;  // (L, L, 16): dP, then dS
  for (int64_t g = 0; g < W; g += G) {
    InRowPairs(L, [&]<int R>(int64_t i0) {
      const T* do_rows[R];
      T* ds_rows[R];
      T* dq_rows[R];
      for (int r = 0; r < R; ++r) {
        do_rows[r] = d_o + (i0 + r) * W + g;
        ds_rows[r] = ds + (i0 + r) * L * W + g;
        dq_rows[r] = dq + (i0 + r) * W + g;
      }
      // dP_ij = dO_i · v_j.
      RowDots<R>(df, do_rows, v + g, cs, L, d, T(1), ds_rows);
      // D_i = Σ_j P_ij dP_ij; dS_ij = P_ij (dP_ij − D_i).
      for (int r = 0; r < R; ++r) {
        const T* p_row = probs + (i0 + r) * L * W + g;
        T* ds_row = ds_rows[r];
        auto dot0 = hn::Zero(df), dot1 = dot0;
        int64_t j = 0;
        for (; j + 2 <= L; j += 2) {
          dot0 = hn::MulAdd(hn::LoadU(df, p_row + j * W), hn::LoadU(df, ds_row + j * W), dot0);
          dot1 = hn::MulAdd(hn::LoadU(df, p_row + (j + 1) * W), hn::LoadU(df, ds_row + (j + 1) * W), dot1);
        }
        if (j < L) dot0 = hn::MulAdd(hn::LoadU(df, p_row + j * W), hn::LoadU(df, ds_row + j * W), dot0);
        const auto row_dot = hn::Add(dot0, dot1);
        for (j = 0; j < L; ++j)
          hn::StoreU(hn::Mul(hn::LoadU(df, p_row + j * W), hn::Sub(hn::LoadU(df, ds_row + j * W), row_dot)), df,
                     ds_row + j * W);
      }
      // dq_i = scale Σ_j dS_ij k_j.
      const T* w_rows[R];
      for (int r = 0; r < R; ++r) w_rows[r] = ds_rows[r];
      WeightedRows<R>(df, w_rows, W, k + g, cs, L, d, scale, dq_rows);
    });
    // dk_j = scale Σ_i dS_ij q_i; dv_j = Σ_i P_ij dO_i.
    InRowPairs(L, [&]<int R>(int64_t j0) {
      const T* ds_cols[R];
      const T* p_cols[R];
      T* dk_rows[R];
      T* dv_rows[R];
      for (int r = 0; r < R; ++r) {
        ds_cols[r] = ds + (j0 + r) * W + g;
        p_cols[r] = probs + (j0 + r) * W + g;
        dk_rows[r] = dk + (j0 + r) * W + g;
        dv_rows[r] = dv + (j0 + r) * W + g;
      }
      WeightedRows<R>(df, ds_cols, L * W, q + g, cs, L, d, scale, dk_rows);
      WeightedRows<R>(df, p_cols, L * W, d_o + g, cs, L, d, T(1), dv_rows);
    });
  }
}

template <class T>
HWY_INLINE void LayerNormForward(const T* x, int64_t width, int64_t cols, const T* weight, const T* bias, T eps, T* y,
                                 T* normalized, T* rstd) {
  const hn::ScalableTag<T> df;
  const int64_t G = static_cast<int64_t>(hn::Lanes(df));
  const auto inv_n = hn::Set(df, T(1) / static_cast<T>(width));
  const auto eps_v = hn::Set(df, eps);
  for (int64_t c = 0; c < cols; c += G) {
    auto sum = hn::Zero(df);
    for (int64_t f = 0; f < width; ++f) sum = hn::Add(sum, hn::LoadU(df, x + f * cols + c));
    const auto mean = hn::Mul(sum, inv_n);
    auto var = hn::Zero(df);
    for (int64_t f = 0; f < width; ++f) {
      const auto d = hn::Sub(hn::LoadU(df, x + f * cols + c), mean);
      var = hn::MulAdd(d, d, var);
    }
    const auto r = hn::Div(hn::Set(df, T(1)), hn::Sqrt(hn::MulAdd(var, inv_n, eps_v)));
    hn::StoreU(r, df, rstd + c);
    for (int64_t f = 0; f < width; ++f) {
      const auto xhat = hn::Mul(hn::Sub(hn::LoadU(df, x + f * cols + c), mean), r);
      hn::StoreU(xhat, df, normalized + f * cols + c);
      hn::StoreU(hn::MulAdd(xhat, hn::Set(df, weight[f]), hn::Set(df, bias[f])), df, y + f * cols + c);
    }
  }
}

template <class T>
HWY_INLINE void LayerNormBackward(const T* dy, const T* normalized, const T* rstd, int64_t width, int64_t cols,
                                  const T* weight, T* grad_weight, T* grad_bias, T* dx, T* scratch) {
  const hn::ScalableTag<T> df;
  const int64_t G = static_cast<int64_t>(hn::Lanes(df));
  T* mean_d = scratch;          // (cols): mean of dxhat
  T* mean_dx = scratch + cols;  // (cols): mean of dxhat·xhat
  const auto inv_n = hn::Set(df, T(1) / static_cast<T>(width));
  for (int64_t c = 0; c < cols; c += G) {
    hn::StoreU(hn::Zero(df), df, mean_d + c);
    hn::StoreU(hn::Zero(df), df, mean_dx + c);
  }
  for (int64_t f = 0; f < width; ++f) {
    const auto w = hn::Set(df, weight[f]);
    auto gw = hn::Zero(df), gb = hn::Zero(df);
    for (int64_t c = 0; c < cols; c += G) {
      const auto g = hn::LoadU(df, dy + f * cols + c), xh = hn::LoadU(df, normalized + f * cols + c);
      const auto d = hn::Mul(g, w);
      hn::StoreU(hn::Add(hn::LoadU(df, mean_d + c), d), df, mean_d + c);
      hn::StoreU(hn::MulAdd(d, xh, hn::LoadU(df, mean_dx + c)), df, mean_dx + c);
      gw = hn::MulAdd(g, xh, gw);
      gb = hn::Add(gb, g);
    }
    grad_weight[f] += hn::GetLane(hn::SumOfLanes(df, gw));
    grad_bias[f] += hn::GetLane(hn::SumOfLanes(df, gb));
  }
  for (int64_t c = 0; c < cols; c += G) {
    hn::StoreU(hn::Mul(hn::LoadU(df, mean_d + c), inv_n), df, mean_d + c);
    hn::StoreU(hn::Mul(hn::LoadU(df, mean_dx + c), inv_n), df, mean_dx + c);
  }
  for (int64_t f = 0; f < width; ++f) {
    const auto w = hn::Set(df, weight[f]);
    for (int64_t c = 0; c < cols; c += G) {
      const auto d = hn::Mul(hn::LoadU(df, dy + f * cols + c), w);
      const auto xh = hn::LoadU(df, normalized + f * cols + c);
      const auto inner = hn::Sub(hn::Sub(d, hn::LoadU(df, mean_d + c)), hn::Mul(xh, hn::LoadU(df, mean_dx + c)));
      hn::StoreU(hn::Mul(hn::LoadU(df, rstd + c), inner), df, dx + f * cols + c);
    }
  }
}

void ForwardF32(const float* q, const float* k, const float* v, int64_t len, int64_t d, float scale, float* o,
                float* probs, float* scratch) {
  Forward(q, k, v, len, d, scale, o, probs, scratch);
}
void ForwardF64(const double* q, const double* k, const double* v, int64_t len, int64_t d, double scale, double* o,
                double* probs, double* scratch) {
  Forward(q, k, v, len, d, scale, o, probs, scratch);
}
void BackwardF32(const float* q, const float* k, const float* v, const float* probs, const float* d_o, int64_t len,
                 int64_t d, float scale, float* dq, float* dk, float* dv, float* scratch) {
  Backward(q, k, v, probs, d_o, len, d, scale, dq, dk, dv, scratch);
}
void BackwardF64(const double* q, const double* k, const double* v, const double* probs, const double* d_o,
                 int64_t len, int64_t d, double scale, double* dq, double* dk, double* dv, double* scratch) {
  Backward(q, k, v, probs, d_o, len, d, scale, dq, dk, dv, scratch);
}

void LayerNormF32(const float* x, int64_t width, int64_t cols, const float* w, const float* b, float eps, float* y,
                  float* normalized, float* rstd) {
  LayerNormForward(x, width, cols, w, b, eps, y, normalized, rstd);
}
void LayerNormF64(const double* x, int64_t width, int64_t cols, const double* w, const double* b, double eps,
                  double* y, double* normalized, double* rstd) {
  LayerNormForward(x, width, cols, w, b, eps, y, normalized, rstd);
}
void LayerNormBackwardF32(const float* dy, const float* normalized, const float* rstd, int64_t width, int64_t cols,
                          const float* w, float* gw, float* gb, float* dx, float* scratch) {
  LayerNormBackward(dy, normalized, rstd, width, cols, w, gw, gb, dx, scratch);
}
void LayerNormBackwardF64(const double* dy, const double* normalized, const double* rstd, int64_t width, int64_t cols,
                          const double* w, double* gw, double* gb, double* dx, double* scratch) {
  LayerNormBackward(dy, normalized, rstd, width, cols, w, gw, gb, dx, scratch);
}

}  // namespace HWY_NAMESPACE
}  // namespace mha::models::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "models/lanes_kernels.h"

#include "mha/core/simd.h"

namespace mha::models::detail {

static_assert(kLanes == 16, "lanes_kernels.cpp hard-codes 16 image lanes");

HWY_EXPORT(ForwardF32);
HWY_EXPORT(ForwardF64);
HWY_EXPORT(BackwardF32);
HWY_EXPORT(BackwardF64);
HWY_EXPORT(LayerNormF32);
HWY_EXPORT(LayerNormF64);
HWY_EXPORT(LayerNormBackwardF32);
HWY_EXPORT(LayerNormBackwardF64);

template <>
void layer_norm_lanes(const float* x, int64_t width, int64_t cols, const float* w, const float* b, float eps, float* y,
                      float* normalized, float* rstd) {
  HWY_DYNAMIC_DISPATCH(LayerNormF32)(x, width, cols, w, b, eps, y, normalized, rstd);
}
template <>
void layer_norm_lanes(const double* x, int64_t width, int64_t cols, const double* w, const double* b, double eps,
                      double* y, double* normalized, double* rstd) {
  HWY_DYNAMIC_DISPATCH(LayerNormF64)(x, width, cols, w, b, eps, y, normalized, rstd);
}
template <>
void layer_norm_lanes_backward(const float* dy, const float* normalized, const float* rstd, int64_t width,
                               int64_t cols, const float* w, float* gw, float* gb, float* dx, float* scratch) {
  HWY_DYNAMIC_DISPATCH(LayerNormBackwardF32)(dy, normalized, rstd, width, cols, w, gw, gb, dx, scratch);
}
template <>
void layer_norm_lanes_backward(const double* dy, const double* normalized, const double* rstd, int64_t width,
                               int64_t cols, const double* w, double* gw, double* gb, double* dx, double* scratch) {
  HWY_DYNAMIC_DISPATCH(LayerNormBackwardF64)(dy, normalized, rstd, width, cols, w, gw, gb, dx, scratch);
}

template <>
void attention_chunk_forward(const float* q, const float* k, const float* v, int64_t len, int64_t d, float scale,
                             float* o, float* probs, float* scratch) {
  HWY_DYNAMIC_DISPATCH(ForwardF32)(q, k, v, len, d, scale, o, probs, scratch);
}
template <>
void attention_chunk_forward(const double* q, const double* k, const double* v, int64_t len, int64_t d, double scale,
                             double* o, double* probs, double* scratch) {
  HWY_DYNAMIC_DISPATCH(ForwardF64)(q, k, v, len, d, scale, o, probs, scratch);
}
template <>
void attention_chunk_backward(const float* q, const float* k, const float* v, const float* probs, const float* d_o,
                              int64_t len, int64_t d, float scale, float* dq, float* dk, float* dv, float* scratch) {
  HWY_DYNAMIC_DISPATCH(BackwardF32)(q, k, v, probs, d_o, len, d, scale, dq, dk, dv, scratch);
}
template <>
void attention_chunk_backward(const double* q, const double* k, const double* v, const double* probs,
                              const double* d_o, int64_t len, int64_t d, double scale, double* dq, double* dk,
                              double* dv, double* scratch) {
  HWY_DYNAMIC_DISPATCH(BackwardF64)(q, k, v, probs, d_o, len, d, scale, dq, dk, dv, scratch);
}

}  // namespace mha::models::detail

// MHA_CPU_TARGET's ceiling, set while the program starts, before any dispatch (mha/core/simd.h).
[[maybe_unused]] static const bool cpu_target_applied = mha::detail::apply_cpu_target_from_environment();

#endif  // HWY_ONCE
