// The decode backend against the reference, under the FlashAttention rule (as cpu_flash_test):
// on the same float inputs, with ref64 the reference in double and ref32 the reference in float,
//   max|decode − ref64| <= 2·max|ref32 − ref64| + 1e-6
// for the output and the logsumexp. The sweep covers 1 to 16 query rows against key lengths
// that end inside, at and past chunk boundaries, every mask kind, both causal alignments, GQA
// and MQA, dropout and scales; then bfloat16/float16 keys and values, fully masked and NaN rows,
// the automatic choice, bitwise determinism across thread counts, bad input and every SIMD target.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <filesystem>

#include "../support/assertions.h"
#include "../support/golden.h"
#include "../support/attention_cases.h"
#include "mha/attention/attention.h"
#include "mha/core/half.h"
#include "mha/core/safetensors.h"
#include "mha/core/simd.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using namespace test_cases;

// The forward only: the backward of a decode call is cpu_flash's.
BackendCheck check_case{Backend::decode};
FlashRule& rule = check_case.rule;

// Query lengths 1..16 against key lengths around the chunk sizes (256 keys for up to 7 rows per
// kv head, more for more rows), head sizes whole and ragged against the vector width (run_sweep).
TEST(Decode, MatchesReferenceOverTheSweep) {
  check_case.sweep({.lengths = every_pair({1, 2, 5, 16}, {1, 7, 97, 256, 257, 1025, 4099}),
                    .heads = {{2, 2}, {4, 2}, {6, 1}, {1, 1}, {32, 8}},
                    .first_seed = 3000});
}

// Many rows per kv head (MQA, 32 heads × 16 queries = 512 rows: row blocks of 64 and chunks of
// 4096 keys), and long caches with 1 row (many chunks of 256).
TEST(Decode, MatchesReferenceWithManyRowsAndLongCaches) {
  Case c = sized(1, 32, 1, 16, 5000, 64, 64);
  c.scoring.causal = Causal::bottom_right;
  c.mask = MaskKind::bool_padding;
  check_case(c, 61);
  c = sized(1, 4, 4, 1, 20000, 64, 64);
  c.scoring.causal = Causal::bottom_right;
  c.mask = MaskKind::additive_heads;
  c.scoring.dropout_p = 0.1;
  check_case(c, 62);
}

// L > S bottom-right: the first queries see no key (output 0, logsumexp −inf, no NaN); a NaN
// score reaches its row only.
TEST(Decode, FullyMaskedAndNaNRows) {
  Case c = sized(1, 2, 1, 12, 5, 16, 16);
  c.scoring.causal = Causal::bottom_right;
  check_case(c, 71);
  const Inputs in = make_inputs(c, 71);
  const ForwardResult<float> r = run_forward<float>(c, in, Backend::decode);
  for (int64_t h = 0; h < c.q_heads; ++h) {
    for (int64_t i = 0; i < c.q_len - c.k_len; ++i) {
      const int64_t row = h * c.q_len + i;
      EXPECT_EQ(r.logsumexp[row], -INFINITY) << "row " << i;
      for (int64_t e = 0; e < c.v_dim; ++e) EXPECT_EQ(r.output[row * c.v_dim + e], 0.0f);
    }
  }
  Tensor<float> q({1, 1, 2, 2}, {std::nanf(""), 1.0f, 0.5f, 0.5f}), k({1, 1, 300, 2}, 0.25f), v({1, 1, 300, 1}, 1.0f);
  Options<float> opt;
  opt.backend = Backend::decode;
  const auto nan_row = sdpa_forward(q, k, v, opt);
  EXPECT_TRUE(std::isnan(nan_row.output[0]));
  EXPECT_TRUE(std::isnan(nan_row.logsumexp[0]));
  EXPECT_NEAR(nan_row.output[1], 1.0f, 1e-6f);
}

// automatic sends float calls of at most 16 query rows without weights to decode, others to
// cpu_flash; the backward of a decode call is cpu_flash's.
TEST(Decode, AutomaticChoosesDecodeForFewQueryRows) {
  for (int64_t L : {1, 16, 17}) {
    const Case c = sized(1, 4, 2, L, 700, 32, 32);
    const Inputs in = make_inputs(c, 81);
    const Backend expected = L <= 16 ? Backend::decode : Backend::cpu_flash;
    EXPECT_TRUE(bitwise_equal(run_forward<float>(c, in, Backend::automatic).output, run_forward<float>(c, in, expected).output))
        << "L " << L;
  }
}

