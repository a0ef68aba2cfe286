// Tutorial 002's models, done right, on a batch of 28×28 "images" read as 28 tokens of 28
// features:
//   (a) SelfAttention: one head, softmax(q kᵀ / sqrt(d_kq)) v with d_kq = embed_dim = 28;
//   (b) multi-head self-attention with a residual, x + MHA(x, x, x), 4 heads of head_dim 7;
//   (c) MultiHeadSelfAttentionClassifier: (b) → mean over the 28 positions → fc1 (28 → 128) →
//       ReLU → fc2 (128 → 10) logits.
// Forward only (the weights are untrained, so the predicted classes mean nothing yet); the models
// are Modules with parameters() and every layer used has a backward, so they can be trained later.
//
// What the tutorial gets wrong and this does not: kᵀ is the transpose of the last two dimensions
// (the tutorial's key.T reverses all three of a batched tensor), the scale is a float computed from
// the head size (torch.sqrt of a Python int is a TypeError), and the multi-head scale is
// 1/sqrt(head_dim). Checked against the plain formula written out below. Also shown: with no
// positional encoding the classifier cannot see the order of the rows (reversing them changes
// nothing).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mha/attention/attention.h"
#include "mha/nn/linear.h"
#include "mha/nn/multihead_attention.h"
#include "mha/nn/relu.h"
#include "support/example_files.h"
#include "support/plain_math.h"

namespace {

namespace plain = mha::examples::plain;
using mha::Shape;
using mha::Tensor;

constexpr int64_t kBatch = 4, kImageSize = 28;  // rows are tokens, columns are features
constexpr int64_t kSeqLen = kImageSize, kEmbedDim = kImageSize, kNumHeads = 4, kHiddenDim = 128,
                  kNumClasses = 10;
constexpr int64_t kHeadDim = kEmbedDim / kNumHeads;
constexpr uint64_t kSeed = 0;

void print_shape(const char* stage, const Shape& shape) {
  std::printf("  %-62s %s\n", stage, mha::to_string(shape).c_str());
}

// (a) The tutorial's SelfAttention: K, Q, V projections and one head of size d_kq = embed_dim; no
// output projection (one head has nothing to mix). Parameter names K, Q, V as in the tutorial.
struct SelfAttention : mha::nn::Module<float> {
  mha::Generator init{kSeed};
  mha::nn::Linear<float> K{kEmbedDim, kEmbedDim, init}, Q{kEmbedDim, kEmbedDim, init},
      V{kEmbedDim, kEmbedDim, init};

  std::vector<mha::nn::Parameter<float>> parameters() override {
    std::vector<mha::nn::Parameter<float>> out;
    append_prefixed(out, K.parameters(), "K");
    append_prefixed(out, Q.parameters(), "Q");
    append_prefixed(out, V.parameters(), "V");
    return out;
  }

  // x (N, L, E) → (N, L, E).
  Tensor<float> forward(const Tensor<float>& x, bool print_stages = false) const {
    // SDPA takes (N, heads, L, d): one head is a size-1 head dimension.
    const Tensor<float> key = mha::unsqueeze(K.forward(x), 1), query = mha::unsqueeze(Q.forward(x), 1),
                        value = mha::unsqueeze(V.forward(x), 1);
    mha::attention::Options<float> options;
    options.scale = 1.0 / std::sqrt(static_cast<double>(kEmbedDim));  // d_kq = embed_dim for one head
    options.need_weights = print_stages;
    auto result = mha::attention::sdpa_forward(query, key, value, options);
    Tensor<float> out = mha::squeeze(result.output, 1);
    if (print_stages) {
      print_shape("x (N, L, E)", x.shape());
      print_shape("key, query, value = K(x), Q(x), V(x) (N, L, d_kq)", mha::squeeze(key, 1).shape());
      print_shape("query @ key.transpose(-2, -1) / sqrt(d_kq), softmax (N, L, L)",
                  mha::squeeze(*result.weights, 1).shape());
      print_shape("weights @ value (N, L, E)", out.shape());
    }
    return out;
  }
};

// (c) The classifier, with (b) inside. The tutorial's query/key/value/fc layers are
// nn.MultiheadAttention's in_proj (q, k, v rows) and out_proj; the PyTorch twin checks that
// mapping against the tutorial's own MultiHeadSelfAttention.
struct MultiHeadSelfAttentionClassifier : mha::nn::Module<float> {
  mha::nn::MultiheadAttention<float> attention;
  mha::Generator init{kSeed + 2};
  mha::nn::Linear<float> fc1{kEmbedDim, kHiddenDim, init}, fc2{kHiddenDim, kNumClasses, init};
  mha::nn::ReLU<float> relu;

