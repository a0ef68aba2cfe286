#include "mha/nn/packed_transformer.h"

#include <algorithm>
#include <map>
#include <string>

#include "elementwise.h"
#include "gelu_kernels.h"
#include "mha/attention/attention.h"
#include "mha/nn/relu.h"

namespace mha::nn {
namespace {

using detail::add_into;

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

LayerNorm<float> copy_norm(const std::map<std::string, Tensor<float>*>& params, const std::string& name,
                           const TransformerEncoderLayerOptions& o) {
  LayerNorm<float> norm(o.d_model, o.layer_norm_eps, true, o.bias);
  norm.weight = *params.at(name + ".weight");
  if (o.bias) norm.bias = *params.at(name + ".bias");
  return norm;
}

}  // namespace

PackedTransformerEncoderLayer::PackedTransformerEncoderLayer(TransformerEncoderLayer<float>& layer)
    : options_(layer.options()), norm1_(1), norm2_(1) {
  const auto params = parameters_by_name(layer);
  in_proj_ = panel_gemm::PackedLinear(parameter(params, "self_attn.in_proj_weight"),
                                      parameter(params, "self_attn.in_proj_bias"), "self_attn.in_proj");
  out_proj_ = panel_gemm::PackedLinear(parameter(params, "self_attn.out_proj.weight"),
                                       parameter(params, "self_attn.out_proj.bias"), "self_attn.out_proj");
  linear1_ = panel_gemm::PackedLinear(parameter(params, "linear1.weight"), parameter(params, "linear1.bias"), "linear1");
  linear2_ = panel_gemm::PackedLinear(parameter(params, "linear2.weight"), parameter(params, "linear2.bias"), "linear2");
  norm1_ = copy_norm(params, "norm1", options_);
  norm2_ = copy_norm(params, "norm2", options_);
}

Tensor<float> PackedTransformerEncoderLayer::forward(View<const float> src, View<const bool> key_padding_mask) const {
  const int64_t E = options_.d_model, H = options_.nhead, hd = E / H;
  check(src.dim() == 3 && src.size(2) == E && row_major(src), "PackedTransformerEncoderLayer: src: expected a "
        "contiguous (N, L, ", E, ") view, got shape ", src.shape(), " with strides ", src.strides());
  const int64_t N = src.size(0), L = src.size(1);
  if (key_padding_mask.defined())
    check(key_padding_mask.shape() == Shape{N, L} && row_major(key_padding_mask),
          "PackedTransformerEncoderLayer: key_padding_mask: expected a contiguous (", N, ", ", L,
          ") view (true = padding), got shape ", key_padding_mask.shape());

  // Self-attention block on `in` (N, L, E): out_proj(attention(in_proj(in))).
  auto self_attention = [&](View<const float> in) {
    const Tensor<float> qkv = in_proj_.forward(in);  // (N, L, 3E): rows [q | k | v]
    // Heads read in place: (N, H, L, hd) with rows of 3E floats.
    const Shape qkv_strides{L * 3 * E, hd, 3 * E, 1};
    const View<const float> q(qkv.data(), {N, H, L, hd}, qkv_strides);
    const View<const float> k(qkv.data() + E, {N, H, L, hd}, qkv_strides);
    const View<const float> v(qkv.data() + 2 * E, {N, H, L, hd}, qkv_strides);
    Tensor<float> merged = Tensor<float>::uninitialized({N, L, E});  // heads written merged
    Tensor<double> logsumexp = Tensor<double>::uninitialized({N, H, L});
    attention::Options<float> opt;
    Tensor<bool> attend;
    if (key_padding_mask.defined()) {  // the core's polarity: true = may attend; (N, 1, 1, L)
      attend = Tensor<bool>::uninitialized({N, 1, 1, L});
      for (int64_t i = 0; i < N * L; ++i) attend[i] = !key_padding_mask.data()[i];
      opt.attend_mask = attend;
    }
    attention::sdpa_forward_into<float>(
        q, k, v, {View<float>(merged.data(), {N, H, L, hd}, {L * E, hd, E, 1}), logsumexp, {}}, opt);
    return out_proj_.forward(merged);
  };
  // Feed-forward block: linear2(activation(linear1(in))).
  auto feed_forward = [&](View<const float> in) {
    Tensor<float> h = linear1_.forward(in);
    if (options_.activation == Activation::gelu)
      detail::gelu_erf_forward(h.data(), h.data(), h.numel());
    else
      h = relu(h);
    return linear2_.forward(h);
  };

  Tensor<float> x = Tensor<float>::uninitialized({N, L, E});
  std::copy_n(src.data(), src.numel(), x.data());
  if (options_.norm_first) {  // x = x + sa(norm1(x)); x = x + ff(norm2(x))
    add_into(x, self_attention(norm1_.forward(x)));
    add_into(x, feed_forward(norm2_.forward(x)));
  } else {  // x = norm1(x + sa(x)); x = norm2(x + ff(x))
    add_into(x, self_attention(x));
    x = norm1_.forward(x);
    add_into(x, feed_forward(x));
    x = norm2_.forward(x);
  }
  return x;
}

}  // namespace mha::nn
