// PackedLinear (mha/core/panel_gemm.h): y = x·Wᵀ + b on the panel micro-kernel, against the sum
// written out in double here, on every SIMD target this CPU runs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "../support/assertions.h"
#include "mha/core/panel_gemm.h"
#include "mha/core/random.h"
#include "mha/core/simd.h"

namespace {

using mha::Tensor;
using mha::panel_gemm::PackedLinear;
using mha::testing::throws_error;

Tensor<float> uniform(mha::Shape shape, mha::Generator& gen) {
  Tensor<float> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(gen.uniform(-1.0, 1.0));
  return t;
}

// A float sum of K products is within γ_K·Σ|x_k·w_k| of the exact value, γ_K = K·u/(1 − K·u),
// u = 2⁻²⁴ (Higham, Accuracy and Stability of Numerical Algorithms, §3.1); FMAs only tighten it.
// Plus one rounding of the bias addition.
void expect_close_to_exact(const Tensor<float>& y, const Tensor<float>& x, const Tensor<float>& w,
                           const Tensor<float>* b, const std::string& where) {
  const int64_t n = w.size(0), k = w.size(1), m = y.numel() / std::max<int64_t>(n, 1);
  const double u = std::ldexp(1.0, -24), gamma = k * u / (1 - k * u);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = b != nullptr ? (*b)[j] : 0.0, magnitude = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = static_cast<double>(x[r * k + c]) * w[j * k + c];
        exact += p;
        magnitude += std::abs(p);
      }
      const double bound = gamma * magnitude + u * std::abs(exact) + std::numeric_limits<float>::min();
      ASSERT_LE(std::abs(y[r * n + j] - exact), bound) << where << ": row " << r << ", column " << j;
    }
  }
}

TEST(PackedLinear, MatchesTheExactSumOnEveryTargetAndShape) {
  mha::Generator gen(5);
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 1, 1}, {5, 3, 7}, {6, 64, 128}, {7, 65, 129}, {20, 384, 384}, {97, 130, 33}, {200, 63, 5}, {13, 17, 0}};
  for (const std::string& target : mha::simd_targets()) {
    mha::ScopedSimdTarget pin(target);
    for (auto [m, n, k] : shapes) {
      const Tensor<float> x = uniform({m, k}, gen), w = uniform({n, k}, gen), b = uniform({n}, gen);
      for (bool with_bias : {false, true}) {
        const PackedLinear linear(w, with_bias ? mha::View<const float>(b) : mha::View<const float>());
        const Tensor<float> y = linear.forward(x);
        ASSERT_EQ(y.shape(), (mha::Shape{m, n}));
        expect_close_to_exact(y, x, w, with_bias ? &b : nullptr,
                              target + " (" + std::to_string(m) + ", " + std::to_string(n) + ", " +
                                  std::to_string(k) + ")" + (with_bias ? " with bias" : ""));
      }
    }
  }
}

TEST(PackedLinear, LeadingDimensionsAndAnyThreadCountGiveTheSameBits) {
  mha::Generator gen(6);
  const Tensor<float> x = uniform({3, 70, 96}, gen), w = uniform({200, 96}, gen), b = uniform({200}, gen);
  const PackedLinear linear(w, b);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Tensor<float> one = linear.forward(x);
  omp_set_num_threads(2);
  const Tensor<float> two = linear.forward(x);
  omp_set_num_threads(saved);
  ASSERT_EQ(one.shape(), (mha::Shape{3, 70, 200}));
  for (int64_t i = 0; i < one.numel(); ++i) ASSERT_EQ(one[i], two[i]) << "element " << i;
  expect_close_to_exact(one, x, w, &b, "3-D input");
  // Writing into a caller's buffer gives the same.
  Tensor<float> into({3, 70, 200});
  linear.forward(x, into);
  for (int64_t i = 0; i < one.numel(); ++i) ASSERT_EQ(into[i], one[i]) << "element " << i;
}

// The epilogue sees every element of y exactly once, after the bias, whatever the split.
TEST(PackedLinear, EpilogueCoversEveryBlockOnce) {
  mha::Generator gen(8);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{7, 65}, {200, 130}, {1, 3}}) {
    const Tensor<float> x = uniform({m, 33}, gen), w = uniform({n, 33}, gen), b = uniform({n}, gen);
    const PackedLinear linear(w, b);
    const Tensor<float> plain = linear.forward(x);
    for (int threads : {1, 2}) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      Tensor<float> y({m, n});
      Tensor<int32_t> seen({m, n});
      linear.forward(x, y, [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
        for (int64_t r = row; r < row + rows; ++r)
          for (int64_t c = col; c < col + cols; ++c) {
            ++seen[r * n + c];
            y[r * n + c] = 2 * y[r * n + c];
          }
      });
      omp_set_num_threads(saved);
      for (int64_t i = 0; i < y.numel(); ++i) {
        ASSERT_EQ(seen[i], 1) << "element " << i << ", " << threads << " threads";
        ASSERT_EQ(y[i], 2 * plain[i]) << "element " << i;
      }
    }
  }
}

TEST(PackedLinear, BadInputsAreErrorsNamingTheArgument) {
  const Tensor<float> w({4, 3}), x({2, 3});
  EXPECT_TRUE(throws_error([&] { PackedLinear(Tensor<float>({12}), {}, "q"); }, {"q: weight", "2-D", "[12]"}));
  EXPECT_TRUE(throws_error([&] { PackedLinear(w, Tensor<float>({3}), "q"); }, {"q: bias", "(4)", "[3]"}));
  const PackedLinear linear(w, {}, "q");
  EXPECT_TRUE(throws_error([&] { linear.forward(Tensor<float>({2, 4})); }, {"q: input", "(..., 3)", "[2, 4]"}));
  Tensor<float> wrong({2, 5});
  EXPECT_TRUE(throws_error([&] { linear.forward(x, wrong); }, {"q: output", "[2, 4]", "[2, 5]"}));
  Tensor<float> storage({2, 8});
  const mha::View<float> strided(storage.data(), {2, 4}, {8, 1});
  EXPECT_TRUE(throws_error([&] { linear.forward(x, strided); }, {"q: output", "contiguous"}));
  const auto targets = mha::simd_targets();
  if (targets.size() > 1) {  // the panel width differs between AVX-512 and AVX2
    const PackedLinear best(w, {}, "q");
    mha::ScopedSimdTarget pin(targets.back());
    if (mha::panel_gemm::panel_width() != 64)
      EXPECT_TRUE(throws_error([&] { best.forward(x); }, {"q: the weight was packed for panels of", "pack it again"}));
  }
}

}  // namespace
