// The KV cache and the incremental forward: generating token by token (or a prompt, then token by
// token) gives what one causal forward over the whole sequence gives, under the FlashAttention
// rule (error against the double computation at most 2× the float full forward's, + 1e-6), for
// several lengths, batch sizes with sequences of different lengths, GQA, and float32, bfloat16
// and float16 storage; plus truncate/reset and every bad input.
#include "mha/nn/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/nn/multihead_attention.h"

namespace mha::nn {
namespace {

using mha::testing::expect_error;

Tensor<float> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<float> t(shape);
  for (auto& x : t.values()) x = static_cast<float>(gen.normal());
  return t;
}

template <class A, class B>
double max_diff(const A* a, const B* b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return worst;
}

// |ours − ref64| <= 2·|ref32 − ref64| + 1e-6 (max over the elements).
void expect_flash_rule(double ours, double ref32, const std::string& what) {
  EXPECT_LE(ours, 2 * ref32 + 1e-6) << what << ": incremental error " << ours << ", full float forward error " << ref32;
}

// Rows [t0, t0 + rows) of a (T, E) sequence.
Tensor<float> rows_of(const Tensor<float>& x, int64_t t0, int64_t rows) {
  const int64_t e = x.size(1);
  Tensor<float> out({rows, e});
  std::copy_n(x.data() + t0 * e, rows * e, out.data());
  return out;
}

// The full causal forward of one unbatched sequence (T, E) in the module's type.
template <class T>
Tensor<T> full_causal(MultiheadAttention<T>& m, const Tensor<T>& x) {
  const int64_t len = x.size(0);
  Tensor<bool> blocked({len, len});
  for (int64_t i = 0; i < len; ++i)
    for (int64_t j = i + 1; j < len; ++j) blocked[i * len + j] = true;
  MultiheadAttentionArgs<T> args;
  args.need_weights = false;
  args.attn_mask = blocked;
  args.is_causal = true;
  return m.forward(x, x, x, args).output;
}

// A float module and its double twin (same parameters).
struct Modules {
  MultiheadAttention<float> f;
  MultiheadAttention<double> d;
  explicit Modules(MultiheadAttentionOptions o) : f(o, 11), d(o, 0) {
    f.eval();
    d.eval();
    auto fp = f.parameters();
    auto dp = d.parameters();
    for (size_t i = 0; i < fp.size(); ++i) *dp[i].value = mha::cast<double>(*fp[i].value);
  }
};

// A batch of sequences of different lengths, generated with `prompt` tokens at once then one at a
// time (counts mark which sequences still have tokens), against each sequence's full forward.
// With a sliding window (window_left >= 0) or chunks (chunk > 0) on the module, both sides use
// them: the cache's calls and the full forward's.
template <class Kv>
void check_generation(const std::vector<int64_t>& lengths, int64_t prompt, bool batch_first, int64_t window_left = -1,
                      int64_t chunk = 0) {
  SCOPED_TRACE(std::string(storage_name<Kv>()) + " prompt " + std::to_string(prompt) + " batch " +
               std::to_string(lengths.size()) + (batch_first ? " batch_first" : "") + " window_left " +
               std::to_string(window_left) + " chunk " + std::to_string(chunk));
  MultiheadAttentionOptions o;
  o.embed_dim = 32;
  o.num_heads = 4;
  o.batch_first = batch_first;
  o.scoring.window_left = window_left;
  o.scoring.chunk_size = chunk;
  Modules m(o);
  const int64_t n = static_cast<int64_t>(lengths.size()), e = o.embed_dim;
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  Generator gen(21);
  std::vector<Tensor<float>> seqs;
  for (int64_t len : lengths) seqs.push_back(random_tensor({len, e}, gen));
  KVCache<Kv> cache(n, o.num_heads, longest, e / o.num_heads, e / o.num_heads);
  std::vector<Tensor<float>> got(lengths.size());
  for (size_t b = 0; b < lengths.size(); ++b) got[b] = Tensor<float>({lengths[b], e});

  for (int64_t t0 = 0; t0 < longest;) {
    const int64_t step = t0 == 0 ? prompt : 1;
    // (N, step, E) or (step, N, E); sequences past their end get padding rows (garbage, count 0).
    Tensor<float> x(batch_first ? Shape{n, step, e} : Shape{step, n, e});
    std::vector<int64_t> counts(lengths.size());
    for (int64_t b = 0; b < n; ++b) {
      counts[b] = std::clamp<int64_t>(lengths[b] - t0, 0, step);
      for (int64_t t = 0; t < step; ++t) {
        float* row = x.data() + (batch_first ? (b * step + t) : (t * n + b)) * e;
        for (int64_t c = 0; c < e; ++c) row[c] = t < counts[b] ? seqs[b][(t0 + t) * e + c] : 1e3f;
      }
    }
    const Tensor<float> y = m.f.forward_cached(x, cache, counts);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t t = 0; t < counts[b]; ++t)
        std::copy_n(y.data() + (batch_first ? (b * step + t) : (t * n + b)) * e, e, got[b].data() + (t0 + t) * e);
    t0 += step;
  }
  for (int64_t b = 0; b < n; ++b) {
    EXPECT_EQ(cache.lengths()[b], lengths[b]);
    // The reference sees what the cache stores: keys and values rounded to Kv. With a float cache
    // that is the float computation itself; with a half cache the comparison is against the same
    // attention on rounded keys and values, which the full forward does not do. So for half
    // caches the check is the bar of the issue instead: against the double forward, at most the
    // error of rounding k and v (measured below with the float computation on rounded values).
    const Tensor<double> ref64 = full_causal(m.d, mha::cast<double>(seqs[b]));
    const Tensor<float> ref32 = full_causal(m.f, seqs[b]);
    const double ours = max_diff(got[b].data(), ref64.data(), ref64.numel());
    const double full = max_diff(ref32.data(), ref64.data(), ref64.numel());
    if constexpr (std::is_same_v<Kv, float>) {
      expect_flash_rule(ours, full, "sequence " + std::to_string(b));
    } else {
      // Half storage: relative to the outputs' size, bfloat16's 8-bit mantissa (2⁻⁹ relative
      // rounding) and float16's 11-bit (2⁻¹²) bound what k and v lose; the outputs are averages
      // of values (|v| ~ 1) through out_proj, so a few times the unit roundoff.
      const double unit = std::is_same_v<Kv, bfloat16> ? 0x1p-8 : 0x1p-11;
      EXPECT_LE(ours, 4 * unit) << "sequence " << b << ": half cache error " << ours;
    }
  }
}

