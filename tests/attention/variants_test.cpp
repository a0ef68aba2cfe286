// The score variants of a call: Scoring::softcap, Options::sinks, Options::alibi_slopes.
//   - hand-derived values: each variant on a row small enough to work out on paper, on every
//     backend (the reference in double, cpu_flash and decode in float);
//   - the reference's gradients (grad_sinks included) against finite differences in double, with
//     the variants mixed with masks, causality, windows, dropout and GQA;
//   - ALiBi under causality equals Bloom's key-position form slope·j given as an additive mask
//     (the two differ by a constant per row, which softmax ignores);
//   - a sink of −inf is no sink, bit for bit; rows that see no key give 0 with a sink too
//     (logsumexp = the sink, gradients 0, never NaN);
//   - blocks of keys (whole_call) merged by log-sum-exp equal the whole call, the sink counted
//     once (in the block holding key 0), its gradient included;
//   - cpu_flash and decode with every variant on every SIMD target against the reference
//     (FlashAttention's rule), and bitwise the same for 1, 2, 3 and 8 threads;
//   - bad values are refused with the argument named.
// (The backend sweeps of cpu_flash_test and decode_test cycle these variants too; the goldens
// computed by PyTorch from Gemma 2's, gpt-oss's, Bloom's and FlashAttention's own definitions are
// in sdpa_golden_test.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "../support/gradient_check.h"
#include "mha/attention/attention.h"
#include "mha/core/simd.h"

