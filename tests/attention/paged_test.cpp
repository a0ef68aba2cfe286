// paged_forward_into against the reference, under the FlashAttention rule (as decode_test): for
// each sequence, the reference in float and in double on that sequence's keys and values copied
// out of the pages (int8: scale·x, exactly in double, and the queries rounded to int8 as the call
// rounds them against int8 pages), and
//   max|paged − ref64| <= 2·max|ref32 − ref64| + 1e-6
// over the whole call's output and logsumexp. The pools hold the pages in shuffled order, with
// random numbers in every slot no sequence owns (a read past a sequence's tokens shows), in
// mha's layout and FlashAttention's; sequences mix decode rows and prefill chunks; every storage
// type, backend, page size (one that is not a multiple of the decode block included), the
// variants, every SIMD target, thread counts, and every bad input.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "../support/max_diff.h"
#include "mha/attention/attention.h"
#include "mha/core/half.h"
#include "mha/core/simd.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using mha::testing::max_diff;

struct PagedCase {
  int64_t Hq = 8, Hkv = 2, Dqk = 64, Dv = 64, P = 64;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (queries, tokens) per sequence
  Scoring scoring{.causal = Causal::bottom_right};
  bool alibi = false, sinks = false;
  bool flash_layout = false;  // pages stored (pages, P, Hkv, D)
  std::vector<int64_t> starts;  // key_starts (left padding), one per sequence, or none
};

// Tokens [from, S) of a (1, H, S, D) tensor.
Tensor<double> tokens_from(const Tensor<double>& t, int64_t from) {
  const int64_t H = t.size(1), S = t.size(2), D = t.size(3);
  Tensor<double> out({1, H, S - from, D});
  for (int64_t h = 0; h < H; ++h)
    std::copy_n(t.data() + (h * S + from) * D, (S - from) * D, out.data() + h * (S - from) * D);
  return out;
}

// A uniform number in [-1, 1) from the generator (the same on every machine).
float uniform(std::mt19937& g) { return static_cast<float>(g() >> 8) * 0x1p-23f - 1.0f; }

// A case's pool, table and queries, and each sequence's keys and values as float and double.
template <class Kv>
struct Built {
  int64_t pages = 0, blocks = 0;
  std::vector<Kv> key_store, value_store;
  std::vector<float> key_scale_store, value_scale_store;
  Tensor<int32_t> table;
  Tensor<float> query;
  Tensor<int64_t> cu, k_len, starts;
  Tensor<float> alibi, sinks;
  std::vector<Tensor<double>> keys, values;  // (1, Hkv, S, D) per sequence, the stored values

  // The pool as paged_forward_into reads it (mha's layout or FlashAttention's, as views).
  PagedKv<Kv> view(const PagedCase& c) const {
    auto pages_of = [&](const std::vector<Kv>& store, int64_t D) {
      if (!c.flash_layout) return View<const Kv>(store.data(), {pages, c.Hkv, c.P, D});
      return View<const Kv>(store.data(), {pages, c.Hkv, c.P, D}, {c.P * c.Hkv * D, D, c.Hkv * D, 1});
    };
    PagedKv<Kv> kv{pages_of(key_store, c.Dqk), pages_of(value_store, c.Dv), table, {}, {}};
    if constexpr (std::is_same_v<Kv, int8_t>) {
      kv.key_scales = View<const float>(key_scale_store.data(), {pages, c.Hkv, c.P});
      kv.value_scales = View<const float>(value_scale_store.data(), {pages, c.Hkv, c.P});
    }
    return kv;
  }
  Options<float> options(const PagedCase& c) const {
    Options<float> o;
    static_cast<Scoring&>(o) = c.scoring;
    o.cu_seqlens_q = cu;
    o.key_lengths = k_len;
    if (c.alibi) o.alibi_slopes = alibi;
    if (c.sinks) o.sinks = sinks;
    if (!c.starts.empty()) o.key_starts = starts;
    return o;
  }
};

