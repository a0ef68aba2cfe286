#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/gradient_check.h"
#include "mha/core/simd.h"
#include "mha/nn/gelu.h"
#include "mha/nn/relu.h"

namespace {

using mha::Generator;
using mha::Shape;
using mha::Tensor;
using mha::nn::GELU;
using mha::nn::GeluApproximation;
using mha::nn::ReLU;
using namespace mha::testing;

// Random values kept away from 0 by at least 1e-3, so ReLU's kink is never inside [x − h, x + h].
Tensor<double> away_from_zero(const Shape& shape, Generator& gen) {
  Tensor<double> x = random_tensor(shape, gen, -3, 3);
  for (double& v : x.values())
    if (std::abs(v) < 1e-3) v = v < 0 ? -0.5 : 0.5;
  return x;
}

TEST(ReLU, ValuesAndGradientAtZero) {
  const Tensor<double> x({5}, {-2.0, -0.0, 0.0, 1e-300, 3.5});
  const Tensor<double> y = mha::nn::relu(x);
  const double expected[] = {0, 0, 0, 1e-300, 3.5};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(y[i], expected[i]);
  const Tensor<double> g = mha::nn::relu_backward(x, Tensor<double>({5}, 1.0));
  const double expected_g[] = {0, 0, 0, 1, 1};  // PyTorch: gradient 0 at x == 0
  for (int i = 0; i < 5; ++i) EXPECT_EQ(g[i], expected_g[i]);
}

// PyTorch: relu(NaN) = NaN (clamp_min), and threshold_backward passes the gradient where the
// output is not <= 0, NaN included; ±inf as any number.
TEST(ReLU, NaNAndInfinityAsPyTorch) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor<double> x({3}, {nan, inf, -inf});
  const Tensor<double> y = mha::nn::relu(x);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], inf);
  EXPECT_EQ(y[2], 0.0);
  const Tensor<double> g = mha::nn::relu_backward(x, Tensor<double>({3}, 2.0));
  EXPECT_EQ(g[0], 2.0);
  EXPECT_EQ(g[1], 2.0);
  EXPECT_EQ(g[2], 0.0);
  // bfloat16 the same.
  const Tensor<mha::bfloat16> yh =
      mha::nn::relu(Tensor<mha::bfloat16>({1}, mha::to_bfloat16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(mha::widen(yh[0])));
}

TEST(ReLU, GradientsMatchFiniteDifferences) {
  Generator gen(51);
  ReLU<double> layer;
  EXPECT_TRUE(layer.parameters().empty());
  for (int trial = 0; trial < 8; ++trial) {
    const Tensor<double> x = away_from_zero(random_shape(gen, trial % 5), gen);  // ranks 0..4
    const Tensor<double> g = random_tensor(x.shape(), gen);
    ReLU<double>::Cache cache;
    layer.forward(x, &cache);
    EXPECT_TRUE(check_gradient([&](const Tensor<double>& v) { return layer.forward(v); }, x, g,
                               layer.backward(g, cache)))
        << "shape " << mha::to_string(x.shape());
  }
}

TEST(GELU, KnownValues) {
  // Reference values: x·Φ(x) and the tanh formula, evaluated independently here.
  const Tensor<double> x({5}, {-3.0, -1.0, 0.0, 0.5, 2.0});
  const Tensor<double> exact = mha::nn::gelu(x);
  const Tensor<double> approx = mha::nn::gelu(x, GeluApproximation::tanh);
  for (int64_t i = 0; i < 5; ++i) {
    const double v = x[i];
    EXPECT_NEAR(exact[i], v * 0.5 * std::erfc(-v / std::sqrt(2.0)), 1e-15);
    const double t = std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v));
    EXPECT_NEAR(approx[i], 0.5 * v * (1 + t), 1e-15);
  }
  EXPECT_NEAR(exact[3], 0.34573123063700656, 1e-15);   // 0.5·Φ(0.5)
  EXPECT_NEAR(exact[1], -0.15865525393145705, 1e-15);  // −Φ(−1)
}

