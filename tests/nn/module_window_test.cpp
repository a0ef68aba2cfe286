// MultiheadAttentionOptions::window_left / window_right: the module's sliding window reaches its
// attention core in forward and backward (MultiheadAttentionMasks::core_options with
// module_scoring). A module with a window equals, bit for bit (double, on the reference backend),
// the same module given the window as a bool attn_mask (True = blocked) built here from the
// definition (query i sees key j when i + d − left <= j <= i + d + right, d = S − L without
// causality): output, weights, input gradients and every parameter gradient. The token-by-token
// path (forward_cached) is in kv_cache_test.cpp; a bad window is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "../support/assertions.h"
#include "mha/core/random.h"
#include "mha/nn/multihead_attention.h"

namespace mha::nn {
namespace {

using mha::testing::expect_error;

Tensor<double> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<double> t(shape);
  for (auto& x : t.values()) x = gen.normal();
  return t;
}

bool bitwise_equal(const Tensor<double>& a, const Tensor<double>& b) {
  return a.shape() == b.shape() && std::equal(a.values().begin(), a.values().end(), b.values().begin(),
                                              [](double x, double y) { return x == y || (x != x && y != y); });
}

TEST(ModuleWindow, EqualsTheModuleGivenTheWindowAsAMask) {
  for (auto [left, right] : {std::pair<int64_t, int64_t>{2, 1}, {0, 0}, {-1, 3}, {5, -1}}) {
    SCOPED_TRACE("window " + std::to_string(left) + "," + std::to_string(right));
    const int64_t n = 2, len = 9, src = 13, e = 8;
    MultiheadAttentionOptions o;
    o.embed_dim = e;
    o.num_heads = 2;
    o.batch_first = true;
    MultiheadAttentionOptions windowed = o;
    windowed.window_left = left;
    windowed.window_right = right;
    MultiheadAttention<double> with(windowed, 5), masked(o, 5);  // the same parameters (same seed)
    Generator gen(9);
    const Tensor<double> q = random_tensor({n, len, e}, gen), kv = random_tensor({n, src, e}, gen);
    const Tensor<double> grad = random_tensor({n, len, e}, gen);
    Tensor<bool> blocked({len, src});
    for (int64_t i = 0; i < len; ++i)
      for (int64_t j = 0; j < src; ++j) {
        const int64_t d = src - len;
        const bool sees = (left < 0 || j >= i + d - left) && (right < 0 || j <= i + d + right);
        blocked[i * src + j] = !sees;
      }
    MultiheadAttentionArgs<double> with_args, mask_args;
    mask_args.attn_mask = blocked;
    MultiheadAttentionCache<double> with_cache, mask_cache;
    const auto a = with.forward(q, kv, kv, with_args, &with_cache);
    const auto b = masked.forward(q, kv, kv, mask_args, &mask_cache);
    EXPECT_TRUE(bitwise_equal(a.output, b.output));
    ASSERT_TRUE(a.attn_weights && b.attn_weights);
    EXPECT_TRUE(bitwise_equal(*a.attn_weights, *b.attn_weights));
    const auto ga = with.backward(grad, with_cache), gb = masked.backward(grad, mask_cache);
    EXPECT_TRUE(bitwise_equal(ga.grad_query, gb.grad_query));
    EXPECT_TRUE(bitwise_equal(ga.grad_key, gb.grad_key));
    EXPECT_TRUE(bitwise_equal(ga.grad_value, gb.grad_value));
    auto pa = with.parameters(), pb = masked.parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bitwise_equal(*pa[i].grad, *pb[i].grad)) << pa[i].name;
  }
}

TEST(ModuleWindow, BelowMinusOneIsRefused) {
  MultiheadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  o.window_left = -3;
  expect_error([&] { MultiheadAttention<float> m(o, 0); },
               "MultiheadAttention: window_left: expected -1 (unbounded) or a number of keys >= 0, got -3");
}

}  // namespace
}  // namespace mha::nn
