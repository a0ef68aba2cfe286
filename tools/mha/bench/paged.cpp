// `mha bench --paged`: serving's attention on the CPU, in two tables.
//   1. Decode steps (one query row per head, Hq = 32, Hkv = 8, d = 128) against paged caches beside
//      the contiguous cache of the same storage, in the same rounds: bfloat16 contiguous, bfloat16
//      in pages of 256 (and of 16 and 64 at one shape: the page size's cost), int8 in pages of
//      256; GB/s of what is stored and read (int8: its numbers and a float scale per row), beside
//      the machine's read bandwidth (as `mha bench --decode`); int8 against bfloat16. The pages of
//      a pool are handed out in shuffled order, as a long-running server's pool is. Each step reads
//      another copy (enough copies for 512 MiB), so no cache level holds them between steps.
//   2. A mixed batch, as a serving engine schedules a step: 32 sequences decoding one token each at
//      2048 tokens and one prefill chunk of 512 tokens (its tokens 1536..2047), in one paged call
//      beside the same work as 33 calls (one a sequence); tokens per second of attention (one
//      layer), bfloat16 and int8 pages of 256.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "bench/bench.h"
#include "mha/attention/attention.h"
#include "mha/core/half.h"

namespace mha::tools::bench {
namespace {

constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128;

double seconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A pool of pages holding `sequences` sequences of `tokens` tokens each (pages of P), the pages
// handed out in shuffled order; Kv float values in [−1, 1] (int8: numbers in [−127, 127] and
// scales near 1/127).
template <class Kv>
struct Pool {
  int64_t P, pages;
  std::vector<Kv> keys, values;
  std::vector<float> key_scales, value_scales;
  Tensor<int32_t> table;

  Pool(int64_t sequences, int64_t tokens, int64_t page_size, uint64_t seed)
      : P(page_size), pages(sequences * ((tokens + page_size - 1) / page_size)) {
    const int64_t blocks = (tokens + P - 1) / P, n = pages * kKvHeads * P * kDim;
    keys.resize(static_cast<size_t>(n));
    values.resize(static_cast<size_t>(n));
    if constexpr (std::is_same_v<Kv, int8_t>) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        keys[static_cast<size_t>(i)] = static_cast<int8_t>(static_cast<int>((static_cast<uint64_t>(i) + seed) * 2654435761u % 255) - 127);
        values[static_cast<size_t>(i)] = static_cast<int8_t>(static_cast<int>((static_cast<uint64_t>(i) + seed + 1) * 2654435761u % 255) - 127);
      }
      key_scales.assign(static_cast<size_t>(pages * kKvHeads * P), 1.0f / 127);
      value_scales.assign(static_cast<size_t>(pages * kKvHeads * P), 1.0f / 127);
    } else {
      fill_values(keys.data(), n, 2 * seed);
      fill_values(values.data(), n, 2 * seed + 1);
    }
    std::vector<int32_t> order(static_cast<size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(seed)));
    table = Tensor<int32_t>({sequences, blocks});
    std::copy(order.begin(), order.end(), table.data());
  }
  attention::PagedKv<Kv> view() const {
    attention::PagedKv<Kv> kv{View<const Kv>(keys.data(), {pages, kKvHeads, P, kDim}),
                              View<const Kv>(values.data(), {pages, kKvHeads, P, kDim}), table, {}, {}};
    if constexpr (std::is_same_v<Kv, int8_t>) {
      kv.key_scales = View<const float>(key_scales.data(), {pages, kKvHeads, P});
      kv.value_scales = View<const float>(value_scales.data(), {pages, kKvHeads, P});
    }
    return kv;
  }
};

// Bytes a step reads per token and kv head: keys and values, and int8's two scales.
template <class Kv>
int64_t row_bytes() {
  return 2 * kDim * static_cast<int64_t>(sizeof(Kv)) + (std::is_same_v<Kv, int8_t> ? 8 : 0);
}

struct StepRow {
  double ms, gb_per_s, read_gb_per_s;
};

// Median step over `copies` caches and the read bandwidth in the same rounds.
StepRow measure(ReadBandwidth& reader, int64_t bytes, int64_t copies, int repeats,
                const std::function<void(int64_t)>& step) {
  std::vector<double> steps, reads;
  for (int r = 0; r <= repeats; ++r) {  // round 0 warms up
    const double t = seconds([&] {
      for (int64_t c = 0; c < copies; ++c) step(c);
    });
    const double read = seconds([&] { reader.read(); });
    if (r > 0) steps.push_back(t / static_cast<double>(copies)), reads.push_back(read);
  }
  std::sort(steps.begin(), steps.end());
  std::sort(reads.begin(), reads.end());
  const double t = steps[steps.size() / 2];
  return {t * 1e3, static_cast<double>(bytes) / t / 1e9,
          static_cast<double>(ReadBandwidth::bytes) / reads[reads.size() / 2] / 1e9};
}

