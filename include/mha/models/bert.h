#pragma once
// A BERT-family encoder from a Hugging Face model directory (config.json + model.safetensors),
// token for token with transformers' BertModel (its last_hidden_state; the pooler is not used):
//
//   x = LayerNorm(word_embeddings[ids] + position_embeddings[0..L) + token_type_embeddings[0])
//   num_hidden_layers × post-norm TransformerEncoderLayer (batch_first, activation hidden_act,
//       eps layer_norm_eps), the padding mask from attention_mask; attention is mha's
//       MultiheadAttention with query/key/value packed into in_proj_weight / in_proj_bias
//
// Hugging Face's tensor names, with or without the "bert." prefix, map onto the layers' PyTorch
// names (attention.self.{query,key,value} -> self_attn.in_proj_*, attention.output.dense ->
// self_attn.out_proj, attention.output.LayerNorm -> norm1, intermediate.dense -> linear1,
// output.dense -> linear2, output.LayerNorm -> norm2); LayerNorm's old gamma/beta names are
// accepted. pooler.*, embeddings.position_ids and task heads (cls.*, ...) are ignored; any other
// tensor under embeddings./encoder. is an error, as is a missing or misshaped one (naming the
// file and the tensor). F32 is read as is; F16, BF16 and F64 are converted.
//
// Supported: model_type "bert", absolute positions, hidden_act "gelu" (exact) or "relu"; any
// other value is an error naming config.json and the field.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mha/core/tensor.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/packed_transformer.h"
#include "mha/nn/transformer.h"

namespace mha::safetensors {
class MappedFile;
}

namespace mha::models {

struct BertConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 0;
  double layer_norm_eps = 1e-12;
  nn::Activation hidden_act = nn::Activation::gelu;

  // config.json; errors name the file and the field.
  static BertConfig from_file(const std::string& path);
};

template <class T>
class BertModel {
 public:
  // Weights zero (load them next).
  explicit BertModel(const BertConfig& config);
  // config.json and model.safetensors of `directory`. config.json's sizes are checked against
  // the shapes in model.safetensors' header before anything is allocated; a mismatch is an
  // error naming config.json, the field, model.safetensors and the tensor.
  static BertModel from_directory(const std::string& directory);
  // Every weight from a safetensors file (Hugging Face's names); errors name the file and tensor.
  void load_safetensors(const std::string& path);
  void load_safetensors(const safetensors::MappedFile& file);  // the same, from a file already open

  const BertConfig& config() const { return config_; }

  // ids (N, L) -> the embedding block's output (N, L, hidden). Every id must be in
  // [0, vocab_size) and L <= max_position_embeddings.
  Tensor<T> embed(const Tensor<int64_t>& input_ids) const;
  // input_ids, attention_mask (N, L), the mask 1 for real tokens and 0 for padding (what the
  // tokenizer returns) -> last_hidden_state (N, L, hidden), through the layers' own forward.
  Tensor<T> forward(const Tensor<int64_t>& input_ids, const Tensor<int64_t>& attention_mask);

  Tensor<T> word_embeddings, position_embeddings, token_type_embeddings;  // (V|P|types, hidden)
  nn::LayerNorm<T> embeddings_norm;
  std::vector<nn::TransformerEncoderLayer<T>> layers;

 private:
  BertConfig config_;
};

// The padding mask the layers take (true = padding) from a tokenizer's attention_mask (1 = real
// token, 0 = padding; any other value is an error), checked against input_ids' shape (N, L).
Tensor<bool> key_padding_mask(const Tensor<int64_t>& attention_mask, const Shape& input_ids_shape);

// BertModel<float>'s forward on nn::PackedTransformerEncoderLayer<T> (weights packed once, for
// inference): what SentenceEncoder runs. The layers see only the real tokens, back to back (the
// padding is removed after the embedding block and costs the layers nothing); the states of the
// padding positions come out 0. T = float is tested against BertModel::forward;
// T = bfloat16 runs the layers in bfloat16 (the embedding block in float, its output rounded
// once), held to PyTorch's bar: all-MiniLM-L6-v2's token states and embeddings within twice
// sentence-transformers' bfloat16 distance from float64 (tests/models/sentence_encoder_test.cpp). Holds a pointer to `model`'s
// embeddings: the model must outlive it, and later weight changes are not seen.
template <class T>
class PackedBert {
 public:
  explicit PackedBert(BertModel<float>& model);
  // As BertModel::forward at every real token (attention_mask 1); 0 at the padding positions.
  Tensor<T> forward(const Tensor<int64_t>& input_ids, const Tensor<int64_t>& attention_mask) const;

 private:
  const BertModel<float>* model_;
  std::vector<nn::PackedTransformerEncoderLayer<T>> layers_;
};

}  // namespace mha::models
