// Options::whole_call: a call that is a block of a larger one. Blocks of query rows and of heads
// give the whole call's rows bit for bit (causal masks and dropout at the whole call's positions);
// blocks of keys merged by merge_partial give the whole call's output and logsumexp, and their
// backwards, accumulated, its gradients (to rounding: the double reference within 1e-12, float
// within FlashAttention's rule against the double reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "../support/gradient_check.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/core/view.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using test_cases::copy_of;
using test_cases::FlashRule;
using test_cases::max_diff;

template <class T>
void fill(Tensor<T>& t, T value) {
  std::fill(t.values().begin(), t.values().end(), value);
}

template <class T>
void expect_bitwise(const Tensor<T>& got, const Tensor<T>& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(T) * static_cast<size_t>(got.numel())), 0) << what;
}

constexpr int64_t B = 2, Hq = 4, Hkv = 2, G = Hq / Hkv, L = 37, S = 45, D = 16, Dv = 8;

// A case of these shapes on a backend; masked: an attend_mask (B, 1, L, S) that hides some keys
// and whole rows (MaskKind::empty_rows).
struct BlockCase {
  Backend backend;
  test_cases::Case c;

  BlockCase(Backend b, Causal causal, double dropout, bool masked) : backend(b), c(test_cases::sized(B, Hq, Hkv, L, S, D, Dv)) {
    c.scoring.causal = causal;
    c.scoring.dropout_p = dropout;
    c.mask = masked ? test_cases::MaskKind::empty_rows : test_cases::MaskKind::none;
  }
  bool masked() const { return c.mask != test_cases::MaskKind::none; }
  BlockCase on(Backend other) const {
    BlockCase moved = *this;
    moved.backend = other;
    return moved;
  }
  std::string describe() const { return std::string(test_cases::name_of(backend)) + " " + c.describe(); }
};

template <class T>
struct Problem {
  test_cases::Inputs in;
  Tensor<T> q, k, v, dout;
  test_cases::Held<T> held;
  Options<T> options;

  Problem(const BlockCase& bc, uint64_t seed) : in(test_cases::make_inputs(bc.c, seed)) {
    q = cast<T>(in.q);
    k = cast<T>(in.k);
    v = cast<T>(in.v);
    dout = cast<T>(in.dout);
    options = test_cases::options_of<T>(bc.c, in, bc.backend, held);
  }
  Problem(const Problem&) = delete;  // the options view the masks held here
  const Tensor<bool>& keep() const { return *in.attend; }
};

// Rows [r0, r0 + n) of heads [h0, h0 + nh) as a call of their own: the whole call's results there,
// bit for bit; the backward's grad_query too (each row's gradient sums over all keys, as there),
// and with every row, grad_key and grad_value of the block's kv heads.
template <class T>
void check_query_and_head_blocks(const BlockCase& c) {
  SCOPED_TRACE(c.describe());
  const Problem<T> pr(c, 11);
  const auto whole = sdpa_forward(pr.q, pr.k, pr.v, pr.options);
  const auto grads = sdpa_backward(pr.q, pr.k, pr.v, whole.output, whole.logsumexp, pr.dout, pr.options);
  const int64_t row_blocks[][2] = {{0, 5}, {5, 16}, {21, 16}, {36, 1}, {0, L}};
  const int64_t head_blocks[][2] = {{0, Hq}, {2, 2}};
  for (const auto& rb : row_blocks)
    for (const auto& hb : head_blocks) {
      const int64_t r0 = rb[0], n = rb[1], h0 = hb[0], nh = hb[1];
      SCOPED_TRACE("rows " + std::to_string(r0) + "+" + std::to_string(n) + " heads " + std::to_string(h0) + "+" +
                   std::to_string(nh));
      auto rows = [&](const auto& t) { return View<const T>(t).slice(2, r0, n).slice(1, h0, nh); };
      auto kv = [&](const auto& t) { return View<const T>(t).slice(1, h0 / G, nh / G); };
      Options<T> opt = pr.options;
      opt.whole_call = {r0, 0, h0, L, S, Hq};
      if (c.masked()) opt.attend_mask = View<const bool>(pr.keep()).slice(2, r0, n);
      Tensor<T> out({B, nh, n, Dv});
      Tensor<double> lse({B, nh, n});
      sdpa_forward_into<T>(rows(pr.q), kv(pr.k), kv(pr.v), {out, lse, {}}, opt);
      expect_bitwise(out, copy_of(rows(whole.output)), "output");
      expect_bitwise(lse, copy_of(View<const double>(whole.logsumexp).slice(2, r0, n).slice(1, h0, nh)), "logsumexp");

      Tensor<T> dq({B, nh, n, D}), dk({B, nh / G, S, D}), dv({B, nh / G, S, Dv});
      sdpa_backward_into<T>(rows(pr.q), kv(pr.k), kv(pr.v), rows(whole.output),
                            View<const double>(whole.logsumexp).slice(2, r0, n).slice(1, h0, nh), rows(pr.dout),
                            {dq, dk, dv}, opt);
      expect_bitwise(dq, copy_of(rows(grads.grad_query)), "grad_query");
      if (n == L) {  // every row: the block's kv heads have all their gradient
        expect_bitwise(dk, copy_of(kv(grads.grad_key)), "grad_key");
        expect_bitwise(dv, copy_of(kv(grads.grad_value)), "grad_value");
      }
    }
}