namespace mha::attention {
namespace {

using mha::testing::check_gradient;
using mha::testing::expect_error;
using mha::testing::replacing;
using namespace test_cases;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One query, keys with the given scores (q = 1, d = 1, scale 1) and values v_j = (j, 1): the
// output's first element is Σ_j P_j·j, its second Σ_j P_j.
template <class T>
ForwardResult<T> run_row(const std::vector<double>& scores, Options<T> opt) {
  const int64_t S = static_cast<int64_t>(scores.size());
  Tensor<T> q({1, 1, 1, 1}, {T(1)}), k({1, 1, S, 1}), v({1, 1, S, 2});
  for (int64_t j = 0; j < S; ++j) {
    k[j] = static_cast<T>(scores[static_cast<size_t>(j)]);
    v[2 * j] = static_cast<T>(j);
    v[2 * j + 1] = T(1);
  }
  opt.scale = 1.0;
  return sdpa_forward(q, k, v, opt);
}

// The row's output (Σ P_j·j, Σ P_j) and logsumexp on every backend: the reference in double
// within 1e-14, cpu_flash and decode in float within 2e-6.
void expect_row(const std::vector<double>& scores, const Options<double>& opt, double sum_pj_j, double sum_p,
                double lse, const std::string& what) {
  SCOPED_TRACE(what);
  const ForwardResult<double> r = run_row(scores, opt);
  EXPECT_NEAR(r.output[0], sum_pj_j, 1e-14);
  EXPECT_NEAR(r.output[1], sum_p, 1e-14);
  EXPECT_NEAR(r.logsumexp[0], lse, 1e-14);
  for (Backend backend : {Backend::cpu_flash, Backend::decode}) {
    SCOPED_TRACE(name_of(backend));
    Options<float> f;
    static_cast<Scoring&>(f) = opt;
    f.backend = backend;
    Tensor<float> sinks_f, slopes_f;
    if (opt.sinks.defined()) f.sinks = sinks_f = mha::cast<float>(copy_of(opt.sinks));
    if (opt.alibi_slopes.defined()) f.alibi_slopes = slopes_f = mha::cast<float>(copy_of(opt.alibi_slopes));
    const ForwardResult<float> g = run_row(scores, f);
    EXPECT_NEAR(g.output[0], sum_pj_j, 2e-6);
    EXPECT_NEAR(g.output[1], sum_p, 2e-6);
    EXPECT_NEAR(g.logsumexp[0], lse, 2e-6);
  }
}

TEST(Variants, HandDerivedRows) {
  // A sink of log 4 beside scores [0, log 3]: the denominator is 1 + 3 + 4 = 8, so P = [1/8, 3/8]
  // (the sink's 1/2 is left out of the output) and logsumexp = log 8.
  Tensor<double> sink({1}, {std::log(4.0)});
  Options<double> with_sink;
  with_sink.sinks = sink;
  expect_row({0.0, std::log(3.0)}, with_sink, 3.0 / 8, 4.0 / 8, std::log(8.0), "sink");

  // Soft-cap c = 2: scores [0, 2·atanh(1/2), 100] become [0, 1, 2·tanh(50) = 2 (to double's
  // precision)]: P ∝ [1, e, e²].
  Options<double> capped;
  capped.softcap = 2.0;
  const double e = std::exp(1.0), z = 1 + e + e * e;
  expect_row({0.0, 2 * std::atanh(0.5), 100.0}, capped, (e + 2 * e * e) / z, 1.0, std::log(z), "softcap");

  // ALiBi slope 1/2, one query against three keys without causality: the diagonal is
  // S − L = 2, so the biases are −(1/2)·|2 − j| = [−1, −1/2, 0] on zero scores: P ∝ [e⁻¹, e^−½, 1].
  Tensor<double> slope({1}, {0.5});
  Options<double> alibi;
  alibi.alibi_slopes = slope;
  const double a0 = std::exp(-1.0), a1 = std::exp(-0.5), za = a0 + a1 + 1;
  expect_row({0.0, 0.0, 0.0}, alibi, (a1 + 2) / za, 1.0, std::log(za), "alibi");
  // Top-left causality moves the diagonal to 0: query 0 sees key 0 alone, bias 0.
  alibi.causal = Causal::top_left;
  expect_row({0.0, 0.0, 0.0}, alibi, 0.0, 1.0, 0.0, "alibi, top-left causal");

  // All three: soft-cap 2 on [0, 2·atanh(1/2)] gives [0, 1]; ALiBi 1/2 on S − L = 1 adds
  // [−1/2, 0]; a sink of 0 adds e⁰ = 1: P = [e^−½, e] / (e^−½ + e + 1).
  Tensor<double> zero_sink({1}, {0.0});
  Options<double> all;
  all.softcap = 2.0;
  all.alibi_slopes = slope;
  all.sinks = zero_sink;
  const double b0 = std::exp(-0.5), zb = b0 + e + 1;
  expect_row({0.0, 2 * std::atanh(0.5)}, all, e / zb, (b0 + e) / zb, std::log(zb), "soft-cap, ALiBi and a sink");
}

// The reference's gradients in double against finite differences, the variants mixed with the
// rest; grad_sinks too.
TEST(Variants, ReferenceGradientsMatchFiniteDifferences) {
  Generator pick(77);
  const MaskKind masks[] = {MaskKind::none, MaskKind::bool_batch, MaskKind::additive_2d, MaskKind::empty_rows};
  for (int trial = 0; trial < 24; ++trial) {
    Case c = sized(1 + trial % 2, 2 * (1 + trial % 2), 1 + trial % 2, 1 + static_cast<int64_t>(pick.uniform() * 6),
                   1 + static_cast<int64_t>(pick.uniform() * 7), 1 + static_cast<int64_t>(pick.uniform() * 4),
                   1 + static_cast<int64_t>(pick.uniform() * 4));
    c.mask = masks[trial % 4];
    c.scoring.causal = static_cast<Causal>(trial % 3);
    c.scoring.softcap = trial % 3 == 1 ? 0.7 : trial % 3 == 2 ? 5.0 : 0.0;
    c.sinks = trial % 2 == 0;
    c.alibi = static_cast<Slopes>(trial % 3);
    if (trial % 5 == 3) c.scoring.dropout_p = 0.3;
    if (trial % 7 == 4) c.scoring.window_left = 1;
    c.scoring.dropout_seed = 11 + static_cast<uint64_t>(trial);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + c.describe());
    Inputs in = make_inputs(c, 300 + static_cast<uint64_t>(trial));
    if (in.sinks)  // a −inf sink has no finite neighbourhood (no-sink equality is tested below)
      for (auto& x : in.sinks->values()) x = std::isinf(x) ? 0.5f : x;
    Tensor<double> q = mha::cast<double>(in.q), k = mha::cast<double>(in.k), v = mha::cast<double>(in.v);
    const Tensor<double> dout = mha::cast<double>(in.dout);
    Held<double> held;
    const Options<double> opt = options_of<double>(c, in, Backend::reference, held);
    const ForwardResult<double> fwd = sdpa_forward(q, k, v, opt);
    const Gradients<double> g = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
    // The output of the current q, k, v and sinks (replacing swaps the tensor the options view).
    auto forward = [&] {
      Options<double> o = opt;
      if (held.sinks) o.sinks = *held.sinks;
      return sdpa_forward(q, k, v, o).output;
    };
    EXPECT_TRUE(check_gradient(replacing(q, forward), q, dout, g.grad_query)) << "grad_query";
    EXPECT_TRUE(check_gradient(replacing(k, forward), k, dout, g.grad_key)) << "grad_key";
    EXPECT_TRUE(check_gradient(replacing(v, forward), v, dout, g.grad_value)) << "grad_value";
    ASSERT_EQ(g.grad_sinks.has_value(), c.sinks);
    if (c.sinks) EXPECT_TRUE(check_gradient(replacing(*held.sinks, forward), *held.sinks, dout, *g.grad_sinks)) << "grad_sinks";
  }
}

// ALiBi with causality against Bloom's form: build_alibi_tensor gives key j the bias slope·j
// (positions from the cumulative attention mask, no padding here), added to the scores under the
// causal mask. On every key a query sees (j <= i + d), −slope·|i + d − j| = slope·j − slope·(i + d):
// the same row up to a constant, so the same P, output and gradients (double, within rounding).
TEST(Variants, AlibiUnderCausalityIsBloomsKeyPositionForm) {
  for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
    Case c = sized(2, 4, 2, 9, 13, 8, 8);
    c.scoring.causal = causal;
    c.alibi = Slopes::batch_heads;
    SCOPED_TRACE(c.describe());
    const Inputs in = make_inputs(c, 5);
    Held<double> held;
    const Options<double> opt = options_of<double>(c, in, Backend::reference, held);
    Tensor<double> bloom({c.batch, c.q_heads, 1, c.k_len});
    for (int64_t bh = 0; bh < c.batch * c.q_heads; ++bh)
      for (int64_t j = 0; j < c.k_len; ++j) bloom[bh * c.k_len + j] = (*held.alibi_slopes)[bh] * static_cast<double>(j);
    Options<double> twin = opt;
    twin.alibi_slopes = {};
    twin.additive_mask = bloom;
    const Tensor<double> q = mha::cast<double>(in.q), k = mha::cast<double>(in.k), v = mha::cast<double>(in.v),
                         dout = mha::cast<double>(in.dout);
    const auto a = sdpa_forward(q, k, v, opt), b = sdpa_forward(q, k, v, twin);
    EXPECT_LE(max_diff(a.output, b.output), 1e-14);
    const auto ga = sdpa_backward(q, k, v, a.output, a.logsumexp, dout, opt);
    const auto gb = sdpa_backward(q, k, v, b.output, b.logsumexp, dout, twin);
    EXPECT_LE(max_diff(ga.grad_query, gb.grad_query), 1e-13);
    EXPECT_LE(max_diff(ga.grad_key, gb.grad_key), 1e-13);
    EXPECT_LE(max_diff(ga.grad_value, gb.grad_value), 1e-14);
  }
}

