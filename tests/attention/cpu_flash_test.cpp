// The cpu_flash backend against the reference, under the FlashAttention rule: on the same float
// inputs, with ref64 the reference run in double and ref32 the reference run in float,
//   max|flash − ref64| <= 2·max|ref32 − ref64| + 1e-6
// for the output, the logsumexp and the three gradients. The sweep covers the sequence lengths
// and head sizes of the contract (every length as L and as S with every head size), every mask
// kind and broadcast shape, both causal alignments, GQA, dropout, custom and negative scales and
// fully masked rows; then the weights, bitwise determinism across thread counts, the edge cases
// (huge finite mask fill, NaN rows), bad input, and every SIMD target compiled in.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/core/simd.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using namespace test_cases;

BackendCheck check_case{Backend::cpu_flash};  // against the reference, under FlashAttention's rule

// Every pair (L, S) of lengths, each length as L and as S (by diagonals: S is `shift` lengths
// further on), with every head size (run_sweep).
TEST(CpuFlash, MatchesReferenceOverTheSweep) {
  const int64_t lengths[] = {1, 7, 64, 97, 1025};
  Sweep sweep{.heads = {{2, 2}, {4, 2}, {6, 1}, {1, 1}}, .first_seed = 1000};
  for (int shift = 0; shift < 5; ++shift)
    for (int i = 0; i < 5; ++i) sweep.lengths.emplace_back(lengths[i], lengths[(i + shift) % 5]);
  check_case.sweep(sweep);
}

// Long sequences on both sides at once, with the features that change the tile walk.
TEST(CpuFlash, MatchesReferenceOnLongSequences) {
  Case c = sized(1, 2, 1, 1025, 1025, 64, 64);
  c.scoring.causal = Causal::top_left;
  c.mask = MaskKind::additive_2d;
  check_case(c, 7);
  c.q_len = 300;
  c.scoring.causal = Causal::bottom_right;
  c.mask = MaskKind::bool_2d;
  c.scoring.dropout_p = 0.2;
  check_case(c, 8);
}

// More keys than kLongKeys (16384): the forward shares one packed kv head between threads and
// the backward takes the keys in segments with D from a first sweep. Few queries keep the
// reference cheap; GQA, masks, both causal alignments, dropout and ragged sizes all cross the
// segment boundaries (4096 keys).
TEST(CpuFlash, MatchesReferenceOnLongKeySequences) {
  Case c = sized(1, 4, 2, 100, 16385 + 97, 59, 24);
  c.mask = MaskKind::bool_padding;
  check_case(c, 51);
  c = sized(2, 4, 2, 7, 16385 + 97, 59, 24);
  c.scoring.causal = Causal::bottom_right;
  c.mask = MaskKind::additive_heads;
  c.scoring.dropout_p = 0.2;
  check_case(c, 52);
  // top-left: the first 4096 queries see only the first segment, none the last three
  c = sized(1, 1, 1, 4500, 16385, 8, 8);
  c.scoring.causal = Causal::top_left;
  check_case(c, 53);
}

// L > S bottom-right: the first L − S queries see no key; plus a mask row that blocks everything.
TEST(CpuFlash, FullyMaskedRowsGiveZeroOutputAndGradient) {
  Case c = sized(1, 2, 1, 97, 7, 59, 59);
  c.scoring.causal = Causal::bottom_right;
  c.mask = MaskKind::bool_2d;
  check_case(c, 21);
  Inputs in = make_inputs(c, 21);
  for (int64_t j = 0; j < c.k_len; ++j) (*in.attend)[96 * c.k_len + j] = false;  // the last row sees nothing
  const Results<float> flash = run<float>(c, in, Backend::cpu_flash);
  for (int64_t h = 0; h < c.q_heads; ++h) {
    for (int64_t i : {int64_t{0}, c.q_len - c.k_len - 1, c.q_len - 1}) {
      const int64_t row = h * c.q_len + i;
      EXPECT_EQ(flash.fwd.logsumexp[row], -INFINITY) << "row " << i;
      for (int64_t d = 0; d < c.v_dim; ++d) EXPECT_EQ(flash.fwd.output[row * c.v_dim + d], 0.0f);
      for (int64_t d = 0; d < c.qk_dim; ++d) EXPECT_EQ(flash.grads.grad_query[row * c.qk_dim + d], 0.0f);
    }
  }
}

