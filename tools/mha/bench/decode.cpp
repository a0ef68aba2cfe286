// `mha bench --decode`: one query row per head (B, Hq = 32, 1, d = 128) against a KV cache (B, Hkv, S, 128) in
// float32 or bfloat16, bottom-right causal (the new token sees the whole cache). The work is
// reading the cache once, so the figure is GB/s of keys and values read, beside the machine's
// read bandwidth measured here by a large parallel sum. Each step reads another copy of the cache
// (as each layer of a model reads its own), enough copies to fill 512 MiB, so that the last
// level cache does not hold the cache between steps.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/bench.h"
#include "mha/attention/attention.h"
#include "mha/core/half.h"

namespace mha::tools::bench {
namespace {

// One row of the table: a step's median time and, measured in the same rounds (a pass of the
// parallel sum after each step: the host's bandwidth drifts over a run), the read bandwidth.
template <class Kv>
void decode_row(nlohmann::json& report, ReadBandwidth& reader, int64_t batch, int64_t kv_heads, int64_t keys,
                int repeats) {
  const int64_t heads = 32, d = 128;
  const int64_t bytes = 2 * batch * kv_heads * keys * d * static_cast<int64_t>(sizeof(Kv));
  const int64_t copies = std::clamp<int64_t>(((int64_t{512} << 20) + bytes - 1) / bytes, 1, 64);
  std::vector<Tensor<Kv>> k, v;
  for (int64_t c = 0; c < copies; ++c) {
    k.emplace_back(Shape{batch, kv_heads, keys, d});
    v.emplace_back(Shape{batch, kv_heads, keys, d});
    fill_values(k.back().data(), k.back().numel(), 2 * static_cast<uint64_t>(c));
    fill_values(v.back().data(), v.back().numel(), 2 * static_cast<uint64_t>(c) + 1);
  }
  // The query and output in the cache's type, as a model in that type runs (PyTorch's peer too).
  Tensor<Kv> q({batch, heads, 1, d}), out({batch, heads, 1, d});
  fill_values(q.data(), q.numel(), 7);
  Tensor<double> lse({batch, heads, 1});
  attention::Options<Kv> opt;
  opt.causal = attention::Causal::bottom_right;
  auto seconds = [](const std::function<void()>& run) {
    const auto start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> steps, reads;
  for (int r = 0; r <= repeats; ++r) {  // round 0 warms up
    const double step = seconds([&] {
      for (int64_t c = 0; c < copies; ++c)
        attention::sdpa_forward_into<Kv>(View<const Kv>(q), View<const Kv>(k[c]), View<const Kv>(v[c]), {out, lse, {}}, opt);
    });
    const double read = seconds([&] { reader.read(); });
    if (r > 0) steps.push_back(step / static_cast<double>(copies)), reads.push_back(read);
  }
  std::sort(steps.begin(), steps.end());
  std::sort(reads.begin(), reads.end());
  const double t = steps[steps.size() / 2];
  const double gbs = static_cast<double>(bytes) / t / 1e9;
  const double bandwidth = static_cast<double>(ReadBandwidth::bytes) / reads[reads.size() / 2] / 1e9;
  std::printf("%-9s %3lld %4lld %7lld %10.3f %8.1f %8.1f %7.0f%%\n", storage_name<Kv>(), static_cast<long long>(batch),
              static_cast<long long>(kv_heads), static_cast<long long>(keys), t * 1e3, gbs, bandwidth,
              100 * gbs / bandwidth);
  std::fflush(stdout);
  report["decode"].push_back({{"dtype", storage_name<Kv>()}, {"batch", batch}, {"query_heads", heads},
                              {"kv_heads", kv_heads}, {"keys", keys}, {"head_dim", d}, {"step_ms", t * 1e3},
                              {"cache_bytes", bytes}, {"gb_per_s", gbs}, {"read_gb_per_s", bandwidth}});
}

}  // namespace

void run_decode_bench(const BenchArgs& args) {
  nlohmann::json report;
  report["threads"] = omp_get_max_threads();
  ReadBandwidth reader;
  std::printf("mha bench --decode: %d threads; read bandwidth: a parallel sum of 1 GiB after each step, same rounds\n"
              "one query row per head, Hq = 32, d = 128, bottom-right causal; GB/s of keys and values read\n%s\n\n",
              omp_get_max_threads(), code_in_use(report).c_str());
  std::printf("%-9s %3s %4s %7s %10s %8s %8s %8s\n", "cache", "B", "Hkv", "S", "step ms", "GB/s", "read", "%read");
  const std::vector<int64_t> batches = args.quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 8};
  const std::vector<int64_t> kv_heads = args.quick ? std::vector<int64_t>{8} : std::vector<int64_t>{8, 32};
  const std::vector<int64_t> lengths =
      args.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 4096, 16384, 32768};
  for (bool bf16 : {false, true})
    for (int64_t b : batches)
      for (int64_t h : kv_heads)
        for (int64_t s : lengths) {
          if (bf16) {
            decode_row<bfloat16>(report, reader, b, h, s, args.repeats);
          } else {
            decode_row<float>(report, reader, b, h, s, args.repeats);
          }
        }
  write_report(report, args.json_path);
}

}  // namespace mha::tools::bench
