// Token-by-token generation with a KV cache: a small decoder-only model (token embedding, causal
// pre-norm blocks of MultiheadAttention and a GELU MLP, a final LayerNorm, logits through the
// output projection) picks each next token greedily.
//
//   with the cache     each step runs only the new token: its keys and values are appended to
//                      every layer's KVCache and it attends over them (forward_cached)
//   without the cache  each step runs the whole sequence again with a causal mask (forward)
//
// Every step checks that the two give the same logits (FlashAttention's rule: the cached step's
// error against a double recompute at most twice the float recompute's, + 1e-5 on the logits'
// scale) and the same token; then both loops are timed and tokens/s printed. The weights are
// random (seeded): the tokens are arbitrary, the agreement and the speed are the point.
//
//   generate [--tokens N] [--prompt N] [--layers N] [--cache float32|bfloat16|float16]
// With a bfloat16 or float16 cache the cached logits carry the rounding of the stored keys and
// values; the check is then the cache's own bar (relative error of a few units of its rounding).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "mha/core/error.h"
#include "mha/core/half.h"
#include "mha/core/random.h"
#include "mha/nn/gelu.h"
#include "mha/nn/kv_cache.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/linear.h"
#include "mha/nn/multihead_attention.h"

namespace {

using mha::Shape;
using mha::Tensor;
namespace nn = mha::nn;

constexpr int64_t kVocab = 512, kEmbed = 256, kHeads = 8, kHidden = 4 * kEmbed;

// One pre-norm block: x + attn(LN1(x)), then + W2·GELU(W1·LN2(x)). Templated on the scalar so the
// check can rerun the model in double with the same weights.
template <class T>
struct Block {
  nn::LayerNorm<T> ln1{kEmbed}, ln2{kEmbed};
  nn::MultiheadAttention<T> attn;
  std::unique_ptr<nn::Linear<T>> fc1, fc2;
  Block(mha::Generator& gen, uint64_t seed) : attn(attention_options(), seed) {
    fc1 = std::make_unique<nn::Linear<T>>(kEmbed, kHidden, gen);
    fc2 = std::make_unique<nn::Linear<T>>(kHidden, kEmbed, gen);
    attn.eval();
  }
  static nn::MultiheadAttentionOptions attention_options() {
    nn::MultiheadAttentionOptions o;
    o.embed_dim = kEmbed;
    o.num_heads = kHeads;
    o.batch_first = false;  // unbatched (T, E) input
    return o;
  }
  std::vector<Tensor<T>*> parameters() {
    std::vector<Tensor<T>*> out;
    for (nn::Module<T>* m : std::initializer_list<nn::Module<T>*>{&ln1, &ln2, &attn, fc1.get(), fc2.get()})
      for (auto& p : m->parameters()) out.push_back(p.value);
    return out;
  }
  Tensor<T> mlp(const Tensor<T>& x) const {
    return fc2->forward(nn::GELU<T>().forward(fc1->forward(ln2.forward(x))));
  }
};

template <class T>
Tensor<T> add(Tensor<T> a, const Tensor<T>& b) {
  for (int64_t i = 0; i < a.numel(); ++i) a[i] += b[i];
  return a;
}

template <class T>
struct Model {
  Tensor<T> embedding, unembedding;  // (vocab, E) each: token vectors in, logits out
  std::vector<std::unique_ptr<Block<T>>> blocks;
  nn::LayerNorm<T> final_norm{kEmbed};

