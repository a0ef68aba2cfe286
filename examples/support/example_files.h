#pragma once
// Every example can run on weights and inputs from files and write what it computed, so a test
// can compare it with the same scenario run by PyTorch (tests/goldens/examples):
//
//   <example> [--weights W.safetensors] [--inputs I.safetensors] [--output O.safetensors]
//             [--heatmap P.png]
//
// Without --weights the example initialises itself from its seed; without --inputs it makes its
// own inputs; without --output it only prints. --heatmap draws its attention weights: only the
// examples that have one picture to show take it (parse's `draws`).
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "mha/core/error.h"
#include "mha/core/escape.h"
#include "mha/core/safetensors.h"
#include "mha/nn/serialization.h"
#include "mha/viz/heatmap.h"

namespace mha::examples {

struct ExampleFiles {
  std::string weights, inputs, output, heatmap;

  // Parses the options (--heatmap where the example `draws`); returns false when the program
  // should exit (help or bad flag) with `exit_code` set.
  bool parse(int argc, char** argv, const std::string& description, int& exit_code, bool draws = false) {
    CLI::App app{description};
    // CLI11's messages quote the flags as given (a value, a path that does not exist): escaped.
    app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
      return escape(CLI::FailureMessage::simple(failed, e), /*keep_newlines=*/true);
    });
    app.add_option("--weights", weights, "load the model's state dict (PyTorch names) from this file")
        ->check(CLI::ExistingFile);
    app.add_option("--inputs", inputs, "take the inputs from this file")->check(CLI::ExistingFile);
    app.add_option("--output", output, "write the results to this file");
    if (draws) app.add_option("--heatmap", heatmap, "draw the attention weights into this PNG file");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      exit_code = app.exit(e);
      return false;
    }
    return true;
  }

  // Loads --weights into `module` when given (strict: names and shapes must match).
  template <class Module>
  void load_weights(Module& module) const {
    if (!weights.empty()) module.load_state_dict(nn::load_state_dict_file<float>(weights));
  }

  // The named input from --inputs, or `fallback` when no inputs file was given.
  template <class T>
  Tensor<T> input(const std::string& name, Tensor<T> fallback) const {
    if (inputs.empty()) return fallback;
    return safetensors::to_tensor<T>(safetensors::require(safetensors::load(inputs), name, inputs), name);
  }

  // Writes `results` to --output when given.
  void save(const std::map<std::string, Tensor<float>>& results) const {
    if (output.empty()) return;
    safetensors::File file;
    for (const auto& [name, tensor] : results) file.tensors.emplace(name, safetensors::from_tensor(tensor));
    safetensors::save(file, output);
    std::printf("results written to %s\n", escape(output).c_str());
  }

  // Draws (H, L, S) attention weights to --heatmap when given.
  void draw(const Tensor<float>& weights, const viz::HeatmapOptions& options) const {
    if (heatmap.empty()) return;
    viz::write_attention_heatmap(heatmap, weights, options);
    std::printf("heatmap written to %s\n", escape(heatmap).c_str());
  }
};

// Runs body() and turns an mha::Error into a one-line message and exit code 1. SIGXFSZ is
// ignored, as in the mha tool: a write past the file-size limit then fails with "File too large"
// instead of killing the example.
template <class Body>
int run_example(Body body) {
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());  // already escaped, as every mha::Error
    return 1;
  }
}

// An example's main(): parses the options (ExampleFiles::parse, with --heatmap where the example
// `draws`) and, unless the program should exit there, runs body(files) under run_example.
template <class Body>
int example_main(int argc, char** argv, const std::string& description, bool draws, Body body) {
  ExampleFiles files;
  int exit_code = 0;
  if (!files.parse(argc, argv, description, exit_code, draws)) return exit_code;
  return run_example([&] { return body(std::as_const(files)); });
}

}  // namespace mha::examples