int64_t copies_for(int64_t bytes) { return std::clamp<int64_t>(((int64_t{512} << 20) + bytes - 1) / bytes, 1, 64); }

// One decode step of B sequences of S tokens: storage Kv, contiguous (P = 0) or in pages of P.
template <class Kv>
StepRow decode_step(ReadBandwidth& reader, int64_t B, int64_t S, int64_t P, int repeats) {
  const int64_t bytes = B * kKvHeads * S * row_bytes<Kv>(), copies = copies_for(bytes);
  Tensor<float> q({B, kHeads, 1, kDim}), out({B, kHeads, 1, kDim});
  fill_values(q.data(), q.numel(), 7);
  Tensor<double> lse({B, kHeads, 1});
  if (P == 0) {
    if constexpr (std::is_same_v<Kv, int8_t>) {
      throw Error("mha bench --paged: int8 is a paged cache's storage only");
    } else {
      std::vector<Tensor<Kv>> k, v;
      for (int64_t c = 0; c < copies; ++c) {
        k.emplace_back(Shape{B, kKvHeads, S, kDim});
        v.emplace_back(Shape{B, kKvHeads, S, kDim});
        fill_values(k.back().data(), k.back().numel(), 2 * static_cast<uint64_t>(c));
        fill_values(v.back().data(), v.back().numel(), 2 * static_cast<uint64_t>(c) + 1);
      }
      attention::Options<float> opt;
      opt.causal = attention::Causal::bottom_right;
      return measure(reader, bytes, copies, repeats, [&](int64_t c) {
        attention::sdpa_forward_into(View<const float>(q), View<const Kv>(k[c]), View<const Kv>(v[c]), {out, lse, {}},
                                     opt);
      });
    }
  }
  std::vector<Pool<Kv>> pools;
  for (int64_t c = 0; c < copies; ++c) pools.emplace_back(B, S, P, static_cast<uint64_t>(c) + 1);
  Tensor<int64_t> cu({B + 1}), lengths({B});
  for (int64_t b = 0; b < B; ++b) cu[b + 1] = b + 1, lengths[b] = S;
  attention::Options<float> opt;
  opt.causal = attention::Causal::bottom_right;
  opt.cu_seqlens_q = cu;
  opt.key_lengths = lengths;
  const View<const float> packed(q.data(), {1, kHeads, B, kDim}, {0, kDim, kHeads * kDim, 1});
  const View<float> packed_out(out.data(), {1, kHeads, B, kDim}, {0, kDim, kHeads * kDim, 1});
  const View<double> packed_lse(lse.data(), {1, kHeads, B}, {0, 1, kHeads});
  return measure(reader, bytes, copies, repeats, [&](int64_t c) {
    attention::paged_forward_into(packed, pools[static_cast<size_t>(c)].view(), {packed_out, packed_lse, {}}, opt);
  });
}

void print_step(nlohmann::json& report, const char* cache, int64_t B, int64_t S, int64_t P, const StepRow& r,
                double versus, const char* versus_name) {
  std::printf("%-9s %5lld %3lld %6lld %9.3f %7.1f %7.1f %6.0f%%  %5.2fx %s\n", cache, static_cast<long long>(P),
              static_cast<long long>(B), static_cast<long long>(S), r.ms, r.gb_per_s, r.read_gb_per_s,
              100 * r.gb_per_s / r.read_gb_per_s, versus, versus_name);
  std::fflush(stdout);
  report["decode"].push_back({{"cache", cache}, {"page_size", P}, {"batch", B}, {"keys", S}, {"step_ms", r.ms},
                              {"gb_per_s", r.gb_per_s}, {"read_gb_per_s", r.read_gb_per_s}, {"ratio", versus},
                              {"ratio_against", versus_name}});
}

