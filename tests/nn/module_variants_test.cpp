// The module's attention variants: MultiheadAttentionOptions::scoring (the window, chunks, the
// soft-cap, a scale), and the per-call MultiheadAttentionArgs::sinks / alibi_slopes, reach its
// attention core in forward and backward (MultiheadAttentionMasks::core_options with module_scoring).
//   - a module with a window or chunks equals, bit for bit (double, on the reference backend), the
//     same module given them as a bool attn_mask (True = blocked) built here from the definition
//     (query i sees key j when i + d − left <= j <= i + d + right and ⌊j / C⌋ = ⌊(i + d) / C⌋,
//     d = S − L without causality): output, weights, input gradients and every parameter gradient
//     (the token-by-token path, forward_cached, is in kv_cache_test.cpp);
//   - a scale s equals the default 1/sqrt(head_dim) with the query projection multiplied by
//     s·sqrt(head_dim) (within 1e-13 in double);
//   - ALiBi equals, bit for bit (double, reference backend), the module given the same biases as a
//     float (N·H, L, S) attn_mask built here from the definition −slope·|i + S − L − j|;
//   - sinks of 0 are add_zero_attn: a zero key scores 0 against every query and its zero value adds
//     nothing, which is a sink logit of 0 (output and input gradients within 1e-14);
//   - grad_sinks and the input gradients under a soft-cap against finite differences;
//   - a bad window, soft-cap, chunk or scale is refused, and so are the settings that are each
//     call's own (causality, dropout, its seed) or a block's (whole_call).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "../support/assertions.h"
#include "../support/gradient_check.h"
#include "../support/max_diff.h"
#include "mha/core/random.h"
#include "mha/nn/multihead_attention.h"

namespace mha::nn {
namespace {

using mha::testing::check_gradient;
using mha::testing::expect_error;
using mha::testing::max_diff;
using mha::testing::replacing;

Tensor<double> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<double> t(shape);
  for (auto& x : t.values()) x = gen.normal();
  return t;
}

bool bitwise_equal(const Tensor<double>& a, const Tensor<double>& b) {
  return a.shape() == b.shape() && std::equal(a.values().begin(), a.values().end(), b.values().begin(),
                                              [](double x, double y) { return x == y || (x != x && y != y); });
}

// Module a with args_a and module b with args_b on the same inputs: the output, the weights and every
// gradient (inputs' and parameters') bit for bit.
void expect_same_results(MultiheadAttention<double>& a, const MultiheadAttentionArgs<double>& args_a,
                         MultiheadAttention<double>& b, const MultiheadAttentionArgs<double>& args_b,
                         const Tensor<double>& q, const Tensor<double>& kv, const Tensor<double>& grad) {
  MultiheadAttentionCache<double> cache_a, cache_b;
  const auto fa = a.forward(q, kv, kv, args_a, &cache_a), fb = b.forward(q, kv, kv, args_b, &cache_b);
  EXPECT_TRUE(bitwise_equal(fa.output, fb.output));
  ASSERT_TRUE(fa.attn_weights && fb.attn_weights);
  EXPECT_TRUE(bitwise_equal(*fa.attn_weights, *fb.attn_weights));
  const auto ga = a.backward(grad, cache_a), gb = b.backward(grad, cache_b);
  EXPECT_TRUE(bitwise_equal(ga.grad_query, gb.grad_query));
  EXPECT_TRUE(bitwise_equal(ga.grad_key, gb.grad_key));
  EXPECT_TRUE(bitwise_equal(ga.grad_value, gb.grad_value));
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bitwise_equal(*pa[i].grad, *pb[i].grad)) << pa[i].name;
}

constexpr int64_t kN = 2, kLen = 6, kSrc = 9, kEmbed = 8, kHeads = 2;

MultiheadAttentionOptions options() {
  MultiheadAttentionOptions o;
  o.embed_dim = kEmbed;
  o.num_heads = kHeads;
  o.batch_first = true;
  return o;
}

int64_t floor_div(int64_t a, int64_t b) { return (a >= 0 ? a : a - b + 1) / b; }

