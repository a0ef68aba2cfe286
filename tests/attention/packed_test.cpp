// Packed variable-length sequences (Options::cu_seqlens_q / cu_seqlens_k, FlashAttention's varlen):
//   - the reference on a packed call equals, bit for bit (double and float), each sequence called
//     on its own (a view of the packed tensors), with causality of both alignments, windows,
//     soft-caps, sinks, per-sequence ALiBi slopes, per-sequence key lengths (seqused_k), GQA and
//     empty sequences; the per-sequence twin is the definition "no attention across sequences";
//   - cpu_flash on packed calls holds to the reference under FlashAttention's rule, forward and
//     backward (grad_sinks too), dropout included, on every SIMD target; bitwise the same for 1
//     and 2 threads;
//   - FlashAttention's (total, H, D) memory is read in place as the (1, H, total, D) view;
//   - bad offsets and combinations are refused with the argument named.
#include <gtest/gtest.h>
#include <omp.h>

#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "mha/attention/attention.h"
#include "mha/core/simd.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using namespace test_cases;

// A packed case: the sequences' query and key counts, the heads and head sizes, the settings.
struct PackedCase {
  std::vector<int64_t> q_lens, k_lens;
  int64_t q_heads = 4, kv_heads = 2, qk_dim = 8, v_dim = 8;
  Scoring scoring;
  bool sinks = false, alibi = false;  // ALiBi: (N, Hq) slopes, one row per sequence
  std::vector<int64_t> seqused_k;     // key_lengths, one per sequence (empty: none)

  int64_t count() const { return static_cast<int64_t>(q_lens.size()); }
  std::string describe() const {
    std::string s = "Hq" + std::to_string(q_heads) + " Hkv" + std::to_string(kv_heads) + " lengths";
    for (int64_t n = 0; n < count(); ++n) s += " " + std::to_string(q_lens[n]) + "x" + std::to_string(k_lens[n]);
    describe_fields(scoring, s);
    if (sinks) s += " sinks";
    if (alibi) s += " alibi(N,Hq)";
    if (!seqused_k.empty()) s += " seqused_k";
    return s;
  }
};