  MultiHeadSelfAttentionClassifier() : attention(attention_options(), kSeed + 1) {}

  static mha::nn::MultiheadAttentionOptions attention_options() {
    mha::nn::MultiheadAttentionOptions options;
    options.embed_dim = kEmbedDim;
    options.num_heads = kNumHeads;
    options.batch_first = true;  // images are (N, rows, columns)
    return options;
  }

  std::vector<mha::nn::Parameter<float>> parameters() override {
    std::vector<mha::nn::Parameter<float>> out;
    append_prefixed(out, attention.parameters(), "attention");
    append_prefixed(out, fc1.parameters(), "fc1");
    append_prefixed(out, fc2.parameters(), "fc2");
    return out;
  }

  struct Stages {
    Tensor<float> attention_output;  // (N, L, E): x + MHA(x, x, x)
    Tensor<float> logits;            // (N, classes)
  };

  Stages forward(const Tensor<float>& x, bool print_stages = false) {
    mha::nn::MultiheadAttentionArgs<float> args;
    args.need_weights = print_stages;
    args.average_attn_weights = false;  // per head, to show the shape
    const auto attended = attention.forward(x, x, x, args);
    Stages s;
    s.attention_output = x;
    for (int64_t i = 0; i < x.numel(); ++i) s.attention_output[i] += attended.output[i];  // residual

    // Mean over the positions: (N, L, E) → (N, E).
    const int64_t n_batch = x.size(0), len = x.size(1);
    Tensor<float> pooled({n_batch, kEmbedDim});
    for (int64_t n = 0; n < n_batch; ++n)
      for (int64_t e = 0; e < kEmbedDim; ++e) {
        double sum = 0;
        for (int64_t t = 0; t < len; ++t) sum += s.attention_output[(n * len + t) * kEmbedDim + e];
        pooled[n * kEmbedDim + e] = static_cast<float>(sum / static_cast<double>(len));
      }
    const Tensor<float> hidden = relu.forward(fc1.forward(pooled));
    s.logits = fc2.forward(hidden);
    if (print_stages) {
      print_shape("x (N, L, E)", x.shape());
      print_shape("q, k, v = in_proj(x) (N, L, E)", x.shape());
      print_shape("split into heads (N, H, L, head_dim)", {n_batch, kNumHeads, len, kHeadDim});
      print_shape("q k^T / sqrt(head_dim), softmax (N, H, L, L)", attended.attn_weights->shape());
      print_shape("weights @ v, heads merged, out_proj (N, L, E)", attended.output.shape());
      print_shape("+ x (residual) = attention_output (N, L, E)", s.attention_output.shape());
      print_shape("mean over positions (N, E)", pooled.shape());
      print_shape("fc1, ReLU (N, hidden)", hidden.shape());
      print_shape("fc2 = logits (N, classes)", s.logits.shape());
    }
    return s;
  }
};

// Both models in one state dict, as the PyTorch twin's module with children `single_head` and
// `classifier` (scripts/goldens/examples/attention_classifier.py).
struct TutorialModels : mha::nn::Module<float> {
  SelfAttention single_head;
  MultiHeadSelfAttentionClassifier classifier;

