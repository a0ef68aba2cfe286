#pragma once
// `mha eval`: evaluates a training checkpoint (written by `mha train`) on Fashion-MNIST: loss,
// accuracy, accuracy per class and, optionally, the confusion matrix as a PNG.
#include <CLI/CLI.hpp>

namespace mha::tools {

// Adds the subcommand to `app`; it runs when the subcommand is parsed (see main.cpp).
void add_eval_command(CLI::App& app);

}  // namespace mha::tools