template <class Kv>
Built<Kv> build(const PagedCase& c, uint32_t seed) {
  std::mt19937 g(seed);
  Built<Kv> b;
  const int64_t N = static_cast<int64_t>(c.seqs.size());
  int64_t T = 0;
  for (const auto& [q, k] : c.seqs) {
    T += q;
    b.blocks = std::max(b.blocks, (k + c.P - 1) / c.P);
  }
  b.blocks = std::max<int64_t>(b.blocks, 1) + 1;  // one spare column, never read
  for (const auto& [q, k] : c.seqs) b.pages += (k + c.P - 1) / c.P;
  b.pages += 3;  // pages no sequence owns
  auto fill = [&](std::vector<Kv>& store, int64_t D) {
    store.resize(static_cast<size_t>(b.pages * c.Hkv * c.P * D));
    for (Kv& x : store) {
      if constexpr (std::is_same_v<Kv, int8_t>) {
        x = static_cast<int8_t>(static_cast<int>(g() % 255) - 127);
      } else {
        x = narrow<Kv>(uniform(g));
      }
    }
  };
  fill(b.key_store, c.Dqk);
  fill(b.value_store, c.Dv);
  for (auto* s : {&b.key_scale_store, &b.value_scale_store}) {
    s->resize(static_cast<size_t>(b.pages * c.Hkv * c.P));
    for (float& x : *s) x = 0.02f * (uniform(g) + 1.5f);
  }
  // Pages in shuffled order.
  std::vector<int32_t> order(static_cast<size_t>(b.pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), g);
  b.table = Tensor<int32_t>({N, b.blocks});
  for (int64_t i = 0; i < b.table.numel(); ++i) b.table[i] = static_cast<int32_t>(g() % b.pages);  // never read
  b.cu = Tensor<int64_t>({N + 1});
  b.k_len = Tensor<int64_t>({N});
  size_t next = 0;
  const PagedKv<Kv> kv = b.view(c);
  for (int64_t s = 0; s < N; ++s) {
    const auto [q, k] = c.seqs[static_cast<size_t>(s)];
    b.cu[s + 1] = b.cu[s] + q;
    b.k_len[s] = k;
    for (int64_t j = 0; j < (k + c.P - 1) / c.P; ++j) b.table[s * b.blocks + j] = order[next++];
    auto gather = [&](const View<const Kv>& pages, const std::vector<float>& scales, int64_t D) {
      Tensor<double> t({1, c.Hkv, k, D});
      for (int64_t h = 0; h < c.Hkv; ++h)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t page = b.table[s * b.blocks + j / c.P], slot = j % c.P;
          const Kv* row = pages.data() + page * pages.stride(0) + h * pages.stride(1) + slot * pages.stride(2);
          const double scale = std::is_same_v<Kv, int8_t> ? scales[static_cast<size_t>((page * c.Hkv + h) * c.P + slot)] : 1.0;
          for (int64_t e = 0; e < D; ++e) {
            double x;
            if constexpr (std::is_same_v<Kv, int8_t>) {
              x = static_cast<double>(row[e]);
            } else {
              x = static_cast<double>(widen(row[e]));
            }
            t[((h * k) + j) * D + e] = scale * x;
          }
        }
      return t;
    };
    b.keys.push_back(gather(kv.key_pages, b.key_scale_store, c.Dqk));
    b.values.push_back(gather(kv.value_pages, b.value_scale_store, c.Dv));
  }
  b.query = Tensor<float>({1, c.Hq, T, c.Dqk});
  for (int64_t i = 0; i < b.query.numel(); ++i) b.query[i] = uniform(g);
  b.alibi = Tensor<float>({N, c.Hq});
  for (int64_t i = 0; i < b.alibi.numel(); ++i) b.alibi[i] = 0.05f * (uniform(g) + 1.0f);
  b.sinks = Tensor<float>({c.Hq});
  for (int64_t i = 0; i < b.sinks.numel(); ++i) b.sinks[i] = 2.0f * uniform(g);
  if (!c.starts.empty()) b.starts = Tensor<int64_t>({N}, c.starts);
  return b;
}

