// Scoring::chunk_size (Llama 4's chunked attention) and Options::key_starts (left padding,
// FlashAttention's cache_leftpad):
//   - the reference (double and float) equals, bit for bit, the same call with the dense
//     attend_mask their documented semantics give, built here by hand: sequence b's keys begin at
//     p = key_starts[b] and its positions are its own (key j is j − p, S_b = S − p keys; p < 0: the
//     sequence began −p keys before the call's first); query i's
//     own key is i + d (d = 0 for top-left causality, S_b − L otherwise), and it sees key j when
//     ⌊(j − p) / C⌋ = ⌊(i + d) / C⌋, with j − p <= i + d under causality and the window as always;
//   - transformers' chunked_overlay ((kv − pad) // C == (q − pad) // C, with causality kv <= q) on a
//     left-padded batch is chunk_size = C with bottom-right causality and key_starts = pad;
//   - cpu_flash and decode hold to the reference under FlashAttention's rule on every SIMD target;
//   - a chunk as long as the sequence is no chunk, bit for bit;
//   - a negative chunk, a start past the sequence's keys or below −2^62 are refused.
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

int64_t floor_div(int64_t a, int64_t b) { return (a >= 0 ? a : a - b + 1) / b; }

// Whether query i of sequence b sees key j, from the documented semantics.
bool sees(const Scoring& s, int64_t L, int64_t S, int64_t start, int64_t i, int64_t j) {
  const int64_t own_keys = S - start, own_j = j - start;
  const int64_t d = s.causal == Causal::top_left ? 0 : own_keys - L;
  bool see = own_j >= 0;
  if (s.window_left >= 0) see = see && own_j >= i + d - s.window_left;
  if (s.window_right >= 0) see = see && own_j <= i + d + s.window_right;
  if (s.causal != Causal::none) see = see && own_j <= i + d;
  if (s.chunk_size > 0) see = see && floor_div(own_j, s.chunk_size) == floor_div(i + d, s.chunk_size);
  return see;
}

// The dense (B, 1, L, S) attend_mask of the chunks, the left padding, causality and the window.
Tensor<bool> dense_mask(const Case& c, const Inputs& in) {
  Tensor<bool> m({c.batch, 1, c.q_len, c.k_len});
  int64_t at = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.q_len; ++i)
      for (int64_t j = 0; j < c.k_len; ++j, ++at)
        m[at] = sees(c.scoring, c.q_len, c.k_len, in.key_starts ? (*in.key_starts)[b] : 0, i, j);
  return m;
}

// The chunked call and its masked twin (chunks, padding, causality and window in the mask).
template <class T>
void expect_twin_bitwise(const Case& c, uint64_t seed, Backend backend) {
  const Inputs in = make_inputs(c, seed);
  Inputs twin_in = in;
  twin_in.attend = dense_mask(c, in);
  twin_in.key_starts.reset();
  Case twin = c;
  twin.left_padded = false;
  twin.scoring.causal = Causal::none;
  twin.scoring.window_left = twin.scoring.window_right = -1;
  twin.scoring.chunk_size = 0;
  expect_same_bits(run<T>(c, in, backend), run<T>(twin, twin_in, backend));
}

// Chunks: one key, shorter than a tile, longer than one, past the sequence.
const int64_t kChunks[] = {1, 5, 40, 200, 1000};

std::vector<Case> shapes() {
  return {sized(2, 4, 2, 97, 300, 24, 17), sized(1, 2, 1, 300, 97, 16, 16), sized(2, 2, 2, 45, 45, 8, 8),
          sized(2, 6, 1, 7, 600, 64, 64)};
}

TEST(Chunk, ReferenceEqualsTheDenseMaskOfItsDefinition) {
  uint64_t seed = 6000;
  int n = 0;
  for (const Case& shape : shapes())
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
      for (int64_t chunk : kChunks) {
        Case c = shape;
        c.scoring.causal = causal;
        c.scoring.chunk_size = n % 6 == 5 ? 0 : chunk;  // left padding alone, too
        c.left_padded = n % 2 == 0;
        if (n % 4 == 1) c.scoring.window_left = 3;
        if (n % 5 == 2) c.scoring.dropout_p = 0.2;
        ++n;
        SCOPED_TRACE(c.describe());
        expect_twin_bitwise<double>(c, seed, Backend::reference);
        expect_twin_bitwise<float>(c, seed, Backend::reference);
        ++seed;
      }
}

