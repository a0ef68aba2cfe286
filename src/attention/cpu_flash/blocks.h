#pragma once
// cpu_flash's block sizes and the logsumexp helpers its forward and backward share.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../tiles/tiles.h"

namespace mha::attention::detail::cpu_flash {

using namespace tiles;

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
// Under a narrow window the forward multiplies each group of kBandRows rows over the columns that
// group sees (forward.cpp): two of the micro-kernel's 6-row strips. (A wide window's groups see
// nearly the whole tile: there the split would only cost the products' reuse of each panel.)
constexpr size_t kBandRows = 12;
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

// Rows per query block: `rows`, or half as many under a sliding window narrower than 512 keys on
// its left. A block's key walk is about rows + W keys wide where each row sees W (plus up to 63
// for the walk's alignment), so smaller blocks compute fewer hidden scores; the micro-kernel's
// 6-row strips still fill. Measured (W = 256, B = 1, H = 8, L = 16 384, d = 64, 2 threads, three
// alternating runs on a noisy machine): forward 90, 78, 73 GFLOP/s of visible pairs with 48 rows
// against 88, 81, 70 with 96; backward 95, 81, 85 against 88, 86, 76; 24 rows were slower.
inline bool narrow_window(const Problem& p) { return p.settings.window_left >= 0 && p.settings.window_left < 512; }
inline int64_t block_rows(const Problem& p, size_t rows) {
  return static_cast<int64_t>(narrow_window(p) ? rows / 2 : rows);
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
