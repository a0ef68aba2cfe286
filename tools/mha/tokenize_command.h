#pragma once
// `mha tokenize`: WordPiece token ids of a text file (one sentence per line) with a model
// directory's tokenizer, written to a .safetensors file as Hugging Face returns them.
#include <CLI/CLI.hpp>

namespace mha::tools {

void add_tokenize_command(CLI::App& app);

}  // namespace mha::tools
