// `mha bench`: forward and backward GFLOP/s of the attention core on a fixed set of shapes, the
// fraction of this machine's sgemm rate measured in the same run (the practical ceiling), the
// memory the call needs beyond its inputs and outputs, and the module forward. Prints a table
// and writes JSON (scripts/bench/bench.py adds PyTorch and ONNX Runtime measured in the same run).
//
// FLOPs as FlashAttention counts them: forward 4·B·H·L·S·d (halved when causal), backward 2.5×.
#include "bench_command.h"

#include <immintrin.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend_option.h"
#include "number_flags.h"
#include "mha/attention/attention.h"
#include "mha/core/atomic_file.h"
#include "mha/core/blas_threads.h"
#include "mha/core/escape.h"
#include "mha/core/gemm.h"
#include "mha/core/half.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/panel_gemm.h"
#include "mha/core/random.h"
#include "mha/nn/multihead_attention.h"
#if MHA_WITH_MPI
#include "mha/distributed/context_parallel.h"
#endif

namespace mha::tools {
namespace {

struct BenchArgs {
  std::string json_path;
  std::string backend = "automatic";
  bool quick = false;   // small shapes only: a smoke run for tests
  bool decode = false;  // decode steps against a KV cache instead (run_decode_bench)
  bool gemm = false;    // attention's tile products in bfloat16 and float32 instead (run_gemm_bench)
  int repeats = 5;
  // --context-parallel (under mpirun): run_context_parallel_bench
  std::string context_parallel, layout = "zigzag";
  std::vector<int64_t> lengths{16384, 65536};
  int64_t heads = 4, kv_heads = 4, head_dim = 64;
  bool causal = true, backward = true;
};

// Median wall time of `repeats` runs after one warm-up run.
double median_seconds(const std::function<void()>& run, int repeats) {
  run();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Resident memory in bytes from /proc/self/status ("VmRSS" now, "VmHWM" the peak).
int64_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::string(field).size() + 1)) * 1024;
  return -1;
}

// Peak resident memory of run() above what was resident before it, in bytes. Writing "5" to
// clear_refs resets the kernel's peak (VmHWM) to the current RSS. glibc keeps freed blocks of up
// to 32 MiB in its heap once a block that size was freed (its mmap threshold adapts), so a call
// could reuse memory that is already resident and look free. While measuring, every block over
// 1 MiB is mapped on allocation and returned on free.
//
// Timings run with the threshold at 32 MiB instead, glibc's own ceiling for it and where a
// long-running program that frees blocks of that size ends up (PyTorch's process too): with
// 1 MiB, every large tensor a call returns would be freshly mapped and page-faulted on each call
// (measured on the module forward: 350 ms against 281 ms).
constexpr int kMeasuringThreshold = 1 << 20, kTimingThreshold = 32 << 20;

int64_t extra_peak_bytes(const std::function<void()>& run) {
  mallopt(M_MMAP_THRESHOLD, kMeasuringThreshold);
  malloc_trim(0);
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const int64_t before = status_bytes("VmRSS:");
  run();
  const int64_t extra = status_bytes("VmHWM:") - before;
  mallopt(M_MMAP_THRESHOLD, kTimingThreshold);
  return extra;
}

Tensor<float> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<float> t(shape);
  for (auto& x : t.values()) x = static_cast<float>(gen.normal());
  return t;
}

struct Shape4 {
  int64_t batch, heads, len, head_dim;
  bool causal;
};

double attention_flops(const Shape4& s) {
  const double f = 4.0 * s.batch * s.heads * static_cast<double>(s.len) * s.len * s.head_dim;
  return s.causal ? f / 2 : f;
}

double sgemm_gflops(int repeats) {
  const int64_t n = 2048;
  Generator gen(1);
  const Tensor<float> a = random_tensor({n, n}, gen), b = random_tensor({n, n}, gen);
  Tensor<float> c({n, n});
  const double t = median_seconds(
      [&] { gemm<float>(Transpose::no, Transpose::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); },
      repeats);
  return 2.0 * n * n * n / t / 1e9;
}