TEST(WholeCall, QueryAndHeadBlocksGiveTheWholeCallsRowsBitForBit) {
  for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
    for (double dropout : {0.0, 0.3})
      for (bool masked : {false, true}) {
        check_query_and_head_blocks<double>({Backend::reference, causal, dropout, masked});
        check_query_and_head_blocks<float>({Backend::reference, causal, dropout, masked});
        check_query_and_head_blocks<float>({Backend::cpu_flash, causal, dropout, masked});
        check_query_and_head_blocks<float>({Backend::decode, causal, dropout, masked});
      }
}

// cpu_flash's backward splits a kv head's query blocks into chunks when the call has few (b, kv
// head) pairs; a block of heads splits them as the whole call does, so it sums dK and dV in the
// same order (with 400 rows: 4 chunks for the whole call's 2 kv heads, 8 for one alone).
TEST(WholeCall, HeadBlocksSumTheirGradientsInTheWholeCallsOrder) {
  Generator gen(3);
  const int64_t n = 400;
  // Uniform in [-2, 2).
  auto draw = [&](const Shape& shape) { return mha::testing::random_tensor<float>(shape, gen, -2.0, 2.0); };
  const Tensor<float> q = draw({1, 4, n, D}), k = draw({1, 2, n, D}), v = draw({1, 2, n, Dv}),
                      dout = draw({1, 4, n, Dv});
  Options<float> opt;
  opt.backend = Backend::cpu_flash;
  opt.causal = Causal::top_left;
  const auto f = sdpa_forward(q, k, v, opt);
  const auto g = sdpa_backward(q, k, v, f.output, f.logsumexp, dout, opt);
  auto heads = [](const auto& t, int64_t h0, int64_t nh) { return View<const float>(t).slice(1, h0, nh); };
  opt.whole_call = {0, 0, 2, 0, 0, 4};
  Tensor<float> dq({1, 2, n, D}), dk({1, 1, n, D}), dv({1, 1, n, Dv});
  sdpa_backward_into<float>(heads(q, 2, 2), heads(k, 1, 1), heads(v, 1, 1), heads(f.output, 2, 2),
                            View<const double>(f.logsumexp).slice(1, 2, 2), heads(dout, 2, 2), {dq, dk, dv}, opt);
  expect_bitwise(dk, copy_of(heads(g.grad_key, 1, 1)), "grad_key");
  expect_bitwise(dv, copy_of(heads(g.grad_value, 1, 1)), "grad_value");
}

