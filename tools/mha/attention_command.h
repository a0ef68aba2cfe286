#pragma once
// `mha attention`: the black-box interface to MultiheadAttention through safetensors files.
#include <CLI/CLI.hpp>

namespace mha::tools {

// Adds the subcommand to `app`; it runs when the subcommand is parsed (see main.cpp).
void add_attention_command(CLI::App& app);

// The tensor-name contract of `mha attention` (shown in its --help and in `mha --help`).
const char* attention_contract();

}  // namespace mha::tools
