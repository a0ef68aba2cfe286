#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "../support/gradient_check.h"
#include "../support/assertions.h"
#include "mha/nn/linear.h"

namespace {

using mha::Generator;
using mha::Shape;
using mha::Tensor;
using mha::nn::Linear;
using namespace mha::testing;

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  Generator gen(11);
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t rank = 1 + trial % 4;
    const int64_t in = random_int(gen, 1, 7);
    const int64_t out = random_int(gen, 1, 7);
    const bool bias = trial % 3 != 2;
    Linear<double> layer(in, out, bias, gen);
    const Tensor<double> x = random_tensor(with_last(random_shape(gen, rank), in), gen);
    const Tensor<double> g = random_tensor(with_last(x.shape(), out), gen);
    SCOPED_TRACE("x " + mha::to_string(x.shape()) + ", out " + std::to_string(out) +
                 (bias ? ", bias" : ", no bias"));

    Linear<double>::Cache cache;
    const Tensor<double> y = layer.forward(x, &cache);
    EXPECT_EQ(y.shape(), with_last(x.shape(), out));
    const Tensor<double> grad_x = layer.backward(g, cache);

    EXPECT_TRUE(
        check_gradient([&](const Tensor<double>& v) { return layer.forward(v); }, x, g, grad_x))
        << "input";
    EXPECT_TRUE(check_gradient(replacing(layer.weight, [&] { return layer.forward(x); }),
                               layer.weight, g, layer.grad_weight))
        << "weight";
    if (bias) {
      EXPECT_TRUE(check_gradient(replacing(layer.bias, [&] { return layer.forward(x); }),
                                 layer.bias, g, layer.grad_bias))
          << "bias";
    }
  }
}

TEST(Linear, ForwardMatchesDirectSum) {
  Generator gen(3);
  Linear<double> layer(5, 4, gen);
  const Tensor<double> x = random_tensor({2, 3, 5}, gen);
  const Tensor<double> y = layer.forward(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t o = 0; o < 4; ++o) {
      double s = layer.bias[o];
      for (int64_t i = 0; i < 5; ++i) s += x[r * 5 + i] * layer.weight[o * 5 + i];
      EXPECT_NEAR(y[r * 4 + o], s, 1e-14);
    }
}

TEST(Linear, BackwardAccumulatesParameterGradients) {
  Generator gen(4);
  Linear<double> layer(3, 2, gen);
  const Tensor<double> x = random_tensor({4, 3}, gen);
  const Tensor<double> g = random_tensor({4, 2}, gen);
  Linear<double>::Cache cache;
  layer.forward(x, &cache);
  layer.backward(g, cache);
  const Tensor<double> once_w = layer.grad_weight, once_b = layer.grad_bias;
  layer.backward(g, cache);
  for (int64_t i = 0; i < once_w.numel(); ++i)
    EXPECT_DOUBLE_EQ(layer.grad_weight[i], 2 * once_w[i]);
  for (int64_t i = 0; i < once_b.numel(); ++i) EXPECT_DOUBLE_EQ(layer.grad_bias[i], 2 * once_b[i]);
  layer.zero_grad();
  for (double v : layer.grad_weight.values()) EXPECT_EQ(v, 0.0);
}

TEST(Linear, ParametersUsePyTorchNames) {
  Generator gen(1);
  Linear<float> with_bias(3, 2, gen);
  auto p = with_bias.parameters();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].name, "weight");
  EXPECT_EQ(p[0].value->shape(), (Shape{2, 3}));
  EXPECT_EQ(p[1].name, "bias");
  EXPECT_EQ(p[1].value->shape(), (Shape{2}));
  Linear<float> no_bias(3, 2, false, gen);
  ASSERT_EQ(no_bias.parameters().size(), 1u);
  EXPECT_FALSE(no_bias.has_bias());
  auto state = with_bias.state_dict();
  EXPECT_EQ(state.size(), 2u);
  EXPECT_TRUE(throws_error([&] { no_bias.load_state_dict(state); }, {"unexpected tensor 'bias'"}));
}

