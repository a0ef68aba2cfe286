// MultiheadAttention's masks: everything torch.nn.functional.multi_head_attention_forward does to
// attn_mask and key_padding_mask, gathered in multihead_attention_masks (the module's forward and
// the Python binding call it).
#include "mha/nn/multihead_attention.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>
#include <variant>

namespace mha::nn {
namespace {

using attention::Causal;

// Pads the last dimension with one unmasked column (add_bias_kv / add_zero_attn).
template <class T>
Mask<T> pad_key_column(const Mask<T>& mask) {
  return std::visit(
      [](const auto& m) -> Mask<T> {
        using Elem = typename std::decay_t<decltype(m)>::value_type;
        Shape shape = m.shape();
        const int64_t len = shape.back();
        shape.back() = len + 1;
        std::decay_t<decltype(m)> out(shape, Elem(0));
        const int64_t rows = len + 1 > 0 ? out.numel() / (len + 1) : 0;
        for (int64_t r = 0; r < rows; ++r) std::copy_n(m.data() + r * len, len, out.data() + r * (len + 1));
        return out;
      },
      mask);
}

// a ⊕ b elementwise after broadcasting both (rank 4) to their common shape.
template <class E, class Op>
Tensor<E> broadcast_combine(const Tensor<E>& a, const Tensor<E>& b, Op op) {
  Shape shape(a.shape().size());
  for (size_t i = 0; i < shape.size(); ++i) shape[i] = std::max(a.shape()[i], b.shape()[i]);
  Tensor<E> out = expand(a, shape);
  const Tensor<E> other = expand(b, shape);
  for (int64_t i = 0; i < out.numel(); ++i) out[i] = op(out[i], other[i]);
  return out;
}

template <class T>
Shape mask_shape(const Mask<T>& m) {
  return std::visit([](const auto& t) { return t.shape(); }, m);
}

template <class T>
Mask<T> reshape_mask(const Mask<T>& m, const Shape& shape) {
  return std::visit([&](const auto& t) -> Mask<T> { return t.reshape(shape); }, m);
}

}  // namespace

// Everything multi_head_attention_forward does to attn_mask and key_padding_mask, in one place
// (PyTorch spreads it over the function).
template <class T>
MultiheadAttentionMasks<T> multihead_attention_masks(const MultiheadAttentionOptions& options,
                                                     const MultiheadAttentionArgs<T>& args, int64_t n, int64_t len,
                                                     int64_t src_len, bool unbatched) {
  const int64_t heads = options.num_heads;

  // 1. Check against the shapes PyTorch accepts, and bring to rank 4 (N|1, H|1, L|1, S).
  std::optional<Mask<T>> attn_mask = args.attn_mask, padding_mask = args.key_padding_mask;
  check(!args.is_causal || attn_mask, "is_causal: PyTorch requires attn_mask with the is_causal hint "
        "(pass the causal mask as attn_mask); got is_causal=true and no attn_mask");
  if (attn_mask) {
    const Shape s = mask_shape(*attn_mask);
    if (s.size() == 2) {
      check_shape(s, {len, src_len}, "attn_mask (2-D)");
      attn_mask = reshape_mask(*attn_mask, {1, 1, len, src_len});
    } else {
      check(s.size() == 3, "attn_mask: expected a 2-D (L, S) or 3-D (N*num_heads, L, S) mask, got shape ",
            s);
      check_shape(s, {checked_numel({n, heads}, "attn_mask: N*num_heads"), len, src_len},
                  unbatched ? "attn_mask (3-D, unbatched: num_heads, L, S)" : "attn_mask (3-D: N*num_heads, L, S)");
      attn_mask = reshape_mask(*attn_mask, {n, heads, len, src_len});
    }
  }
  if (padding_mask) {
    const Shape s = mask_shape(*padding_mask);
    check_shape(s, unbatched ? Shape{src_len} : Shape{n, src_len},
                unbatched ? "key_padding_mask (unbatched: S)" : "key_padding_mask (N, S)");
    padding_mask = reshape_mask(*padding_mask, {n, 1, 1, src_len});
  }

  // 2. The is_causal hint. PyTorch: with need_weights=false and no key padding mask, it replaces
  // the attention mask by SDPA's top-left causal mask; otherwise the mask itself is used.
  MultiheadAttentionMasks<T> out;
  if (args.is_causal && !padding_mask && !args.need_weights) {
    out.causal = Causal::top_left;
    attn_mask.reset();
  }

  // 3. add_bias_kv and add_zero_attn each append a key every query may attend: a free column.
  for (bool appends_key : {options.add_bias_kv, options.add_zero_attn}) {
    if (!appends_key) continue;
    if (attn_mask) attn_mask = pad_key_column(*attn_mask);
    if (padding_mask) padding_mask = pad_key_column(*padding_mask);
  }

  // 4. Merge into one bool and one float mask. PyTorch turns a bool mask into −inf and adds the
  // two masks; two bool masks are the same as "blocked where either blocks", two float masks are
  // added, and a bool with a float mask need no merging.
  std::optional<Tensor<bool>> blocked;
  for (std::optional<Mask<T>>* mask : {&attn_mask, &padding_mask}) {
    if (!*mask) continue;
    if (auto* b = std::get_if<Tensor<bool>>(&**mask)) {
      blocked = blocked ? broadcast_combine(*blocked, *b, std::logical_or<bool>()) : *b;
    } else {
      const Tensor<T>& f = std::get<Tensor<T>>(**mask);
      // (bfloat16 masks added in float, the sum rounded once)
      auto add = [](T a, T b) { return narrow<T>(widen(a) + widen(b)); };
      out.additive_mask = out.additive_mask ? broadcast_combine(*out.additive_mask, f, add) : f;
    }
  }

  // 5. Flip to the attention core's polarity (true = may attend).
  if (blocked) {
    for (int64_t i = 0; i < blocked->numel(); ++i) (*blocked)[i] = !(*blocked)[i];
    out.attend_mask = std::move(blocked);
  }
  // 6. The call's sinks and slopes go to the core as they are (it checks their shapes).
  out.sinks = args.sinks;
  out.alibi_slopes = args.alibi_slopes;
  return out;
}

template MultiheadAttentionMasks<float> multihead_attention_masks(const MultiheadAttentionOptions&,
                                                                  const MultiheadAttentionArgs<float>&, int64_t,
                                                                  int64_t, int64_t, bool);
template MultiheadAttentionMasks<double> multihead_attention_masks(const MultiheadAttentionOptions&,
                                                                   const MultiheadAttentionArgs<double>&, int64_t,
                                                                   int64_t, int64_t, bool);
template MultiheadAttentionMasks<bfloat16> multihead_attention_masks(const MultiheadAttentionOptions&,
                                                                     const MultiheadAttentionArgs<bfloat16>&, int64_t,
                                                                     int64_t, int64_t, bool);
template MultiheadAttentionMasks<float16> multihead_attention_masks(const MultiheadAttentionOptions&,
                                                                    const MultiheadAttentionArgs<float16>&, int64_t,
                                                                    int64_t, int64_t, bool);

}  // namespace mha::nn