// Sinks of −inf are no sinks: every output and gradient bit for bit as without them (grad_sinks
// 0); a row that sees no key gives output 0, logsumexp = its sink and gradient 0 on every backend.
TEST(Variants, SinksOfMinusInfinityAreNoneAndEmptyRowsStayZero) {
  for (Backend backend : {Backend::reference, Backend::cpu_flash, Backend::decode}) {
    Case c = sized(2, 4, 2, 11, 19, 8, 8);
    c.mask = MaskKind::empty_rows;
    c.scoring.causal = Causal::bottom_right;
    SCOPED_TRACE(std::string(name_of(backend)) + " " + c.describe());
    Inputs in = make_inputs(c, 9);
    const Results<float> plain = run<float>(c, in, backend);
    c.sinks = true;
    in.sinks = Tensor<float>({c.q_heads}, -std::numeric_limits<float>::infinity());
    const Results<float> none = run<float>(c, in, backend);
    EXPECT_TRUE(bitwise_equal(plain.fwd.output, none.fwd.output));
    EXPECT_TRUE(bitwise_equal(plain.fwd.logsumexp, none.fwd.logsumexp));
    EXPECT_TRUE(bitwise_equal(plain.grads.grad_query, none.grads.grad_query));
    EXPECT_TRUE(bitwise_equal(plain.grads.grad_key, none.grads.grad_key));
    EXPECT_TRUE(bitwise_equal(plain.grads.grad_value, none.grads.grad_value));
    for (float x : none.grads.grad_sinks->values()) EXPECT_EQ(x, 0.0f);

    in.sinks = Tensor<float>({c.q_heads}, {0.5f, -1.0f, 2.0f, 0.0f});
    const Results<float> sunk = run<float>(c, in, backend);
    int empty_rows = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.q_heads; ++h)
        for (int64_t i = 0; i < c.q_len; ++i) {
          const int64_t row = (b * c.q_heads + h) * c.q_len + i;
          if (i % 5 != 2) {
            EXPECT_LT(sunk.fwd.logsumexp[row], plain.fwd.logsumexp[row] + std::log1p(std::exp(4.0)));
            continue;
          }
          ++empty_rows;
          EXPECT_EQ(sunk.fwd.logsumexp[row], static_cast<double>((*in.sinks)[h])) << "row " << row;
          for (int64_t e = 0; e < c.v_dim; ++e) EXPECT_EQ(sunk.fwd.output[row * c.v_dim + e], 0.0f);
          for (int64_t e = 0; e < c.qk_dim; ++e) EXPECT_EQ(sunk.grads.grad_query[row * c.qk_dim + e], 0.0f);
        }
    EXPECT_EQ(empty_rows, 2 * 4 * 2);
    for (float x : sunk.grads.grad_sinks->values()) EXPECT_TRUE(std::isfinite(x) && x != 0.0f);
  }
}

