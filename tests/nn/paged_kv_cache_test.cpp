// PagedKVCache: against the contiguous KVCache (same tokens, same queries: the same bits with
// pages of whole decode blocks), forks that share pages and copy the last one on write, release
// and reuse, all-or-nothing growth, int8 within its derived bounds (each number within scale/2;
// attention's output within the bound docs/generation.md derives), memory the system gives only
// to written pages, and every bad input.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <random>
#include <vector>

#include "../support/assertions.h"
#include "../support/max_diff.h"
#include "mha/nn/kv_cache.h"
#include "mha/nn/paged_kv_cache.h"

namespace mha::nn {
namespace {

using mha::testing::expect_error;
using mha::testing::max_diff;

float uniform(std::mt19937& g) { return static_cast<float>(g() >> 8) * 0x1p-23f - 1.0f; }

Tensor<float> random(Shape shape, std::mt19937& g, float scale = 1.0f) {
  Tensor<float> t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = scale * uniform(g);
  return t;
}

// Tokens [t0, t0 + n) of sequence b of a (B, H, T, D) tensor, as (1, H, n, D).
Tensor<float> tokens(const Tensor<float>& x, int64_t b, int64_t t0, int64_t n) {
  const int64_t H = x.size(1), T = x.size(2), D = x.size(3);
  Tensor<float> out({1, H, n, D});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(x.data() + ((b * H + h) * T + t0 + t) * D, D, out.data() + (h * n + t) * D);
  return out;
}

// The tokens of several sequences packed along dimension 2 (cu_seqlens order).
Tensor<float> pack(const std::vector<Tensor<float>>& parts) {
  int64_t T = 0;
  for (const auto& p : parts) T += p.size(2);
  const int64_t H = parts[0].size(1), D = parts[0].size(3);
  Tensor<float> out({1, H, T, D});
  int64_t t0 = 0;
  for (const auto& p : parts) {
    for (int64_t h = 0; h < H; ++h)
      std::copy_n(p.data() + h * p.size(2) * D, p.size(2) * D, out.data() + (h * T + t0) * D);
    t0 += p.size(2);
  }
  return out;
}

// A prompt of 300 tokens for two sequences, then decode steps of one token each: the paged cache's
// attention is the contiguous cache's, bit for bit with pages of 256 (the decode blocks), for
// every storage; and within float rounding with pages of 48.
template <class Kv>
void matches_contiguous(int64_t P, bool bitwise) {
  std::mt19937 g(11);
  const int64_t Hq = 8, Hkv = 2, D = 64, prompt = 300, steps = 5;
  KVCache<Kv> dense(2, Hkv, prompt + steps, D, D);
  PagedKVCache<Kv> paged(3, 40, P, Hkv, D, D);  // layer 1 of 3
  const int64_t a = paged.add(), b = paged.add();
  const std::vector<int64_t> seqs{a, b};
  for (int64_t step = 0; step <= steps; ++step) {
    const int64_t n = step == 0 ? prompt : 1;
    const Tensor<float> k = random({2, Hkv, n, D}, g), v = random({2, Hkv, n, D}, g), q = random({2, Hq, n, D}, g);
    dense.append(k, v);
    const Tensor<float> want = attend(dense, q);
    paged.extend(seqs, std::vector<int64_t>{n, n});
    const std::vector<int64_t> cu{0, n, 2 * n};
    paged.write(1, seqs, pack({tokens(k, 0, 0, n), tokens(k, 1, 0, n)}), pack({tokens(v, 0, 0, n), tokens(v, 1, 0, n)}),
                cu);
    const Tensor<float> got = attend(paged, 1, seqs, pack({tokens(q, 0, 0, n), tokens(q, 1, 0, n)}), cu);
    const Tensor<float> want_packed = pack({tokens(want, 0, 0, n), tokens(want, 1, 0, n)});
    if (bitwise) {
      EXPECT_EQ(max_diff(got, want_packed), 0.0) << "step " << step;
    } else {
      EXPECT_LE(max_diff(got, want_packed), 2e-6) << "step " << step;
    }
  }
  EXPECT_EQ(paged.length(a), prompt + steps);
  EXPECT_EQ(paged.pages_in_use(), 2 * ((prompt + steps + P - 1) / P));
}

TEST(PagedKVCache, MatchesTheContiguousCache) {
  matches_contiguous<float>(256, true);
  matches_contiguous<bfloat16>(256, true);
  matches_contiguous<float16>(256, true);
  matches_contiguous<float>(48, false);
  matches_contiguous<bfloat16>(48, false);
}

// A fork shares its parent's pages; the partly filled last page is copied by the first of the two
// to grow into it, so each sees its own new tokens and the shared prefix once.
TEST(PagedKVCache, ForkSharesPagesAndCopiesTheLastOnWrite) {
  std::mt19937 g(12);
  const int64_t Hkv = 1, D = 8, P = 16;
  PagedKVCache<float> cache(1, 10, P, Hkv, D, D);
  const int64_t parent = cache.add();
  const std::vector<int64_t> one{parent};
  const Tensor<float> prompt = random({1, Hkv, 20, D}, g);
  cache.extend(one, std::vector<int64_t>{20});
  cache.write(0, one, prompt, prompt, std::vector<int64_t>{0, 20});
  EXPECT_EQ(cache.pages_in_use(), 2);
  const int64_t child = cache.fork(parent);
  EXPECT_EQ(cache.length(child), 20);
  EXPECT_EQ(cache.pages_in_use(), 2);  // shared
  // A write into the shared page is refused; growth copies it.
  expect_error([&] { cache.write(0, std::vector<int64_t>{child}, tokens(prompt, 0, 19, 1), tokens(prompt, 0, 19, 1),
                                 std::vector<int64_t>{0, 1}); },
               "lies in a page another sequence shares");
  const Tensor<float> x = random({1, Hkv, 1, D}, g), y = random({1, Hkv, 1, D}, g);
  cache.extend(std::vector<int64_t>{child}, std::vector<int64_t>{1});
  EXPECT_EQ(cache.pages_in_use(), 3);  // the child's copy of page 1
  cache.write(0, std::vector<int64_t>{child}, x, x, std::vector<int64_t>{0, 1});
  cache.extend(one, std::vector<int64_t>{1});
  EXPECT_EQ(cache.pages_in_use(), 3);  // the parent now alone holds its page 1
  cache.write(0, one, y, y, std::vector<int64_t>{0, 1});
  // Each attends to the shared 20 and its own 21st token: a query that matches only the 21st token's
  // key strongly picks its value out.
  const Tensor<int32_t> table = cache.block_table(std::vector<int64_t>{parent, child});
  const auto pages = cache.pages(0, table);
  ASSERT_EQ(table[0], table[2]);  // page 0 shared
  ASSERT_NE(table[1], table[3]);
  auto token = [&](int64_t row, int64_t j) { return pages.value_pages.data() + (table[row * 2 + j / P] * P + j % P) * D; };
  for (int64_t e = 0; e < D; ++e) {
    EXPECT_EQ(token(0, 20)[e], y[e]);
    EXPECT_EQ(token(1, 20)[e], x[e]);
    for (int64_t j = 0; j < 20; ++j) {
      EXPECT_EQ(token(0, j)[e], prompt[j * D + e]);
      EXPECT_EQ(token(1, j)[e], prompt[j * D + e]);
    }
  }
  // Attention of each sequence's newest token: a contiguous cache holding its tokens' (up to
  // rounding: pages of 16 cut the sums where the contiguous cache's blocks of 256 do not).
  for (const auto& [seq, last] : {std::pair{parent, &y}, std::pair{child, &x}}) {
    KVCache<float> dense(1, Hkv, 21, D, D);
    dense.append(prompt, prompt);
    dense.append(*last, *last);
    const Tensor<float> q = random({1, 2, 1, D}, g);
    EXPECT_LE(max_diff(attend(cache, 0, std::vector<int64_t>{seq}, q, std::vector<int64_t>{0, 1}), attend(dense, q)),
              1e-6);
  }
  // Release: the parent's own page goes back; the shared one stays with the child.
  cache.release(parent);
  EXPECT_EQ(cache.pages_in_use(), 2);
  expect_error([&] { cache.length(parent); }, "expected the id of a live sequence");
  EXPECT_EQ(cache.add(), parent);  // the id is used again
  cache.release(child);
  EXPECT_EQ(cache.pages_in_use(), 0);
}

// extend is all or nothing; pages run out with a clear message.
TEST(PagedKVCache, GrowthIsAllOrNothing) {
  PagedKVCache<bfloat16> cache(2, 4, 8, 2, 4, 4);
  const int64_t a = cache.add(), b = cache.add();
  cache.extend(std::vector<int64_t>{a}, std::vector<int64_t>{20});  // 3 pages
  expect_error([&] { cache.extend(std::vector<int64_t>{a, b}, std::vector<int64_t>{4, 9}); },
               "expected at most 1 free pages to be needed (3 of 4 in use), got 2");
  EXPECT_EQ(cache.length(a), 20);
  EXPECT_EQ(cache.length(b), 0);
  EXPECT_EQ(cache.free_pages(), 1);
  cache.extend(std::vector<int64_t>{a, b}, std::vector<int64_t>{4, 8});
  EXPECT_EQ(cache.free_pages(), 0);
}

// int8: every stored number within scale/2 of what was written (scale = max|x|/127 of its row), and
// attention's output within the bound derived from that (docs/generation.md): the query row is
// rounded the same way (scale s_q), so a score's error is at most
//   ε = scale · max_j ( Σ_e |q_e|·s_j/2 + s_q/2·Σ_e |k̂_je| )      (|qk − q̂k̂| <= |q||k − k̂| + |q − q̂||k̂|),
// and with Δ_v the largest value error,
//   |out − out_exact| <= (e^{2ε} − 1)·max|v| + Δ_v        per element,
// out_exact being the float cache's attention on the unrounded numbers; held, and printed beside
// bfloat16's error on the same numbers.
TEST(PagedKVCache, Int8WithinItsDerivedBounds) {
  std::mt19937 g(13);
  const int64_t Hq = 8, Hkv = 2, D = 128, S = 3000, P = 256;
  PagedKVCache<int8_t> q8(1, 16, P, Hkv, D, D);
  PagedKVCache<bfloat16> bf(1, 16, P, Hkv, D, D);
  PagedKVCache<float> f32(1, 16, P, Hkv, D, D);
  const Tensor<float> k = random({1, Hkv, S, D}, g, 2.0f), v = random({1, Hkv, S, D}, g);
  const std::vector<int64_t> cu{0, S};
  auto fill = [&](auto& cache) {
    const int64_t s = cache.add();
    cache.extend(std::vector<int64_t>{s}, std::vector<int64_t>{S});
    cache.write(0, std::vector<int64_t>{s}, k, v, cu);
    return s;
  };
  const int64_t s8 = fill(q8), sb = fill(bf), sf = fill(f32);
  // Each number within scale/2.
  const Tensor<int32_t> table = q8.block_table(std::vector<int64_t>{s8});
  const auto pages = q8.pages(0, table);
  double worst_key_ratio = 0, largest_v_error = 0;
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t j = 0; j < S; ++j) {
      const int64_t page = table[j / P], slot = j % P, row = (page * Hkv + h) * P + slot;
      const float ks = pages.key_scales.data()[row], vs = pages.value_scales.data()[row];
      float kmax = 0;
      for (int64_t e = 0; e < D; ++e) kmax = std::max(kmax, std::abs(k[(h * S + j) * D + e]));
      ASSERT_EQ(ks, kmax / 127.0f);
      for (int64_t e = 0; e < D; ++e) {
        const double ke = std::abs(ks * static_cast<double>(pages.key_pages.data()[row * D + e]) - k[(h * S + j) * D + e]);
        const double ve = std::abs(vs * static_cast<double>(pages.value_pages.data()[row * D + e]) - v[(h * S + j) * D + e]);
        ASSERT_LE(ke, ks / 2 * (1 + 1e-6));
        ASSERT_LE(ve, vs / 2 * (1 + 1e-6));
        worst_key_ratio = std::max(worst_key_ratio, ke / ks);
        largest_v_error = std::max(largest_v_error, ve);
      }
    }
  EXPECT_GT(worst_key_ratio, 0.45);  // the bound is nearly reached: the rounding is real
  // Attention of one decode row per head (the sequence's last token) over all S tokens.
  const Tensor<float> q = random({1, Hq, 1, D}, g);
  const std::vector<int64_t> qcu{0, 1};
  const Tensor<float> exact = attend(f32, 0, std::vector<int64_t>{sf}, q, qcu);
  const Tensor<float> got8 = attend(q8, 0, std::vector<int64_t>{s8}, q, qcu);
  const Tensor<float> gotb = attend(bf, 0, std::vector<int64_t>{sb}, q, qcu);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kv = h / (Hq / Hkv);
    double eps = 0, vmax = 0, qsum = 0;
    float qmax = 0;
    for (int64_t e = 0; e < D; ++e) {
      qsum += std::abs(q[h * D + e]);
      qmax = std::max(qmax, std::abs(q[h * D + e]));
    }
    const double q_scale = qmax / 127.0f;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t row = (table[j / P] * Hkv + kv) * P + j % P;
      const double ks = pages.key_scales.data()[row];
      double ksum = 0;
      for (int64_t e = 0; e < D; ++e) ksum += std::abs(ks * pages.key_pages.data()[row * D + e]);
      eps = std::max(eps, scale * (qsum * ks / 2 + q_scale / 2 * ksum));
      for (int64_t e = 0; e < D; ++e) vmax = std::max(vmax, std::abs(static_cast<double>(v[(kv * S + j) * D + e])));
    }
    const double bound = std::expm1(2 * eps) * vmax + largest_v_error + 1e-6;
    double err8 = 0, errb = 0;
    for (int64_t e = 0; e < D; ++e) {
      err8 = std::max(err8, std::abs(static_cast<double>(got8[h * D + e]) - exact[h * D + e]));
      errb = std::max(errb, std::abs(static_cast<double>(gotb[h * D + e]) - exact[h * D + e]));
    }
    EXPECT_LE(err8, bound) << "head " << h;
    if (h == 0)
      std::cout << "[paged int8] head 0: int8 error " << err8 << " (derived bound " << bound << "), bfloat16 error "
                << errb << "\n";
  }
  // A row holding a NaN is stored as NaN, and reaches the output as a NaN key would.
  const int64_t s = q8.add();
  Tensor<float> bad = random({1, Hkv, 1, D}, g);
  bad[3] = std::nanf("");
  q8.extend(std::vector<int64_t>{s}, std::vector<int64_t>{1});
  q8.write(0, std::vector<int64_t>{s}, bad, bad, std::vector<int64_t>{0, 1});
  const Tensor<float> nan_out = attend(q8, 0, std::vector<int64_t>{s}, random({1, Hq, 1, D}, g), qcu);
  EXPECT_TRUE(std::isnan(nan_out[0]));
  EXPECT_FALSE(std::isnan(nan_out[(Hq - 1) * D]));  // kv head 1's numbers are finite
}

