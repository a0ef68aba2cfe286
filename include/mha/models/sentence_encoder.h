#pragma once
// Sentence embeddings as sentence-transformers computes them, from its model directory:
//
//   modules.json            the pipeline: Transformer (the directory itself), then Pooling
//                           (its folder, e.g. 1_Pooling/config.json), then Normalize if listed
//   sentence_bert_config.json   max_seq_length (truncation), do_lower_case (must be false)
//   vocab.txt, tokenizer_config.json   the WordPiece tokenizer (tokenizer.h)
//   config.json, model.safetensors     the BERT encoder (bert.h)
//
// Pooling as 1_Pooling/config.json says: mean over real tokens (MiniLM's), the [CLS] token, max
// over real tokens, or mean·sqrt(count) ("mean_sqrt_len"); exactly one mode. Normalize: each
// embedding divided by max(‖e‖₂, 1e-12), as torch.nn.functional.normalize. A plain Hugging Face
// directory without modules.json: mean pooling, no normalisation, max length
// min(model_max_length, max_position_embeddings). Anything else (another module type, several
// pooling modes at once, do_lower_case true) is an error naming the file and field.
//
// encode() batches like sentence-transformers (sorted by length, padded to the longest of each
// batch, results in the input order) and runs the encoder's inference path (PackedBert). A
// sentence's embedding does not depend on the batch it was in, nor on the thread count.
//
// dtype bfloat16 runs the encoder's layers in bfloat16 (PackedBert<bfloat16>: weights rounded to
// bfloat16, products on the CPU's bf16 instructions where it has them); the embedding block,
// pooling and normalisation stay in float, and the embeddings are float either way. In bfloat16 a
// sentence's embedding does not depend on the thread count, but its last bits may on the batch
// (libxsmm's kernels add in an order set by the product's shape, as PyTorch's bfloat16 does).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mha/core/tensor.h"
#include "mha/models/bert.h"
#include "mha/models/tokenizer.h"

namespace mha::models {

enum class Pooling { mean, cls, max, mean_sqrt_len };

// The type the encoder's layers compute in.
enum class Dtype { float32, bfloat16 };
// "float32" / "bfloat16" (also "float", "bf16"); anything else is an mha::Error naming `what`
// and listing the two.
Dtype dtype_from_name(const std::string& name, const std::string& what = "dtype");
const char* dtype_name(Dtype dtype);

class SentenceEncoder {
 public:
  explicit SentenceEncoder(const std::string& directory, Dtype dtype = Dtype::float32);
  SentenceEncoder(const SentenceEncoder&) = delete;
  SentenceEncoder& operator=(const SentenceEncoder&) = delete;

  // (N, dimension()) embeddings of `sentences` (UTF-8), batch_size >= 1 at a time. `progress`,
  // when given, is called after each batch with the number of sentences done so far.
  Tensor<float> encode(const std::vector<std::string>& sentences, int64_t batch_size = 32,
                       const std::function<void(int64_t)>& progress = {}) const;
  // The embeddings of one tokenized batch (the tokenizer's padded (N, L) ids and mask).
  Tensor<float> encode_tokens(const TokenizedBatch& batch) const;

  const WordPieceTokenizer& tokenizer() const { return tokenizer_; }
  const BertModel<float>& model() const { return *model_; }
  int64_t max_seq_length() const { return max_seq_length_; }
  int64_t dimension() const { return model_->config().hidden_size; }
  Pooling pooling() const { return pooling_; }
  Dtype dtype() const { return dtype_; }
  bool normalize() const { return normalize_; }

 private:
  WordPieceTokenizer tokenizer_;
  std::unique_ptr<BertModel<float>> model_;  // PackedBert points into it: kept at one address
  std::unique_ptr<PackedBert<float>> packed_;             // dtype float32
  std::unique_ptr<PackedBert<bfloat16>> packed_bfloat16_;  // dtype bfloat16
  Dtype dtype_ = Dtype::float32;
  int64_t max_seq_length_ = 0;
  Pooling pooling_ = Pooling::mean;
  bool normalize_ = false;
};

// The tokens per sentence (special tokens included) a model directory truncates to:
// sentence_bert_config.json's max_seq_length when present in a sentence-transformers directory
// (one with modules.json, as sentence-transformers reads it), else tokenizer_config.json's
// model_max_length, at most config.json's max_position_embeddings. Errors name file and field.
int64_t model_max_length(const std::string& directory, const WordPieceTokenizer& tokenizer);

// Pools hidden (N, L, H) over the real tokens of attention_mask (N, L) and normalises if asked:
// (N, H). Sums in double.
Tensor<float> pool(const Tensor<float>& hidden, const Tensor<int64_t>& attention_mask, Pooling pooling,
                   bool normalize);

}  // namespace mha::models
