// The module follows torch.nn.functional.multi_head_attention_forward step by step:
// layout → masks → input projections → add_bias_kv → split heads → add_zero_attn → attention
// → merge heads → out_proj (splitting and merging heads are views, not copies); backward walks
// the same steps in reverse. Both are free functions on parameter views
// (multihead_attention_forward / _backward), which the module calls with views of its own
// tensors and the Python binding with views of torch's, so there is one implementation. All of
// PyTorch's mask handling, spread over that function, is gathered in multihead_attention_masks
// (multihead_attention_masks.cpp); the checks of the options and parameters are in
// multihead_attention_checks.cpp.
#include "mha/nn/multihead_attention.h"

#include <cmath>
#include <optional>

#include "mha/nn/linear.h"
#include "multihead_attention_checks.h"

namespace mha::nn {
namespace {

using attention::Causal;

// (N, L, H·hd) memory seen as (N, H, L, hd): the heads split without a copy, as the attention
// core reads and writes them in place.
template <class T>
View<T> heads_view(T* data, int64_t n, int64_t len, int64_t heads, int64_t head_dim) {
  return View<T>(data, {n, heads, len, head_dim}, {len * heads * head_dim, head_dim, heads * head_dim, 1});
}
template <class T>
View<T> heads_view(const View<T>& x, int64_t heads) {
  return heads_view(x.data(), x.size(0), x.size(1), heads, x.size(2) / heads);
}
template <class T>
View<const T> heads_view(const Tensor<T>& x, int64_t heads) {
  return heads_view(View<const T>(x), heads);
}
template <class T>
View<T> heads_view(Tensor<T>& x, int64_t heads) {
  return heads_view(View<T>(x), heads);
}

// A tensor as a view; an undefined tensor (an absent parameter) as an undefined view.
template <class T>
View<const T> view_of(const Tensor<T>& x) {
  return x.defined() ? View<const T>(x) : View<const T>();
}
template <class T>
View<T> mutable_view_of(Tensor<T>& x) {
  return x.defined() ? View<T>(x) : View<T>();
}
template <class T>
View<const T> view_of(const std::optional<Tensor<T>>& x) {
  return x ? View<const T>(*x) : View<const T>();
}

// x in the caller's layout, seen batch-first (N, L, ·): the caller's memory itself when it is
// batch-first or unbatched (then N = 1), else a transposed copy of (L, N, ·).
template <class T>
struct BatchFirst {
  std::optional<Tensor<T>> copy;
  View<const T> view;
};

template <class T>
BatchFirst<T> batch_first_input(View<const T> x, bool unbatched, bool batch_first) {
  BatchFirst<T> out;
  if (unbatched) {
    out.view = View<const T>(x.data(), {1, x.size(0), x.size(1)});
  } else if (batch_first) {
    out.view = x;
  } else {
    const int64_t len = x.size(0), n = x.size(1), width = x.size(2);
    out.copy = Tensor<T>({n, len, width});
    for (int64_t i = 0; i < len; ++i)
      for (int64_t b = 0; b < n; ++b)
        std::copy_n(x.data() + (i * n + b) * width, width, out.copy->data() + (b * len + i) * width);
    out.view = View<const T>(*out.copy);
  }
  return out;
}

// (N, L, ·) back to the caller's layout.
template <class T>
Tensor<T> to_caller_layout(Tensor<T> x, bool unbatched, bool batch_first) {
  if (unbatched) return std::move(x).reshape({x.size(1), x.size(2)});
  return batch_first ? std::move(x) : permute(x, {1, 0, 2});
}

// Appends `rows` (N, 1, E)-broadcast rows along dim 1: (N, S, E) → (N, S+1, E).
template <class T>
Tensor<T> append_row(const Tensor<T>& x, const T* row) {
  const int64_t n = x.size(0), len = x.size(1), e = x.size(2);
  Tensor<T> out({n, len + 1, e});
  for (int64_t b = 0; b < n; ++b) {
    std::copy_n(x.data() + b * len * e, len * e, out.data() + b * (len + 1) * e);
    if (row) std::copy_n(row, e, out.data() + (b * (len + 1) + len) * e);
  }
  return out;
}

// (N, S+1, E) → (N, S, E): the inverse of append_row.
template <class T>
Tensor<T> drop_last_row(const Tensor<T>& x) {
  const int64_t n = x.size(0), len = x.size(1), e = x.size(2);
  auto out = Tensor<T>::uninitialized({n, len - 1, e});
  for (int64_t b = 0; b < n; ++b) std::copy_n(x.data() + b * len * e, (len - 1) * e, out.data() + b * (len - 1) * e);
  return out;
}

// The input projection for which = 0 (q), 1 (k), 2 (v): rows [E·which, E·(which+1)) of the
// packed in_proj_weight, or the separate weight; and where its gradient is added (nullptr: not
// computed).
template <class T>
WeightView<T> projection_weight(const MultiheadAttentionOptions& o, const MultiheadAttentionWeights<T>& w,
                                int which) {
  const int64_t e = o.embed_dim;
  if (w.in_proj_weight.defined()) return {w.in_proj_weight.data() + which * e * e, e, e};
  const View<const T>* separate[3] = {&w.q_proj_weight, &w.k_proj_weight, &w.v_proj_weight};
  return {separate[which]->data(), e, separate[which]->size(1)};
}

template <class T>
T* projection_weight_grad(const MultiheadAttentionOptions& o, const MultiheadAttentionWeightGradients<T>& g,
                          int which) {
  const int64_t e = o.embed_dim;
  if (g.in_proj_weight.defined()) return g.in_proj_weight.data() + which * e * e;
  const View<T>* separate[3] = {&g.q_proj_weight, &g.k_proj_weight, &g.v_proj_weight};
  return separate[which]->defined() ? separate[which]->data() : nullptr;
}

// A view's memory (from `offset` on), nullptr when the view is undefined (absent).
template <class V>
auto data_or_null(const V& x, int64_t offset = 0) -> decltype(x.data()) {
  return x.defined() ? x.data() + offset : nullptr;
}

}  // namespace

attention::Scoring module_scoring(const MultiheadAttentionOptions& options, double dropout_p, uint64_t dropout_seed) {
  attention::Scoring s = options.scoring;
  s.dropout_p = dropout_p;
  s.dropout_seed = dropout_p > 0.0 ? dropout_seed : 0;
  return s;
}

template <class T>
attention::Options<T> MultiheadAttentionMasks<T>::core_options(const attention::Scoring& scoring) const {
  attention::Options<T> opt;
  static_cast<attention::Scoring&>(opt) = scoring;
  if (attend_mask) opt.attend_mask = *attend_mask;
  if (additive_mask) opt.additive_mask = *additive_mask;
  opt.causal = causal;
  if (sinks) opt.sinks = *sinks;
  if (alibi_slopes) opt.alibi_slopes = *alibi_slopes;
  return opt;
}

namespace {

// (N, H, L, S) → (N, L, S): the mean over heads (average_attn_weights).
template <class T>
Tensor<T> mean_over_heads(const Tensor<T>& w) {
  const int64_t n = w.size(0), heads = w.size(1), len = w.size(2), s = w.size(3);
  using W = widened_t<T>;  // bfloat16 sums in float, rounded once
  Tensor<T> mean = Tensor<T>::uninitialized({n, len, s});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < len * s; ++i) {
      W sum = 0;
      for (int64_t h = 0; h < heads; ++h) sum += widen(w[(b * heads + h) * len * s + i]);
      mean[b * len * s + i] = narrow<T>(sum / static_cast<W>(heads));
    }
  return mean;
}

}  // namespace

