#pragma once
// `mha train`: trains the attention classifier on Fashion-MNIST (mha/train/trainer.h), with a
// progress bar per epoch, test evaluation after each, checkpoints and resume, and pictures of
// the training curves and the test confusion matrix. See docs/training.md.
#include <CLI/CLI.hpp>

namespace mha::tools {

// Adds the subcommand to `app`; it runs when the subcommand is parsed (see main.cpp).
void add_train_command(CLI::App& app);

}  // namespace mha::tools