TEST(GELU, GradientsMatchFiniteDifferences) {
  Generator gen(61);
  for (auto a : {GeluApproximation::none, GeluApproximation::tanh}) {
    GELU<double> layer(a);
    EXPECT_TRUE(layer.parameters().empty());
    for (int trial = 0; trial < 8; ++trial) {
      const Tensor<double> x = random_tensor(random_shape(gen, trial % 5), gen, -4, 4);
      const Tensor<double> g = random_tensor(x.shape(), gen);
      GELU<double>::Cache cache;
      layer.forward(x, &cache);
      EXPECT_TRUE(check_gradient([&](const Tensor<double>& v) { return layer.forward(v); }, x, g,
                                 layer.backward(g, cache)))
          << mha::nn::gelu_approximation_name(a) << ", shape " << mha::to_string(x.shape());
    }
  }
}

// The float exact GELU is vectorised (SLEEF's erfc on AVX-512 and AVX2, the scalar formula on
// other targets and in each call's tail). On every target this CPU runs, each value is within
// 4 ULP of the scalar float formula x · (0.5 · erfc(x · (−1/√2))) with glibc's erfcf (SLEEF's
// erfcf is within 1.5 ULP, glibc's within 1, the two products add 1), down to where the value
// leaves float's normal range. (Against x·Φ(x) in double the float formula itself is off by up to
// ~1e-5 relative in the far left tail, x < −10: erfc's argument is rounded to float first and
// erfc is steep there, d ln erfc(t)/dt ≈ −2t; FloatMatchesDouble bounds it on [−5, 5].)
// The sizes cover empty, partial vectors and several threads' chunks; ±inf and NaN give what the
// double formula gives.
TEST(GELU, VectorisedFloatIsWithinFourUlpOfTheScalarFormulaOnEveryTarget) {
  std::vector<float> values;
  for (double v = -14.0; v <= 14.0; v += 1.0 / 64) values.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, -1e-8f, 30.0f, -30.0f, 1e30f, -1e30f}) values.push_back(v);
  Generator gen(17);
  const Tensor<double> random = random_tensor({40000}, gen, -9, 9);  // > 2 chunks of 16 Ki
  for (int64_t i = 0; i < random.numel(); ++i) values.push_back(static_cast<float>(random[i]));
  for (const std::string& target : mha::simd_targets()) {
    mha::ScopedSimdTarget pin(target);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{17}, static_cast<int64_t>(values.size())}) {
      Tensor<float> x({n});
      for (int64_t i = 0; i < n; ++i) x[i] = values[static_cast<size_t>(i)];
      const Tensor<float> y = mha::nn::gelu(x);
      ASSERT_EQ(y.shape(), x.shape());
      for (int64_t i = 0; i < n; ++i) {
        const double want = x[i] * (0.5f * std::erfc(x[i] * -0.70710678118654752440f));
        const double ulp = std::max(std::abs(want) * std::numeric_limits<float>::epsilon(),
                                    static_cast<double>(std::numeric_limits<float>::min()));
        ASSERT_LE(std::abs(y[i] - want), 4 * ulp)
            << "target " << target << ", x = " << x[i] << ": got " << y[i] << ", want " << want;
      }
    }
    const float inf = std::numeric_limits<float>::infinity();
    const Tensor<float> special({3}, {inf, -inf, std::nanf("")});
    const Tensor<float> got = mha::nn::gelu(special);
    const Tensor<double> want = mha::nn::gelu(mha::cast<double>(special));  // inf, NaN (−inf · 0), NaN
    for (int64_t i = 0; i < 3; ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << target << ", x = " << special[i];
      } else {
        EXPECT_EQ(got[i], want[i]) << target << ", x = " << special[i];
      }
    }
  }
}

