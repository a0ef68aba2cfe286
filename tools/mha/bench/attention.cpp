// `mha bench`: forward and backward GFLOP/s of the attention core on a fixed set of shapes, the
// fraction of this machine's sgemm rate measured in the same run (the practical ceiling), the
// memory the call needs beyond its inputs and outputs, and the module forward. Prints a table
// and writes JSON (scripts/bench/bench.py adds PyTorch and ONNX Runtime measured in the same run).
//
// FLOPs as FlashAttention counts them: forward 4·B·H·L·S·d (halved when causal), backward 2.5×.
#include <malloc.h>
#include <omp.h>

#include <cstdio>
#include <vector>

#include "backend_option.h"
#include "bench/bench.h"
#include "mha/attention/attention.h"
#include "mha/core/blas_threads.h"
#include "mha/core/gemm.h"
#include "mha/nn/multihead_attention.h"

namespace mha::tools::bench {
namespace {

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

}  // namespace

void run_attention_bench(const BenchArgs& args) {
  mallopt(M_MMAP_THRESHOLD, kTimingThreshold);  // see extra_peak_bytes
  const attention::Backend backend = parse_backend(args.backend);
  nlohmann::json report;
  report["threads"] = omp_get_max_threads();
  report["backend"] = args.backend;
  const double sgemm = sgemm_gflops(args.repeats);
  report["sgemm_gflops"] = sgemm;
  report["blas_threading"] = to_string(blas_threading());
  std::printf("mha bench: %d threads, backend %s; BLAS threads: %s; sgemm (2048^3, BLAS) %.1f GFLOP/s\n%s\n\n",
              omp_get_max_threads(), args.backend.c_str(), to_string(blas_threading()).c_str(), sgemm,
              code_in_use(report).c_str());
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

}  // namespace mha::tools::bench