template <class T>
MultiheadAttention<T>::MultiheadAttention(const MultiheadAttentionOptions& options, uint64_t seed)
    : generator_(seed) {
  options_ = resolved_options(options);
  const int64_t e = options_.embed_dim;

  // PyTorch's _reset_parameters: xavier_uniform_ over the whole packed (3E, E) matrix (or each
  // separate weight), zero biases, out_proj.weight with nn.Linear's default
  // kaiming_uniform_(a=√5) = U(±1/√fan_in), xavier_normal_ for bias_k/bias_v.
  auto uniform = [&](Shape shape, double bound) {
    Param p{Tensor<T>(shape), Tensor<T>(shape)};
    for (auto& x : p.value.values()) x = narrow<T>(generator_.uniform(-bound, bound));
    return p;
  };
  auto xavier_uniform = [&](int64_t rows, int64_t cols) {
    return uniform({rows, cols}, std::sqrt(6.0 / static_cast<double>(rows + cols)));
  };
  if (packed_in_projection()) {
    in_proj_weight_ = xavier_uniform(3 * e, e);
  } else {
    q_proj_weight_ = xavier_uniform(e, e);
    k_proj_weight_ = xavier_uniform(e, kdim());
    v_proj_weight_ = xavier_uniform(e, vdim());
  }
  if (options_.bias) in_proj_bias_ = {Tensor<T>({3 * e}), Tensor<T>({3 * e})};
  out_proj_weight_ = uniform({e, e}, 1.0 / std::sqrt(static_cast<double>(e)));
  if (options_.bias) out_proj_bias_ = {Tensor<T>({e}), Tensor<T>({e})};
  if (options_.add_bias_kv) {
    // (1, 1, E): fan_in = fan_out = E, so xavier_normal_'s std is sqrt(2 / 2E).
    const double stddev = std::sqrt(1.0 / static_cast<double>(e));
    for (Param* p : {&bias_k_, &bias_v_}) {
      *p = {Tensor<T>({1, 1, e}), Tensor<T>({1, 1, e})};
      for (auto& x : p->value.values()) x = narrow<T>(generator_.normal(0.0, stddev));
    }
  }
}