// The keys in uneven blocks (one of them a single key), each a call of its own with key_offset:
// merged, the whole call's output and logsumexp; backwards given the merged output and logsumexp,
// adding into one grad_query and into each block's rows of grad_key and grad_value, its gradients.
template <class T>
void check_key_blocks(const BlockCase& c, FlashRule& rule) {
  SCOPED_TRACE(c.describe());
  const Problem<T> pr(c, 23);
  const int64_t key_blocks[][2] = {{0, 13}, {13, 1}, {14, 17}, {31, 14}};

  Tensor<double> merged({B, Hq, L, Dv}), lse({B, Hq, L});
  fill(lse, -std::numeric_limits<double>::infinity());  // nothing merged yet
  for (const auto& kb : key_blocks) {
    Options<T> opt = pr.options;
    opt.whole_call = {0, kb[0], 0, L, S, Hq};
    if (c.masked()) opt.attend_mask = View<const bool>(pr.keep()).slice(3, kb[0], kb[1]);
    Tensor<T> out({B, Hq, L, Dv});
    Tensor<double> block_lse({B, Hq, L});
    sdpa_forward_into<T>(pr.q, View<const T>(pr.k).slice(2, kb[0], kb[1]), View<const T>(pr.v).slice(2, kb[0], kb[1]),
                         {out, block_lse, {}}, opt);
    merge_partial<T>(merged, lse, out, block_lse);
  }
  for (double x : merged.values()) ASSERT_FALSE(std::isnan(x)) << "a NaN in the merged output";
  const Tensor<T> output = cast<T>(merged);

  Tensor<T> dq({B, Hq, L, D}), dk({B, Hkv, S, D}), dv({B, Hkv, S, Dv});
  for (const auto& kb : key_blocks) {
    Options<T> opt = pr.options;
    opt.whole_call = {0, kb[0], 0, L, S, Hq};
    if (c.masked()) opt.attend_mask = View<const bool>(pr.keep()).slice(3, kb[0], kb[1]);
    auto keys = [&](auto& t) { return View<T>(t).slice(2, kb[0], kb[1]); };
    sdpa_backward_into<T>(pr.q, View<const T>(pr.k).slice(2, kb[0], kb[1]), View<const T>(pr.v).slice(2, kb[0], kb[1]),
                          output, lse, pr.dout, {dq, keys(dk), keys(dv), /*accumulate=*/true}, opt);
  }

  // The whole call in double (the reference), and for float the float reference beside it.
  const Problem<double> pr64(BlockCase(c).on(Backend::reference), 23);
  const Tensor<double>&q64 = pr64.q, &k64 = pr64.k, &v64 = pr64.v, &dout64 = pr64.dout;
  const Options<double>& opt64 = pr64.options;
  const auto whole64 = sdpa_forward(q64, k64, v64, opt64);
  const auto grads64 = sdpa_backward(q64, k64, v64, whole64.output, whole64.logsumexp, dout64, opt64);
  if constexpr (std::is_same_v<T, double>) {
    EXPECT_LE(max_diff(lse, whole64.logsumexp), 1e-12) << "logsumexp";
    EXPECT_LE(max_diff(output, whole64.output), 1e-12) << "output";
    EXPECT_LE(max_diff(dq, grads64.grad_query), 1e-12) << "grad_query";
    EXPECT_LE(max_diff(dk, grads64.grad_key), 1e-12) << "grad_key";
    EXPECT_LE(max_diff(dv, grads64.grad_value), 1e-12) << "grad_value";
  } else {
    Options<float> opt32 = pr.options;
    opt32.backend = Backend::reference;
    const auto whole32 = sdpa_forward(pr.q, pr.k, pr.v, opt32);
    const auto grads32 = sdpa_backward(pr.q, pr.k, pr.v, whole32.output, whole32.logsumexp, pr.dout, opt32);
    rule.expect(lse, whole32.logsumexp, whole64.logsumexp, "logsumexp");
    rule.expect(output, whole32.output, whole64.output, "output");
    rule.expect(dq, grads32.grad_query, grads64.grad_query, "grad_query");
    rule.expect(dk, grads32.grad_key, grads64.grad_key, "grad_key");
    rule.expect(dv, grads32.grad_value, grads64.grad_value, "grad_value");
  }
}

