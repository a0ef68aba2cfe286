// bf16 × bf16 → float products (mha/core/bf16_gemm.h), on every path this CPU runs (AMX tiles,
// VDPBF16PS, the float32 fallback always), against the sum written out in double here; and
// PackedLinear, the bfloat16 linear layer on them.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../support/assertions.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/gemm.h"
#include "mha/core/random.h"
#include "mha/core/simd.h"

namespace {

using mha::bfloat16;
namespace bg = mha::bf16_gemm;

std::vector<bfloat16> uniform(size_t count, mha::Generator& gen) {
  std::vector<bfloat16> x(count);
  for (bfloat16& e : x) e = mha::to_bfloat16(static_cast<float>(gen.uniform(-2.0, 2.0)));
  return x;
}


struct Case {
  size_t m, n, k, lda, ldc;
};

// C = (C0 +) A·B for A m × k (row stride lda) and B k × n given as X = B (pack_b) or X = Bᵀ
// (pack_b_transposed), against the exact sum in double: every bf16 product is exact in float, so a
// float sum of k of them (plus C0) is within γ_(k+1)·(|C0| + Σ|a·b|), γ_j = j·u/(1 − j·u), u = 2⁻²⁴
// (Higham §3.1), in whatever order the path adds them. Columns past n are left as they were.
void check(const Case& c, bool transposed, bool accumulate, bg::Path path, mha::Generator& gen) {
  const std::vector<bfloat16> a = uniform(c.m * c.lda, gen), b = uniform(c.k * c.n, gen);  // b: B row-major
  std::vector<bfloat16> bt(c.n * c.k), packed(bg::packed_size(c.k, c.n), bfloat16{0x7fc0});  // NaN: all overwritten
  for (size_t kk = 0; kk < c.k; ++kk)
    for (size_t j = 0; j < c.n; ++j) bt[j * c.k + kk] = b[kk * c.n + j];
  if (transposed) {
    bg::pack_b_transposed(bt.data(), c.k, c.n, c.k, packed.data());
  } else {
    bg::pack_b(b.data(), c.n, c.k, c.n, packed.data());
  }
  std::vector<float> out(c.m * c.ldc);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(gen.uniform(-1.0, 1.0));
  const std::vector<float> before = out;
  {
    const bg::ScopedPath pin(path);
    bg::multiply(c.m, c.n, c.k, a.data(), c.lda, packed.data(), c.n, out.data(), c.ldc, accumulate);
  }
  const std::string where = std::string(bg::name(path)) + " m=" +
                            std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                            (transposed ? " from Bᵀ" : " from B") + (accumulate ? ", accumulating" : "");
  const double u = std::ldexp(1.0, -24), gamma = (c.k + 1) * u / (1 - (c.k + 1) * u);
  for (size_t r = 0; r < c.m; ++r) {
    for (size_t j = 0; j < c.n; ++j) {
      double exact = accumulate ? before[r * c.ldc + j] : 0.0, magnitude = std::abs(exact);
      for (size_t kk = 0; kk < c.k; ++kk) {
        const double p = static_cast<double>(mha::to_float(a[r * c.lda + kk])) * mha::to_float(b[kk * c.n + j]);
        exact += p;
        magnitude += std::abs(p);
      }
      ASSERT_LE(std::abs(out[r * c.ldc + j] - exact), gamma * magnitude + std::numeric_limits<float>::min())
          << where << ": row " << r << ", column " << j;
    }
    for (size_t j = c.n; j < c.ldc; ++j) ASSERT_EQ(out[r * c.ldc + j], before[r * c.ldc + j]) << where << ": past n";
  }
}

TEST(Bf16Gemm, MatchesTheExactSumOnEveryPathAndShape) {
  mha::Generator gen(21);
  // Attention's tiles (S = Q·Kᵀ: rows × keys × d; O += P·V: rows × d × keys; a band of 12 rows),
  // odd depths and widths with even and odd row strides of A, one row, one column, depth 0 and 1;
  // whole AMX tiles in place with strides wider than the matrices (32 × 48: a 16-column edge).
  const std::vector<Case> cases = {{48, 256, 64, 64, 256}, {96, 64, 256, 256, 64}, {12, 272, 64, 70, 280},
                                   {7, 33, 17, 18, 40},    {7, 33, 17, 17, 40},    {1, 1, 1, 2, 1},
                                   {5, 3, 0, 2, 3},        {6, 64, 1, 3, 64},      {13, 100, 129, 130, 101},
                                   {13, 100, 129, 131, 101}, {32, 48, 96, 100, 60}, {16, 32, 32, 32, 32}};
  for (bg::Path path : bg::paths())
    for (const Case& c : cases)
      for (bool transposed : {false, true})
        for (bool accumulate : {false, true}) check(c, transposed, accumulate, path, gen);
}

// A block of a larger packed B (attention's tiles inside a packed kv head): rows from an even kk0,
// columns from c0, the packed matrix's width as ldb; against the exact sum of that block, on both
// paths, from B and from Bᵀ, with an odd depth (the block's last row then shares its pair with a
// row outside the block, which must not be read).
TEST(Bf16Gemm, BlocksOfAWiderPackedMatrix) {
  mha::Generator gen(23);
  const size_t K = 40, N = 300, m = 11;
  const std::vector<bfloat16> a = uniform(m * K, gen), b = uniform(K * N, gen);
  std::vector<bfloat16> bt(N * K);
  for (size_t kk = 0; kk < K; ++kk)
    for (size_t j = 0; j < N; ++j) bt[j * K + kk] = b[kk * N + j];
  const size_t u_bits = 24;
  for (bg::Path path : bg::paths())
    for (bool transposed : {false, true}) {
      std::vector<bfloat16> packed(bg::packed_size(K, N));
      if (transposed) {
        bg::pack_b_transposed(bt.data(), K, N, K, packed.data());
      } else {
        bg::pack_b(b.data(), N, K, N, packed.data());
      }
      for (const auto [kk0, k, c0, n] : {std::tuple<size_t, size_t, size_t, size_t>{0, 40, 0, 300},
                                         {8, 17, 16, 33}, {2, 37, 250, 50}, {38, 1, 5, 7}, {8, 32, 16, 64}}) {
        std::vector<float> out(m * n);
        {
          const bg::ScopedPath pin(path);
          bg::multiply(m, n, k, a.data() + kk0, K, packed.data() + kk0 * N + 2 * c0, N, out.data(), n, false);
        }
        const double gamma = (k + 1) * std::ldexp(1.0, -static_cast<int>(u_bits));
        for (size_t r = 0; r < m; ++r)
          for (size_t j = 0; j < n; ++j) {
            double exact = 0, magnitude = 0;
            for (size_t kk = kk0; kk < kk0 + k; ++kk) {
              const double p = static_cast<double>(mha::to_float(a[r * K + kk])) * mha::to_float(b[kk * N + c0 + j]);
              exact += p;
              magnitude += std::abs(p);
            }
            ASSERT_LE(std::abs(out[r * n + j] - exact), gamma * magnitude + std::numeric_limits<float>::min())
                << bg::name(path) << (transposed ? " from Bᵀ" : " from B") << " rows " << kk0
                << "+" << k << " columns " << c0 << "+" << n << ": row " << r << ", column " << j;
          }
      }
    }
}

// float16 on split operands (bf16_gemm.h): every float16 is exactly hi + lo (all 65536, in
// split_a's first and second parts; ±inf as hi with lo 0, NaN as NaN), and a product on the split
// A and B equals the float16 product with every term exact: against the exact sum in double
// within γ_(4k)·Σ|terms| on every path (the 4k exact bf16 products of a depth-split_depth(k)
// product, each |hi·hi'|, |lo·hi'|, ... at most |x|·|y|·(1 + 2⁻⁸)², so Σ|terms| ≤ 1.01·Σ|x·y|).
// From Bᵀ (pack_split_b_transposed, with ldb past n) and from B (pack_split_b: A·Bhi + A·Blo).
TEST(Bf16Gemm, Float16SplitIntoTwoBfloat16sIsExact) {
  std::vector<mha::float16> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = mha::float16{static_cast<uint16_t>(i)};
  std::vector<bfloat16> row(bg::split_depth(all.size()));
  bg::split_a(all.data(), all.size(), row.data());
  for (size_t i = 0; i < all.size(); ++i) {
    const float x = mha::to_float(all[i]), hi = mha::to_float(row[i]),
                lo = mha::to_float(row[all.size() + i]);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(hi)) << "float16 bits " << i;
    } else {
      ASSERT_EQ(hi + lo, x) << "float16 bits " << i;  // hi + lo is exact in float: x has 11 bits
      ASSERT_EQ(static_cast<double>(hi) + lo, static_cast<double>(x)) << "float16 bits " << i;
      if (std::isinf(x)) EXPECT_EQ(lo, 0.0f) << "float16 bits " << i;
    }
  }
}

