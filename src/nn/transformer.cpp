#include "mha/nn/transformer.h"

#include <cmath>
#include <string>
#include <utility>

#include "elementwise.h"
#include "mha/nn/relu.h"

namespace mha::nn {

using detail::sum;

Activation activation_from_string(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  throw Error("TransformerEncoderLayer: activation: expected \"relu\" or \"gelu\", got \"" + name + "\"");
}

std::string activation_name(Activation activation) {
  switch (activation) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
  }
  throw Error("TransformerEncoderLayer: activation: unknown value " + std::to_string(static_cast<int>(activation)));
}

namespace {

const TransformerEncoderLayerOptions& checked(const TransformerEncoderLayerOptions& o) {
  check(o.d_model >= 1, "TransformerEncoderLayer: d_model: expected >= 1, got ", o.d_model);
  check(o.nhead >= 1, "TransformerEncoderLayer: nhead: expected >= 1, got ", o.nhead);
  check(o.d_model % o.nhead == 0, "TransformerEncoderLayer: d_model (", o.d_model, ") must be divisible by nhead (",
        o.nhead, ")");
  check(o.dim_feedforward >= 1, "TransformerEncoderLayer: dim_feedforward: expected >= 1, got ", o.dim_feedforward);
  check(o.dropout >= 0 && o.dropout <= 1, "TransformerEncoderLayer: dropout: expected a probability in [0, 1], got ",
        o.dropout);
  check(std::isfinite(o.layer_norm_eps) && o.layer_norm_eps >= 0,
        "TransformerEncoderLayer: layer_norm_eps: expected a finite number >= 0, got ", o.layer_norm_eps);
  activation_name(o.activation);  // throws on a value outside the enum
  return o;
}

MultiheadAttentionOptions attention_options(const TransformerEncoderLayerOptions& o) {
  MultiheadAttentionOptions m;
  m.embed_dim = o.d_model;
  m.num_heads = o.nhead;
  m.dropout = o.dropout;
  m.bias = o.bias;
  m.batch_first = o.batch_first;
  return m;
}

// One stream of seeds per layer: self_attn's, then the three dropouts'.
uint64_t derived_seed(uint64_t seed, uint64_t which) { return Generator(seed ^ (which * 0x9E3779B97F4A7C15ull)).next_u64(); }

}  // namespace

template <class T>
TransformerEncoderLayer<T>::TransformerEncoderLayer(const TransformerEncoderLayerOptions& options, uint64_t seed)
    : self_attn(attention_options(checked(options)), derived_seed(seed, 0)),
      linear1([&] {
        Generator g(derived_seed(seed, 1));
        return Linear<T>(options.d_model, options.dim_feedforward, options.bias, g);
      }()),
      linear2([&] {
        Generator g(derived_seed(seed, 2));
        return Linear<T>(options.dim_feedforward, options.d_model, options.bias, g);
      }()),
      norm1(options.d_model, options.layer_norm_eps, true, options.bias),
      norm2(options.d_model, options.layer_norm_eps, true, options.bias),
      dropout(options.dropout, derived_seed(seed, 3)),
      dropout1(options.dropout, derived_seed(seed, 4)),
      dropout2(options.dropout, derived_seed(seed, 5)),
      options_(options) {}

template <class T>
Tensor<T> TransformerEncoderLayer<T>::self_attention_block(const Tensor<T>& x, const TransformerEncoderArgs<T>& args,
                                                           TransformerEncoderLayerCache<T>* cache) {
  MultiheadAttentionArgs<T> a;
  a.key_padding_mask = args.src_key_padding_mask;
  a.attn_mask = args.src_mask;
  a.need_weights = false;
  a.is_causal = args.is_causal;
  Tensor<T> out;
  try {
    out = self_attn.forward(x, x, x, a, cache != nullptr ? &cache->self_attn : nullptr).output;
  } catch (const Error& e) {  // self_attn's message names its own arguments: say which of the layer's they are
    throw Error(std::string("TransformerEncoderLayer: self_attn, given src_mask as attn_mask and src_key_padding_mask "
                            "as key_padding_mask: ") + e.what());
  }
  return dropout1.forward(out, cache != nullptr ? &cache->dropout1 : nullptr);
}

