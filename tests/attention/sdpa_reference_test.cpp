// The reference backend: hand-derived values, finite-difference gradients in double, the
// properties the contract promises (masked rows, GQA, causal alignments, dropout), bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "../support/gradient_check.h"
#include "../support/golden.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"

namespace mha::attention {
namespace {

using mha::testing::check_gradient;
using mha::testing::expect_error;
using mha::testing::max_abs_diff;
using mha::testing::replacing;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor<double> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<double> t(shape);
  for (auto& x : t.values()) x = gen.normal(0.0, 1.0);
  return t;
}

using test_cases::Case;
using test_cases::MaskKind;

// Checks dQ, dK, dV of the reference backend in double against finite differences.
void check_gradients(const Case& c, uint64_t seed) {
  const test_cases::Inputs in = test_cases::make_inputs(c, seed);
  Tensor<double> q = mha::cast<double>(in.q), k = mha::cast<double>(in.k), v = mha::cast<double>(in.v);
  const Tensor<double> grad_out = mha::cast<double>(in.dout);
  test_cases::Held<double> held;
  const Options<double> opt = test_cases::options_of<double>(c, in, Backend::reference, held);

  ForwardResult<double> fwd = sdpa_forward(q, k, v, opt);
  Gradients<double> g = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, grad_out, opt);
  auto forward = [&] { return sdpa_forward(q, k, v, opt).output; };
  EXPECT_TRUE(check_gradient(replacing(q, forward), q, grad_out, g.grad_query)) << "grad_query";
  EXPECT_TRUE(check_gradient(replacing(k, forward), k, grad_out, g.grad_key)) << "grad_key";
  EXPECT_TRUE(check_gradient(replacing(v, forward), v, grad_out, g.grad_value)) << "grad_value";
}

// Masks broadcast over heads: a bool one (B, 1, L, S) that blocks ~30% of pairs, a float one
// (L, S) with noise and a few −inf, or both.
TEST(SdpaReference, GradientsMatchFiniteDifferencesOnRandomShapes) {
  Generator pick(2024);
  const MaskKind masks[] = {MaskKind::none, MaskKind::bool_batch, MaskKind::additive_2d,
                            MaskKind::bool_batch_additive_2d};
  for (int trial = 0; trial < 24; ++trial) {
    Case c;
    c.batch = 1 + static_cast<int64_t>(pick.uniform() * 2);
    c.kv_heads = 1 + static_cast<int64_t>(pick.uniform() * 2);
    c.q_heads = c.kv_heads * (1 + static_cast<int64_t>(pick.uniform() * 3));
    c.q_len = 1 + static_cast<int64_t>(pick.uniform() * 6);
    c.k_len = 1 + static_cast<int64_t>(pick.uniform() * 6);
    c.qk_dim = 1 + static_cast<int64_t>(pick.uniform() * 5);
    c.v_dim = 1 + static_cast<int64_t>(pick.uniform() * 5);
    c.scoring.causal = static_cast<Causal>(trial % 3);
    c.mask = masks[trial % 4];
    c.scoring.dropout_p = trial % 5 == 4 ? 0.3 : 0.0;
    if (trial % 6 == 5) c.scoring.scale = -0.7;
    const auto seed = 100 + static_cast<uint64_t>(trial);
    c.scoring.dropout_seed = seed * 7 + 1;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << c.describe());
    check_gradients(c, seed);
  }
}

// One query, two keys, d = 1, scale 1: scores [0, ln 3], so P = [1/4, 3/4] and
// output = 1/4·v0 + 3/4·v1; logsumexp = log(1 + 3) = log 4.
TEST(SdpaReference, HandDerivedTwoKeyCase) {
  Tensor<double> q({1, 1, 1, 1}, {1.0});
  Tensor<double> k({1, 1, 2, 1}, {0.0, std::log(3.0)});
  Tensor<double> v({1, 1, 2, 2}, {2.0, -4.0, 6.0, 8.0});
  Options<double> opt;
  opt.scale = 1.0;
  opt.need_weights = true;
  auto r = sdpa_forward(q, k, v, opt);
  EXPECT_NEAR(r.output[0], 0.25 * 2 + 0.75 * 6, 1e-15);
  EXPECT_NEAR(r.output[1], 0.25 * -4 + 0.75 * 8, 1e-15);
  EXPECT_NEAR(r.logsumexp[0], std::log(4.0), 1e-15);
  EXPECT_NEAR((*r.weights)[0], 0.25, 1e-15);
  EXPECT_NEAR((*r.weights)[1], 0.75, 1e-15);
  // Default scale is 1/sqrt(head size): with d = 4 and q·k = 2 the score is 1.
  Tensor<double> q4({1, 1, 1, 4}, {1, 1, 1, 1});
  Tensor<double> k4({1, 1, 2, 4}, {0.5, 0.5, 0.5, 0.5, 0, 0, 0, 0});
  Tensor<double> v4({1, 1, 2, 1}, {1.0, 0.0});
  auto r4 = sdpa_forward(q4, k4, v4);
  EXPECT_NEAR(r4.output[0], std::exp(1.0) / (std::exp(1.0) + 1.0), 1e-15);
}

