#include "embed_command.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "mha/core/escape.h"
#include "mha/core/safetensors.h"
#include "mha/models/sentence_encoder.h"
#include "mha/models/text_lines.h"
#include "input_path.h"
#include "number_flags.h"
#include "output_path.h"

namespace mha::tools {
namespace {

struct EmbedArgs {
  std::string model, input, output, dtype = "float32";
  int64_t batch_size = 32;
};

const char* embed_contract() {
  return R"(
--input holds one sentence per line (UTF-8; '-' reads standard input). --output gets one tensor,
`embeddings`, F32 of shape (N, hidden): row i is line i's embedding, as sentence-transformers'
encode() computes it with this model directory (tokenizer, BERT encoder, pooling and
normalisation as its modules.json says). --dtype bfloat16 runs the encoder's layers in bfloat16
(weights rounded once; the CPU's bf16 instructions where it has them); the embeddings are F32
either way. Written atomically. Progress goes to standard error
when it is a terminal.)";
}

void run(const EmbedArgs& args) {
  const models::Dtype dtype = models::dtype_from_name(args.dtype, "--dtype");
  check_output_directory(args.output, "--output");
  check_text_input(args.input, "--input");
  const std::vector<std::string> sentences = models::read_lines(args.input);
  const models::SentenceEncoder encoder(args.model, dtype);
  const bool show_progress = ::isatty(STDERR_FILENO) != 0 && sentences.size() > 256;
  const auto n = static_cast<int64_t>(sentences.size());
  const Tensor<float> embeddings = encoder.encode(sentences, args.batch_size, [&](int64_t done) {
    if (show_progress) std::fprintf(stderr, "\rmha embed: %lld / %lld sentences", static_cast<long long>(done),
                                    static_cast<long long>(n));
  });
  if (show_progress) std::fprintf(stderr, "\n");
  safetensors::File file;
  file.tensors["embeddings"] = safetensors::from_tensor(embeddings);
  safetensors::save(file, args.output);
}

}  // namespace

void add_embed_command(CLI::App& app) {
  auto args = std::make_shared<EmbedArgs>();
  CLI::App* cmd = app.add_subcommand("embed", "Sentence embeddings of a text file (one sentence per line).");
  cmd->footer(embed_contract());
  cmd->add_option("--model", args->model, "sentence-transformers / Hugging Face model directory")->required();
  cmd->add_option("--input", args->input, "text file, one sentence per line ('-': standard input)")->required();
  cmd->add_option("--output", args->output, "where to write the embeddings (.safetensors)")->required();
  cmd->add_option("--dtype", args->dtype, "the type the encoder's layers compute in: float32 or bfloat16")
      ->capture_default_str();
  cmd->add_option("--batch-size", args->batch_size, "sentences encoded together")
      ->check(integer_bounds(1))
      ->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace mha::tools