template <class T>
Tensor<T> TransformerEncoderLayer<T>::feed_forward_block(const Tensor<T>& x, TransformerEncoderLayerCache<T>* cache) {
  Tensor<T> h = linear1.forward(x, cache != nullptr ? &cache->linear1 : nullptr);
  Tensor<T> a = options_.activation == Activation::gelu ? gelu(h) : relu(h);
  if (cache != nullptr) cache->activation_input = std::move(h);
  a = dropout.forward(a, cache != nullptr ? &cache->dropout : nullptr);
  Tensor<T> y = linear2.forward(a, cache != nullptr ? &cache->linear2 : nullptr);
  return dropout2.forward(y, cache != nullptr ? &cache->dropout2 : nullptr);
}

template <class T>
Tensor<T> TransformerEncoderLayer<T>::forward(const Tensor<T>& src, const TransformerEncoderArgs<T>& args,
                                              TransformerEncoderLayerCache<T>* cache) {
  const int64_t E = options_.d_model;
  check(src.defined() && (src.dim() == 2 || src.dim() == 3) && src.shape().back() == E,
        "TransformerEncoderLayer: src: expected shape ", options_.batch_first ? "(N, S, " : "(S, N, ", E,
        ") or unbatched (S, ", E, "), got ", src.shape());
  const bool training = this->is_training();
  for (Module<T>* m : std::initializer_list<Module<T>*>{&self_attn, &linear1, &linear2, &norm1, &norm2, &dropout,
                                                         &dropout1, &dropout2})
    m->train(training);
  if (cache != nullptr) *cache = TransformerEncoderLayerCache<T>();
  Tensor<T> x;
  if (options_.norm_first) {  // x = x + sa(norm1(x)); x = x + ff(norm2(x))
    x = sum(self_attention_block(norm1.forward(src, cache != nullptr ? &cache->norm1 : nullptr), args, cache), src);
    x = sum(feed_forward_block(norm2.forward(x, cache != nullptr ? &cache->norm2 : nullptr), cache), x);
  } else {  // x = norm1(x + sa(x)); x = norm2(x + ff(x))
    x = norm1.forward(sum(self_attention_block(src, args, cache), src), cache != nullptr ? &cache->norm1 : nullptr);
    x = norm2.forward(sum(feed_forward_block(x, cache), x), cache != nullptr ? &cache->norm2 : nullptr);
  }
  if (cache != nullptr) cache->filled = true;
  return x;
}

template <class T>
Tensor<T> TransformerEncoderLayer<T>::self_attention_backward(const Tensor<T>& grad,
                                                              const TransformerEncoderLayerCache<T>& cache) {
  const Tensor<T> g = dropout1.backward(grad, cache.dropout1);
  MultiheadAttentionGradients<T> gs = self_attn.backward(g, cache.self_attn);
  // query, key and value were all the block's input.
  return sum(sum(std::move(gs.grad_query), gs.grad_key), gs.grad_value);
}

template <class T>
Tensor<T> TransformerEncoderLayer<T>::feed_forward_backward(const Tensor<T>& grad,
                                                            const TransformerEncoderLayerCache<T>& cache) {
  Tensor<T> g = linear2.backward(dropout2.backward(grad, cache.dropout2), cache.linear2);
  g = dropout.backward(g, cache.dropout);
  g = options_.activation == Activation::gelu ? gelu_backward(cache.activation_input, g)
                                              : relu_backward(cache.activation_input, g);
  return linear1.backward(g, cache.linear1);
}

