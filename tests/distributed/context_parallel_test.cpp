// Context-parallel attention under mpirun (ctest runs this binary with P = 1, 2, 3, 4 ranks on
// this machine). Every rank builds the same whole inputs from one seed, runs its share of the
// call, and compares with the single-process call's results cut to its rows (shard):
//   - ulysses, and the ring with P = 1: bit for bit;
//   - the ring: FlashAttention's rule against the whole call in double (float), 1e-12 (double);
// over non-causal and both causal alignments (with L != S), GQA and MQA, key-padding and additive
// masks, fully masked rows (no NaN), dropout, lengths not divisible by 2P, ranks with fewer rows
// than one tile or none. Message and byte counts are asserted: the ring sends P − 1 blocks forward
// and 2P − 1 backward; ulysses makes two all-to-alls each way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/distributed/context_parallel.h"

namespace mha::distributed {
namespace {

using attention::Causal;
using attention::Options;
using attention::test_cases::bitwise_equal;
using attention::test_cases::FlashRule;
using attention::test_cases::max_diff;

using attention::test_cases::MaskKind;

// A case (shapes, mask, scoring) under a scheme and a layout.
struct CpCase {
  Scheme scheme;
  Layout layout;
  attention::test_cases::Case c;
};

// D: the query/key and the value head size. dropout_seed 99.
CpCase make_case(Scheme scheme, Layout layout, Causal causal, int64_t batch, int64_t query_heads, int64_t kv_heads,
                 int64_t query_len, int64_t key_len, int64_t head_dim, MaskKind mask, double dropout) {
  CpCase cp{scheme, layout, attention::test_cases::sized(batch, query_heads, kv_heads, query_len, key_len, head_dim, head_dim)};
  cp.c.mask = mask;
  cp.c.scoring.causal = causal;
  cp.c.scoring.dropout_p = dropout;
  cp.c.scoring.dropout_seed = 99;
  return cp;
}

std::string describe(const CpCase& cp) {
  return std::string(cp.scheme == Scheme::ring ? "ring" : "ulysses") +
         (cp.layout == Layout::zigzag ? " zigzag " : " contiguous ") + cp.c.describe();
}

// The whole call's inputs and options, the same on every rank (make_inputs from one seed).
template <class T>
struct Whole {
  attention::test_cases::Inputs in;
  Tensor<T> q, k, v, dout;
  attention::test_cases::Held<T> held;
  Options<T> options;

