#pragma once
// How a sequence is split across P ranks, and the way back.
//
//   contiguous  rank r holds chunk r of P equal chunks (sizes differ by at most one row)
//   zigzag      the sequence cut into 2P chunks; rank r holds chunk r and chunk 2P − 1 − r, in
//               that order (head-tail: with a causal mask every rank has the same work); rank
//               P − 1's two chunks meet and are one range
//
// Chunk c of n chunks of a length-L sequence is rows [c·L/n, (c + 1)·L/n) (integer division), so
// any L works, L < n included (some chunks are then empty).
#include <cstdint>
#include <vector>

#include "mha/core/tensor.h"
#include "mha/core/view.h"

namespace mha::distributed {

enum class Layout { contiguous, zigzag };

// Rows [start, start + length) of the whole sequence.
struct Range {
  int64_t start = 0, length = 0;
};

// The rows rank `rank` of `ranks` holds, in the order it stores them.
std::vector<Range> shard_ranges(int64_t length, Layout layout, int rank, int ranks);
// How many rows that is.
int64_t shard_length(int64_t length, Layout layout, int rank, int ranks);

// Rank `rank`'s rows of `whole` along `axis` (a copy, rows in the layout's order).
template <class T>
Tensor<T> shard(View<const T> whole, int64_t axis, Layout layout, int rank, int ranks);

// The whole tensor from every rank's shard (shards[r] is rank r's), along `axis`: shard's inverse.
template <class T>
Tensor<T> unshard(const std::vector<Tensor<T>>& shards, int64_t axis, Layout layout);

}  // namespace mha::distributed
