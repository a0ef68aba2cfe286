#include "mha/models/bert.h"

#include <algorithm>
#include <set>
#include <type_traits>
#include <utility>

#include "json_file.h"
#include "mha/core/error.h"
#include "mha/core/safetensors.h"

namespace mha::models {

BertConfig BertConfig::from_file(const std::string& path) {
  using namespace detail;
  const Json json = read_json_file(path);
  BertConfig c;
  if (auto type = optional_string(json, "model_type", path))
    check(*type == "bert", path, ": field 'model_type': expected \"bert\", got \"", *type,
          "\" (other BERT-family types differ: RoBERTa's positions start after the padding index, "
          "ALBERT shares its layers)");
  if (auto positions = optional_string(json, "position_embedding_type", path))
    check(*positions == "absolute", path, ": field 'position_embedding_type': expected \"absolute\", got \"",
          *positions, "\" (relative position embeddings are not supported)");
  for (const char* flag : {"is_decoder", "add_cross_attention"})
    check(!optional_bool(json, flag, path).value_or(false), path, ": field '", flag,
          "': a decoder is not supported (expected false)");
  c.vocab_size = positive_int(json, "vocab_size", path);
  c.hidden_size = positive_int(json, "hidden_size", path);
  c.num_hidden_layers = positive_int(json, "num_hidden_layers", path);
  c.num_attention_heads = positive_int(json, "num_attention_heads", path);
  c.intermediate_size = positive_int(json, "intermediate_size", path);
  c.max_position_embeddings = positive_int(json, "max_position_embeddings", path);
  c.type_vocab_size = positive_int(json, "type_vocab_size", path);
  c.layer_norm_eps = positive_number(json, "layer_norm_eps", path);
  check(c.hidden_size % c.num_attention_heads == 0, path, ": field 'hidden_size' (", c.hidden_size,
        ") must be a multiple of 'num_attention_heads' (", c.num_attention_heads, ")");
  const std::string act = optional_string(json, "hidden_act", path).value_or("gelu");
  if (act == "gelu") {
    c.hidden_act = nn::Activation::gelu;
  } else if (act == "relu") {
    c.hidden_act = nn::Activation::relu;
  } else {
    throw Error(path + ": field 'hidden_act': expected \"gelu\" or \"relu\", got \"" + act +
                "\" (the tanh approximations gelu_new / gelu_pytorch_tanh are not supported)");
  }
  return c;
}

namespace {

template <class T>
nn::TransformerEncoderLayer<T> bert_layer(const BertConfig& c) {
  nn::TransformerEncoderLayerOptions o;
  o.d_model = c.hidden_size;
  o.nhead = c.num_attention_heads;
  o.dim_feedforward = c.intermediate_size;
  o.dropout = 0.0;  // inference; Hugging Face's dropouts are off in eval mode too
  o.activation = c.hidden_act;
  o.layer_norm_eps = c.layer_norm_eps;
  o.batch_first = true;
  o.norm_first = false;
  nn::TransformerEncoderLayer<T> layer(o);
  layer.eval();
  return layer;
}

}  // namespace

template <class T>
BertModel<T>::BertModel(const BertConfig& config)
    : word_embeddings({config.vocab_size, config.hidden_size}),
      position_embeddings({config.max_position_embeddings, config.hidden_size}),
      token_type_embeddings({config.type_vocab_size, config.hidden_size}),
      embeddings_norm(config.hidden_size, config.layer_norm_eps),
      config_(config) {
  layers.reserve(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers.push_back(bert_layer<T>(config));
}

namespace {

// The sizes of config.json against the shapes in the weights file's header (read without the
// weights), before the model allocates from them: a config.json with vocab_size or
// num_hidden_layers 1e9 would otherwise allocate gigabytes (and fail with bad_alloc) before a
// weight was read. Every size the model allocates from is checked here.
void check_config_against_weights(const BertConfig& c, const std::string& config_path,
                                  const safetensors::MappedFile& file) {
  const std::string prefix = file.contains("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  // Dimension `dim` of tensor `name` is config field `field` (value `value`).
  auto expect = [&](const std::string& name, size_t dim, const char* field, int64_t value) {
    const auto it = file.tensors().find(prefix + name);
    check(it != file.tensors().end(), file.path(), ": tensor '", prefix + name, "' is missing (its size ", field,
          " is ", value, " in ", config_path, ")");
    const Shape& shape = it->second.shape;
    check(dim < shape.size() && shape[dim] == value, config_path, ": field '", field, "' (", value,
          ") does not match ", file.path(), ": tensor '", prefix + name, "' has shape ", shape);
  };
  expect("embeddings.word_embeddings.weight", 0, "vocab_size", c.vocab_size);
  expect("embeddings.word_embeddings.weight", 1, "hidden_size", c.hidden_size);
  expect("embeddings.position_embeddings.weight", 0, "max_position_embeddings", c.max_position_embeddings);
  expect("embeddings.token_type_embeddings.weight", 0, "type_vocab_size", c.type_vocab_size);
  expect("encoder.layer.0.intermediate.dense.weight", 0, "intermediate_size", c.intermediate_size);
  // Layer i is there if its query weight is; the count stops at the first one missing, so it
  // costs at most one look-up per tensor of the file.
  int64_t layers = 0;
  while (layers < c.num_hidden_layers &&
         file.contains(prefix + "encoder.layer." + std::to_string(layers) + ".attention.self.query.weight"))
    ++layers;
  check(layers == c.num_hidden_layers, config_path, ": field 'num_hidden_layers' (", c.num_hidden_layers,
        ") does not match ", file.path(), ": it has ", layers, " layer", layers == 1 ? "" : "s", " (no tensor '",
        prefix, "encoder.layer.", layers, ".attention.self.query.weight')");
}

}  // namespace

template <class T>
BertModel<T> BertModel<T>::from_directory(const std::string& directory) {
  const std::string config_path = directory + "/config.json";
  const BertConfig config = BertConfig::from_file(config_path);
  const safetensors::MappedFile file(directory + "/model.safetensors");
  check_config_against_weights(config, config_path, file);
  BertModel<T> model(config);
  model.load_safetensors(file);
  return model;
}

template <class T>
void BertModel<T>::load_safetensors(const std::string& path) {
  load_safetensors(safetensors::MappedFile(path));
}

template <class T>
void BertModel<T>::load_safetensors(const safetensors::MappedFile& file) {
  const std::string& path = file.path();
  const std::string prefix = file.contains("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  std::set<std::string> used;
  // The tensor `name` (under the prefix) of `shape`, as T.
  auto take = [&](const std::string& name, const Shape& shape) {
    const std::string full = prefix + name;
    check(file.contains(full), path, ": tensor '", full, "' is missing (expected shape ", shape,
          " from config.json)");
    const auto& ref = file.tensors().at(full);
    check(ref.shape == shape, path, ": tensor '", full, "': expected shape ", shape, " (from config.json), got ",
          ref.shape);
    using safetensors::DType;
    check(ref.dtype == DType::F32 || ref.dtype == DType::F16 || ref.dtype == DType::BF16 || ref.dtype == DType::F64,
          path, ": tensor '", full, "': expected a float dtype (F32, F16, BF16, F64), got ",
          safetensors::to_string(ref.dtype));
    used.insert(full);
    return safetensors::to_tensor<T>(ref, full);
  };
  // LayerNorm parameters: weight/bias, or the gamma/beta of checkpoints converted from TensorFlow.
  auto take_norm = [&](const std::string& name, nn::LayerNorm<T>& norm) {
    const bool old = !file.contains(prefix + name + ".weight") && file.contains(prefix + name + ".gamma");
    norm.weight = take(name + (old ? ".gamma" : ".weight"), {config_.hidden_size});
    norm.bias = take(name + (old ? ".beta" : ".bias"), {config_.hidden_size});
  };
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  word_embeddings = take("embeddings.word_embeddings.weight", {config_.vocab_size, H});
  position_embeddings = take("embeddings.position_embeddings.weight", {config_.max_position_embeddings, H});
  token_type_embeddings = take("embeddings.token_type_embeddings.weight", {config_.type_vocab_size, H});
  take_norm("embeddings.LayerNorm", embeddings_norm);
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string p = "encoder.layer." + std::to_string(i) + ".";
    nn::StateDict<T> state;
    // query, key and value stacked into in_proj (PyTorch's packed layout: rows [q; k; v]).
    Tensor<T> in_w({3 * H, H}), in_b({3 * H});
    const char* parts[] = {"query", "key", "value"};
    for (int64_t j = 0; j < 3; ++j) {
      const Tensor<T> w = take(p + "attention.self." + parts[j] + ".weight", {H, H});
      const Tensor<T> b = take(p + "attention.self." + parts[j] + ".bias", {H});
      std::copy_n(w.data(), H * H, in_w.data() + j * H * H);
      std::copy_n(b.data(), H, in_b.data() + j * H);
    }
    state["self_attn.in_proj_weight"] = std::move(in_w);
    state["self_attn.in_proj_bias"] = std::move(in_b);
    state["self_attn.out_proj.weight"] = take(p + "attention.output.dense.weight", {H, H});
    state["self_attn.out_proj.bias"] = take(p + "attention.output.dense.bias", {H});
    state["linear1.weight"] = take(p + "intermediate.dense.weight", {I, H});
    state["linear1.bias"] = take(p + "intermediate.dense.bias", {I});
    state["linear2.weight"] = take(p + "output.dense.weight", {H, I});
    state["linear2.bias"] = take(p + "output.dense.bias", {H});
    nn::LayerNorm<T> norm1(H), norm2(H);
    take_norm(p + "attention.output.LayerNorm", norm1);
    take_norm(p + "output.LayerNorm", norm2);
    state["norm1.weight"] = norm1.weight;
    state["norm1.bias"] = norm1.bias;
    state["norm2.weight"] = norm2.weight;
    state["norm2.bias"] = norm2.bias;
    layers[i].load_state_dict(state);
  }
  // Anything else under embeddings./encoder. was not understood: refuse rather than ignore it
  // (e.g. a checkpoint with more layers than config.json says).
  for (const auto& [name, ref] : file.tensors()) {
    if (used.count(name) != 0 || name == prefix + "embeddings.position_ids") continue;
    const bool ours = name.rfind(prefix + "embeddings.", 0) == 0 || name.rfind(prefix + "encoder.", 0) == 0;
    check(!ours, path, ": unexpected tensor '", name, "' with shape ", ref.shape,
          " (not part of a BERT encoder with the sizes of config.json)");
  }
}

Tensor<bool> key_padding_mask(const Tensor<int64_t>& attention_mask, const Shape& input_ids_shape) {
  check(attention_mask.shape() == input_ids_shape, "attention_mask: expected shape ", input_ids_shape,
        " (input_ids'), got ", attention_mask.shape());
  Tensor<bool> mask = Tensor<bool>::uninitialized(attention_mask.shape());
  for (int64_t i = 0; i < mask.numel(); ++i) {
    check(attention_mask[i] == 0 || attention_mask[i] == 1, "attention_mask: expected 0 or 1, got ",
          attention_mask[i], " at flat index ", i);
    mask[i] = attention_mask[i] == 0;
  }
  return mask;
}

template <class T>
Tensor<T> BertModel<T>::embed(const Tensor<int64_t>& input_ids) const {
  check(input_ids.dim() == 2, "BertModel: input_ids: expected shape (N, L), got ", input_ids.shape());
  const int64_t N = input_ids.size(0), L = input_ids.size(1), H = config_.hidden_size;
  check(L <= config_.max_position_embeddings, "BertModel: input_ids: expected at most max_position_embeddings = ",
        config_.max_position_embeddings, " tokens, got ", L);
  Tensor<T> x = Tensor<T>::uninitialized({N, L, H});
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t l = 0; l < L; ++l) {
      const int64_t id = input_ids[n * L + l];
      check(id >= 0 && id < config_.vocab_size, "BertModel: input_ids: expected ids in [0, ", config_.vocab_size,
            "), got ", id, " at (", n, ", ", l, ")");
      const T* w = word_embeddings.data() + id * H;
      const T* p = position_embeddings.data() + l * H;
      const T* t = token_type_embeddings.data();  // token type 0: one sentence per input
      T* out = x.data() + (n * L + l) * H;
      for (int64_t h = 0; h < H; ++h)  // Hugging Face's order of additions (bfloat16: in float, rounded once)
        out[h] = narrow<T>(widen(w[h]) + widen(t[h]) + widen(p[h]));
    }
  }
  return embeddings_norm.forward(x);
}

template <class T>
Tensor<T> BertModel<T>::forward(const Tensor<int64_t>& input_ids, const Tensor<int64_t>& attention_mask) {
  nn::TransformerEncoderArgs<T> args;
  args.src_key_padding_mask = key_padding_mask(attention_mask, input_ids.shape());
  Tensor<T> x = embed(input_ids);
  for (auto& layer : layers) {
    layer.eval();
    x = layer.forward(x, args);
  }
  return x;
}

template class BertModel<float>;
template class BertModel<double>;
template class BertModel<bfloat16>;

template <class T>
PackedBert<T>::PackedBert(BertModel<float>& model) : model_(&model) {
  layers_.reserve(model.layers.size());
  for (auto& layer : model.layers) layers_.emplace_back(layer);
}

template <class T>
Tensor<T> PackedBert<T>::forward(const Tensor<int64_t>& input_ids, const Tensor<int64_t>& attention_mask) const {
  const Tensor<bool> padding = key_padding_mask(attention_mask, input_ids.shape());
  const Tensor<float> embedded = model_->embed(input_ids);  // padded: each token at its position l
  const int64_t N = embedded.size(0), L = embedded.size(1), E = embedded.size(2);
  // The real tokens back to back (rounded once for bfloat16) and where each sequence starts.
  std::vector<int64_t> rows;
  Tensor<int64_t> cu_seqlens({N + 1});
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t l = 0; l < L; ++l)
      if (!padding[n * L + l]) rows.push_back(n * L + l);
    cu_seqlens[n + 1] = static_cast<int64_t>(rows.size());
  }
  const auto total = static_cast<int64_t>(rows.size());
  Tensor<T> x = Tensor<T>::uninitialized({total, E});
  for (int64_t r = 0; r < total; ++r) convert(embedded.data() + rows[r] * E, x.data() + r * E, static_cast<size_t>(E));
  for (const auto& layer : layers_) x = layer.forward(x, cu_seqlens);
  Tensor<T> out({N, L, E});  // padding positions 0
  for (int64_t r = 0; r < total; ++r) std::copy_n(x.data() + r * E, E, out.data() + rows[r] * E);
  return out;
}

template class PackedBert<float>;
template class PackedBert<bfloat16>;

}  // namespace mha::models