// The pool is reserved, not touched: only written pages take memory, and a released page gives
// its memory back (resident pages by mincore on the pool's own addresses).
TEST(PagedKVCache, MemoryFollowsWhatIsWritten) {
  const int64_t page_system = sysconf(_SC_PAGESIZE);
  const int64_t P = 256, Hkv = 4, D = 64;  // 256 KiB a page of keys (float): whole system pages
  PagedKVCache<float> cache(1, 512, P, Hkv, D, D);  // 128 MiB of keys reserved
  const Tensor<int32_t> none = cache.block_table(std::vector<int64_t>{});
  const float* base = cache.pages(0, none).key_pages.data();
  const size_t bytes = static_cast<size_t>(512 * P * Hkv * D) * sizeof(float);
  auto resident = [&] {
    std::vector<unsigned char> in(bytes / static_cast<size_t>(page_system));
    EXPECT_EQ(mincore(const_cast<float*>(base), bytes, in.data()), 0);
    int64_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n * page_system;
  };
  EXPECT_EQ(resident(), 0);
  const int64_t s = cache.add();
  std::mt19937 g(14);
  const Tensor<float> k = random({1, Hkv, 600, D}, g);
  cache.extend(std::vector<int64_t>{s}, std::vector<int64_t>{600});
  cache.write(0, std::vector<int64_t>{s}, k, k, std::vector<int64_t>{0, 600});
  const int64_t page_bytes = P * Hkv * D * static_cast<int64_t>(sizeof(float));
  EXPECT_GT(resident(), 2 * page_bytes);   // 600 tokens: parts of 3 pages written
  EXPECT_LE(resident(), 3 * page_bytes);
  cache.release(s);
  EXPECT_EQ(resident(), 0);
}