TEST(SdpaReference, FullyMaskedRowsGiveZeroOutputAndZeroGradient) {
  Generator gen(5);
  Tensor<double> q = random_tensor({1, 2, 3, 4}, gen), k = random_tensor({1, 2, 5, 4}, gen);
  Tensor<double> v = random_tensor({1, 2, 5, 3}, gen), dout = random_tensor({1, 2, 3, 3}, gen);
  Tensor<bool> attend({3, 5}, true);
  for (int j = 0; j < 5; ++j) attend[1 * 5 + j] = false;  // query row 1 sees nothing
  Options<double> opt;
  opt.attend_mask = attend;
  opt.need_weights = true;
  auto r = sdpa_forward(q, k, v, opt);
  auto g = sdpa_backward(q, k, v, r.output, r.logsumexp, dout, opt);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(r.logsumexp[h * 3 + 1], -kInf);
    for (int d = 0; d < 3; ++d) EXPECT_EQ(r.output[(h * 3 + 1) * 3 + d], 0.0);
    for (int d = 0; d < 4; ++d) EXPECT_EQ(g.grad_query[(h * 3 + 1) * 4 + d], 0.0);
    for (int j = 0; j < 5; ++j) EXPECT_EQ((*r.weights)[(h * 3 + 1) * 5 + j], 0.0);
  }
  for (double x : g.grad_key.values()) EXPECT_TRUE(std::isfinite(x));
  for (double x : g.grad_value.values()) EXPECT_TRUE(std::isfinite(x));
  // An additive mask of −inf everywhere in the row behaves the same.
  Tensor<double> additive({3, 5}, 0.0);
  for (int j = 0; j < 5; ++j) additive[1 * 5 + j] = -kInf;
  Options<double> opt2;
  opt2.additive_mask = additive;
  auto r2 = sdpa_forward(q, k, v, opt2);
  EXPECT_EQ(max_abs_diff(r.output, r2.output), 0.0);
}

// A finite mask fill far larger than the scores (−1e9 in float, −1e300 in double) makes every
// score of the row equal, so P = 1/S and, with one query, grad_value_j = grad_output / S;
// k_j = 0.1·(2j, 2j + 1), v = (1, 2, 3, 4).
// (A backward that rebuilt P as exp(s − lse) would get P = 1 here: lse = m + log S rounds to m.)
template <class T>
void check_huge_fill(T fill) {
  const int64_t S = 4;
  Tensor<T> q({1, 1, 1, 2}, {T(0.3), T(-0.2)}), k({1, 1, S, 2}), v({1, 1, S, 1}, {1, 2, 3, 4});
  for (int64_t i = 0; i < k.numel(); ++i) k[i] = T(0.1) * static_cast<T>(i);
  Tensor<T> additive({1, S}, fill), dout({1, 1, 1, 1}, {T(1)});
  Options<T> opt;
  opt.additive_mask = additive;
  auto r = sdpa_forward(q, k, v, opt);
  EXPECT_NEAR(r.output[0], T(2.5), T(1e-6));
  auto g = sdpa_backward(q, k, v, r.output, r.logsumexp, dout, opt);
  for (int64_t j = 0; j < S; ++j) EXPECT_NEAR(g.grad_value[j], T(0.25), T(1e-6)) << "key " << j;
  // dq = scale Σ_j P_j (dout·v_j − dout·o) k_j = (1/√2)(1/4) Σ_j (v_j − 2.5) k_j = (1, 1)/(4√2).
  for (int64_t d = 0; d < 2; ++d) EXPECT_NEAR(g.grad_query[d], T(1 / (4 * std::sqrt(2.0))), T(1e-6));
}