// The mixed batch: 32 decodes at 2048 tokens and a 512-token chunk of a 2048-token sequence.
template <class Kv>
void mixed_batch(nlohmann::json& report, int64_t decodes, int64_t context, int64_t chunk, int repeats) {
  const int64_t N = decodes + 1, T = decodes + chunk;
  const Pool<Kv> pool(N, context, 256, 99);
  Tensor<float> q({1, kHeads, T, kDim}), out({1, kHeads, T, kDim});
  fill_values(q.data(), q.numel(), 5);
  Tensor<double> lse({1, kHeads, T});
  Tensor<int64_t> cu({N + 1}), lengths({N});
  for (int64_t s = 0; s < N; ++s) {
    cu[s + 1] = cu[s] + (s < decodes ? 1 : chunk);
    lengths[s] = context;
  }
  attention::Options<float> opt;
  opt.causal = attention::Causal::bottom_right;
  opt.cu_seqlens_q = cu;
  opt.key_lengths = lengths;
  const attention::PagedKv<Kv> kv = pool.view();
  const double one = median_seconds([&] { attention::paged_forward_into(View<const float>(q), kv, {out, lse, {}}, opt); },
                                    repeats);
  // The same work as a call per sequence: its queries, its row of the table.
  std::vector<Tensor<int64_t>> own_cu;
  for (int64_t s = 0; s < N; ++s) own_cu.emplace_back(Shape{2}, std::vector<int64_t>{0, cu[s + 1] - cu[s]});
  const double separate = median_seconds(
      [&] {
        for (int64_t s = 0; s < N; ++s) {
          attention::PagedKv<Kv> part = kv;
          part.block_table = kv.block_table.slice(0, s, 1);
          attention::Options<float> o = opt;
          o.cu_seqlens_q = own_cu[static_cast<size_t>(s)];
          o.key_lengths = View<const int64_t>(lengths.data() + s, {1});
          attention::paged_forward_into(View<const float>(q).slice(2, cu[s], cu[s + 1] - cu[s]), part,
                                        {View<float>(out).slice(2, cu[s], cu[s + 1] - cu[s]),
                                         View<double>(lse).slice(2, cu[s], cu[s + 1] - cu[s]), {}},
                                        o);
        }
      },
      repeats);
  std::printf("%-9s %8.2f %10.0f %10.2f %10.0f %8.2fx\n", storage_name<Kv>(), one * 1e3, static_cast<double>(T) / one,
              separate * 1e3, static_cast<double>(T) / separate, separate / one);
  std::fflush(stdout);
  report["mixed"].push_back({{"cache", storage_name<Kv>()}, {"decodes", decodes}, {"context", context},
                             {"chunk", chunk}, {"one_call_ms", one * 1e3}, {"separate_calls_ms", separate * 1e3},
                             {"tokens_per_s", static_cast<double>(T) / one}});
}

}  // namespace

void run_paged_bench(const BenchArgs& args) {
  nlohmann::json report;
  report["threads"] = omp_get_max_threads();
  ReadBandwidth reader;
  std::printf("mha bench --paged: %d threads; read bandwidth: a parallel sum of 1 GiB after each step, same rounds\n"
              "decode steps, one query row per head, Hq = 32, Hkv = 8, d = 128; GB/s of what is stored and read\n"
              "%s\n\n",
              omp_get_max_threads(), code_in_use(report).c_str());
  std::printf("%-9s %5s %3s %6s %9s %7s %7s %7s  %s\n", "cache", "page", "B", "S", "step ms", "GB/s", "read", "%read",
              "ratio");
  const std::vector<int64_t> batches = args.quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 8};
  const std::vector<int64_t> lengths =
      args.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{2048, 8192, 32768};
  const int64_t page_cost_at = args.quick ? 1024 : 8192;  // the shape with pages of 16 and 64 too
  for (int64_t B : batches)
    for (int64_t S : lengths) {
      const StepRow dense = decode_step<bfloat16>(reader, B, S, 0, args.repeats);
      print_step(report, "bfloat16", B, S, 0, dense, 1.0, "(contiguous)");
      const StepRow paged = decode_step<bfloat16>(reader, B, S, 256, args.repeats);
      print_step(report, "bfloat16", B, S, 256, paged, dense.ms / paged.ms, "contiguous/paged");
      if (B == 1 && S == page_cost_at)
        for (int64_t P : {16, 64}) {
          const StepRow small = decode_step<bfloat16>(reader, B, S, P, args.repeats);
          print_step(report, "bfloat16", B, S, P, small, dense.ms / small.ms, "contiguous/paged");
        }
      const StepRow q8 = decode_step<int8_t>(reader, B, S, 256, args.repeats);
      print_step(report, "int8", B, S, 256, q8, paged.ms / q8.ms, "bf16/int8");
    }
  std::printf("\nmixed batch: 32 decodes at 2048 tokens + a 512-token prefill chunk (of 2048), pages of 256; "
              "attention of one layer\n%-9s %8s %10s %10s %10s %9s\n",
              "cache", "one ms", "tokens/s", "33 ms", "tokens/s", "33/one");
  const int64_t decodes = args.quick ? 4 : 32, context = args.quick ? 512 : 2048, chunk = args.quick ? 64 : 512;
  mixed_batch<bfloat16>(report, decodes, context, chunk, args.repeats);
  mixed_batch<int8_t>(report, decodes, context, chunk, args.repeats);
  write_report(report, args.json_path);
}

}  // namespace mha::tools::bench
