// One attention call across processes: run under mpirun (e.g. `mpirun -np 4 context_parallel`).
//
// A causal self-attention over L = 4096 tokens (8 query heads sharing 2 key/value heads, d = 64)
// is split across the ranks: each holds its zigzag share of the rows (chunks r and 2P − 1 − r of
// 2P, so every rank has the same causal work). The ring passes keys and values around while
// each rank attends its rows to the block it holds; Ulysses exchanges heads for rows instead.
// Every rank checks its rows, forward and backward, against the single-process call, and rank 0
// reports. Exits 1 on a mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "mha/core/random.h"
#include "mha/distributed/context_parallel.h"

using namespace mha;
using namespace mha::distributed;

namespace {

Tensor<float> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<float> t(shape);
  for (auto& x : t.values()) x = static_cast<float>(gen.uniform(-1.0, 1.0));
  return t;
}

double max_diff(const Tensor<float>& a, const Tensor<float>& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

}  // namespace

int main() {
  Communicator& comm = Communicator::world();
  return run_or_abort(comm, [&] {
    const int P = comm.size(), rank = comm.rank();
    const int64_t L = 4096, H = 8, Hkv = 2, d = 64;
    // Every rank makes the same whole inputs (one seed) and keeps its rows of them.
    Generator gen(2024);
    const Tensor<float> q = random_tensor({1, H, L, d}, gen), k = random_tensor({1, Hkv, L, d}, gen),
                        v = random_tensor({1, Hkv, L, d}, gen), dout = random_tensor({1, H, L, d}, gen);
    const Layout layout = Layout::zigzag;
    auto mine = [&](const Tensor<float>& t) { return shard(View<const float>(t), 2, layout, rank, P); };
    attention::Options<float> options;
    options.causal = attention::Causal::top_left;

    const auto whole = attention::sdpa_forward(q, k, v, options);
    const auto whole_grads = attention::sdpa_backward(q, k, v, whole.output, whole.logsumexp, dout, options);
    if (rank == 0) {
      std::printf("causal attention, L = %lld tokens, %lld query heads over %lld kv heads, d = %lld, on %d ranks\n",
                  static_cast<long long>(L), static_cast<long long>(H), static_cast<long long>(Hkv),
                  static_cast<long long>(d), P);
      std::printf("rank 0 holds rows");
      for (const Range& r : shard_ranges(L, layout, 0, P))
        std::printf(" [%lld, %lld)", static_cast<long long>(r.start), static_cast<long long>(r.start + r.length));
      std::printf(" (zigzag)\n");
    }
    bool ok = true;
    for (Scheme scheme : {Scheme::ring, Scheme::ulysses}) {
      const Sequence seq{L, L, layout};
      comm.reset_traffic();
      const auto out = context_parallel_forward(comm, scheme, mine(q), mine(k), mine(v), seq, options);
      const auto g = context_parallel_backward(comm, scheme, mine(q), mine(k), mine(v), out.output, out.logsumexp,
                                               mine(dout), seq, options);
      const Traffic sent = comm.traffic();  // before the checks' own collectives below
      // Largest difference from the single-process call over this rank's rows, then over all ranks.
      const double worst[] = {comm.all_reduce_max(max_diff(out.output, mine(whole.output))),
                              comm.all_reduce_max(max_diff(g.grad_query, mine(whole_grads.grad_query))),
                              comm.all_reduce_max(max_diff(g.grad_key, mine(whole_grads.grad_key)))};
      // Ulysses runs the unchanged kernel on whole heads: bit for bit. The ring merges blocks of
      // keys by log-sum-exp: equal up to float rounding.
      const double bound = scheme == Scheme::ulysses ? 0.0 : 1e-5;
      ok = ok && worst[0] <= bound && worst[1] <= bound && worst[2] <= bound;
      if (rank == 0)
        std::printf("  %-8s forward+backward: %2lld messages, %2lld collectives, %6.2f MiB sent by rank 0; largest "
                    "difference from one process: output %.1e, grad_query %.1e, grad_key %.1e%s\n",
                    scheme == Scheme::ring ? "ring" : "ulysses", static_cast<long long>(sent.messages),
                    static_cast<long long>(sent.collectives),
                    static_cast<double>(sent.message_bytes + sent.collective_bytes) / 1048576.0, worst[0], worst[1],
                    worst[2], scheme == Scheme::ulysses ? " (bit for bit)" : "");
    }
    if (rank == 0) std::printf(ok ? "every rank's rows match the single-process call\n" : "MISMATCH\n");
    return ok ? 0 : 1;
  });
}
