// The first tutorial's scenario, done right: "this is an example sentence" through a toy
// tokenizer, padded to 10 tokens, a 512-wide embedding and 8-head self-attention.
//
// What the tutorial gets wrong and this does not: the padding tokens are masked out of the keys
// (key_padding_mask) instead of being attended to like words, and the module is checked against
// the plain formula, softmax(q kᵀ / sqrt(head_dim)) v, written out below, through both attention
// backends (the row-by-row reference and the fused cpu_flash kernel).
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mha/nn/embedding.h"
#include "mha/nn/multihead_attention.h"
#include "support/example_files.h"
#include "support/plain_math.h"

namespace {

namespace plain = mha::examples::plain;
using mha::Shape;
using mha::Tensor;

constexpr int64_t kMaxLen = 10, kEmbedDim = 512, kNumHeads = 8, kVocabSize = 6;

// Word → id; unknown words → 0, which is also the padding id.
std::vector<int64_t> tokenize(const std::string& sentence) {
  const std::map<std::string, int64_t> vocabulary{
      {"this", 1}, {"is", 2}, {"an", 3}, {"example", 4}, {"sentence", 5}};
  std::vector<int64_t> ids;
  std::istringstream words(sentence);
  for (std::string w; words >> w;) {
    for (auto& ch : w) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    auto it = vocabulary.find(w);
    ids.push_back(it == vocabulary.end() ? 0 : it->second);
  }
  return ids;
}

// The tutorial's model: an embedding table and one multi-head self-attention layer.
// Parameter names as a PyTorch module with children `embedding` and `attention` would have.
struct SentenceModel : mha::nn::Module<float> {
  mha::Generator gen{0};
  mha::nn::Embedding<float> embedding{kVocabSize, kEmbedDim, /*padding_idx=*/0, gen};
  mha::nn::MultiheadAttention<float> attention;

  explicit SentenceModel(const mha::nn::MultiheadAttentionOptions& options)
      : attention(options, /*seed=*/1) {}
  std::vector<mha::nn::Parameter<float>> parameters() override {
    std::vector<mha::nn::Parameter<float>> out;
    append_prefixed(out, embedding.parameters(), "embedding");
    append_prefixed(out, attention.parameters(), "attention");
    return out;
  }
};

void print_shape(const char* stage, const Shape& shape) {
  std::printf("  %-38s %s\n", stage, mha::to_string(shape).c_str());
}

// softmax(q kᵀ / sqrt(d) + mask) v for every head, in double, straight from the state dict:
// the formula the module must reproduce. x (L, E) is one sequence; returns (L, E).
std::vector<double> plain_attention(const Tensor<float>& x, const std::vector<bool>& is_padding,
                                    mha::nn::StateDict<float>& state) {
  const int64_t L = kMaxLen, E = kEmbedDim, H = kNumHeads, d = E / H;
  const Tensor<float>& w_in = state.at("in_proj_weight");  // rows: q, then k, then v
  const Tensor<float>& b_in = state.at("in_proj_bias");
  auto linear = [&](const std::vector<double>& in, const Tensor<float>& w, const Tensor<float>& b, int64_t row0) {
    return plain::linear(in, L, E, w, b, row0, E);
  };
  std::vector<double> input(x.values().begin(), x.values().end());
  const auto q = linear(input, w_in, b_in, 0), k = linear(input, w_in, b_in, E),
             v = linear(input, w_in, b_in, 2 * E);
  std::vector<double> heads_out(static_cast<size_t>(L * E));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> p(static_cast<size_t>(L));
      for (int64_t j = 0; j < L; ++j) {
        const double s = plain::dot(&q[static_cast<size_t>(i * E + h * d)], &k[static_cast<size_t>(j * E + h * d)], d);
        p[static_cast<size_t>(j)] =
            is_padding[static_cast<size_t>(j)] ? -std::numeric_limits<double>::infinity() : s / std::sqrt(double(d));
      }
      plain::softmax(p);
      for (int64_t j = 0; j < L; ++j)
        for (int64_t c = 0; c < d; ++c)
          heads_out[static_cast<size_t>(i * E + h * d + c)] +=
              p[static_cast<size_t>(j)] * v[static_cast<size_t>(j * E + h * d + c)];
    }
  return linear(heads_out, state.at("out_proj.weight"), state.at("out_proj.bias"), 0);
}

}  // namespace

