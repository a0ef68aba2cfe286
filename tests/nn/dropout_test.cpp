#include <gtest/gtest.h>

#include <cmath>

#include "../support/gradient_check.h"
#include "../support/assertions.h"
#include "mha/nn/dropout.h"

namespace {

using mha::Generator;
using mha::Shape;
using mha::Tensor;
using mha::nn::Dropout;
using namespace mha::testing;

TEST(Dropout, TrainingZeroesAboutPAndScalesSurvivors) {
  for (double p : {0.1, 0.5, 0.9}) {
    Dropout<double> layer(p, 42);
    const Tensor<double> x({200, 500}, 3.0);
    const Tensor<double> y = layer.forward(x);
    int64_t kept = 0;
    for (double v : y.values()) {
      if (v != 0.0) {
        EXPECT_DOUBLE_EQ(v, 3.0 / (1.0 - p));
        ++kept;
      }
    }
    const double n = static_cast<double>(x.numel());
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), n * (1 - p), 5 * sd) << "p = " << p;
  }
}

TEST(Dropout, EvalAndZeroPAreIdentity) {
  Generator gen(1);
  const Tensor<double> x = random_tensor({3, 4, 5}, gen);
  Dropout<double> layer(0.5, 7);
  layer.eval();
  Dropout<double>::Cache cache;
  EXPECT_TRUE(all_close(layer.forward(x, &cache), x, 0, 0));
  EXPECT_EQ(layer.counter(), 0u);  // eval does not advance the counter
  EXPECT_TRUE(all_close(layer.backward(x, cache), x, 0, 0));
  Dropout<double> zero(0.0, 7);
  EXPECT_TRUE(all_close(zero.forward(x), x, 0, 0));
}

TEST(Dropout, PEqualOneDropsEverything) {
  Generator gen(1);
  const Tensor<double> x = random_tensor({6, 7}, gen);
  Dropout<double> layer(1.0, 3);
  Dropout<double>::Cache cache;
  const Tensor<double> y = layer.forward(x, &cache);
  for (double v : y.values()) EXPECT_EQ(v, 0.0);
  const Tensor<double> g = layer.backward(x, cache);
  for (double v : g.values()) EXPECT_EQ(v, 0.0);
}

TEST(Dropout, ConsecutiveCallsDifferAndRunsReproduce) {
  const Tensor<double> x({1000}, 1.0);
  Dropout<double> a(0.5, 99);
  const Tensor<double> first = a.forward(x);
  const Tensor<double> second = a.forward(x);
  EXPECT_EQ(a.counter(), 2u);
  int64_t differ = 0;
  for (int64_t i = 0; i < x.numel(); ++i) differ += first[i] != second[i];
  EXPECT_GT(differ, 300);

  Dropout<double> b(0.5, 99);  // same seed: same sequence
  EXPECT_TRUE(all_close(b.forward(x), first, 0, 0));
  EXPECT_TRUE(all_close(b.forward(x), second, 0, 0));
  b.set_counter(1);
  EXPECT_TRUE(all_close(b.forward(x), second, 0, 0));

  Dropout<double> c(0.5, 100);  // another seed: another mask
  const Tensor<double> other = c.forward(x);
  differ = 0;
  for (int64_t i = 0; i < x.numel(); ++i) differ += first[i] != other[i];
  EXPECT_GT(differ, 300);

  // float and double draw the same mask from the same (seed, counter).
  Dropout<float> f(0.5, 99);
  const Tensor<float> yf = f.forward(mha::cast<float>(x));
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(yf[i] != 0.0f, first[i] != 0.0);

  // The mask is a pure function of (shape, p, seed, counter).
  const Tensor<bool> m1 = mha::nn::dropout_mask({1000}, 0.5, 99, 0);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(m1[i], first[i] != 0.0);
}

TEST(Dropout, MaskIsUnbiasedPerPosition) {
  // Over many calls, every position of a small tensor is kept about 1 − p of the time.
  Dropout<double> layer(0.3, 5);
  const Tensor<double> x({4, 3}, 1.0);
  const int calls = 4000;
  std::vector<int> kept(12, 0);
  for (int c = 0; c < calls; ++c) {
    const Tensor<double> y = layer.forward(x);
    for (int64_t i = 0; i < 12; ++i) kept[static_cast<size_t>(i)] += y[i] != 0.0;
  }
  const double sd = std::sqrt(calls * 0.3 * 0.7);
  for (int k : kept) EXPECT_NEAR(k, calls * 0.7, 5 * sd);
}

TEST(Dropout, GradientsMatchFiniteDifferences) {
  Generator gen(31);
  for (int trial = 0; trial < 8; ++trial) {
    const Shape shape = random_shape(gen, trial % 4);  // ranks 0..3
    const Tensor<double> x = random_tensor(shape, gen);
    const Tensor<double> g = random_tensor(shape, gen);
    Dropout<double> layer(0.4, 1000 + static_cast<uint64_t>(trial));
    Dropout<double>::Cache cache;
    layer.forward(x, &cache);
    const Tensor<double> grad_x = layer.backward(g, cache);
    auto f = [&](const Tensor<double>& v) {
      layer.set_counter(0);  // the same mask as the analytic pass
      return layer.forward(v);
    };
    EXPECT_TRUE(check_gradient(f, x, g, grad_x)) << "shape " << mha::to_string(shape);
  }
}

TEST(Dropout, BadInputsThrowTellingErrors) {
  EXPECT_TRUE(throws_error([] { Dropout<double>(-0.1); },
                           {"Dropout: p: expected a probability in [0, 1], got -0.1"}));
  EXPECT_TRUE(throws_error([] { Dropout<double>(1.5); }, {"Dropout: p", "got 1.5"}));
  EXPECT_TRUE(throws_error([] { Dropout<double>(NAN); }, {"Dropout: p"}));
  Dropout<double> layer(0.5);
  EXPECT_TRUE(
      throws_error([&] { layer.forward(Tensor<double>()); }, {"Dropout: input", "undefined"}));
  Dropout<double>::Cache cache;
  EXPECT_TRUE(throws_error([&] { layer.backward(Tensor<double>({2}), cache); },
                           {"Dropout::backward: cache", "empty cache"}));
  layer.forward(Tensor<double>({2, 3}), &cache);
  EXPECT_TRUE(throws_error(
      [&] {
        layer.backward(Tensor<double>({3, 2}), cache);
      },
      {"Dropout::backward: grad_output: expected shape [2, 3], got [3, 2]"}));
  EXPECT_TRUE(throws_error([] { mha::nn::dropout_mask({2}, 2.0, 0, 0); }, {"dropout_mask: p"}));
  EXPECT_TRUE(throws_error(
      [] {
        mha::nn::dropout_apply(Tensor<double>({2, 3}), Tensor<bool>({3}), 0.5);
      },
      {"dropout_apply: keep: expected shape [2, 3], got [3]"}));
}

}  // namespace
