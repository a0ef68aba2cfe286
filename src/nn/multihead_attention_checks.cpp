// MultiheadAttention's checks: the options (resolved_options), and the parameters and their
// gradients against them (multihead_attention_checks.h).
#include "multihead_attention_checks.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace mha::nn {

MultiheadAttentionOptions resolved_options(MultiheadAttentionOptions options) {
  const int64_t e = options.embed_dim, h = options.num_heads;
  check(h > 0, "MultiheadAttention: num_heads: expected > 0, got ", h);
  check(e % h == 0, "MultiheadAttention: embed_dim must be divisible by num_heads, got embed_dim ", e,
        " and num_heads ", h);
  check(std::isfinite(options.dropout) && options.dropout >= 0.0 && options.dropout <= 1.0,
        "MultiheadAttention: dropout: expected a probability in [0, 1], got ", options.dropout);
  attention::check_scoring(options.scoring, "MultiheadAttention: scoring.");
  const attention::Scoring& s = options.scoring;
  const attention::Scoring defaults;
  check(s.causal == defaults.causal && s.dropout_p == defaults.dropout_p && s.dropout_seed == defaults.dropout_seed &&
            s.whole_call == defaults.whole_call,
        "MultiheadAttention: scoring: expected causal, dropout_p, dropout_seed and whole_call at their defaults (each "
        "call's own: is_causal and the masks, the module's dropout in training), got causal ",
        static_cast<int>(s.causal), ", dropout_p ", s.dropout_p, ", dropout_seed ", s.dropout_seed,
        s.whole_call == defaults.whole_call ? " and the default whole_call" : " and a whole_call of a larger call");
  if (!options.kdim) options.kdim = e;
  if (!options.vdim) options.vdim = e;
  // Widths beyond what BLAS indexes (int) cannot be computed; refusing them here also keeps
  // 3·embed_dim and every weight size far from int64 overflow.
  constexpr int64_t kMaxWidth = std::numeric_limits<int>::max() / 3;
  for (auto [name, width] : {std::pair<const char*, int64_t>{"embed_dim", e}, {"kdim", *options.kdim},
                             {"vdim", *options.vdim}})
    check(width > 0 && width <= kMaxWidth, "MultiheadAttention: ", name, ": expected 1 to ", kMaxWidth, ", got ",
          width);

  return options;
}

namespace detail {
namespace {

// One parameter against what the options say: given with `shape` exactly when `expected`
// (`why` says which option decides), contiguous.
template <class T>
void check_parameter(const char* what, const char* name, const View<T>& w, bool expected, const Shape& shape,
                     const char* why) {
  if (!expected) {
    check(!w.defined(), "MultiheadAttention: ", what, name, ": expected none (", why, "), got shape ",
          w.shape());
    return;
  }
  check(w.defined(), "MultiheadAttention: ", what, name, ": expected shape ", shape, " (", why,
        "), got none");
  if (w.shape() != shape) check_shape(w.shape(), shape, std::string("MultiheadAttention: ") + what + name);
  check(row_major(w), "MultiheadAttention: ", what, name, ": expected contiguous (row-major) memory, got strides ",
        w.strides(), " for shape ", w.shape());
}

// Calls f(name, weight, gradient-or-weight, expected, shape, why) for each parameter in
// state_dict order; `W` is MultiheadAttentionWeights or MultiheadAttentionWeightGradients.
template <class W, class F>
void for_each_parameter(const MultiheadAttentionOptions& o, const W& w, F f) {
  const int64_t e = o.embed_dim;
  const bool packed = *o.kdim == e && *o.vdim == e;
  const char* packed_why = packed ? "kdim == vdim == embed_dim: one packed in_proj_weight"
                                  : "kdim or vdim differs from embed_dim: separate q/k/v_proj_weight";
  const char* bias_why = o.bias ? "bias=true" : "bias=false";
  const char* bias_kv_why = o.add_bias_kv ? "add_bias_kv=true" : "add_bias_kv=false";
  f("in_proj_weight", w.in_proj_weight, packed, Shape{3 * e, e}, packed_why);
  f("q_proj_weight", w.q_proj_weight, !packed, Shape{e, e}, packed_why);
  f("k_proj_weight", w.k_proj_weight, !packed, Shape{e, *o.kdim}, packed_why);
  f("v_proj_weight", w.v_proj_weight, !packed, Shape{e, *o.vdim}, packed_why);
  f("in_proj_bias", w.in_proj_bias, o.bias, Shape{3 * e}, bias_why);
  f("bias_k", w.bias_k, o.add_bias_kv, Shape{1, 1, e}, bias_kv_why);
  f("bias_v", w.bias_v, o.add_bias_kv, Shape{1, 1, e}, bias_kv_why);
  f("out_proj_weight", w.out_proj_weight, true, Shape{e, e}, "always");
  f("out_proj_bias", w.out_proj_bias, o.bias, Shape{e}, bias_why);
}

}  // namespace

template <class T>
void check_weights(const MultiheadAttentionOptions& o, const MultiheadAttentionWeights<T>& w) {
  for_each_parameter(o, w, [](const char* name, const View<const T>& p, bool expected, const Shape& shape,
                              const char* why) { check_parameter("weights: ", name, p, expected, shape, why); });
}

// A gradient may be absent (not computed); a given one has its weight's shape and overlaps no
// other gradient (each is added into).
template <class T>
void check_gradients(const MultiheadAttentionOptions& o, const MultiheadAttentionWeightGradients<T>& g) {
  std::vector<std::pair<const char*, View<T>>> given;
  for_each_parameter(o, g, [&](const char* name, const View<T>& p, bool expected, const Shape& shape,
                               const char* why) {
    if (!p.defined()) return;
    check_parameter("grads: ", name, p, expected, shape, why);
    for (const auto& [other, q] : given)
      check(!ranges_overlap(p, q), "MultiheadAttention: grads: ", name, " and ", other,
            ": expected separate memory (each gradient is added into), got overlapping views");
    given.emplace_back(name, p);
  });
}

template void check_weights(const MultiheadAttentionOptions&, const MultiheadAttentionWeights<float>&);
template void check_weights(const MultiheadAttentionOptions&, const MultiheadAttentionWeights<double>&);
template void check_gradients(const MultiheadAttentionOptions&, const MultiheadAttentionWeightGradients<float>&);
template void check_gradients(const MultiheadAttentionOptions&, const MultiheadAttentionWeightGradients<double>&);
template void check_weights(const MultiheadAttentionOptions&, const MultiheadAttentionWeights<bfloat16>&);
template void check_gradients(const MultiheadAttentionOptions&, const MultiheadAttentionWeightGradients<bfloat16>&);
template void check_weights(const MultiheadAttentionOptions&, const MultiheadAttentionWeights<float16>&);
template void check_gradients(const MultiheadAttentionOptions&, const MultiheadAttentionWeightGradients<float16>&);

}  // namespace detail
}  // namespace mha::nn