  std::vector<mha::nn::Parameter<float>> parameters() override {
    std::vector<mha::nn::Parameter<float>> out;
    append_prefixed(out, single_head.parameters(), "single_head");
    append_prefixed(out, classifier.parameters(), "classifier");
    return out;
  }
};

// softmax(q kᵀ / sqrt(d)) v for one head: q, k, v (L, d) row-major → (L, d).
std::vector<double> plain_head(const std::vector<double>& q, const std::vector<double>& k,
                               const std::vector<double>& v, int64_t len, int64_t d) {
  std::vector<double> out(static_cast<size_t>(len * d));
  for (int64_t i = 0; i < len; ++i) {
    std::vector<double> p(static_cast<size_t>(len));
    for (int64_t j = 0; j < len; ++j)
      p[static_cast<size_t>(j)] = plain::dot(&q[static_cast<size_t>(i * d)], &k[static_cast<size_t>(j * d)], d) /
                                  std::sqrt(static_cast<double>(d));
    plain::softmax(p);
    for (int64_t j = 0; j < len; ++j)
      for (int64_t c = 0; c < d; ++c)
        out[static_cast<size_t>(i * d + c)] += p[static_cast<size_t>(j)] * v[static_cast<size_t>(j * d + c)];
  }
  return out;
}

struct PlainResults {
  std::vector<double> single_head_output, attention_output, logits;
};

// All three models written out in double, image by image, straight from the state dict.
PlainResults plain_models(const Tensor<float>& images, const mha::nn::StateDict<float>& state) {
  const int64_t L = kSeqLen, E = kEmbedDim, d = kHeadDim;
  auto p = [&](const std::string& name) -> const Tensor<float>& { return state.at(name); };
  PlainResults r;
  for (int64_t n = 0; n < images.size(0); ++n) {
    const std::vector<double> x(images.values().begin() + n * L * E,
                                images.values().begin() + (n + 1) * L * E);
    // (a) one head of size E.
    const auto single =
        plain_head(plain::linear(x, L, E, p("single_head.Q.weight"), p("single_head.Q.bias"), 0, E),
                   plain::linear(x, L, E, p("single_head.K.weight"), p("single_head.K.bias"), 0, E),
                   plain::linear(x, L, E, p("single_head.V.weight"), p("single_head.V.bias"), 0, E), L, E);
    r.single_head_output.insert(r.single_head_output.end(), single.begin(), single.end());
    // (b) head h projects with rows [h·d, (h+1)·d) of the q, k and v blocks of in_proj_weight.
    const Tensor<float>&w_in = p("classifier.attention.in_proj_weight"),
          &b_in = p("classifier.attention.in_proj_bias");
    std::vector<double> merged(static_cast<size_t>(L * E));
    for (int64_t h = 0; h < kNumHeads; ++h) {
      const auto head = plain_head(plain::linear(x, L, E, w_in, b_in, h * d, d),
                                   plain::linear(x, L, E, w_in, b_in, E + h * d, d),
                                   plain::linear(x, L, E, w_in, b_in, 2 * E + h * d, d), L, d);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t c = 0; c < d; ++c)
          merged[static_cast<size_t>(t * E + h * d + c)] = head[static_cast<size_t>(t * d + c)];
    }
    auto attended = plain::linear(merged, L, E, p("classifier.attention.out_proj.weight"),
                                  p("classifier.attention.out_proj.bias"), 0, E);
    for (size_t i = 0; i < attended.size(); ++i) attended[i] += x[i];  // residual
    r.attention_output.insert(r.attention_output.end(), attended.begin(), attended.end());
    // (c) mean over positions, fc1, ReLU, fc2.
    std::vector<double> pooled(static_cast<size_t>(E));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t e = 0; e < E; ++e)
        pooled[static_cast<size_t>(e)] += attended[static_cast<size_t>(t * E + e)] / L;
    auto hidden =
        plain::linear(pooled, 1, E, p("classifier.fc1.weight"), p("classifier.fc1.bias"), 0, kHiddenDim);
    for (auto& h : hidden) h = std::max(h, 0.0);
    const auto logits = plain::linear(hidden, 1, kHiddenDim, p("classifier.fc2.weight"),
                                      p("classifier.fc2.bias"), 0, kNumClasses);
    r.logits.insert(r.logits.end(), logits.begin(), logits.end());
  }
  return r;
}