// The reference over each sequence on its copied keys and values, in F, assembled as the call's
// (1, Hq, T, Dv) output and (1, Hq, T) logsumexp.
template <class F, class Kv>
std::pair<Tensor<F>, Tensor<double>> reference(const PagedCase& c, const Built<Kv>& b) {
  const int64_t T = b.query.size(2);
  Tensor<F> out({1, c.Hq, T, c.Dv});
  Tensor<double> lse({1, c.Hq, T});
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const auto [q, k] = c.seqs[s];
    const int64_t q0 = b.cu[static_cast<int64_t>(s)];
    Tensor<F> query({1, c.Hq, q, c.Dqk});
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < q; ++i) {
        const float* row = b.query.data() + (h * T + q0 + i) * c.Dqk;
        // Against int8 pages each query row is rounded as the keys are (attention.h): scale =
        // max|q|/127 in float, q8 = round(q/scale) in double, and the row is scale·q8 (exact in double).
        float amax = 0;
        for (int64_t e = 0; e < c.Dqk; ++e) amax = std::max(amax, std::abs(row[e]));
        const float scale = amax / 127.0f;
        for (int64_t e = 0; e < c.Dqk; ++e)
          query[(h * q + i) * c.Dqk + e] =
              std::is_same_v<Kv, int8_t>
                  ? static_cast<F>(static_cast<F>(scale) * static_cast<F>(std::nearbyint(static_cast<double>(row[e]) / scale)))
                  : static_cast<F>(row[e]);
      }
    Options<F> o;
    static_cast<Scoring&>(o) = c.scoring;
    o.backend = Backend::reference;
    Tensor<F> slopes({c.Hq}), sinks({c.Hq});
    for (int64_t h = 0; h < c.Hq; ++h) {
      slopes[h] = static_cast<F>(b.alibi[static_cast<int64_t>(s) * c.Hq + h]);
      sinks[h] = static_cast<F>(b.sinks[h]);
    }
    if (c.alibi) o.alibi_slopes = slopes;
    if (c.sinks) o.sinks = sinks;
    // Left padding: the sequence is its tokens from its start on.
    const int64_t from = c.starts.empty() ? 0 : c.starts[s];
    const ForwardResult<F> r =
        sdpa_forward(query, mha::cast<F>(tokens_from(b.keys[s], from)), mha::cast<F>(tokens_from(b.values[s], from)), o);
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < q; ++i) {
        std::copy_n(r.output.data() + (h * q + i) * c.Dv, c.Dv, out.data() + (h * T + q0 + i) * c.Dv);
        lse[h * T + q0 + i] = r.logsumexp[h * q + i];
      }
  }
  return {out, lse};
}

template <class Kv>
std::pair<Tensor<float>, Tensor<double>> run_paged(const PagedCase& c, const Built<Kv>& b, Backend backend) {
  const int64_t T = b.query.size(2);
  Tensor<float> out({1, c.Hq, T, c.Dv});
  Tensor<double> lse({1, c.Hq, T});
  Options<float> o = b.options(c);
  o.backend = backend;
  paged_forward_into(b.query, b.view(c), {out, lse, {}}, o);
  return {out, lse};
}

const char* name_of(Backend b) {
  return b == Backend::automatic ? "automatic" : b == Backend::decode ? "decode" : b == Backend::cpu_flash ? "cpu_flash" : "reference";
}

// The case under every backend, held to the FlashAttention rule.
template <class Kv>
void check_paged(const PagedCase& c, uint32_t seed, std::vector<Backend> backends = {Backend::automatic,
                                                                                     Backend::decode,
                                                                                     Backend::cpu_flash}) {
  const Built<Kv> b = build<Kv>(c, seed);
  const auto [ref32, lse32] = reference<float>(c, b);
  const auto [ref64, lse64] = reference<double>(c, b);
  for (Backend backend : backends) {
    SCOPED_TRACE(std::string("backend ") + name_of(backend) + ", seed " + std::to_string(seed));
    const auto [out, lse] = run_paged(c, b, backend);
    const double allowed = 2 * max_diff(ref32, ref64) + 1e-6;
    EXPECT_LE(max_diff(out, ref64), allowed) << "output";
    const double lse_allowed = 2 * max_diff(lse32, lse64) + 1e-6;
    EXPECT_LE(max_diff(lse, lse64), lse_allowed) << "logsumexp";
  }
}

