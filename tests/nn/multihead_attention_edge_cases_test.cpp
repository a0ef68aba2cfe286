// MultiheadAttention on numerical edge cases: logits of ±1e4, NaN in an input, every key masked,
// zero-length sequences and sizes whose products overflow. Forward and backward, in double and
// in float on both attention backends. Expected values are derived by hand in the comments and
// were checked against PyTorch 2.15 (torch.nn.MultiheadAttention, float64), quoted where used.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/backends.h"
#include "mha/core/random.h"
#include "mha/nn/multihead_attention.h"

namespace mha::nn {
namespace {

using mha::testing::expect_error;
using mha::testing::expect_values;
using mha::testing::for_every_backend;

template <class T>
void expect_all(const Tensor<T>& t, T value, const std::string& what) {
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], value) << what << " element " << i;
}

template <class T>
Tensor<T> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<T> t(shape);
  for (auto& x : t.values()) x = static_cast<T>(gen.normal());
  return t;
}

// Parameters drawn at random (biases included, so that a zero bias cannot hide a term).
template <class T>
void randomise(MultiheadAttention<T>& module, uint64_t seed) {
  Generator gen(seed);
  for (auto& p : module.parameters()) *p.value = random_tensor<T>(p.value->shape(), gen);
}

template <class T>
Tensor<T> parameter(MultiheadAttention<T>& module, const std::string& name, bool grad = false) {
  for (auto& p : module.parameters())
    if (p.name == name) return grad ? *p.grad : *p.value;
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

MultiheadAttentionOptions options(int64_t embed_dim, int64_t num_heads) {
  MultiheadAttentionOptions o;
  o.embed_dim = embed_dim;
  o.num_heads = num_heads;
  return o;
}

// E = 4, 2 heads on `backend`, in eval mode, its parameters drawn from `seed` (randomise).
template <class T>
MultiheadAttention<T> random_module(attention::Backend backend, uint64_t seed) {
  MultiheadAttention<T> m(options(4, 2), 0);
  m.backend = backend;
  m.eval();
  randomise(m, seed);
  return m;
}

// ------------------------------------------------------------------------------------------
// Logits of ±1e4. E = 1, one head (scale 1), every projection weight 1 and bias 0, so q = k = v
// = x and the scores are x_i·x_j. x = (100, −100, 0):
//   row 0 scores ( 1e4, −1e4, 0) -> P = (1, 0, 0),  output  100
//   row 1 scores (−1e4,  1e4, 0) -> P = (0, 1, 0),  output −100
//   row 2 scores (   0,    0, 0) -> P = 1/3 each,   output    0
// Backward, grad_output 1: dP_ij = v_j; rows 0 and 1 have dS = P(dP − D) = 0; row 2 has
// dS = (100, −100, 0)/3, so grad_query_2 = Σ_j dS_2j k_j = 20000/3, grad_key = Σ_i dS_ij q_i = 0
// (q_2 = 0), grad_value_j = Σ_i P_ij = (4/3, 4/3, 1/3). PyTorch: out [100, -100, 0],
// dq [0, 0, 6666.666666666666], dk [0, 0, 0], dv [1.333.., 1.333.., 0.333..].
// A softmax without the maximum subtracted would compute exp(1e4) = inf and return NaN.
TEST(MultiheadAttentionNumerics, LogitsOfPlusMinus1e4StayFiniteForwardAndBackward) {
  for_every_backend([]<class T>(attention::Backend backend, double tol) {
    MultiheadAttention<T> m(options(1, 1), 0);
    m.backend = backend;
    m.eval();
    StateDict<T> state = m.state_dict();
    state.at("in_proj_weight") = Tensor<T>({3, 1}, T(1));
    state.at("in_proj_bias") = Tensor<T>({3});
    state.at("out_proj.weight") = Tensor<T>({1, 1}, T(1));
    state.at("out_proj.bias") = Tensor<T>({1});
    m.load_state_dict(state);
    const Tensor<T> x({3, 1, 1}, {100, -100, 0});
    MultiheadAttentionCache<T> cache;
    const auto r = m.forward(x, x, x, {}, &cache);
    expect_values(r.output, {3, 1, 1}, {100, -100, 0}, tol, "output");
    const double third = 1.0 / 3.0;
    expect_values(*r.attn_weights, {1, 3, 3}, {1, 0, 0, 0, 1, 0, third, third, third}, tol, "attn_weights");
    const auto g = m.backward(Tensor<T>({3, 1, 1}, T(1)), cache);
    expect_values(g.grad_query, {3, 1, 1}, {0, 0, 20000.0 / 3}, tol, "grad_query");
    expect_values(g.grad_key, {3, 1, 1}, {0, 0, 0}, tol, "grad_key");
    expect_values(g.grad_value, {3, 1, 1}, {4 * third, 4 * third, third}, tol, "grad_value");
  });
}

// ------------------------------------------------------------------------------------------
// NaN in an input, as in PyTorch: a NaN query position makes its own output row NaN (its
// projection is NaN in every head) and nothing else; a NaN key position makes every output row of
// its sequence NaN, even when key_padding_mask masks that key (PyTorch adds the mask's −inf to
// the NaN score: NaN). PyTorch 2.15, NaN at key 1 of batch 0, padded: output rows of batch 0 all
// NaN, batch 1 all finite, with need_weights True and False.
TEST(MultiheadAttentionNumerics, NanPropagatesLikePyTorch) {
  for_every_backend([]<class T>(attention::Backend backend, double) {
    MultiheadAttention<T> m = random_module<T>(backend, 3);
    Generator gen(4);
    Tensor<T> query = random_tensor<T>({3, 2, 4}, gen), key = random_tensor<T>({5, 2, 4}, gen);
    const Tensor<T> value = random_tensor<T>({5, 2, 4}, gen);
    for (bool need_weights : {true, false}) {
      SCOPED_TRACE(need_weights ? "need_weights" : "no weights");
      MultiheadAttentionArgs<T> args;
      args.need_weights = need_weights;
      // NaN in query position (l = 2, n = 1).
      Tensor<T> nan_query = query;
      nan_query[(2 * 2 + 1) * 4 + 0] = std::numeric_limits<T>::quiet_NaN();
      auto r = m.forward(nan_query, key, value, args);
      for (int64_t l = 0; l < 3; ++l)
        for (int64_t n = 0; n < 2; ++n)
          for (int64_t e = 0; e < 4; ++e)
            EXPECT_EQ(std::isnan(r.output[(l * 2 + n) * 4 + e]), l == 2 && n == 1)
                << l << " " << n << " " << e;
      // NaN in key position (s = 1, n = 0), which key_padding_mask masks.
      Tensor<T> nan_key = key;
      nan_key[(1 * 2 + 0) * 4 + 3] = std::numeric_limits<T>::quiet_NaN();
      Tensor<bool> padding({2, 5});
      padding[1] = true;
      args.key_padding_mask = padding;
      r = m.forward(query, nan_key, value, args);
      for (int64_t l = 0; l < 3; ++l)
        for (int64_t n = 0; n < 2; ++n)
          for (int64_t e = 0; e < 4; ++e)
            EXPECT_EQ(std::isnan(r.output[(l * 2 + n) * 4 + e]), n == 0) << l << " " << n;
    }
  });
}

// ------------------------------------------------------------------------------------------
// Every key masked for every query, by key_padding_mask, a bool attn_mask or a float attn_mask
// of −inf: the attention is 0 (PyTorch's need_weights=True path gives NaN here; mha gives 0 on
// every path, as PyTorch's SDPA path does: README), so each output row is out_proj.bias, the
// weights are 0 and every gradient is 0 except out_proj.bias's, which is Σ grad_output.
TEST(MultiheadAttentionNumerics, EveryKeyMaskedGivesTheBiasAndZeroGradients) {
  for_every_backend([]<class T>(attention::Backend backend, double tol) {
    MultiheadAttention<T> m = random_module<T>(backend, 5);
    Generator gen(6);
    const Tensor<T> query = random_tensor<T>({3, 2, 4}, gen), key = random_tensor<T>({5, 2, 4}, gen);
    const Tensor<T> value = random_tensor<T>({5, 2, 4}, gen);
    const Tensor<T> bias = parameter(m, "out_proj.bias");
    for (int way = 0; way < 3; ++way) {
      SCOPED_TRACE(way == 0 ? "key_padding_mask" : way == 1 ? "bool attn_mask" : "float attn_mask");
      MultiheadAttentionArgs<T> args;
      if (way == 0) args.key_padding_mask = Tensor<bool>({2, 5}, true);
      if (way == 1) args.attn_mask = Tensor<bool>({3, 5}, true);
      if (way == 2) args.attn_mask = Tensor<T>({3, 5}, -std::numeric_limits<T>::infinity());
      MultiheadAttentionCache<T> cache;
      const auto r = m.forward(query, key, value, args, &cache);
      for (int64_t row = 0; row < 6; ++row)
        for (int64_t e = 0; e < 4; ++e) EXPECT_NEAR(static_cast<double>(r.output[row * 4 + e]), bias[e], tol);
      expect_all(*r.attn_weights, T(0), "attn_weights");
      m.zero_grad();
      const auto g = m.backward(Tensor<T>({3, 2, 4}, T(1)), cache);
      expect_all(g.grad_query, T(0), "grad_query");
      expect_all(g.grad_key, T(0), "grad_key");
      expect_all(g.grad_value, T(0), "grad_value");
      expect_all(parameter(m, "in_proj_weight", true), T(0), "grad in_proj_weight");
      expect_all(parameter(m, "out_proj.weight", true), T(0), "grad out_proj.weight");
      expect_values(parameter(m, "out_proj.bias", true), {4}, {6, 6, 6, 6}, tol, "grad out_proj.bias");
    }
  });
}

// ------------------------------------------------------------------------------------------
// Zero-length sequences, with PyTorch's results (2.15, E = 4, 2 heads, (L, N, S)):
//   S = 0:  output (3, 2, 4) with every row out_proj.bias, weights (2, 3, 0); grad_query 0
//   L = 0:  output (0, 2, 4), weights (2, 0, 3)
//   N = 0:  output (3, 0, 4), weights (0, 3, 3)
//   unbatched S = 0: output (3, 4), rows out_proj.bias, weights (3, 0)
// With no keys there is nothing to attend to: the attention is 0 and the output is the bias.
TEST(MultiheadAttentionNumerics, ZeroLengthSequencesGivePyTorchsShapesAndValues) {
  for_every_backend([]<class T>(attention::Backend backend, double tol) {
    MultiheadAttention<T> m = random_module<T>(backend, 7);
    const Tensor<T> bias = parameter(m, "out_proj.bias");
    struct Case {
      Shape query, key, output, weights;
    };
    for (const Case& c :
         {Case{{3, 2, 4}, {0, 2, 4}, {3, 2, 4}, {2, 3, 0}}, Case{{0, 2, 4}, {3, 2, 4}, {0, 2, 4}, {2, 0, 3}},
          Case{{3, 0, 4}, {3, 0, 4}, {3, 0, 4}, {0, 3, 3}}, Case{{3, 4}, {0, 4}, {3, 4}, {3, 0}}}) {
      SCOPED_TRACE("query " + to_string(c.query) + ", key " + to_string(c.key));
      Tensor<T> query(c.query, T(0.5)), key(c.key, T(-0.25));
      MultiheadAttentionCache<T> cache;
      const auto r = m.forward(query, key, key, {}, &cache);
      EXPECT_EQ(r.output.shape(), c.output);
      EXPECT_EQ(r.attn_weights->shape(), c.weights);
      if (c.key[0] == 0)
        for (int64_t i = 0; i < r.output.numel(); ++i)
          EXPECT_NEAR(static_cast<double>(r.output[i]), bias[i % 4], tol);
      m.zero_grad();
      const Tensor<T> grad_output(c.output, T(1));
      const auto g = m.backward(grad_output, cache);
      EXPECT_EQ(g.grad_query.shape(), c.query);
      EXPECT_EQ(g.grad_key.shape(), c.key);
      EXPECT_EQ(g.grad_value.shape(), c.key);
      expect_all(g.grad_query, T(0), "grad_query");
      // d out_proj.bias = Σ grad_output over every output row.
      const double rows = static_cast<double>(grad_output.numel() / 4);
      expect_values(parameter(m, "out_proj.bias", true), {4}, {rows, rows, rows, rows}, tol,
                    "grad out_proj.bias");
    }
    // add_bias_kv with no keys: the one learned key is all there is, so every row attends to it
    // alone and the output is out_proj(bias_v) = out_proj.weight · bias_v + out_proj.bias.
    MultiheadAttentionOptions with_bias_kv = options(4, 2);
    with_bias_kv.add_bias_kv = true;
    MultiheadAttention<T> b(with_bias_kv, 0);
    b.backend = backend;
    b.eval();
    randomise(b, 8);
    const Tensor<T> w = parameter(b, "out_proj.weight"), ob = parameter(b, "out_proj.bias"),
                    bv = parameter(b, "bias_v");
    const auto r = b.forward(Tensor<T>({2, 1, 4}, T(0.5)), Tensor<T>({0, 1, 4}), Tensor<T>({0, 1, 4}));
    ASSERT_EQ(r.output.shape(), (Shape{2, 1, 4}));
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t e = 0; e < 4; ++e) {
        double expected = ob[e];
        for (int64_t d = 0; d < 4; ++d)
          expected += static_cast<double>(w[e * 4 + d]) * static_cast<double>(bv[d]);
        EXPECT_NEAR(static_cast<double>(r.output[l * 4 + e]), expected, tol * 10) << l << " " << e;
      }
  });
}

// ------------------------------------------------------------------------------------------
// Sizes whose product overflows: an empty batch of 2^62 sequences with a 3-D attn_mask, which
// must hold N·num_heads = 2^63 masks.
TEST(MultiheadAttentionNumerics, SizesWhoseProductsOverflowAreRefused) {
  MultiheadAttention<double> m(options(4, 2), 0);
  const int64_t n = int64_t{1} << 62;
  const Tensor<double> query({0, n, 4}), key({0, n, 4});
  MultiheadAttentionArgs<double> args;
  args.attn_mask = Tensor<bool>({1, 0, 0});
  expect_error([&] { m.forward(query, key, key, args); },
               "attn_mask: N*num_heads: number of elements overflows 64 bits");
  // Widths beyond what the projections can index are refused when the module is made.
  expect_error([] { (void)MultiheadAttention<double>(options(int64_t{1} << 40, 1), 0); },
               "MultiheadAttention: embed_dim: expected 1 to");
}

}  // namespace
}  // namespace mha::nn
