// Options::query_lengths / key_lengths (a padded batch, FlashAttention's seqused_q / seqused_k):
// a call with lengths equals, bit for bit, the same call with the dense attend_mask that the
// documented semantics give, built here by hand: query i of sequence b is real iff
// i < query_lengths[b], key j exists iff j < key_lengths[b], bottom-right causality is
// j <= i + key_lengths[b] − query_lengths[b] and top-left j <= i (causal then off in the masked
// twin), ANDed with the case's own masks. Bitwise holds on every backend because the visible keys'
// arithmetic is the same: where the lengths end a row's key walk (or skip a tile or a decode
// chunk), the mask adds −inf, whose exp is 0 and whose rescale factor is 1, so the sums see the
// same terms in the same order. Checked for the output, the logsumexp and the three gradients, on
// the reference (double and float), cpu_flash and decode (L <= 16; its backward is cpu_flash's)
// on every SIMD target compiled in, with random lengths including 0 and full, L != S, GQA, every
// causal alignment, masks and dropout. A padding query gives output 0, logsumexp −inf, gradient 0,
// and a padding key gradient 0. Then the lengths' errors, and lengths in whole-call positions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/core/simd.h"
#include "mha/core/view.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using namespace test_cases;

// A case with per-sequence lengths; an empty vector: that length not given.
struct LengthsCase {
  Case c;
  std::vector<int64_t> query_lengths, key_lengths;

  int64_t query_length(int64_t b) const { return query_lengths.empty() ? c.q_len : query_lengths[b]; }
  int64_t key_length(int64_t b) const { return key_lengths.empty() ? c.k_len : key_lengths[b]; }
  std::string describe() const {
    auto list = [](const std::vector<int64_t>& v) {
      if (v.empty()) return std::string("none");
      std::string s;
      for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
      return s;
    };
    return c.describe() + " query_lengths " + list(query_lengths) + " key_lengths " + list(key_lengths);
  }
};

// Element (b, h, i, j) of a mask of rank 1..4 broadcast to (B, Hq, L, S).
bool broadcast_at(const Tensor<bool>& m, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t index[4] = {b, h, i, j};
  int64_t flat = 0;
  for (int64_t a = 0; a < m.dim(); ++a) {
    const int64_t size = m.size(a);
    flat = flat * size + (size == 1 ? 0 : index[4 - m.dim() + a]);
  }
  return m[flat];
}

// The dense (B, Hq, L, S) attend_mask equivalent to the lengths, their causality and the case's
// own attend_mask, from the documented semantics (options.h).
Tensor<bool> dense_mask(const LengthsCase& lc, const Inputs& in) {
  const Case& c = lc.c;
  Tensor<bool> m({c.batch, c.q_heads, c.q_len, c.k_len});
  int64_t at = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t ql = lc.query_length(b), kl = lc.key_length(b);
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t i = 0; i < c.q_len; ++i)
        for (int64_t j = 0; j < c.k_len; ++j, ++at) {
          bool see = i < ql && j < kl;
          if (c.scoring.causal == Causal::top_left) see = see && j <= i;
          if (c.scoring.causal == Causal::bottom_right) see = see && j <= i + kl - ql;
          if (in.attend) see = see && broadcast_at(*in.attend, b, h, i, j);
          m[at] = see;
        }
  }
  return m;
}

// The call with the lengths (lengths given) or its masked twin; forward and backward on backend.
template <class T>
Results<T> run_call(const Case& c, const Inputs& in, Backend backend, const LengthsCase* lengths) {
  const Tensor<T> q = mha::cast<T>(in.q), k = mha::cast<T>(in.k), v = mha::cast<T>(in.v), dout = mha::cast<T>(in.dout);
  Held<T> held;
  Options<T> opt = options_of<T>(c, in, backend, held);
  if (lengths && !lengths->query_lengths.empty())
    opt.query_lengths = View<const int64_t>(lengths->query_lengths.data(), {c.batch});
  if (lengths && !lengths->key_lengths.empty())
    opt.key_lengths = View<const int64_t>(lengths->key_lengths.data(), {c.batch});
  ForwardResult<T> fwd = sdpa_forward(q, k, v, opt);
  Gradients<T> grads = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
  return {std::move(fwd), std::move(grads)};
}