  explicit Model(int64_t layers) {
    mha::Generator gen(2026);
    embedding = Tensor<T>({kVocab, kEmbed});
    unembedding = Tensor<T>({kVocab, kEmbed});
    for (auto& x : embedding.values()) x = static_cast<T>(gen.normal(0.0, 1.0));
    for (auto& x : unembedding.values()) x = static_cast<T>(gen.normal(0.0, 1.0));
    for (int64_t l = 0; l < layers; ++l) blocks.push_back(std::make_unique<Block<T>>(gen, 100 + static_cast<uint64_t>(l)));
  }
  // Copies every parameter of `other` (another scalar type).
  template <class U>
  void copy_from(Model<U>& other) {
    embedding = mha::cast<T>(other.embedding);
    unembedding = mha::cast<T>(other.unembedding);
    for (size_t l = 0; l < blocks.size(); ++l) {
      auto to = blocks[l]->parameters();
      auto from = other.blocks[l]->parameters();
      for (size_t i = 0; i < to.size(); ++i) *to[i] = mha::cast<T>(*from[i]);
    }
  }
  Tensor<T> embed(const std::vector<int64_t>& tokens, size_t from) const {
    Tensor<T> x({static_cast<int64_t>(tokens.size() - from), kEmbed});
    for (size_t t = from; t < tokens.size(); ++t)
      std::copy_n(embedding.data() + tokens[t] * kEmbed, kEmbed, x.data() + static_cast<int64_t>(t - from) * kEmbed);
    return x;
  }
  // Logits (vocab) of the last row of x (T, E).
  std::vector<double> logits(const Tensor<T>& x) const {
    const Tensor<T> h = final_norm.forward(x);
    const T* last = h.data() + (h.size(0) - 1) * kEmbed;
    std::vector<double> out(kVocab);
    for (int64_t v = 0; v < kVocab; ++v) {
      double s = 0;
      for (int64_t e = 0; e < kEmbed; ++e) s += static_cast<double>(last[e]) * static_cast<double>(unembedding[v * kEmbed + e]);
      out[static_cast<size_t>(v)] = s;
    }
    return out;
  }

  // Without the cache: the whole sequence through every block, causal mask.
  std::vector<double> recompute(const std::vector<int64_t>& tokens) {
    Tensor<T> x = embed(tokens, 0);
    const int64_t len = x.size(0);
    Tensor<bool> blocked({len, len});
    for (int64_t i = 0; i < len; ++i)
      for (int64_t j = i + 1; j < len; ++j) blocked[i * len + j] = true;
    nn::MultiheadAttentionArgs<T> args;
    args.need_weights = false;
    args.attn_mask = blocked;
    args.is_causal = true;
    for (auto& b : blocks) {
      const Tensor<T> n = b->ln1.forward(x);
      x = add(std::move(x), b->attn.forward(n, n, n, args).output);
      x = add(x, b->mlp(x));
    }
    return logits(x);
  }

