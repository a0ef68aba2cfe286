// Per-target SIMD code of the tile kernels: the row operations of the softmax, over the functions
// of one vector in vectors-inl.h (exponentials, soft-cap, bfloat16 stores), and dropout.
// kernels.cpp includes this file once per Highway target (foreach_target.h); kernels.h describes
// every function's contract.
//
// Each vector operation here has a scalar twin: the reference backend computes the same
// quantities one element at a time, and the tests run this code for every compiled target
// against it.

// Per-target include guard (Highway's pattern: toggled once per target).
#if defined(MHA_ATTENTION_TILES_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_ATTENTION_TILES_KERNELS_INL_H_
#undef MHA_ATTENTION_TILES_KERNELS_INL_H_
#else
#define MHA_ATTENTION_TILES_KERNELS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/tiles/kernels.h"
#include "attention/tiles/vectors-inl.h"
#include "hwy/highway.h"
#include "mha/core/random.h"

HWY_BEFORE_NAMESPACE();
namespace mha::attention::detail::tiles::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_HAVE_SCALABLE
#error "the micro-kernel holds arrays of vectors: scalable-vector targets are disabled in kernels.cpp"
#endif

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

HWY_INLINE size_t round_up_to(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// ------------------------------------------------------------------------------------------
// Row operations of the softmax.

// What the row's scores at columns [c0, c0 + N) are before the key range: cap(q·k) + bias.
HWY_INLINE VF Scores(DF d, const ScoreTile& t, const float* s, const float* bias, size_t c0) {
  VF x = hn::LoadU(d, s + c0);
  if (t.scale != 1.0f) x = hn::Mul(x, hn::Set(d, t.scale));
  if (t.softcap > 0.0f) x = Capped(d, x, t.softcap);
  return bias ? hn::Add(x, hn::LoadU(d, bias + c0)) : x;
}

// The scores of columns [c0, c0 + N) of one row: cap(q·k) (already scaled) + bias, plus −inf in
// the columns outside [first, end) (hidden by the key range, added as the reference adds it, so a
// NaN stays NaN), and exactly −inf in the lanes beyond `cols` (padding, which then weighs
// nothing).
HWY_INLINE VF EdgeScores(DF d, const ScoreTile& t, const float* s, const float* bias, size_t c0, size_t first,
                         size_t end) {
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  VF x = Scores(d, t, s, bias, c0);
  const auto visible = hn::AndNot(hn::FirstN(d, first > c0 ? first - c0 : 0), hn::FirstN(d, end > c0 ? end - c0 : 0));
  x = hn::IfThenElse(visible, x, hn::Add(x, neg_inf));
  return hn::IfThenElse(hn::FirstN(d, t.cols - c0), x, neg_inf);
}

// The scale the exponential's argument takes as s·scale − shift when the scale is the tile's only
// addition (bfloat16 products leave q·k unscaled): then the rows' maxima are taken over the raw
// scores (scale·max s = max scale·s: rounding is monotone, scale > 0), no scaled copy of the tile
// is stored and read back, and the probabilities are 2^((s·scale − shift)·log2 e)
// (Exp2OfNonPositive). 1 otherwise: exp(s − shift) as the float path computes it.
HWY_INLINE float DeferredScale(const ScoreTile& t) {
  const bool deferred = t.scale != 1.0f && t.scale > 0.0f && std::isfinite(t.scale) && !t.bias && t.softcap == 0.0f;
  return deferred ? t.scale : 1.0f;
}

// Columns [first, end) of row r are visible (first <= end <= cols).
struct Visible {
  size_t first, end;
};
HWY_INLINE Visible VisibleColumns(const ScoreTile& t, size_t r) {
  if (!t.first_visible) return {0, t.cols};
  auto clamp = [&](int64_t c) { return static_cast<size_t>(std::clamp<int64_t>(c, 0, static_cast<int64_t>(t.cols))); };
  const size_t end = clamp(t.end_visible[r]);
  return {std::min(clamp(t.first_visible[r]), end), end};
}

// Row r of the tile with its additions applied (stored back where there are any) and its
// maximum: the part of the online softmax that needs no exponential. Two running maxima halve
// the dependency chain of Max. (With a deferred scale t.scale is 1 here: the caller multiplies.)
HWY_INLINE float ScoresAndRowMax(DF d, const ScoreTile& t, size_t r) {
  const size_t N = hn::Lanes(d);
  float* s = t.scores + r * t.stride;
  const float* bias = t.bias ? t.bias + r * t.stride : nullptr;
  const Visible v = VisibleColumns(t, r);
  VF max0 = hn::Set(d, -std::numeric_limits<float>::infinity()), max1 = max0;
  auto edge = [&](size_t c0) {
    const VF x = EdgeScores(d, t, s, bias, c0, v.first, v.end);
    hn::StoreU(x, d, s + c0);
    max0 = hn::Max(max0, x);
  };
  size_t c0 = 0;
  for (; c0 < v.first; c0 += N) edge(c0);  // vectors that reach below the first visible column
  if (bias || t.softcap > 0.0f || t.scale != 1.0f) {
    for (; c0 + N <= v.end; c0 += N) {
      const VF x = Scores(d, t, s, bias, c0);
      hn::StoreU(x, d, s + c0);
      max0 = hn::Max(max0, x);
    }
  } else {  // nothing to add: the tile already holds the scores
    for (; c0 + 2 * N <= v.end; c0 += 2 * N) {
      max0 = hn::Max(max0, hn::LoadU(d, s + c0));
      max1 = hn::Max(max1, hn::LoadU(d, s + c0 + N));
    }
    for (; c0 + N <= v.end; c0 += N) max0 = hn::Max(max0, hn::LoadU(d, s + c0));
  }
  for (; c0 < t.cols; c0 += N) edge(c0);
  return hn::GetLane(hn::MaxOfLanes(d, hn::Max(max0, max1)));
}

// The largest tile height the kernels accept (per-row scratch on the stack).
constexpr size_t kMaxTileRows = 256;

void OnlineSoftmaxTile(const ScoreTile& t, double* row_max, double* row_sum, float* out, size_t out_stride,
                       size_t out_cols) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t padded = (t.cols + N - 1) / N * N;  // cols rounded up to whole vectors
  HWY_ALIGN float shift[kMaxTileRows], shift_lo[kMaxTileRows], alpha_arg[kMaxTileRows], alpha[kMaxTileRows];
  HWY_ASSERT(t.rows <= kMaxTileRows);
  const size_t rows = t.rows;

  // Pass 1 (every row, so that the rows' dependency chains overlap): the block maxima and
  // m' = max(m, block max). A row with nothing visible yet keeps m' = −inf and subtracts 0
  // instead (exp(−inf − 0) = 0, where −inf − (−inf) would be NaN).
  // With a deferred scale the exponentials take s·scale − m' from one FMA, exact before its
  // rounding, so m' must be the shift itself: the block maximum's s·scale is exact in double (a
  // product of two floats), and where |m'| >= 2²⁰ float's rounding of it (up to 2⁻⁴, and 256 at
  // 5e9, where the row's own maximum would come out at e²⁵⁶) is kept as a second float, shift_lo,
  // subtracted as well; below, m' is rounded to float and the row's maximum comes out within 2⁻⁵
  // of 0. Either way the state m' is the shift the exponentials subtract, so logsumexp = m' + log l
  // is that of the exact scores, as the backward recomputes them (probabilities_tile). (A target
  // without an FMA rounds s·scale before it subtracts: there m' is the float of the rounded
  // maximum, every argument <= 0, and the backward rounds the same way.)
  const float scale = DeferredScale(t);
  const bool base2 = scale != 1.0f;
  ScoreTile raw = t;  // the tile as pass 1 reads it: without the deferred scale
  if (base2) raw.scale = 1.0f;
  for (size_t r = 0; r < rows; ++r) {
    const double block_max = static_cast<double>(ScoresAndRowMax(d, raw, r)) * scale;
    const double old_max = row_max[r];
    double m = block_max > old_max ? block_max : old_max;
    const float hi = static_cast<float>(m);
    const bool wide = HWY_NATIVE_FMA && std::abs(hi) >= 0x1p20f && std::isfinite(hi);
    shift_lo[r] = wide ? static_cast<float>(m - static_cast<double>(hi)) : 0.0f;
    if (!wide) m = hi;
    row_max[r] = m;
    shift[r] = m == -std::numeric_limits<double>::infinity() ? 0.0f : hi;
    alpha_arg[r] =
        old_max == -std::numeric_limits<double>::infinity() ? neg_inf : static_cast<float>(old_max - m);
  }
  // α = exp(m − m') rescales what was summed against the old maximum (0 when m = −inf), N rows
  // at a time. (In float: α scales a row's l and O alike, so O = O/l does not see its rounding.)
  for (size_t r = rows; r < round_up_to(rows, N); ++r) alpha_arg[r] = 0.0f;
  for (size_t r = 0; r < rows; r += N)
    hn::Store(ExpOfNonPositive(d, hn::Load(d, alpha_arg + r)), d, alpha + r);

  // Pass 2: p = exp(s − m'), summed before dropout, then multiplied by the dropout factor;
  // l' = α·l + Σ p and out ← α·out. A row with a second float in its shift takes one subtraction
  // more per vector (the wide rows' loop, a template argument: the others' loop is unchanged).
  auto softmax_row = [&](size_t r, auto wide) {
    float* s = t.scores + r * t.stride;
    const float* drop = t.dropout ? t.dropout + r * t.stride : nullptr;
    const VF vshift = hn::Set(d, shift[r]), vlo = hn::Set(d, shift_lo[r]), vscale = hn::Set(d, scale),
             log2e = hn::Set(d, kLog2e);
    // p at column c0 (returned) and, times the dropout factor, what P·V multiplies (kept).
    bfloat16* s_bf16 = t.probs_bf16 ? t.probs_bf16 + r * t.stride : nullptr;
    bfloat16* s_lo = t.probs_bf16_lo ? t.probs_bf16_lo + r * t.stride : nullptr;
    auto probability = [&](size_t c0, VF& kept) {
      const VF x = hn::LoadU(d, s + c0);
      VF prob;
      if (base2) {
        VF arg = hn::MulSub(x, vscale, vshift);
        if constexpr (decltype(wide)::value) arg = hn::Sub(arg, vlo);
        prob = Exp2OfNonPositive(d, hn::Mul(arg, log2e));
      } else {
        prob = ExpOfNonPositive(d, hn::Sub(x, vshift));
      }
      kept = drop ? hn::Mul(prob, hn::LoadU(d, drop + c0)) : prob;
      return prob;
    };
    // kept at column c0, in bfloat16 for P·V or over the scores.
    auto store = [&](size_t c0, VF kept) {
      if (s_lo) {
        StoreBF16Split(d, kept, s_bf16 + c0, s_lo + c0);
      } else if (s_bf16) {
        StoreBF16(d, kept, s_bf16 + c0);
      } else {
        hn::StoreU(kept, d, s + c0);
      }
    };
    VF sum0 = hn::Zero(d), sum1 = sum0, kept0, kept1;  // two sums halve the dependency chain of Add
    size_t c0 = 0;
    for (; c0 + 2 * N <= padded; c0 += 2 * N) {
      sum0 = hn::Add(sum0, probability(c0, kept0));
      sum1 = hn::Add(sum1, probability(c0 + N, kept1));
      if (s_lo) {
        StoreBF16SplitTwo(d, kept0, kept1, s_bf16 + c0, s_lo + c0);
      } else if (s_bf16) {
        StoreBF16Two(d, kept0, kept1, s_bf16 + c0);  // one conversion for both
      } else {
        store(c0, kept0);
        store(c0 + N, kept1);
      }
    }
    if (c0 < padded) {
      sum0 = hn::Add(sum0, probability(c0, kept0));
      store(c0, kept0);
    }
    row_sum[r] = static_cast<double>(alpha[r]) * row_sum[r] +
                 static_cast<double>(hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1))));
    if (alpha[r] != 1.0f) {
      const VF valpha = hn::Set(d, alpha[r]);
      float* o = out + r * out_stride;
      for (size_t c = 0; c < out_cols; c += N) hn::StoreU(hn::Mul(hn::LoadU(d, o + c), valpha), d, o + c);
    }
  };
  for (size_t r = 0; r < rows; ++r) {
    if (shift_lo[r] != 0.0f) {
      softmax_row(r, std::true_type{});
    } else {
      softmax_row(r, std::false_type{});
    }
  }
}

