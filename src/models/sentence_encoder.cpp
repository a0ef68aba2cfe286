#include "mha/models/sentence_encoder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>

#include "json_file.h"
#include "mha/core/error.h"
#include "mha/core/escape.h"

namespace mha::models {
namespace {

namespace fs = std::filesystem;

// The pooling mode of a sentence-transformers Pooling config (exactly one mode set).
Pooling read_pooling(const std::string& path, int64_t hidden_size) {
  using namespace detail;
  const Json json = read_json_file(path);
  if (auto dim = optional_int(json, "word_embedding_dimension", path))
    check(*dim == hidden_size, path, ": field 'word_embedding_dimension': expected ", hidden_size,
          " (config.json's hidden_size), got ", *dim);
  for (const char* unsupported : {"pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"})
    check(!optional_bool(json, unsupported, path).value_or(false), path, ": field '", unsupported,
          "': this pooling mode is not supported (mean, cls, max and mean_sqrt_len are)");
  const std::pair<const char*, Pooling> modes[] = {{"pooling_mode_mean_tokens", Pooling::mean},
                                                   {"pooling_mode_cls_token", Pooling::cls},
                                                   {"pooling_mode_max_tokens", Pooling::max},
                                                   {"pooling_mode_mean_sqrt_len_tokens", Pooling::mean_sqrt_len}};
  int chosen = 0;
  Pooling pooling = Pooling::mean;
  for (const auto& [field, mode] : modes) {
    if (optional_bool(json, field, path).value_or(false)) {
      ++chosen;
      pooling = mode;
    }
  }
  check(chosen == 1, path, ": expected exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token, "
        "pooling_mode_max_tokens, pooling_mode_mean_sqrt_len_tokens to be true, got ", chosen);
  return pooling;
}

}  // namespace

Dtype dtype_from_name(const std::string& name, const std::string& what) {
  if (name == "float32" || name == "float") return Dtype::float32;
  if (name == "bfloat16" || name == "bf16") return Dtype::bfloat16;
  throw Error(what + ": expected \"float32\" or \"bfloat16\", got \"" + escape(name) + "\"");
}

const char* dtype_name(Dtype dtype) { return dtype == Dtype::bfloat16 ? "bfloat16" : "float32"; }

int64_t model_max_length(const std::string& directory, const WordPieceTokenizer& tokenizer) {
  using namespace detail;
  int64_t length = tokenizer.config().model_max_length;
  const std::string config_path = directory + "/config.json";
  int64_t positions = int64_t{1} << 62;
  if (fs::exists(config_path)) {
    positions = positive_int(read_json_file(config_path), "max_position_embeddings", config_path);
    length = std::min(length, positions);
  }
  // sentence-transformers reads its own config only in its own directories (with modules.json):
  // a plain Hugging Face directory truncates at the tokenizer's length whatever else it holds.
  const std::string st_config = directory + "/sentence_bert_config.json";
  if (fs::exists(directory + "/modules.json") && fs::exists(st_config)) {
    const Json json = read_json_file(st_config);
    if (auto max_seq = optional_int(json, "max_seq_length", st_config, 2)) {
      check(*max_seq <= positions, st_config, ": field 'max_seq_length': expected at most ", positions,
            " (config.json's max_position_embeddings), got ", *max_seq);
      length = *max_seq;
    }
    check(!optional_bool(json, "do_lower_case", st_config).value_or(false), st_config,
          ": field 'do_lower_case': true is not supported (the tokenizer's own lower-casing is)");
  }
  return length;
}

SentenceEncoder::SentenceEncoder(const std::string& directory, Dtype dtype)
    : tokenizer_(WordPieceTokenizer::from_directory(directory)),
      model_(std::make_unique<BertModel<float>>(BertModel<float>::from_directory(directory))) {
  using namespace detail;
  const BertConfig& config = model_->config();
  // Every id the tokenizer can give must have an embedding: found here, not at the first sentence
  // that holds a token past them.
  check(tokenizer_.vocab_size() <= config.vocab_size, directory, "/vocab.txt: expected at most ", config.vocab_size,
        " tokens (config.json's vocab_size, the word embeddings' rows), got ", tokenizer_.vocab_size());
  max_seq_length_ = model_max_length(directory, tokenizer_);
  const std::string modules_path = directory + "/modules.json";
  if (fs::exists(modules_path)) {
    const Json modules = read_json_file(modules_path, false);
    check(modules.is_array(), modules_path, ": expected a JSON list of modules");
    bool have_transformer = false, have_pooling = false;
    for (const Json& m : modules) {
      check(m.is_object(), modules_path, ": expected each module to be an object");
      const std::string type = string_field(m, "type", modules_path);
      const std::string path = optional_string(m, "path", modules_path).value_or("");
      if (type == "sentence_transformers.models.Transformer") {
        check(path.empty() && !have_transformer && !have_pooling, modules_path,
              ": expected one Transformer module first, in the directory itself (path \"\"), got path \"", path, "\"");
        have_transformer = true;
      } else if (type == "sentence_transformers.models.Pooling") {
        check(have_transformer && !have_pooling, modules_path, ": expected one Pooling module after the Transformer");
        pooling_ = read_pooling(directory + "/" + path + "/config.json", config.hidden_size);
        have_pooling = true;
      } else if (type == "sentence_transformers.models.Normalize") {
        check(have_pooling && !normalize_, modules_path, ": expected one Normalize module after the Pooling");
        normalize_ = true;
      } else {
        throw Error(modules_path + ": module type \"" + type +
                    "\" is not supported (Transformer, Pooling and Normalize are)");
      }
    }
    check(have_transformer && have_pooling, modules_path, ": expected a Transformer and a Pooling module");
  }
  dtype_ = dtype;
  if (dtype == Dtype::bfloat16) packed_bfloat16_ = std::make_unique<PackedBert<bfloat16>>(*model_);
  else packed_ = std::make_unique<PackedBert<float>>(*model_);
}

Tensor<float> pool(const Tensor<float>& hidden, const Tensor<int64_t>& attention_mask, Pooling pooling,
                   bool normalize) {
  check(hidden.dim() == 3 && attention_mask.shape() == Shape{hidden.size(0), hidden.size(1)},
        "pool: expected hidden (N, L, H) and attention_mask (N, L), got ", hidden.shape(), " and ",
        attention_mask.shape());
  const int64_t N = hidden.size(0), L = hidden.size(1), H = hidden.size(2);
  Tensor<float> out({N, H});
  std::vector<double> acc(static_cast<size_t>(H));
  for (int64_t n = 0; n < N; ++n) {
    int64_t count = 0;
    std::fill(acc.begin(), acc.end(), pooling == Pooling::max ? -std::numeric_limits<double>::infinity() : 0.0);
    for (int64_t l = 0; l < L; ++l) {
      if (attention_mask[n * L + l] == 0) continue;
      if (pooling == Pooling::cls && count > 0) break;
      ++count;
      const float* row = hidden.data() + (n * L + l) * H;
      for (int64_t h = 0; h < H; ++h)
        acc[h] = pooling == Pooling::max ? std::max(acc[h], static_cast<double>(row[h])) : acc[h] + row[h];
    }
    // sentence-transformers divides by max(count, 1e-9); count is >= 2 here ([CLS], [SEP]).
    const double divisor = pooling == Pooling::mean            ? std::max<double>(count, 1e-9)
                           : pooling == Pooling::mean_sqrt_len ? std::sqrt(std::max<double>(count, 1e-9))
                                                               : 1.0;
    double norm = 0;
    for (int64_t h = 0; h < H; ++h) {
      acc[h] = count == 0 ? 0.0 : acc[h] / divisor;
      norm += acc[h] * acc[h];
    }
    const double scale = normalize ? 1.0 / std::max(std::sqrt(norm), 1e-12) : 1.0;
    for (int64_t h = 0; h < H; ++h) out[n * H + h] = static_cast<float>(acc[h] * scale);
  }
  return out;
}

Tensor<float> SentenceEncoder::encode_tokens(const TokenizedBatch& batch) const {
  const Tensor<float> hidden = packed_ ? packed_->forward(batch.input_ids, batch.attention_mask)
                                       : cast<float>(packed_bfloat16_->forward(batch.input_ids, batch.attention_mask));
  return pool(hidden, batch.attention_mask, pooling_, normalize_);
}

Tensor<float> SentenceEncoder::encode(const std::vector<std::string>& sentences, int64_t batch_size,
                                      const std::function<void(int64_t)>& progress) const {
  check(batch_size >= 1, "SentenceEncoder::encode: batch_size: expected >= 1, got ", batch_size);
  const auto n = static_cast<int64_t>(sentences.size());
  const int64_t H = dimension();
  // Tokenize everything first, then batch the longest first (sentence-transformers sorts by
  // length too), so each batch pads little.
  std::vector<std::vector<int64_t>> ids(sentences.size());
  for (size_t i = 0; i < sentences.size(); ++i) ids[i] = tokenizer_.encode(sentences[i], max_seq_length_);
  std::vector<int64_t> order(sentences.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a].size() > ids[b].size(); });
  const auto pad = tokenizer_.token_to_id(tokenizer_.config().pad_token);
  Tensor<float> out({n, H});
  for (int64_t b0 = 0; b0 < n; b0 += batch_size) {
    const int64_t count = std::min(batch_size, n - b0);
    const auto longest = static_cast<int64_t>(ids[order[b0]].size());
    TokenizedBatch batch{Tensor<int64_t>({count, longest}), Tensor<int64_t>({count, longest})};
    for (int64_t i = 0; i < count; ++i) {
      const auto& row = ids[order[b0 + i]];
      for (int64_t l = 0; l < longest; ++l) {
        const bool real = l < static_cast<int64_t>(row.size());
        batch.input_ids[i * longest + l] = real ? row[l] : *pad;
        batch.attention_mask[i * longest + l] = real ? 1 : 0;
      }
    }
    const Tensor<float> embeddings = encode_tokens(batch);
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(embeddings.data() + i * H, H, out.data() + order[b0 + i] * H);
    if (progress) progress(b0 + count);
  }
  return out;
}

}  // namespace mha::models