TEST(SdpaReference, HugeFiniteMaskFillsKeepExactGradients) {
  check_huge_fill<float>(-1e9f);
  check_huge_fill<double>(-1e300);
}

// NaN is not "masked": a NaN score makes its row NaN (output and weights), as in PyTorch, and
// does not leak into other rows.
TEST(SdpaReference, NanPropagatesThroughItsRowOnly) {
  Tensor<double> q({1, 1, 2, 2}, {std::nan(""), 1.0, 0.5, 0.5}), k({1, 1, 3, 2}, 0.25), v({1, 1, 3, 1}, 1.0);
  Options<double> opt;
  opt.need_weights = true;
  auto r = sdpa_forward(q, k, v, opt);
  EXPECT_TRUE(std::isnan(r.output[0]));
  for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan((*r.weights)[j]));
  EXPECT_NEAR(r.output[1], 1.0, 1e-15);
}

// GQA: Hq = 6 over Hkv = 2 equals plain attention with each kv head repeated 3 times
// (repeat_interleave: query head h reads kv head h / 3), gradients summed back over the group.
TEST(SdpaReference, GroupedQueryAttentionEqualsRepeatedHeads) {
  Generator gen(9);
  Tensor<double> q = random_tensor({2, 6, 4, 3}, gen), k = random_tensor({2, 2, 5, 3}, gen);
  Tensor<double> v = random_tensor({2, 2, 5, 2}, gen), dout = random_tensor({2, 6, 4, 2}, gen);
  auto repeat = [](const Tensor<double>& x, int64_t times) {
    Tensor<double> out({x.size(0), x.size(1) * times, x.size(2), x.size(3)});
    const int64_t block = x.size(2) * x.size(3);
    for (int64_t b = 0; b < x.size(0); ++b)
      for (int64_t h = 0; h < out.size(1); ++h)
        std::copy_n(x.data() + (b * x.size(1) + h / times) * block, block, out.data() + (b * out.size(1) + h) * block);
    return out;
  };
  Options<double> opt;
  opt.causal = Causal::bottom_right;
  auto gqa = sdpa_forward(q, k, v, opt);
  auto full = sdpa_forward(q, repeat(k, 3), repeat(v, 3), opt);
  EXPECT_LT(max_abs_diff(gqa.output, full.output), 1e-14);
  auto g_gqa = sdpa_backward(q, k, v, gqa.output, gqa.logsumexp, dout, opt);
  auto g_full = sdpa_backward(q, repeat(k, 3), repeat(v, 3), full.output, full.logsumexp, dout, opt);
  EXPECT_LT(max_abs_diff(g_gqa.grad_query, g_full.grad_query), 1e-14);
  Tensor<double> summed_k(k.shape());
  const int64_t block = 5 * 3;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 6; ++h)
      for (int64_t i = 0; i < block; ++i) summed_k[(b * 2 + h / 3) * block + i] += g_full.grad_key[(b * 6 + h) * block + i];
  EXPECT_LT(max_abs_diff(g_gqa.grad_key, summed_k), 1e-14);
}

// Causal alignments equal the explicit masks PyTorch documents:
// top-left tril(ones(L, S)), bottom-right tril(ones(L, S), diagonal = S − L).
TEST(SdpaReference, CausalAlignmentsEqualExplicitMasks) {
  Generator gen(11);
  for (auto [L, S] : {std::pair<int64_t, int64_t>{3, 5}, {5, 3}, {4, 4}, {1, 6}}) {
    Tensor<double> q = random_tensor({1, 2, L, 3}, gen), k = random_tensor({1, 2, S, 3}, gen);
    Tensor<double> v = random_tensor({1, 2, S, 2}, gen);
    for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
      const int64_t diagonal = causal == Causal::top_left ? 0 : S - L;
      Tensor<bool> tril({L, S});
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j) tril[i * S + j] = j - i <= diagonal;
      Options<double> implicit, explicit_mask;
      implicit.causal = causal;
      explicit_mask.attend_mask = tril;
      EXPECT_EQ(max_abs_diff(sdpa_forward(q, k, v, implicit).output, sdpa_forward(q, k, v, explicit_mask).output), 0.0)
          << "L=" << L << " S=" << S << " causal " << static_cast<int>(causal);
    }
  }
}