void ProbabilitiesTile(const ScoreTile& t, const float* lse_hi, const float* lse_lo, float* dprob, double* row_dot,
                       double* row_mass) {
  const DF d;
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < t.rows; ++r) {
    float* s = t.scores + r * t.stride;
    float* dp = dprob ? dprob + r * t.stride : nullptr;
    const float* drop = t.dropout ? t.dropout + r * t.stride : nullptr;
    const size_t padded = (t.cols + N - 1) / N * N;
    float* slope = dp && t.cap_slope ? t.cap_slope + r * t.stride : nullptr;
    if (lse_hi[r] == std::numeric_limits<float>::infinity()) {  // fully masked row: P = 0
      std::fill(s, s + padded, 0.0f);
      if (dp) std::fill(dp, dp + padded, 0.0f);
      if (slope) std::fill(slope, slope + padded, 0.0f);
      continue;
    }
    // With cap_slope: the row soft-capped in place first, cap' = 1 − tanh² beside it (0 past
    // cols), so that the loop below reads capped scores (u, without the soft-cap).
    ScoreTile u = t;
    if (slope) {
      const VF inverse_cap = hn::Set(d, 1.0f / t.softcap);
      for (size_t c0 = 0; c0 < padded; c0 += N) {
        const VF capped = Capped(d, hn::Mul(hn::LoadU(d, s + c0), hn::Set(d, t.scale)), t.softcap);
        hn::StoreU(capped, d, s + c0);
        const VF tanh = hn::Mul(capped, inverse_cap);
        const VF derivative = hn::NegMulAdd(tanh, tanh, hn::Set(d, 1.0f));
        hn::StoreU(hn::IfThenElseZero(hn::FirstN(d, t.cols - c0), derivative), d, slope + c0);
      }
      u.softcap = 0.0f;
      u.scale = 1.0f;
    }
    const float scale = DeferredScale(u);  // base 2 when the scale is deferred
    const bool base2 = scale != 1.0f;
    if (base2) u.scale = 1.0f;
    const float* bias = t.bias ? t.bias + r * t.stride : nullptr;
    const Visible v = VisibleColumns(t, r);
    const VF hi = hn::Set(d, lse_hi[r]), lo = hn::Set(d, lse_lo[r]);
    const VF vscale = hn::Set(d, scale), log2e = hn::Set(d, kLog2e);
    VF dot = hn::Zero(d), mass = hn::Zero(d);
    for (size_t c0 = 0; c0 < padded; c0 += N) {
      const VF x = c0 >= v.first && c0 + N <= v.end ? Scores(d, u, s, bias, c0)
                                                    : EdgeScores(d, u, s, bias, c0, v.first, v.end);
      // (s − hi) is exact when s is within a factor 2 of hi (Sterbenz), which covers every
      // score that matters when |lse| is huge (base 2: s·scale − hi rounded once, by the FMA);
      // lo then carries the part a float lse would lose.
      VF prob = base2 ? Exp2OfNonPositive(d, hn::Mul(hn::Sub(hn::MulSub(x, vscale, hi), lo), log2e))
                      : ExpOfNonPositive(d, hn::Sub(hn::Sub(x, hi), lo));
      if (dp) {
        VF g = hn::LoadU(d, dp + c0);
        if (drop) {
          g = hn::Mul(g, hn::LoadU(d, drop + c0));
          hn::StoreU(g, d, dp + c0);
        }
        dot = hn::MulAdd(prob, g, dot);  // padding lanes: prob = 0 and g = 0
        mass = hn::Add(mass, prob);
      } else if (drop) {
        prob = hn::Mul(prob, hn::LoadU(d, drop + c0));
      }
      hn::StoreU(prob, d, s + c0);
    }
    if (dp) {
      row_dot[r] += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, dot)));
      row_mass[r] += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, mass)));
    }
  }
}