template <class T>
std::vector<Parameter<T>> MultiheadAttention<T>::parameters() {
  std::vector<Parameter<T>> out;
  auto add = [&](const char* name, Param& p) { out.push_back({name, &p.value, &p.grad}); };
  if (packed_in_projection()) {
    add("in_proj_weight", in_proj_weight_);
  } else {
    add("q_proj_weight", q_proj_weight_);
    add("k_proj_weight", k_proj_weight_);
    add("v_proj_weight", v_proj_weight_);
  }
  if (options_.bias) add("in_proj_bias", in_proj_bias_);
  if (options_.add_bias_kv) {
    add("bias_k", bias_k_);
    add("bias_v", bias_v_);
  }
  add("out_proj.weight", out_proj_weight_);
  if (options_.bias) add("out_proj.bias", out_proj_bias_);
  return out;
}


template <class T>
MultiheadAttentionOutput<T> multihead_attention_forward(const MultiheadAttentionOptions& unresolved,
                                                        const MultiheadAttentionWeights<T>& weights,
                                                        View<const std::type_identity_t<T>> query,
                                                        View<const std::type_identity_t<T>> key,
                                                        View<const std::type_identity_t<T>> value,
                                                        const MultiheadAttentionArgs<T>& args, bool training,
                                                        uint64_t dropout_seed, attention::Backend backend,
                                                        MultiheadAttentionCache<T>* cache, const AttentionCore<T>& core) {
  const MultiheadAttentionOptions options = resolved_options(unresolved);
  detail::check_weights(options, weights);
  const int64_t e = options.embed_dim, heads = options.num_heads;
  const char* layout = options.batch_first ? "(N, L, E)" : "(L, N, E)";

  // 1. Layout: everything internal is batch-first (N, L, ·). Unbatched input is (L, ·).
  check(query.dim() == 2 || query.dim() == 3, "query: expected a 3-D tensor ", layout,
        " or a 2-D unbatched tensor (L, E), got shape ", query.shape());
  const bool unbatched = query.dim() == 2;
  check(key.dim() == query.dim() && value.dim() == query.dim(), "key/value: expected ", query.dim(),
        "-D tensors like query ", query.shape(), ", got key ", key.shape(),
        " and value ", value.shape());
  for (auto [name, x] : {std::pair<const char*, const View<const T>*>{"query", &query}, {"key", &key}, {"value", &value}})
    check(row_major(*x), name, ": expected contiguous (row-major) memory, got shape ", x->shape(),
          " with strides ", x->strides());
  const BatchFirst<T> q_in = batch_first_input(query, unbatched, options.batch_first);
  const BatchFirst<T> k_in = batch_first_input(key, unbatched, options.batch_first);
  const BatchFirst<T> v_in = batch_first_input(value, unbatched, options.batch_first);
  const int64_t n = q_in.view.size(0), len = q_in.view.size(1), src_len = k_in.view.size(1);
  check(q_in.view.size(2) == e, "query: expected last dimension embed_dim = ", e, ", got shape ",
        query.shape());
  check(k_in.view.size(2) == *options.kdim, "key: expected last dimension kdim = ", *options.kdim, ", got shape ",
        key.shape());
  check(v_in.view.size(2) == *options.vdim, "value: expected last dimension vdim = ", *options.vdim, ", got shape ",
        value.shape());
  check(k_in.view.size(0) == n && v_in.view.size(0) == n, "key/value: expected batch size ", n,
        " (from query ", query.shape(), "), got key ", key.shape(), " and value ",
        value.shape());
  check(v_in.view.size(1) == src_len, "value: expected the same sequence length as key (", src_len,
        "), got shape ", value.shape());

  // 2. Masks, in the attention core's form: checked before any work is done, and already with
  // the key columns that steps 4 and 5 append.
  MultiheadAttentionMasks<T> masks = multihead_attention_masks(options, args, n, len, src_len, unbatched);

  // 3. Input projections.
  const T* in_bias = data_or_null(weights.in_proj_bias);
  Tensor<T> q = linear_forward<T>(q_in.view, projection_weight(options, weights, 0), in_bias,
                                  "MultiheadAttention: q projection");
  Tensor<T> k = linear_forward<T>(k_in.view, projection_weight(options, weights, 1), in_bias ? in_bias + e : nullptr,
                                  "MultiheadAttention: k projection");
  Tensor<T> v = linear_forward<T>(v_in.view, projection_weight(options, weights, 2),
                                  in_bias ? in_bias + 2 * e : nullptr, "MultiheadAttention: v projection");

  // 4. add_bias_kv: one learned key/value appended to the sequence, (N, S, E) → (N, S+1, E).
  if (options.add_bias_kv) {
    k = append_row(k, weights.bias_k.data());
    v = append_row(v, weights.bias_v.data());
  }
  // 5. add_zero_attn: a zero key and value appended to every head, which is one zero row of
  // (N, S', E) before the heads are split.
  if (options.add_zero_attn) {
    k = append_row(k, static_cast<const T*>(nullptr));
    v = append_row(v, static_cast<const T*>(nullptr));
  }

  // 6–8. Split heads, attention, merge heads: the core reads the projections as (N, H, L, hd)
  // views and writes its output straight into the merged (N, L, E) layout, so neither the split
  // nor the merge copies anything; with need_weights also the weights (N, H, L, S').
  attention::Options<T> opt = masks.core_options(module_scoring(options, training ? options.dropout : 0.0, dropout_seed));
  opt.backend = backend;
  opt.need_weights = args.need_weights;
  auto merged = Tensor<T>::uninitialized({n, len, e});  // sdpa_forward_into writes it in full
  auto logsumexp = Tensor<double>::uninitialized({n, heads, len});  // written in full, as merged
  std::optional<Tensor<T>> weights_out;
  if (args.need_weights) weights_out = Tensor<T>({n, heads, len, k.size(1)});
  check(static_cast<bool>(core.forward) == static_cast<bool>(core.backward),
        "MultiheadAttention: core: expected both a forward and a backward, or neither");
  const attention::ForwardOutputs<T> outputs{heads_view(merged, heads), logsumexp,
                                             weights_out ? View<T>(*weights_out) : View<T>()};
  if (core.forward)
    core.forward(heads_view(q, heads), heads_view(k, heads), heads_view(v, heads), outputs, opt);
  else
    attention::sdpa_forward_into<T>(heads_view(q, heads), heads_view(k, heads), heads_view(v, heads), outputs, opt);

  // 9. out_proj, then back to the caller's layout; the weights averaged over heads unless
  // average_attn_weights=false.
  Tensor<T> out = linear_forward<T>(View<const T>(merged), {weights.out_proj_weight.data(), e, e},
                                    data_or_null(weights.out_proj_bias), "MultiheadAttention: out_proj");
  MultiheadAttentionOutput<T> result;
  result.output = to_caller_layout(std::move(out), unbatched, options.batch_first);
  if (args.need_weights) {
    Tensor<T> w = args.average_attn_weights ? mean_over_heads(*weights_out) : std::move(*weights_out);
    if (unbatched) {
      Shape shape = w.shape();
      shape.erase(shape.begin());
      w = std::move(w).reshape(shape);
    }
    result.attn_weights = std::move(w);
  }

  if (cache) {
    cache->q = std::move(q);
    cache->k = std::move(k);
    cache->v = std::move(v);
    cache->logsumexp = std::move(logsumexp);
    cache->merged = std::move(merged);
    cache->masks = std::move(masks);
    cache->scoring = opt;
  }
  return result;
}