TEST(KVCache, TokenByTokenMatchesFullCausalForward) {
  check_generation<float>({1}, 1, true);
  check_generation<float>({9}, 1, true);
  check_generation<float>({300}, 1, false);
  check_generation<float>({7, 4, 9}, 1, true);
  check_generation<float>({7, 4, 9}, 5, false);  // a prompt of 5, then one at a time
  check_generation<float>({20, 20}, 20, true);   // all at once: T = 20 > 16 runs cpu_flash
}

// The module's sliding window reaches the cache's calls: each token sees its last W keys.
TEST(KVCache, TokenByTokenWithASlidingWindowMatchesTheFullForward) {
  check_generation<float>({300}, 1, false, 37);
  check_generation<float>({7, 4, 9}, 5, true, 3);
  check_generation<bfloat16>({40, 33}, 20, true, 0);
}

// The module's chunks (Llama 4's) reach the cache's calls: each token sees its own chunk's keys
// up to itself, the chunks counted from each sequence's first token.
TEST(KVCache, TokenByTokenWithChunksMatchesTheFullForward) {
  check_generation<float>({300}, 1, false, -1, 64);
  check_generation<float>({7, 4, 9}, 5, true, -1, 3);
  check_generation<bfloat16>({40, 33}, 20, true, 6, 8);
}

TEST(KVCache, HalfPrecisionStorage) {
  check_generation<bfloat16>({7, 4, 9}, 3, true);
  check_generation<float16>({7, 4, 9}, 3, true);
  check_generation<bfloat16>({200}, 1, false);
}

// GQA at the attention level: Hq = 8 query heads over 2 kv heads, token by token through attend,
// against sdpa_forward of the whole sequence with top-left causality.
TEST(KVCache, GroupedQueryAttentionTokenByToken) {
  const int64_t B = 2, Hq = 8, Hkv = 2, L = 37, D = 16;
  Generator gen(5);
  const Tensor<float> q = random_tensor({B, Hq, L, D}, gen), k = random_tensor({B, Hkv, L, D}, gen),
                      v = random_tensor({B, Hkv, L, D}, gen);
  attention::Options<float> opt32;
  opt32.causal = attention::Causal::top_left;
  opt32.backend = attention::Backend::reference;
  attention::Options<double> opt64;
  opt64.causal = attention::Causal::top_left;
  const auto ref32 = attention::sdpa_forward(q, k, v, opt32).output;
  const auto ref64 = attention::sdpa_forward(mha::cast<double>(q), mha::cast<double>(k), mha::cast<double>(v), opt64).output;
  KVCache<float> cache(B, Hkv, L, D, D);
  Tensor<float> got({B, Hq, L, D});
  auto token = [](const Tensor<float>& x, int64_t t) {  // (B, H, 1, D) view of token t
    const int64_t H = x.size(1), len = x.size(2), D = x.size(3);
    return View<const float>(x.data() + t * D, {x.size(0), H, 1, D}, {H * len * D, len * D, D, 1});
  };
  for (int64_t t = 0; t < L; ++t) {
    cache.append(token(k, t), token(v, t));
    const Tensor<float> out = attend(cache, token(q, t));
    for (int64_t bh = 0; bh < B * Hq; ++bh) std::copy_n(out.data() + bh * D, D, got.data() + (bh * L + t) * D);
  }
  expect_flash_rule(max_diff(got.data(), ref64.data(), got.numel()), max_diff(ref32.data(), ref64.data(), got.numel()),
                    "GQA");
}