void ScoreGradientsTile(float* probs, float* dprob, size_t stride, size_t rows, size_t cols, const float* delta,
                        const float* dropout, const float* renormalize, const float* cap_slope,
                        const Bf16Operands* bf16) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const size_t padded = (cols + N - 1) / N * N;
  // Row r's P (renormalised, times the dropout factor) and dS at columns [c0, c0 + N).
  auto gradients = [&](size_t r, size_t c0, VF& prob, VF& ds) {
    prob = hn::LoadU(d, probs + r * stride + c0);
    if (renormalize && renormalize[r] != 1.0f) prob = hn::Mul(prob, hn::Set(d, renormalize[r]));
    ds = hn::Mul(prob, hn::Sub(hn::LoadU(d, dprob + r * stride + c0), hn::Set(d, delta[r])));
    if (cap_slope) ds = hn::Mul(ds, hn::LoadU(d, cap_slope + r * stride + c0));
    if (dropout) prob = hn::Mul(prob, hn::LoadU(d, dropout + r * stride + c0));
  };
  if (bf16) {  // bfloat16 outputs instead of the float ones, two rows at a time (the pairs)
    HWY_ASSERT(bf16->pairs_ld >= padded && bf16->rows_ld >= padded);
    for (size_t r = 0; r < rows; r += 2) {
      const bool second = r + 1 < rows;  // else the pairs' zero row
      bfloat16* p_pairs = bf16->p_pairs + r * bf16->pairs_ld;  // rows r, r + 1: pair row r / 2
      bfloat16* ds_pairs = bf16->ds_pairs + r * bf16->pairs_ld;
      bfloat16* ds_rows = bf16->ds_rows + r * bf16->rows_ld;
      for (size_t c0 = 0; c0 < padded; c0 += N) {
        VF p0, ds0, p1 = hn::Zero(d), ds1 = hn::Zero(d);
        gradients(r, c0, p0, ds0);
        if (second) gradients(r + 1, c0, p1, ds1);
        StoreBF16Pairs(d, p0, p1, p_pairs + 2 * c0);
        StoreBF16Pairs(d, ds0, ds1, ds_pairs + 2 * c0);
        StoreBF16(d, ds0, ds_rows + c0);
        if (second) StoreBF16(d, ds1, ds_rows + bf16->rows_ld + c0);
        if (bf16->p_pairs_lo) {  // what those roundings left (StoreBF16Split), in the same places
          const size_t pairs_at = r * bf16->pairs_ld + 2 * c0, rows_at = r * bf16->rows_ld + c0;
          const VF ds_rest0 = BF16Rest(d, ds0), ds_rest1 = BF16Rest(d, ds1);
          StoreBF16Pairs(d, BF16Rest(d, p0), BF16Rest(d, p1), bf16->p_pairs_lo + pairs_at);
          StoreBF16Pairs(d, ds_rest0, ds_rest1, bf16->ds_pairs_lo + pairs_at);
          StoreBF16(d, ds_rest0, bf16->ds_rows_lo + rows_at);
          if (second) StoreBF16(d, ds_rest1, bf16->ds_rows_lo + rows_at + bf16->rows_ld);
        }
      }
    }
    return;
  }
  for (size_t r = 0; r < rows; ++r) {
    const bool rewrite = dropout || (renormalize && renormalize[r] != 1.0f);
    for (size_t c0 = 0; c0 < padded; c0 += N) {
      VF prob, ds;
      gradients(r, c0, prob, ds);
      hn::StoreU(ds, d, dprob + r * stride + c0);
      if (rewrite) hn::StoreU(prob, d, probs + r * stride + c0);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Dropout: Philox4x32-10 (mha/core/random.h), N counters at a time. Counter (j, i, bh, bh >> 32)
// and key = seed give the same bits as dropout_keep, element for element; its scalar twin is
// dropout_keep itself (and the HWY_SCALAR target calls it).

#if HWY_TARGET != HWY_SCALAR
// (hi, lo) 32-bit halves of the 64-bit products a·m, lane by lane. MulEven multiplies the even
// lanes; the odd lanes are shifted down to take their place.
template <class DU>
HWY_INLINE void MulHiLo(DU du, hn::Vec<DU> a, uint32_t m, hn::Vec<DU>& hi, hn::Vec<DU>& lo) {
  const hn::Repartition<uint64_t, DU> du64;
  const hn::Vec<DU> vm = hn::Set(du, m);
  const auto even = hn::MulEven(a, vm);                                              // a0·m, a2·m, ...
  const auto odd = hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(du64, a))), vm);  // a1·m, ...
  hi = hn::OddEven(hn::BitCast(du, odd), hn::BitCast(du, hn::ShiftRight<32>(even)));
  lo = hn::Mul(a, vm);
}
#endif