TEST(PagedKVCache, RejectsBadInput) {
  expect_error([] { PagedKVCache<float>(0, 4, 8, 1, 4, 4); }, "layers: expected >= 1");
  expect_error([] { PagedKVCache<float>(1, 0, 8, 1, 4, 4); }, "pages: expected 1 to");
  expect_error([] { PagedKVCache<float>(1, int64_t{1} << 31, 8, 1, 4, 4); }, "pages: expected 1 to");
  expect_error([] { PagedKVCache<float>(1, 4, 0, 1, 4, 4); }, "page_size: expected >= 1");
  expect_error([] { PagedKVCache<float>(1, 4, 8, 0, 4, 4); }, "kv_heads: expected >= 1");
  PagedKVCache<float> cache(2, 4, 8, 2, 4, 3);
  const int64_t a = cache.add();
  const std::vector<int64_t> one{a};
  expect_error([&] { cache.extend(std::vector<int64_t>{a + 1}, std::vector<int64_t>{1}); },
               "PagedKVCache::extend: sequence: expected the id of a live sequence");
  expect_error([&] { cache.extend(std::vector<int64_t>{a, a}, std::vector<int64_t>{1, 1}); }, "expected distinct ids");
  expect_error([&] { cache.extend(one, std::vector<int64_t>{-1}); }, "counts[0]: expected >= 0");
  expect_error([&] { cache.extend(one, std::vector<int64_t>{}); }, "counts: expected one per sequence");
  expect_error([&] { cache.fork(-1); }, "PagedKVCache::fork: sequence");
  cache.extend(one, std::vector<int64_t>{2});
  Tensor<float> k({1, 2, 2, 4}), v({1, 2, 2, 3});
  const std::vector<int64_t> cu{0, 2};
  expect_error([&] { cache.write(2, one, k, v, cu); }, "layer: expected 0 to 1, got 2");
  expect_error([&] { cache.write(0, one, v, v, cu); }, "key: expected (1, Hkv, T, Dqk) = (1, 2, T, 4)");
  expect_error([&] { cache.write(0, one, k, k, cu); }, "value: expected [1, 2, 2, 3]");
  expect_error([&] { cache.write(0, one, k, v, std::vector<int64_t>{0, 1}); }, "end at T = 2");
  expect_error([&] { cache.write(0, one, k, v, std::vector<int64_t>{2}); }, "cu_seqlens: expected 2 values");
  Tensor<float> k3({1, 2, 3, 4}), v3({1, 2, 3, 3});
  expect_error([&] { cache.write(0, one, k3, v3, std::vector<int64_t>{0, 3}); }, "expected 0 to 2 new tokens, got 3");
  cache.write(0, one, k, v, cu);
  Tensor<float> q({1, 4, 2, 4});
  expect_error([&] { attend(cache, 0, one, q, std::vector<int64_t>{0, 2}, {.causal = attention::Causal::top_left}); },
               "scoring.causal: expected none or bottom_right");
  expect_error([&] { attend(cache, 0, one, q, std::vector<int64_t>{0}); }, "cu_seqlens_q: expected 2 values");
  expect_error([&] { attend(cache, 0, one, q, std::vector<int64_t>{0, 2}, {.dropout_p = 0.5}); },
               "dropout_p: expected 0");
  expect_error([&] { attend(cache, 5, one, q, std::vector<int64_t>{0, 2}); }, "layer: expected 0 to 1");
  Tensor<float> q3({1, 3, 2, 4});
  expect_error([&] { attend(cache, 0, one, q3, std::vector<int64_t>{0, 2}); }, "a multiple of the 2 kv heads");
  cache.release(a);
  expect_error([&] { cache.release(a); }, "PagedKVCache::release: sequence");
}

}  // namespace
}  // namespace mha::nn
