// `mha bench`'s flags; each bench is a file of bench/ (bench.h).
#include "bench_command.h"

#include <memory>
#include <string>

#include "bench/bench.h"
#include "number_flags.h"
#include "backend_option.h"
#include "mha/core/error.h"
#if MHA_WITH_MPI
#include "mha/distributed/context_parallel.h"
#endif

namespace mha::tools {

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<bench::BenchArgs>();
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
  cmd->add_flag("--paged", args->paged,
                "decode steps against paged bfloat16 and int8 caches beside the contiguous cache and the read "
                "bandwidth, and a mixed batch of decodes and a prefill chunk in one call, instead")
      ->excludes(gemm)
      ->excludes("--decode");
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
        bench::run_context_parallel_bench(*args);
        return 0;
      });
      return;
#else
      throw Error("--context-parallel: this mha was built without MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    if (args->gemm) return bench::run_gemm_bench(*args);
    if (args->paged) return bench::run_paged_bench(*args);
    args->decode ? bench::run_decode_bench(*args) : bench::run_attention_bench(*args);
  });
}

}  // namespace mha::tools

