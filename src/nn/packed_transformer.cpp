#include "mha/nn/packed_transformer.h"

#include <algorithm>
#include <map>
#include <string>

#include "gelu_kernels.h"
#include "mha/attention/attention.h"
#include "mha/nn/gelu.h"

namespace mha::nn {
namespace {

// The layer's parameters by their PyTorch names.
std::map<std::string, Tensor<float>*> parameters_by_name(TransformerEncoderLayer<float>& layer) {
  std::map<std::string, Tensor<float>*> out;
  for (auto& p : layer.parameters()) out.emplace(p.name, p.value);
  return out;
}

View<const float> parameter(const std::map<std::string, Tensor<float>*>& params, const std::string& name) {
  const auto it = params.find(name);
  return it == params.end() ? View<const float>() : View<const float>(*it->second);
}

// The layer's LayerNorm `name` with its parameters as T (rounded once for bfloat16).
template <class T>
LayerNorm<T> copy_norm(const std::map<std::string, Tensor<float>*>& params, const std::string& name,
                       const TransformerEncoderLayerOptions& o) {
  LayerNorm<T> norm(o.d_model, o.layer_norm_eps, true, o.bias);
  norm.weight = cast<T>(*params.at(name + ".weight"));
  if (o.bias) norm.bias = cast<T>(*params.at(name + ".bias"));
  return norm;
}

// An epilogue adding the residual's row (width `width`) to the finished values of the same row.
template <class T>
auto add_residual(const T* residual, int64_t width) {
  return [=](int64_t row, int64_t col, float* values, int64_t count) {
    const T* r = residual + row * width + col;
    for (int64_t j = 0; j < count; ++j) values[j] += widen(r[j]);
  };
}

}  // namespace

template <class T>
PackedTransformerEncoderLayer<T>::PackedTransformerEncoderLayer(TransformerEncoderLayer<float>& layer)
    : options_(layer.options()), attention_options_(layer.self_attn.options()), norm1_(1), norm2_(1) {
  const auto params = parameters_by_name(layer);
  in_proj_ = Linear(parameter(params, "self_attn.in_proj_weight"), parameter(params, "self_attn.in_proj_bias"),
                    "self_attn.in_proj");
  out_proj_ = Linear(parameter(params, "self_attn.out_proj.weight"), parameter(params, "self_attn.out_proj.bias"),
                     "self_attn.out_proj");
  linear1_ = Linear(parameter(params, "linear1.weight"), parameter(params, "linear1.bias"), "linear1");
  linear2_ = Linear(parameter(params, "linear2.weight"), parameter(params, "linear2.bias"), "linear2");
  norm1_ = copy_norm<T>(params, "norm1", options_);
  norm2_ = copy_norm<T>(params, "norm2", options_);
}

template <class T>
Tensor<T> PackedTransformerEncoderLayer<T>::forward(View<const T> tokens, View<const int64_t> cu_seqlens) const {
  const int64_t E = options_.d_model, H = options_.nhead, hd = E / H;
  check(tokens.dim() == 2 && tokens.size(1) == E && row_major(tokens), "PackedTransformerEncoderLayer: tokens: "
        "expected a contiguous (T, ", E, ") view, got shape ", tokens.shape(), " with strides ", tokens.strides());
  const int64_t total = tokens.size(0);  // tokens of all sequences
  Tensor<int64_t> whole;  // one sequence of all the tokens
  if (!cu_seqlens.defined()) {
    whole = Tensor<int64_t>({2}, std::vector<int64_t>{0, total});
    cu_seqlens = whole;
  }
  check(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2 && row_major(cu_seqlens),
        "PackedTransformerEncoderLayer: cu_seqlens: expected a contiguous (N + 1) view of offsets, got shape ",
        cu_seqlens.shape());
  const int64_t N = cu_seqlens.size(0) - 1;
  const int64_t* cu = cu_seqlens.data();
  for (int64_t s = 0; s <= N; ++s)
    check(s == 0 ? cu[s] == 0 : cu[s] >= cu[s - 1] && cu[s] <= total, "PackedTransformerEncoderLayer: cu_seqlens: "
          "expected non-decreasing offsets from 0 to T = ", total, ", got ", cu[s], " at index ", s);
  check(cu[N] == total, "PackedTransformerEncoderLayer: cu_seqlens: expected the last offset to be T = ", total, ", got ", cu[N]);
  if (total == 0) return Tensor<T>({0, E});

  // Self-attention block: residual + out_proj(attention(in_proj(in))), the residual added to
  // each block of out_proj's product as it is finished.
  auto self_attention = [&](View<const T> in, const T* residual) {
    const Tensor<T> qkv = in_proj_.forward(in);  // (T, 3E): rows [q | k | v]
    // Heads read in place: (1, H, T, hd) with rows of 3E values, the sequences back to back.
    const Shape qkv_strides{total * 3 * E, hd, 3 * E, 1};
    const View<const T> q(qkv.data(), {1, H, total, hd}, qkv_strides);
    const View<const T> k(qkv.data() + E, {1, H, total, hd}, qkv_strides);
    const View<const T> v(qkv.data() + 2 * E, {1, H, total, hd}, qkv_strides);
    Tensor<T> merged = Tensor<T>::uninitialized({total, E});  // heads written merged
    Tensor<double> logsumexp = Tensor<double>::uninitialized({1, H, total});
    attention::Options<T> opt;
    static_cast<attention::Scoring&>(opt) = module_scoring(attention_options_, 0.0, 0);
    opt.cu_seqlens_q = opt.cu_seqlens_k = cu_seqlens;  // a token sees its own sequence's tokens
    // cpu_flash whatever the length: automatic would take decode for a few tokens and cpu_flash above,
    // which round differently, and a sentence's result must not depend on the batch it came in
    // (the sentence encoder's promise: any batch size, any thread count).
    opt.backend = attention::Backend::cpu_flash;
    attention::sdpa_forward_into<T>(
        q, k, v, {View<T>(merged.data(), {1, H, total, hd}, {total * E, hd, E, 1}), logsumexp, {}}, opt);
    Tensor<T> out = Tensor<T>::uninitialized({total, E});
    out_proj_.forward(merged, out, add_residual(residual, E));
    return out;
  };
  // Feed-forward block: residual + linear2(activation(linear1(in))), the activation applied to
  // each block of linear1's product and the residual added to linear2's as they are finished.
  auto feed_forward = [&](View<const T> in, const T* residual) {
    const int64_t F = options_.dim_feedforward;
    Tensor<T> h = Tensor<T>::uninitialized({total, F});
    linear1_.forward(in, h, [&](int64_t, int64_t, float* values, int64_t count) {
      if (options_.activation == Activation::gelu && std::is_same_v<T, bfloat16>) {
        gelu_for_bfloat16(values, values, count);  // of values rounded to bfloat16, as Linear<bfloat16>'s
      } else if (options_.activation == Activation::gelu) {
        detail::gelu_erf_forward_serial(values, values, count);
      } else {
        for (int64_t j = 0; j < count; ++j) values[j] = std::max(values[j], 0.0f);
      }
    });
    Tensor<T> out = Tensor<T>::uninitialized({total, E});
    linear2_.forward(h, out, add_residual(residual, E));
    return out;
  };

  if (options_.norm_first) {  // x = x + sa(norm1(x)); x = x + ff(norm2(x))
    Tensor<T> x = Tensor<T>::uninitialized(tokens.shape());  // LayerNorm takes a Tensor
    std::copy_n(tokens.data(), tokens.numel(), x.data());
    const Tensor<T> a1 = self_attention(norm1_.forward(x), x.data());
    return feed_forward(norm2_.forward(a1), a1.data());
  }
  // x = norm1(x + sa(x)); x = norm2(x + ff(x))
  const Tensor<T> y1 = norm1_.forward(self_attention(tokens, tokens.data()));
  return norm2_.forward(feed_forward(y1, y1.data()));
}

template class PackedTransformerEncoderLayer<float>;
template class PackedTransformerEncoderLayer<bfloat16>;

}  // namespace mha::nn
