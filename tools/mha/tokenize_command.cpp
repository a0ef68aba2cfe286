#include "tokenize_command.h"

#include <cstdint>
#include <memory>
#include <string>

#include "mha/core/safetensors.h"
#include "mha/models/sentence_encoder.h"
#include "mha/models/text_lines.h"
#include "input_path.h"
#include "number_flags.h"
#include "output_path.h"

namespace mha::tools {
namespace {

struct TokenizeArgs {
  std::string model, input, output;
  int64_t max_length = 0;  // 0: the model's
};

const char* tokenize_contract() {
  return R"(
--input holds one sentence per line (UTF-8; '-' reads standard input). --output gets `input_ids`
and `attention_mask`, I64 of shape (N, longest), as Hugging Face's tokenizer returns them with
padding=True, truncation=True: [CLS] pieces [SEP], truncated to the maximum length, padded with
[PAD] (mask 0). The maximum length is --max-length, else the model's: sentence_bert_config.json's
max_seq_length, else tokenizer_config.json's model_max_length, at most config.json's
max_position_embeddings. An empty input gives shapes (0, 0). Written atomically.)";
}

void run(const TokenizeArgs& args) {
  check_output_directory(args.output, "--output");
  check_text_input(args.input, "--input");
  const std::vector<std::string> lines = models::read_lines(args.input);
  // The tokenizer and maximum length a SentenceEncoder of this directory uses, without loading
  // the weights.
  const models::WordPieceTokenizer tokenizer = models::WordPieceTokenizer::from_directory(args.model);
  const int64_t max_length = args.max_length > 0 ? args.max_length : models::model_max_length(args.model, tokenizer);
  const models::TokenizedBatch batch = tokenizer.encode_batch(lines, max_length);
  safetensors::File file;
  file.tensors["input_ids"] = safetensors::from_tensor(batch.input_ids);
  file.tensors["attention_mask"] = safetensors::from_tensor(batch.attention_mask);
  safetensors::save(file, args.output);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "WordPiece token ids of a text file (one sentence per line).");
  cmd->footer(tokenize_contract());
  cmd->add_option("--model", args->model, "Hugging Face model directory (vocab.txt, tokenizer_config.json)")->required();
  cmd->add_option("--input", args->input, "text file, one sentence per line ('-': standard input)")->required();
  cmd->add_option("--output", args->output, "where to write input_ids and attention_mask (.safetensors)")->required();
  cmd->add_option("--max-length", args->max_length, "tokens per sentence, [CLS] and [SEP] included (default: the model's)")
      ->check(integer_bounds(2, int64_t{1} << 40));
  cmd->callback([args] { run(*args); });
}

}  // namespace mha::tools