  explicit Whole(const CpCase& cp) : in(attention::test_cases::make_inputs(cp.c, 42)) {
    q = cast<T>(in.q);
    k = cast<T>(in.k);
    v = cast<T>(in.v);
    dout = cast<T>(in.dout);
    options = attention::test_cases::options_of<T>(cp.c, in, attention::Backend::automatic, held);
  }
  Whole(const Whole&) = delete;  // the options view the masks held here
};

template <class T>
Tensor<T> mine(const Tensor<T>& whole, int64_t axis, Layout layout, Communicator& comm) {
  return shard(View<const T>(whole), axis, layout, comm.rank(), comm.size());
}

// The bytes of the ring's messages: one block of keys and values (or their gradients) of rank
// `owner`'s rows per message.
template <class T>
int64_t block_bytes(const CpCase& cp, int owner, int ranks) {
  const attention::test_cases::Case& c = cp.c;
  return static_cast<int64_t>(sizeof(T)) * c.batch * c.kv_heads * shard_length(c.k_len, cp.layout, owner, ranks) *
         (c.qk_dim + c.v_dim);
}

template <class T>
void check_case(const CpCase& cp, FlashRule& rule) {
  Communicator& comm = Communicator::world();
  const int P = comm.size(), r = comm.rank();
  SCOPED_TRACE(describe(cp) + " P=" + std::to_string(P) + " rank " + std::to_string(r));
  const Whole<T> w(cp);
  const Layout layout = cp.layout;
  const auto fwd = attention::sdpa_forward(w.q, w.k, w.v, w.options);
  const auto grads = attention::sdpa_backward(w.q, w.k, w.v, fwd.output, fwd.logsumexp, w.dout, w.options);

  const Sequence seq{cp.c.q_len, cp.c.k_len, layout};
  const Tensor<T> q = mine(w.q, 2, layout, comm), k = mine(w.k, 2, layout, comm), v = mine(w.v, 2, layout, comm),
                  dout = mine(w.dout, 2, layout, comm);
  comm.reset_traffic();
  const auto out = context_parallel_forward(comm, cp.scheme, q, k, v, seq, w.options);
  const Traffic forward = comm.traffic();
  comm.reset_traffic();
  const auto g = context_parallel_backward(comm, cp.scheme, q, k, v, out.output, out.logsumexp, dout, seq, w.options);
  const Traffic backward = comm.traffic();

  // EXPECT, never ASSERT, in what every rank runs: a rank that returned early would leave the
  // others waiting in the next call.
  auto nans = [](const Tensor<T>& t) { return std::count_if(t.values().begin(), t.values().end(), [](T x) { return std::isnan(x); }); };
  EXPECT_EQ(nans(out.output), 0) << "NaN in the output";
  EXPECT_EQ(nans(g.grad_query) + nans(g.grad_key) + nans(g.grad_value), 0) << "NaN in a gradient";

  const Tensor<T> want_out = mine(fwd.output, 2, layout, comm), want_dq = mine(grads.grad_query, 2, layout, comm),
                  want_dk = mine(grads.grad_key, 2, layout, comm), want_dv = mine(grads.grad_value, 2, layout, comm);
  const Tensor<double> want_lse = mine(fwd.logsumexp, 2, layout, comm);
  if (cp.scheme == Scheme::ulysses || P == 1) {
    EXPECT_TRUE(bitwise_equal(out.output, want_out)) << "output, " << max_diff(out.output, want_out);
    EXPECT_TRUE(bitwise_equal(out.logsumexp, want_lse)) << "logsumexp, " << max_diff(out.logsumexp, want_lse);
    EXPECT_TRUE(bitwise_equal(g.grad_query, want_dq)) << "grad_query, " << max_diff(g.grad_query, want_dq);
    EXPECT_TRUE(bitwise_equal(g.grad_key, want_dk)) << "grad_key, " << max_diff(g.grad_key, want_dk);
    EXPECT_TRUE(bitwise_equal(g.grad_value, want_dv)) << "grad_value, " << max_diff(g.grad_value, want_dv);
  } else {
    // Against the whole call in double on the same inputs; float also beside the float reference.
    const Whole<double> w64(cp);
    const Options<double>& o64 = w64.options;
    const Tensor<double>&q64 = w64.q, &k64 = w64.k, &v64 = w64.v, &d64 = w64.dout;
    const auto f64 = attention::sdpa_forward(q64, k64, v64, o64);
    const auto g64 = attention::sdpa_backward(q64, k64, v64, f64.output, f64.logsumexp, d64, o64);
    auto cut = [&](const Tensor<double>& t) { return mine(t, 2, layout, comm); };
    if constexpr (std::is_same_v<T, double>) {
      EXPECT_LE(max_diff(out.output, cut(f64.output)), 1e-12) << "output";
      EXPECT_LE(max_diff(out.logsumexp, cut(f64.logsumexp)), 1e-12) << "logsumexp";
      EXPECT_LE(max_diff(g.grad_query, cut(g64.grad_query)), 1e-12) << "grad_query";
      EXPECT_LE(max_diff(g.grad_key, cut(g64.grad_key)), 1e-12) << "grad_key";
      EXPECT_LE(max_diff(g.grad_value, cut(g64.grad_value)), 1e-12) << "grad_value";
    } else {
      Options<float> o32 = w.options;
      o32.backend = attention::Backend::reference;
      const auto f32 = attention::sdpa_forward(w.q, w.k, w.v, o32);
      const auto g32 = attention::sdpa_backward(w.q, w.k, w.v, f32.output, f32.logsumexp, w.dout, o32);
      auto cut32 = [&](const Tensor<float>& t) { return mine(t, 2, layout, comm); };
      rule.expect(out.output, cut32(f32.output), cut(f64.output), "output");
      rule.expect(out.logsumexp, cut(f32.logsumexp), cut(f64.logsumexp), "logsumexp");
      rule.expect(g.grad_query, cut32(g32.grad_query), cut(g64.grad_query), "grad_query");
      rule.expect(g.grad_key, cut32(g32.grad_key), cut(g64.grad_key), "grad_key");
      rule.expect(g.grad_value, cut32(g32.grad_value), cut(g64.grad_value), "grad_value");
    }
  }

  // What this rank sent. The ring: a block of keys and values per step but the last, forward and
  // backward, and the gradients' blocks at every step backward; one all_gather per call (every
  // rank's call checked against rank 0's). Ulysses: the all_gather and two all-to-alls.
  if (cp.scheme == Scheme::ring) {
    int64_t kv = 0, all = 0;
    for (int s = 0; s < P; ++s) {
      const int64_t bytes = block_bytes<T>(cp, ((r - s) % P + P) % P, P);
      all += bytes;
      if (s + 1 < P) kv += bytes;
    }
    EXPECT_EQ(forward.messages, P - 1);
    EXPECT_EQ(forward.message_bytes, kv);
    // (With one rank the gradients' block is home from the start: nothing is sent.)
    EXPECT_EQ(backward.messages, P > 1 ? 2 * P - 1 : 0);
    EXPECT_EQ(backward.message_bytes, P > 1 ? kv + all : 0);
    EXPECT_EQ(forward.collectives, 1);
    EXPECT_EQ(backward.collectives, 1);
  } else {
    EXPECT_EQ(forward.messages, 0);
    EXPECT_EQ(backward.messages, 0);
    EXPECT_EQ(forward.collectives, 3);
    EXPECT_EQ(backward.collectives, 3);
  }
}

std::vector<CpCase> cases() {
  std::vector<CpCase> all;
  for (Scheme scheme : {Scheme::ring, Scheme::ulysses})
    for (Layout layout : {Layout::contiguous, Layout::zigzag})
      for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
        // GQA, L != S (and so a real bottom-right alignment), lengths not divisible by 2P.
        all.push_back(make_case(scheme, layout, causal, 2, 4, 2, 37, 45, 16, MaskKind::none, 0.0));
        all.push_back(make_case(scheme, layout, causal, 1, 3, 1, 45, 37, 8, MaskKind::key_padding, 0.0));  // MQA
        all.push_back(make_case(scheme, layout, causal, 2, 4, 4, 29, 29, 16, MaskKind::additive_full, 0.25));
        all.push_back(make_case(scheme, layout, causal, 1, 2, 2, 33, 40, 16, MaskKind::empty_rows, 0.0));
        all.push_back(make_case(scheme, layout, causal, 1, 2, 1, 3, 5, 8, MaskKind::none, 0.0));  // fewer rows than ranks
      }
  // Long enough for several of cpu_flash's tiles per rank, causal, zigzag.
  all.push_back(make_case(Scheme::ring, Layout::zigzag, Causal::top_left, 1, 4, 2, 500, 500, 32, MaskKind::none, 0.1));
  all.push_back(make_case(Scheme::ulysses, Layout::zigzag, Causal::top_left, 1, 4, 2, 500, 500, 32, MaskKind::none, 0.1));
  return all;
}

TEST(ContextParallel, FloatEqualsTheWholeCall) {
  FlashRule rule{"ring"};
  for (const CpCase& cp : cases()) check_case<float>(cp, rule);
  if (Communicator::world().rank() == 0)
    std::printf("ring, float: largest error / FlashAttention's bound %.3f\n", rule.worst_fraction);
}

TEST(ContextParallel, DoubleEqualsTheWholeCall) {
  FlashRule rule{"ring"};
  for (const CpCase& cp : cases()) check_case<double>(cp, rule);
}

TEST(ContextParallel, EveryRankMustMakeTheSameCall) {
  Communicator& comm = Communicator::world();
  const Whole<float> w(make_case(Scheme::ring, Layout::contiguous, Causal::none, 1, 2, 2, 8, 8, 4, MaskKind::none, 0.0));
  Options<float> options;
  options.dropout_seed = comm.rank() == comm.size() - 1 ? 7 : 8;  // the last rank differs (P = 1: none)
  const Sequence seq{8, 8, Layout::contiguous};
  auto call = [&](Scheme scheme) {
    context_parallel_forward(comm, scheme, mine(w.q, 2, seq.layout, comm), mine(w.k, 2, seq.layout, comm),
                             mine(w.v, 2, seq.layout, comm), seq, options);
  };
  if (comm.size() > 1) {
    const std::string expected = "rank " + std::to_string(comm.size() - 1) + "'s dropout_seed (7) differs from rank 0's (8)";
    mha::testing::expect_error([&] { call(Scheme::ring); }, expected);
    mha::testing::expect_error([&] { call(Scheme::ulysses); }, expected);
  }
  options.dropout_seed = 8;
  options.softcap = comm.rank() == comm.size() - 1 ? 2.5 : 0.2;  // a double, shown as one
  if (comm.size() > 1)
    mha::testing::expect_error([&] { call(Scheme::ring); },
                               "rank " + std::to_string(comm.size() - 1) + "'s softcap (2.5) differs from rank 0's (0.2)");
  options.softcap = 0;
  options.need_weights = true;  // refused on every rank alike, before any message
  mha::testing::expect_error([&] { call(Scheme::ring); }, "options.need_weights: context-parallel attention");
  options.need_weights = false;
  options.whole_call.query_offset = 1;
  mha::testing::expect_error([&] { call(Scheme::ring); }, "options.whole_call: expected the default");
  options.whole_call = {};
  const Tensor<int64_t> offsets(Shape{2}, {int64_t{0}, int64_t{8}});
  options.cu_seqlens_q = offsets;
  mha::testing::expect_error([&] { call(Scheme::ring); },
                             "options.cu_seqlens_q: context-parallel attention takes no typed view but the masks");
  options.cu_seqlens_q = {};
  Tensor<bool> bad({3, 8});
  options.attend_mask = bad;
  mha::testing::expect_error([&] { call(Scheme::ring); }, "options.attend_mask: expected a mask broadcastable");
}

}  // namespace
}  // namespace mha::distributed
