// Scoring::window_left / window_right (a sliding window, FlashAttention-2's window_size):
//   - the reference (double and float) equals, bit for bit, the same call with the dense
//     attend_mask the documented semantics give, built here by hand: query i sees key j when
//     i + d − left <= j <= i + d + right (d = 0 for top-left causality, S − L otherwise; −1 =
//     unbounded), with j <= i + d under causality; Hugging Face's sliding_window = W, (W − 1, 0)
//     with causality, is also checked against its own definition kv > q − W;
//   - cpu_flash and decode, which walk only the keys a block of queries sees and mask the rest at
//     the tile's two edges, hold to the reference under FlashAttention's rule on every SIMD target;
//   - a window wider than the sequence is no window, bit for bit on every backend; a window of
//     one key (0, 0) returns that key's value exactly;
//   - a window below −1 is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "mha/attention/attention.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using namespace test_cases;

// Element (b, h, i, j) of a mask of rank 1..4 broadcast to (B, Hq, L, S).
bool broadcast_at(const Tensor<bool>& m, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t index[4] = {b, h, i, j};
  int64_t flat = 0;
  for (int64_t a = 0; a < m.dim(); ++a) flat = flat * m.size(a) + (m.size(a) == 1 ? 0 : index[4 - m.dim() + a]);
  return m[flat];
}

// Whether query i sees key j by the window and causality, from the documented semantics.
bool in_window(const Scoring& s, int64_t L, int64_t S, int64_t i, int64_t j) {
  const int64_t d = s.causal == Causal::top_left ? 0 : S - L;
  bool see = true;
  if (s.window_left >= 0) see = see && j >= i + d - s.window_left;
  if (s.window_right >= 0) see = see && j <= i + d + s.window_right;
  if (s.causal != Causal::none) see = see && j <= i + d;
  return see;
}

// The dense (B, Hq, L, S) attend_mask of the window, its causality and the case's own mask.
Tensor<bool> dense_mask(const Case& c, const Inputs& in) {
  Tensor<bool> m({c.batch, c.q_heads, c.q_len, c.k_len});
  int64_t at = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t i = 0; i < c.q_len; ++i)
        for (int64_t j = 0; j < c.k_len; ++j, ++at)
          m[at] = in_window(c.scoring, c.q_len, c.k_len, i, j) && (!in.attend || broadcast_at(*in.attend, b, h, i, j));
  return m;
}

// The windowed call and its masked twin (window and causality in the mask) on `backend`.
template <class T>
void expect_twin_bitwise(const Case& c, const Tensor<bool>& mask, uint64_t seed, Backend backend) {
  const Inputs in = make_inputs(c, seed);
  Inputs twin_in = in;
  twin_in.attend = mask;
  Case twin = c;
  twin.scoring.causal = Causal::none;
  twin.scoring.window_left = twin.scoring.window_right = -1;
  expect_same_bits(run<T>(c, in, backend), run<T>(twin, twin_in, backend));
}

// Windows: one-sided, two-sided, one key, narrower than a tile, wider than one, past the sequence.
const std::pair<int64_t, int64_t> kWindows[] = {{5, -1}, {-1, 3}, {37, 11}, {0, 0}, {300, -1}, {70, 300}, {2, 0}};

std::vector<Case> shapes() {
  return {sized(2, 4, 2, 97, 300, 24, 17), sized(1, 2, 1, 300, 97, 16, 16), sized(2, 2, 2, 45, 45, 8, 8),
          sized(1, 6, 1, 7, 600, 64, 64)};
}

TEST(Window, ReferenceEqualsTheDenseMaskOfItsDefinition) {
  uint64_t seed = 4000;
  int n = 0;
  for (const Case& shape : shapes())
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
      for (auto [left, right] : kWindows) {
        Case c = shape;
        c.scoring.causal = causal;
        c.scoring.window_left = left;
        c.scoring.window_right = right;
        c.mask = n % 3 == 0 ? MaskKind::both : n % 3 == 1 ? MaskKind::bool_keys : MaskKind::none;
        if (n % 4 == 1) c.scoring.dropout_p = 0.2;
        ++n;
        SCOPED_TRACE(c.describe());
        const Tensor<bool> mask = dense_mask(c, make_inputs(c, seed));
        expect_twin_bitwise<double>(c, mask, seed, Backend::reference);
        expect_twin_bitwise<float>(c, mask, seed, Backend::reference);
        ++seed;
      }
}