// Sequences of uneven lengths and counts: the cache passes per-sequence lengths to the core
// (Options::query_lengths / key_lengths). Each attend is checked against sdpa_forward on the
// reference backend with the explicit (B, 1, T, S) mask of what the cache holds: query t of
// sequence b is real iff t < counts[b] and sees the slots 0..lengths[b] − counts[b] + t. The
// recompute reads the keys and values rounded to Kv, as the cache stores them; ours against it in
// double within FlashAttention's rule (2× the float recompute's error + 1e-6), padding queries
// exactly 0. A prompt of 12 (decode), then T new tokens: T = 1 and 3 run decode, T = 20 cpu_flash.
// Sequence 1 takes no new token, sequence 3 starts empty (a length below the others').
template <class Kv>
void check_uneven_step(int64_t T) {
  SCOPED_TRACE(std::string(storage_name<Kv>()) + " T " + std::to_string(T));
  const int64_t B = 4, Hq = 4, Hkv = 2, D = 16, capacity = 40;
  Generator gen(31 + static_cast<uint64_t>(T));
  KVCache<Kv> cache(B, Hkv, capacity, D, D);
  // What the cache holds, rounded to Kv, slot by slot: (B, Hkv, capacity, D).
  Tensor<float> held_k({B, Hkv, capacity, D}), held_v({B, Hkv, capacity, D});
  auto round_trip = [](const Tensor<float>& x) {
    Tensor<Kv> stored(x.shape());
    convert(x.data(), stored.data(), static_cast<size_t>(x.numel()));
    Tensor<float> back(x.shape());
    convert(stored.data(), back.data(), static_cast<size_t>(x.numel()));
    return back;
  };
  auto step = [&](int64_t n, const std::vector<int64_t>& counts) {
    SCOPED_TRACE("step of " + std::to_string(n) + " tokens");
    const Tensor<float> k = random_tensor({B, Hkv, n, D}, gen), v = random_tensor({B, Hkv, n, D}, gen),
                        q = random_tensor({B, Hq, n, D}, gen);
    const std::vector<int64_t> before = cache.lengths();
    cache.append(k, v, counts);
    const Tensor<float> rk = round_trip(k), rv = round_trip(v);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t t = 0; t < counts[b]; ++t) {
          const int64_t from = ((b * Hkv + h) * n + t) * D, to = ((b * Hkv + h) * capacity + before[b] + t) * D;
          std::copy_n(rk.data() + from, D, held_k.data() + to);
          std::copy_n(rv.data() + from, D, held_v.data() + to);
        }
    const Tensor<float> got = attend(cache, q);

    const int64_t S = cache.length();
    Tensor<float> keys({B, Hkv, S, D}), values({B, Hkv, S, D});
    for (int64_t bh = 0; bh < B * Hkv; ++bh) {
      std::copy_n(held_k.data() + bh * capacity * D, S * D, keys.data() + bh * S * D);
      std::copy_n(held_v.data() + bh * capacity * D, S * D, values.data() + bh * S * D);
    }
    Tensor<bool> mask({B, 1, n, S});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < S; ++j)
          mask[(b * n + t) * S + j] = t < counts[b] && j <= cache.lengths()[b] - counts[b] + t;
    attention::Options<float> opt32;
    opt32.attend_mask = mask;
    opt32.backend = attention::Backend::reference;
    attention::Options<double> opt64;
    opt64.attend_mask = mask;
    opt64.backend = attention::Backend::reference;
    const Tensor<float> ref32 = attention::sdpa_forward(q, keys, values, opt32).output;
    const Tensor<double> ref64 =
        attention::sdpa_forward(mha::cast<double>(q), mha::cast<double>(keys), mha::cast<double>(values), opt64).output;
    ASSERT_EQ(got.shape(), ref64.shape());
    expect_flash_rule(max_diff(got.data(), ref64.data(), got.numel()), max_diff(ref32.data(), ref64.data(), got.numel()),
                      "output");
    int64_t padding_not_zero = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t t = counts[b]; t < n; ++t)
          for (int64_t d = 0; d < D; ++d) padding_not_zero += got[((b * Hq + h) * n + t) * D + d] != 0.0f;
    EXPECT_EQ(padding_not_zero, 0);
  };
  step(12, {5, 3, 12, 0});
  step(T, {T, 0, T > 1 ? T - 1 : 1, T});
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{5 + T, 3, 12 + (T > 1 ? T - 1 : 1), T}));
}