template <class T>
Tensor<T> TransformerEncoderLayer<T>::backward(const Tensor<T>& grad_output, const TransformerEncoderLayerCache<T>& cache) {
  check(cache.filled, "TransformerEncoderLayer::backward: cache: expected the cache filled by forward, got an empty cache");
  if (options_.norm_first) {
    // out = a1 + ff(norm2(a1)), a1 = x + sa(norm1(x))
    const Tensor<T> grad_a1 = sum(norm2.backward(feed_forward_backward(grad_output, cache), cache.norm2), grad_output);
    return sum(norm1.backward(self_attention_backward(grad_a1, cache), cache.norm1), grad_a1);
  }
  // out = norm2(y1 + ff(y1)), y1 = norm1(x + sa(x))
  const Tensor<T> grad_a2 = norm2.backward(grad_output, cache.norm2);
  const Tensor<T> grad_y1 = sum(feed_forward_backward(grad_a2, cache), grad_a2);
  const Tensor<T> grad_a1 = norm1.backward(grad_y1, cache.norm1);
  return sum(self_attention_backward(grad_a1, cache), grad_a1);
}

template <class T>
std::vector<Parameter<T>> TransformerEncoderLayer<T>::parameters() {
  std::vector<Parameter<T>> out;
  this->append_prefixed(out, self_attn.parameters(), "self_attn");
  this->append_prefixed(out, linear1.parameters(), "linear1");
  this->append_prefixed(out, linear2.parameters(), "linear2");
  this->append_prefixed(out, norm1.parameters(), "norm1");
  this->append_prefixed(out, norm2.parameters(), "norm2");
  return out;
}

template <class T>
TransformerEncoder<T>::TransformerEncoder(const TransformerEncoderLayer<T>& encoder_layer,
                                          const TransformerEncoderOptions& options) {
  check(options.num_layers >= 1, "TransformerEncoder: num_layers: expected >= 1, got ", options.num_layers);
  layers.assign(static_cast<size_t>(options.num_layers), encoder_layer);
  if (options.final_norm) {
    const auto& o = encoder_layer.options();
    norm.emplace(o.d_model, o.layer_norm_eps, true, o.bias);
  }
}

template <class T>
TransformerEncoderLayer<T>& TransformerEncoder<T>::layer(int64_t i) {
  check(i >= 0 && i < num_layers(), "TransformerEncoder::layer: i: expected in [0, ", num_layers(), "), got ", i);
  return layers[static_cast<size_t>(i)];
}

template <class T>
Tensor<T> TransformerEncoder<T>::forward(const Tensor<T>& src, const TransformerEncoderArgs<T>& args,
                                         TransformerEncoderCache<T>* cache) {
  if (cache != nullptr) {
    *cache = TransformerEncoderCache<T>();
    cache->layers.resize(layers.size());
  }
  Tensor<T> x = src;
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].train(this->is_training());
    x = layers[i].forward(x, args, cache != nullptr ? &cache->layers[i] : nullptr);
  }
  if (norm) x = norm->forward(x, cache != nullptr ? &cache->norm : nullptr);
  if (cache != nullptr) cache->filled = true;
  return x;
}

template <class T>
Tensor<T> TransformerEncoder<T>::backward(const Tensor<T>& grad_output, const TransformerEncoderCache<T>& cache) {
  check(cache.filled && cache.layers.size() == layers.size(),
        "TransformerEncoder::backward: cache: expected the cache filled by forward, got an empty cache");
  Tensor<T> g = norm ? norm->backward(grad_output, cache.norm) : grad_output;
  for (size_t i = layers.size(); i-- > 0;) g = layers[i].backward(g, cache.layers[i]);
  return g;
}

template <class T>
std::vector<Parameter<T>> TransformerEncoder<T>::parameters() {
  std::vector<Parameter<T>> out;
  for (size_t i = 0; i < layers.size(); ++i)
    this->append_prefixed(out, layers[i].parameters(), "layers." + std::to_string(i));
  if (norm) this->append_prefixed(out, norm->parameters(), "norm");
  return out;
}

template class TransformerEncoderLayer<float>;
template class TransformerEncoderLayer<double>;
template class TransformerEncoder<float>;
template class TransformerEncoder<double>;
template class TransformerEncoderLayer<bfloat16>;
template class TransformerEncoder<bfloat16>;

}  // namespace mha::nn