// transformers' chunked_overlay (masking_utils.py): kv_idx − pad and q_idx − pad in the same chunk,
// and'ed with causality kv_idx <= q_idx and the padding kv_idx >= pad; a prefill (L = S) of a
// left-padded batch. Its padding queries see no key (transformers' rows there are never read).
TEST(Chunk, TransformersChunkedOverlayOnALeftPaddedBatch) {
  for (int64_t C : {1, 3, 8, 64}) {
    Case c = sized(2, 2, 1, 50, 50, 16, 16);
    c.scoring.causal = Causal::bottom_right;
    c.scoring.chunk_size = C;
    c.left_padded = true;
    const Inputs in = make_inputs(c, 88);
    Inputs twin_in = in;
    twin_in.key_starts.reset();
    twin_in.attend = Tensor<bool>({c.batch, 1, c.q_len, c.k_len});
    for (int64_t b = 0, at = 0; b < c.batch; ++b) {
      const int64_t pad = (*in.key_starts)[b];
      for (int64_t q = 0; q < c.q_len; ++q)
        for (int64_t kv = 0; kv < c.k_len; ++kv, ++at)
          (*twin_in.attend)[at] = kv >= pad && q >= pad && kv <= q && floor_div(kv - pad, C) == floor_div(q - pad, C);
    }
    Case twin = c;
    twin.left_padded = false;
    twin.scoring.causal = Causal::none;
    twin.scoring.chunk_size = 0;
    SCOPED_TRACE("C " + std::to_string(C));
    expect_same_bits(run<double>(c, in, Backend::reference), run<double>(twin, twin_in, Backend::reference));
  }
}

// cpu_flash (and decode for L <= 16) against the reference on every SIMD target.
TEST(Chunk, FusedBackendsMatchTheReferenceOnEveryTarget) {
  std::vector<Case> cases;
  for (const Case& shape : shapes())
    for (int64_t chunk : kChunks) {
      const int n = static_cast<int>(cases.size());
      Case& c = cases.emplace_back(shape);
      c.scoring.causal = static_cast<Causal>(n % 3);
      c.scoring.chunk_size = chunk;
      c.left_padded = n % 2 == 1;
      c.mask = n % 3 == 0 ? MaskKind::additive_2d : MaskKind::none;
      c.need_weights = n % 7 == 0;
    }
  expect_fused_backends_match_reference(cases, 7000, "chunk");
}

// A chunk that holds every position of the call is no chunk: the same walk, the same bits.
TEST(Chunk, AChunkAsLongAsTheCallIsNoChunk) {
  for (Backend backend : {Backend::reference, Backend::cpu_flash}) {
    Case c = sized(2, 2, 1, 97, 97, 16, 16);
    c.scoring.causal = Causal::top_left;
    const Inputs in = make_inputs(c, 9);
    const Results<float> plain = run<float>(c, in, backend);
    for (int64_t chunk : {int64_t{97}, int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
      c.scoring.chunk_size = chunk;
      const Results<float> chunked = run<float>(c, in, backend);
      EXPECT_TRUE(bitwise_equal(plain.fwd.output, chunked.fwd.output)) << chunk;
      EXPECT_TRUE(bitwise_equal(plain.grads.grad_query, chunked.grads.grad_query)) << chunk;
    }
  }
}

TEST(Chunk, BadSettingsAreRefused) {
  Case c = sized(2, 2, 1, 7, 7, 8, 8);
  c.scoring.chunk_size = -1;
  expect_error([&] { run_forward<float>(c, make_inputs(c, 1), Backend::automatic); },
               "chunk_size: expected 0 (no chunks) or a number of keys > 0, got -1");
  c.scoring.chunk_size = 4;
  Inputs in = make_inputs(c, 1);
  in.key_starts = Tensor<int64_t>(Shape{2}, {int64_t{0}, int64_t{8}});
  expect_error([&] { run_forward<float>(c, in, Backend::automatic); },
               "key_starts: expected starts in [-2^62, 7], got 8 for sequence 1");
  in.key_starts = Tensor<int64_t>(Shape{2}, {-(int64_t{1} << 62) - 1, int64_t{0}});
  expect_error([&] { run_forward<float>(c, in, Backend::automatic); },
               "key_starts: expected starts in [-2^62, 7], got -4611686018427387905 for sequence 0");
  in.key_starts = Tensor<int64_t>(Shape{3}, {int64_t{0}, int64_t{1}, int64_t{2}});
  expect_error([&] { run_forward<float>(c, in, Backend::automatic); },
               "key_starts: expected a 1-D tensor of 2 starts (one per sequence), got shape [3]");
}

}  // namespace
}  // namespace mha::attention
