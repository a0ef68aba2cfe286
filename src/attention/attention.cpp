// sdpa_forward / sdpa_backward: argument checks, then dispatch to the chosen backend.
#include "mha/attention/attention.h"

#include <cmath>
#include <type_traits>

#include "cpu_flash/cpu_flash.h"
#include "problem.h"
#include "reference.h"

namespace mha::attention {
namespace {

using detail::BroadcastView;
using detail::Masks;
using detail::Problem;

void check_rank4(const Shape& shape, const char* name, const char* layout) {
  check(shape.size() == 4, name, ": expected a 4-D tensor ", layout, ", got shape ", to_string(shape));
}

// A mask of rank 1..4 whose dimensions, aligned on the right, are 1 or the full size.
template <class M>
BroadcastView<M> broadcast_view(const Tensor<M>* mask, const Problem& p, const char* name) {
  BroadcastView<M> view;
  if (!mask) return view;
  const Shape full{p.batch, p.query_heads, p.query_len, p.key_len};
  const Shape& s = mask->shape();
  bool ok = !s.empty() && s.size() <= 4;
  for (size_t i = 0; ok && i < s.size(); ++i) {
    const int64_t want = full[4 - s.size() + i];
    ok = s[i] == want || s[i] == 1;
  }
  check(ok, name, ": expected a 1-D to 4-D shape broadcastable to (B, Hq, L, S) = ", to_string(full),
        ", got ", to_string(s));
  // Strides of the mask as stored, 0 where it broadcasts.
  int64_t stride[4] = {0, 0, 0, 0};
  int64_t running = 1;
  for (size_t i = s.size(); i-- > 0;) {
    const size_t axis = 4 - s.size() + i;
    stride[axis] = s[i] == 1 ? 0 : running;
    running *= s[i];
  }
  view.data = mask->data();
  view.stride_b = stride[0];
  view.stride_h = stride[1];
  view.stride_i = stride[2];
  view.stride_j = stride[3];
  return view;
}

template <class T>
Problem make_problem(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                     const Options<T>& options) {
  check_rank4(query.shape(), "query", "(B, Hq, L, Dqk)");
  check_rank4(key.shape(), "key", "(B, Hkv, S, Dqk)");
  check_rank4(value.shape(), "value", "(B, Hkv, S, Dv)");
  const Shape &q = query.shape(), &k = key.shape(), &v = value.shape();
  check(k[0] == q[0] && v[0] == q[0], "key/value: expected batch size ", q[0],
        " (from query ", to_string(q), "), got key ", to_string(k), " and value ", to_string(v));
  check(k[1] == v[1], "value: expected ", k[1], " heads (as key ", to_string(k), "), got ",
        to_string(v));
  check(k[2] == v[2], "value: expected sequence length ", k[2], " (as key ", to_string(k), "), got ",
        to_string(v));
  check(k[3] == q[3], "key: expected head size ", q[3], " (as query ", to_string(q), "), got ",
        to_string(k));
  check(k[1] > 0 && q[1] % k[1] == 0, "key: number of key/value heads must divide the ", q[1],
        " query heads (grouped-query attention), got ", k[1]);
  // The sizes the call works with, checked before anything is allocated: the output
  // (B, Hq, L, Dv), the logsumexp (B, Hq, L) and the score matrix (B, Hq, L, S), whose element
  // count is also the work, built or not. A product past 64 bits would wrap into a wrong size.
  checked_numel({q[0], q[1], q[2], v[3]}, "query and value: the output (B, Hq, L, Dv)");
  checked_numel({q[0], q[1], q[2]}, "query: the logsumexp (B, Hq, L)");
  checked_numel({q[0], q[1], q[2], k[2]}, "query and key: the score matrix (B, Hq, L, S)");
  check(std::isfinite(options.dropout_p) && options.dropout_p >= 0.0 && options.dropout_p <= 1.0,
        "dropout_p: expected a probability in [0, 1], got ", options.dropout_p);

  Problem p;
  p.batch = q[0];
  p.query_heads = q[1];
  p.kv_heads = k[1];
  p.query_len = q[2];
  p.key_len = k[2];
  p.qk_head_dim = q[3];
  p.v_head_dim = v[3];
  p.causal = options.causal;
  p.dropout_p = options.dropout_p;
  p.dropout_seed = options.dropout_seed;
  if (options.scale) {
    check(std::isfinite(*options.scale), "scale: expected a finite number, got ", *options.scale);
    p.scale = *options.scale;
  } else {
    check(p.qk_head_dim > 0, "query: head size must be > 0 for the default scale 1/sqrt(Dqk), got ",
          to_string(q));
    p.scale = 1.0 / std::sqrt(static_cast<double>(p.qk_head_dim));
  }
  return p;
}

template <class T>
Masks<T> make_masks(const Problem& p, const Options<T>& options) {
  return {broadcast_view(options.attend_mask, p, "attend_mask"),
          broadcast_view(options.additive_mask, p, "additive_mask")};
}

// The backend that runs: `automatic` is cpu_flash for float and reference for double (the
// double path exists for checking, where the plain definition is what is wanted).
template <class T>
Backend resolve_backend(Backend requested) {
  if (requested == Backend::automatic) return std::is_same_v<T, float> ? Backend::cpu_flash : Backend::reference;
  check(requested != Backend::cpu_flash || std::is_same_v<T, float>,
        "options.backend: cpu_flash supports float32 only (use reference or automatic for double)");
  return requested;
}

// No query rows (B, Hq or L is 0): the results are empty whatever the backend, and are made
// here, so that no backend multiplies sizes of which one is 0 and the others may be huge (the
// checks above allow B·Hq past 64 bits when L is 0, as a product with a zero factor is 0).
bool no_query_rows(const Problem& p) { return p.batch == 0 || p.query_heads == 0 || p.query_len == 0; }

}  // namespace

template <class T>
ForwardResult<T> sdpa_forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                              const Options<T>& options) {
  const Problem p = make_problem(query, key, value, options);
  const Masks<T> masks = make_masks(p, options);
  const Backend backend = resolve_backend<T>(options.backend);
  if (no_query_rows(p)) {
    ForwardResult<T> empty{Tensor<T>({p.batch, p.query_heads, p.query_len, p.v_head_dim}),
                           Tensor<double>({p.batch, p.query_heads, p.query_len}), std::nullopt};
    if (options.need_weights) empty.weights = Tensor<T>({p.batch, p.query_heads, p.query_len, p.key_len});
    return empty;
  }
  switch (backend) {
    case Backend::reference:
      return detail::reference_forward(p, masks, query, key, value, options.need_weights);
    case Backend::cpu_flash:
      if constexpr (std::is_same_v<T, float>)
        return detail::cpu_flash_forward(p, masks, query, key, value, options.need_weights);
      break;
    case Backend::automatic:
      break;
  }
  throw Error("sdpa_forward: options.backend: unknown backend");
}

