// `mha bench --context-parallel`: context-parallel attention under mpirun: for each sequence length, each rank builds random
// rows of its own (its layout's share of a B = 1 call), and the forward (and backward) are timed
// as the slowest rank's time (a barrier before each run), with what each rank sent and its peak
// resident memory beyond what it held before. Rank 0 prints and writes the JSON.
#include <malloc.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "bench/bench.h"
#include "mha/distributed/context_parallel.h"

namespace mha::tools::bench {

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

}  // namespace mha::tools::bench
