#pragma once
// cpu_flash's block sizes, which products run on bf16 pairs, and the logsumexp helpers its forward
// and backward share.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../tiles/tiles.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/half.h"

namespace mha::attention::detail::cpu_flash {

using namespace tiles;

// Block sizes. Key blocks are multiples of 64, so of every target's panel width; query
// blocks are multiples of the micro-kernel's 6 rows (no ragged row strip but the last).
//   forward:  a task is kForwardQueries query rows, which walk the keys kForwardKeys at a time;
//             the score tile (96 × 256 floats, 96 KiB) and the output accumulator live in L2.
//   backward: blocks of kBackwardQueries rows (or twice as many: backward_rows), walking the keys
//             kBackwardKeys at a time.
// Measured on the 2-core AVX-512 machine (B=4, H=8, L=S=2048, d=64, 2 threads): over Br in
// {64, 72, 96, 120} × Bc in {192, 256, 384, 512} the forward moved by less than the machine's
// run-to-run noise (~5%) except 64-row blocks (a ragged 4-row strip: ~3% slower); the backward
// likewise over Br in {48, 64, 96, 128, 192} × Bc in {128, 256} (d = 128 leans to Br = 192,
// which doubles the per-thread row blocks).
constexpr size_t kForwardQueries = 96;
constexpr size_t kForwardKeys = 256;
constexpr size_t kBackwardQueries = 96;
constexpr size_t kBackwardKeys = 256;
// Under a narrow window forward and backward multiply each group of kBandRows rows over the columns
// that group sees (for_each_band): two of the micro-kernel's 6-row strips. (A wide window's groups
// see nearly the whole tile: there the split would only cost the products' reuse of each panel.)
constexpr size_t kBandRows = 12;
// The forward packs the keys a task's walk reads and up to this many more (forward.cpp): 1024
// keys of Kᵀ and V at d = 64 are 512 KiB, which stay in L2 while the next tasks read them.
constexpr int64_t kPackAhead = 1024;
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
static_assert(kForwardQueries <= 256 && 2 * kBackwardQueries <= 256,
              "ScoreTile holds at most 256 rows (backward_rows)");

// Whether a call's products run on bf16 pairs (bf16_gemm's AMX or VDPBF16PS kernels) rather than
// on float panels, the operands widened as packed:
// - forward: bfloat16 queries, keys and values on a CPU with the bf16 instructions;
// - backward: the same, and query and value heads of one size. Where the sizes differ PyTorch's
//   SDPA has no fused kernel and computes bfloat16 in float32 (its math backend upcasts), so its
//   gradients carry their final rounding alone; with P and dS rounded to bfloat16 for the
//   products, mha's had 1.1–1.9× that error in the median and up to 2.4× (docs/bfloat16.md).
//   There the float products run instead: the float call's gradients rounded once. (The forward
//   keeps the pairs: its output's error is its own rounding either way.) This is the C++ half of
//   the "in float" policy; the Python doors' half is as_float_call (python/mha/_policy.py, whose
//   table docs/python.md, "Policies", cites beside this).
template <class T, class Kv>
bool forward_on_pairs() {
  return std::is_same_v<T, bfloat16> && std::is_same_v<Kv, bfloat16> && bf16_gemm::native();
}
// - forward, float16 queries, keys and values where the products run on AMX tiles: the split
//   products (bf16_gemm::split_depth: every float16 exactly two bfloat16s, four exact bf16
//   products per float16 product, summed in float as the float products are), Q·Kᵀ at four times
//   the depth and P·V on P split the same way (within 2⁻¹⁶ of the float P). The tiles multiply
//   bf16 at several times the float FMA's rate; VDPBF16PS alone (AMD Zen 4) would do four
//   products in the time of fewer than two FMAs there, so float16 keeps the float panels.
// - backward, float16 where the forward takes the split products: S and dP at four times the
//   depth, and dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS, dQ += dS·K as three products each on P and dS split as
//   the forward's P (hi·hi + lo·hi + hi·lo; lo·lo, at most 2⁻¹⁶ of the term, left out), for any
//   head sizes (docs/bfloat16.md).
template <class T, class Kv>
bool forward_on_split() {
  return std::is_same_v<T, float16> && std::is_same_v<Kv, float16> &&
         bf16_gemm::path() == bf16_gemm::Path::amx;
}
template <class T>
bool backward_on_split() {
  return forward_on_split<T, T>();
}
// The packed width of a split Kᵀ or Vᵀ of `keys` columns: its pair rows 4·width bytes apart, not
// 4·keys, which for keys a multiple of 1024 would put the 16 rows of a tile load in one L1 set
// (measured, alternating builds, forward at (4, 8, 2048), d = 128: 157 → 146 ms non-causal, 96 → 89
// causal; d = 64: 3–5%). bfloat16's Kᵀ, four times shallower, did not move with the same spacing
// (forward or backward), so keeps its own.
inline size_t split_width(size_t keys) { return (keys + 15) / 16 * 16 + 16; }
template <class T>
bool backward_on_pairs(const Problem& p) {
  return forward_on_pairs<T, T>() && p.qk_head_dim == p.v_head_dim;
}

// Rows per query block: `rows`, or half as many under a sliding window narrower than 512 keys on
// its left. A block's key walk is about rows + W keys wide where each row sees W (plus up to 63
// for the walk's alignment), so smaller blocks compute fewer hidden scores; the micro-kernel's
// 6-row strips still fill. Measured (W = 256, B = 1, H = 8, L = 16 384, d = 64, 2 threads, three
// alternating runs on a noisy machine): forward 90, 78, 73 GFLOP/s of visible pairs with 48 rows
// against 88, 81, 70 with 96; backward 95, 81, 85 against 88, 86, 76; 24 rows were slower. A
// window as wide as the keys or wider is no narrower than a row's walk, so its blocks (and the
// backward's chunks of them) are those of no window.
inline bool narrow_window(const Problem& p) {
  return p.settings.window_left >= 0 && p.settings.window_left < std::min<int64_t>(512, p.key_len);
}
inline int64_t block_rows(const Problem& p, size_t rows) {
  return static_cast<int64_t>(narrow_window(p) ? rows / 2 : rows);
}

// A group of a block's rows and the tile's columns [first_col, end_col) it multiplies. Under a
// narrow window each group of kBandRows rows multiplies only the columns its rows see (of the tile
// of keys [j0, j0 + cols)), widened down to a multiple of `align` (panel_step(): a band may begin
// inside a packed panel, packed_columns); the products' zeros beside the band are filled instead
// (fill_beside_band). Elsewhere one group spans the block and the tile.
struct Band {
  size_t first_row, rows, first_col, end_col;
};
template <class Step>
void for_each_band(bool banded, const KeyRange* visible, size_t rows, int64_t j0, size_t cols, size_t align,
                   Step&& step) {
  const size_t group = banded ? kBandRows : rows;
  for (size_t g0 = 0; g0 < rows; g0 += group) {
    Band band{g0, std::min(group, rows - g0), 0, cols};
    if (banded) {
      int64_t begin = std::numeric_limits<int64_t>::max(), end = 0;
      for (size_t r = g0; r < g0 + band.rows; ++r)
        if (!visible[r].empty()) begin = std::min(begin, visible[r].begin), end = std::max(end, visible[r].end);
      const int64_t tile_cols = static_cast<int64_t>(cols), w = static_cast<int64_t>(align);
      const int64_t first = std::clamp<int64_t>(begin - j0, 0, tile_cols) / w * w;
      band.first_col = static_cast<size_t>(first);
      band.end_col = static_cast<size_t>(std::max(first, std::clamp<int64_t>(end - j0, 0, tile_cols)));
    }
    step(band);
  }
}
// Where a band's or a walk's keys may start: a vector of keys (panel_step()), and at least a pair
// (bf16 pairs interleave keys two by two: scalar targets have one-key vectors).
inline size_t key_step() { return std::max<size_t>(panel_step(), 2); }
// Where cpu_flash's key walks start: the first visible key, rounded down to key_step().
inline int64_t walk_start(const KeyRange& keys) { return key_walk_start(keys, static_cast<int64_t>(key_step())); }

// The columns from c on of a matrix with k rows packed by pack_transposed (panels of W columns).
inline PanelsB packed_columns(const float* packed, size_t k, size_t c, size_t W) {
  return {packed + c / W * W * k, W, k * W, c % W};
}

// Zeros in the band's rows of `tile` (row stride `stride`, `cols` columns) beside its columns.
inline void fill_beside_band(const Band& band, float* tile, size_t stride, size_t cols) {
  for (size_t r = band.first_row; r < band.first_row + band.rows; ++r) {
    std::fill(tile + r * stride, tile + r * stride + band.first_col, 0.0f);
    std::fill(tile + r * stride + band.end_col, tile + r * stride + cols, 0.0f);
  }
}

// The blocks of query rows the tasks take: rows_per_block at a time from row 0, and with packed
// sequences (Options::cu_seqlens) from each sequence's first row, so that no block, and no tile,
// holds two sequences' rows (a block's key walk is then its own sequence's keys alone).
class QueryBlocks {
 public:
  struct Block {
    int64_t first;
    size_t rows;
  };

  QueryBlocks(const Problem& p, int64_t rows_per_block)
      : rows_(p.query_len), per_block_(rows_per_block), packed_(p.packed.present()) {
    for (int64_t s = 0; packed_ && s < p.packed.count; ++s)
      for (int64_t i = p.packed.q(s); i < p.packed.q(s + 1); i += rows_per_block)
        blocks_.push_back({i, static_cast<size_t>(std::min(rows_per_block, p.packed.q(s + 1) - i))});
  }
  int64_t count() const {
    return packed_ ? static_cast<int64_t>(blocks_.size()) : (rows_ + per_block_ - 1) / per_block_;
  }
  Block operator[](int64_t n) const {
    if (packed_) return blocks_[static_cast<size_t>(n)];
    return {n * per_block_, static_cast<size_t>(std::min(per_block_, rows_ - n * per_block_))};
  }

 private:
  int64_t rows_, per_block_;
  bool packed_;
  std::vector<Block> blocks_;  // packed: every block
};

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

}  // namespace mha::attention::detail::cpu_flash
