#include "mha/models/attention_classifier.h"

#include <cmath>
#include <string>
#include <variant>

namespace mha::models {
namespace {

const char* path_name(ComputePath path) { return path == ComputePath::fused ? "fused" : "module"; }

// The cache's state for one path, for a forward on `batch` inputs: the state it holds, its
// buffers kept for reuse, or a new one in place of an empty cache or the other path's state.
template <class State, class Cache>
State* start_state(Cache* cache, int64_t batch, size_t blocks) {
  if (!cache) return nullptr;
  State* state = std::get_if<State>(cache);
  if (!state) state = &cache->template emplace<State>();
  state->batch = batch;
  state->blocks.resize(blocks);
  return state;
}

}  // namespace

void AttentionClassifierConfig::check_valid() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"sequence_length", sequence_length}, {"input_dim", input_dim},     {"embed_dim", embed_dim},
      {"num_heads", num_heads},             {"hidden_dim", hidden_dim},   {"num_classes", num_classes},
      {"num_blocks", num_blocks}};
  for (const auto& [name, value] : sizes)
    check(value >= 1 && value <= (int64_t{1} << 20), "AttentionClassifier: ", name, ": expected 1 to ",
          int64_t{1} << 20, ", got ", value);
  check(embed_dim % num_heads == 0, "AttentionClassifier: embed_dim must be divisible by num_heads, got embed_dim ",
        embed_dim, " and num_heads ", num_heads);
  check(input_projection || embed_dim == input_dim, "AttentionClassifier: embed_dim: expected input_dim = ",
        input_dim, " without an input projection (enable input_projection for another width), got ", embed_dim);
  check(std::isfinite(dropout) && dropout >= 0 && dropout < 1,
        "AttentionClassifier: dropout: expected a probability in [0, 1), got ", dropout);
}

template <class T>
AttentionClassifier<T>::AttentionClassifier(const AttentionClassifierConfig& config, uint64_t seed, ComputePath path)
    : config_(config), path_(path), dropout_(config.dropout, seed ^ 0x64726f706f7574ull /* "dropout" */) {
  config_.check_valid();
  const int64_t L = config_.sequence_length, E = config_.embed_dim;
  // One stream for the layers in order; each attention block gets its own seed (its module
  // draws from its own generator).
  Generator gen(seed);
  if (config_.input_projection) input_projection_.emplace(config_.input_dim, E, gen);
  if (config_.learned_positions) {
    positions_ = Tensor<T>({1, L, E});
    for (auto& v : positions_.values()) v = narrow<T>(gen.normal(0.0, 0.02));
    grad_positions_ = Tensor<T>(positions_.shape());
  }
  nn::MultiheadAttentionOptions options;
  options.embed_dim = E;
  options.num_heads = config_.num_heads;
  options.batch_first = true;
  for (int64_t b = 0; b < config_.num_blocks; ++b) {
    Block block;
    if (config_.pre_norm) block.norm.emplace(E);
    block.attention = std::make_unique<nn::MultiheadAttention<T>>(options, seed + 1 + static_cast<uint64_t>(b));
    blocks_.push_back(std::move(block));
  }
  if (config_.pre_norm) norm_.emplace(E);
  fc1_.emplace(E, config_.hidden_dim, gen);
  fc2_.emplace(config_.hidden_dim, config_.num_classes, gen);
}

template <class T>
std::vector<nn::Parameter<T>> AttentionClassifier<T>::parameters() {
  std::vector<nn::Parameter<T>> out;
  if (input_projection_) this->append_prefixed(out, input_projection_->parameters(), "input_projection");
  if (config_.learned_positions) out.push_back({"positions", &positions_, &grad_positions_});
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const std::string prefix = "blocks." + std::to_string(b);
    if (blocks_[b].norm) this->append_prefixed(out, blocks_[b].norm->parameters(), prefix + ".norm");
    this->append_prefixed(out, blocks_[b].attention->parameters(), prefix + ".attention");
  }
  if (norm_) this->append_prefixed(out, norm_->parameters(), "norm");
  this->append_prefixed(out, fc1_->parameters(), "fc1");
  this->append_prefixed(out, fc2_->parameters(), "fc2");
  return out;
}

// ---- Module path: the layers' own forward and backward -------------------------------------