TEST(WholeCall, KeyBlocksMergedGiveTheWholeCall) {
  FlashRule rule{"key blocks"};
  for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
    for (double dropout : {0.0, 0.3})
      for (bool masked : {false, true}) {
        check_key_blocks<double>({Backend::reference, causal, dropout, masked}, rule);
        check_key_blocks<float>({Backend::reference, causal, dropout, masked}, rule);
        check_key_blocks<float>({Backend::cpu_flash, causal, dropout, masked}, rule);
      }
  std::printf("key blocks, float: largest error / allowed %.3f\n", rule.worst_fraction);
}

TEST(WholeCall, AccumulateAddsToWhatTheGradientsHold) {
  const Problem<double> pr({Backend::reference, Causal::top_left, 0.0, false}, 5);
  const auto f = sdpa_forward(pr.q, pr.k, pr.v, pr.options);
  const auto g = sdpa_backward(pr.q, pr.k, pr.v, f.output, f.logsumexp, pr.dout, pr.options);
  Tensor<double> dq(pr.q.shape()), dk(pr.k.shape()), dv(pr.v.shape());
  for (auto* t : {&dq, &dk, &dv}) fill(*t, 0.5);
  sdpa_backward_into<double>(pr.q, pr.k, pr.v, f.output, f.logsumexp, pr.dout, {dq, dk, dv, true}, pr.options);
  auto shifted = [](Tensor<double> t) {
    for (auto& x : t.values()) x += 0.5;
    return t;
  };
  EXPECT_LE(max_diff(dq, shifted(g.grad_query)), 1e-13);
  EXPECT_LE(max_diff(dk, shifted(g.grad_key)), 1e-13);
  EXPECT_LE(max_diff(dv, shifted(g.grad_value)), 1e-13);
  // Without accumulate, the same outputs are overwritten.
  sdpa_backward_into<double>(pr.q, pr.k, pr.v, f.output, f.logsumexp, pr.dout, {dq, dk, dv}, pr.options);
  expect_bitwise(dq, g.grad_query, "grad_query overwritten");
}

TEST(WholeCall, MergeKeepsFullyMaskedRowsAtZeroAndNaNsVisible) {
  Tensor<double> out({1, 1, 3, 2}), lse({1, 1, 3});
  fill(lse, -std::numeric_limits<double>::infinity());
  Tensor<float> block({1, 1, 3, 2});
  for (int i = 0; i < 6; ++i) block[i] = static_cast<float>(i + 1);
  Tensor<double> block_lse({1, 1, 3});
  block_lse[0] = -std::numeric_limits<double>::infinity();
  block_lse[1] = 0.0;
  block_lse[2] = std::nan("");
  merge_partial<float>(out, lse, block, block_lse);
  merge_partial<float>(out, lse, block, block_lse);  // twice: row 1 is the mean of equal blocks
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(lse[0], -std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(out[2], 3.0);
  EXPECT_DOUBLE_EQ(out[3], 4.0);
  EXPECT_DOUBLE_EQ(lse[1], std::log(2.0));
  EXPECT_TRUE(std::isnan(lse[2]));
  EXPECT_TRUE(std::isnan(out[4]));
  expect_error([&] { merge_partial<float>(out, lse, Tensor<float>({1, 1, 2, 2}), block_lse); }, "block_output");
}

TEST(WholeCall, BlocksOutsideTheWholeCallAreRefused) {
  const Problem<double> pr({Backend::reference, Causal::none, 0.0, false}, 3);
  auto call = [&](WholeCall pos) {
    Options<double> opt;
    opt.whole_call = pos;
    sdpa_forward(pr.q, pr.k, pr.v, opt);
  };
  expect_error([&] { call({-1, 0, 0, L, S, Hq}); }, "options.whole_call: expected the call's 37 queries from query_offset -1");
  expect_error([&] { call({1, 0, 0, L, S, Hq}); }, "inside the whole call's 37");
  expect_error([&] { call({0, 5, 0, 0, 48, 0}); }, "options.whole_call: expected the call's 45 keys from key_offset 5");
  expect_error([&] { call({0, 0, 1, 0, 0, 4}); }, "query heads from head_offset 1");
  call({3, 2, 4, 40, 47, 8});  // inside: accepted
}

}  // namespace
}  // namespace mha::attention