double max_abs_diff(const Tensor<float>& ours, const std::vector<double>& expected, double& max_value) {
  double m = 0;
  for (int64_t i = 0; i < ours.numel(); ++i) {
    m = std::max(m, std::abs(ours[i] - expected[static_cast<size_t>(i)]));
    max_value = std::max(max_value, std::abs(expected[static_cast<size_t>(i)]));
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const char* description =
      "The tutorial's single-head self-attention and multi-head self-attention classifier on "
      "28x28 images read as 28 tokens of 28 features (forward).";
  return mha::examples::example_main(argc, argv, description, /*draws=*/false, [](const auto& files) {
    TutorialModels models;
    files.load_weights(models);
    models.classifier.attention.eval();  // no dropout in the attention (its p is 0 anyway)

    // Images: (N, 28, 28) pixel intensities in [0, 1).
    mha::Generator gen(kSeed + 3);
    Tensor<float> random_images({kBatch, kImageSize, kImageSize});
    for (auto& v : random_images.values()) v = static_cast<float>(gen.uniform());
    const Tensor<float> images = files.input("images", random_images);
    std::printf("Attention classifier on %lld images of %lldx%lld: rows are tokens, columns features\n",
                static_cast<long long>(images.size(0)), static_cast<long long>(kImageSize),
                static_cast<long long>(kImageSize));

    std::printf("\n(a) Single-head self-attention (d_kq = embed_dim = %lld, scale 1/sqrt(%lld)):\n",
                static_cast<long long>(kEmbedDim), static_cast<long long>(kEmbedDim));
    const Tensor<float> single_head_output = models.single_head.forward(images, true);

    std::printf(
        "\n(b, c) Multi-head self-attention with residual, then the classifier "
        "(%lld heads of head_dim %lld, scale 1/sqrt(%lld)):\n",
        static_cast<long long>(kNumHeads), static_cast<long long>(kHeadDim),
        static_cast<long long>(kHeadDim));
    const auto stages = models.classifier.forward(images, true);

    std::printf("\nLogits (untrained weights, so the classes are arbitrary):\n");
    for (int64_t n = 0; n < images.size(0); ++n) {
      std::printf("  image %lld:", static_cast<long long>(n));
      int64_t predicted = 0;
      for (int64_t c = 0; c < kNumClasses; ++c) {
        const float logit = stages.logits[n * kNumClasses + c];
        std::printf(" %7.3f", logit);
        if (logit > stages.logits[n * kNumClasses + predicted]) predicted = c;
      }
      std::printf("  -> class %lld\n", static_cast<long long>(predicted));
    }
    files.save({{"single_head_output", single_head_output},
                {"attention_output", stages.attention_output},
                {"logits", stages.logits}});

    // No positional encoding: self-attention is permutation-equivariant and the mean is
    // permutation-invariant, so the image upside down (rows reversed) gets the same logits.
    Tensor<float> flipped(images.shape());
    const int64_t row = kImageSize;
    for (int64_t n = 0; n < images.size(0); ++n)
      for (int64_t t = 0; t < kSeqLen; ++t)
        std::copy_n(images.data() + (n * kSeqLen + t) * row, row,
                    flipped.data() + (n * kSeqLen + kSeqLen - 1 - t) * row);
    const Tensor<float> flipped_logits = models.classifier.forward(flipped).logits;
    double flip_change = 0, logit_scale = 0;
    for (int64_t i = 0; i < stages.logits.numel(); ++i) {
      flip_change =
          std::max(flip_change, std::abs(static_cast<double>(flipped_logits[i]) - stages.logits[i]));
      logit_scale = std::max(logit_scale, std::abs(static_cast<double>(stages.logits[i])));
    }
    std::printf(
        "\nRows reversed (image upside down): max |logit change| = %.3g; without positional encoding "
        "the classifier cannot see row order\n",
        flip_change);

    // float32 against the double formula: sums of at most 128 products and a softmax, so a few
    // float epsilons times the magnitude.
    const PlainResults expected = plain_models(images, models.state_dict());
    bool ok = flip_change <= 1e-5 * std::max(1.0, logit_scale);
    const std::pair<const char*, std::pair<const Tensor<float>*, const std::vector<double>*>> checks[] = {
        {"single_head_output", {&single_head_output, &expected.single_head_output}},
        {"attention_output", {&stages.attention_output, &expected.attention_output}},
        {"logits", {&stages.logits, &expected.logits}}};
    std::printf("\nCheck against the plain formula (double):\n");
    for (const auto& [name, pair] : checks) {
      double max_value = 0;
      const double error = max_abs_diff(*pair.first, *pair.second, max_value);
      const bool good = error <= 1e-5 * std::max(1.0, max_value);
      std::printf("  %-20s max |model - formula| = %.3g (max |value| %.3g): %s\n", name, error, max_value,
                  good ? "OK" : "MISMATCH");
      ok = ok && good;
    }
    std::printf("\n%s\n", ok ? "All checks OK" : "MISMATCH");
    return ok ? 0 : 1;
  });
}