// Two blocks of keys (whole_call.key_offset) merged by log-sum-exp give the whole call: the sink
// joins the block holding key 0 only, so it is counted once; the blocks' backward, accumulated,
// gives the whole call's gradients, grad_sinks included. Double, every variant at once.
TEST(Variants, KeyBlocksMergeToTheWholeCallWithTheSinkCountedOnce) {
  Case c = sized(2, 4, 2, 10, 23, 8, 6);
  c.scoring.causal = Causal::bottom_right;
  c.scoring.softcap = 3.0;
  c.scoring.window_left = 9;
  c.sinks = true;
  c.alibi = Slopes::heads;
  c.mask = MaskKind::additive_2d;
  SCOPED_TRACE(c.describe());
  const Inputs in = make_inputs(c, 21);
  Held<double> held;
  const Options<double> opt = options_of<double>(c, in, Backend::reference, held);
  const Tensor<double> q = mha::cast<double>(in.q), k = mha::cast<double>(in.k), v = mha::cast<double>(in.v),
                       dout = mha::cast<double>(in.dout);
  const auto whole = sdpa_forward(q, k, v, opt);
  const auto whole_grads = sdpa_backward(q, k, v, whole.output, whole.logsumexp, dout, opt);

  Tensor<double> output({c.batch, c.q_heads, c.q_len, c.v_dim}), lse({c.batch, c.q_heads, c.q_len}, kNegInf);
  const int64_t split = 14;
  const std::vector<std::pair<int64_t, int64_t>> blocks = {{split, c.k_len}, {0, split}};  // key 0's block last
  auto block_options = [&](int64_t j0, int64_t j1) {
    Options<double> o = opt;
    o.whole_call = {0, j0, 0, c.q_len, c.k_len, c.q_heads};
    o.additive_mask = View<const double>(*held.additive).slice(1, j0, j1 - j0);
    return o;
  };
  auto keys = [](const Tensor<double>& t, int64_t j0, int64_t j1) { return View<const double>(t).slice(2, j0, j1 - j0); };
  for (const auto& [j0, j1] : blocks) {
    Tensor<double> out({c.batch, c.q_heads, c.q_len, c.v_dim}), block_lse({c.batch, c.q_heads, c.q_len});
    sdpa_forward_into<double>(q, keys(k, j0, j1), keys(v, j0, j1), {out, block_lse, {}}, block_options(j0, j1));
    merge_partial<double>(output, lse, out, block_lse);
  }
  EXPECT_LE(max_diff(output, whole.output), 1e-14);
  EXPECT_LE(max_diff(lse, whole.logsumexp), 1e-14);

  Tensor<double> dq(q.shape()), dk(k.shape()), dv(v.shape()), dsinks({c.q_heads});
  for (const auto& [j0, j1] : blocks) {
    auto keys_of = [&](Tensor<double>& t) { return View<double>(t).slice(2, j0, j1 - j0); };
    sdpa_backward_into<double>(q, keys(k, j0, j1), keys(v, j0, j1), whole.output, whole.logsumexp, dout,
                               {dq, keys_of(dk), keys_of(dv), true, dsinks}, block_options(j0, j1));
  }
  EXPECT_LE(max_diff(dq, whole_grads.grad_query), 1e-13);
  EXPECT_LE(max_diff(dk, whole_grads.grad_key), 1e-13);
  EXPECT_LE(max_diff(dv, whole_grads.grad_value), 1e-13);
  EXPECT_LE(max_diff(dsinks, *whole_grads.grad_sinks), 1e-13);
}

