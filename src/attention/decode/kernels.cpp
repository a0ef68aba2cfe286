// Per-target code of the decode backend's products (kernels.h), compiled once per Highway
// target; each call runs the best target this CPU supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/decode/kernels.cpp"
#include <algorithm>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "attention/decode/kernels.h"
#include "mha/core/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace mha::attention::detail::decode::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_HAVE_SCALABLE
#error "the kernels hold arrays of vectors: scalable-vector targets are disabled in CMakeLists.txt"
#endif

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Software prefetch into L2 (prefetcht1, not L1: the lines are wanted up to a block of 256 keys
// later) of the value rows of the keys being scored, so that they have arrived when
// pv_accumulate reads them. The keys themselves are left to the hardware's stream prefetcher:
// prefetching them too, 64 rows ahead, made both slower (measured on a 2-core Zen 3, B=1,
// Hkv=8, S=32768: float32 15.6 GB/s with both, 19.2 with the values only, 14.3 with neither).
template <class Kv>
HWY_INLINE void PrefetchRows(const Kv* first, size_t stride, size_t count, size_t dim) {
  const char* base = reinterpret_cast<const char*>(first);
  for (size_t r = 0; r < count; ++r)
    for (size_t byte = 0; byte < dim * sizeof(Kv); byte += 64)
      __builtin_prefetch(base + (r * stride) * sizeof(Kv) + byte, /*rw=*/0, /*locality=*/2);
}

size_t Lanes() { return hn::Lanes(DF()); }

#if HWY_TARGET == HWY_SCALAR
template <size_t R, size_t K>
HWY_INLINE void StoreSums(DF /*d*/, const VF (&acc)[R][K], float* s, size_t ss) {
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < K; ++j) s[r * ss + j] = hn::GetLane(acc[r][j]);
}
#else
using D4 = hn::Full128<float>;

// The 128-bit blocks of v added together.
template <class D>
HWY_INLINE hn::Vec<D4> AddBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) == 4) {
    return v;
  } else {
    const hn::Half<D> dh;
    return AddBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

// [Σa, Σb, Σc, Σe]: four sums across lanes at once, in 3 additions and one per extra block
// (four SumOfLanes cost 4·log2(lanes) shuffles and additions, as many as the products of a
// 128-long dot product on AVX-512).
HWY_INLINE hn::Vec<D4> Sum4(DF d, VF a, VF b, VF c, VF e) {
  const hn::Repartition<double, DF> d64;
  // Within each block: [a0+a2, b0+b2, a1+a3, b1+b3] and the same of c, e.
  const VF ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const VF ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  const auto ab64 = hn::BitCast(d64, ab), ce64 = hn::BitCast(d64, ce);
  const VF sums = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, ab64, ce64)),
                          hn::BitCast(d, hn::InterleaveUpper(d64, ab64, ce64)));
  return AddBlocks(d, sums);
}

// s[r·ss + j] = Σ lanes of acc[r][j], four accumulators at a time (a row's four keys stored at
// once when K = 4).
template <size_t R, size_t K>
HWY_INLINE void StoreSums(DF d, const VF (&acc)[R][K], float* s, size_t ss) {
  const D4 d4;
  const VF zero = hn::Zero(d);
  auto at = [&](size_t i) { return i < R * K ? acc[i / K][i % K] : zero; };
  for (size_t i = 0; i < R * K; i += 4) {
    const hn::Vec<D4> sums = Sum4(d, at(i), at(i + 1), at(i + 2), at(i + 3));
    if constexpr (K == 4) {
      hn::StoreU(sums, d4, s + (i / K) * ss);
    } else {
      HWY_ALIGN float lanes[4];
      hn::Store(sums, d4, lanes);
      for (size_t t = 0; t < 4 && i + t < R * K; ++t) s[((i + t) / K) * ss + (i + t) % K] = lanes[t];
    }
  }
}
#endif

