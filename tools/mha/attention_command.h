#pragma once
// `mha attention`: the black-box interface to MultiheadAttention through safetensors files.
#include <CLI/CLI.hpp>

namespace mha::tools {

// Adds the subcommand to `app`; it runs when the subcommand is parsed (see main.cpp).
void add_attention_command(CLI::App& app);

}  // namespace mha::tools