void DropoutTile(uint64_t seed, uint64_t batch_head, uint32_t i0, size_t rows, uint32_t j0, size_t cols, double p,
                 float kept, float* factor, size_t stride) {
#if HWY_TARGET == HWY_SCALAR
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c)
      factor[r * stride + c] =
          dropout_keep(seed, batch_head, i0 + static_cast<uint32_t>(r), j0 + static_cast<uint32_t>(c), p) ? kept : 0.0f;
#else
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const size_t N = hn::Lanes(d);
  // Kept when uniform = (bits >> 8)·2⁻²⁴ >= p, i.e. when the integer bits >> 8 > ceil(p·2²⁴) − 1
  // (exact: p·2²⁴ is p with a shifted exponent). Both sides fit in an int32.
  const auto threshold = hn::Set(di, static_cast<int32_t>(std::ceil(p * 16777216.0)) - 1);
  const uint32_t bh_lo = static_cast<uint32_t>(batch_head), bh_hi = static_cast<uint32_t>(batch_head >> 32);
  using VU = hn::Vec<decltype(du)>;
  // Four counter vectors in flight: ten dependent rounds of multiplies make a long latency chain
  // (measured: 2 streams 1.3x, 4 streams 1.45x the speed of one).
  constexpr size_t kStreams = 4;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c0 = 0; c0 < cols; c0 += kStreams * N) {
      VU c[kStreams][4];
      for (size_t k = 0; k < kStreams; ++k) {
        c[k][0] = hn::Add(hn::Iota(du, j0), hn::Set(du, static_cast<uint32_t>(c0 + k * N)));
        c[k][1] = hn::Set(du, i0 + static_cast<uint32_t>(r));
        c[k][2] = hn::Set(du, bh_lo);
        c[k][3] = hn::Set(du, bh_hi);
      }
      uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
      for (int round = 0; round < 10; ++round) {
        const VU key0 = hn::Set(du, k0), key1 = hn::Set(du, k1);
        for (size_t k = 0; k < kStreams; ++k) {
          VU hi0, lo0, hi1, lo1;
          MulHiLo(du, c[k][0], 0xD2511F53u, hi0, lo0);
          MulHiLo(du, c[k][2], 0xCD9E8D57u, hi1, lo1);
          c[k][0] = hn::Xor(hn::Xor(hi1, c[k][1]), key0);
          c[k][1] = lo1;
          c[k][2] = hn::Xor(hn::Xor(hi0, c[k][3]), key1);
          c[k][3] = lo0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      for (size_t k = 0; k < kStreams && c0 + k * N < cols; ++k) {
        const auto keep = hn::Gt(hn::BitCast(di, hn::ShiftRight<8>(c[k][0])), threshold);
        const VF out = hn::IfThenElseZero(hn::RebindMask(d, keep), hn::Set(d, kept));
        const size_t start = c0 + k * N, n = std::min(N, cols - start);
        if (n == N) {
          hn::StoreU(out, d, factor + r * stride + start);
        } else {
          HWY_ALIGN float lanes[hn::MaxLanes(d)];
          hn::Store(out, d, lanes);
          std::copy_n(lanes, n, factor + r * stride + start);
        }
      }
    }
  }
#endif
}

}  // namespace mha::attention::detail::tiles::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