template <class T>
template <class Kv>
Tensor<T> MultiheadAttention<T>::forward_cached(const Tensor<T>& x, KVCache<Kv>& cache, std::span<const int64_t> counts) {
  static_assert(std::is_same_v<T, float>, "the KV cache computes in float");
  const MultiheadAttentionOptions& o = options_;
  const int64_t e = o.embed_dim, heads = o.num_heads, hd = head_dim();
  check(packed_in_projection() && !o.add_bias_kv && !o.add_zero_attn,
        "MultiheadAttention::forward_cached: expected self-attention with kdim = vdim = embed_dim and neither "
        "add_bias_kv nor add_zero_attn, got kdim ", kdim(), ", vdim ", vdim(), ", add_bias_kv ", o.add_bias_kv,
        ", add_zero_attn ", o.add_zero_attn);
  check(x.dim() == 2 || x.dim() == 3, "MultiheadAttention::forward_cached: x: expected a 3-D tensor ",
        o.batch_first ? "(N, T, E)" : "(T, N, E)", " or a 2-D unbatched tensor (T, E), got shape ", x.shape());
  const bool unbatched = x.dim() == 2;
  const BatchFirst<T> in = batch_first_input(View<const T>(x), unbatched, o.batch_first);
  const int64_t n = in.view.size(0), len = in.view.size(1);
  check(in.view.size(2) == e, "MultiheadAttention::forward_cached: x: expected last dimension embed_dim = ", e,
        ", got shape ", x.shape());
  check(cache.batch() == n && cache.kv_heads() == heads && cache.qk_head_dim() == hd && cache.v_head_dim() == hd,
        "MultiheadAttention::forward_cached: cache: expected batch ", n, ", ", heads, " kv heads and head dims ", hd,
        ", got batch ", cache.batch(), ", ", cache.kv_heads(), " kv heads, head dims ", cache.qk_head_dim(), " and ",
        cache.v_head_dim());
  // One projection for q, k and v together: (N, T, 3E), each a (N, H, T, hd) view of it.
  const MultiheadAttentionWeights<T> w = weights();
  const Tensor<T> qkv = linear_forward<T>(in.view, {w.in_proj_weight.data(), 3 * e, e}, data_or_null(w.in_proj_bias),
                                          "MultiheadAttention: in projection");
  auto part = [&](int64_t which) {
    return View<const T>(qkv.data() + which * e, {n, heads, len, hd}, {len * 3 * e, hd, 3 * e, 1});
  };
  cache.append(part(1), part(2), counts);
  Tensor<T> merged({n, len, e});
  attend_into(cache, part(0), heads_view(merged, heads), module_scoring(options_, 0.0, 0));
  Tensor<T> out = linear_forward<T>(View<const T>(merged), {w.out_proj_weight.data(), e, e},
                                    data_or_null(w.out_proj_bias), "MultiheadAttention: out_proj");
  return to_caller_layout(std::move(out), unbatched, o.batch_first);
}

