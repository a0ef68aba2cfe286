// Per-target code of the decode backend's products (kernels.h), compiled once per Highway
// target; each call runs the best target this CPU supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/decode/kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "attention/decode/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace mha::attention::detail::decode::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_HAVE_SCALABLE
#error "the kernels hold arrays of vectors: scalable-vector targets are disabled in CMakeLists.txt"
#endif

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

size_t Lanes() { return hn::Lanes(DF()); }

// R rows × K keys of scores: R·K accumulators, each key vector loaded once for the R rows.
template <size_t R, size_t K>
HWY_INLINE void QKBlock(DF d, const float* q, size_t qs, const float* k, size_t ks, size_t dim, float* s,
                        size_t ss) {
  const size_t N = hn::Lanes(d);
  VF acc[R][K];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < K; ++j) acc[r][j] = hn::Zero(d);
  for (size_t e = 0; e < dim; e += N) {
    VF qv[R];
    for (size_t r = 0; r < R; ++r) qv[r] = hn::LoadU(d, q + r * qs + e);
    for (size_t j = 0; j < K; ++j) {
      const VF kv = hn::LoadU(d, k + j * ks + e);
      for (size_t r = 0; r < R; ++r) acc[r][j] = hn::MulAdd(qv[r], kv, acc[r][j]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < K; ++j) s[r * ss + j] = hn::GetLane(hn::SumOfLanes(d, acc[r][j]));
}

template <size_t R>
HWY_INLINE void QKRows(DF d, const float* q, size_t qs, const float* k, size_t ks, size_t cols, size_t dim, float* s,
                       size_t ss) {
  size_t c = 0;
  for (; c + 4 <= cols; c += 4) QKBlock<R, 4>(d, q, qs, k + c * ks, ks, dim, s + c, ss);
  switch (cols - c) {
    case 3: QKBlock<R, 3>(d, q, qs, k + c * ks, ks, dim, s + c, ss); break;
    case 2: QKBlock<R, 2>(d, q, qs, k + c * ks, ks, dim, s + c, ss); break;
    case 1: QKBlock<R, 1>(d, q, qs, k + c * ks, ks, dim, s + c, ss); break;
    default: break;
  }
}

void QKScores(const float* q, size_t q_stride, size_t rows, const float* k, size_t k_stride, size_t cols, size_t dim,
              float* scores, size_t score_stride) {
  const DF d;
  size_t r = 0;
  for (; r + 2 <= rows; r += 2)
    QKRows<2>(d, q + r * q_stride, q_stride, k, k_stride, cols, dim, scores + r * score_stride, score_stride);
  if (r < rows) QKRows<1>(d, q + r * q_stride, q_stride, k, k_stride, cols, dim, scores + r * score_stride, score_stride);
}

// Column blocks of up to kVecs vectors: 4 rows × kVecs accumulators fit the register file
// (16 of 32 on AVX-512, 8 of 16 on AVX2) beside the value vectors and one broadcast.
constexpr size_t kVecs = HWY_MAX_BYTES >= 64 ? 4 : 2;

template <size_t R, size_t V>
HWY_INLINE void PVBlock(DF d, const float* p, size_t ps, const float* v, size_t vs, size_t cols, float* o,
                        size_t os) {
  const size_t N = hn::Lanes(d);
  VF acc[R][V];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < V; ++j) acc[r][j] = hn::LoadU(d, o + r * os + j * N);
  for (size_t c = 0; c < cols; ++c) {
    VF vv[V];
    for (size_t j = 0; j < V; ++j) vv[j] = hn::LoadU(d, v + c * vs + j * N);
    for (size_t r = 0; r < R; ++r) {
      const VF pr = hn::Set(d, p[r * ps + c]);
      for (size_t j = 0; j < V; ++j) acc[r][j] = hn::MulAdd(pr, vv[j], acc[r][j]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < V; ++j) hn::StoreU(acc[r][j], d, o + r * os + j * N);
}

template <size_t R>
HWY_INLINE void PVRows(DF d, const float* p, size_t ps, const float* v, size_t vs, size_t cols, size_t dim, float* o,
                       size_t os) {
  const size_t N = hn::Lanes(d);
  size_t e = 0;
  for (; e + kVecs * N <= dim; e += kVecs * N) PVBlock<R, kVecs>(d, p, ps, v + e, vs, cols, o + e, os);
  switch ((dim - e) / N) {
    case 3: PVBlock<R, 3>(d, p, ps, v + e, vs, cols, o + e, os); break;
    case 2: PVBlock<R, 2>(d, p, ps, v + e, vs, cols, o + e, os); break;
    case 1: PVBlock<R, 1>(d, p, ps, v + e, vs, cols, o + e, os); break;
    default: break;
  }
}

void PVAccumulate(const float* p, size_t p_stride, size_t rows, const float* v, size_t v_stride, size_t cols,
                  size_t dim, float* out, size_t out_stride) {
  const DF d;
  size_t r = 0;
  for (; r + 4 <= rows; r += 4)
    PVRows<4>(d, p + r * p_stride, p_stride, v, v_stride, cols, dim, out + r * out_stride, out_stride);
  const float* pr = p + r * p_stride;
  float* outr = out + r * out_stride;
  switch (rows - r) {
    case 3: PVRows<3>(d, pr, p_stride, v, v_stride, cols, dim, outr, out_stride); break;
    case 2: PVRows<2>(d, pr, p_stride, v, v_stride, cols, dim, outr, out_stride); break;
    case 1: PVRows<1>(d, pr, p_stride, v, v_stride, cols, dim, outr, out_stride); break;
    default: break;
  }
}

}  // namespace mha::attention::detail::decode::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mha::attention::detail::decode {

HWY_EXPORT(Lanes);
HWY_EXPORT(QKScores);
HWY_EXPORT(PVAccumulate);

size_t lanes() { return HWY_DYNAMIC_DISPATCH(Lanes)(); }

void qk_scores(const float* q, size_t q_stride, size_t rows, const float* k, size_t k_stride, size_t cols, size_t dim,
               float* scores, size_t score_stride) {
  HWY_DYNAMIC_DISPATCH(QKScores)(q, q_stride, rows, k, k_stride, cols, dim, scores, score_stride);
}

void pv_accumulate(const float* p, size_t p_stride, size_t rows, const float* v, size_t v_stride, size_t cols,
                   size_t dim, float* out, size_t out_stride) {
  HWY_DYNAMIC_DISPATCH(PVAccumulate)(p, p_stride, rows, v, v_stride, cols, dim, out, out_stride);
}

}  // namespace mha::attention::detail::decode
#endif  // HWY_ONCE