// Decode rows (1..16 queries) and prefill chunks (17, 40) of sequences of many lengths, with a
// sequence of no queries, in one call.
const std::vector<std::pair<int64_t, int64_t>> kMixed = {{1, 1},    {1, 300},  {3, 700}, {16, 1025},
                                                         {17, 600}, {0, 50},   {40, 2100}, {1, 4099}};

template <class Kv>
void sweep(uint32_t seed) {
  for (int64_t P : {16, 100, 256}) {
    PagedCase c;
    c.P = P;
    c.seqs = kMixed;
    SCOPED_TRACE("page size " + std::to_string(P));
    check_paged<Kv>(c, seed + static_cast<uint32_t>(P));
  }
  PagedCase c;  // ragged head sizes, FlashAttention's layout, no causality, MQA
  c.Hq = 3;
  c.Hkv = 1;
  c.Dqk = 24;
  c.Dv = 59;
  c.P = 32;
  c.flash_layout = true;
  c.scoring.causal = Causal::none;
  c.seqs = {{2, 90}, {20, 40}, {1, 513}};
  check_paged<Kv>(c, seed + 1);
}

TEST(Paged, FloatPagesMatchReference) { sweep<float>(100); }
TEST(Paged, Bfloat16PagesMatchReference) { sweep<bfloat16>(200); }
TEST(Paged, Float16PagesMatchReference) { sweep<float16>(300); }
TEST(Paged, Int8PagesMatchReference) { sweep<int8_t>(400); }

// The variants a paged call takes: a sliding window, soft-capping, chunks, ALiBi (a row per
// sequence) and sinks, each on float and int8 pages.
TEST(Paged, VariantsMatchReference) {
  PagedCase c;
  c.seqs = kMixed;
  c.P = 64;
  c.scoring.window_left = 100;
  c.scoring.window_right = 0;
  check_paged<float>(c, 501);
  check_paged<int8_t>(c, 502);
  c.scoring = Scoring{.causal = Causal::bottom_right, .softcap = 5.0};
  c.alibi = true;
  check_paged<bfloat16>(c, 503);
  check_paged<int8_t>(c, 504);
  c.scoring = Scoring{.causal = Causal::bottom_right, .chunk_size = 128};
  c.alibi = false;
  c.sinks = true;
  check_paged<float>(c, 505);
  check_paged<int8_t>(c, 506);
  // Left padding (key_starts: transformers' generate() pads a batch on the left), with chunks and
  // ALiBi counted from each sequence's first real token.
  c.starts = {1, 299, 699, 9, 590, 50, 2080, 4000};  // some past the first query: padded queries see nothing
  c.alibi = true;
  check_paged<bfloat16>(c, 507);
  check_paged<int8_t>(c, 508);
}