// The (B, Hq, L, S) weights (after dropout), only materialised when asked for.
TEST(CpuFlash, WeightsMatchReference) {
  Case c = sized(2, 4, 2, 97, 300, 59, 59);
  c.need_weights = true;
  for (MaskKind mask : {MaskKind::none, MaskKind::both}) {
    c.mask = mask;
    c.scoring.causal = mask == MaskKind::none ? Causal::top_left : Causal::bottom_right;
    c.scoring.dropout_p = mask == MaskKind::none ? 0.0 : 0.2;
    check_case(c, 31);
  }
}

// The same output and gradients, bit for bit, for 1, 2, 3 and 8 threads, with shapes that split the
// queries of the backward into chunks (B·Hkv = 1) and that do not (B·Hkv = 12), and with long keys.
TEST(CpuFlash, BitwiseIdenticalForAnyThreadCount) {
  Case few = sized(1, 2, 1, 200, 1025, 64, 64);
  few.scoring.causal = Causal::bottom_right;
  few.scoring.dropout_p = 0.1;
  few.mask = MaskKind::additive_2d;
  Case many = few;
  many.batch = 2;
  many.q_heads = 12;
  many.kv_heads = 6;
  many.k_len = 97;
  Case long_keys = few;  // segmented backward, shared packs in the forward
  long_keys.q_len = 50;
  long_keys.k_len = 16385 + 300;
  Case long_chunks = long_keys;  // 80 items (2 heads × 40 blocks): 16 chunks of 5, dealt back and forth
  long_chunks.q_len = 3840;
  long_chunks.scoring.causal = Causal::top_left;
  long_chunks.mask = MaskKind::none;
  for (const Case& c : {few, many, long_keys, long_chunks}) {
    SCOPED_TRACE(c.describe());
    const Inputs in = make_inputs(c, 41);
    expect_bitwise_on_thread_counts([&] { return run<float>(c, in, Backend::cpu_flash); });
  }
}

// A −1e9 fill makes every score of the row −1e9 in float (q·k is rounded away), so P = 1/S:
// with one query, output = mean(v) and grad_value_j = 1/S. The double logsumexp keeps log S,
// which a float would round away (then the backward's exp(s − lse) would give P = 1).
TEST(CpuFlash, HugeFiniteMaskFillKeepsExactGradients) {
  const int64_t S = 4;
  Tensor<float> q({1, 1, 1, 2}, {0.3f, -0.2f}), k({1, 1, S, 2}), v({1, 1, S, 1}, {1, 2, 3, 4});
  for (int64_t i = 0; i < k.numel(); ++i) k[i] = 0.1f * static_cast<float>(i);
  Tensor<float> additive({1, S}, -1e9f), dout({1, 1, 1, 1}, {1.0f});
  Options<float> opt;
  opt.additive_mask = additive;
  opt.backend = Backend::cpu_flash;
  auto r = sdpa_forward(q, k, v, opt);
  EXPECT_NEAR(r.output[0], 2.5f, 1e-6f);
  auto g = sdpa_backward(q, k, v, r.output, r.logsumexp, dout, opt);
  for (int64_t j = 0; j < S; ++j) EXPECT_NEAR(g.grad_value[j], 0.25f, 1e-6f) << "key " << j;
  // dq = scale Σ_j P_j (v_j − o) k_j = (1/√2)(1/4) Σ_j (v_j − 2.5) k_j = (1, 1)/(4√2).
  for (int64_t d = 0; d < 2; ++d) EXPECT_NEAR(g.grad_query[d], 1 / (4 * std::sqrt(2.0f)), 1e-6f);
  opt.backend = Backend::reference;
  auto g_ref = sdpa_backward(q, k, v, r.output, r.logsumexp, dout, opt);
  EXPECT_LT(max_diff(g.grad_key, g_ref.grad_key), 1e-6);
}