void write_report(const nlohmann::json& report, const std::string& path) {
  if (path.empty()) return;
  const std::string text = report.dump(2) + "\n";
  write_file_atomically(path, "mha bench", [&](std::FILE* f) { std::fputs(text.c_str(), f); });
  std::printf("JSON written to %s\n", escape(path).c_str());
}

void run_bench(const BenchArgs& args) {
  mallopt(M_MMAP_THRESHOLD, kTimingThreshold);  // see extra_peak_bytes
  const attention::Backend backend = parse_backend(args.backend);
  nlohmann::json report;
  report["threads"] = omp_get_max_threads();
  report["backend"] = args.backend;
  const double sgemm = sgemm_gflops(args.repeats);
  report["sgemm_gflops"] = sgemm;
  report["blas_threading"] = to_string(blas_threading());
  std::printf("mha bench: %d threads, backend %s; BLAS threads: %s; sgemm (2048^3, BLAS) %.1f GFLOP/s\n\n",
              omp_get_max_threads(), args.backend.c_str(), to_string(blas_threading()).c_str(), sgemm);
  std::printf("%-34s %10s %8s %8s %10s %8s %8s %12s\n", "shape (B, H, L=S, d)", "fwd ms", "GFLOP/s", "%sgemm",
              "bwd ms", "GFLOP/s", "%sgemm", "extra MiB");

  std::vector<Shape4> shapes;
  if (args.quick) {
    shapes = {{1, 2, 128, 64, false}, {1, 2, 128, 64, true}};
  } else {
    for (int64_t len : {512, 2048, 4096})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true}) shapes.push_back({4, 8, len, d, causal});
    shapes.push_back({1, 1, 65536, 64, false});
  }
  for (const Shape4& s : shapes) {
    Generator gen(7);
    const Tensor<float> q = random_tensor({s.batch, s.heads, s.len, s.head_dim}, gen);
    const Tensor<float> k = random_tensor({s.batch, s.heads, s.len, s.head_dim}, gen);
    const Tensor<float> v = random_tensor({s.batch, s.heads, s.len, s.head_dim}, gen);
    const Tensor<float> dout = random_tensor({s.batch, s.heads, s.len, s.head_dim}, gen);
    attention::Options<float> opt;
    opt.backend = backend;
    opt.causal = s.causal ? attention::Causal::top_left : attention::Causal::none;
    const bool long_case = s.len > 8192;
    const int repeats = long_case ? 1 : args.repeats;
    auto fwd = attention::sdpa_forward(q, k, v, opt);
    const double t_fwd = median_seconds([&] { fwd = attention::sdpa_forward(q, k, v, opt); }, repeats);
    const double t_bwd = median_seconds(
        [&] { (void)attention::sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt); }, repeats);
    // Memory beyond inputs and outputs: the peak during the call minus what it returns.
    const int64_t out_bytes = fwd.output.numel() * 4 + fwd.logsumexp.numel() * 8;
    const int64_t extra_fwd = extra_peak_bytes([&] { fwd = attention::sdpa_forward(q, k, v, opt); }) - out_bytes;
    const int64_t extra_bwd = extra_peak_bytes([&] {
      (void)attention::sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
    }) - 3 * q.numel() * 4;
    const double flops = attention_flops(s);
    const double gf_fwd = flops / t_fwd / 1e9, gf_bwd = 2.5 * flops / t_bwd / 1e9;
    char name[64];
    std::snprintf(name, sizeof(name), "(%lld, %lld, %lld, %lld)%s", static_cast<long long>(s.batch),
                  static_cast<long long>(s.heads), static_cast<long long>(s.len), static_cast<long long>(s.head_dim),
                  s.causal ? " causal" : "");
    const double extra_mib = static_cast<double>(std::max(extra_fwd, extra_bwd)) / (1 << 20);
    std::printf("%-34s %10.2f %8.1f %7.0f%% %10.2f %8.1f %7.0f%% %12.1f\n", name, t_fwd * 1e3, gf_fwd,
                100 * gf_fwd / sgemm, t_bwd * 1e3, gf_bwd, 100 * gf_bwd / sgemm, extra_mib);
    std::fflush(stdout);
    report["attention"].push_back({{"batch", s.batch}, {"heads", s.heads}, {"len", s.len}, {"head_dim", s.head_dim},
                                   {"causal", s.causal}, {"forward_ms", t_fwd * 1e3}, {"forward_gflops", gf_fwd},
                                   {"backward_ms", t_bwd * 1e3}, {"backward_gflops", gf_bwd},
                                   {"forward_extra_bytes", extra_fwd}, {"backward_extra_bytes", extra_bwd}});
  }

  // The module: E = 512, 8 heads, batch 4, length 2048, need_weights = false (eval).
  const int64_t batch = args.quick ? 1 : 4, len = args.quick ? 64 : 2048, embed = 512;
  nn::MultiheadAttentionOptions mo;
  mo.embed_dim = embed;
  mo.num_heads = 8;
  mo.batch_first = true;
  nn::MultiheadAttention<float> module(mo, 3);
  module.eval();
  module.backend = backend;
  Generator gen(9);
  const Tensor<float> x = random_tensor({batch, len, embed}, gen);
  nn::MultiheadAttentionArgs<float> margs;
  margs.need_weights = false;
  const double t_module =
      median_seconds([&] { (void)module.forward(x, x, x, margs); }, args.quick ? 1 : args.repeats);
  std::printf("\nMultiheadAttention forward (N=%lld, L=%lld, E=512, 8 heads, need_weights=false): %.2f ms\n",
              static_cast<long long>(batch), static_cast<long long>(len), t_module * 1e3);
  report["module"] = {{"batch", batch}, {"len", len}, {"embed_dim", embed}, {"num_heads", 8},
                      {"forward_ms", t_module * 1e3}};

  write_report(report, args.json_path);
}