// With pages of whole decode blocks (256 keys) the decode rows are the same bits as decode on the
// same keys laid out contiguously (the same tasks, blocks and sums): paging costs no accuracy.
TEST(Paged, WholeBlockPagesGiveTheContiguousBits) {
  PagedCase c;
  c.P = 256;
  c.seqs = {{1, 300}, {4, 2000}, {1, 4099}, {2, 256}};
  const Built<bfloat16> b = build<bfloat16>(c, 601);
  const auto [out, lse] = run_paged(c, b, Backend::automatic);
  const int64_t N = 4, L = 4, S = 4099, T = b.query.size(2);
  Tensor<float> q({N, c.Hq, L, c.Dqk});
  Tensor<bfloat16> k({N, c.Hkv, S, c.Dqk}), v({N, c.Hkv, S, c.Dv});
  Tensor<int64_t> q_len({N}), k_len({N});
  for (int64_t s = 0; s < N; ++s) {
    const auto [ql, kl] = c.seqs[static_cast<size_t>(s)];
    q_len[s] = ql;
    k_len[s] = kl;
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < ql; ++i)
        std::copy_n(b.query.data() + (h * T + b.cu[s] + i) * c.Dqk, c.Dqk, q.data() + ((s * c.Hq + h) * L + i) * c.Dqk);
    for (int64_t h = 0; h < c.Hkv; ++h)
      for (int64_t j = 0; j < kl; ++j)
        for (int64_t e = 0; e < c.Dqk; ++e) {
          k[((s * c.Hkv + h) * S + j) * c.Dqk + e] = narrow<bfloat16>(static_cast<float>(b.keys[static_cast<size_t>(s)][(h * kl + j) * c.Dqk + e]));
          v[((s * c.Hkv + h) * S + j) * c.Dv + e] = narrow<bfloat16>(static_cast<float>(b.values[static_cast<size_t>(s)][(h * kl + j) * c.Dv + e]));
        }
  }
  Options<float> o;
  o.causal = Causal::bottom_right;
  o.query_lengths = q_len;
  o.key_lengths = k_len;
  o.backend = Backend::decode;
  Tensor<float> dense({N, c.Hq, L, c.Dv});
  Tensor<double> dense_lse({N, c.Hq, L});
  sdpa_forward_into(q, k, v, {dense, dense_lse, {}}, o);
  int compared = 0;
  for (int64_t s = 0; s < N; ++s)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < q_len[s]; ++i) {
        const float* a = out.data() + (h * T + b.cu[s] + i) * c.Dv;
        const float* d = dense.data() + ((s * c.Hq + h) * L + i) * c.Dv;
        ASSERT_TRUE(std::equal(a, a + c.Dv, d)) << "sequence " << s << " head " << h << " query " << i;
        ASSERT_EQ(lse[h * T + b.cu[s] + i], dense_lse[(s * c.Hq + h) * L + i]);
        ++compared;
      }
  EXPECT_EQ(compared, 8 * 8);
}

// The same bits for 1, 2 and 3 threads, and on every SIMD target compiled in and supported here
// (int8 widening and the page cuts run per target).
TEST(Paged, ThreadsAndTargets) {
  PagedCase c;
  c.P = 100;
  c.seqs = kMixed;
  const Built<int8_t> b = build<int8_t>(c, 701);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto [one, one_lse] = run_paged(c, b, Backend::automatic);
  for (int n : {2, 3}) {
    omp_set_num_threads(n);
    const auto [out, lse] = run_paged(c, b, Backend::automatic);
    EXPECT_EQ(max_diff(out, one), 0.0) << n << " threads";
    EXPECT_EQ(max_diff(lse, one_lse), 0.0) << n << " threads";
  }
  omp_set_num_threads(threads);
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    check_paged<int8_t>(c, 702, {Backend::automatic});
    check_paged<bfloat16>(c, 703, {Backend::decode});
  }
}

