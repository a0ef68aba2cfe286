#include <gtest/gtest.h>

#include <cmath>

#include "../support/gradient_check.h"
#include "../support/assertions.h"
#include "mha/nn/embedding.h"

namespace {

using mha::Generator;
using mha::Shape;
using mha::Tensor;
using mha::nn::Embedding;
using namespace mha::testing;

Tensor<int64_t> random_indices(const Shape& shape, int64_t num, Generator& gen) {
  Tensor<int64_t> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = random_int(gen, 0, num - 1);
  return t;
}

TEST(Embedding, ForwardGathersRows) {
  Generator gen(1);
  Embedding<double> layer(10, 3, gen);
  const Tensor<int64_t> idx({2, 2}, {4, 0, 9, 4});
  const Tensor<double> y = layer.forward(idx);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 3}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(y[i * 3 + j], layer.weight[idx[i] * 3 + j]);
  // Rank-0 indices give one row.
  const Tensor<double> one = layer.forward(Tensor<int64_t>(Shape{}, 7));
  ASSERT_EQ(one.shape(), (Shape{3}));
  EXPECT_EQ(one[2], layer.weight[7 * 3 + 2]);
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  Generator gen(41);
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t num = random_int(gen, 1, 7);
    const int64_t dim = random_int(gen, 1, 7);
    std::optional<int64_t> pad;
    if (trial % 2 == 1) pad = random_int(gen, 0, num - 1);
    Embedding<double> layer(num, dim, pad, gen);
    const Tensor<int64_t> idx = random_indices(random_shape(gen, trial % 4), num, gen);
    Shape out_shape = idx.shape();
    out_shape.push_back(dim);
    const Tensor<double> g = random_tensor(out_shape, gen);
    Embedding<double>::Cache cache;
    EXPECT_EQ(layer.forward(idx, &cache).shape(), out_shape);
    layer.backward(g, cache);
    // The padding row gets no gradient (PyTorch), so the analytic gradient differs from the
    // finite difference there: compare the other rows, and check the padding row is zero.
    Tensor<double> numeric = numerical_gradient(
        replacing(layer.weight, [&] { return layer.forward(idx); }), layer.weight, g);
    if (pad) {
      for (int64_t j = 0; j < dim; ++j) {
        EXPECT_EQ(layer.grad_weight[*pad * dim + j], 0.0);
        numeric[*pad * dim + j] = 0.0;
      }
    }
    EXPECT_TRUE(gradients_close(layer.grad_weight, numeric))
        << "indices " << mha::to_string(idx.shape()) << ", num " << num << ", dim " << dim;
  }
}

TEST(Embedding, RepeatedIndicesAccumulate) {
  Generator gen(2);
  Embedding<double> layer(4, 2, 1, gen);
  const Tensor<int64_t> idx({5}, {3, 3, 1, 0, 3});
  Embedding<double>::Cache cache;
  layer.forward(idx, &cache);
  const Tensor<double> g({5, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  layer.backward(g, cache);
  const double expected[] = {7, 8, 0, 0, 0, 0, 1 + 3 + 9, 2 + 4 + 10};
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(layer.grad_weight[i], expected[i]);
  layer.backward(g, cache);  // accumulates
  EXPECT_DOUBLE_EQ(layer.grad_weight[6], 26.0);
}

TEST(Embedding, InitIsStandardNormalWithZeroPaddingRow) {
  Generator gen(77);
  const int64_t num = 1000, dim = 128;
  Embedding<double> layer(num, dim, -1, gen);  // negative padding_idx counts from the end
  ASSERT_EQ(layer.padding_idx(), std::optional<int64_t>(num - 1));
  for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(layer.weight[(num - 1) * dim + j], 0.0);
  const int64_t n = (num - 1) * dim;
  double mean = 0, sq = 0, fourth = 0;
  int64_t beyond3 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = layer.weight[i];
    mean += v;
    sq += v * v;
    fourth += v * v * v * v;
    beyond3 += std::abs(v) > 3;
  }
  const double dn = static_cast<double>(n);
  mean /= dn;
  const double var = sq / dn - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5 / std::sqrt(dn));
  EXPECT_NEAR(var, 1.0, 5 * std::sqrt(2.0 / dn));           // Var(v²) = 2 for N(0, 1)
  EXPECT_NEAR(fourth / dn, 3.0, 5 * std::sqrt(96.0 / dn));  // E v⁴ = 3, Var(v⁴) = 96
  // P(|v| > 3) = 0.0027 for a normal (and 0 for a uniform of the same variance).
  EXPECT_NEAR(static_cast<double>(beyond3) / dn, 0.0027, 5 * std::sqrt(0.0027 / dn));
  auto p = layer.parameters();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].name, "weight");
}