// Hugging Face's sliding_window = W (masking_utils.py, sliding_window_overlay: kv > q − W, with
// causality kv <= q) is (W − 1, 0) with causality; L = S, as a prefill computes it.
TEST(Window, HuggingFacesSlidingWindowIsWMinusOneToTheLeft) {
  for (int64_t W : {1, 4, 64, 200}) {
    Case c = sized(1, 2, 2, 150, 150, 16, 16);
    c.scoring.causal = Causal::top_left;
    c.scoring.window_left = W - 1;
    c.scoring.window_right = 0;
    Tensor<bool> mask({1, 1, c.q_len, c.k_len});
    for (int64_t q = 0; q < c.q_len; ++q)
      for (int64_t kv = 0; kv < c.k_len; ++kv) mask[q * c.k_len + kv] = kv > q - W && kv <= q;
    SCOPED_TRACE("W " + std::to_string(W));
    expect_twin_bitwise<double>(c, mask, 77, Backend::reference);
  }
}

// cpu_flash (and decode for L <= 16) against the reference on every SIMD target: the lower edge
// of a tile's visible columns is masked by the kernels only when a window starts a row's keys past
// the tile's first column.
TEST(Window, FusedBackendsMatchTheReferenceOnEveryTarget) {
  std::vector<Case> cases;
  for (const Case& shape : shapes())
    for (auto [left, right] : kWindows) {
      const int n = static_cast<int>(cases.size());
      Case& c = cases.emplace_back(shape);
      c.scoring.causal = static_cast<Causal>(n % 3);
      c.scoring.window_left = left;
      c.scoring.window_right = right;
      c.mask = n % 2 ? MaskKind::additive_2d : MaskKind::none;
      c.need_weights = n % 5 == 0;
    }
  expect_fused_backends_match_reference(cases, 5000, "window");
}

// A window that covers every key is no window: the same walk, the same bits, on every backend.
TEST(Window, WiderThanTheSequenceIsNoWindow) {
  for (Backend backend : {Backend::reference, Backend::cpu_flash, Backend::decode}) {
    Case c = sized(2, 4, 2, backend == Backend::decode ? 9 : 97, 300, 24, 24);
    c.mask = MaskKind::both;
    const Inputs in = make_inputs(c, 91);
    const Results<float> plain = run<float>(c, in, backend);
    c.scoring.window_left = 400;
    c.scoring.window_right = 1000000;
    const Results<float> wide = run<float>(c, in, backend);
    SCOPED_TRACE(name_of(backend));
    EXPECT_TRUE(bitwise_equal(plain.fwd.output, wide.fwd.output));
    EXPECT_TRUE(bitwise_equal(plain.grads.grad_key, wide.grads.grad_key));
  }
}

// (0, 0) on L = S without causality: each query sees its own key only, so its softmax is 1 and
// its output is that key's value, exactly; the gradient of every key but the query's own is 0.
TEST(Window, OneKeyWindowReturnsThatKeysValue) {
  for (Backend backend : {Backend::reference, Backend::cpu_flash, Backend::decode}) {
    Case c = sized(1, 2, 1, backend == Backend::decode ? 16 : 130, backend == Backend::decode ? 16 : 130, 8, 8);
    c.scoring.window_left = c.scoring.window_right = 0;
    const Inputs in = make_inputs(c, 5);
    const ForwardResult<float> r = run_forward<float>(c, in, backend);
    SCOPED_TRACE(name_of(backend));
    int64_t wrong = 0;
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t i = 0; i < c.q_len; ++i)
        for (int64_t d = 0; d < c.v_dim; ++d)
          wrong += r.output[(h * c.q_len + i) * c.v_dim + d] != in.v[i * c.v_dim + d];
    EXPECT_EQ(wrong, 0);
  }
}

TEST(Window, BelowMinusOneIsRefused) {
  Tensor<float> q({1, 1, 2, 4}), k({1, 1, 3, 4}), v({1, 1, 3, 4});
  Options<float> opt;
  opt.window_left = -2;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "window_left: expected -1 (unbounded) or a number of keys >= 0, got -2");
  opt.window_left = 3;
  opt.window_right = -7;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "window_right: expected -1 (unbounded) or a number of keys >= 0, got -7");
}

}  // namespace
}  // namespace mha::attention