TEST(Linear, FunctionalOnWeightRowsMatchesPackedProjection) {
  // A packed (3E, E) projection, as MultiheadAttention's in_proj: each row block applied alone
  // equals the matching columns of the full product, and the gradients land in the right rows.
  Generator gen(21);
  const int64_t e = 4;
  Linear<double> packed(e, 3 * e, gen);
  const Tensor<double> x = random_tensor({2, 5, e}, gen);
  const Tensor<double> full = packed.forward(x);
  Tensor<double> grad_w(packed.weight.shape()), grad_b(packed.bias.shape());
  Tensor<double> grad_x_sum(x.shape());
  const Tensor<double> g_full = random_tensor(full.shape(), gen);
  for (int64_t part = 0; part < 3; ++part) {
    auto view = mha::nn::weight_rows(packed.weight, part * e, e);
    const Tensor<double> y = mha::nn::linear_forward(x, view, packed.bias.data() + part * e);
    ASSERT_EQ(y.shape(), (Shape{2, 5, e}));
    Tensor<double> g(y.shape());
    for (int64_t r = 0; r < 10; ++r)
      for (int64_t o = 0; o < e; ++o) {
        EXPECT_NEAR(y[r * e + o], full[r * 3 * e + part * e + o], 1e-14);
        g[r * e + o] = g_full[r * 3 * e + part * e + o];
      }
    const Tensor<double> gx = mha::nn::linear_backward(x, view, g, grad_w.data() + part * e * e,
                                                       grad_b.data() + part * e);
    for (int64_t i = 0; i < gx.numel(); ++i) grad_x_sum[i] += gx[i];
  }
  Linear<double>::Cache cache;
  packed.forward(x, &cache);
  const Tensor<double> grad_x = packed.backward(g_full, cache);
  EXPECT_TRUE(all_close(grad_x_sum, grad_x, 1e-12, 1e-14));
  EXPECT_TRUE(all_close(grad_w, packed.grad_weight, 1e-12, 1e-14));
  EXPECT_TRUE(all_close(grad_b, packed.grad_bias, 1e-12, 1e-14));
}

TEST(Linear, TensorFunctionalMatchesModule) {
  Generator gen(5);
  Linear<float> layer(6, 3, gen);
  const Tensor<float> x = random_tensor<float>({7, 6}, gen);
  const Tensor<float> g = random_tensor<float>({7, 3}, gen);
  const Tensor<float> y = mha::nn::linear_forward(x, layer.weight, &layer.bias);
  EXPECT_TRUE(all_close(y, layer.forward(x), 0, 0));
  Tensor<float> gw(layer.weight.shape()), gb(layer.bias.shape());
  const Tensor<float> gx = mha::nn::linear_backward(x, layer.weight, g, &gw, &gb);
  Linear<float>::Cache cache;
  layer.forward(x, &cache);
  EXPECT_TRUE(all_close(gx, layer.backward(g, cache), 0, 0));
  EXPECT_TRUE(all_close(gw, layer.grad_weight, 0, 0));
  EXPECT_TRUE(all_close(gb, layer.grad_bias, 0, 0));
  // No bias, no parameter gradients.
  const Tensor<float> y0 = mha::nn::linear_forward(x, layer.weight);
  EXPECT_NEAR(y0[0] + layer.bias[0], y[0], 1e-6);
  EXPECT_EQ(mha::nn::linear_backward(x, layer.weight, g, nullptr, nullptr).shape(), x.shape());
}

TEST(Linear, FloatMatchesDouble) {
  Generator gen_f(8), gen_d(8);
  Linear<float> lf(5, 6, gen_f);
  Linear<double> ld(5, 6, gen_d);
  Generator gx(9);
  const Tensor<double> x = random_tensor({3, 4, 5}, gx);
  EXPECT_TRUE(all_close(lf.forward(mha::cast<float>(x)), ld.forward(x), 1e-5, 1e-6));
}

