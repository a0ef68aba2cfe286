#include "mha/distributed/layout.h"

#include <algorithm>
#include <cstring>

namespace mha::distributed {
namespace {

Range chunk(int64_t length, int64_t c, int64_t n) {
  // c·L fits 64 bits: L <= 2^40 and c < 2^21 (shard_ranges checks both).
  const int64_t start = c * length / n, end = (c + 1) * length / n;
  return {start, end - start};
}

// Copies rows [from, from + count) along `axis` between two tensors of the same shape elsewhere:
// `outer` blocks of `rows`·`inner` elements.
template <class T>
void copy_rows(const T* src, int64_t src_rows, int64_t src_row0, T* dst, int64_t dst_rows, int64_t dst_row0,
               int64_t count, int64_t outer, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + (o * dst_rows + dst_row0) * inner, src + (o * src_rows + src_row0) * inner,
                sizeof(T) * static_cast<size_t>(count * inner));
}

struct Split {
  int64_t outer = 1, rows = 0, inner = 1;
};

Split split_at(const Shape& shape, int64_t axis, const char* name) {
  check(axis >= 0 && axis < static_cast<int64_t>(shape.size()), name, ": axis: expected 0 to ",
        static_cast<int64_t>(shape.size()) - 1, ", got ", axis);
  Split s;
  for (int64_t a = 0; a < axis; ++a) s.outer *= shape[static_cast<size_t>(a)];
  s.rows = shape[static_cast<size_t>(axis)];
  for (size_t a = static_cast<size_t>(axis) + 1; a < shape.size(); ++a) s.inner *= shape[a];
  return s;
}

}  // namespace

std::vector<Range> shard_ranges(int64_t length, Layout layout, int rank, int ranks) {
  check(ranks >= 1 && ranks <= (1 << 20), "shard_ranges: ranks: expected 1 to 2^20, got ", ranks);
  check(rank >= 0 && rank < ranks, "shard_ranges: rank: expected 0 to ", ranks - 1, ", got ", rank);
  check(length >= 0 && length <= (int64_t{1} << 40), "shard_ranges: length: expected 0 to 2^40, got ", length);
  if (layout == Layout::contiguous) return {chunk(length, rank, ranks)};
  check(layout == Layout::zigzag, "shard_ranges: layout: expected contiguous or zigzag");
  const Range head = chunk(length, rank, 2 * int64_t{ranks}), tail = chunk(length, 2 * int64_t{ranks} - 1 - rank, 2 * int64_t{ranks});
  // Rank P − 1's two chunks (and P = 1's) meet: one range, so a single rank's call is one block.
  if (head.start + head.length == tail.start) return {{head.start, head.length + tail.length}};
  return {head, tail};
}

int64_t shard_length(int64_t length, Layout layout, int rank, int ranks) {
  int64_t n = 0;
  for (const Range& r : shard_ranges(length, layout, rank, ranks)) n += r.length;
  return n;
}

template <class T>
Tensor<T> shard(View<const T> whole, int64_t axis, Layout layout, int rank, int ranks) {
  check(whole.contiguous(), "shard: whole: expected a contiguous tensor, got strides ", whole.strides(),
        " for shape ", whole.shape());
  const Split s = split_at(whole.shape(), axis, "shard");
  const std::vector<Range> ranges = shard_ranges(s.rows, layout, rank, ranks);
  Shape shape = whole.shape();
  shape[static_cast<size_t>(axis)] = shard_length(s.rows, layout, rank, ranks);
  Tensor<T> out(shape);
  int64_t at = 0;
  for (const Range& r : ranges) {
    if (whole.numel() > 0)
      copy_rows(whole.data(), s.rows, r.start, out.data(), shape[static_cast<size_t>(axis)], at, r.length, s.outer, s.inner);
    at += r.length;
  }
  return out;
}

template <class T>
Tensor<T> unshard(const std::vector<Tensor<T>>& shards, int64_t axis, Layout layout) {
  check(!shards.empty(), "unshard: shards: expected one per rank, got none");
  const int ranks = static_cast<int>(shards.size());
  Shape shape = shards[0].shape();
  split_at(shape, axis, "unshard");
  int64_t length = 0;
  for (const auto& t : shards) {
    Shape other = t.shape();
    check(other.size() == shape.size(), "unshard: shards: expected the shape of shard 0, ", shape, ", but along axis ",
          axis, ", got ", other);
    other[static_cast<size_t>(axis)] = shape[static_cast<size_t>(axis)];
    check(other == shape, "unshard: shards: expected the shape of shard 0, ", shape, ", but along axis ", axis,
          ", got ", t.shape());
    length += t.size(axis);
  }
  shape[static_cast<size_t>(axis)] = length;
  Tensor<T> whole(shape);
  const Split s = split_at(shape, axis, "unshard");
  for (int r = 0; r < ranks; ++r) {
    const Tensor<T>& part = shards[static_cast<size_t>(r)];
    check(part.size(axis) == shard_length(length, layout, r, ranks), "unshard: shards[", r, "]: expected ",
          shard_length(length, layout, r, ranks), " rows along axis ", axis, " of the ", length, " in all, got ",
          part.size(axis));
    int64_t at = 0;
    for (const Range& range : shard_ranges(length, layout, r, ranks)) {
      if (whole.numel() > 0)
        copy_rows(part.data(), part.size(axis), at, whole.data(), length, range.start, range.length, s.outer, s.inner);
      at += range.length;
    }
  }
  return whole;
}

#define MHA_INSTANTIATE(T)                                                       \
  template Tensor<T> shard(View<const T>, int64_t, Layout, int, int);           \
  template Tensor<T> unshard(const std::vector<Tensor<T>>&, int64_t, Layout);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bool)
#undef MHA_INSTANTIATE

}  // namespace mha::distributed
