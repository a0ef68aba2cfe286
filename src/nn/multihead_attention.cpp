// The module follows torch.nn.functional.multi_head_attention_forward step by step:
// layout → masks → input projections → add_bias_kv → split heads → add_zero_attn → attention
// → merge heads → out_proj (splitting and merging heads are views, not copies). backward walks the same steps in reverse. All of PyTorch's mask
// handling, spread over that function, is gathered in canonical_masks, which forward calls once.
#include "mha/nn/multihead_attention.h"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "mha/nn/linear.h"

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
View<const T> heads_view(const Tensor<T>& x, int64_t heads) {
  return heads_view(x.data(), x.size(0), x.size(1), heads, x.size(2) / heads);
}
template <class T>
View<T> heads_view(Tensor<T>& x, int64_t heads) {
  return heads_view(x.data(), x.size(0), x.size(1), heads, x.size(2) / heads);
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

// Drops the last position of dim `axis` (the inverse of append_row / a zero-attention column).
template <class T>
Tensor<T> drop_last(const Tensor<T>& x, int64_t axis) {
  Shape shape = x.shape();
  const int64_t len = shape[static_cast<size_t>(axis)];
  int64_t outer = 1, inner = 1;
  for (int64_t a = 0; a < axis; ++a) outer *= shape[static_cast<size_t>(a)];
  for (int64_t a = axis + 1; a < x.dim(); ++a) inner *= shape[static_cast<size_t>(a)];
  shape[static_cast<size_t>(axis)] = len - 1;
  Tensor<T> out(shape);
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(x.data() + o * len * inner, (len - 1) * inner, out.data() + o * (len - 1) * inner);
  return out;
}

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

// The masks as the attention core takes them: at most one bool mask, in the core's polarity
// (true = may attend), and one float mask added to the scores, each rank 4 (N|1, H|1, L|1, S')
// with S' counting the add_bias_kv / add_zero_attn columns; plus the causality the is_causal
// hint turns into.
template <class T>
struct CoreMasks {
  std::optional<Tensor<bool>> attend_mask;
  std::optional<Tensor<T>> additive_mask;
  Causal causal = Causal::none;
};

// Everything multi_head_attention_forward does to attn_mask and key_padding_mask, in one place
// (PyTorch spreads it over the function). query is (N, L, ·) and key (N, S, ·) after the layout
// step; `unbatched`: the masks come without N (key_padding_mask (S), attn_mask (num_heads, L, S)).
template <class T>
CoreMasks<T> canonical_masks(const MultiheadAttentionArgs<T>& args, const MultiheadAttentionOptions& options,
                             int64_t n, int64_t len, int64_t src_len, bool unbatched) {
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
            to_string(s));
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
  CoreMasks<T> out;
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
      out.additive_mask = out.additive_mask ? broadcast_combine(*out.additive_mask, f, std::plus<T>()) : f;
    }
  }

  // 5. Flip to the attention core's polarity (true = may attend).
  if (blocked) {
    for (int64_t i = 0; i < blocked->numel(); ++i) (*blocked)[i] = !(*blocked)[i];
    out.attend_mask = std::move(blocked);
  }
  return out;
}

// The attention core's options for what forward chose and saved in the cache (masks, causality,
// dropout), so that backward runs the core on exactly what forward ran.
template <class T>
attention::Options<T> core_options(const MultiheadAttentionCache<T>& c, attention::Backend backend) {
  attention::Options<T> opt;
  if (c.attend_mask) opt.attend_mask = *c.attend_mask;
  if (c.additive_mask) opt.additive_mask = *c.additive_mask;
  opt.causal = c.causal;
  opt.dropout_p = c.dropout_p;
  opt.dropout_seed = c.dropout_seed;
  opt.backend = backend;
  return opt;
}

// (N, H, L, S) → (N, L, S): the mean over heads (average_attn_weights).
template <class T>
Tensor<T> mean_over_heads(const Tensor<T>& w) {
  const int64_t n = w.size(0), heads = w.size(1), len = w.size(2), s = w.size(3);
  Tensor<T> mean({n, len, s});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < len * s; ++i) mean[b * len * s + i] += w[(b * heads + h) * len * s + i];
  for (auto& x : mean.values()) x /= static_cast<T>(heads);
  return mean;
}

}  // namespace

