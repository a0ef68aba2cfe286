// What `mha bench`'s benches share (bench.h).
#include "bench/bench.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "mha/core/atomic_file.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/escape.h"
#include "mha/core/simd.h"

namespace mha::tools::bench {

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

int64_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::string(field).size() + 1)) * 1024;
  return -1;
}

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

std::string code_in_use(nlohmann::json& report) {
  const std::string target = simd_targets().front(), ceiling = simd_target_ceiling();
  const char* bf16 = bf16_gemm::name(bf16_gemm::path());
  report["simd_target"] = target;
  report["mha_cpu_target"] = ceiling;
  report["bf16_path"] = bf16;
  return "SIMD target " + target + (ceiling.empty() ? " (this CPU's best)" : " (MHA_CPU_TARGET=" + ceiling + ")") +
         "; bf16 products: " + bf16;
}

void write_report(const nlohmann::json& report, const std::string& path) {
  if (path.empty()) return;
  const std::string text = report.dump(2) + "\n";
  write_file_atomically(path, "mha bench", [&](std::FILE* f) { std::fputs(text.c_str(), f); });
  std::printf("JSON written to %s\n", escape(path).c_str());
}

}  // namespace mha::tools::bench