int main(int argc, char** argv) {
  const char* description =
      "The first tutorial's sentence through an embedding and 8-head self-attention.";
  return mha::examples::example_main(argc, argv, description, /*draws=*/true, [](const auto& files) {
    const std::string sentence = "this is an example sentence";
    std::printf("Sentence self-attention: \"%s\"\n\n", sentence.c_str());

    // 1. Tokenize and pad to kMaxLen with id 0.
    std::vector<int64_t> ids = tokenize(sentence);
    const auto words = static_cast<int64_t>(ids.size());
    ids.resize(kMaxLen, 0);
    std::printf("  token ids: ");
    for (int64_t id : ids) std::printf("%lld ", static_cast<long long>(id));
    std::printf("(%lld words, %lld padding)\n", static_cast<long long>(words),
                static_cast<long long>(kMaxLen - words));
    Tensor<int64_t> tokens({1, kMaxLen}, std::span<const int64_t>(ids));

    // 2. The model: self-attention batch_first like the tutorial's input.
    mha::nn::MultiheadAttentionOptions options;
    options.embed_dim = kEmbedDim;
    options.num_heads = kNumHeads;
    options.batch_first = true;
    SentenceModel model(options);
    files.load_weights(model);
    model.eval();
    mha::nn::MultiheadAttention<float>& attention = model.attention;

    // 3. Embed: (1, L) → (1, L, E). Id 0 is padding, so its embedding row is zero and untrained.
    const Tensor<float> x = model.embedding.forward(tokens);
    print_shape("encoded sentence (N, L)", tokens.shape());
    print_shape("embedded sentence (N, L, E)", x.shape());

    // 4. Attention with the padding masked out of the keys.
    Tensor<bool> is_padding({1, kMaxLen});
    for (int64_t j = words; j < kMaxLen; ++j) is_padding[j] = true;
    mha::nn::MultiheadAttentionArgs<float> args;
    args.key_padding_mask = is_padding;
    args.average_attn_weights = false;  // per-head weights (N, H, L, S)
    const int64_t head_dim = kEmbedDim / kNumHeads;
    print_shape("q, k, v after projection (N, L, E)", {1, kMaxLen, kEmbedDim});
    print_shape("split into heads (N, H, L, head_dim)", {1, kNumHeads, kMaxLen, head_dim});
    const auto result = attention.forward(x, x, x, args);
    const Tensor<float>& weights = *result.attn_weights;
    print_shape("scores, weights (N, H, L, S)", weights.shape());
    print_shape("heads merged, out_proj (N, L, E)", result.output.shape());

    // 5. One head's weights: rows are queries, columns keys; padding columns are 0.
    const int64_t head = 0;
    std::printf("\nAttention weights of head %lld (scale 1/sqrt(head_dim) = 1/sqrt(%lld)):\n       ",
                static_cast<long long>(head), static_cast<long long>(head_dim));
    for (int64_t j = 0; j < kMaxLen; ++j) std::printf("  key%-2lld", static_cast<long long>(j));
    std::printf("\n");
    for (int64_t i = 0; i < kMaxLen; ++i) {
      std::printf("  q%-3lld", static_cast<long long>(i));
      for (int64_t j = 0; j < kMaxLen; ++j)
        std::printf(" %6.3f", weights[(head * kMaxLen + i) * kMaxLen + j]);
      std::printf("\n");
    }

    // 6. The module against the plain formula on the same input and weights.
    files.save({{"embedded", x}, {"output", result.output}, {"attn_weights", weights}});
    std::vector<std::string> token_strings;
    std::istringstream words_in(sentence);
    for (std::string w; words_in >> w;) token_strings.push_back(w);
    token_strings.resize(kMaxLen, "<pad>");
    mha::viz::HeatmapOptions picture;
    picture.query_tokens = picture.key_tokens = token_strings;
    picture.title = "\"" + sentence + "\": 8 heads, padding masked";
    files.draw(weights.reshape({kNumHeads, kMaxLen, kMaxLen}), picture);
    auto state = attention.state_dict();
    std::vector<bool> padding(static_cast<size_t>(kMaxLen));
    for (int64_t j = 0; j < kMaxLen; ++j) padding[static_cast<size_t>(j)] = is_padding[j];
    const std::vector<double> expected = plain_attention(x.reshape({kMaxLen, kEmbedDim}), padding, state);
    double max_value = 0;
    for (double e : expected) max_value = std::max(max_value, std::abs(e));
    auto error_of = [&](const Tensor<float>& output) {
      double worst = 0;
      for (int64_t i = 0; i < output.numel(); ++i)
        worst = std::max(worst, std::abs(output[i] - expected[static_cast<size_t>(i)]));
      return worst;
    };
    const double max_error = error_of(result.output);
    // float32 module vs double formula: a sum of 512 products per projection, so a few float
    // epsilons times the magnitude is the honest expectation.
    const bool ok = max_error <= 1e-5 * std::max(1.0, max_value);
    std::printf(
        "\nCheck against the plain formula (double): max |module - formula| = %.3g (max |output| %.3g): %s\n",
        max_error, max_value, ok ? "OK" : "MISMATCH");

    // 7. The two attention backends on the same input: the row-by-row reference and the fused
    // tiled cpu_flash kernel (the default for float). Each against the formula; the fast one
    // must stay within FlashAttention's rule: twice the reference's error, plus 1e-6·max.
    std::printf("\nBackends, each against the formula:\n");
    double backend_error[2] = {0, 0};
    const mha::attention::Backend backends[2] = {mha::attention::Backend::reference,
                                                 mha::attention::Backend::cpu_flash};
    const char* names[2] = {"reference", "cpu_flash"};
    for (int b = 0; b < 2; ++b) {
      attention.backend = backends[b];
      backend_error[b] = error_of(attention.forward(x, x, x, args).output);
      std::printf("  %-10s max |output - formula| = %.3g\n", names[b], backend_error[b]);
    }
    attention.backend = mha::attention::Backend::automatic;
    const bool backends_ok = backend_error[1] <= 2 * backend_error[0] + 1e-6 * std::max(1.0, max_value);
    std::printf("  cpu_flash within 2 x the reference's error + 1e-6 x max: %s\n", backends_ok ? "OK" : "MISMATCH");
    return ok && backends_ok ? 0 : 1;
  });
}
