// bf16 × bf16 → float products (mha/core/bf16_gemm.h), on the CPU's bf16 instructions where it has
// them and on the float32 fallback always, against the sum written out in double here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mha/core/bf16_gemm.h"
#include "mha/core/random.h"

namespace {

using mha::bfloat16;
namespace bg = mha::bf16_gemm;

std::vector<bfloat16> uniform(size_t count, mha::Generator& gen) {
  std::vector<bfloat16> x(count);
  for (bfloat16& e : x) e = mha::to_bfloat16(static_cast<float>(gen.uniform(-2.0, 2.0)));
  return x;
}

// The paths to check, as "forced to the float32 fallback": always, and not where this CPU has the
// bf16 instructions.
std::vector<bool> fallbacks() { return bg::native() ? std::vector<bool>{true, false} : std::vector<bool>{true}; }

struct Case {
  size_t m, n, k, lda, ldc;
};

// C = (C0 +) A·B for A m × k (row stride lda) and B k × n given as X = B (pack_b) or X = Bᵀ
// (pack_b_transposed), against the exact sum in double: every bf16 product is exact in float, so a
// float sum of k of them (plus C0) is within γ_(k+1)·(|C0| + Σ|a·b|), γ_j = j·u/(1 − j·u), u = 2⁻²⁴
// (Higham §3.1), in whatever order the path adds them. Columns past n are left as they were.
void check(const Case& c, bool transposed, bool accumulate, bool fallback, mha::Generator& gen) {
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
    std::optional<bg::ScopedFloat32Fallback> pin;
    if (fallback) pin.emplace();
    bg::multiply(c.m, c.n, c.k, a.data(), c.lda, packed.data(), c.n, out.data(), c.ldc, accumulate);
  }
  const std::string where = std::string(fallback ? "float32 fallback" : "bf16 instructions") + " m=" +
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
  // odd depths and widths with even and odd row strides of A, one row, one column, depth 0 and 1.
  const std::vector<Case> cases = {{48, 256, 64, 64, 256}, {96, 64, 256, 256, 64}, {12, 272, 64, 70, 280},
                                   {7, 33, 17, 18, 40},    {7, 33, 17, 17, 40},    {1, 1, 1, 2, 1},
                                   {5, 3, 0, 2, 3},        {6, 64, 1, 3, 64},      {13, 100, 129, 130, 101},
                                   {13, 100, 129, 131, 101}};
  for (bool fallback : fallbacks())
    for (const Case& c : cases)
      for (bool transposed : {false, true})
        for (bool accumulate : {false, true}) check(c, transposed, accumulate, fallback, gen);
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
  for (bool fallback : fallbacks())
    for (bool transposed : {false, true}) {
      std::vector<bfloat16> packed(bg::packed_size(K, N));
      if (transposed) {
        bg::pack_b_transposed(bt.data(), K, N, K, packed.data());
      } else {
        bg::pack_b(b.data(), N, K, N, packed.data());
      }
      for (const auto [kk0, k, c0, n] : {std::tuple<size_t, size_t, size_t, size_t>{0, 40, 0, 300},
                                         {8, 17, 16, 33}, {2, 37, 250, 50}, {38, 1, 5, 7}}) {
        std::vector<float> out(m * n);
        {
          std::optional<bg::ScopedFloat32Fallback> pin;
          if (fallback) pin.emplace();
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
                << (fallback ? "fallback" : "native") << (transposed ? " from Bᵀ" : " from B") << " rows " << kk0
                << "+" << k << " columns " << c0 << "+" << n << ": row " << r << ", column " << j;
          }
      }
    }
}

// The bf16 instructions and the float32 fallback compute the same exact products and differ only
// in the order of their float additions: the same within that rounding on an attention tile.
TEST(Bf16Gemm, NativeAndFallbackAgreeWithinTheirRounding) {
  if (!bg::native()) GTEST_SKIP() << "this CPU has no AVX512_BF16: only the fallback runs (checked above)";
  mha::Generator gen(22);
  const size_t m = 48, n = 256, k = 64;
  const std::vector<bfloat16> a = uniform(m * k, gen), b = uniform(k * n, gen);
  std::vector<bfloat16> packed(bg::packed_size(k, n));
  bg::pack_b(b.data(), n, k, n, packed.data());
  std::vector<float> native(m * n), fallback(m * n);
  bg::multiply(m, n, k, a.data(), k, packed.data(), n, native.data(), n, false);
  {
    bg::ScopedFloat32Fallback pin;
    EXPECT_FALSE(bg::native());
    bg::multiply(m, n, k, a.data(), k, packed.data(), n, fallback.data(), n, false);
  }
  EXPECT_TRUE(bg::native());
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < m * n; ++i) {
    double magnitude = 0;
    for (size_t kk = 0; kk < k; ++kk)
      magnitude += std::abs(static_cast<double>(mha::to_float(a[i / n * k + kk])) * mha::to_float(b[kk * n + i % n]));
    ASSERT_LE(std::abs(native[i] - fallback[i]), 2 * k * u * magnitude) << "element " << i;
  }
}

}  // namespace