// R rows × K keys of scores: R·K accumulators, each key vector loaded (and converted) once for
// the R rows.
template <size_t R, size_t K, class Kv>
HWY_INLINE void QKBlock(DF d, const float* q, size_t qs, const Kv* k, size_t ks, size_t dim, float* s, size_t ss) {
  const size_t N = hn::Lanes(d);
  VF acc[R][K];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < K; ++j) acc[r][j] = hn::Zero(d);
  for (size_t e = 0; e < dim; e += N) {
    VF qv[R];
    for (size_t r = 0; r < R; ++r) qv[r] = hn::LoadU(d, q + r * qs + e);
    for (size_t j = 0; j < K; ++j) {
      const VF kv = mha::HWY_NAMESPACE::LoadAsFloat(d, k + j * ks + e);
      for (size_t r = 0; r < R; ++r) acc[r][j] = hn::MulAdd(qv[r], kv, acc[r][j]);
    }
  }
  StoreSums<R, K>(d, acc, s, ss);
}

// Keys per block: R·K accumulators + R query vectors + 1 key vector fit the register file
// (32 vectors on AVX-512 and NEON, 16 on AVX2 and SSE).
constexpr size_t kQKKeys = HWY_MAX_BYTES >= 64 ? 4 : 2;

template <size_t R, class Kv>
HWY_INLINE void QKRows(DF d, const float* q, size_t qs, const Kv* k, size_t ks, size_t cols, size_t dim, float* s,
                       size_t ss, const Kv* next, size_t ns) {
  size_t c = 0;
  for (; c + kQKKeys <= cols; c += kQKKeys) {
    if (next) PrefetchRows(next + c * ns, ns, kQKKeys, dim);
    QKBlock<R, kQKKeys>(d, q, qs, k + c * ks, ks, dim, s + c, ss);
  }
  for (; c < cols; ++c) QKBlock<R, 1>(d, q, qs, k + c * ks, ks, dim, s + c, ss);
}