// bfloat16 (gemm<bfloat16>: exact bf16 products summed in float, each result rounded once): the
// output and every gradient against the same values in double, within γ_(k+1)·(Σ|terms|) of the
// exact sum (k terms and a bias or the zero the gradient starts from; Higham §3.1, u = 2⁻²⁴) plus
// bfloat16's rounding, 2⁻⁸ relative; the bias gradient is a double sum rounded through float.
TEST(Linear, Bfloat16RoundsEachResultOnce) {
  using mha::bfloat16;
  Generator gen(10);
  Linear<bfloat16> layer(37, 21, gen);
  const Tensor<bfloat16> x = mha::cast<bfloat16>(random_tensor({2, 9, 37}, gen, -2, 2));
  const Tensor<bfloat16> g = mha::cast<bfloat16>(random_tensor({2, 9, 21}, gen, -1, 1));
  Linear<bfloat16>::Cache cache;
  const Tensor<bfloat16> y = layer.forward(x, &cache);
  const Tensor<bfloat16> gx = layer.backward(g, cache);
  const int64_t rows = 18, in = 37, out = 21;
  const Tensor<double> xd = mha::cast<double>(x), gd = mha::cast<double>(g), w = mha::cast<double>(layer.weight),
                       b = mha::cast<double>(layer.bias);
  const double u = std::ldexp(1.0, -24);
  auto within = [&](double got, double exact, double magnitude, int64_t k, const std::string& what) {
    const double f = (k + 1) * u / (1 - (k + 1) * u) * magnitude;
    EXPECT_LE(std::abs(got - exact), f + std::ldexp(1.0, -8) * (std::abs(exact) + f) + 1e-37) << what;
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double exact = b[o], magnitude = std::abs(b[o]);
      for (int64_t i = 0; i < in; ++i) exact += xd[r * in + i] * w[o * in + i], magnitude += std::abs(xd[r * in + i] * w[o * in + i]);
      within(mha::to_float(y[r * out + o]), exact, magnitude, in, "y " + std::to_string(r) + "," + std::to_string(o));
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < in; ++i) {
      double exact = 0, magnitude = 0;
      for (int64_t o = 0; o < out; ++o) exact += gd[r * out + o] * w[o * in + i], magnitude += std::abs(gd[r * out + o] * w[o * in + i]);
      within(mha::to_float(gx[r * in + i]), exact, magnitude, out, "grad_input");
    }
  for (int64_t o = 0; o < out; ++o) {
    double bias_sum = 0;
    for (int64_t i = 0; i < in; ++i) {
      double exact = 0, magnitude = 0;
      for (int64_t r = 0; r < rows; ++r) exact += gd[r * out + o] * xd[r * in + i], magnitude += std::abs(gd[r * out + o] * xd[r * in + i]);
      within(mha::to_float(layer.grad_weight[o * in + i]), exact, magnitude, rows, "grad_weight");
    }
    for (int64_t r = 0; r < rows; ++r) bias_sum += gd[r * out + o];
    EXPECT_LE(std::abs(mha::to_float(layer.grad_bias[o]) - bias_sum), std::ldexp(std::abs(bias_sum), -8) + 1e-7) << "grad_bias";
  }
  // Degenerate sizes: no input features (the product is empty: y = bias, here 0), no rows.
  Linear<bfloat16> zero_in(0, 2, gen);
  Linear<bfloat16>::Cache zero_cache;
  const Tensor<bfloat16> y0 = zero_in.forward(Tensor<bfloat16>({4, 0}), &zero_cache);
  ASSERT_EQ(y0.shape(), (Shape{4, 2}));
  for (int64_t i = 0; i < y0.numel(); ++i) EXPECT_EQ(mha::to_float(y0[i]), 0.0f);
  EXPECT_EQ(zero_in.backward(mha::cast<bfloat16>(Tensor<double>({4, 2}, 1.0)), zero_cache).shape(), (Shape{4, 0}));
  EXPECT_EQ(mha::to_float(zero_in.grad_bias[0]), 4.0f);
  EXPECT_EQ(layer.forward(Tensor<bfloat16>({0, 37})).shape(), (Shape{0, 21}));
}

TEST(Linear, EmptyAndDegenerateSizes) {
  Generator gen(2);
  Linear<double> layer(3, 2, gen);
  const Tensor<double> y = layer.forward(Tensor<double>({0, 3}));
  EXPECT_EQ(y.shape(), (Shape{0, 2}));
  Linear<double> zero_in(0, 2, gen);
  const Tensor<double> y2 = zero_in.forward(Tensor<double>({4, 0}));
  ASSERT_EQ(y2.shape(), (Shape{4, 2}));
  for (int64_t i = 0; i < y2.numel(); ++i) EXPECT_EQ(y2[i], 0.0);  // bias bound 0 -> bias 0
  Linear<double>::Cache cache;
  zero_in.forward(Tensor<double>({4, 0}), &cache);
  EXPECT_EQ(zero_in.backward(Tensor<double>({4, 2}, 1.0), cache).shape(), (Shape{4, 0}));
  EXPECT_EQ(zero_in.grad_bias[0], 4.0);
}