std::vector<int64_t> offsets(const std::vector<int64_t>& lens) {
  std::vector<int64_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// The packed tensors (batch 1, sequences back to back) and the per-head/per-sequence values.
struct PackedInputs {
  Tensor<float> q, k, v, dout;
  std::optional<Tensor<float>> sinks, slopes;
  std::vector<int64_t> cu_q, cu_k;
};

PackedInputs make_packed(const PackedCase& c, uint64_t seed) {
  Generator gen(seed);
  PackedInputs in;
  in.cu_q = offsets(c.q_lens);
  in.cu_k = offsets(c.k_lens);
  const int64_t L = in.cu_q.back(), S = in.cu_k.back();
  in.q = random_tensor({1, c.q_heads, L, c.qk_dim}, gen);
  in.k = random_tensor({1, c.kv_heads, S, c.qk_dim}, gen);
  in.v = random_tensor({1, c.kv_heads, S, c.v_dim}, gen);
  in.dout = random_tensor({1, c.q_heads, L, c.v_dim}, gen);
  if (c.sinks) in.sinks = random_tensor({c.q_heads}, gen);
  if (c.alibi) {
    in.slopes = Tensor<float>({c.count(), c.q_heads});
    for (auto& x : in.slopes->values()) x = static_cast<float>(gen.uniform());
  }
  return in;
}

template <class T>
struct PackedRun {
  Tensor<T> output;
  Tensor<double> logsumexp;
  Tensor<T> dq, dk, dv;
  std::optional<Tensor<T>> dsinks;
};

// The packed call on `backend` (packed), or each sequence on its own through views of the same
// tensors (twin), in T.
template <class T>
PackedRun<T> run_packed(const PackedCase& c, const PackedInputs& in, Backend backend, bool twin) {
  const Tensor<T> q = mha::cast<T>(in.q), k = mha::cast<T>(in.k), v = mha::cast<T>(in.v), dout = mha::cast<T>(in.dout);
  std::optional<Tensor<T>> sinks, slopes;
  if (in.sinks) sinks = mha::cast<T>(*in.sinks);
  if (in.slopes) slopes = mha::cast<T>(*in.slopes);
  Options<T> opt;
  static_cast<Scoring&>(opt) = c.scoring;
  opt.backend = backend;
  if (sinks) opt.sinks = *sinks;
  PackedRun<T> r{Tensor<T>(q.shape()), Tensor<double>({1, c.q_heads, q.size(2)}), Tensor<T>(q.shape()),
                 Tensor<T>(k.shape()), Tensor<T>(v.shape()), std::nullopt};
  r.output = Tensor<T>({1, c.q_heads, q.size(2), c.v_dim});
  if (sinks) r.dsinks = Tensor<T>({c.q_heads});
  const View<T> sinks_grad = r.dsinks ? View<T>(*r.dsinks) : View<T>();
  if (!twin) {
    const Tensor<int64_t> cu_q({c.count() + 1}, std::span<const int64_t>(in.cu_q)),
        cu_k({c.count() + 1}, std::span<const int64_t>(in.cu_k));
    Tensor<int64_t> used;
    opt.cu_seqlens_q = cu_q;
    opt.cu_seqlens_k = cu_k;
    if (slopes) opt.alibi_slopes = *slopes;
    if (!c.seqused_k.empty()) opt.key_lengths = used = Tensor<int64_t>({c.count()}, std::span<const int64_t>(c.seqused_k));
    sdpa_forward_into<T>(q, k, v, {r.output, r.logsumexp, {}}, opt);
    sdpa_backward_into<T>(q, k, v, r.output, r.logsumexp, dout, {r.dq, r.dk, r.dv, false, sinks_grad}, opt);
    return r;
  }
  for (int64_t n = 0; n < c.count(); ++n) {
    const int64_t q0 = in.cu_q[n], lq = c.q_lens[n], k0 = in.cu_k[n], lk = c.k_lens[n];
    auto rows = [&](auto& t) { return View<std::remove_reference_t<decltype(*t.data())>>(t).slice(2, q0, lq); };
    auto keys = [&](auto& t) { return View<std::remove_reference_t<decltype(*t.data())>>(t).slice(2, k0, lk); };
    Options<T> o = opt;
    Tensor<T> slope_row;
    if (slopes) o.alibi_slopes = slope_row = Tensor<T>({c.q_heads}, std::span<const T>(slopes->data() + n * c.q_heads, c.q_heads));
    Tensor<int64_t> used;
    if (!c.seqused_k.empty()) o.key_lengths = used = Tensor<int64_t>({1}, {c.seqused_k[static_cast<size_t>(n)]});
    const View<const T> qn = rows(q), kn = keys(k), vn = keys(v), on = rows(r.output);
    const View<const double> ln = View<const double>(r.logsumexp).slice(2, q0, lq);
    sdpa_forward_into<T>(qn, kn, vn, {rows(r.output), View<double>(r.logsumexp).slice(2, q0, lq), {}}, o);
    sdpa_backward_into<T>(qn, kn, vn, on, ln, rows(dout), {rows(r.dq), keys(r.dk), keys(r.dv), n > 0, sinks_grad}, o);
  }
  return r;
}

template <class T>
void expect_bitwise(const PackedRun<T>& a, const PackedRun<T>& b) {
  EXPECT_TRUE(bitwise_equal(a.output, b.output)) << "output " << max_diff(a.output, b.output);
  EXPECT_TRUE(bitwise_equal(a.logsumexp, b.logsumexp)) << "logsumexp";
  EXPECT_TRUE(bitwise_equal(a.dq, b.dq)) << "grad_query " << max_diff(a.dq, b.dq);
  EXPECT_TRUE(bitwise_equal(a.dk, b.dk)) << "grad_key " << max_diff(a.dk, b.dk);
  EXPECT_TRUE(bitwise_equal(a.dv, b.dv)) << "grad_value " << max_diff(a.dv, b.dv);
  // grad_sinks sums every row: the packed call in one double sum, the twin sequence by sequence
  // (rounded to T in between), so equal to T's rounding.
  constexpr double kSinksBound = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  if (a.dsinks) EXPECT_LE(max_diff(*a.dsinks, *b.dsinks), kSinksBound) << "grad_sinks";
}

std::vector<PackedCase> cases() {
  std::vector<PackedCase> all;
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> lengths = {
      {{5, 0, 9, 1, 7}, {5, 3, 9, 4, 12}},         // an empty sequence, a query with more keys
      {{97, 130, 64, 1}, {97, 130, 64, 300}},      // sequences across tiles, a decode-like one
      {{200, 33}, {150, 33}},                       // L > S in a sequence
  };
  int n = 0;
  for (const auto& [ql, kl] : lengths)
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      PackedCase c;
      c.q_lens = ql;
      c.k_lens = kl;
      c.scoring.causal = causal;
      if (n % 4 == 1) c.scoring.window_left = 20;
      if (n % 4 == 3) c.scoring.window_left = c.scoring.window_right = 3;
      if (n % 3 == 1) c.scoring.softcap = 2.0;
      c.sinks = n % 2 == 0;
      c.alibi = n % 3 == 2;
      if (n == 4) c.seqused_k = {kl[0] - 7, kl[1], kl[2] - 1, kl[3] - 100};
      all.push_back(c);
      ++n;
    }
  return all;
}