TEST(Embedding, FloatMatchesDoubleForSameSeed) {
  Generator gf(5), gd(5);
  Embedding<float> ef(6, 4, gf);
  Embedding<double> ed(6, 4, gd);
  EXPECT_TRUE(all_close(ef.weight, ed.weight, 1e-6, 1e-6));
}

TEST(Embedding, BadInputsThrowTellingErrors) {
  Generator gen(0);
  Embedding<double> layer(10, 3, gen);
  EXPECT_TRUE(throws_error(
      [&] {
        layer.forward(Tensor<int64_t>({3}, {1, 12, 2}));
      },
      {"Embedding: input: index 12 at position 1", "out of range [0, 10)"}));
  EXPECT_TRUE(throws_error(
      [&] {
        layer.forward(Tensor<int64_t>({2}, {-1, 2}));
      },
      {"index -1", "out of range [0, 10)"}));
  EXPECT_TRUE(
      throws_error([&] { layer.forward(Tensor<int64_t>()); }, {"Embedding: input", "undefined"}));
  EXPECT_TRUE(throws_error([&] { Embedding<double>(5, 2, 5, gen); },
                           {"Embedding: padding_idx: expected a value in [-5, 5)", "got 5"}));
  EXPECT_TRUE(throws_error([&] { Embedding<double>(5, 2, -6, gen); },
                           {"Embedding: padding_idx", "got -6"}));
  EXPECT_TRUE(throws_error([&] { Embedding<double>(-1, 2, gen); },
                           {"Embedding: num_embeddings: expected >= 0, got -1"}));
  EXPECT_TRUE(throws_error([&] { Embedding<double>(3, -2, gen); },
                           {"Embedding: embedding_dim: expected >= 0, got -2"}));
  Embedding<double>::Cache cache;
  EXPECT_TRUE(throws_error(
      [&] {
        layer.backward(Tensor<double>({2, 3}), cache);
      },
      {"Embedding::backward: cache", "empty cache"}));
  layer.forward(Tensor<int64_t>({2, 2}, {1, 2, 3, 4}), &cache);
  EXPECT_TRUE(throws_error(
      [&] {
        layer.backward(Tensor<double>({2, 3}), cache);
      },
      {"Embedding::backward: grad_output: expected shape [2, 2, 3], got [2, 3]"}));
}

// bfloat16: the forward copies rows (bit for bit); the backward adds each gradient row in float and
// rounds the sum (2⁻⁸ relative per addition: an index seen c times is within c·2⁻⁸·Σ|g| of the
// exact sum of its rows); padding_idx gets nothing.
TEST(Embedding, Bfloat16) {
  using mha::bfloat16;
  Generator gen(12);
  Embedding<bfloat16> emb(7, 5, 3, gen);
  const Tensor<int64_t> idx({6}, {1, 4, 1, 3, 1, 6});
  Embedding<bfloat16>::Cache cache;
  const Tensor<bfloat16> y = emb.forward(idx, &cache);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 5; ++j) ASSERT_EQ(y[i * 5 + j].bits, emb.weight[idx[i] * 5 + j].bits);
  const Tensor<bfloat16> g = mha::cast<bfloat16>(random_tensor({6, 5}, gen, -1, 1));
  emb.backward(g, cache);
  for (int64_t row = 0; row < 7; ++row)
    for (int64_t j = 0; j < 5; ++j) {
      double exact = 0, magnitude = 0;
      int count = 0;
      for (int64_t i = 0; i < 6; ++i)
        if (idx[i] == row && row != 3) exact += mha::to_float(g[i * 5 + j]), magnitude += std::abs(mha::to_float(g[i * 5 + j])), ++count;
      EXPECT_LE(std::abs(mha::to_float(emb.grad_weight[row * 5 + j]) - exact), count * std::ldexp(magnitude, -8))
          << "row " << row << ", column " << j;
    }
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(mha::to_float(emb.weight[3 * 5 + j]), 0.0f);  // padding_idx
}

}  // namespace