TEST(Bf16Gemm, Float16SplitProductsMatchTheExactSum) {
  mha::Generator gen(29);
  auto halves = [&](size_t count, double range) {
    std::vector<mha::float16> x(count);
    for (auto& e : x) e = mha::to_float16(static_cast<float>(gen.uniform(-range, range)));
    return x;
  };
  for (const auto [m, n, k] :
       {std::tuple<size_t, size_t, size_t>{96, 256, 64}, {13, 37, 19}, {1, 1, 1}, {32, 48, 128}})
    for (bg::Path path : bg::paths()) {
      const std::vector<mha::float16> a = halves(m * k, 300.0), x = halves(n * k, 0.01);  // x: Bᵀ rows
      const size_t depth = bg::split_depth(k), ldb = n + 16;
      std::vector<bfloat16> a_split(m * depth), bt(bg::packed_size(depth, ldb)), b_hi(bg::packed_size(k, n)),
          b_lo(bg::packed_size(k, n));
      for (size_t r = 0; r < m; ++r) bg::split_a(a.data() + r * k, k, a_split.data() + r * depth);
      bg::pack_split_b_transposed(x.data(), k, n, k, bt.data(), ldb);
      std::vector<mha::float16> b(k * n);  // B = Xᵀ row-major, for pack_split_b
      for (size_t kk = 0; kk < k; ++kk)
        for (size_t j = 0; j < n; ++j) b[kk * n + j] = x[j * k + kk];
      bg::pack_split_b(b.data(), n, k, n, b_hi.data(), b_lo.data());
      // A's rows unsplit for pack_split_b's products: A·B = A_hi·B_hi + A_lo·B_hi + A·B_lo, from
      // split_a's hi and lo parts (round_up(k, 8) apart).
      const size_t part = depth / 4;
      std::vector<bfloat16> a_hi(m * part), a_lo(m * part);
      for (size_t r = 0; r < m; ++r)
        for (size_t kk = 0; kk < part; ++kk) {
          a_hi[r * part + kk] = a_split[r * depth + kk];
          a_lo[r * part + kk] = a_split[r * depth + part + kk];
        }
      std::vector<float> from_bt(m * n), from_b(m * n, 0.0f);
      {
        const bg::ScopedPath pin(path);
        bg::multiply(m, n, depth, a_split.data(), depth, bt.data(), ldb, from_bt.data(), n, false);
        for (const auto& [a_part, b_part] : {std::pair{&a_hi, &b_hi}, std::pair{&a_lo, &b_hi},
                                             std::pair{&a_hi, &b_lo}, std::pair{&a_lo, &b_lo}})
          bg::multiply(m, n, k, a_part->data(), part, b_part->data(), n, from_b.data(), n, true);
      }
      const double gamma = 4.0 * k * std::ldexp(1.0, -24) / (1 - 4.0 * k * std::ldexp(1.0, -24));
      for (size_t r = 0; r < m; ++r)
        for (size_t j = 0; j < n; ++j) {
          double exact = 0, magnitude = 0;
          for (size_t kk = 0; kk < k; ++kk) {
            const double p = static_cast<double>(mha::to_float(a[r * k + kk])) * mha::to_float(x[j * k + kk]);
            exact += p;
            magnitude += std::abs(p);
          }
          const double bound = gamma * 1.01 * magnitude + std::numeric_limits<float>::min();
          ASSERT_LE(std::abs(from_bt[r * n + j] - exact), bound)
              << bg::name(path) << " from Bᵀ, m=" << m << " n=" << n << " k=" << k << ": row " << r
              << ", column " << j;
          ASSERT_LE(std::abs(from_b[r * n + j] - exact), bound)
              << bg::name(path) << " from B, m=" << m << " n=" << n << " k=" << k << ": row " << r
              << ", column " << j;
        }
    }
}