// A 1-D mask (S) broadcasts over batch, heads and queries, as in PyTorch.
TEST(SdpaReference, OneDimensionalMaskBroadcastsOverEverything) {
  Generator gen(12);
  Tensor<double> q = random_tensor({2, 2, 3, 4}, gen), k = random_tensor({2, 2, 5, 4}, gen);
  Tensor<double> v = random_tensor({2, 2, 5, 3}, gen);
  Tensor<bool> keys({5}, {true, false, true, true, false}), full({2, 2, 3, 5});
  for (int64_t i = 0; i < full.numel(); ++i) full[i] = keys[i % 5];
  Options<double> one_d, four_d;
  one_d.attend_mask = keys;
  four_d.attend_mask = full;
  EXPECT_EQ(max_abs_diff(sdpa_forward(q, k, v, one_d).output, sdpa_forward(q, k, v, four_d).output), 0.0);
}

TEST(SdpaReference, DropoutIsSeededScaledAndReproducible) {
  Generator gen(13);
  Tensor<double> q = random_tensor({2, 2, 16, 4}, gen), k = random_tensor({2, 2, 32, 4}, gen);
  Tensor<double> v = random_tensor({2, 2, 32, 4}, gen);
  Options<double> opt;
  opt.dropout_p = 0.25;
  opt.dropout_seed = 42;
  opt.need_weights = true;
  Options<double> plain;
  plain.need_weights = true;
  auto a = sdpa_forward(q, k, v, opt), b = sdpa_forward(q, k, v, opt), clean = sdpa_forward(q, k, v, plain);
  EXPECT_EQ(max_abs_diff(a.output, b.output), 0.0);
  opt.dropout_seed = 43;
  EXPECT_GT(max_abs_diff(a.output, sdpa_forward(q, k, v, opt).output), 1e-3);
  // Each weight is either dropped (0) or the clean probability scaled by 1/(1 − p).
  int64_t dropped = 0;
  for (int64_t i = 0; i < a.weights->numel(); ++i) {
    const double w = (*a.weights)[i], p = (*clean.weights)[i];
    if (w == 0.0) {
      ++dropped;
    } else {
      EXPECT_NEAR(w, p / 0.75, 1e-15);
    }
  }
  const double fraction = static_cast<double>(dropped) / static_cast<double>(a.weights->numel());
  EXPECT_NEAR(fraction, 0.25, 0.03);  // 4096 draws: 3 standard deviations is ~0.02
  // p = 1 drops everything (no 0·inf NaN).
  opt.dropout_p = 1.0;
  const auto dropped_all = sdpa_forward(q, k, v, opt);  // named: a temporary would die before the loop
  for (double x : dropped_all.output.values()) EXPECT_EQ(x, 0.0);
}

TEST(SdpaReference, BadInputGivesClearErrors) {
  Tensor<double> q({1, 4, 3, 8}), k({1, 2, 5, 8}), v({1, 2, 5, 6});
  expect_error([&] { sdpa_forward(Tensor<double>({4, 3, 8}), k, v); }, "query: expected a 4-D tensor");
  expect_error([&] { sdpa_forward(q, Tensor<double>({1, 3, 5, 8}), Tensor<double>({1, 3, 5, 6})); },
               "must divide the 4 query heads");
  expect_error([&] { sdpa_forward(q, Tensor<double>({2, 2, 5, 8}), v); }, "expected batch size 1");
  expect_error([&] { sdpa_forward(q, Tensor<double>({1, 2, 5, 7}), v); }, "key: expected head size 8");
  expect_error([&] { sdpa_forward(q, k, Tensor<double>({1, 2, 4, 6})); }, "value: expected sequence length 5");
  Tensor<bool> bad_mask({3, 4});
  Options<double> opt;
  opt.attend_mask = bad_mask;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "attend_mask: expected a 1-D to 4-D shape broadcastable");
  Options<double> drop;
  drop.dropout_p = 1.5;
  expect_error([&] { sdpa_forward(q, k, v, drop); }, "dropout_p");
  Options<double> nan_scale;
  nan_scale.scale = std::nan("");
  expect_error([&] { sdpa_forward(q, k, v, nan_scale); }, "scale: expected a finite number");
  auto fwd = sdpa_forward(q, k, v);
  expect_error([&] { sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, Tensor<double>({1, 4, 3, 5})); },
               "grad_output: expected shape [1, 4, 3, 6]");
}

}  // namespace
}  // namespace mha::attention