// cpu_flash and decode with every variant at once on every SIMD target compiled in, against the
// reference under FlashAttention's rule; and bitwise the same for 1, 2, 3 and 8 threads.
TEST(Variants, FastBackendsOnEveryTargetAndThreadCount) {
  Case c = sized(2, 4, 2, 97, 300, 59, 24);
  c.mask = MaskKind::both;
  c.scoring.causal = Causal::bottom_right;
  c.scoring.softcap = 2.5;
  c.scoring.window_left = 150;
  c.scoring.dropout_p = 0.1;
  c.sinks = true;
  c.alibi = Slopes::batch_heads;
  c.need_weights = true;
  Case short_rows = c;  // decode's shape, and the automatic choice's for it
  short_rows.q_len = 5;
  short_rows.need_weights = false;
  short_rows.scoring.dropout_p = 0;
  Case wide = c;  // a window of 512 keys or more: full blocks, products not banded (blocks.h)
  wide.scoring.window_left = 700;
  wide.k_len = 1300;
  wide.need_weights = false;
  BackendCheck flash{Backend::cpu_flash}, decode{Backend::decode};
  // The references once, before the targets.
  const Reference c_ref = reference_of(c, 61, true), wide_ref = reference_of(wide, 64, true),
                  short_rows_ref = reference_of(short_rows, 62, false);
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    flash(c, c_ref);
    flash(wide, wide_ref);
    decode(short_rows, short_rows_ref);
  }
  std::cout << "[variants] largest fraction of the allowed error on every target: cpu_flash "
            << flash.rule.worst_fraction << ", decode " << decode.rule.worst_fraction << "\n";
  for (const auto& [x, backend] : {std::pair{c, Backend::cpu_flash}, std::pair{short_rows, Backend::decode}}) {
    SCOPED_TRACE(std::string(name_of(backend)) + " " + x.describe());
    const Inputs in = make_inputs(x, 63);
    expect_bitwise_on_thread_counts([&] { return run<float>(x, in, backend); });
  }
}