// Every path computes the same exact products as the float32 fallback and differs only in the
// order of its float additions: the same within that rounding on an attention tile; and
// ScopedPath caps the path while it lives.
TEST(Bf16Gemm, EveryPathAgreesWithTheFallbackWithinTheirRounding) {
  const std::vector<bg::Path> paths = bg::paths();
  ASSERT_EQ(paths.front(), bg::Path::float32);
  if (paths.size() == 1) GTEST_SKIP() << "this CPU has no bf16 instructions: only the fallback runs (checked above)";
  mha::Generator gen(22);
  const size_t m = 48, n = 256, k = 64;
  const std::vector<bfloat16> a = uniform(m * k, gen), b = uniform(k * n, gen);
  std::vector<bfloat16> packed(bg::packed_size(k, n));
  bg::pack_b(b.data(), n, k, n, packed.data());
  std::vector<float> fallback(m * n);
  {
    bg::ScopedFloat32Fallback pin;
    EXPECT_FALSE(bg::native());
    bg::multiply(m, n, k, a.data(), k, packed.data(), n, fallback.data(), n, false);
  }
  EXPECT_EQ(bg::path(), paths.back());
  const double u = std::ldexp(1.0, -24);
  for (bg::Path path : paths) {
    std::vector<float> out(m * n);
    {
      const bg::ScopedPath pin(path);
      EXPECT_EQ(bg::path(), path);
      bg::multiply(m, n, k, a.data(), k, packed.data(), n, out.data(), n, false);
    }
    for (size_t i = 0; i < m * n; ++i) {
      double magnitude = 0;
      for (size_t kk = 0; kk < k; ++kk)
        magnitude += std::abs(static_cast<double>(mha::to_float(a[i / n * k + kk])) * mha::to_float(b[kk * n + i % n]));
      ASSERT_LE(std::abs(out[i] - fallback[i]), 2 * k * u * magnitude) << bg::name(path) << ", element " << i;
    }
  }
}