TEST(ModuleVariants, EqualsTheModuleGivenTheWindowAndChunksAsAMask) {
  for (auto [left, right, chunk] : {std::tuple<int64_t, int64_t, int64_t>{2, 1, 0}, {0, 0, 0}, {-1, 3, 0},
                                    {5, -1, 0}, {-1, -1, 4}, {3, 2, 5}, {-1, -1, 1}}) {
    SCOPED_TRACE("window " + std::to_string(left) + "," + std::to_string(right) + " chunk " + std::to_string(chunk));
    const int64_t n = 2, len = 9, src = 13, e = 8;
    MultiheadAttentionOptions o;
    o.embed_dim = e;
    o.num_heads = 2;
    o.batch_first = true;
    MultiheadAttentionOptions windowed = o;
    windowed.scoring.window_left = left;
    windowed.scoring.window_right = right;
    windowed.scoring.chunk_size = chunk;
    MultiheadAttention<double> with(windowed, 5), masked(o, 5);  // the same parameters (same seed)
    Generator gen(9);
    const Tensor<double> q = random_tensor({n, len, e}, gen), kv = random_tensor({n, src, e}, gen);
    const Tensor<double> grad = random_tensor({n, len, e}, gen);
    Tensor<bool> blocked({len, src});
    for (int64_t i = 0; i < len; ++i)
      for (int64_t j = 0; j < src; ++j) {
        const int64_t d = src - len;
        const bool sees = (left < 0 || j >= i + d - left) && (right < 0 || j <= i + d + right) &&
                          (chunk == 0 || floor_div(j, chunk) == floor_div(i + d, chunk));
        blocked[i * src + j] = !sees;
      }
    MultiheadAttentionArgs<double> with_args, mask_args;
    mask_args.attn_mask = blocked;
    expect_same_results(with, with_args, masked, mask_args, q, kv, grad);
  }
}

TEST(ModuleVariants, AScaleIsTheQueryProjectionScaled) {
  const double scale = 0.3, head_dim = static_cast<double>(kEmbed / kHeads);
  MultiheadAttentionOptions scaled_options = options();
  scaled_options.scoring.scale = scale;
  MultiheadAttention<double> scaled(scaled_options, 5), plain(options(), 5);
  // The query's rows of the packed projection (the first embed_dim), weight and bias.
  for (auto& p : plain.parameters())
    if (p.name == "in_proj_weight" || p.name == "in_proj_bias")
      for (int64_t i = 0; i < kEmbed * (p.name == "in_proj_weight" ? kEmbed : 1); ++i)
        p.value->values()[i] *= scale * std::sqrt(head_dim);
  Generator gen(6);
  const Tensor<double> q = random_tensor({kN, kLen, kEmbed}, gen), kv = random_tensor({kN, kSrc, kEmbed}, gen);
  MultiheadAttentionArgs<double> args;
  const auto a = scaled.forward(q, kv, kv, args), b = plain.forward(q, kv, kv, args);
  EXPECT_LE(max_diff(a.output, b.output), 1e-13);
  EXPECT_LE(max_diff(*a.attn_weights, *b.attn_weights), 1e-13);
  EXPECT_GT(max_diff(a.output, MultiheadAttention<double>(options(), 5).forward(q, kv, kv, args).output), 1e-3);
}

TEST(ModuleVariants, AlibiEqualsItsBiasAsAnAttentionMask) {
  MultiheadAttention<double> with(options(), 5), masked(options(), 5);
  Generator gen(2);
  const Tensor<double> q = random_tensor({kN, kLen, kEmbed}, gen), kv = random_tensor({kN, kSrc, kEmbed}, gen),
                       grad = random_tensor({kN, kLen, kEmbed}, gen);
  Tensor<double> slopes({kN, kHeads});
  for (auto& x : slopes.values()) x = gen.uniform();
  Tensor<double> bias({kN * kHeads, kLen, kSrc});  // PyTorch's 3-D attn_mask: (N·num_heads, L, S)
  for (int64_t bh = 0; bh < kN * kHeads; ++bh)
    for (int64_t i = 0; i < kLen; ++i)
      for (int64_t j = 0; j < kSrc; ++j)
        bias[(bh * kLen + i) * kSrc + j] = -slopes[bh] * static_cast<double>(std::abs(i + kSrc - kLen - j));
  MultiheadAttentionArgs<double> alibi, mask;
  alibi.alibi_slopes = slopes;
  mask.attn_mask = bias;
  expect_same_results(with, alibi, masked, mask, q, kv, grad);
}