TEST(Paged, RejectsBadInput) {
  PagedCase c;
  c.P = 16;
  c.seqs = {{1, 20}, {2, 40}};
  Built<float> b = build<float>(c, 801);
  Built<int8_t> b8 = build<int8_t>(c, 802);
  Tensor<float> out({1, c.Hq, 3, c.Dv});
  Tensor<double> lse({1, c.Hq, 3});
  auto call = [&](const PagedKv<float>& kv, const Options<float>& o) { paged_forward_into(b.query, kv, {out, lse, {}}, o); };
  const PagedKv<float> kv = b.view(c);
  const Options<float> good = b.options(c);
  call(kv, good);  // the good call runs

  Tensor<int32_t> table = b.table;
  table[0] = static_cast<int32_t>(b.pages);
  PagedKv<float> bad = kv;
  bad.block_table = table;
  expect_error([&] { call(bad, good); }, "block_table[0, 0]: expected a page 0 to");
  table = b.table;
  table[b.blocks + 1] = -1;
  bad.block_table = table;
  expect_error([&] { call(bad, good); }, "block_table[1, 1]: expected a page 0 to");
  Tensor<int64_t> lengths({2}, std::vector<int64_t>{20, b.blocks * c.P + 1});
  Options<float> o = good;
  o.key_lengths = lengths;
  expect_error([&] { call(kv, o); }, "options.key_lengths[1]: expected 2 to");
  lengths[1] = 1;  // fewer tokens than queries
  expect_error([&] { call(kv, o); }, "options.key_lengths[1]: expected 2 to");
  Tensor<int64_t> cu({3}, std::vector<int64_t>{0, 2, 1});
  o = good;
  o.cu_seqlens_q = cu;
  expect_error([&] { call(kv, o); }, "options.cu_seqlens_q: expected to start at 0 and end at T = 3");
  cu[2] = 3;
  cu[1] = 4;
  expect_error([&] { call(kv, o); }, "options.cu_seqlens_q: expected non-decreasing");
  o = good;
  o.cu_seqlens_q = View<const int64_t>();
  expect_error([&] { call(kv, o); }, "options.cu_seqlens_q: expected (3)");
  o = good;
  o.key_lengths = View<const int64_t>();
  expect_error([&] { call(kv, o); }, "options.key_lengths: expected (2)");
  o = good;
  Tensor<bool> mask({1, 1, 3, 40});
  o.attend_mask = mask;
  expect_error([&] { call(kv, o); }, "options.attend_mask: expected none in a paged call");
  o = good;
  o.cu_seqlens_k = b.cu;
  expect_error([&] { call(kv, o); }, "options.cu_seqlens_k: expected none in a paged call");
  o = good;
  Tensor<int64_t> starts({2}, std::vector<int64_t>{0, 41});
  o.key_starts = starts;
  expect_error([&] { call(kv, o); }, "options.key_starts[1]: expected 0 to 40");
  o = good;
  o.dropout_p = 0.1;
  expect_error([&] { call(kv, o); }, "options.dropout_p: expected 0");
  o = good;
  o.causal = Causal::top_left;
  expect_error([&] { call(kv, o); }, "options.causal: expected none or bottom_right");
  o = good;
  o.need_weights = true;
  expect_error([&] { call(kv, o); }, "options.need_weights: expected false");
  o = good;
  o.scale = std::nan("");
  expect_error([&] { call(kv, o); }, "scale");
  // Shapes.
  bad = kv;
  bad.value_pages = View<const float>(b.value_store.data(), {b.pages - 1, c.Hkv, c.P, c.Dv});
  expect_error([&] { call(bad, good); }, "value_pages: expected (");
  bad = kv;
  bad.key_pages = View<const float>(b.key_store.data(), {b.pages, c.Hkv, c.P, c.Dqk / 2});
  expect_error([&] { call(bad, good); }, "query: expected Dqk = 32");
  bad = kv;
  bad.key_pages = View<const float>(b.key_store.data(), {b.pages, 3, c.P, c.Dqk / 3 * 2});
  bad.value_pages = View<const float>(b.value_store.data(), {b.pages, 3, c.P, c.Dv / 3 * 2});
  expect_error([&] { call(bad, good); }, "query: expected Dqk = 42");
  bad = kv;
  bad.key_pages = View<const float>(b.key_store.data(), {b.pages, c.Hkv, c.P, c.Dqk}, {c.Hkv * c.P * c.Dqk, c.P * c.Dqk, 1, c.P});
  expect_error([&] { call(bad, good); }, "key_pages: expected a contiguous last dimension");
  bad = kv;
  bad.key_scales = View<const float>(b8.key_scale_store.data(), {b.pages, c.Hkv, c.P});
  expect_error([&] { call(bad, good); }, "key_scales: expected none (only int8 pages have scales)");
  PagedKv<int8_t> kv8 = b8.view(c);
  kv8.value_scales = View<const float>();
  expect_error([&] { paged_forward_into(b8.query, kv8, {out, lse, {}}, b8.options(c)); },
               "value_scales: expected (pages, Hkv, P)");
  Tensor<float> small({1, c.Hq, 2, c.Dv});
  expect_error([&] { paged_forward_into(b.query, kv, {small, lse, {}}, good); }, "output");
  Tensor<float> q2({2, c.Hq, 3, c.Dqk});
  expect_error([&] { paged_forward_into(q2, kv, {out, lse, {}}, good); }, "query: expected (1, Hq, T, Dqk)");
  Tensor<float> q3({1, 3, 3, c.Dqk}), out3({1, 3, 3, c.Dv});
  Tensor<double> lse3({1, 3, 3});
  expect_error([&] { paged_forward_into(q3, kv, {out3, lse3, {}}, good); }, "a multiple of the 2 kv heads");
}

}  // namespace
}  // namespace mha::attention