// ---- PackedLinear -------------------------------------------------------------------------------

using mha::Tensor;

Tensor<float> uniform_float(const mha::Shape& shape, mha::Generator& gen) {
  Tensor<float> t(shape);
  for (float& v : t.values()) v = static_cast<float>(gen.uniform(-1.0, 1.0));
  return t;
}

Tensor<bfloat16> uniform_bf16(const mha::Shape& shape, mha::Generator& gen) {
  Tensor<bfloat16> t(shape);
  for (bfloat16& v : t.values()) v = mha::to_bfloat16(static_cast<float>(gen.uniform(-2.0, 2.0)));
  return t;
}

// y = bf16(f), f the float sum of the k exact products of x and the weight rounded to bfloat16,
// plus the bias: |f − exact| ≤ γ_(k+1)·(|b| + Σ|x·w|) (Higham §3.1, u = 2⁻²⁴), and the rounding
// to bfloat16 adds at most 2⁻⁸·|f| (its unit roundoff).
void expect_close_to_exact(const Tensor<bfloat16>& y, const Tensor<bfloat16>& x, const Tensor<float>& w,
                           const Tensor<float>& b, const std::string& where) {
  const int64_t out = w.size(0), in = w.size(1), m = x.numel() / in;
  const double u = std::ldexp(1.0, -24), gamma = (in + 1) * u / (1 - (in + 1) * u);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double exact = b.defined() ? b[o] : 0.0, magnitude = std::abs(exact);
      for (int64_t i = 0; i < in; ++i) {
        const double p = static_cast<double>(mha::to_float(x[r * in + i])) *
                         mha::to_float(mha::to_bfloat16(w[o * in + i]));
        exact += p;
        magnitude += std::abs(p);
      }
      const double f_bound = gamma * magnitude;
      const double bound =  // (+ the smallest normal float: the native rounding flushes subnormals)
          f_bound + std::ldexp(1.0, -8) * (std::abs(exact) + f_bound) + std::numeric_limits<float>::min();
      ASSERT_LE(std::abs(mha::to_float(y[r * out + o]) - exact), bound) << where << ": row " << r << ", column " << o;
    }
}