// The kernels' soft-cap against tanh in double, through the public door: with one key and one
// query per row (q = x, k = 1, d = 1, scale 1) a row's logsumexp is its capped score c·tanh(x / c)
// itself, in float. x sweeps both of the kernels' branches (|x / c| below and above 0.625), the
// saturation and the tiny; on every SIMD target the largest error is within 3 float ulps of the
// value and the mean error (a bias would add up over a row's keys) within a tenth of one.
TEST(Variants, SoftCapKernelAgainstTanhInDouble) {
  const int64_t L = 20000;
  Tensor<float> q({1, 1, L, 1}), k({1, 1, 1, 1}, 1.0f), v({1, 1, 1, 1}, 1.0f);
  Generator gen(8);
  for (int64_t i = 0; i < L; ++i) q[i] = static_cast<float>(gen.normal(0.0, i % 2 ? 0.5 : 4.0));
  q[0] = 1e-30f;
  q[1] = -40.0f;
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    for (double cap : {1.0, 2.5}) {
      Options<float> opt;
      opt.scale = 1.0;
      opt.softcap = cap;
      opt.backend = Backend::cpu_flash;
      const ForwardResult<float> r = sdpa_forward(q, k, v, opt);
      double worst = 0, bias = 0;
      for (int64_t i = 0; i < L; ++i) {
        const double want = cap * std::tanh(static_cast<double>(q[i]) / cap);
        const double ulp = std::nextafter(static_cast<float>(std::abs(want)), INFINITY) - static_cast<float>(std::abs(want));
        const double error = (r.logsumexp[i] - want) / ulp;
        worst = std::max(worst, std::abs(error));
        bias += error / L;
      }
      // tanh within 1.5 ulp and the two roundings of y = x·(1/c) and c·t (VariantsTest's evidence:
      // 1.49 ulp at c = 1, 2.70 at c = 2.5, on every target).
      EXPECT_LE(worst, 3.0) << "cap " << cap;
      EXPECT_LE(std::abs(bias), 0.1) << "cap " << cap;
      std::cout << "[softcap] " << target << " cap " << cap << ": largest error " << worst << " ulp, mean " << bias
                << " ulp\n";
    }
  }
}

TEST(Variants, BadValuesAreRefused) {
  const Tensor<float> q({2, 4, 3, 8}, 0.1f), k({2, 2, 5, 8}, 0.2f), v({2, 2, 5, 8}, 0.3f);
  for (double cap : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Options<float> opt;
    opt.softcap = cap;
    expect_error([&] { sdpa_forward(q, k, v, opt); }, "softcap: expected 0 (none) or a finite cap > 0, got ");
  }
  {  // a cap the kernels' float would hold as 0 (no cap): refused, not dropped; float's least holds
    Options<float> opt;
    opt.softcap = 1e-46;
    expect_error([&] { sdpa_forward(q, k, v, opt); }, "softcap: expected 0 (none) or a cap of at least 1.4e-45");
    opt.softcap = 1.5e-45;
    EXPECT_NO_THROW(sdpa_forward(q, k, v, opt));
  }
  {  // a Causal that is none of its values
    Options<float> opt;
    opt.causal = static_cast<Causal>(7);
    expect_error([&] { sdpa_forward(q, k, v, opt); }, "causal: expected none, top_left or bottom_right, got the value 7");
  }
  const Tensor<float> per_batch({2, 4}, 0.5f), too_few({2}, 0.5f), nan_one({4}, {0, std::nanf(""), 0, 0}),
      plus_inf({4}, {0, 0, std::numeric_limits<float>::infinity(), 0});
  Options<float> opt;
  opt.sinks = per_batch;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "sinks: expected shape (Hq) = [4], one per query head, got [2, 4]");
  opt.sinks = nan_one;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "sinks: expected finite logits (or -inf: no sink), got nan for head 1");
  opt.sinks = plus_inf;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "got inf for head 2");
  opt.sinks = {};
  opt.alibi_slopes = too_few;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "alibi_slopes: expected shape (Hq) = [4] or (B, Hq) = [2, 4], got [2]");
  opt.alibi_slopes = nan_one;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "alibi_slopes: expected finite slopes, got nan at (b, h) = (0, 1)");
  opt.alibi_slopes = {};
  // grad_sinks without sinks, and of the wrong shape.
  const auto fwd = sdpa_forward(q, k, v, opt);
  Tensor<float> dq(q.shape()), dk(k.shape()), dv(v.shape()), ds({4}), ds_wrong({3});
  expect_error([&] { sdpa_backward_into<float>(q, k, v, fwd.output, fwd.logsumexp, fwd.output, {dq, dk, dv, false, ds}, opt); },
               "grad_sinks: expected none (options.sinks is not given), got one");
  const Tensor<float> sinks({4}, 0.0f);
  opt.sinks = sinks;
  expect_error([&] { sdpa_backward_into<float>(q, k, v, fwd.output, fwd.logsumexp, fwd.output, {dq, dk, dv, false, ds_wrong}, opt); },
               "grad_sinks");
}

}  // namespace
}  // namespace mha::attention
