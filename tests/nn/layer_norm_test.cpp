#include <gtest/gtest.h>

#include <cmath>

#include "../support/gradient_check.h"
#include "../support/assertions.h"
#include "mha/nn/layer_norm.h"

namespace {

using mha::Generator;
using mha::Shape;
using mha::Tensor;
using mha::nn::LayerNorm;
using namespace mha::testing;

struct Config {
  bool affine;
  bool bias;
};

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  Generator gen(17);
  const Config configs[] = {{true, true}, {true, false}, {false, false}};
  for (int trial = 0; trial < 18; ++trial) {
    const Config c = configs[trial % 3];
    const int64_t norm_rank = 1 + trial % 2;    // 1 or 2 trailing dims
    const int64_t lead_rank = (trial / 2) % 3;  // 0..2 leading dims
    const Shape norm = random_shape(gen, norm_rank, 1, 7);
    Shape shape = random_shape(gen, lead_rank, 1, 7);
    shape.insert(shape.end(), norm.begin(), norm.end());
    LayerNorm<double> layer(norm, 1e-5, c.affine, c.bias);
    // Non-trivial parameters, so their gradients and the input gradient through them are tested.
    if (c.affine) layer.weight = random_tensor(norm, gen, 0.5, 1.5);
    if (c.bias) layer.bias = random_tensor(norm, gen);
    const Tensor<double> x = random_tensor(shape, gen, -2, 2);
    const Tensor<double> g = random_tensor(shape, gen);
    SCOPED_TRACE("x " + mha::to_string(shape) + ", normalized_shape " + mha::to_string(norm) +
                 (c.affine ? ", affine" : "") + (c.bias ? ", bias" : ""));

    LayerNorm<double>::Cache cache;
    const Tensor<double> y = layer.forward(x, &cache);
    EXPECT_EQ(y.shape(), shape);
    const Tensor<double> grad_x = layer.backward(g, cache);
    EXPECT_TRUE(
        check_gradient([&](const Tensor<double>& v) { return layer.forward(v); }, x, g, grad_x))
        << "input";
    if (c.affine) {
      EXPECT_TRUE(check_gradient(replacing(layer.weight, [&] { return layer.forward(x); }),
                                 layer.weight, g, layer.grad_weight))
          << "weight";
    }
    if (c.bias) {
      EXPECT_TRUE(check_gradient(replacing(layer.bias, [&] { return layer.forward(x); }),
                                 layer.bias, g, layer.grad_bias))
          << "bias";
    }
  }
}

TEST(LayerNorm, NormalisesToZeroMeanUnitBiasedVariance) {
  Generator gen(2);
  LayerNorm<double> layer(Shape{3, 4}, 0.0);
  const Tensor<double> x = random_tensor({5, 3, 4}, gen, -3, 7);
  const Tensor<double> y = layer.forward(x);
  for (int64_t g = 0; g < 5; ++g) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < 12; ++i) mean += y[g * 12 + i];
    mean /= 12;
    for (int64_t i = 0; i < 12; ++i) var += (y[g * 12 + i] - mean) * (y[g * 12 + i] - mean);
    var /= 12;  // biased
    EXPECT_NEAR(mean, 0.0, 1e-12);
    EXPECT_NEAR(var, 1.0, 1e-12);
  }
}

TEST(LayerNorm, HandComputedValues) {
  // x = [1, 2, 3, 4]: mean 2.5, biased var 1.25.
  LayerNorm<double> layer(4, 1e-5);
  layer.weight = Tensor<double>({4}, {1.0, 2.0, 3.0, 4.0});
  layer.bias = Tensor<double>({4}, {0.5, 0.5, 0.5, 0.5});
  const Tensor<double> y = layer.forward(Tensor<double>({1, 4}, {1.0, 2.0, 3.0, 4.0}));
  const double r = 1.0 / std::sqrt(1.25 + 1e-5);
  const double expected[] = {-1.5 * r * 1 + 0.5, -0.5 * r * 2 + 0.5, 0.5 * r * 3 + 0.5,
                             1.5 * r * 4 + 0.5};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], expected[i], 1e-14);
}