TEST(Bf16PackedLinear, MatchesTheExactSumOnEveryPath) {
  mha::Generator gen(31);
  // Rows and columns past one block of 64, ragged ends, an odd depth, one row, no bias.
  for (auto [m, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 3}, {70, 96, 130}, {5, 33, 64}, {130, 384, 200}})
    for (bool with_bias : {true, false})
      for (bg::Path path : bg::paths()) {
        const Tensor<float> w = uniform_float({out, in}, gen), b = with_bias ? uniform_float({out}, gen) : Tensor<float>();
        const Tensor<bfloat16> x = uniform_bf16({m, in}, gen);
        const bg::ScopedPath pin(path);
        const bg::PackedLinear linear(w, b.defined() ? mha::View<const float>(b) : mha::View<const float>());
        const Tensor<bfloat16> y = linear.forward(x);
        ASSERT_EQ(y.shape(), (mha::Shape{m, out}));
        expect_close_to_exact(y, x, w, b, std::string(bg::name(path)) +
                                              " m=" + std::to_string(m) + " in=" + std::to_string(in) +
                                              " out=" + std::to_string(out) + (with_bias ? "" : ", no bias"));
      }
}

// The thread count changes nothing; the epilogue sees every value once, in float, and what it
// leaves is stored.
TEST(Bf16PackedLinear, ThreadsAndEpilogue) {
  mha::Generator gen(32);
  const int64_t in = 96, out = 200;
  const Tensor<float> w = uniform_float({out, in}, gen), b = uniform_float({out}, gen);
  const Tensor<bfloat16> x = uniform_bf16({3, 70, in}, gen);
  for (bg::Path path : bg::paths()) {
    const bg::ScopedPath pin(path);
    const bg::PackedLinear linear(w, b);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const Tensor<bfloat16> one = linear.forward(x);
    omp_set_num_threads(2);
    const Tensor<bfloat16> two = linear.forward(x);
    Tensor<bfloat16> doubled({3, 70, out});
    Tensor<int32_t> seen({3 * 70, out});
    linear.forward(x, doubled, [&](int64_t row, int64_t col, float* values, int64_t count) {
      for (int64_t j = 0; j < count; ++j) {
        ++seen[row * out + col + j];
        values[j] *= 2;
      }
    });
    omp_set_num_threads(saved);
    ASSERT_EQ(one.shape(), (mha::Shape{3, 70, out}));
    for (int64_t i = 0; i < one.numel(); ++i) {
      ASSERT_EQ(one[i].bits, two[i].bits) << "element " << i << ", " << bg::name(path);
      ASSERT_EQ(seen[i], 1) << "element " << i;
      // Doubling commutes with rounding to bfloat16 (no overflow here).
      ASSERT_EQ(mha::to_float(doubled[i]), 2 * mha::to_float(one[i])) << "element " << i;
    }
  }
}