TEST(KVCache, UnevenLengthsAndCountsMatchAnExplicitMask) {
  for (int64_t T : {1, 3, 20}) {
    check_uneven_step<float>(T);
    check_uneven_step<bfloat16>(T);
    check_uneven_step<float16>(T);
  }
}

// truncate rewinds: regenerating after it gives the same bits as the first time.
TEST(KVCache, TruncateAndResetRewind) {
  MultiheadAttentionOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  MultiheadAttention<float> m(o, 3);
  m.eval();
  Generator gen(8);
  const Tensor<float> x = random_tensor({6, 16}, gen);
  KVCache<bfloat16> cache(1, 2, 8, 8, 8);
  (void)m.forward_cached(rows_of(x, 0, 4), cache);
  const Tensor<float> first = m.forward_cached(rows_of(x, 4, 2), cache);
  EXPECT_EQ(cache.length(), 6);
  cache.truncate(4);
  EXPECT_EQ(cache.length(), 4);
  const Tensor<float> again = m.forward_cached(rows_of(x, 4, 2), cache);
  EXPECT_EQ(max_diff(first.data(), again.data(), first.numel()), 0.0);
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
  (void)m.forward_cached(rows_of(x, 0, 4), cache);
  EXPECT_EQ(max_diff(first.data(), m.forward_cached(rows_of(x, 4, 2), cache).data(), first.numel()), 0.0);
}

TEST(KVCache, RejectsBadInput) {
  expect_error([] { KVCache<float>(0, 1, 4, 8, 8); }, "batch: expected >= 1, got 0");
  expect_error([] { KVCache<float>(1, 1, 0, 8, 8); }, "capacity: expected >= 1, got 0");
  KVCache<float> cache(2, 2, 4, 8, 8);
  Tensor<float> k({2, 2, 3, 8}), v({2, 2, 3, 8});
  expect_error([&] { cache.append(Tensor<float>({2, 1, 3, 8}), v); }, "key: expected (B, Hkv, T, Dqk) = (2, 2, T, 8)");
  expect_error([&] { cache.append(k, Tensor<float>({2, 2, 2, 8})); }, "value: expected [2, 2, 3, 8]");
  const std::vector<int64_t> bad_count{1, 4}, one_count{1};
  expect_error([&] { cache.append(k, v, bad_count); }, "counts[1]: expected 0..3 (the new tokens), got 4");
  expect_error([&] { cache.append(k, v, one_count); }, "counts: expected 2 counts");
  cache.append(k, v);
  expect_error([&] { cache.append(k, v); }, "sequence 0 holds 3 tokens; 3 more would pass the capacity 4");
  EXPECT_EQ(cache.length(), 3);  // the failed append changed nothing
  expect_error([&] { cache.truncate(-1); }, "length: expected >= 0");
  expect_error([&] { (void)attend(cache, Tensor<float>({2, 4, 2, 8})); }, "expected T >= 3");

  MultiheadAttentionOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  o.add_bias_kv = true;
  MultiheadAttention<float> with_bias(o, 1);
  KVCache<float> c(1, 2, 4, 8, 8);
  expect_error([&] { (void)with_bias.forward_cached(Tensor<float>({1, 16}), c); }, "neither add_bias_kv");
  o.add_bias_kv = false;
  MultiheadAttention<float> m(o, 1);
  KVCache<float> wrong(1, 4, 4, 4, 4);
  expect_error([&] { (void)m.forward_cached(Tensor<float>({1, 16}), wrong); }, "cache: expected batch 1, 2 kv heads");
  expect_error([&] { (void)m.forward_cached(Tensor<float>({1, 15}), c); }, "x: expected last dimension embed_dim = 16");
}

}  // namespace
}  // namespace mha::nn
