#pragma once
// `mha bench`: attention speed on this machine, as FlashAttention counts it.
#include <CLI/CLI.hpp>

namespace mha::tools {

void add_bench_command(CLI::App& app);

}  // namespace mha::tools