// ---------------------------------------------------------------------------------------------
// Decode: one query row per head (B, Hq = 32, 1, d = 128) against a KV cache (B, Hkv, S, 128) in
// float32 or bfloat16, bottom-right causal (the new token sees the whole cache). The work is
// reading the cache once, so the figure is GB/s of keys and values read, beside the machine's
// read bandwidth measured here by a large parallel sum. Each step reads another copy of the cache
// (as each layer of a model reads its own), enough copies to fill 512 MiB, so that the last
// level cache does not hold the cache between steps.

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

class ReadBandwidth {
 public:
  ReadBandwidth() : data_(new uint64_t[kCount]) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < kCount; ++i) data_[i] = static_cast<uint64_t>(i);
  }
  static constexpr int64_t bytes = int64_t{1} << 30;
  void read() {
    const bool wide = __builtin_cpu_supports("avx512f");
    uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t b = 0; b < kCount; b += kBlock)
      sum += wide ? sum_block_avx512(data_.get() + b, kBlock) : sum_block(data_.get() + b, kBlock);
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

void run_decode_bench(const BenchArgs& args) {
  nlohmann::json report;
  report["threads"] = omp_get_max_threads();
  ReadBandwidth reader;
  std::printf("mha bench --decode: %d threads; read bandwidth: a parallel sum of 1 GiB after each step, same rounds\n"
              "one query row per head, Hq = 32, d = 128, bottom-right causal; GB/s of keys and values read\n\n",
              omp_get_max_threads());
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

// Attention's tile products, one thread, operands in cache (a tile's reuse within a block): the
// float32 panel micro-kernel against bf16 × bf16 → float (bf16_gemm.h) on each path this CPU
// runs: AMX tiles, VDPBF16PS, and the float32 fallback a CPU without either takes.
void run_gemm_bench(const BenchArgs& args) {
  nlohmann::json report;
  const std::vector<bf16_gemm::Path> paths = bf16_gemm::paths();
  std::printf("mha bench --gemm: one thread; GFLOP/s of C (m x n, float) = A (m x k) . B (k x n)\n"
              "bf16 paths on this CPU (the last is the one taken):");
  for (bf16_gemm::Path p : paths) std::printf(" [%s]", bf16_gemm::name(p));
  std::printf("\n\n%-26s %5s %5s %5s %10s", "tile", "m", "n", "k", "float32");
  // Each path's column and JSON key, by Path's value.
  const std::pair<const char*, const char*> columns[] = {
      {"bf16 fb", "bf16_fallback_gflops"}, {"bf16 vdp", "bf16_vdpbf16ps_gflops"}, {"bf16 amx", "bf16_amx_gflops"}};
  for (bf16_gemm::Path p : paths) std::printf(" %10s", columns[static_cast<int>(p)].first);
  std::printf("\n");
  struct Shape3 {
    const char* name;
    size_t m, n, k;
  };
  const std::vector<Shape3> shapes = {{"S = Q.K^T, d 64", 96, 256, 64},   {"S = Q.K^T, d 64, 48 rows", 48, 256, 64},
                                      {"S, a band of 12 rows", 12, 272, 64}, {"O += P.V, d 64", 96, 64, 256},
                                      {"S = Q.K^T, d 128", 96, 256, 128},  {"O += P.V, d 128", 96, 128, 256}};
  Generator gen(3);
  for (const Shape3& t : shapes) {
    const size_t W = panel_gemm::panel_width(), n_padded = (t.n + W - 1) / W * W;
    std::vector<float> a(t.m * t.k), b(t.k * t.n), b_panels(n_padded * t.k), c(t.m * n_padded);
    std::vector<bfloat16> a16(t.m * t.k), b16(t.k * t.n), b_pairs(bf16_gemm::packed_size(t.k, t.n));
    for (size_t i = 0; i < a.size(); ++i) a16[i] = to_bfloat16(a[i] = static_cast<float>(gen.uniform(-1, 1)));
    for (size_t i = 0; i < b.size(); ++i) b16[i] = to_bfloat16(b[i] = static_cast<float>(gen.uniform(-1, 1)));
    panel_gemm::pack_rows(b.data(), t.n, t.k, t.n, b_panels.data());
    bf16_gemm::pack_b(b16.data(), t.n, t.k, t.n, b_pairs.data());
    const int calls = static_cast<int>(std::max<size_t>(1, (args.quick ? 20000000 : 400000000) / (t.m * t.n * t.k)));
    const double flops = 2.0 * static_cast<double>(t.m * t.n * t.k) * calls;
    auto rate = [&](const std::function<void()>& product) {
      return flops / median_seconds([&] { for (int r = 0; r < calls; ++r) product(); }, args.repeats) / 1e9;
    };
    const double f32 = rate([&] {
      panel_gemm::multiply(t.m, t.n, t.k, {a.data(), t.k}, {b_panels.data(), W, t.k * W}, {c.data(), n_padded}, true);
    });
    nlohmann::json row = {{"tile", t.name}, {"m", t.m}, {"n", t.n}, {"k", t.k}, {"float32_gflops", f32}};
    std::printf("%-26s %5zu %5zu %5zu %10.1f", t.name, t.m, t.n, t.k, f32);
    for (bf16_gemm::Path p : paths) {
      bf16_gemm::ScopedPath pin(p);
      const double r = rate([&] {
        bf16_gemm::multiply(t.m, t.n, t.k, a16.data(), t.k, b_pairs.data(), t.n, c.data(), n_padded, true);
      });
      std::printf(" %10.1f", r);
      row[columns[static_cast<int>(p)].second] = r;
    }
    std::printf("\n");
    std::fflush(stdout);
    report["tiles"].push_back(row);
  }
  report["bf16_path"] = bf16_gemm::name(bf16_gemm::path());
  write_report(report, args.json_path);
}

#if MHA_WITH_MPI
// Context-parallel attention under mpirun: for each sequence length, each rank builds random
// rows of its own (its layout's share of a B = 1 call), and the forward (and backward) are timed
// as the slowest rank's time (a barrier before each run), with what each rank sent and its peak
// resident memory beyond what it held before. Rank 0 prints and writes the JSON.
void run_context_parallel_bench(const BenchArgs& args) {
  using namespace distributed;
  Communicator& comm = Communicator::world();
  const int P = comm.size(), rank = comm.rank();
  const Scheme scheme = args.context_parallel == "ulysses" ? Scheme::ulysses : Scheme::ring;
  const Layout layout = args.layout == "contiguous" ? Layout::contiguous : Layout::zigzag;
  check(args.heads % args.kv_heads == 0, "--kv-heads: expected a divisor of --heads ", args.heads, ", got ",
        args.kv_heads);
  nlohmann::json report;
  report["ranks"] = P;
  report["threads_per_rank"] = omp_get_max_threads();
  report["scheme"] = args.context_parallel;
  report["layout"] = args.layout;
  if (rank == 0) {
    std::printf("mha bench --context-parallel %s: %d ranks x %d threads, layout %s, B = 1, Hq = %lld, Hkv = %lld, d = "
                "%lld%s, float32\n",
                args.context_parallel.c_str(), P, omp_get_max_threads(), args.layout.c_str(),
                static_cast<long long>(args.heads), static_cast<long long>(args.kv_heads),
                static_cast<long long>(args.head_dim), args.causal ? ", causal" : "");
    std::printf("%8s %10s %10s %10s %10s %10s %10s\n", "L", "fwd ms", "bwd ms", "TFLOP/s", "sent MiB", "peak MiB",
                "model MiB");
  }
  // The slowest rank's time of one run (every rank starts together).
  auto slowest = [&](const std::function<void()>& run) {
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    run();
    return comm.all_reduce_max(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
  auto median = [&](const std::function<void()>& run) {
    std::vector<double> t;
    for (int r = 0; r < args.repeats; ++r) t.push_back(slowest(run));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  for (int64_t L : args.lengths) {
    const Sequence seq{L, L, layout};
    const int64_t n = shard_length(L, layout, rank, P), d = args.head_dim;
    Generator gen(1000 + static_cast<uint64_t>(rank));
    auto random = [&](const Shape& shape) {
      Tensor<float> t(shape);
      for (auto& x : t.values()) x = static_cast<float>(gen.uniform(-1.0, 1.0));
      return t;
    };
    const Tensor<float> q = random({1, args.heads, n, d}), k = random({1, args.kv_heads, n, d}),
                        v = random({1, args.kv_heads, n, d}), dout = random({1, args.heads, n, d});
    attention::Options<float> options;
    options.causal = args.causal ? attention::Causal::top_left : attention::Causal::none;
    malloc_trim(0);
    const int64_t before = status_bytes("VmRSS");
    std::ofstream("/proc/self/clear_refs") << "5";
    attention::ForwardResult<float> out;
    comm.reset_traffic();
    const double fwd = median([&] { out = context_parallel_forward(comm, scheme, q, k, v, seq, options); });
    const Traffic forward_traffic = comm.traffic();
    double bwd = 0;
    comm.reset_traffic();
    if (args.backward)
      bwd = median([&] { context_parallel_backward(comm, scheme, q, k, v, out.output, out.logsumexp, dout, seq, options); });
    const Traffic backward_traffic = comm.traffic();
    const int64_t peak = status_bytes("VmHWM") - before;
    // Per rank: the largest over the ranks of what one run sent and of the peak memory.
    const int64_t mine[] = {(forward_traffic.message_bytes + forward_traffic.collective_bytes) / args.repeats,
                            (backward_traffic.message_bytes + backward_traffic.collective_bytes) / args.repeats, peak};
    const std::vector<int64_t> all = comm.all_gather(std::span<const int64_t>(mine, 3));
    int64_t sent_fwd = 0, sent_bwd = 0, peak_max = 0;
    for (int r = 0; r < P; ++r) {
      sent_fwd = std::max(sent_fwd, all[static_cast<size_t>(r) * 3]);
      sent_bwd = std::max(sent_bwd, all[static_cast<size_t>(r) * 3 + 1]);
      peak_max = std::max(peak_max, all[static_cast<size_t>(r) * 3 + 2]);
    }
    // The ring's model, per rank (docs/distributed.md), in bytes, with N = L/P rows: forward
    // 4Nd(5H + 6Hkv) (q, k, v, the output and a block's, the double accumulator, two blocks of
    // keys and values), backward 16Nd(H + 3Hkv) (q, k, v, output, grad_output, the three
    // gradients, and four blocks: keys and values, and their gradients, each current and next).
    const double N = static_cast<double>(L) / P, H = static_cast<double>(args.heads), Hkv = static_cast<double>(args.kv_heads);
    const double model = scheme == Scheme::ring
                             ? std::max(4 * N * d * (5 * H + 6 * Hkv), args.backward ? 16 * N * d * (H + 3 * Hkv) : 0.0)
                             : 0.0;
    const double flops = 4.0 * static_cast<double>(L) * static_cast<double>(L) * d * H / (args.causal ? 2 : 1);
    const double rate = flops * (args.backward ? 3.5 : 1.0) / (fwd + bwd) / 1e12;
    char bwd_ms[32] = "-";
    if (args.backward) std::snprintf(bwd_ms, sizeof bwd_ms, "%.1f", bwd * 1e3);
    if (rank == 0)
      std::printf("%8lld %10.1f %10s %10.3f %10.1f %10.1f %10s\n", static_cast<long long>(L), fwd * 1e3, bwd_ms, rate,
                  static_cast<double>(sent_fwd + sent_bwd) / 1048576.0, static_cast<double>(peak_max) / 1048576.0,
                  model > 0 ? std::to_string(std::lround(model / 1048576.0)).c_str() : "-");
    report["rows"].push_back({{"length", L}, {"forward_ms", fwd * 1e3}, {"backward_ms", bwd * 1e3},
                              {"sent_bytes_forward", sent_fwd}, {"sent_bytes_backward", sent_bwd},
                              {"peak_bytes", peak_max}, {"model_bytes", model}, {"tflops", rate}});
  }
  if (rank == 0) {
    std::printf("(times: the slowest rank, median of %d; sent: one forward%s, per rank, largest over the ranks; "
                "peak: resident memory beyond what the rank held before, largest over the ranks)\n",
                args.repeats, args.backward ? " + one backward" : "");
    write_report(report, args.json_path);
  }
}
#endif

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure attention forward/backward speed and memory on this machine.");
  cmd->add_option("--json", args->json_path, "also write the results as JSON to this file");
  add_backend_option(cmd, args->backend);
  cmd->add_option("--repeats", args->repeats, "timed runs per measurement (the median is reported)")
      ->check(integer_bounds(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--quick", args->quick, "a few small shapes only (a smoke test)");
  CLI::Option* gemm = cmd->add_flag("--gemm", args->gemm,
                                    "attention's tile products in bfloat16 (the CPU's bf16 instructions, and the "
                                    "float32 fallback) beside float32, one thread, instead");
  cmd->add_flag("--decode", args->decode,
                "decode steps against a KV cache (float32 and bfloat16) beside the machine's read bandwidth, "
                "instead of the attention and module shapes")
      ->excludes(gemm);
  cmd->add_option("--context-parallel", args->context_parallel,
                  "under mpirun: time context-parallel attention (ring or ulysses) over --lengths instead")
      ->check(CLI::IsMember({"ring", "ulysses"}))
      ->excludes(gemm);
  cmd->add_option("--layout", args->layout, "with --context-parallel: each rank's rows")
      ->check(CLI::IsMember({"contiguous", "zigzag"}))
      ->capture_default_str();
  cmd->add_option("--lengths", args->lengths, "with --context-parallel: sequence lengths L = S (comma-separated)")
      ->delimiter(',')
      ->check(integer_bounds(1, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--heads", args->heads, "with --context-parallel: query heads")->check(integer_bounds(1, 4096))->capture_default_str();
  cmd->add_option("--kv-heads", args->kv_heads, "with --context-parallel: key/value heads")
      ->check(integer_bounds(1, 4096))
      ->capture_default_str();
  cmd->add_option("--head-dim", args->head_dim, "with --context-parallel: head size")->check(integer_bounds(1, 4096))->capture_default_str();
  cmd->add_flag("--causal,!--no-causal", args->causal, "with --context-parallel: top-left causal (default on)");
  cmd->add_flag("--backward,!--no-backward", args->backward, "with --context-parallel: also time the backward");
  cmd->callback([args] {
    if (!args->context_parallel.empty()) {
#if MHA_WITH_MPI
      auto& comm = distributed::Communicator::world();
      distributed::run_or_abort(comm, [&] {
        run_context_parallel_bench(*args);
        return 0;
      });
      return;
#else
      throw Error("--context-parallel: this mha was built without MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    if (args->gemm) return run_gemm_bench(*args);
    args->decode ? run_decode_bench(*args) : run_bench(*args);
  });
}

}  // namespace mha::tools
