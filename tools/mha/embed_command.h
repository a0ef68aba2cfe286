#pragma once
// `mha embed`: sentence embeddings of a text file (one sentence per line) with a
// sentence-transformers model directory, written to a .safetensors file.
#include <CLI/CLI.hpp>

namespace mha::tools {

void add_embed_command(CLI::App& app);

}  // namespace mha::tools