template Tensor<float> MultiheadAttention<float>::forward_cached(const Tensor<float>&, KVCache<float>&,
                                                                 std::span<const int64_t>);
template Tensor<float> MultiheadAttention<float>::forward_cached(const Tensor<float>&, KVCache<bfloat16>&,
                                                                 std::span<const int64_t>);
template Tensor<float> MultiheadAttention<float>::forward_cached(const Tensor<float>&, KVCache<float16>&,
                                                                 std::span<const int64_t>);

template <class T>
MultiheadAttentionGradients<T> multihead_attention_backward(const MultiheadAttentionOptions& unresolved,
                                                            const MultiheadAttentionWeights<T>& weights,
                                                            View<const std::type_identity_t<T>> grad_output,
                                                            const MultiheadAttentionSaved<T>& saved,
                                                            const MultiheadAttentionWeightGradients<T>& grads,
                                                            attention::Backend backend, const AttentionCore<T>& core) {
  const MultiheadAttentionOptions options = resolved_options(unresolved);
  detail::check_weights(options, weights);
  detail::check_gradients(options, grads);
  const int64_t e = options.embed_dim, heads = options.num_heads;

  // What forward saw and computed, checked against each other: the inputs fix N, L and S.
  for (auto [name, x] : {std::pair<const char*, const View<const T>*>{"query", &saved.query}, {"key", &saved.key},
                         {"value", &saved.value}, {"q", &saved.q}, {"k", &saved.k}, {"v", &saved.v},
                         {"merged", &saved.merged}}) {
    check(x->defined(), "MultiheadAttention backward: saved.", name, ": expected what forward saved, got none");
    check(row_major(*x), "MultiheadAttention backward: saved.", name, ": expected contiguous memory, got strides ",
          x->strides(), " for shape ", x->shape());
  }
  check(saved.query.dim() == 2 || saved.query.dim() == 3, "MultiheadAttention backward: saved.query: expected 2-D "
        "or 3-D, got shape ", saved.query.shape());
  const bool unbatched = saved.query.dim() == 2;
  check(saved.key.dim() == saved.query.dim() && saved.value.dim() == saved.query.dim(),
        "MultiheadAttention backward: saved.key/value: expected ", saved.query.dim(), "-D like saved.query, got ",
        saved.key.shape(), " and ", saved.value.shape());
  const BatchFirst<T> q_in = batch_first_input(saved.query, unbatched, options.batch_first);
  const BatchFirst<T> k_in = batch_first_input(saved.key, unbatched, options.batch_first);
  const BatchFirst<T> v_in = batch_first_input(saved.value, unbatched, options.batch_first);
  const int64_t n = q_in.view.size(0), len = q_in.view.size(1);
  const int64_t keys = k_in.view.size(1) + options.add_bias_kv + options.add_zero_attn;
  check_shape(saved.q.shape(), {n, len, e}, "MultiheadAttention backward: saved.q");
  check_shape(saved.k.shape(), {n, keys, e}, "MultiheadAttention backward: saved.k");
  check_shape(saved.v.shape(), {n, keys, e}, "MultiheadAttention backward: saved.v");
  check_shape(saved.merged.shape(), {n, len, e}, "MultiheadAttention backward: saved.merged");
  const Shape expected_shape = unbatched ? Shape{len, e} : (options.batch_first ? Shape{n, len, e} : Shape{len, n, e});
  check_shape(grad_output.shape(), expected_shape, "grad_output");
  check(row_major(grad_output), "grad_output: expected contiguous (row-major) memory, got strides ",
        grad_output.strides());
  const BatchFirst<T> grad_in = batch_first_input(grad_output, unbatched, options.batch_first);

  // 9. out_proj.
  Tensor<T> grad_merged = linear_backward<T>(saved.merged, {weights.out_proj_weight.data(), e, e}, grad_in.view,
                                             data_or_null(grads.out_proj_weight), data_or_null(grads.out_proj_bias),
                                             "MultiheadAttention: out_proj");
  // 8–5. Merge heads, attention, split heads, on (N, ·, E) memory seen as heads (as forward),
  // with the masks, causality and dropout forward used.
  // sdpa_backward_into overwrites every element of its outputs.
  auto grad_q = Tensor<T>::uninitialized(saved.q.shape()), grad_k = Tensor<T>::uninitialized(saved.k.shape()),
       grad_v = Tensor<T>::uninitialized(saved.v.shape());
  attention::Options<T> opt = saved.core;
  opt.backend = backend;
  MultiheadAttentionGradients<T> out;
  if (opt.sinks.defined()) out.grad_sinks = Tensor<T>({heads});
  const attention::GradientOutputs<T> outputs{heads_view(grad_q, heads), heads_view(grad_k, heads),
                                              heads_view(grad_v, heads), false,
                                              out.grad_sinks ? View<T>(*out.grad_sinks) : View<T>()};
  check(static_cast<bool>(core.forward) == static_cast<bool>(core.backward),
        "MultiheadAttention: core: expected both a forward and a backward, or neither");
  if (core.backward)
    core.backward(heads_view(saved.q, heads), heads_view(saved.k, heads), heads_view(saved.v, heads),
                  heads_view(saved.merged, heads), saved.logsumexp, heads_view(grad_merged, heads), outputs, opt);
  else
    attention::sdpa_backward_into<T>(heads_view(saved.q, heads), heads_view(saved.k, heads), heads_view(saved.v, heads),
                                     heads_view(saved.merged, heads), saved.logsumexp, heads_view(grad_merged, heads),
                                     outputs, opt);
  // 5. add_zero_attn: the zero key/value are constants.
  if (options.add_zero_attn) {
    grad_k = drop_last_row(grad_k);
    grad_v = drop_last_row(grad_v);
  }
  // 4. add_bias_kv: the appended position's gradient belongs to bias_k / bias_v.
  if (options.add_bias_kv) {
    const int64_t s = grad_k.size(1);
    for (auto [grad, from] : {std::pair<const View<T>*, const Tensor<T>*>{&grads.bias_k, &grad_k}, {&grads.bias_v, &grad_v}}) {
      if (!grad->defined()) continue;
      for (int64_t d = 0; d < e; ++d) {  // summed over the batch in float (a half type rounded once)
        auto sum = widen(grad->data()[d]);
        for (int64_t b = 0; b < n; ++b) sum += widen((*from)[(b * s + s - 1) * e + d]);
        grad->data()[d] = narrow<T>(sum);
      }
    }
    grad_k = drop_last_row(grad_k);
    grad_v = drop_last_row(grad_v);
  }
  // 3. Input projections.
  T* in_bias_grad = data_or_null(grads.in_proj_bias);
  out.grad_query = to_caller_layout(
      linear_backward<T>(q_in.view, projection_weight(options, weights, 0), View<const T>(grad_q),
                         projection_weight_grad(options, grads, 0), in_bias_grad, "MultiheadAttention: q projection"),
      unbatched, options.batch_first);
  out.grad_key = to_caller_layout(
      linear_backward<T>(k_in.view, projection_weight(options, weights, 1), View<const T>(grad_k),
                         projection_weight_grad(options, grads, 1), in_bias_grad ? in_bias_grad + e : nullptr,
                         "MultiheadAttention: k projection"),
      unbatched, options.batch_first);
  out.grad_value = to_caller_layout(
      linear_backward<T>(v_in.view, projection_weight(options, weights, 2), View<const T>(grad_v),
                         projection_weight_grad(options, grads, 2), in_bias_grad ? in_bias_grad + 2 * e : nullptr,
                         "MultiheadAttention: v projection"),
      unbatched, options.batch_first);
  return out;
}