TEST(Packed, ReferenceEqualsEachSequenceOnItsOwnBitwise) {
  for (const PackedCase& c : cases()) {
    SCOPED_TRACE(c.describe());
    const PackedInputs in = make_packed(c, 11);
    expect_bitwise(run_packed<double>(c, in, Backend::reference, false), run_packed<double>(c, in, Backend::reference, true));
    expect_bitwise(run_packed<float>(c, in, Backend::reference, false), run_packed<float>(c, in, Backend::reference, true));
  }
}

// A packed case's inputs and the reference's packed run on them in float and double: what cpu_flash
// is held to. The reference runs no SIMD-dispatched code, so one serves every SIMD target.
struct PackedReference {
  PackedInputs in;
  PackedRun<float> r32;
  PackedRun<double> r64;
};

PackedReference packed_reference(const PackedCase& c, uint64_t seed) {
  PackedInputs in = make_packed(c, seed);
  PackedRun<float> r32 = run_packed<float>(c, in, Backend::reference, false);
  PackedRun<double> r64 = run_packed<double>(c, in, Backend::reference, false);
  return {std::move(in), std::move(r32), std::move(r64)};
}

// FlashAttention's rule for cpu_flash's packed run against the reference in float and double.
void expect_flash_rule(const PackedCase& c, const PackedReference& ref, FlashRule& rule) {
  const auto got = run_packed<float>(c, ref.in, Backend::cpu_flash, false);
  const PackedRun<float>& r32 = ref.r32;
  const PackedRun<double>& r64 = ref.r64;
  rule.expect(got.output, r32.output, r64.output, "output");
  rule.expect(got.logsumexp, r32.logsumexp, r64.logsumexp, "logsumexp");
  rule.expect(got.dq, r32.dq, r64.dq, "grad_query");
  rule.expect(got.dk, r32.dk, r64.dk, "grad_key");
  rule.expect(got.dv, r32.dv, r64.dv, "grad_value");
  if (c.sinks) rule.expect(*got.dsinks, *r32.dsinks, *r64.dsinks, "grad_sinks");
}

TEST(Packed, CpuFlashMatchesTheReferenceOnEveryTarget) {
  FlashRule rule{"cpu_flash"};
  for (PackedCase c : cases()) {
    SCOPED_TRACE(c.describe());
    expect_flash_rule(c, packed_reference(c, 12), rule);
    c.scoring.dropout_p = 0.2;  // dropout at the packed positions, the same on both backends
    c.scoring.dropout_seed = 5;
    expect_flash_rule(c, packed_reference(c, 13), rule);
  }
  PackedCase c = cases()[4];
  const PackedReference ref = packed_reference(c, 14);  // once, before the targets
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    expect_flash_rule(c, ref, rule);
  }
  std::cout << "[packed] cpu_flash: largest fraction of the allowed error " << rule.worst_fraction << "\n";
  const PackedInputs in = make_packed(c, 15);
  expect_bitwise_on_thread_counts([&] { return run_packed<float>(c, in, Backend::cpu_flash, false); });
}

