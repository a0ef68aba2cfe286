// How the forward, backward and decode share their work among 8, 32 and 128 threads on `mha
// bench`'s shapes (mha/attention/work_split.h: each backend's own plan, dealt as OpenMP's dynamic
// schedule deals it), held to a bound on the idle share; hand-derived splits of simple shapes; bad
// input. The results' independence of the thread count is cpu_flash_test's and decode_test's.
#include "mha/attention/work_split.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../support/assertions.h"

namespace mha::attention {
namespace {

struct Row {
  std::string name;
  Shape q, k, v;
  Options<float> options;
};

// `mha bench`'s shapes (tools/mha/bench/attention.cpp and decode.cpp): (4, 8, L, d) for L 512,
// 2048, 4096, d 64, 128, causal or not, and (1, 1, 65536, 64); decode: one query row per head,
// Hq 32, d 128, bottom-right causal, B 1 and 8, Hkv 8 and 32, S 1024 to 32768.
std::vector<Row> bench_rows() {
  std::vector<Row> rows;
  for (int64_t L : {512, 2048, 4096})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        Row r{"(4,8," + std::to_string(L) + "," + std::to_string(d) + ")" + (causal ? " causal" : ""),
              {4, 8, L, d}, {4, 8, L, d}, {4, 8, L, d}, {}};
        r.options.causal = causal ? Causal::top_left : Causal::none;
        rows.push_back(r);
      }
  rows.push_back({"(1,1,65536,64)", {1, 1, 65536, 64}, {1, 1, 65536, 64}, {1, 1, 65536, 64}, {}});
  for (int64_t B : {1, 8})
    for (int64_t Hkv : {8, 32})
      for (int64_t S : {1024, 4096, 16384, 32768}) {
        Row r{"decode B" + std::to_string(B) + " Hkv" + std::to_string(Hkv) + " S" + std::to_string(S),
              {B, 32, 1, 128}, {B, Hkv, S, 128}, {B, Hkv, S, 128}, {}};
        r.options.causal = Causal::bottom_right;
        rows.push_back(r);
      }
  return rows;
}

WorkSplit split(const Shape& q, const Shape& kv, Causal causal, Pass pass, int threads) {
  Options<float> options;
  options.causal = causal;
  return work_split(q, kv, kv, options, pass, threads);
}

// The table of docs/performance.md ("Threads"), and what it must keep: the forward and decode's
// large shapes within a few percent of every thread busy; the backward's bench shapes one task
// per (b, kv head), all alike (idle 0 up to 32 threads, 75% at 128: B·Hkv = 32 tasks); the long
// shape's segments cut into 16 chunks each (the partials' memory bound).
TEST(WorkSplit, BenchShapesAtManyThreads) {
  std::printf("%-26s %-8s %7s  %s\n", "shape", "pass", "tasks",
              "tasks a thread runs (fewest-most) and idle share at 8 / 32 / 128 threads");
  for (const Row& r : bench_rows())
    for (Pass pass : {Pass::forward, Pass::backward}) {
      if (pass == Pass::backward && r.q[2] == 1) continue;  // decode rows: the forward alone
      SCOPED_TRACE(r.name);
      std::printf("%-26s %-8s", r.name.c_str(), pass == Pass::forward ? "forward" : "backward");
      for (int threads : {8, 32, 128}) {
        const WorkSplit s = work_split(r.q, r.k, r.v, r.options, pass, threads);
        if (threads == 8) std::printf(" %7lld ", static_cast<long long>(s.tasks));
        std::printf(" %4lld-%-4lld %5.1f%%", static_cast<long long>(s.fewest), static_cast<long long>(s.most),
                    100 * s.idle);
        const bool decode = r.q[2] == 1, long_keys = r.k[2] > 16384;
        EXPECT_EQ(s.backend, decode ? Backend::decode : Backend::cpu_flash);
        if (pass == Pass::forward && r.q[2] >= 2048) EXPECT_LE(s.idle, threads == 128 ? 0.20 : 0.05);
        if (decode && r.k[1] * r.k[0] * r.k[2] >= 8 * 16384) EXPECT_EQ(s.idle, 0.0) << threads;
        if (pass == Pass::backward && !long_keys) {
          EXPECT_EQ(s.tasks, 32);
          EXPECT_NEAR(s.idle, threads <= 32 ? 0.0 : 0.75, 0.01);
        }
        if (pass == Pass::backward && long_keys) {
          // Two sweeps × 16 segments × 16 chunks (as many as 40 MiB of partials allow: 2.1 MB
          // each) of the 683 query blocks (the last one 64 rows), dealt back and forth: chunks 0–9
          // get 43 whole blocks, the most work, 43 · 96 rows. From 16 threads up each chunk has a
          // thread, so 1 − 65536 / (threads · 43 · 96) idle; on 8, two chunks a thread.
          EXPECT_EQ(s.tasks, 2 * 16 * 16);
          if (threads >= 16) {
            EXPECT_NEAR(s.idle, 1 - 65536.0 / (threads * 43 * 96), 1e-9);
          } else {
            EXPECT_LE(s.idle, 0.01);
          }
        }
      }
      std::printf("\n");
    }
}

// Splits derived by hand. (4, 8, 1536, 64): 16 blocks of 96 rows per head, 512 equal tasks, so
// 64, 16 and 4 a thread with none idle. A causal backward of one head, (1, 1, 1536, 64): 16
// items, 8 chunks, dealt back and forth (items c and 15 − c), whose work (the rows × the keys each
// block's walk reads, (i + 1)·96 for block i) is the same for each: none idle on 8 threads.
// Decode, (1, 32, 1, 128) against (1, 8, 4096, 128): 4 rows per kv head, chunks of 1024 keys, so
// 8 × 4 = 32 tasks of equal work: 4 a thread on 8 threads, 1 on 32, and on 128 threads 96 idle.
TEST(WorkSplit, DerivedByHand) {
  for (int threads : {8, 32, 128}) {
    const WorkSplit s = split({4, 8, 1536, 64}, {4, 8, 1536, 64}, Causal::none, Pass::forward, threads);
    EXPECT_EQ(s.tasks, 512);
    EXPECT_EQ(s.fewest, 512 / threads);
    EXPECT_EQ(s.most, 512 / threads);
    EXPECT_DOUBLE_EQ(s.idle, 0.0);
  }
  const WorkSplit causal = split({1, 1, 1536, 64}, {1, 1, 1536, 64}, Causal::top_left, Pass::backward, 8);
  EXPECT_EQ(causal.tasks, 8);
  EXPECT_EQ(causal.fewest, 1);
  EXPECT_EQ(causal.most, 1);
  EXPECT_NEAR(causal.idle, 0.0, 1e-12);
  for (int threads : {8, 32, 128}) {
    const WorkSplit d = split({1, 32, 1, 128}, {1, 8, 4096, 128}, Causal::bottom_right, Pass::forward, threads);
    EXPECT_EQ(d.backend, Backend::decode);
    EXPECT_EQ(d.tasks, 32);
    EXPECT_EQ(d.most, threads <= 32 ? 32 / threads : 1);
    EXPECT_DOUBLE_EQ(d.idle, threads <= 32 ? 0.0 : 0.75);
  }
  // A decode call's backward is cpu_flash's.
  EXPECT_EQ(split({1, 32, 1, 128}, {1, 8, 4096, 128}, Causal::none, Pass::backward, 8).backend, Backend::cpu_flash);
}

TEST(WorkSplit, RejectsBadInput) {
  using mha::testing::expect_error;
  const Shape q{1, 2, 8, 16};
  Options<float> options;
  expect_error([&] { work_split(q, q, q, options, Pass::forward, 0); }, "threads: expected at least 1, got 0");
  expect_error([&] { work_split(Shape{1, 2, 8}, q, q, options, Pass::forward, 4); }, "query");
  expect_error([&] { work_split(q, Shape{1, 3, 8, 16}, Shape{1, 3, 8, 16}, options, Pass::forward, 4); },
               "key: number of key/value heads must divide");
  options.backend = Backend::reference;
  expect_error([&] { work_split(q, q, q, options, Pass::backward, 4); }, "the reference runs no parallel tasks");
  expect_error([&] { work_split(q, q, q, Options<double>{}, Pass::forward, 4); }, "the reference runs no parallel tasks");
}

}  // namespace
}  // namespace mha::attention
