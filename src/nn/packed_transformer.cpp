#include "mha/nn/packed_transformer.h"

#include <algorithm>
#include <map>
#include <span>
#include <string>

#include "gelu_kernels.h"
#include "mha/attention/attention.h"

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

LayerNorm<float> copy_norm(const std::map<std::string, Tensor<float>*>& params, const std::string& name,
                           const TransformerEncoderLayerOptions& o) {
  LayerNorm<float> norm(o.d_model, o.layer_norm_eps, true, o.bias);
  norm.weight = *params.at(name + ".weight");
  if (o.bias) norm.bias = *params.at(name + ".bias");
  return norm;
}

// An epilogue adding residual rows (width `width`) to the same block of `out`.
panel_gemm::PackedLinear::Epilogue add_rows(float* out, const float* residual, int64_t width) {
  return [=](int64_t row, int64_t rows, int64_t col, int64_t cols) {
    for (int64_t r = row; r < row + rows; ++r)
      for (int64_t j = col; j < col + cols; ++j) out[r * width + j] += residual[r * width + j];
  };
}

}  // namespace

PackedTransformerEncoderLayer::PackedTransformerEncoderLayer(TransformerEncoderLayer<float>& layer)
    : options_(layer.options()), attention_options_(layer.self_attn.options()), norm1_(1), norm2_(1) {
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

  // Self-attention block: residual + out_proj(attention(in_proj(in))), the residual added to
  // each block of out_proj's product as it is finished.
  auto self_attention = [&](View<const float> in, const float* residual) {
    const Tensor<float> qkv = in_proj_.forward(in);  // (N, L, 3E): rows [q | k | v]
    // Heads read in place: (N, H, L, hd) with rows of 3E floats.
    const Shape qkv_strides{L * 3 * E, hd, 3 * E, 1};
    const View<const float> q(qkv.data(), {N, H, L, hd}, qkv_strides);
    const View<const float> k(qkv.data() + E, {N, H, L, hd}, qkv_strides);
    const View<const float> v(qkv.data() + 2 * E, {N, H, L, hd}, qkv_strides);
    Tensor<float> merged = Tensor<float>::uninitialized({N, L, E});  // heads written merged
    Tensor<double> logsumexp = Tensor<double>::uninitialized({N, H, L});
    // cpu_flash whatever L: automatic would take decode for batches of at most 16 tokens and
    // cpu_flash above, which round differently, and a sentence's result must not depend on the
    // batch it came in (the sentence encoder's promise: any batch size, any thread count).
    // The masks and settings as the module makes them (MultiheadAttentionMasks::core_options).
    MultiheadAttentionArgs<float> args;
    args.need_weights = false;
    if (key_padding_mask.defined())
      args.key_padding_mask = Tensor<bool>({N, L}, std::span<const bool>(key_padding_mask.data(), static_cast<size_t>(N * L)));
    const MultiheadAttentionMasks<float> masks = multihead_attention_masks(attention_options_, args, N, L, L, false);
    attention::Options<float> opt = masks.core_options(module_scoring(attention_options_, 0.0, 0));
    opt.backend = attention::Backend::cpu_flash;
    attention::sdpa_forward_into<float>(
        q, k, v, {View<float>(merged.data(), {N, H, L, hd}, {L * E, hd, E, 1}), logsumexp, {}}, opt);
    Tensor<float> out = Tensor<float>::uninitialized({N, L, E});
    out_proj_.forward(merged, out, add_rows(out.data(), residual, E));
    return out;
  };
  // Feed-forward block: residual + linear2(activation(linear1(in))), the activation applied to
  // each block of linear1's product and the residual added to linear2's as they are finished.
  auto feed_forward = [&](View<const float> in, const float* residual) {
    const int64_t F = options_.dim_feedforward;
    Tensor<float> h = Tensor<float>::uninitialized({N, L, F});
    float* ph = h.data();
    linear1_.forward(in, h, [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
      for (int64_t r = row; r < row + rows; ++r) {
        float* p = ph + r * F + col;
        if (options_.activation == Activation::gelu) {
          detail::gelu_erf_forward_serial(p, p, cols);
        } else {
          for (int64_t j = 0; j < cols; ++j) p[j] = std::max(p[j], 0.0f);
        }
      }
    });
    Tensor<float> out = Tensor<float>::uninitialized({N, L, E});
    linear2_.forward(h, out, add_rows(out.data(), residual, E));
    return out;
  };

  if (options_.norm_first) {  // x = x + sa(norm1(x)); x = x + ff(norm2(x))
    Tensor<float> x = Tensor<float>::uninitialized(src.shape());  // LayerNorm takes a Tensor
    std::copy_n(src.data(), src.numel(), x.data());
    const Tensor<float> a1 = self_attention(norm1_.forward(x), x.data());
    return feed_forward(norm2_.forward(a1), a1.data());
  }
  // x = norm1(x + sa(x)); x = norm2(x + ff(x))
  const Tensor<float> y1 = norm1_.forward(self_attention(src, src.data()));
  return norm2_.forward(feed_forward(y1, y1.data()));
}

}  // namespace mha::nn