// FlashAttention's varlen tensors are (total, H, D): the same memory viewed as (1, H, total, D).
TEST(Packed, ReadsFlashAttentionsLayoutInPlace) {
  PackedCase c = cases()[1];
  c.sinks = c.alibi = false;
  Options<float> opt;
  static_cast<Scoring&>(opt) = c.scoring;
  const PackedInputs in = make_packed(c, 16);
  const int64_t L = in.cu_q.back(), H = c.q_heads, D = c.qk_dim;
  // (total, H, D) copies of q, k, v.
  auto thd = [](const Tensor<float>& t) {
    const int64_t H = t.size(1), N = t.size(2), D = t.size(3);
    Tensor<float> out({N, H, D});
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t d = 0; d < D; ++d) out[(i * H + h) * D + d] = t[(h * N + i) * D + d];
    return out;
  };
  const Tensor<float> q = thd(in.q), k = thd(in.k), v = thd(in.v);
  auto as_bhld = [](const Tensor<float>& t) {
    return View<const float>(t.data(), {1, t.size(1), t.size(0), t.size(2)}, {0, t.size(2), t.size(1) * t.size(2), 1});
  };
  const Tensor<int64_t> cu_q({c.count() + 1}, std::span<const int64_t>(in.cu_q)),
      cu_k({c.count() + 1}, std::span<const int64_t>(in.cu_k));
  opt.cu_seqlens_q = cu_q;
  opt.cu_seqlens_k = cu_k;
  Tensor<float> out({1, H, L, D});
  Tensor<double> lse({1, H, L});
  sdpa_forward_into<float>(as_bhld(q), as_bhld(k), as_bhld(v), {out, lse, {}}, opt);
  const auto want = run_packed<float>(c, in, Backend::cpu_flash, false);
  EXPECT_TRUE(bitwise_equal(out, want.output));
}

TEST(Packed, BadOffsetsAreRefused) {
  const Tensor<float> q({1, 2, 6, 4}, 0.1f), k({1, 2, 8, 4}, 0.2f), v({1, 2, 8, 4}, 0.3f);
  auto with = [&](std::vector<int64_t> cq, std::vector<int64_t> ck, const std::string& message) {
    const Tensor<int64_t> a({static_cast<int64_t>(cq.size())}, std::span<const int64_t>(cq)),
        b({static_cast<int64_t>(ck.size())}, std::span<const int64_t>(ck));
    Options<float> opt;
    opt.cu_seqlens_q = a;
    opt.cu_seqlens_k = b;
    expect_error([&] { sdpa_forward(q, k, v, opt); }, message);
  };
  with({1, 6}, {0, 8}, "cu_seqlens_q: expected to start at 0, got 1");
  with({0, 4, 2, 6}, {0, 2, 4, 8}, "cu_seqlens_q: expected non-decreasing offsets, got 2 after 4 at index 2");
  with({0, 3, 5}, {0, 4, 8}, "cu_seqlens_q: expected to end at L = 6 (the packed total), got 5");
  with({0, 3, 6}, {0, 4, 9}, "cu_seqlens_k: expected to end at S = 8 (the packed total), got 9");
  with({0, 3, 6}, {0, 8}, "cu_seqlens_q, cu_seqlens_k: expected two 1-D tensors of N + 1 offsets");
  const Tensor<int64_t> cu({3}, {0, 3, 6});
  Options<float> opt;
  opt.cu_seqlens_q = cu;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "expected both (packed sequences) or neither, got cu_seqlens_q only");
  const Tensor<int64_t> cu_k({3}, {0, 4, 8});
  opt.cu_seqlens_k = cu_k;
  const Tensor<float> q2({2, 2, 6, 4}, 0.1f), k2({2, 2, 8, 4}, 0.2f);
  expect_error([&] { sdpa_forward(q2, k2, k2, opt); }, "query: expected batch size 1 with cu_seqlens");
  opt.backend = Backend::decode;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "options.backend: decode does not take packed sequences");
  opt.backend = Backend::automatic;
  const Tensor<int64_t> too_many({2}, {4, 5});
  opt.key_lengths = too_many;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "key_lengths: expected lengths in [0, 4], got 5 for sequence 1");
  opt.key_lengths = {};
  const Tensor<int64_t> before({2}, {0, -1});  // a negative start would reach the previous sequence's keys
  opt.key_starts = before;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "key_starts: expected starts in [0, 4], got -1 for sequence 1");
  opt.key_starts = {};
  opt.whole_call.query_len = 12;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "options.whole_call: expected the default with cu_seqlens");
  opt.whole_call = {};
  const Tensor<float> slopes({3, 2}, 0.5f);
  opt.alibi_slopes = slopes;
  expect_error([&] { sdpa_forward(q, k, v, opt); }, "alibi_slopes: expected shape (Hq) = [2] or (B, Hq) = [2, 2], got [3, 2]");
}

}  // namespace
}  // namespace mha::attention
