// `mha bench --gemm`: attention's tile products, one thread, operands in cache (a tile's reuse
// within a block): the float32 panel micro-kernel against bf16 × bf16 → float (bf16_gemm.h) on
// each path this CPU runs: AMX tiles, VDPBF16PS, and the float32 fallback a CPU without either
// takes.
#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "bench/bench.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/half.h"
#include "mha/core/panel_gemm.h"

namespace mha::tools::bench {

void run_gemm_bench(const BenchArgs& args) {
  nlohmann::json report;
  const std::vector<bf16_gemm::Path> paths = bf16_gemm::paths();
  std::printf("mha bench --gemm: one thread; GFLOP/s of C (m x n, float) = A (m x k) . B (k x n)\n%s\n"
              "bf16 paths on this CPU (the last is the one taken):", code_in_use(report).c_str());
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
  write_report(report, args.json_path);
}

}  // namespace mha::tools::bench