// NaN is not "masked": a NaN query makes its row NaN (output and weights), other rows are clean,
// as in the reference, on a length that spans several key blocks.
TEST(CpuFlash, NanPropagatesThroughItsRowOnly) {
  Generator gen(5);
  Tensor<float> q = random_tensor({1, 1, 70, 8}, gen), k = random_tensor({1, 1, 600, 8}, gen);
  Tensor<float> v = random_tensor({1, 1, 600, 3}, gen);
  q[5 * 8 + 2] = std::nanf("");
  Options<float> opt;
  opt.need_weights = true;
  opt.backend = Backend::cpu_flash;
  auto r = sdpa_forward(q, k, v, opt);
  for (int64_t i = 0; i < 70; ++i) {
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(std::isnan(r.output[i * 3 + d]), i == 5) << "row " << i;
    EXPECT_EQ(std::isnan(r.logsumexp[i]), i == 5);
    EXPECT_EQ(std::isnan((*r.weights)[i * 600 + 123]), i == 5);
  }
}

TEST(CpuFlash, AutomaticPicksCpuFlashForFloatAndReferenceForDouble) {
  Generator gen(6);
  Tensor<float> q = random_tensor({1, 2, 33, 16}, gen), k = random_tensor({1, 2, 40, 16}, gen);
  Tensor<float> v = random_tensor({1, 2, 40, 16}, gen);
  Options<float> automatic, flash;
  flash.backend = Backend::cpu_flash;
  EXPECT_EQ(max_diff(sdpa_forward(q, k, v, automatic).output, sdpa_forward(q, k, v, flash).output), 0.0);
  const Tensor<double> qd = mha::cast<double>(q), kd = mha::cast<double>(k), vd = mha::cast<double>(v);
  Options<double> automatic64, reference64;
  reference64.backend = Backend::reference;
  EXPECT_EQ(max_diff(sdpa_forward(qd, kd, vd, automatic64).output, sdpa_forward(qd, kd, vd, reference64).output), 0.0);
}

TEST(CpuFlash, RefusesDouble) {
  Tensor<double> q({1, 1, 3, 4}), k({1, 1, 5, 4}), v({1, 1, 5, 4});
  Options<double> opt;
  opt.backend = Backend::cpu_flash;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "options.backend: cpu_flash supports float32, bfloat16 and float16");
  auto fwd = sdpa_forward(q, k, v);
  expect_error([&] { sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, fwd.output, opt); },
               "options.backend: cpu_flash supports float32, bfloat16 and float16");
}

// Every SIMD target compiled in and supported here (AVX-512, AVX2, SSE4, SSSE3, emulated
// 128-bit or scalar) runs a few sweep cases, so a CI machine without AVX-512 runs the code it
// will really use, and this machine checks the code paths it would not otherwise take.
// The references are computed once, before the targets.
TEST(CpuFlash, EveryCompiledTargetMatchesReference) {
  const std::vector<std::string> targets = simd_targets();
  ASSERT_FALSE(targets.empty());
  Case masked = sized(1, 4, 2, 97, 300, 59, 24);
  masked.mask = MaskKind::both;
  masked.scoring.causal = Causal::top_left;
  masked.need_weights = true;
  Case dropout = sized(1, 4, 2, 7, 300, 64, 64);
  dropout.scoring.dropout_p = 0.2;
  dropout.need_weights = true;
  const Reference masked_ref = reference_of(masked, 51, true), dropout_ref = reference_of(dropout, 52, true);
  for (const std::string& target : targets) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    check_case(masked, masked_ref);
    check_case(dropout, dropout_ref);
    // NaN still reaches its row on every target (the exponential relies on no special case).
    Tensor<float> q({1, 1, 2, 2}, {std::nanf(""), 1.0f, 0.5f, 0.5f}), k({1, 1, 3, 2}, 0.25f), v({1, 1, 3, 1}, 1.0f);
    Options<float> opt;
    opt.backend = Backend::cpu_flash;
    auto r = sdpa_forward(q, k, v, opt);
    EXPECT_TRUE(std::isnan(r.output[0]));
    EXPECT_NEAR(r.output[1], 1.0f, 1e-6f);
  }
}

}  // namespace
}  // namespace mha::attention