TEST(ModuleVariants, SinksOfZeroAreAZeroKey) {
  MultiheadAttentionOptions zero_attn = options();
  zero_attn.add_zero_attn = true;
  MultiheadAttention<double> with(options(), 7), appended(zero_attn, 7);  // add_zero_attn adds no parameter
  Generator gen(3);
  const Tensor<double> q = random_tensor({kN, kLen, kEmbed}, gen), kv = random_tensor({kN, kSrc, kEmbed}, gen),
                       grad = random_tensor({kN, kLen, kEmbed}, gen);
  MultiheadAttentionArgs<double> sinks, plain;
  sinks.sinks = Tensor<double>({kHeads}, 0.0);
  sinks.need_weights = plain.need_weights = false;
  MultiheadAttentionCache<double> ca, cb;
  const auto a = with.forward(q, kv, kv, sinks, &ca), b = appended.forward(q, kv, kv, plain, &cb);
  EXPECT_LE(max_diff(a.output, b.output), 1e-14);
  const auto ga = with.backward(grad, ca), gb = appended.backward(grad, cb);
  EXPECT_LE(max_diff(ga.grad_query, gb.grad_query), 1e-14);
  EXPECT_LE(max_diff(ga.grad_key, gb.grad_key), 1e-14);
  EXPECT_LE(max_diff(ga.grad_value, gb.grad_value), 1e-14);
  ASSERT_TRUE(ga.grad_sinks.has_value());
  EXPECT_FALSE(gb.grad_sinks.has_value());
}

TEST(ModuleVariants, GradientsMatchFiniteDifferences) {
  MultiheadAttentionOptions o = options();
  o.scoring.softcap = 0.8;
  o.scoring.window_left = 4;
  MultiheadAttention<double> module(o, 9);
  Generator gen(4);
  Tensor<double> q = random_tensor({kN, kLen, kEmbed}, gen), kv = random_tensor({kN, kSrc, kEmbed}, gen);
  const Tensor<double> grad = random_tensor({kN, kLen, kEmbed}, gen);
  MultiheadAttentionArgs<double> args;
  args.need_weights = false;
  args.sinks = random_tensor({kHeads}, gen);
  args.alibi_slopes = Tensor<double>({kHeads}, {0.5, 0.125});
  MultiheadAttentionCache<double> cache;
  module.forward(q, kv, kv, args, &cache);
  const auto g = module.backward(grad, cache);
  auto forward = [&] { return module.forward(q, kv, kv, args).output; };
  EXPECT_TRUE(check_gradient(replacing(q, forward), q, grad, g.grad_query)) << "grad_query";
  EXPECT_TRUE(check_gradient(replacing(*args.sinks, forward), *args.sinks, grad, *g.grad_sinks)) << "grad_sinks";
}

TEST(ModuleVariants, BadSettingsAreRefused) {
  auto refused = [](auto set, const std::string& message) {
    MultiheadAttentionOptions o = options();
    set(o.scoring);
    expect_error([&] { MultiheadAttention<float> m(o, 0); }, message);
  };
  using attention::Scoring;
  refused([](Scoring& s) { s.window_left = -3; },
          "MultiheadAttention: scoring.window_left: expected -1 (unbounded) or a number of keys >= 0, got -3");
  refused([](Scoring& s) { s.softcap = -2; },
          "MultiheadAttention: scoring.softcap: expected 0 (none) or a finite cap > 0, got -2");
  refused([](Scoring& s) { s.chunk_size = -1; },
          "MultiheadAttention: scoring.chunk_size: expected 0 (no chunks) or a number of keys > 0, got -1");
  refused([](Scoring& s) { s.scale = std::nan(""); }, "MultiheadAttention: scoring.scale: expected a finite number");
  const std::string own = "MultiheadAttention: scoring: expected causal, dropout_p, dropout_seed and whole_call at "
                          "their defaults (each call's own: is_causal and the masks, the module's dropout in training)";
  refused([](Scoring& s) { s.causal = attention::Causal::top_left; }, own + ", got causal 1, dropout_p 0");
  refused([](Scoring& s) { s.dropout_p = 0.5; }, own + ", got causal 0, dropout_p 0.5");
  refused([](Scoring& s) { s.dropout_seed = 3; }, own);
  refused([](Scoring& s) { s.whole_call.key_len = 3; }, "and a whole_call of a larger call");
}

}  // namespace
}  // namespace mha::nn