template <class T>
Gradients<T> sdpa_backward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const Tensor<T>& output, const Tensor<double>& logsumexp,
                           const Tensor<T>& grad_output, const Options<T>& options) {
  const Problem p = make_problem(query, key, value, options);
  const Masks<T> masks = make_masks(p, options);
  const Shape out_shape{p.batch, p.query_heads, p.query_len, p.v_head_dim};
  check_shape(output.shape(), out_shape, "output");
  check_shape(grad_output.shape(), out_shape, "grad_output");
  check_shape(logsumexp.shape(), {p.batch, p.query_heads, p.query_len}, "logsumexp");
  const Backend backend = resolve_backend<T>(options.backend);
  // No query rows: no gradient reaches anything.
  if (no_query_rows(p)) return {Tensor<T>(query.shape()), Tensor<T>(key.shape()), Tensor<T>(value.shape())};
  switch (backend) {
    case Backend::reference:
      return detail::reference_backward(p, masks, query, key, value, output, logsumexp, grad_output);
    case Backend::cpu_flash:
      if constexpr (std::is_same_v<T, float>)
        return detail::cpu_flash_backward(p, masks, query, key, value, output, logsumexp, grad_output);
      break;
    case Backend::automatic:
      break;
  }
  throw Error("sdpa_backward: options.backend: unknown backend");
}

template ForwardResult<float> sdpa_forward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                           const Options<float>&);
template ForwardResult<double> sdpa_forward(const Tensor<double>&, const Tensor<double>&,
                                            const Tensor<double>&, const Options<double>&);
template Gradients<float> sdpa_backward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                        const Tensor<float>&, const Tensor<double>&, const Tensor<float>&,
                                        const Options<float>&);
template Gradients<double> sdpa_backward(const Tensor<double>&, const Tensor<double>&,
                                         const Tensor<double>&, const Tensor<double>&,
                                         const Tensor<double>&, const Tensor<double>&,
                                         const Options<double>&);

}  // namespace mha::attention