template <class T>
void check_equals_masked_twin(const LengthsCase& lc, Backend backend, uint64_t seed) {
  SCOPED_TRACE(std::string(name_of(backend)) + (std::is_same_v<T, double> ? " double " : " float ") + lc.describe());
  const Case& c = lc.c;
  const Inputs in = make_inputs(c, seed);
  Inputs twin_in = in;
  twin_in.attend = dense_mask(lc, in);
  Case twin = c;
  twin.scoring.causal = Causal::none;  // in the mask
  const Results<T> got = run_call<T>(c, in, backend, &lc);
  const Results<T> want = run_call<T>(twin, twin_in, backend, nullptr);
  EXPECT_TRUE(bitwise_equal(got.fwd.output, want.fwd.output)) << "output " << max_diff(got.fwd.output, want.fwd.output);
  EXPECT_TRUE(bitwise_equal(got.fwd.logsumexp, want.fwd.logsumexp))
      << "logsumexp " << max_diff(got.fwd.logsumexp, want.fwd.logsumexp);
  EXPECT_TRUE(bitwise_equal(got.grads.grad_query, want.grads.grad_query))
      << "grad_query " << max_diff(got.grads.grad_query, want.grads.grad_query);
  EXPECT_TRUE(bitwise_equal(got.grads.grad_key, want.grads.grad_key))
      << "grad_key " << max_diff(got.grads.grad_key, want.grads.grad_key);
  EXPECT_TRUE(bitwise_equal(got.grads.grad_value, want.grads.grad_value))
      << "grad_value " << max_diff(got.grads.grad_value, want.grads.grad_value);

  // Padding queries: output 0, logsumexp −inf, grad_query 0; padding keys: gradients 0.
  int64_t wrong = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t i = lc.query_length(b); i < c.q_len; ++i) {
        const int64_t row = (b * c.q_heads + h) * c.q_len + i;
        wrong += got.fwd.logsumexp[row] != -std::numeric_limits<double>::infinity();
        for (int64_t d = 0; d < c.v_dim; ++d) wrong += got.fwd.output[row * c.v_dim + d] != T(0);
        for (int64_t d = 0; d < c.qk_dim; ++d) wrong += got.grads.grad_query[row * c.qk_dim + d] != T(0);
      }
    for (int64_t h = 0; h < c.kv_heads; ++h)
      for (int64_t j = lc.key_length(b); j < c.k_len; ++j) {
        const int64_t row = (b * c.kv_heads + h) * c.k_len + j;
        for (int64_t d = 0; d < c.qk_dim; ++d) wrong += got.grads.grad_key[row * c.qk_dim + d] != T(0);
        for (int64_t d = 0; d < c.v_dim; ++d) wrong += got.grads.grad_value[row * c.v_dim + d] != T(0);
      }
  }
  EXPECT_EQ(wrong, 0) << "elements of padding rows that are not 0 (or −inf)";
}

// Random lengths for B sequences: sequence 0 full, 1 no queries, 2 no keys, the rest (and the
// other side of 1 and 2) uniform in [0, full]; `which` cycles through both lengths, only the
// query lengths, only the key lengths.
LengthsCase with_lengths(const Case& c, int which, Generator& gen) {
  LengthsCase lc{c, {}, {}};
  auto draw = [&](int64_t full) { return static_cast<int64_t>(gen.uniform() * static_cast<double>(full + 1)); };
  std::vector<int64_t> q(static_cast<size_t>(c.batch)), k(static_cast<size_t>(c.batch));
  for (int64_t b = 0; b < c.batch; ++b) {
    q[b] = b == 0 ? c.q_len : b == 1 ? 0 : std::min(draw(c.q_len), c.q_len);
    k[b] = b == 0 ? c.k_len : b == 2 ? 0 : std::min(draw(c.k_len), c.k_len);
  }
  if (which != 2) lc.query_lengths = q;
  if (which != 1) lc.key_lengths = k;
  return lc;
}