template <class T>
MultiheadAttentionSaved<T> MultiheadAttentionCache<T>::saved() const {
  MultiheadAttentionSaved<T> s;
  s.query = view_of(query);
  s.key = view_of(key);
  s.value = view_of(value);
  s.q = view_of(q);
  s.k = view_of(k);
  s.v = view_of(v);
  s.logsumexp = view_of(logsumexp);
  s.merged = view_of(merged);
  s.core = masks.core_options(scoring);
  return s;
}

template <class T>
MultiheadAttentionWeights<T> MultiheadAttention<T>::weights() const {
  return {view_of(in_proj_weight_.value), view_of(q_proj_weight_.value), view_of(k_proj_weight_.value),
          view_of(v_proj_weight_.value),  view_of(in_proj_bias_.value),  view_of(bias_k_.value),
          view_of(bias_v_.value),         view_of(out_proj_weight_.value), view_of(out_proj_bias_.value)};
}

template <class T>
MultiheadAttentionWeightGradients<T> MultiheadAttention<T>::weight_gradients() {
  return {mutable_view_of(in_proj_weight_.grad), mutable_view_of(q_proj_weight_.grad),
          mutable_view_of(k_proj_weight_.grad),  mutable_view_of(v_proj_weight_.grad),
          mutable_view_of(in_proj_bias_.grad),   mutable_view_of(bias_k_.grad),
          mutable_view_of(bias_v_.grad),         mutable_view_of(out_proj_weight_.grad),
          mutable_view_of(out_proj_bias_.grad)};
}