template <class T>
Tensor<T> AttentionClassifier<T>::module_forward(const Tensor<T>& x, ModuleCache* cache) {
  const int64_t N = x.size(0), L = config_.sequence_length, E = config_.embed_dim;
  Tensor<T> h = input_projection_ ? input_projection_->forward(x, cache ? &cache->input_projection : nullptr) : x;
  if (config_.learned_positions)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < L * E; ++i) h[n * L * E + i] += positions_[i];
  nn::MultiheadAttentionArgs<T> args;
  args.need_weights = false;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    Block& block = blocks_[b];
    typename ModuleCache::BlockCache* bc = cache ? &cache->blocks[b] : nullptr;
    const Tensor<T> a = block.norm ? block.norm->forward(h, bc ? &bc->norm : nullptr) : h;
    Tensor<T> y = block.attention->forward(a, a, a, args, bc ? &bc->attention : nullptr).output;
    for (int64_t i = 0; i < y.numel(); ++i) y[i] += h[i];  // the residual
    h = std::move(y);
  }
  if (norm_) h = norm_->forward(h, cache ? &cache->norm : nullptr);
  Tensor<T> pooled({N, E});  // mean over positions
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t t = 0; t < L; ++t)
      for (int64_t e = 0; e < E; ++e) pooled[n * E + e] += h[(n * L + t) * E + e];
    for (int64_t e = 0; e < E; ++e) pooled[n * E + e] /= static_cast<T>(L);
  }
  dropout_.train(this->is_training());
  Tensor<T> hidden = relu_.forward(fc1_->forward(pooled, cache ? &cache->fc1 : nullptr), cache ? &cache->relu : nullptr);
  hidden = dropout_.forward(hidden, cache ? &cache->dropout : nullptr);
  return fc2_->forward(hidden, cache ? &cache->fc2 : nullptr);
}

template <class T>
Tensor<T> AttentionClassifier<T>::module_backward(const Tensor<T>& grad_logits, const ModuleCache& cache,
                                                  bool want_input_grad) {
  const int64_t N = cache.batch, L = config_.sequence_length, E = config_.embed_dim;
  Tensor<T> g = fc2_->backward(grad_logits, cache.fc2);
  g = dropout_.backward(g, cache.dropout);
  g = fc1_->backward(relu_.backward(g, cache.relu), cache.fc1);  // (N, E): grad of pooled
  Tensor<T> grad_h({N, L, E});  // the mean spreads the gradient evenly over the positions
  for (int64_t n = 0; n < N; ++n)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t e = 0; e < E; ++e) grad_h[(n * L + t) * E + e] = g[n * E + e] / static_cast<T>(L);
  if (norm_) grad_h = norm_->backward(grad_h, cache.norm);
  for (size_t b = blocks_.size(); b-- > 0;) {
    Block& block = blocks_[b];
    const typename ModuleCache::BlockCache& bc = cache.blocks[b];
    auto grads = block.attention->backward(grad_h, bc.attention);
    // Self-attention: query, key and value are the same tensor.
    Tensor<T> grad_a = std::move(grads.grad_query);
    for (int64_t i = 0; i < grad_a.numel(); ++i) grad_a[i] += grads.grad_key[i] + grads.grad_value[i];
    if (block.norm) grad_a = block.norm->backward(grad_a, bc.norm);
    for (int64_t i = 0; i < grad_h.numel(); ++i) grad_h[i] += grad_a[i];  // the residual path
  }
  if (config_.learned_positions)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < L * E; ++i) grad_positions_[i] += grad_h[n * L * E + i];
  if (input_projection_) grad_h = input_projection_->backward(grad_h, cache.input_projection);
  return want_input_grad ? std::move(grad_h) : Tensor<T>();
}

// ---- Dispatch -----------------------------------------------------------------------------

template <class T>
Tensor<T> AttentionClassifier<T>::forward(const Tensor<T>& x, Cache* cache) {
  const int64_t L = config_.sequence_length;
  check(x.defined() && x.dim() == 3 && x.size(0) >= 1 && x.size(1) == L && x.size(2) == config_.input_dim,
        "AttentionClassifier: input: expected shape (N, ", L, ", ", config_.input_dim, ") with N >= 1, got ",
        x.defined() ? "shape " + to_string(x.shape()) : std::string("an undefined tensor"));
  const int64_t N = x.size(0);
  if (path_ == ComputePath::fused) return fused_forward(x, start_state<FusedCache>(cache, N, blocks_.size()));
  return module_forward(x, start_state<ModuleCache>(cache, N, blocks_.size()));
}

template <class T>
Tensor<T> AttentionClassifier<T>::backward(const Tensor<T>& grad_logits, Cache& cache, bool want_input_grad) {
  FusedCache* fused = std::get_if<FusedCache>(&cache);
  ModuleCache* module = std::get_if<ModuleCache>(&cache);
  check(fused || module,
        "AttentionClassifier::backward: cache: expected the cache filled by forward, got an empty cache");
  const ComputePath filled_on = fused ? ComputePath::fused : ComputePath::module;
  check(filled_on == path_, "AttentionClassifier::backward: cache: expected a cache filled on this model's ",
        path_name(path_), " path, got one filled on the ", path_name(filled_on), " path");
  const int64_t batch = fused ? fused->batch : module->batch;
  const size_t blocks = fused ? fused->blocks.size() : module->blocks.size();
  check(batch >= 1 && blocks == blocks_.size(),
        "AttentionClassifier::backward: cache: expected the cache filled by forward, got an empty cache");
  check(grad_logits.defined(), "AttentionClassifier::backward: grad_logits: expected shape [", batch, ", ",
        config_.num_classes, "], got an undefined tensor");
  check_shape(grad_logits.shape(), {batch, config_.num_classes}, "AttentionClassifier::backward: grad_logits");
  return fused ? fused_backward(grad_logits, *fused, want_input_grad)
               : module_backward(grad_logits, *module, want_input_grad);
}

template class AttentionClassifier<float>;
template class AttentionClassifier<double>;

}  // namespace mha::models
