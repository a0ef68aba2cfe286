#pragma once
// The tile layer every fused backend shares (cpu_flash forward and backward, decode): aligned
// scratch buffers, and make_tile, the one function that turns a tile of scale·q·k into a ScoreTile
// carrying everything the problem adds to it (the masks, the visible key range as the tile's
// edges, the dropout factors), with the reference's exact semantics (ScoreAdditions in problem.h,
// dropout_keep). The SIMD kernels that consume a ScoreTile are in kernels.h.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "../problem.h"
#include "kernels.h"

namespace mha::attention::detail::tiles {

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

// Key walks start on a multiple of `align`: kKeyAlign (a multiple of every target's panel width),
// so that a walk that skips keys nobody in the block sees still starts on a panel of the packed
// keys (decode), or panel_step(), where the products take B from inside a panel (cpu_flash,
// PanelsB::first_column), so that a walk wastes at most one vector of keys before its first.
constexpr int64_t kKeyAlign = 64;
inline int64_t key_walk_start(const KeyRange& keys, int64_t align = kKeyAlign) { return keys.begin / align * align; }

// Where make_tile writes a tile's additions: bias and dropout rows share the scores' stride (null
// when the problem has no additions, no dropout); first and end hold one entry per row; cap_slope
// (the backward's, with a soft-cap) is where probabilities_tile writes the soft-cap's derivative.
struct TileScratch {
  float* bias = nullptr;
  float* dropout = nullptr;
  float* cap_slope = nullptr;  // the backward's, with a soft-cap
  int64_t* first = nullptr;
  int64_t* end = nullptr;
};

// The tile of keys [j0, j0 + cols) for `rows` query rows of batch b, row r being query i of head h
// with (h, i) = row_of(r), whose `scores` (row stride `stride`) hold scale·q·k: a ScoreTile with
//   bias     ScoreAdditions' masks part at (b, h, i, j), when there are masks;
//   edges    each row's visible key range (Problem::visible_keys) as columns [first, end), when
//            some row does not see the whole tile;
//   dropout  each probability's factor, 0 or 1/(1 − p), at the whole call's positions;
//   softcap  Scoring::softcap, which the kernels apply to q·k (and cap_slope for its derivative).
// cpu_flash's rows are consecutive queries of one head; decode's run through a GQA group's heads.
// `visible`, when given, holds each row's Problem::visible_keys, worked out once for a block of rows
// that walks several tiles (cpu_flash), rather than once a tile.
// The masks may be float, bfloat16 or float16 (M: the call's type), added in float.
template <class M, class RowOf>
ScoreTile make_tile(const Problem& p, const ScoreAdditions<M>& additions, const TileScratch& scratch,
                    float* scores, size_t stride, int64_t b, size_t rows, int64_t j0, size_t cols, RowOf row_of,
                    const KeyRange* visible_rows = nullptr) {
  ScoreTile t{scores, stride, rows, cols};
  const int64_t j1 = j0 + static_cast<int64_t>(cols);
  const float kept = static_cast<float>(p.dropout_scale());
  bool edges = false;
  for (size_t r = 0; r < rows; ++r) {
    const auto [h, i] = row_of(r);
    if (scratch.bias) {
      const auto masks = additions.row(p, b, h, i);
      float* bias = scratch.bias + r * stride;
      for (size_t c = 0; c < cols; ++c) bias[c] = masks(j0 + static_cast<int64_t>(c));
    }
    const KeyRange visible = visible_rows ? visible_rows[r] : p.visible_keys(b, i);
    scratch.first[r] = visible.begin - j0;
    scratch.end[r] = visible.end - j0;
    edges = edges || visible.begin > j0 || visible.end < j1;
    if (scratch.dropout)
      dropout_tile(p.settings.dropout_seed, p.dropout_stream(b * p.query_heads + h), p.dropout_row(i), 1,
                   p.dropout_column(j0), cols, p.settings.dropout_p, kept, scratch.dropout + r * stride, stride);
  }
  t.bias = scratch.bias;
  t.dropout = scratch.dropout;
  t.softcap = static_cast<float>(p.settings.softcap);
  t.cap_slope = scratch.cap_slope;
  if (edges) {
    t.first_visible = scratch.first;
    t.end_visible = scratch.end;
  }
  return t;
}

}  // namespace mha::attention::detail::tiles