// The backward of a decode call recomputes the probabilities as cpu_flash does, from a logsumexp
// of the same scores: with large logits (inputs up to ±9, as PyTorch's OpInfo samples draw them:
// |s| up to ~200) a logsumexp of decode's own scores, summed in another order, put grad_value
// 5e-6 to 1e-5 off (25× PyTorch's float error). grad_value, which does not read the output, is
// cpu_flash's bit for bit, and every gradient keeps FlashAttention's rule, with 1e-6 of the
// largest value as the Python tests have it (gradients here reach ~10: cpu_flash's own
// grad_query is 4.2e-6 off where twice the float reference's error + 1e-6 allows 3.9e-6).
TEST(Decode, BackwardRecomputesTheScoresItsLogsumexpIsOf) {
  FlashRule rule{"decode backward", true};
  for (Causal causal : {Causal::none, Causal::top_left}) {
    Case c = sized(4, 1, 1, 3, 6, 8, 8);
    c.scoring.causal = causal;
    Inputs in = make_inputs(c, 83);
    for (Tensor<float>* t : {&in.q, &in.k, &in.v})
      for (auto& x : t->values()) x = std::clamp(3 * x, -9.0f, 9.0f);
    const auto decode = run<float>(c, in, Backend::decode);
    const auto flash = run<float>(c, in, Backend::cpu_flash);
    const auto ref32 = run<float>(c, in, Backend::reference);
    const auto ref64 = run<double>(c, in, Backend::reference);
    EXPECT_TRUE(bitwise_equal(decode.grads.grad_value, flash.grads.grad_value)) << c.describe();
    rule.expect(decode.grads.grad_query, ref32.grads.grad_query, ref64.grads.grad_query, c.describe() + " grad_query");
    rule.expect(decode.grads.grad_key, ref32.grads.grad_key, ref64.grads.grad_key, c.describe() + " grad_key");
    rule.expect(decode.grads.grad_value, ref32.grads.grad_value, ref64.grads.grad_value, c.describe() + " grad_value");
  }
}

// Chunk boundaries depend on the shape only: 1, 2, 3 and 8 threads give the same bits, with one row,
// a GQA group of 4 rows, and 64 rows per kv head.
TEST(Decode, BitwiseIdenticalForAnyThreadCount) {
  for (int64_t L : {1, 16}) {
    Case c = sized(1, 8, 2, L, 5000, 64, 64);
    c.scoring.causal = Causal::bottom_right;
    c.mask = MaskKind::additive_2d;
    c.scoring.dropout_p = 0.1;
    SCOPED_TRACE(c.describe());
    const Inputs in = make_inputs(c, 91);
    on_thread_counts([&] { return run_forward<float>(c, in, Backend::decode); }, [](const auto& one, const auto& other) {
      EXPECT_TRUE(bitwise_equal(one.output, other.output));
      EXPECT_TRUE(bitwise_equal(one.logsumexp, other.logsumexp));
    });
  }
}

// Keys and values stored in bfloat16 or float16: decode converts blocks as it reads them and
// computes in float. The check: the reference in double and in float on the same (rounded) keys
// and values, under the FlashAttention rule; the reference and cpu_flash backends on half
// storage are the float calls on the converted values, bit for bit.
// A float tensor stored as Kv (rounded), and back.
template <class To, class From>
Tensor<To> converted(const Tensor<From>& x) {
  Tensor<To> out(x.shape());
  convert(x.data(), out.data(), static_cast<size_t>(x.numel()));
  return out;
}

template <class Kv>
void check_half_storage(const Case& c, uint64_t seed) {
  SCOPED_TRACE(std::string(storage_name<Kv>()) + " " + c.describe());
  Inputs in = make_inputs(c, seed);
  const Tensor<Kv> k = converted<Kv>(in.k), v = converted<Kv>(in.v);
  in.k = converted<float>(k);  // the values the half storage holds
  in.v = converted<float>(v);
  for (Backend backend : {Backend::decode, Backend::reference, Backend::cpu_flash}) {
    Held<float> held;
    const Options<float> opt = options_of<float>(c, in, backend, held);
    Tensor<float> out({c.batch, c.q_heads, c.q_len, c.v_dim});
    Tensor<double> lse({c.batch, c.q_heads, c.q_len});
    sdpa_forward_into(in.q, k, v, {out, lse, {}}, opt);
    const ForwardResult<float> on_float = run_forward<float>(c, in, backend);
    if (backend == Backend::decode) {
      rule.expect(out, run_forward<float>(c, in, Backend::reference).output,
                        run_forward<double>(c, in, Backend::reference).output, "output");
      EXPECT_TRUE(bitwise_equal(out, on_float.output)) << "decode: half storage differs from its float values";
    } else {
      EXPECT_TRUE(bitwise_equal(out, on_float.output)) << "backend " << static_cast<int>(backend);
    }
  }
}

TEST(Decode, HalfPrecisionKeysAndValues) {
  Case c;
  for (int64_t L : {1, 4}) {
    c = sized(1, 8, 2, L, 1000, 64, 64);
    c.scoring.causal = Causal::bottom_right;
    check_half_storage<bfloat16>(c, 101);
    check_half_storage<float16>(c, 102);
  }
  c.qk_dim = 59;  // ragged rows, a mask, dropout
  c.v_dim = 24;
  c.mask = MaskKind::both;
  c.scoring.dropout_p = 0.2;
  check_half_storage<bfloat16>(c, 103);
  check_half_storage<float16>(c, 104);
}