// The shapes: GQA with L < S over several tiles, MQA with few queries and keys past a decode
// chunk, L > S, and a full GQA group of 16 queries. Decode runs those with L <= 16.
std::vector<Case> shapes() {
  return {sized(4, 4, 2, 97, 300, 59, 24), sized(4, 6, 1, 7, 600, 64, 64), sized(3, 2, 2, 45, 37, 16, 16),
          sized(4, 8, 2, 16, 20, 32, 32)};
}

// Masks, dropout, scale and which lengths are given cycle with the case number.
std::vector<LengthsCase> cases(uint64_t seed) {
  Generator gen(seed);
  const MaskKind masks[] = {MaskKind::none, MaskKind::both, MaskKind::bool_keys, MaskKind::additive_heads,
                            MaskKind::empty_rows};
  std::vector<LengthsCase> all;
  int n = 0;
  for (const Case& shape : shapes())
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Case c = shape;
      c.scoring.causal = causal;
      c.mask = masks[n % 5];
      if (n % 3 == 1) c.scoring.dropout_p = 0.2;
      if (n % 4 == 3) c.scoring.scale = -0.5;
      all.push_back(with_lengths(c, n % 3, gen));
      ++n;
    }
  return all;
}

TEST(SequenceLengths, ReferenceEqualsTheMaskedCall) {
  uint64_t seed = 500;
  for (const LengthsCase& lc : cases(5)) {
    check_equals_masked_twin<double>(lc, Backend::reference, seed);
    check_equals_masked_twin<float>(lc, Backend::reference, seed++);
  }
}

// cpu_flash and decode on every SIMD target compiled in and supported here.
TEST(SequenceLengths, FastBackendsEqualTheMaskedCallOnEveryTarget) {
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    uint64_t seed = 600;
    for (const LengthsCase& lc : cases(6)) {
      check_equals_masked_twin<float>(lc, Backend::cpu_flash, seed);
      if (lc.c.q_len <= 16) check_equals_masked_twin<float>(lc, Backend::decode, seed);
      ++seed;
    }
  }
}

// Long keys (past cpu_flash's kLongKeys, 16384: shared packs forward, key segments backward) with
// lengths that end inside, before and at the end of the segments.
TEST(SequenceLengths, LongKeysEqualTheMaskedCall) {
  Case c = sized(3, 2, 1, 16, 16385 + 97, 16, 16);
  c.scoring.causal = Causal::bottom_right;
  c.mask = MaskKind::bool_padding;
  check_equals_masked_twin<float>({c, {16, 3, 0}, {16385 + 97, 5000, 4096}}, Backend::cpu_flash, 700);
  check_equals_masked_twin<float>({c, {16, 3, 0}, {16385 + 97, 5000, 4096}}, Backend::decode, 700);
}

// Lengths are in the whole call's positions (Options::whole_call): a block of query rows with
// the whole call's lengths gives the whole call's rows bit for bit (forward and grad_query), the
// block's own rows past a sequence's length padding.
template <class T>
void check_query_block(Backend backend, Causal causal, int64_t r0, int64_t n) {
  SCOPED_TRACE(std::string(name_of(backend)) + " causal " + name_of(causal) + " rows " + std::to_string(r0) + "+" +
               std::to_string(n));
  Case c = sized(3, 4, 2, 37, 45, 16, 8);
  c.scoring.causal = causal;
  c.scoring.dropout_p = 0.2;
  c.mask = MaskKind::bool_2d;
  const std::vector<int64_t> ql{37, 20, 9}, kl{30, 45, 12};
  const LengthsCase lc{c, ql, kl};
  const Inputs in = make_inputs(c, 800);
  const Results<T> whole = run_call<T>(c, in, backend, &lc);

  const Tensor<T> q = mha::cast<T>(in.q), k = mha::cast<T>(in.k), v = mha::cast<T>(in.v), dout = mha::cast<T>(in.dout);
  Held<T> held;
  Options<T> opt = options_of<T>(c, in, backend, held);
  opt.query_lengths = View<const int64_t>(ql.data(), {3});
  opt.key_lengths = View<const int64_t>(kl.data(), {3});
  opt.whole_call = {r0, 0, 0, c.q_len, c.k_len, c.q_heads};
  opt.attend_mask = View<const bool>(*in.attend).slice(0, r0, n);
  auto rows = [&](const auto& t) {
    using V = std::remove_cvref_t<decltype(t[0])>;
    return copy_of(View<const V>(t).slice(2, r0, n));
  };
  const Tensor<T> q_block = rows(q), dout_block = rows(dout), out_block = rows(whole.fwd.output);
  const Tensor<double> lse_block = rows(whole.fwd.logsumexp);
  const ForwardResult<T> fwd = sdpa_forward(q_block, k, v, opt);
  EXPECT_TRUE(bitwise_equal(fwd.output, out_block)) << "output " << max_diff(fwd.output, out_block);
  EXPECT_TRUE(bitwise_equal(fwd.logsumexp, lse_block)) << "logsumexp " << max_diff(fwd.logsumexp, lse_block);
  if (backend == Backend::decode) return;  // decode's backward is cpu_flash's
  const Gradients<T> g = sdpa_backward(q_block, k, v, out_block, lse_block, dout_block, opt);
  const Tensor<T> dq = rows(whole.grads.grad_query);
  EXPECT_TRUE(bitwise_equal(g.grad_query, dq)) << "grad_query " << max_diff(g.grad_query, dq);
}