// gelu_for_bfloat16 (the bfloat16 layers' GELU): each x rounded to bfloat16 (to nearest, ties to
// even), its exact GELU rounded to bfloat16 again, on every target:
// - for each of the 65 536 bfloat16s, the bfloat16 nearest to x·Φ(x) computed in long double (erfcl):
//   within half a unit of that value's binade, on the upper side of a tie;
// - a float x gives what to_bfloat16(x) gives (floats between bfloat16s, ties among them);
// - ±inf and NaN as the exact GELU gives them; the same bits whatever the split of a row.
TEST(GELU, ForBfloat16IsTheNearestBfloat16ToTheExactGeluOfTheRoundedInput) {
  std::vector<float> x;
  for (uint32_t bits = 0; bits < 65536; ++bits)
    x.push_back(mha::to_float(mha::bfloat16{static_cast<uint16_t>(bits)}));
  const auto n = static_cast<int64_t>(x.size());
  // Floats a quarter, a half (a tie) and three quarters of a unit past some bfloat16s.
  std::vector<float> between;
  for (double v = -14.0; v <= 14.0; v += 0.37)
    for (uint32_t quarter = 1; quarter < 4; ++quarter) {
      uint32_t bits = std::bit_cast<uint32_t>(mha::to_float(mha::to_bfloat16(static_cast<float>(v))));
      between.push_back(std::bit_cast<float>(bits + quarter * 0x4000u));
    }
  const float inf = std::numeric_limits<float>::infinity();
  const float special[5] = {inf, -inf, std::nanf(""), std::bit_cast<float>(0x7fffffffu),
                            std::bit_cast<float>(0xffffffffu)};
  for (const std::string& target : mha::simd_targets()) {
    mha::ScopedSimdTarget pin(target);
    std::vector<float> y(x.size());
    mha::nn::gelu_for_bfloat16(x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[static_cast<size_t>(i)], yi = y[static_cast<size_t>(i)];
      if (!std::isfinite(xi)) continue;  // below
      const long double exact = xi * 0.5L * std::erfc(-static_cast<long double>(xi) / std::sqrt(2.0L));
      ASSERT_EQ(std::bit_cast<uint32_t>(yi) & 0xffffu, 0u) << target << ": not a bfloat16, x = " << xi;
      // Half a unit of exact's binade [2^(e−1), 2^e): 2^(e−1)·2⁻⁸, at least half the smallest
      // subnormal's 2⁻¹³³ (0 for x = ±0, whose GELU is 0).
      int exponent = 0;
      std::frexp(exact, &exponent);
      const long double half_unit = exact == 0 ? 0.0L : std::ldexp(1.0L, std::max(exponent - 9, -134));
      const long double error = std::abs(yi - exact);
      ASSERT_LE(error, half_unit) << target << ", x = " << xi;
      // A tie in long double is x/2 where erfc rounds to 1 (tiny x); the exact GELU, x/2 + x·(Φ(x) − ½),
      // lies above it: the nearest bfloat16 is the upper one.
      if (error == half_unit && exact != 0) ASSERT_GT(yi, exact) << target << ", a tie, x = " << xi;
    }
    std::vector<float> from_floats(between.size()), expected(between.size());
    mha::nn::gelu_for_bfloat16(between.data(), from_floats.data(), static_cast<int64_t>(between.size()));
    for (size_t i = 0; i < between.size(); ++i) {
      const float rounded = mha::to_float(mha::to_bfloat16(between[i]));
      mha::nn::gelu_for_bfloat16(&rounded, &expected[i], 1);
      ASSERT_EQ(std::bit_cast<uint32_t>(from_floats[i]), std::bit_cast<uint32_t>(expected[i]))
          << target << ", x = " << between[i] << " (rounds to " << rounded << ")";
    }
    // In pieces of 7 (tails everywhere): the same bits as in one call, on every target's own run.
    std::vector<float> pieces(x.size());
    for (int64_t i = 0; i < n; i += 7) mha::nn::gelu_for_bfloat16(x.data() + i, pieces.data() + i, std::min<int64_t>(7, n - i));
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(pieces[static_cast<size_t>(i)]),
                std::bit_cast<uint32_t>(y[static_cast<size_t>(i)]))
          << target << ", x = " << x[static_cast<size_t>(i)];
    float out[5];
    mha::nn::gelu_for_bfloat16(special, out, 5);
    EXPECT_EQ(out[0], inf) << target;
    for (int k = 1; k < 5; ++k)
      EXPECT_TRUE(std::isnan(out[k])) << target << ", special " << k;  // −inf · 0, NaN
  }
}