  // With the cache: only tokens[from..] run; their keys and values join each layer's cache.
  template <class Kv>
  std::vector<double> step(const std::vector<int64_t>& tokens, size_t from, std::vector<nn::KVCache<Kv>>& caches) {
    Tensor<T> x = embed(tokens, from);
    for (size_t l = 0; l < blocks.size(); ++l) {
      auto& b = *blocks[l];
      x = add(std::move(x), b.attn.forward_cached(b.ln1.forward(x), caches[l]));
      x = add(x, b.mlp(x));
    }
    return logits(x);
  }
};

int64_t argmax(const std::vector<double>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

double max_abs(const std::vector<double>& a) {
  double worst = 0;
  for (double x : a) worst = std::max(worst, std::abs(x));
  return worst;
}

template <class Kv>
int run(int64_t new_tokens, int64_t prompt_len, int64_t layers) {
  Model<float> model(layers);
  Model<double> model64(layers);
  model64.copy_from(model);
  const int64_t capacity = prompt_len + new_tokens;
  std::printf("A decoder-only model: vocab %lld, %lld layers of %lld-wide attention (%lld heads) + MLP %lld; "
              "KV cache in %s\n",
              static_cast<long long>(kVocab), static_cast<long long>(layers), static_cast<long long>(kEmbed),
              static_cast<long long>(kHeads), static_cast<long long>(kHidden), mha::storage_name<Kv>());
  std::vector<int64_t> prompt;
  for (int64_t t = 0; t < prompt_len; ++t) prompt.push_back((t * 37 + 11) % kVocab);

  // 1. Generate with the cache, checking every step against the recompute in float and double.
  auto make_caches = [&] {
    std::vector<nn::KVCache<Kv>> caches;
    for (int64_t l = 0; l < layers; ++l) caches.emplace_back(1, kHeads, capacity, kEmbed / kHeads, kEmbed / kHeads);
    return caches;
  };
  std::vector<nn::KVCache<Kv>> caches = make_caches();
  std::vector<int64_t> tokens = prompt;
  double worst_ratio = 0;
  bool ok = true;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const size_t from = i == 0 ? 0 : tokens.size() - 1;  // the prompt at once, then one token a step
    const std::vector<double> cached = model.step(tokens, from, caches);
    const std::vector<double> full = model.recompute(tokens), full64 = model64.recompute(tokens);
    const double error = max_diff(cached, full64), float_error = max_diff(full, full64);
    const double scale = std::max(1.0, max_abs(full64));
    // float cache: FlashAttention's rule; half cache: a few units of its rounding (2⁻⁸ bfloat16,
    // 2⁻¹¹ float16) relative to the logits' size.
    const double allowed = std::is_same_v<Kv, float> ? 2 * float_error + 1e-5 * scale
                                                      : 4 * (std::is_same_v<Kv, mha::bfloat16> ? 0x1p-8 : 0x1p-11) * scale;
    worst_ratio = std::max(worst_ratio, error / allowed);
    const int64_t next = argmax(cached);
    if (error > allowed || (std::is_same_v<Kv, float> && next != argmax(full))) {
      std::printf("step %lld: cached logits differ from the recompute by %.3g (allowed %.3g), token %lld vs %lld\n",
                  static_cast<long long>(i), error, allowed, static_cast<long long>(next),
                  static_cast<long long>(argmax(full)));
      ok = false;
    }
    tokens.push_back(next);
  }
  std::printf("prompt (%lld tokens):", static_cast<long long>(prompt_len));
  for (int64_t t : prompt) std::printf(" %lld", static_cast<long long>(t));
  std::printf("\ngenerated (%lld tokens):", static_cast<long long>(new_tokens));
  for (size_t t = prompt.size(); t < tokens.size(); ++t) std::printf(" %lld", static_cast<long long>(tokens[t]));
  std::printf("\nevery step checked against the full recompute (float and double): largest error %.2f of the "
              "allowed\n", worst_ratio);

  // 2. Speed: the same tokens with and without the cache.
  using clock = std::chrono::steady_clock;
  auto start = clock::now();
  caches = make_caches();
  for (int64_t i = 0; i < new_tokens; ++i) {
    const size_t len = static_cast<size_t>(prompt_len + i + 1);
    const std::vector<int64_t> prefix(tokens.begin(), tokens.begin() + static_cast<int64_t>(len) - 1);
    (void)model.step(prefix, i == 0 ? 0 : prefix.size() - 1, caches);
  }
  const double with_cache = std::chrono::duration<double>(clock::now() - start).count();
  start = clock::now();
  for (int64_t i = 0; i < new_tokens; ++i) {
    const std::vector<int64_t> prefix(tokens.begin(), tokens.begin() + prompt_len + i);
    (void)model.recompute(prefix);
  }
  const double without = std::chrono::duration<double>(clock::now() - start).count();
  std::printf("%lld tokens after a %lld-token prompt: %.0f tokens/s with the cache, %.0f without (%.1fx)\n",
              static_cast<long long>(new_tokens), static_cast<long long>(prompt_len),
              static_cast<double>(new_tokens) / with_cache, static_cast<double>(new_tokens) / without,
              without / with_cache);
  std::printf(ok ? "OK: the cached generation matches the full recompute\n"
                 : "MISMATCH: the cached generation differs from the full recompute\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Greedy generation with a KV cache, checked against the full recompute at every step."};
  int64_t tokens = 48, prompt = 16, layers = 2;
  std::string cache = "float32";
  app.add_option("--tokens", tokens, "tokens to generate")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--prompt", prompt, "prompt length")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--layers", layers, "decoder blocks")->check(CLI::Range(1, 48))->capture_default_str();
  app.add_option("--cache", cache, "KV cache storage")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (cache == "bfloat16") return run<mha::bfloat16>(tokens, prompt, layers);
    if (cache == "float16") return run<mha::float16>(tokens, prompt, layers);
    return run<float>(tokens, prompt, layers);
  } catch (const mha::Error& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
}
