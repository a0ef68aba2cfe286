#pragma once
// `mha bench`'s benches, one per file (attention.cpp, decode.cpp, paged.cpp, gemm.cpp, context_parallel.cpp),
// their arguments (the flags of bench_command.cpp) and what they share: timing, memory, the report.
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mha/core/half.h"
#include "mha/core/random.h"
#include "mha/core/tensor.h"

namespace mha::tools::bench {

struct BenchArgs {
  std::string json_path;
  std::string backend = "automatic";
  bool quick = false;   // small shapes only: a smoke run for tests
  bool decode = false;  // decode steps against a KV cache instead (run_decode_bench)
  bool paged = false;   // paged and int8 caches, and a mixed batch, instead (run_paged_bench)
  bool gemm = false;    // attention's tile products in bfloat16 and float32 instead (run_gemm_bench)
  int repeats = 5;
  // --context-parallel (under mpirun): run_context_parallel_bench
  std::string context_parallel, layout = "zigzag";
  std::vector<int64_t> lengths{16384, 65536};
  int64_t heads = 4, kv_heads = 4, head_dim = 64;
  bool causal = true, backward = true;
};

// The attention and module shapes (attention.cpp), decode steps beside the read bandwidth
// (decode.cpp), paged and int8 caches and a mixed batch (paged.cpp), the tile products (gemm.cpp), context parallelism under mpirun (context_parallel.cpp).
void run_attention_bench(const BenchArgs& args);
void run_decode_bench(const BenchArgs& args);
void run_paged_bench(const BenchArgs& args);
void run_gemm_bench(const BenchArgs& args);
void run_context_parallel_bench(const BenchArgs& args);

// Median wall time of `repeats` runs after one warm-up run.
double median_seconds(const std::function<void()>& run, int repeats);

// Resident memory in bytes from /proc/self/status ("VmRSS" now, "VmHWM" the peak).
int64_t status_bytes(const char* field);

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

int64_t extra_peak_bytes(const std::function<void()>& run);

Tensor<float> random_tensor(const Shape& shape, Generator& gen);

// The code this run takes, recorded in the report and returned as a line for the header: the
// SIMD target in use (under MHA_CPU_TARGET's ceiling, when set: mha/core/simd.h) and the bfloat16
// products' path.
std::string code_in_use(nlohmann::json& report);

// The machine's read bandwidth, as the decode benches compare with it: read() sums `bytes` (1 GiB)
// on every thread (read_bandwidth.cpp says how, and why so).
class ReadBandwidth {
 public:
  ReadBandwidth();
  static constexpr int64_t bytes = int64_t{1} << 30;
  void read();

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

// The report as JSON at `path` (written atomically; nothing when the path is empty).
void write_report(const nlohmann::json& report, const std::string& path);

}  // namespace mha::tools::bench