// GELU on bfloat16: forward and backward computed in float from the widened values, each result
// rounded once (2⁻⁸ relative): within that and the float computation's own error (a few float units
// for tanh's forward and the derivatives) of the exact values; the exact GELU's forward is
// gelu_for_bfloat16's nearest bfloat16, within 2⁻⁸ alone.
TEST(GELU, Bfloat16) {
  Generator gen(19);
  const Tensor<mha::bfloat16> x = mha::cast<mha::bfloat16>(random_tensor({3, 700}, gen, -6, 6));
  const Tensor<mha::bfloat16> go = mha::cast<mha::bfloat16>(random_tensor({3, 700}, gen, -1, 1));
  for (GeluApproximation a : {GeluApproximation::none, GeluApproximation::tanh}) {
    const Tensor<mha::bfloat16> y = mha::nn::gelu(x, a), g = mha::nn::gelu_backward(x, go, a);
    const Tensor<double> y64 = mha::nn::gelu(mha::cast<double>(x), a);
    const Tensor<double> g64 = mha::nn::gelu_backward(mha::cast<double>(x), mha::cast<double>(go), a);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double a2 = std::pow(mha::to_float(x[i]), 2) / 2, u = std::ldexp(1.0, -24);
      const double float_error = a == GeluApproximation::none ? 1e-12 : 1.2e-7 + (5 * a2 + 16) * u;
      EXPECT_LE(std::abs(mha::to_float(y[i]) - y64[i]),
                (std::ldexp(1.0, -8) + float_error) * std::abs(y64[i]) + 1e-37)
          << mha::nn::gelu_approximation_name(a) << ", x = " << mha::to_float(x[i]);
      EXPECT_LE(std::abs(mha::to_float(g[i]) - g64[i]), (std::ldexp(1.0, -8) + 64 * u) * std::abs(g64[i]) + 1e-37)
          << mha::nn::gelu_approximation_name(a) << " backward, x = " << mha::to_float(x[i]);
    }
  }
}

TEST(GELU, FloatMatchesDouble) {
  Generator gen(3);
  const Tensor<double> x = random_tensor({50}, gen, -5, 5);
  for (auto a : {GeluApproximation::none, GeluApproximation::tanh}) {
    EXPECT_TRUE(all_close(mha::nn::gelu(mha::cast<float>(x), a), mha::nn::gelu(x, a), 1e-5, 1e-6));
    EXPECT_TRUE(all_close(mha::nn::gelu_backward(mha::cast<float>(x), mha::cast<float>(x), a),
                          mha::nn::gelu_backward(x, x, a), 1e-5, 1e-6));
  }
}

TEST(GELU, ApproximationNames) {
  EXPECT_EQ(GELU<float>("tanh").approximation(), GeluApproximation::tanh);
  EXPECT_EQ(GELU<float>("none").approximation(), GeluApproximation::none);
  EXPECT_EQ(GELU<float>().approximation(), GeluApproximation::none);
  EXPECT_EQ(mha::nn::gelu_approximation_name(GeluApproximation::tanh), "tanh");
  EXPECT_TRUE(throws_error([] { GELU<float>("erf"); },
                           {"GELU: approximate: expected \"none\" or \"tanh\", got \"erf\""}));
}

// The layer `name`'s backward refuses an empty cache (no forward first), then a grad_output of
// another shape than the forward's input.
template <class Layer>
void expect_backward_errors(const std::string& name) {
  Layer layer;
  typename Layer::Cache cache;
  EXPECT_TRUE(throws_error([&] { layer.backward(Tensor<double>({2}), cache); }, {name + "::backward: cache"}));
  layer.forward(Tensor<double>({4}), &cache);
  EXPECT_TRUE(throws_error([&] { layer.backward(Tensor<double>({2}), cache); },
                           {name + "::backward: grad_output: expected shape [4], got [2]"}));
}

TEST(Activations, BadInputsThrowTellingErrors) {
  EXPECT_TRUE(throws_error([] { mha::nn::relu(Tensor<double>()); }, {"relu: input", "undefined"}));
  EXPECT_TRUE(throws_error([] { mha::nn::gelu(Tensor<double>()); }, {"gelu: input", "undefined"}));
  EXPECT_TRUE(throws_error(
      [] {
        mha::nn::relu_backward(Tensor<double>({2, 3}), Tensor<double>({3, 2}));
      },
      {"relu_backward: grad_output: expected shape [2, 3], got [3, 2]"}));
  EXPECT_TRUE(throws_error(
      [] {
        mha::nn::gelu_backward(Tensor<double>({2, 3}), Tensor<double>({6}));
      },
      {"gelu_backward: grad_output: expected shape [2, 3], got [6]"}));
  EXPECT_TRUE(
      throws_error([] { mha::nn::gelu(Tensor<double>({2}), static_cast<GeluApproximation>(7)); },
                   {"gelu: approximation", "got the value 7"}));
  expect_backward_errors<ReLU<double>>("ReLU");
  expect_backward_errors<GELU<double>>("GELU");
}

}  // namespace