// Rows in groups of 4, so that each key is read from memory once for a GQA group of 4 heads.
template <class Kv>
void QKScores(const float* q, size_t q_stride, size_t rows, const Kv* k, size_t k_stride, size_t cols, size_t dim,
              float* scores, size_t score_stride, const Kv* next, size_t next_stride) {
  const DF d;
  for (size_t r = 0; r < rows; r += 4) {
    const float* qr = q + r * q_stride;
    float* sr = scores + r * score_stride;
    const Kv* nr = r == 0 ? next : nullptr;  // prefetched once
    switch (std::min<size_t>(4, rows - r)) {
      case 4: QKRows<4>(d, qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      case 3: QKRows<3>(d, qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      case 2: QKRows<2>(d, qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
      default: QKRows<1>(d, qr, q_stride, k, k_stride, cols, dim, sr, score_stride, nr, next_stride); break;
    }
  }
}

// Column blocks of up to kVecs vectors: 4 rows × kVecs accumulators fit the register file
// (16 of 32 on AVX-512, 8 of 16 on AVX2) beside the value vectors and one broadcast.
constexpr size_t kVecs = HWY_MAX_BYTES >= 64 ? 4 : 2;

// Keys [0, cols) of R rows × V vectors of output columns, the accumulators in registers.
template <size_t R, size_t V, class Kv>
HWY_INLINE void PVBlock(DF d, const float* p, size_t ps, const Kv* v, size_t vs, size_t cols, float* o, size_t os) {
  const size_t N = hn::Lanes(d);
  VF acc[R][V];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < V; ++j) acc[r][j] = hn::LoadU(d, o + r * os + j * N);
  for (size_t c = 0; c < cols; ++c) {
    VF vv[V];
    for (size_t j = 0; j < V; ++j) vv[j] = mha::HWY_NAMESPACE::LoadAsFloat(d, v + c * vs + j * N);
    for (size_t r = 0; r < R; ++r) {
      const VF pr = hn::Set(d, p[r * ps + c]);
      for (size_t j = 0; j < V; ++j) acc[r][j] = hn::MulAdd(pr, vv[j], acc[r][j]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < V; ++j) hn::StoreU(acc[r][j], d, o + r * os + j * N);
}

template <size_t R, class Kv>
HWY_INLINE void PVRows(DF d, const float* p, size_t ps, const Kv* v, size_t vs, size_t cols, size_t dim, float* o,
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

// Keys in runs of kPVKeys: a run's value rows (16 × d) stay in L1 while every group of 4 rows and
// every block of columns uses them, and memory is read row after row (a block of columns walking
// all the keys would read it with a stride of one row).
constexpr size_t kPVKeys = 16;

template <class Kv>
void PVAccumulate(const float* p, size_t p_stride, size_t rows, const Kv* v, size_t v_stride, size_t cols, size_t dim,
                  float* out, size_t out_stride, const Kv* next, size_t next_stride) {
  const DF d;
  for (size_t c0 = 0; c0 < cols; c0 += kPVKeys) {
    const size_t n = std::min(kPVKeys, cols - c0);
    if (next) PrefetchRows(next + c0 * next_stride, next_stride, n, dim);
    const Kv* vc = v + c0 * v_stride;
    for (size_t r = 0; r < rows; r += 4) {
      const float* pr = p + r * p_stride + c0;
      float* outr = out + r * out_stride;
      switch (std::min<size_t>(4, rows - r)) {
        case 4: PVRows<4>(d, pr, p_stride, vc, v_stride, n, dim, outr, out_stride); break;
        case 3: PVRows<3>(d, pr, p_stride, vc, v_stride, n, dim, outr, out_stride); break;
        case 2: PVRows<2>(d, pr, p_stride, vc, v_stride, n, dim, outr, out_stride); break;
        default: PVRows<1>(d, pr, p_stride, vc, v_stride, n, dim, outr, out_stride); break;
      }
    }
  }
}

// The exported instances, one per storage type.
#define MHA_DECODE_KERNELS(Kv, suffix)                                                                             \
  void QKScores##suffix(const float* q, size_t qs, size_t rows, const Kv* k, size_t ks, size_t cols, size_t dim,   \
                        float* s, size_t ss, const Kv* next, size_t ns) {                                         \
    QKScores(q, qs, rows, k, ks, cols, dim, s, ss, next, ns);                                                     \
  }                                                                                                               \
  void PVAccumulate##suffix(const float* p, size_t ps, size_t rows, const Kv* v, size_t vs, size_t cols,           \
                            size_t dim, float* o, size_t os, const Kv* next, size_t ns) {                         \
    PVAccumulate(p, ps, rows, v, vs, cols, dim, o, os, next, ns);                                                 \
  }
MHA_DECODE_KERNELS(float, F32)
MHA_DECODE_KERNELS(bfloat16, BF16)
MHA_DECODE_KERNELS(float16, F16)
MHA_DECODE_KERNELS(int8_t, I8)
#undef MHA_DECODE_KERNELS

}  // namespace mha::attention::detail::decode::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "mha/core/simd.h"

namespace mha::attention::detail::decode {

HWY_EXPORT(Lanes);
HWY_EXPORT(QKScoresF32);
HWY_EXPORT(QKScoresBF16);
HWY_EXPORT(QKScoresF16);
HWY_EXPORT(QKScoresI8);
HWY_EXPORT(PVAccumulateF32);
HWY_EXPORT(PVAccumulateBF16);
HWY_EXPORT(PVAccumulateF16);
HWY_EXPORT(PVAccumulateI8);

size_t lanes() { return HWY_DYNAMIC_DISPATCH(Lanes)(); }

#define MHA_DECODE_DISPATCH(Kv, suffix)                                                                              \
  template <>                                                                                                      \
  void qk_scores(const float* q, size_t qs, size_t rows, const Kv* k, size_t ks, size_t cols, size_t dim, float* s, \
                 size_t ss, const Kv* next, size_t ns) {                                                           \
    HWY_DYNAMIC_DISPATCH(QKScores##suffix)(q, qs, rows, k, ks, cols, dim, s, ss, next, ns);                        \
  }                                                                                                                \
  template <>                                                                                                      \
  void pv_accumulate(const float* p, size_t ps, size_t rows, const Kv* v, size_t vs, size_t cols, size_t dim,      \
                     float* o, size_t os, const Kv* next, size_t ns) {                                             \
    HWY_DYNAMIC_DISPATCH(PVAccumulate##suffix)(p, ps, rows, v, vs, cols, dim, o, os, next, ns);                    \
  }
MHA_DECODE_DISPATCH(float, F32)
MHA_DECODE_DISPATCH(bfloat16, BF16)
MHA_DECODE_DISPATCH(float16, F16)
MHA_DECODE_DISPATCH(int8_t, I8)
#undef MHA_DECODE_DISPATCH

}  // namespace mha::attention::detail::decode

// MHA_CPU_TARGET's ceiling, set while the program starts, before any dispatch (mha/core/simd.h).
[[maybe_unused]] static const bool cpu_target_applied = mha::detail::apply_cpu_target_from_environment();

#endif  // HWY_ONCE