template <class T>
MultiheadAttentionOutput<T> MultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                          const Tensor<T>& value,
                                                          const MultiheadAttentionArgs<T>& args,
                                                          MultiheadAttentionCache<T>* cache) {
  const bool training = this->is_training();
  const uint64_t dropout_seed =
      training && options_.dropout > 0 ? (uint64_t{generator_.next_u32()} << 32 | generator_.next_u32()) : 0;
  MultiheadAttentionOutput<T> result = multihead_attention_forward<T>(
      options_, weights(), view_of(query), view_of(key), view_of(value), args, training, dropout_seed, backend, cache,
      core);
  if (cache) {
    // Backward needs the inputs; the caller may change or free its tensors before then.
    cache->query = query;
    cache->key = key;
    cache->value = value;
  }
  return result;
}

template <class T>
MultiheadAttentionGradients<T> MultiheadAttention<T>::backward(const Tensor<T>& grad_output,
                                                               const MultiheadAttentionCache<T>& c) {
  check(c.query.defined(), "MultiheadAttention::backward: cache: expected the cache filled by forward, "
        "got an empty cache");
  return multihead_attention_backward<T>(options_, weights(), view_of(grad_output), c.saved(), weight_gradients(),
                                         backend, core);
}

#define MHA_INSTANTIATE(T)                                                                                          \
  template MultiheadAttentionOutput<T> multihead_attention_forward(                                                 \
      const MultiheadAttentionOptions&, const MultiheadAttentionWeights<T>&, View<const T>, View<const T>,           \
      View<const T>, const MultiheadAttentionArgs<T>&, bool, uint64_t, attention::Backend,                          \
      MultiheadAttentionCache<T>*, const AttentionCore<T>&);                                                        \
  template MultiheadAttentionGradients<T> multihead_attention_backward(                                             \
      const MultiheadAttentionOptions&, const MultiheadAttentionWeights<T>&, View<const T>,                         \
      const MultiheadAttentionSaved<T>&, const MultiheadAttentionWeightGradients<T>&, attention::Backend,           \
      const AttentionCore<T>&);                                                                                     \
  template struct MultiheadAttentionMasks<T>;                                                                       \
  template struct MultiheadAttentionCache<T>;                                                                       \
  template class MultiheadAttention<T>;
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace mha::nn