// Where the products run in float the layer keeps its rounded weight widened in float panels
// (bf16_gemm.h): the same bits as multiply_blocks' float32 path on the pairs, for every target,
// and, built on one target and run on another, the pairs' path or panel_gemm's error.
TEST(Bf16PackedLinear, FloatPanelsGiveTheFloat32PathsBits) {
  mha::Generator gen(33);
  const int64_t in = 200, out = 130;
  const Tensor<float> w = uniform_float({out, in}, gen), b = uniform_float({out}, gen);
  Tensor<bfloat16> rounded({out, in});
  mha::convert(w.data(), rounded.data(), static_cast<size_t>(out * in));
  std::vector<bfloat16> pairs(bg::packed_size(in, out));
  bg::pack_b_transposed(rounded.data(), in, out, in, pairs.data());
  // y = x·Wᵀ + b on multiply_blocks' float32 path, rounded once.
  auto expected = [&](const Tensor<bfloat16>& x) {
    const int64_t m = x.size(0);
    Tensor<bfloat16> y({m, out});
    bg::multiply_blocks(m, out, in, x.data(), in, pairs.data(), out,
                        [&](int64_t row, int64_t col, float* values, int64_t count) {
                          for (int64_t j = 0; j < count; ++j) values[j] += b[col + j];
                          mha::convert(values, y.data() + row * out + col, static_cast<size_t>(count));
                        });
    return y;
  };
  auto expect_bits = [](const Tensor<bfloat16>& y, const Tensor<bfloat16>& want, const std::string& what) {
    ASSERT_EQ(y.shape(), want.shape()) << what;
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y[i].bits, want[i].bits) << what << ", element " << i;
  };
  const bg::ScopedFloat32Fallback float32;
  for (const std::string& target : mha::simd_targets()) {
    const mha::ScopedSimdTarget pin(target);
    for (const int64_t m : {int64_t{1}, int64_t{19}, int64_t{70}}) {
      const Tensor<bfloat16> x = uniform_bf16({m, in}, gen);
      expect_bits(bg::PackedLinear(w, b).forward(x), expected(x), target + ", m = " + std::to_string(m));
    }
  }
  // Built for one panel width and run on another: the pairs' float32 path where the CPU has the
  // bf16 instructions (the pairs are kept), else panel_gemm's error naming the change.
  const std::vector<std::string> targets = mha::simd_targets();
  for (const char* other : {"SSE4", "SCALAR"}) {
    if (targets.front() == other || std::find(targets.begin(), targets.end(), other) == targets.end()) continue;
    std::optional<bg::PackedLinear> linear;
    {
      const mha::ScopedSimdTarget pin(targets.front());
      linear.emplace(w, b);
    }
    const mha::ScopedSimdTarget pin(other);
    const Tensor<bfloat16> x = uniform_bf16({5, in}, gen);
    try {
      expect_bits(linear->forward(x), expected(x), std::string("built for ") + targets.front() + ", run on " + other);
    } catch (const mha::Error& e) {
      EXPECT_NE(std::string(e.what()).find("pack it again after pinning a target"), std::string::npos) << e.what();
    }
  }
}

// Asking for the CPU's path (libxsmm_init inside) and multiplying leave no OMP_PROC_BIND behind
// (libxsmm 1.17 sets it; an OpenMP runtime loaded later would then bind its threads to one core).
TEST(Bf16PackedLinear, LeavesTheEnvironmentAsItWas) {
  if (std::getenv("OMP_PROC_BIND") || std::getenv("KMP_AFFINITY") || std::getenv("GOMP_CPU_AFFINITY"))
    GTEST_SKIP() << "an affinity variable is set in this environment";
  mha::Generator gen(34);
  const Tensor<float> w = uniform_float({40, 24}, gen);
  for (bg::Path path : bg::paths()) {
    const bg::ScopedPath pin(path);
    bg::PackedLinear(w, {}).forward(uniform_bf16({3, 24}, gen));
    EXPECT_EQ(std::getenv("OMP_PROC_BIND"), nullptr) << bg::name(path);
  }
}

TEST(Bf16PackedLinear, BadInputsAreErrorsNamingTheArgument) {
  using mha::testing::throws_error;
  const Tensor<float> w({4, 3});
  EXPECT_TRUE(throws_error([&] { bg::PackedLinear(Tensor<float>({12}), {}, "q"); }, {"q: weight", "2-D", "[12]"}));
  EXPECT_TRUE(throws_error([&] { bg::PackedLinear(w, Tensor<float>({3}), "q"); }, {"q: bias", "(4)", "[3]"}));
  const bg::PackedLinear linear(w, {}, "q");
  EXPECT_TRUE(throws_error([&] { linear.forward(Tensor<bfloat16>({2, 4})); }, {"q: input", "(..., 3)", "[2, 4]"}));
  Tensor<bfloat16> wrong({2, 5});
  EXPECT_TRUE(throws_error([&] { linear.forward(Tensor<bfloat16>({2, 3}), wrong); }, {"q: output", "[2, 4]", "[2, 5]"}));
}

