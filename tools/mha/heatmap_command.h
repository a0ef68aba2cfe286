#pragma once
// `mha heatmap`: draws attention weights from a .safetensors file as a PNG heatmap.
#include <CLI/CLI.hpp>

namespace mha::tools {

// Adds the subcommand to `app`; it runs when the subcommand is parsed (see main.cpp).
void add_heatmap_command(CLI::App& app);

}  // namespace mha::tools
