#include "heatmap_command.h"

#include <cstdint>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "number_flags.h"
#include "mha/core/escape.h"
#include "mha/core/safetensors.h"
#include "mha/viz/heatmap.h"

namespace mha::tools {
namespace {

namespace st = mha::safetensors;

struct HeatmapArgs {
  std::string input_path, output_path;
  std::string tensor = "attn_weights";
  int64_t batch = 0;
  std::string tokens, query_tokens, key_tokens;
  std::string title;
  int cell_size = 0;
};

const char* heatmap_contract() {
  return R"(
Shapes of the tensor (as `mha attention` writes attn_weights):
  (L, S)        one panel: averaged weights of one sequence
  (H, L, S)     one panel per head of one sequence; with --batch, read as (N, L, S) instead
  (N, H, L, S)  one panel per head of batch element --batch (default 0)
Weights are drawn on a fixed 0..1 colour scale (viridis); NaN weights are drawn in magenta
and reported. The PNG is written atomically: on any error no output file is left.)";
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// The (L, S) or (H, L, S) part to draw, after picking a batch element where there is one.
Tensor<float> select_panels(const Tensor<float>& weights, const HeatmapArgs& args, bool batch_given,
                            const std::string& what) {
  const Shape& shape = weights.shape();
  check(shape.size() >= 2 && shape.size() <= 4, what,
        ": expected shape (L, S), (H, L, S), (N, L, S) with --batch, or (N, H, L, S), got ", to_string(shape));
  const bool batched = shape.size() == 4 || (shape.size() == 3 && batch_given);
  if (!batched) {
    check(!batch_given, "--batch: ", what, " has shape ", to_string(shape),
          ", which has no batch dimension (expected (N, L, S) or (N, H, L, S))");
    return weights;
  }
  const int64_t n = shape[0];
  check(args.batch >= 0 && args.batch < n, "--batch: expected an index in [0, ", n, ") for ", what, " of shape ",
        to_string(shape), ", got ", args.batch);
  const Shape panel_shape(shape.begin() + 1, shape.end());
  const int64_t size = checked_numel(panel_shape);
  return Tensor<float>(panel_shape, std::span<const float>(weights.data() + args.batch * size, static_cast<size_t>(size)));
}

void check_token_count(const std::vector<std::string>& tokens, int64_t expected, const char* flag,
                       const char* dimension, const Shape& shape) {
  check(tokens.empty() || static_cast<int64_t>(tokens.size()) == expected, flag, ": expected ", expected,
        " tokens (", dimension, " of the panels ", to_string(shape), "), got ", tokens.size());
}

void run(const HeatmapArgs& args, bool batch_given) {
  const st::File file = st::load(args.input_path);
  const std::string what = "tensor '" + args.tensor + "' in " + args.input_path;
  const Tensor<float> weights = st::to_tensor<float>(st::require(file, args.tensor, args.input_path), args.tensor);
  const Tensor<float> panels = select_panels(weights, args, batch_given, what);

  viz::HeatmapOptions options;
  options.query_tokens = split_words(args.query_tokens.empty() ? args.tokens : args.query_tokens);
  options.key_tokens = split_words(args.key_tokens.empty() ? args.tokens : args.key_tokens);
  options.title = args.title;
  options.cell_size = args.cell_size;
  // Token counts are checked here too, so the message names the flag rather than the option.
  const Shape& shape = panels.shape();
  if (shape.size() == 2 || shape.size() == 3) {
    const char* query_flag = args.query_tokens.empty() ? "--tokens" : "--query-tokens";
    const char* key_flag = args.key_tokens.empty() ? "--tokens" : "--key-tokens";
    check_token_count(options.query_tokens, shape[shape.size() - 2], query_flag, "L, the rows", shape);
    check_token_count(options.key_tokens, shape[shape.size() - 1], key_flag, "S, the columns", shape);
  }

  const int64_t nan_count = viz::write_attention_heatmap(args.output_path, panels, options);
  if (nan_count > 0)
    std::cerr << "mha heatmap: warning: " << nan_count << " NaN weight" << (nan_count == 1 ? "" : "s")
              << " in " << escape(what) << ", drawn in magenta\n";
}

}  // namespace

void add_heatmap_command(CLI::App& app) {
  auto args = std::make_shared<HeatmapArgs>();
  CLI::App* cmd = app.add_subcommand("heatmap", "Draw attention weights from a .safetensors file as a PNG heatmap.");
  cmd->footer(heatmap_contract());
  cmd->add_option("--input", args->input_path, ".safetensors file holding the weights")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--tensor", args->tensor, "name of the weights tensor")->capture_default_str();
  CLI::Option* batch = cmd->add_option("--batch", args->batch, "batch element to draw (for batched weights)")
                           ->check(integer_bounds(0))
                           ->capture_default_str();
  cmd->add_option("--output", args->output_path, "where to write the picture (.png)")->required();
  cmd->add_option("--tokens", args->tokens, "whitespace-separated tokens for both axes (self-attention)");
  cmd->add_option("--query-tokens", args->query_tokens, "whitespace-separated row labels (L tokens)");
  cmd->add_option("--key-tokens", args->key_tokens, "whitespace-separated column labels (S tokens)");
  cmd->add_option("--title", args->title, "a line of text above the panels");
  cmd->add_option("--cell-size", args->cell_size, "pixels per weight, 1..256; 0 chooses one")
      ->check(integer_bounds(0, 256))
      ->capture_default_str();
  cmd->callback([args, batch] { run(*args, batch->count() > 0); });
}

}  // namespace mha::tools
