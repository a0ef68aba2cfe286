#pragma once
// What forward.cpp and backward.cpp share: block sizes, aligned scratch buffers, and the scalar
// preparation of one score tile (mask additions, causal limits, dropout factors), all with the
// reference's exact semantics (Masks::fill_row, dropout_keep).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "../problem.h"
#include "kernels.h"

namespace mha::attention::detail::cpu_flash {

// Block sizes. Key blocks are multiples of 64, so of every target's panel width; query
// blocks are multiples of the micro-kernel's 6 rows (no ragged row strip but the last).
//   forward:  a task is kForwardQueries query rows, which walk the keys kForwardKeys at a time;
//             the score tile (96 × 256 floats, 96 KiB) and the output accumulator live in L2.
//   backward: blocks of kBackwardQueries rows, walking the keys kBackwardKeys at a time.
// Measured on the 2-core AVX-512 machine (B=4, H=8, L=S=2048, d=64, 2 threads): over Br in
// {64, 72, 96, 120} × Bc in {192, 256, 384, 512} the forward moved by less than the machine's
// run-to-run noise (~5%) except 64-row blocks (a ragged 4-row strip: ~3% slower); the backward
// likewise over Br in {48, 64, 96, 128, 192} × Bc in {128, 256} (d = 128 leans to Br = 192,
// which doubles the per-thread row blocks).
constexpr size_t kForwardQueries = 96;
constexpr size_t kForwardKeys = 256;
constexpr size_t kBackwardQueries = 96;
constexpr size_t kBackwardKeys = 256;
static_assert(kForwardKeys % 64 == 0 && kBackwardKeys % 64 == 0, "key blocks start on panel boundaries");

// Long key sequences (more than kLongKeys keys) change how the kernels hold a kv head, so that the
// extra memory stays a few tens of MiB whatever S (the bound: under 64 MiB at
// L = S = 65536, d = 64), at a small cost in speed:
//   forward:  one packed copy of the kv head shared by all threads (instead of one per thread);
//   backward: the keys in segments of kBackwardKeySegment, D from a first sweep (see backward.cpp).
// The choice depends on the shape only, so results stay bitwise the same for any thread count.
constexpr int64_t kLongKeys = 16384;
constexpr size_t kBackwardKeySegment = 4096;
static_assert(kBackwardKeySegment % kBackwardKeys == 0, "segments hold whole key blocks");
static_assert(kForwardQueries <= 256 && kBackwardQueries <= 256, "ScoreTile holds at most 256 rows");

inline size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }
inline size_t to_size(int64_t x) { return static_cast<size_t>(x); }

// A 64-byte aligned array of floats (or doubles, int64), zero-filled unless the caller writes
// every element itself (Uninitialized: packed copies, filled by the packers).
template <class T>
class Buffer {
 public:
  enum Fill { Zeroed, Uninitialized };
  Buffer() = default;
  explicit Buffer(size_t count, Fill fill = Zeroed) : count_(count) {
    const size_t bytes = round_up(std::max<size_t>(count, 1) * sizeof(T), 64);
    data_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!data_) throw std::bad_alloc();
    if (fill == Zeroed) std::memset(static_cast<void*>(data_.get()), 0, bytes);
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }
  size_t size() const { return count_; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t count_ = 0;
};

// Query i sees keys [0, causal_limit(i)) (Problem); the limit grows with i, so a block of
// queries [i0, i1) × keys [j0, j1) needs no causal additions when causal_limit(i0) >= j1, and
// no row of it sees a key at or beyond causal_limit(i1 − 1).
inline bool causal_block_open(const Problem& p, int64_t i0, int64_t j1) {
  return p.causal == Causal::none || p.causal_limit(i0) >= j1;
}
// Per-row visible column counts of the tile (queries i0.., keys j0..j0 + cols).
inline void fill_visible(const Problem& p, int64_t i0, size_t rows, int64_t j0, int64_t* visible) {
  for (size_t r = 0; r < rows; ++r) visible[r] = p.causal_limit(i0 + static_cast<int64_t>(r)) - j0;
}

// bias[r][c] = additive_mask(b, h, i0 + r, j0 + c), plus −inf where attend_mask is false:
// Masks::fill_row without the causal part (which the kernels add from `visible`).
inline void fill_mask_tile(const Masks<float>& masks, int64_t b, int64_t h, int64_t i0, size_t rows, int64_t j0,
                           size_t cols, float* bias, size_t stride) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + static_cast<int64_t>(r);
    const float* add = masks.additive.present() ? masks.additive.row(b, h, i) : nullptr;
    const bool* keep = masks.attend.present() ? masks.attend.row(b, h, i) : nullptr;
    float* out = bias + r * stride;
    for (size_t c = 0; c < cols; ++c) {
      const int64_t j = j0 + static_cast<int64_t>(c);
      float v = add ? add[j * masks.additive.stride_j] : 0.0f;
      if (keep && !keep[j * masks.attend.stride_j]) v += neg_inf;
      out[c] = v;
    }
  }
}

// factor[r][c] = dropout factor of probability (b·Hq + h, i0 + r, j0 + c): 0 or 1/(1 − p), at
// the whole call's positions (Problem::dropout_stream).
inline void fill_dropout_tile(const Problem& p, int64_t batch_head, int64_t i0, size_t rows, int64_t j0, size_t cols,
                              float* factor, size_t stride) {
  dropout_tile(p.dropout_seed, p.dropout_stream(batch_head), p.dropout_row(i0), rows, p.dropout_column(j0), cols, p.dropout_p, static_cast<float>(p.dropout_scale()), factor, stride);
}

// logsumexp (double) as hi + lo, two floats: hi = float(lse), lo = float(lse − hi), so that the
// kernels compute s − lse as (s − hi) − lo in float without losing lse's fraction when |lse| is
// huge. A fully masked row (lse = −inf) gets hi = +inf, lo = 0: the kernels' mark for P = 0.
inline void split_logsumexp(double lse, float& hi, float& lo) {
  const bool masked_row = lse == -std::numeric_limits<double>::infinity();
  hi = masked_row ? std::numeric_limits<float>::infinity() : static_cast<float>(lse);
  lo = masked_row ? 0.0f : static_cast<float>(lse - static_cast<double>(hi));
}

// Whether P = exp(s − logsumexp) can be trusted as it is. logsumexp = m + log l is a double,
// rounded by up to |lse|·2⁻⁵³; past |lse| = 2²⁹ that rounding is coarser than float's 2⁻²⁴ in P,
// and past about 1e17 log l is lost altogether (a fill of −FLT_MAX, torch.finfo(float32).min,
// over a whole row: every P comes out 1 instead of 1/l). Such rows are divided by their own sum
// of P (backward.cpp), which is exp(lse_true − lse) and undoes the error whatever it is.
inline bool logsumexp_needs_renormalizing(double lse) { return std::abs(lse) >= 0x1p29 && std::isfinite(lse); }

inline bool has_masks(const Masks<float>& masks) { return masks.additive.present() || masks.attend.present(); }

}  // namespace mha::attention::detail::cpu_flash