// gemm<bfloat16>, the bfloat16 layers' BLAS-style product: every transposition, beta 0 (C ignored,
// NaN there included) and 1, both product paths; each element within γ_(k+1)·(|beta·C| + Σ|a·b|)
// of the exact value plus its rounding to bfloat16 (2⁻⁸ relative); bitwise the same on 1 and 2
// threads.
TEST(Bf16Gemm, BlasStyleGemmRoundsOnce) {
  mha::Generator gen(33);
  const int64_t m = 70, n = 130, k = 45;
  for (bg::Path path : bg::paths())
    for (auto ta : {mha::Transpose::no, mha::Transpose::yes})
      for (auto tb : {mha::Transpose::no, mha::Transpose::yes})
        for (double beta : {0.0, 1.0}) {
          // A stored m × k (or k × m), B stored k × n (or n × k), C m × n with a wider stride.
          const int64_t lda = ta == mha::Transpose::no ? k + 3 : m + 1, ldb = tb == mha::Transpose::no ? n : k, ldc = n + 5;
          const std::vector<bfloat16> a = uniform(static_cast<size_t>((ta == mha::Transpose::no ? m : k) * lda), gen);
          const std::vector<bfloat16> b = uniform(static_cast<size_t>((tb == mha::Transpose::no ? k : n) * ldb), gen);
          std::vector<bfloat16> c0 = uniform(static_cast<size_t>(m * ldc), gen);
          if (beta == 0.0) c0[3] = bfloat16{0x7fc0};  // NaN: ignored
          auto at = [&](int64_t r, int64_t kk) {
            return mha::to_float(ta == mha::Transpose::no ? a[static_cast<size_t>(r * lda + kk)] : a[static_cast<size_t>(kk * lda + r)]);
          };
          auto bt = [&](int64_t kk, int64_t j) {
            return mha::to_float(tb == mha::Transpose::no ? b[static_cast<size_t>(kk * ldb + j)] : b[static_cast<size_t>(j * ldb + kk)]);
          };
          const bg::ScopedPath pin(path);
          std::vector<bfloat16> one = c0, two = c0;
          const int saved = omp_get_max_threads();
          omp_set_num_threads(1);
          mha::gemm<bfloat16>(ta, tb, m, n, k, mha::to_bfloat16(1.0f), a.data(), lda, b.data(), ldb,
                              mha::to_bfloat16(static_cast<float>(beta)), one.data(), ldc);
          omp_set_num_threads(2);
          mha::gemm<bfloat16>(ta, tb, m, n, k, mha::to_bfloat16(1.0f), a.data(), lda, b.data(), ldb,
                              mha::to_bfloat16(static_cast<float>(beta)), two.data(), ldc);
          omp_set_num_threads(saved);
          const double u = std::ldexp(1.0, -24), gamma = (k + 1) * u / (1 - (k + 1) * u);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t i = static_cast<size_t>(r * ldc + j);
              ASSERT_EQ(one[i].bits, two[i].bits) << "row " << r << ", column " << j;
              if (j >= n) {
                ASSERT_EQ(one[i].bits, c0[i].bits) << "past n";
                continue;
              }
              double exact = beta == 0.0 ? 0.0 : beta * mha::to_float(c0[i]), magnitude = std::abs(exact);
              for (int64_t kk = 0; kk < k; ++kk) {
                const double p = static_cast<double>(at(r, kk)) * bt(kk, j);
                exact += p;
                magnitude += std::abs(p);
              }
              const double f = gamma * magnitude, bound = f + std::ldexp(1.0, -8) * (std::abs(exact) + f) + 1e-37;
              ASSERT_LE(std::abs(mha::to_float(one[i]) - exact), bound)
                  << bg::name(path) << (ta == mha::Transpose::yes ? " Aᵀ" : " A")
                  << (tb == mha::Transpose::yes ? " Bᵀ" : " B") << " beta " << beta << ", row " << r << ", column " << j;
            }
        }
}

}  // namespace
