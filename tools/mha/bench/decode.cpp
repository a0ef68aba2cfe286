// `mha bench --decode`: one query row per head (B, Hq = 32, 1, d = 128) against a KV cache (B, Hkv, S, 128) in
// float32 or bfloat16, bottom-right causal (the new token sees the whole cache). The work is
// reading the cache once, so the figure is GB/s of keys and values read, beside the machine's
// read bandwidth measured here by a large parallel sum. Each step reads another copy of the cache
// (as each layer of a model reads its own), enough copies to fill 512 MiB, so that the last
// level cache does not hold the cache between steps.
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/bench.h"
#include "mha/attention/attention.h"
#include "mha/core/half.h"

namespace mha::tools::bench {
namespace {

// A parallel sum over 1 GiB (on every thread, the way the decode kernel reads): blocks of 32 KiB,
// each summed into independent accumulators so that the adds never wait on each other (one
// running sum read 25% less on a 2-core Zen 3: a dependency chain, not the memory), with 64-byte
// loads where the CPU has AVX-512: the compiler's 16-byte loop read 22 GB/s on an Intel Xeon VM
// where this one reads 29, and below what the decode kernels themselves read there (session 36);
// and each line prefetched (into L2) kPrefetchAhead bytes before it is read, as the decode kernels
// prefetch: on that VM a core's reads are bounded by the misses it keeps in flight, and the
// prefetches raised the sum from 26-28 GB/s to 29-30, where float32 decode at Hkv 32 read 29.5
// (session 37). One pass of read() takes the time the machine needs to read `bytes`.
constexpr int64_t kPrefetchAhead = 16384;
inline void prefetch_ahead(const uint64_t* p) {  // an address, not a pointer past the array: a hint only
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + kPrefetchAhead), /*rw=*/0,
                     /*locality=*/1);
}
uint64_t sum_block(const uint64_t* data, int64_t count) {
  uint64_t acc[8] = {};
  for (int64_t i = 0; i < count; i += 8) {
    prefetch_ahead(data + i);
    for (int j = 0; j < 8; ++j) acc[j] += data[i + j];
  }
  uint64_t sum = 0;
  for (uint64_t a : acc) sum += a;
  return sum;
}
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t sum_block_avx512(const uint64_t* data, int64_t count) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < count; i += 32) {
    for (int64_t line = 0; line < 32; line += 8) prefetch_ahead(data + i + line);
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(data + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(data + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(data + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(data + i + 24));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (uint64_t lane : lanes) sum += lane;
  return sum;
}
#endif

class ReadBandwidth {
 public:
  ReadBandwidth() : data_(new uint64_t[kCount]) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < kCount; ++i) data_[i] = static_cast<uint64_t>(i);
  }
  static constexpr int64_t bytes = int64_t{1} << 30;
  void read() {
    uint64_t sum = 0;
#if defined(__x86_64__)
    const bool wide = __builtin_cpu_supports("avx512f");
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t b = 0; b < kCount; b += kBlock)
      sum += wide ? sum_block_avx512(data_.get() + b, kBlock) : sum_block(data_.get() + b, kBlock);
#else
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t b = 0; b < kCount; b += kBlock) sum += sum_block(data_.get() + b, kBlock);
#endif
    total_ += sum;
    if (total_ == 42) std::printf(" ");  // keep the sum alive
  }

 private:
  static constexpr int64_t kCount = bytes / 8, kBlock = 4096;  // 128 Mi uint64
  std::unique_ptr<uint64_t[]> data_;
  uint64_t total_ = 0;
};

// Finite values in [−1, 1] (cheap, parallel: a cache of several GB filled by a normal generator
// would take longer than the measurement).
template <class T>
void fill_values(T* data, int64_t n, uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(static_cast<int64_t>((static_cast<uint64_t>(i) + seed) * 2654435761u % 2001) - 1000) / 1000.0f;
    if constexpr (std::is_same_v<T, float>) {
      data[i] = x;
    } else {
      data[i] = to_bfloat16(x);
    }
  }
}

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
