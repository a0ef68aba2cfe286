// PackedLinear (mha/core/panel_gemm.h): y = x·Wᵀ + b on the panel micro-kernel, against the sum
// written out in double here, on every SIMD target this CPU runs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
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

// The packers against their layouts in panel_gemm.h, element by element, on every target: n and k
// around the panel width and the 4 × 4 blocks pack_transposed moves at a time, rows wider than k.
TEST(PanelPacking, EveryElementWhereTheLayoutSays) {
  mha::Generator gen(11);
  for (const std::string& target : mha::simd_targets()) {
    mha::ScopedSimdTarget pin(target);
    const size_t W = mha::panel_gemm::panel_width();
    for (size_t n : {size_t{1}, W - 1, W, 3 * W + 5})
      for (size_t k : {1, 3, 4, 7, 59, 64}) {
        const size_t ld = k + 3, panels = (n + W - 1) / W;
        const Tensor<float> x = uniform({static_cast<int64_t>(std::max(n, k)), static_cast<int64_t>(ld)}, gen);
        std::vector<float> rows(panels * W * k, -1.0f), transposed(panels * W * k, -1.0f);
        mha::panel_gemm::pack_transposed(x.data(), ld, n, k, transposed.data());  // X is n × k
        const Tensor<float> xr = uniform({static_cast<int64_t>(k), static_cast<int64_t>(n + 2)}, gen);  // k × n
        mha::panel_gemm::pack_rows(xr.data(), n + 2, k, n, rows.data());
        for (size_t p = 0; p < panels; ++p)
          for (size_t kk = 0; kk < k; ++kk)
            for (size_t c = 0; c < W; ++c) {
              const size_t at = p * k * W + kk * W + c, j = p * W + c;
              const std::string where = target + " n=" + std::to_string(n) + " k=" + std::to_string(k);
              ASSERT_EQ(transposed[at], j < n ? x[static_cast<int64_t>(j * ld + kk)] : 0.0f) << where;
              ASSERT_EQ(rows[at], j < n ? xr[static_cast<int64_t>(kk * (n + 2) + j)] : 0.0f) << where;
            }
      }
  }
}

// bfloat16/float16 operands (a KV cache's) packed as they are widened: the very floats the float
// packers give for the widened values, on every target.
template <class Half>
void expect_half_packing_is_float_packing(mha::Generator& gen) {
  for (const std::string& target : mha::simd_targets()) {
    mha::ScopedSimdTarget pin(target);
    const size_t W = mha::panel_gemm::panel_width();
    for (size_t n : {size_t{1}, W + 3})
      for (size_t k : {size_t{5}, size_t{64}}) {
        const size_t ld = std::max(n, k) + 2, rows = std::max(n, k), panels = (n + W - 1) / W;
        std::vector<Half> half(rows * ld);
        std::vector<float> widened(rows * ld);
        for (size_t i = 0; i < half.size(); ++i) {
          if constexpr (std::is_same_v<Half, mha::bfloat16>) {
            half[i] = mha::to_bfloat16(static_cast<float>(gen.uniform(-3, 3)));
          } else {
            half[i] = mha::to_float16(static_cast<float>(gen.uniform(-3, 3)));
          }
          widened[i] = mha::to_float(half[i]);
        }
        std::vector<float> from_half(panels * W * k, -1.0f), from_float(panels * W * k, -2.0f);
        const std::string where = target + " n=" + std::to_string(n) + " k=" + std::to_string(k);
        mha::panel_gemm::pack_transposed(half.data(), ld, n, k, from_half.data());
        mha::panel_gemm::pack_transposed(widened.data(), ld, n, k, from_float.data());
        ASSERT_EQ(from_half, from_float) << "pack_transposed " << where;
        mha::panel_gemm::pack_rows(half.data(), ld, k, n, from_half.data());
        mha::panel_gemm::pack_rows(widened.data(), ld, k, n, from_float.data());
        ASSERT_EQ(from_half, from_float) << "pack_rows " << where;
      }
  }
}

TEST(PanelPacking, HalfPrecisionIsPackedAsItsFloatValues) {
  mha::Generator gen(13);
  expect_half_packing_is_float_packing<mha::bfloat16>(gen);
  expect_half_packing_is_float_packing<mha::float16>(gen);
}

// B starting inside a packed panel (PanelsB::first_column, at any multiple of panel_step()) gives
// the very bits of the same columns packed from their own first panel, on every target: each
// element of C is the same dot product in the same order.
TEST(PanelPacking, BandsThatStartInsideAPanelGiveTheSameBits) {
  mha::Generator gen(12);
  for (const std::string& target : mha::simd_targets()) {
    mha::ScopedSimdTarget pin(target);
    const size_t W = mha::panel_gemm::panel_width(), step = mha::panel_gemm::panel_step();
    const size_t m = 13, k = 37, keys = 4 * W;
    const Tensor<float> a = uniform({static_cast<int64_t>(m), static_cast<int64_t>(k)}, gen);
    const Tensor<float> x = uniform({static_cast<int64_t>(keys), static_cast<int64_t>(k)}, gen);  // Bᵀ
    std::vector<float> packed(keys * k), own(keys * k);
    mha::panel_gemm::pack_transposed(x.data(), k, keys, k, packed.data());
    for (size_t first = 0; first < 2 * W; first += step)
      for (size_t n : {size_t{1}, step, W - step + 1, 2 * W + 3}) {
        if (first + n > keys) continue;
        const std::string where = target + " columns from " + std::to_string(first) + ", n=" + std::to_string(n);
        mha::panel_gemm::pack_transposed(x.data() + first * k, k, n, k, own.data());
        std::vector<float> inside(m * (n + W)), from_own(m * (n + W));
        const size_t ldc = n + W;  // room for whole vectors past n
        mha::panel_gemm::multiply(m, n, k, {a.data(), k}, {packed.data() + first / W * W * k, W, k * W, first % W},
                                  {inside.data(), ldc}, false);
        mha::panel_gemm::multiply(m, n, k, {a.data(), k}, {own.data(), W, k * W}, {from_own.data(), ldc}, false);
        for (size_t r = 0; r < m; ++r)
          for (size_t c = 0; c < n; ++c) ASSERT_EQ(inside[r * ldc + c], from_own[r * ldc + c]) << where;
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

// The epilogue sees every element of y exactly once, after the bias, whatever the split, and what
// it writes is what y holds.
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
      linear.forward(x, y, [&](int64_t row, int64_t col, float* values, int64_t count) {
        for (int64_t c = 0; c < count; ++c) {
          ++seen[row * n + col + c];
          values[c] *= 2;
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
