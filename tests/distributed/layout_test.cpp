// Sharding layouts, in one process: value-coded tensors (each element holds its own whole-tensor
// coordinates) through shard and unshard for every rank count and awkward lengths; the zigzag
// layout's balance; ulysses' head shares; and bad arguments refused by name.
#include <gtest/gtest.h>

#include <set>

#include "../support/assertions.h"
#include "mha/distributed/context_parallel.h"
#include "mha/distributed/layout.h"

namespace mha::distributed {
namespace {

using mha::testing::expect_error;

// (2, 3, L, 2) with element (b, h, i, d) = ((b·3 + h)·L + i)·2 + d: exact in float and double.
template <class T>
Tensor<T> coded(int64_t L) {
  Tensor<T> t({2, 3, L, 2});
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(i);
  return t;
}

TEST(Layout, ShardsHoldTheirRowsAndUnshardRestoresTheWhole) {
  for (Layout layout : {Layout::contiguous, Layout::zigzag})
    for (int P = 1; P <= 5; ++P)
      for (int64_t L : {0, 1, 3, 7, 10, 37, 64}) {
        SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)) + " P " + std::to_string(P) + " L " +
                     std::to_string(L));
        const Tensor<double> whole = coded<double>(L);
        std::vector<Tensor<double>> shards;
        std::set<int64_t> seen;
        for (int r = 0; r < P; ++r) {
          shards.push_back(shard(View<const double>(whole), 2, layout, r, P));
          const Tensor<double>& s = shards.back();
          // Row i of the shard is whole row g(i), the ranges read in order.
          std::vector<int64_t> rows;
          for (const Range& range : shard_ranges(L, layout, r, P))
            for (int64_t i = range.start; i < range.start + range.length; ++i) rows.push_back(i);
          ASSERT_EQ(s.size(2), static_cast<int64_t>(rows.size()));
          for (int64_t b = 0; b < 2; ++b)
            for (int64_t h = 0; h < 3; ++h)
              for (size_t i = 0; i < rows.size(); ++i)
                for (int64_t d = 0; d < 2; ++d)
                  ASSERT_EQ(s[((b * 3 + h) * s.size(2) + static_cast<int64_t>(i)) * 2 + d],
                            static_cast<double>(((b * 3 + h) * L + rows[i]) * 2 + d));
          for (int64_t g : rows) EXPECT_TRUE(seen.insert(g).second) << "row " << g << " held twice";
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), L) << "every row held once";
        const Tensor<double> back = unshard(shards, 2, layout);
        ASSERT_EQ(back.shape(), whole.shape());
        for (int64_t i = 0; i < whole.numel(); ++i) ASSERT_EQ(back[i], whole[i]);
      }
}

TEST(Layout, ZigzagGivesEveryRankTheSameCausalWork) {
  // With L divisible by 2P, the causal pairs (i, j <= i) each rank's rows see are equal.
  for (int P = 1; P <= 8; ++P) {
    const int64_t L = 2 * P * 16;
    int64_t first = -1;
    for (int r = 0; r < P; ++r) {
      int64_t work = 0;
      for (const Range& range : shard_ranges(L, Layout::zigzag, r, P))
        for (int64_t i = range.start; i < range.start + range.length; ++i) work += i + 1;
      if (first < 0) first = work;
      EXPECT_EQ(work, first) << "P " << P << " rank " << r;
    }
  }
}

TEST(Layout, UlyssesSplitsWholeKvHeadsAsEvenlyAsPossible) {
  for (int P = 1; P <= 5; ++P)
    for (int64_t heads : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int r = 0; r < P; ++r) {
        const Range share = ulysses_heads(heads, r, P);
        EXPECT_EQ(share.start, next);
        EXPECT_LE(share.length, (heads + P - 1) / P);
        EXPECT_GE(share.length, heads / P);
        next += share.length;
      }
      EXPECT_EQ(next, heads);
    }
}

TEST(Layout, BadArgumentsAreRefusedByName) {
  expect_error([] { shard_ranges(10, Layout::contiguous, 3, 3); }, "shard_ranges: rank: expected 0 to 2, got 3");
  expect_error([] { shard_ranges(10, Layout::zigzag, 0, 0); }, "shard_ranges: ranks: expected 1 to 2^20, got 0");
  expect_error([] { shard_ranges(-1, Layout::zigzag, 0, 2); }, "shard_ranges: length: expected 0 to 2^40, got -1");
  const Tensor<float> t({2, 4});
  expect_error([&] { shard(View<const float>(t), 2, Layout::contiguous, 0, 1); }, "shard: axis: expected 0 to 1, got 2");
  std::vector<Tensor<float>> parts{Tensor<float>({2, 3}), Tensor<float>({3, 3})};
  expect_error([&] { unshard(parts, 1, Layout::contiguous); }, "unshard: shards: expected the shape of shard 0");
  std::vector<Tensor<float>> uneven{Tensor<float>({2, 1}), Tensor<float>({2, 3})};
  expect_error([&] { unshard(uneven, 1, Layout::contiguous); }, "unshard: shards[0]: expected 2 rows along axis 1");
}

}  // namespace
}  // namespace mha::distributed