// The accuracy bar of a half-precision cache is PyTorch's own: on the same bfloat16/float16
// query, keys and values (tests/goldens/decode, scripts/goldens/make_decode_goldens.py), mha's
// error against float64 is at most 2× that of PyTorch's SDPA (which returns the half type), and
// within the FlashAttention rule against PyTorch's SDPA on the same values in float32.
template <class Kv>
double half_golden_ratio(const safetensors::MappedFile& file, const safetensors::File& peer, const std::string& name) {
  const Tensor<float> q = file.to_tensor<float>("query");
  // Exact: the values are Kv's.
  const Tensor<Kv> k = converted<Kv>(file.to_tensor<float>("key")), v = converted<Kv>(file.to_tensor<float>("value"));
  Options<float> opt;
  opt.causal = file.metadata().at("causal") == "bottom_right" ? Causal::bottom_right : Causal::none;
  // PyTorch's results (in the half type and in float32) as computed on this machine (load_peer).
  const Tensor<double> ref = file.to_tensor<double>("output_f64"),
                       torch_out = safetensors::to_tensor<double>(safetensors::require(peer, "torch_output", name), name),
                       torch_f32 = safetensors::to_tensor<double>(safetensors::require(peer, "torch_output_f32", name), name);
  Tensor<float> out(ref.shape());
  Tensor<double> lse({ref.size(0), ref.size(1), ref.size(2)});
  sdpa_forward_into(q, k, v, {out, lse, {}}, opt);
  const double ours = max_diff(out, ref), torch_error = max_diff(torch_out, ref);
  EXPECT_LE(ours, 2 * torch_error) << name << ": mha error " << ours << ", PyTorch's " << torch_error;
  // And the FlashAttention rule against PyTorch computing on the same values in float32.
  const double torch_f32_error = max_diff(torch_f32, ref);
  EXPECT_LE(ours, 2 * torch_f32_error + 1e-6) << name << ": mha error " << ours << ", PyTorch float32's " << torch_f32_error;
  std::cout << "[decode golden] " << name << ": mha error " << ours << ", PyTorch SDPA's " << torch_error
            << " (in the half type), " << torch_f32_error << " (in float32)\n";
  return ours / torch_error;
}

TEST(Decode, HalfPrecisionWithinPyTorchsOwnError) {
  int cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(mha::testing::goldens_dir() + "/decode")) {
    const safetensors::MappedFile file(entry.path().string());
    const safetensors::File peer = mha::testing::load_peer(entry.path());
    const std::string name = entry.path().stem().string(), dtype = file.metadata().at("dtype");
    ASSERT_TRUE(dtype == "bfloat16" || dtype == "float16") << name;
    if (dtype == "bfloat16") {
      half_golden_ratio<bfloat16>(file, peer, name);
    } else {
      half_golden_ratio<float16>(file, peer, name);
    }
    ++cases;
  }
  EXPECT_EQ(cases, 5);
}

TEST(Decode, RejectsWhatItCannotDo) {
  Tensor<float> q({1, 1, 1, 4}), k({1, 1, 3, 4}), v({1, 1, 3, 4});
  Options<float> opt;
  opt.backend = Backend::decode;
  opt.need_weights = true;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "decode does not return the weights");
  Options<double> dopt;
  dopt.backend = Backend::decode;
  expect_error([&] { sdpa_forward(mha::cast<double>(q), mha::cast<double>(k), mha::cast<double>(v), dopt); },
               "decode supports float32, bfloat16 and float16");
  Tensor<bfloat16> hk({1, 1, 3, 5}), hv({1, 1, 3, 4});
  Tensor<float> out({1, 1, 1, 4});
  Tensor<double> lse({1, 1, 1});
  expect_error([&] { sdpa_forward_into(q, hk, hv, {out, lse, {}}); }, "key: expected head size 4");
}

// Every SIMD target compiled in and supported here runs a few cases (whole and ragged rows, half
// storage), so a machine without AVX-512 runs the code it will really use. The float case's
// reference is computed once, before the targets.
TEST(Decode, EveryCompiledTargetMatchesReference) {
  Case c = sized(1, 8, 2, 3, 600, 64, 59);
  c.mask = MaskKind::both;
  c.scoring.causal = Causal::top_left;
  const Reference ref = reference_of(c, 111, false);
  Case half = c;
  half.scoring.causal = Causal::bottom_right;
  half.qk_dim = half.v_dim = 128;
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    check_case(c, ref);
    check_half_storage<bfloat16>(half, 112);
    check_half_storage<float16>(half, 113);
  }
}

}  // namespace
}  // namespace mha::attention