TEST(LayerNorm, SingleElementGroupsGiveBias) {
  LayerNorm<double> layer(1);
  layer.bias[0] = 0.25;
  const Tensor<double> y = layer.forward(Tensor<double>({3, 1}, {1.0, -5.0, 9.0}));
  for (int64_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(y[i], 0.25);
  LayerNorm<double>::Cache cache;
  layer.forward(Tensor<double>({3, 1}, {1.0, -5.0, 9.0}), &cache);
  const Tensor<double> gx = layer.backward(Tensor<double>({3, 1}, 1.0), cache);
  for (int64_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(gx[i], 0.0);
}

TEST(LayerNorm, InitAndParameterNames) {
  LayerNorm<float> layer(Shape{2, 3});
  auto p = layer.parameters();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].name, "weight");
  EXPECT_EQ(p[1].name, "bias");
  EXPECT_EQ(p[0].value->shape(), (Shape{2, 3}));
  for (float v : layer.weight.values()) EXPECT_EQ(v, 1.0f);
  for (float v : layer.bias.values()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(LayerNorm<float>(4, 1e-5, true, false).parameters().size(), 1u);
  EXPECT_EQ(LayerNorm<float>(4, 1e-5, false).parameters().size(), 0u);
  EXPECT_EQ(LayerNorm<float>({2, 3}).normalized_shape(), (Shape{2, 3}));
  EXPECT_EQ(LayerNorm<float>({5}).normalized_shape(), (Shape{5}));
}

TEST(LayerNorm, FloatMatchesDouble) {
  Generator gen(6);
  const Tensor<double> x = random_tensor({4, 9}, gen, -3, 3);
  LayerNorm<float> lf(9);
  LayerNorm<double> ld(9);
  EXPECT_TRUE(all_close(lf.forward(mha::cast<float>(x)), ld.forward(x), 1e-5, 1e-5));
  // Large offsets: the two-pass double accumulation keeps float accurate.
  Tensor<double> shifted = x;
  for (double& v : shifted.values()) v += 1000.0;
  EXPECT_TRUE(all_close(lf.forward(mha::cast<float>(shifted)), ld.forward(shifted), 1e-3, 1e-3));
}

// bfloat16 widens what it reads and computes in double as LayerNorm<double> does: its forward is
// the double layer's result on the same values rounded once, bit for bit. Its backward reads the
// normalised input from a float cache (the double layer's is double), so each gradient may differ
// from the double one rounded by one bfloat16 unit in the last place (2⁻⁷ relative), no more;
// likewise the parameter gradients, summed in double then rounded through float.
TEST(LayerNorm, Bfloat16IsTheDoubleLayerRoundedOnce) {
  Generator gen(41);
  for (const Config c : {Config{true, true}, Config{true, false}, Config{false, false}}) {
    const Shape norm{48};
    LayerNorm<double> wide(norm, 1e-5, c.affine, c.bias);
    LayerNorm<mha::bfloat16> half(norm, 1e-5, c.affine, c.bias);
    if (c.affine) half.weight = mha::cast<mha::bfloat16>(random_tensor(norm, gen, 0.5, 1.5));
    if (c.bias) half.bias = mha::cast<mha::bfloat16>(random_tensor(norm, gen));
    if (c.affine) wide.weight = mha::cast<double>(half.weight);
    if (c.bias) wide.bias = mha::cast<double>(half.bias);
    const Tensor<mha::bfloat16> x = mha::cast<mha::bfloat16>(random_tensor({5, 48}, gen, -3, 3));
    const Tensor<mha::bfloat16> g = mha::cast<mha::bfloat16>(random_tensor({5, 48}, gen));
    LayerNorm<mha::bfloat16>::Cache half_cache;
    LayerNorm<double>::Cache wide_cache;
    const Tensor<mha::bfloat16> y = half.forward(x, &half_cache);
    const Tensor<double> want = wide.forward(mha::cast<double>(x), &wide_cache);
    for (int64_t i = 0; i < y.numel(); ++i)
      ASSERT_EQ(y[i].bits, mha::to_bfloat16(want[i]).bits) << "forward, element " << i;
    auto within_one_unit = [](const Tensor<mha::bfloat16>& got, const Tensor<double>& exact, const char* what) {
      for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_LE(std::abs(mha::to_float(got[i]) - exact[i]), std::ldexp(std::abs(exact[i]), -7) + 1e-30)
            << what << ", element " << i;
    };
    within_one_unit(half.backward(g, half_cache), wide.backward(mha::cast<double>(g), wide_cache), "grad_input");
    if (c.affine) within_one_unit(half.grad_weight, wide.grad_weight, "grad_weight");
    if (c.bias) within_one_unit(half.grad_bias, wide.grad_bias, "grad_bias");
    if (c.affine) {
      LayerNorm<mha::bfloat16> fresh(norm);
      EXPECT_EQ(mha::to_float(fresh.weight[0]), 1.0f);  // initialised to 1, not to the bits 0x0001
    }
  }
}

TEST(LayerNorm, BadInputsThrowTellingErrors) {
  LayerNorm<double> layer(Shape{3, 4});
  EXPECT_TRUE(throws_error(
      [&] {
        layer.forward(Tensor<double>({2, 4, 3}));
      },
      {"LayerNorm: input: expected trailing dimensions [3, 4] (normalized_shape), got shape [2, 4, "
       "3]"}));
  EXPECT_TRUE(throws_error([&] { layer.forward(Tensor<double>({4})); },
                           {"LayerNorm: input", "[3, 4]", "got shape [4]"}));
  EXPECT_TRUE(
      throws_error([&] { layer.forward(Tensor<double>()); }, {"LayerNorm: input", "undefined"}));
  EXPECT_TRUE(
      throws_error([] { LayerNorm<double>(Shape{}); }, {"LayerNorm: normalized_shape", "got []"}));
  EXPECT_TRUE(throws_error(
      [] {
        LayerNorm<double>(Shape{3, 0});
      },
      {"LayerNorm: normalized_shape: expected dimensions >= 1, got [3, 0]"}));
  EXPECT_TRUE(throws_error([] { LayerNorm<double>(4, -1.0); },
                           {"LayerNorm: eps: expected a finite value >= 0, got -1"}));
  EXPECT_TRUE(throws_error([] { LayerNorm<double>(4, NAN); }, {"LayerNorm: eps"}));
  LayerNorm<double>::Cache cache;
  EXPECT_TRUE(throws_error(
      [&] {
        layer.backward(Tensor<double>({3, 4}), cache);
      },
      {"LayerNorm::backward: cache", "empty cache"}));
  layer.forward(Tensor<double>({2, 3, 4}), &cache);
  EXPECT_TRUE(throws_error(
      [&] {
        layer.backward(Tensor<double>({3, 4}), cache);
      },
      {"LayerNorm::backward: grad_output: expected shape [2, 3, 4], got [3, 4]"}));
  layer.weight = Tensor<double>({12});
  EXPECT_TRUE(throws_error(
      [&] {
        layer.forward(Tensor<double>({3, 4}));
      },
      {"LayerNorm: weight: expected shape [3, 4], got [12]"}));
}

}  // namespace