TEST(Linear, InitIsUniformWithPyTorchBound) {
  Generator gen(1234);
  const int64_t in = 64, out = 2048;
  Linear<double> layer(in, out, gen);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto stats = [&](const Tensor<double>& t) {
    double mean = 0, sq = 0;
    for (double v : t.values()) {
      EXPECT_GE(v, -bound);
      EXPECT_LT(v, bound);
      mean += v;
      sq += v * v;
    }
    const double n = static_cast<double>(t.numel());
    mean /= n;
    // Uniform(-b, b): mean 0 (sd b/sqrt(3n)), E[v²] = b²/3 (sd of the estimate sqrt(4/45)·b²/√n).
    EXPECT_NEAR(mean, 0.0, 5 * bound / std::sqrt(3 * n));
    EXPECT_NEAR(sq / n, bound * bound / 3,
                5 * std::sqrt(4.0 / 45.0) * bound * bound / std::sqrt(n));
  };
  stats(layer.weight);
  stats(layer.bias);
  // The extremes are reached: values fill the whole interval.
  double lo = 0, hi = 0;
  for (double v : layer.weight.values()) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_LT(lo, -0.99 * bound);
  EXPECT_GT(hi, 0.99 * bound);
  // Seeded: the same generator seed gives the same weights.
  Generator again(1234);
  Linear<double> same(in, out, again);
  EXPECT_TRUE(all_close(same.weight, layer.weight, 0, 0));
}

TEST(Linear, BadInputsThrowTellingErrors) {
  Generator gen(0);
  Linear<double> layer(8, 4, gen);
  EXPECT_TRUE(throws_error(
      [&] {
        layer.forward(Tensor<double>({2, 3, 5}));
      },
      {"Linear: input: expected last dimension 8 (in_features), got shape [2, 3, 5]"}));
  EXPECT_TRUE(throws_error([&] { layer.forward(Tensor<double>(Shape{})); },
                           {"Linear: input", "rank >= 1", "got shape []"}));
  EXPECT_TRUE(
      throws_error([&] { layer.forward(Tensor<double>()); }, {"Linear: input", "undefined"}));
  Linear<double>::Cache cache;
  EXPECT_TRUE(throws_error(
      [&] {
        layer.backward(Tensor<double>({2, 4}), cache);
      },
      {"Linear::backward: cache", "empty cache"}));
  layer.forward(Tensor<double>({2, 8}), &cache);
  EXPECT_TRUE(throws_error(
      [&] {
        layer.backward(Tensor<double>({2, 5}), cache);
      },
      {"grad_output", "expected shape [2, 4]", "got [2, 5]"}));
  EXPECT_TRUE(throws_error([&] { Linear<double>(-1, 4, gen); },
                           {"Linear: in_features: expected >= 0, got -1"}));
  EXPECT_TRUE(throws_error([&] { Linear<double>(4, -2, gen); },
                           {"Linear: out_features: expected >= 0, got -2"}));
  layer.weight = Tensor<double>({4, 7});
  EXPECT_TRUE(throws_error(
      [&] {
        layer.forward(Tensor<double>({2, 8}));
      },
      {"Linear: weight: expected shape [4, 8], got [4, 7]"}));

  const Tensor<double> w({6, 3});
  EXPECT_TRUE(throws_error([&] { mha::nn::weight_rows(w, 4, 3); },
                           {"linear: weight", "rows [4, 7)", "[6, 3]"}));
  EXPECT_TRUE(throws_error([&] { mha::nn::weight_view(Tensor<double>({6})); },
                           {"linear: weight", "2-D", "[6]"}));
  const Tensor<double> b({5});
  EXPECT_TRUE(throws_error(
      [&] {
        mha::nn::linear_forward(Tensor<double>({2, 3}), w, &b);
      },
      {"linear: bias: expected shape [6], got [5]"}));
  EXPECT_TRUE(throws_error(
      [&] {
        mha::nn::linear_forward(Tensor<double>({2, 4}), mha::nn::weight_rows(w, 0, 2), nullptr,
                                "MultiheadAttention: q projection");
      },
      {"MultiheadAttention: q projection: input: expected last dimension 3 (in_features), got "
       "shape [2, 4]"}));
  EXPECT_TRUE(throws_error(
      [&] {
        mha::nn::linear_forward(Tensor<double>({2, 3}), mha::nn::WeightView<double>{nullptr, 2, 3},
                                nullptr);
      },
      {"linear: weight", "nullptr"}));
  Tensor<double> gw_bad({3, 6});
  EXPECT_TRUE(throws_error(
      [&] {
        mha::nn::linear_backward(Tensor<double>({2, 3}), w, Tensor<double>({2, 6}), &gw_bad,
                                 nullptr);
      },
      {"linear: grad_weight: expected shape [6, 3], got [3, 6]"}));
}

}  // namespace
