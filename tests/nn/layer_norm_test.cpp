#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../support/gradient_check.h"
#include "../support/assertions.h"
#include "mha/core/simd.h"
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

// float and bfloat16 run a vectorised kernel whose sums take one fixed order (eight partial sums)
// on every SIMD target: each target gives the first's bits, forward and cache, for groups whose
// size is and is not a multiple of a vector (the scalar tail), inputs of both signs and with an
// offset (values that cancel), without and with weight and bias. And each is the double layer's
// result rounded once: bfloat16 bit for bit, float within half a unit in the last place (plus
// 2⁻⁴⁰ relative: the double sums' order differs from the double layer's index order).
TEST(LayerNorm, EveryTargetGivesTheSameBits) {
  Generator gen(43);
  for (const Config c : {Config{true, true}, Config{false, false}}) {
    for (const int64_t n : {int64_t{5}, int64_t{45}, int64_t{384}, int64_t{387}}) {
      const Shape norm{n};
      LayerNorm<double> wide(norm, 1e-5, c.affine, c.bias);
      LayerNorm<float> single(norm, 1e-5, c.affine, c.bias);
      LayerNorm<mha::bfloat16> half(norm, 1e-5, c.affine, c.bias);
      if (c.affine) single.weight = mha::cast<float>(random_tensor(norm, gen, 0.5, 1.5));
      if (c.bias) single.bias = mha::cast<float>(random_tensor(norm, gen));
      if (c.affine) wide.weight = mha::cast<double>(single.weight);
      if (c.bias) wide.bias = mha::cast<double>(single.bias);
      Tensor<double> x = random_tensor({7, n}, gen, -3, 3);
      for (int64_t i = 3 * n; i < 4 * n; ++i) x[i] += 100.0;  // a row far from 0
      const Tensor<float> xf = mha::cast<float>(x);
      const Tensor<double> want = wide.forward(mha::cast<double>(xf));
      for (int64_t i = 0; i < want.numel(); ++i) {
        const double ulp = std::ldexp(1.0, std::ilogb(want[i]) - 23);
        ASSERT_LE(std::abs(single.forward(xf)[i] - want[i]), ulp / 2 + std::abs(want[i]) * 0x1p-40) << "float, element " << i;
      }
      if (c.affine) half.weight = mha::cast<mha::bfloat16>(single.weight);
      if (c.bias) half.bias = mha::cast<mha::bfloat16>(single.bias);
      if (c.affine) wide.weight = mha::cast<double>(half.weight);
      if (c.bias) wide.bias = mha::cast<double>(half.bias);
      const Tensor<mha::bfloat16> xh = mha::cast<mha::bfloat16>(x);
      const Tensor<double> want_half = wide.forward(mha::cast<double>(xh));
      std::vector<float> first_float, first_cache;
      std::vector<uint16_t> first_half;
      for (const std::string& target : mha::simd_targets()) {
        const mha::ScopedSimdTarget pin(target);
        SCOPED_TRACE(target + ", n " + std::to_string(n) + (c.affine ? ", affine" : ""));
        LayerNorm<float>::Cache cache;
        const Tensor<float> yf = single.forward(xf, &cache);
        const Tensor<mha::bfloat16> yh = half.forward(xh);
        std::vector<float> got_float(yf.data(), yf.data() + yf.numel());
        std::vector<float> got_cache(cache.normalized.data(), cache.normalized.data() + cache.normalized.numel());
        got_cache.insert(got_cache.end(), cache.rstd.data(), cache.rstd.data() + cache.rstd.numel());
        std::vector<uint16_t> got_half;
        for (int64_t i = 0; i < yh.numel(); ++i) {
          got_half.push_back(yh[i].bits);
          ASSERT_EQ(yh[i].bits, mha::to_bfloat16(want_half[i]).bits) << "bfloat16, element " << i;
        }
        if (first_float.empty()) {
          first_float = got_float, first_cache = got_cache, first_half = got_half;
          continue;
        }
        for (size_t i = 0; i < got_float.size(); ++i) ASSERT_EQ(got_float[i], first_float[i]) << "float, element " << i;
        for (size_t i = 0; i < got_cache.size(); ++i) ASSERT_EQ(got_cache[i], first_cache[i]) << "cache, element " << i;
        EXPECT_EQ(got_half, first_half);
      }
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