template <class T>
MultiheadAttention<T>::MultiheadAttention(const MultiheadAttentionOptions& options, uint64_t seed)
    : options_(options), generator_(seed) {
  const int64_t e = options_.embed_dim, h = options_.num_heads;
  check(h > 0, "MultiheadAttention: num_heads: expected > 0, got ", h);
  check(e % h == 0, "MultiheadAttention: embed_dim must be divisible by num_heads, got embed_dim ", e,
        " and num_heads ", h);
  check(std::isfinite(options_.dropout) && options_.dropout >= 0.0 && options_.dropout <= 1.0,
        "MultiheadAttention: dropout: expected a probability in [0, 1], got ", options_.dropout);
  if (!options_.kdim) options_.kdim = e;
  if (!options_.vdim) options_.vdim = e;
  // Widths beyond what BLAS indexes (int) cannot be computed; refusing them here also keeps
  // 3·embed_dim and every weight size far from int64 overflow.
  constexpr int64_t kMaxWidth = std::numeric_limits<int>::max() / 3;
  for (auto [name, width] : {std::pair<const char*, int64_t>{"embed_dim", e}, {"kdim", *options_.kdim},
                             {"vdim", *options_.vdim}})
    check(width > 0 && width <= kMaxWidth, "MultiheadAttention: ", name, ": expected 1 to ", kMaxWidth, ", got ",
          width);

  // PyTorch's _reset_parameters: xavier_uniform_ over the whole packed (3E, E) matrix (or each
  // separate weight), zero biases, out_proj.weight with nn.Linear's default
  // kaiming_uniform_(a=√5) = U(±1/√fan_in), xavier_normal_ for bias_k/bias_v.
  auto uniform = [&](Shape shape, double bound) {
    Param p{Tensor<T>(shape), Tensor<T>(shape)};
    for (auto& x : p.value.values()) x = static_cast<T>(generator_.uniform(-bound, bound));
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
      for (auto& x : p->value.values()) x = static_cast<T>(generator_.normal(0.0, stddev));
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
WeightView<T> MultiheadAttention<T>::projection_weight(int which) const {
  const int64_t e = options_.embed_dim;
  if (packed_in_projection()) return weight_rows(in_proj_weight_.value, which * e, e);
  const Param* separate[3] = {&q_proj_weight_, &k_proj_weight_, &v_proj_weight_};
  return weight_view(separate[which]->value);
}

template <class T>
T* MultiheadAttention<T>::projection_weight_grad(int which) {
  if (packed_in_projection()) return in_proj_weight_.grad.data() + which * options_.embed_dim * options_.embed_dim;
  Param* separate[3] = {&q_proj_weight_, &k_proj_weight_, &v_proj_weight_};
  return separate[which]->grad.data();
}

template <class T>
MultiheadAttentionOutput<T> MultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                          const Tensor<T>& value,
                                                          const MultiheadAttentionArgs<T>& args,
                                                          MultiheadAttentionCache<T>* cache) {
  const int64_t e = options_.embed_dim, heads = options_.num_heads;
  const char* layout = options_.batch_first ? "(N, L, E)" : "(L, N, E)";

  // 1. Layout: everything internal is batch-first (N, L, ·). Unbatched input is (L, ·).
  check(query.dim() == 2 || query.dim() == 3, "query: expected a 3-D tensor ", layout,
        " or a 2-D unbatched tensor (L, E), got shape ", to_string(query.shape()));
  const bool unbatched = query.dim() == 2;
  check(key.dim() == query.dim() && value.dim() == query.dim(), "key/value: expected ", query.dim(),
        "-D tensors like query ", to_string(query.shape()), ", got key ", to_string(key.shape()),
        " and value ", to_string(value.shape()));
  // The caller's tensor itself when it is batch-first already (no copy), else a batch-first copy.
  std::optional<Tensor<T>> copies[3];
  auto to_internal = [&](const Tensor<T>& x, int which) -> const Tensor<T>& {
    if (!unbatched && options_.batch_first) return x;
    copies[which] = unbatched ? unsqueeze(x, 0) : permute(x, {1, 0, 2});
    return *copies[which];
  };
  const Tensor<T>&q_in = to_internal(query, 0), &k_in = to_internal(key, 1), &v_in = to_internal(value, 2);
  const int64_t n = q_in.size(0), len = q_in.size(1), src_len = k_in.size(1);
  check(q_in.size(2) == e, "query: expected last dimension embed_dim = ", e, ", got shape ",
        to_string(query.shape()));
  check(k_in.size(2) == kdim(), "key: expected last dimension kdim = ", kdim(), ", got shape ",
        to_string(key.shape()));
  check(v_in.size(2) == vdim(), "value: expected last dimension vdim = ", vdim(), ", got shape ",
        to_string(value.shape()));
  check(k_in.size(0) == n && v_in.size(0) == n, "key/value: expected batch size ", n,
        " (from query ", to_string(query.shape()), "), got key ", to_string(key.shape()), " and value ",
        to_string(value.shape()));
  check(v_in.size(1) == src_len, "value: expected the same sequence length as key (", src_len,
        "), got shape ", to_string(value.shape()));

  // 2. Masks, in the attention core's form (canonical_masks): checked before any work is done,
  // and already with the key columns that steps 4 and 6 append.
  MultiheadAttentionCache<T> local;
  MultiheadAttentionCache<T>& c = cache ? *cache : local;
  CoreMasks<T> masks = canonical_masks(args, options_, n, len, src_len, unbatched);
  c.attend_mask = std::move(masks.attend_mask);
  c.additive_mask = std::move(masks.additive_mask);
  c.causal = masks.causal;

  // 3. Input projections.
  const T* in_bias = options_.bias ? in_proj_bias_.value.data() : nullptr;
  Tensor<T> q = linear_forward(q_in, projection_weight(0), in_bias, "MultiheadAttention: q projection");
  Tensor<T> k = linear_forward(k_in, projection_weight(1), in_bias ? in_bias + e : nullptr,
                               "MultiheadAttention: k projection");
  Tensor<T> v = linear_forward(v_in, projection_weight(2), in_bias ? in_bias + 2 * e : nullptr,
                               "MultiheadAttention: v projection");

  // 4. add_bias_kv: one learned key/value appended to the sequence, (N, S, E) → (N, S+1, E).
  if (options_.add_bias_kv) {
    k = append_row(k, bias_k_.value.data());
    v = append_row(v, bias_v_.value.data());
  }
  // 5. add_zero_attn: a zero key and value appended to every head, which is one zero row of
  // (N, S', E) before the heads are split.
  if (options_.add_zero_attn) {
    k = append_row(k, static_cast<const T*>(nullptr));
    v = append_row(v, static_cast<const T*>(nullptr));
  }

  // 6–8. Split heads, attention, merge heads: the core reads the projections as (N, H, L, hd)
  // views and writes its output straight into the merged (N, L, E) layout, so neither the split
  // nor the merge copies anything; with need_weights also the weights (N, H, L, S').
  c.dropout_p = this->is_training() ? options_.dropout : 0.0;
  c.dropout_seed = c.dropout_p > 0 ? (uint64_t{generator_.next_u32()} << 32 | generator_.next_u32()) : 0;
  attention::Options<T> opt = core_options(c, backend);
  opt.need_weights = args.need_weights;
  auto merged = Tensor<T>::uninitialized({n, len, e});  // sdpa_forward_into writes it in full
  Tensor<double> logsumexp({n, heads, len});
  std::optional<Tensor<T>> weights;
  if (args.need_weights) weights = Tensor<T>({n, heads, len, k.size(1)});
  attention::sdpa_forward_into<T>(heads_view(q, heads), heads_view(k, heads), heads_view(v, heads),
                                  {heads_view(merged, heads), logsumexp, weights ? View<T>(*weights) : View<T>()}, opt);

  // 9. out_proj, then back to the caller's layout; the weights averaged over heads unless
  // average_attn_weights=false.
  Tensor<T> out = linear_forward(merged, weight_view(out_proj_weight_.value),
                                 options_.bias ? out_proj_bias_.value.data() : nullptr, "MultiheadAttention: out_proj");
  MultiheadAttentionOutput<T> result;
  if (unbatched) {
    result.output = squeeze(out, 0);
  } else {
    result.output = options_.batch_first ? std::move(out) : permute(out, {1, 0, 2});
  }
  if (args.need_weights) {
    Tensor<T> w = args.average_attn_weights ? mean_over_heads(*weights) : std::move(*weights);
    result.attn_weights = unbatched ? squeeze(w, 0) : std::move(w);
  }

  if (cache) {
    // Backward needs the inputs: the batch-first copies, or copies of the caller's tensors.
    c.query = copies[0] ? std::move(*copies[0]) : q_in;
    c.key = copies[1] ? std::move(*copies[1]) : k_in;
    c.value = copies[2] ? std::move(*copies[2]) : v_in;
    c.q = std::move(q);
    c.k = std::move(k);
    c.v = std::move(v);
    c.logsumexp = std::move(logsumexp);
    c.merged = std::move(merged);
    c.unbatched = unbatched;
    c.batch_first = options_.batch_first;
  }
  return result;
}

template <class T>
MultiheadAttentionGradients<T> MultiheadAttention<T>::backward(const Tensor<T>& grad_output,
                                                               const MultiheadAttentionCache<T>& c) {
  const int64_t e = options_.embed_dim, heads = options_.num_heads;
  check(c.query.defined(), "MultiheadAttention::backward: cache: expected the cache filled by forward, "
        "got an empty cache");
  const int64_t n = c.query.size(0), len = c.query.size(1);
  const Shape expected_shape = c.unbatched ? Shape{len, e} : (c.batch_first ? Shape{n, len, e} : Shape{len, n, e});
  check_shape(grad_output.shape(), expected_shape, "grad_output");
  auto to_internal = [&](const Tensor<T>& x) {
    if (c.unbatched) return unsqueeze(x, 0);
    return c.batch_first ? x : permute(x, {1, 0, 2});
  };
  auto to_user = [&](Tensor<T> x) {
    if (c.unbatched) return squeeze(x, 0);
    return c.batch_first ? x : permute(x, {1, 0, 2});
  };

  // 9. out_proj.
  Tensor<T> grad_merged = linear_backward(c.merged, weight_view(out_proj_weight_.value), to_internal(grad_output),
                                          out_proj_weight_.grad.data(),
                                          options_.bias ? out_proj_bias_.grad.data() : nullptr);
  // 8–5. Merge heads, attention, split heads, on (N, ·, E) memory seen as heads (as forward),
  // with the masks, causality and dropout forward used.
  Tensor<T> grad_q(c.q.shape()), grad_k(c.k.shape()), grad_v(c.v.shape());
  attention::sdpa_backward_into<T>(heads_view(c.q, heads), heads_view(c.k, heads), heads_view(c.v, heads),
                                   heads_view(c.merged, heads), c.logsumexp, heads_view(grad_merged, heads),
                                   {heads_view(grad_q, heads), heads_view(grad_k, heads), heads_view(grad_v, heads)},
                                   core_options(c, backend));
  // 5. add_zero_attn: the zero key/value are constants.
  if (options_.add_zero_attn) {
    grad_k = drop_last(grad_k, 1);
    grad_v = drop_last(grad_v, 1);
  }
  // 4. add_bias_kv: the appended position's gradient belongs to bias_k / bias_v.
  if (options_.add_bias_kv) {
    const int64_t s = grad_k.size(1);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t d = 0; d < e; ++d) {
        bias_k_.grad[d] += grad_k[(b * s + s - 1) * e + d];
        bias_v_.grad[d] += grad_v[(b * s + s - 1) * e + d];
      }
    grad_k = drop_last(grad_k, 1);
    grad_v = drop_last(grad_v, 1);
  }
  // 3. Input projections.
  T* in_bias_grad = options_.bias ? in_proj_bias_.grad.data() : nullptr;
  MultiheadAttentionGradients<T> out;
  out.grad_query = to_user(linear_backward(c.query, projection_weight(0), grad_q, projection_weight_grad(0),
                                           in_bias_grad));
  out.grad_key = to_user(linear_backward(c.key, projection_weight(1), grad_k, projection_weight_grad(1),
                                         in_bias_grad ? in_bias_grad + e : nullptr));
  out.grad_value = to_user(linear_backward(c.value, projection_weight(2), grad_v, projection_weight_grad(2),
                                           in_bias_grad ? in_bias_grad + 2 * e : nullptr));
  return out;
}

template class MultiheadAttention<float>;
template class MultiheadAttention<double>;

}  // namespace mha::nn