TEST(SequenceLengths, AreInTheWholeCallsPositions) {
  for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
    for (const auto& [r0, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 16}, {16, 8}, {21, 16}, {36, 1}}) {
      check_query_block<double>(Backend::reference, causal, r0, n);
      check_query_block<float>(Backend::reference, causal, r0, n);
      check_query_block<float>(Backend::cpu_flash, causal, r0, n);
      check_query_block<float>(Backend::decode, causal, r0, n);
    }
  }
}

TEST(SequenceLengths, BadLengthsAreRefusedByName) {
  const Tensor<float> q({2, 2, 5, 8}), k({2, 1, 7, 8}), v({2, 1, 7, 8});
  const std::vector<int64_t> three{1, 2, 3}, good_q{5, 0}, good_k{7, 0}, negative{2, -1}, long_q{6, 1}, long_k{1, 8};
  const Tensor<int64_t> column({2, 1}, {1, 2});
  auto forward = [&](View<const int64_t> ql, View<const int64_t> kl, int64_t whole_query_len = 0) {
    Options<float> opt;
    opt.query_lengths = ql;
    opt.key_lengths = kl;
    opt.whole_call.query_len = whole_query_len;
    sdpa_forward(q, k, v, opt);
  };
  auto view = [](const std::vector<int64_t>& x) { return View<const int64_t>(x.data(), {static_cast<int64_t>(x.size())}); };
  expect_error([&] { forward(view(three), {}); },
               "query_lengths: expected a 1-D tensor of 2 lengths (one per sequence), got shape [3]");
  expect_error([&] { forward({}, view(three)); },
               "key_lengths: expected a 1-D tensor of 2 lengths (one per sequence), got shape [3]");
  expect_error([&] { forward(column, {}); }, "query_lengths: expected a 1-D tensor of 2 lengths");
  expect_error([&] { forward(view(negative), {}); }, "query_lengths: expected lengths in [0, 5], got -1 for sequence 1");
  expect_error([&] { forward(view(long_q), {}); }, "query_lengths: expected lengths in [0, 5], got 6 for sequence 0");
  expect_error([&] { forward({}, view(negative)); }, "key_lengths: expected lengths in [0, 7], got -1 for sequence 1");
  expect_error([&] { forward({}, view(long_k)); }, "key_lengths: expected lengths in [0, 7], got 8 for sequence 1");
  EXPECT_NO_THROW(forward(view(good_q), view(good_k)));
  // The bound is the whole call's length.
  EXPECT_NO_THROW(forward(view(long_q), {}, 6));
  expect_error([&] { forward(view(std::vector<int64_t>{7, 0}), {}, 6); }, "query_lengths: expected lengths in [0, 6], got 7");
  // The backward checks them too.
  Options<float> opt;
  opt.key_lengths = view(long_k);
  const Tensor<double> lse({2, 2, 5});
  expect_error([&] { sdpa_backward(q, k, v, q, lse, q, opt); }, "key_lengths: expected lengths in [0, 7], got 8");
}

}  // namespace
}  // namespace mha::attention
