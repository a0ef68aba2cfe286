// sdpa_forward / sdpa_backward: the arguments checked (checks.h), then the call dispatched to the
// chosen backend (a half-precision call's reference runs in float: half_reference.h).
#include "mha/attention/attention.h"
#include "mha/attention/work_split.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu_flash/cpu_flash.h"
#include "decode/decode.h"
#include "half_reference.h"
#include "mha/core/half.h"
#include "problem.h"
#include "reference.h"
#include "work_split.h"

namespace mha::attention {
namespace {

using detail::ByteRanges;
using detail::check_output;
using detail::check_rank4;
using detail::input_ranges;
using detail::lse_rows_of;
using detail::make_additions;
using detail::make_problem;
using detail::make_sinks;
using detail::Problem;
using detail::Rows;
using detail::rows_of;
using detail::ScoreAdditions;

// The backend that runs the forward: `automatic` is decode for float, bfloat16 and float16 with at
// most detail::kDecodeRows query rows and no weights asked for, cpu_flash for their other calls, reference
// for double (the double path exists for checking, where the plain definition is what is wanted).
template <class T>
Backend resolve_backend(Backend requested, const Problem& p, bool need_weights) {
  constexpr bool fused = !std::is_same_v<T, double>;
  if (requested == Backend::automatic) {
    if (!fused) return Backend::reference;
    return p.query_len <= detail::kDecodeRows && !need_weights && !p.packed.present() ? Backend::decode : Backend::cpu_flash;
  }
  check(requested != Backend::decode || !p.packed.present(),
        "options.backend: decode does not take packed sequences (cu_seqlens): use cpu_flash or automatic");
  check(requested != Backend::cpu_flash || fused,
        "options.backend: cpu_flash supports float32, bfloat16 and float16 (use reference or automatic for double)");
  check(requested != Backend::decode || fused,
        "options.backend: decode supports float32, bfloat16 and float16 (use reference or automatic for double)");
  check(requested != Backend::decode || !need_weights,
        "options.backend: decode does not return the weights (options.need_weights is set): use cpu_flash or "
        "reference");
  return requested;
}

// The backward's: decode is a forward kernel, so its calls' backward runs cpu_flash (the same
// function of the same inputs, differing only in float rounding).
template <class T>
Backend resolve_backward_backend(Backend requested, const Problem& p) {
  const Backend b = resolve_backend<T>(requested == Backend::decode ? Backend::cpu_flash : requested, p, false);
  return b == Backend::decode ? Backend::cpu_flash : b;
}

// No query rows (B, Hq or L is 0): the results are empty whatever the backend, and are made
// here, so that no backend multiplies sizes of which one is 0 and the others may be huge (the
// checks above allow B·Hq past 64 bits when L is 0, as a product with a zero factor is 0).
bool no_query_rows(const Problem& p) { return p.batch == 0 || p.query_heads == 0 || p.query_len == 0; }

template <class T>
void zero(const View<T>& v) {
  if (v.numel() == 0) return;
  if (v.contiguous()) {
    std::fill_n(v.data(), v.numel(), T{});
    return;
  }
  // Rows of the last dimension (rank 3 or 4 here), each contiguous or strided.
  const int64_t d = v.dim();
  const int64_t rows = v.numel() / v.size(d - 1);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0, rest = r;
    for (int64_t a = d - 2; a >= 0; --a) {
      offset += (rest % v.size(a)) * v.stride(a);
      rest /= v.size(a);
    }
    for (int64_t c = 0; c < v.size(d - 1); ++c) v.data()[offset + c * v.stride(d - 1)] = T{};
  }
}

// A call's operands as a backend reads them (query, key, value, sinks), checked with the problem
// they make.
template <class T, class Kv, class Args>
Problem read_operands(Args& a, const View<const T>& query, const View<const Kv>& key, const View<const Kv>& value,
                      const Options<T>& options) {
  a.query = rows_of(query, "query", "(B, Hq, L, Dqk)");
  a.key = rows_of(key, "key", "(B, Hkv, S, Dqk)");
  a.value = rows_of(value, "value", "(B, Hkv, S, Dv)");
  const Problem p = make_problem(query.shape(), key.shape(), value.shape(), options);
  a.sinks = make_sinks(p, options);
  return p;
}

// The two calls, on views: `fresh` when the outputs are newly made tensors (zero already,
// distinct from everything), so neither the checks nor the zeroing is needed. Keys and values
// are T, or (Kv, with T float) bfloat16/float16: decode and cpu_flash read those in place (widened
// where they are read or packed), the reference converted to float.
template <class T, class Kv = T>
void forward(View<const T> query, View<const Kv> key, View<const Kv> value, const ForwardOutputs<T>& out,
             const Options<T>& options, bool fresh) {
  detail::ForwardArgs<T, Kv> a;
  const Problem p = read_operands(a, query, key, value, options);
  const ScoreAdditions<T> additions = make_additions(p, options);
  const Backend backend = resolve_backend<T>(options.backend, p, options.need_weights);
  if (!fresh) {
    const ByteRanges inputs = input_ranges({byte_range(query), byte_range(key), byte_range(value)}, options);
    ByteRanges written;
    check_output(out.output, {p.batch, p.query_heads, p.query_len, p.v_head_dim}, "output", inputs, written);
    check_output(out.logsumexp, {p.batch, p.query_heads, p.query_len}, "logsumexp", inputs, written);
    check(out.weights.defined() == options.need_weights, "weights: expected ",
          options.need_weights ? "an output for the weights (options.need_weights is set)"
                               : "none (options.need_weights is not set)",
          ", got ", out.weights.defined() ? "one" : "none");
    if (options.need_weights)
      check_output(out.weights, {p.batch, p.query_heads, p.query_len, p.key_len}, "weights", inputs, written);
  }
  if constexpr (is_half_v<T> || is_half_v<Kv>) {
    if (backend == Backend::reference) return detail::forward_in_float(query, key, value, out, options);
  }
  a.output = rows_of(out.output, "output", "(B, Hq, L, Dv)");
  if (options.need_weights) a.weights = rows_of(out.weights, "weights", "(B, Hq, L, S)");
  a.logsumexp = lse_rows_of(out.logsumexp);
  if (!fresh) {
    // Only what a backend does not write in full (problem.h): on a fresh output the zeroing would
    // be the first touch, on one thread, where cpu_flash touches it first on all of them.
    if (backend == Backend::reference) zero(out.output);
    if (options.need_weights) zero(out.weights);
  }
  if (no_query_rows(p)) return;  // the (empty) results are made
  if constexpr (!std::is_same_v<T, double>) {
    if (backend == Backend::decode) return detail::decode_forward(p, additions, a);
    if (backend == Backend::cpu_flash) return detail::cpu_flash_forward(p, additions, a);
  }
  if constexpr (!is_half_v<T> && !is_half_v<Kv>) {
    if (backend == Backend::reference) return detail::reference_forward(p, additions, a);
  }
  throw Error("sdpa_forward: options.backend: unknown backend");
}

// The sinks' gradient, for every backend: the sink's column of dS = P∘(dP − D), where dP is 0 (the
// sink adds nothing to the output), summed over the batch and the rows:
//   grad_sinks[h] (+)= −Σ_{b,i} exp(sink_h − lse_bhi) · D_bhi,   D_bhi = Σ_j P_bhij dP_bhij = dO_bhi · O_bhi
// in double, rows in order (the same sum for any thread count). D is the backend's own where it
// gives it (a.row_deltas: cpu_flash's, from P and dP in float), else dO·O: from an output rounded
// to bfloat16 that is 2⁻⁹-relative per element, and a sum of such rows can cancel to far less than
// its terms (a bfloat16 gradient 12 ulps off, where PyTorch's eager autograd, summing P·dP, was
// within 1). A block of keys without the sink (make_sinks) adds 0; a row that sees no key has
// O = 0, so D = 0.
template <class T>
void sink_gradients(const Problem& p, const detail::BackwardArgs<T>& a, const View<T>& grad_sinks, bool accumulate) {
  for (int64_t h = 0; h < p.query_heads; ++h) {
    double sum = 0;
    const double sink = a.sinks.of(0, h);
    for (int64_t b = 0; b < p.batch && sink != -std::numeric_limits<double>::infinity(); ++b)
      for (int64_t i = 0; i < p.query_len; ++i) {
        double d = 0;
        if (a.row_deltas) {
          d = a.row_deltas[(b * p.query_heads + h) * p.query_len + i];
        } else {
          const T* dout = a.grad_output.row(b, h, i);
          const T* out = a.output.row(b, h, i);
          for (int64_t e = 0; e < p.v_head_dim; ++e) d += static_cast<double>(widen(dout[e])) * static_cast<double>(widen(out[e]));
        }
        if (d != 0) sum -= std::exp(sink - *a.logsumexp.row(b, h, i)) * d;
      }
    T& g = grad_sinks.data()[h * grad_sinks.stride(0)];
    g = narrow<T>((accumulate ? static_cast<double>(widen(g)) : 0.0) + sum);
  }
}

template <class T>
void backward(View<const T> query, View<const T> key, View<const T> value, View<const T> output,
              View<const double> logsumexp, View<const T> grad_output, const GradientOutputs<T>& grads,
              const Options<T>& options, bool fresh) {
  detail::BackwardArgs<T> a;
  const Problem p = read_operands(a, query, key, value, options);
  const ScoreAdditions<T> additions = make_additions(p, options);
  const Shape out_shape{p.batch, p.query_heads, p.query_len, p.v_head_dim};
  check_shape(output.shape(), out_shape, "output");
  check_shape(grad_output.shape(), out_shape, "grad_output");
  check_shape(logsumexp.shape(), {p.batch, p.query_heads, p.query_len}, "logsumexp");
  a.output = rows_of(output, "output", "(B, Hq, L, Dv)");
  a.grad_output = rows_of(grad_output, "grad_output", "(B, Hq, L, Dv)");
  a.logsumexp = lse_rows_of(logsumexp);
  const Backend backend = resolve_backward_backend<T>(options.backend, p);
  if (!fresh) {
    auto inputs = input_ranges({byte_range(query), byte_range(key), byte_range(value), byte_range(output),
                                byte_range(grad_output)}, options);
    inputs.push_back(byte_range(logsumexp));
    ByteRanges written;
    check_output(grads.grad_query, query.shape(), "grad_query", inputs, written);
    check_output(grads.grad_key, key.shape(), "grad_key", inputs, written);
    check_output(grads.grad_value, value.shape(), "grad_value", inputs, written);
    check(!grads.grad_sinks.defined() || options.sinks.defined(),
          "grad_sinks: expected none (options.sinks is not given), got one");
    if (grads.grad_sinks.defined()) check_output(grads.grad_sinks, {p.query_heads}, "grad_sinks", inputs, written);
  }
  a.grad_query = rows_of(grads.grad_query, "grad_query", "(B, Hq, L, Dqk)");
  a.grad_key = rows_of(grads.grad_key, "grad_key", "(B, Hkv, S, Dqk)");
  a.grad_value = rows_of(grads.grad_value, "grad_value", "(B, Hkv, S, Dv)");
  if (!fresh && !grads.accumulate) {
    zero(grads.grad_query);
    zero(grads.grad_key);
    zero(grads.grad_value);
  }
  Tensor<double> row_deltas;  // cpu_flash's D of each row, for the sinks' gradient
  if (grads.grad_sinks.defined() && backend == Backend::cpu_flash && !no_query_rows(p)) {
    row_deltas = Tensor<double>({p.batch, p.query_heads, p.query_len});
    a.row_deltas = row_deltas.data();
  }
  Tensor<T> output_again;
  Tensor<double> logsumexp_again;
  [&] {
    // No query rows: no gradient reaches anything.
    if (no_query_rows(p)) return;
    if constexpr (!std::is_same_v<T, double>) {
      // The forward ran on decode, whose scores s are summed in another order than the ones
      // cpu_flash's backward recomputes: with large logits the two differ by ulps of s (|s| = 200:
      // 1.5e-5), and so would P = exp(s − logsumexp), relatively. So the logsumexp comes from
      // cpu_flash's forward, whose scores the backward reproduces bit for bit (the output given is
      // still the one used, in Σ dO·O). A short forward (L ≤ 16 query rows) beside the backward.
      // (A block of the rows' keys is given the whole call's logsumexp, and keeps it.)
      if (resolve_backend<T>(options.backend, p, options.need_weights) == Backend::decode && !p.partial_keys()) {
        output_again = Tensor<T>({p.batch, p.query_heads, p.query_len, p.v_head_dim});
        logsumexp_again = Tensor<double>({p.batch, p.query_heads, p.query_len});
        detail::ForwardArgs<T> f{a.sinks, a.query, a.key, a.value, rows_of(View<T>(output_again), "output", ""),
                                 lse_rows_of(View<double>(logsumexp_again)), {}, {}, {}};
        detail::cpu_flash_forward(p, additions, f);
        a.logsumexp = lse_rows_of(View<const double>(logsumexp_again));
        return detail::cpu_flash_backward(p, additions, a);
      }
    }
    switch (backend) {
      case Backend::reference:
        if constexpr (is_half_v<T>) {
          return detail::backward_in_float(query, key, value, output, logsumexp, grad_output, grads, options);
        } else {
          return detail::reference_backward(p, additions, a);
        }
      case Backend::cpu_flash:
        if constexpr (!std::is_same_v<T, double>) return detail::cpu_flash_backward(p, additions, a);
        break;
      case Backend::automatic:
      case Backend::decode:
        break;
    }
    throw Error("sdpa_backward: options.backend: unknown backend");
  }();
  if (grads.grad_sinks.defined()) sink_gradients(p, a, grads.grad_sinks, grads.accumulate);
}

}  // namespace

template <class T>
ForwardResult<T> sdpa_forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                              const Options<T>& options) {
  // The shapes are checked before anything is allocated from them.
  check_rank4(query.shape(), "query", "(B, Hq, L, Dqk)");
  check_rank4(key.shape(), "key", "(B, Hkv, S, Dqk)");
  check_rank4(value.shape(), "value", "(B, Hkv, S, Dv)");
  const Problem p = make_problem(query.shape(), key.shape(), value.shape(), options);
  ForwardResult<T> r{Tensor<T>({p.batch, p.query_heads, p.query_len, p.v_head_dim}),
                     Tensor<double>({p.batch, p.query_heads, p.query_len}), std::nullopt};
  if (options.need_weights) r.weights = Tensor<T>({p.batch, p.query_heads, p.query_len, p.key_len});
  forward<T, T>(query, key, value, {r.output, r.logsumexp, r.weights ? View<T>(*r.weights) : View<T>()}, options,
             /*fresh=*/true);
  return r;
}

template <class T>
Gradients<T> sdpa_backward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const Tensor<T>& output, const Tensor<double>& logsumexp,
                           const Tensor<T>& grad_output, const Options<T>& options) {
  check_rank4(query.shape(), "query", "(B, Hq, L, Dqk)");
  check_rank4(key.shape(), "key", "(B, Hkv, S, Dqk)");
  check_rank4(value.shape(), "value", "(B, Hkv, S, Dv)");
  make_problem(query.shape(), key.shape(), value.shape(), options);
  Gradients<T> g{Tensor<T>(query.shape()), Tensor<T>(key.shape()), Tensor<T>(value.shape()), std::nullopt};
  if (options.sinks.defined()) g.grad_sinks = Tensor<T>({query.size(1)});
  backward<T>(query, key, value, output, logsumexp, grad_output,
              {g.grad_query, g.grad_key, g.grad_value, false, g.grad_sinks ? View<T>(*g.grad_sinks) : View<T>()}, options,
              /*fresh=*/true);
  return g;
}

template <class T>
void sdpa_forward_into(View<const T> query, View<const T> key, View<const T> value, const ForwardOutputs<T>& out,
                       const Options<T>& options) {
  forward<T, T>(query, key, value, out, options, /*fresh=*/false);
}

template <class T>
void sdpa_backward_into(View<const T> query, View<const T> key, View<const T> value, View<const T> output,
                        View<const double> logsumexp, View<const T> grad_output, const GradientOutputs<T>& grads,
                        const Options<T>& options) {
  backward(query, key, value, output, logsumexp, grad_output, grads, options, /*fresh=*/false);
}

void sdpa_forward_into(View<const float> query, View<const bfloat16> key, View<const bfloat16> value,
                       const ForwardOutputs<float>& out, const Options<float>& options) {
  forward<float, bfloat16>(query, key, value, out, options, /*fresh=*/false);
}

void sdpa_forward_into(View<const float> query, View<const float16> key, View<const float16> value,
                       const ForwardOutputs<float>& out, const Options<float>& options) {
  forward<float, float16>(query, key, value, out, options, /*fresh=*/false);
}

template <class T>
WorkSplit work_split(const Shape& query, const Shape& key, const Shape& value, const Options<T>& options, Pass pass,
                     int threads) {
  check(threads >= 1, "threads: expected at least 1, got ", threads);
  check_rank4(query, "query", "(B, Hq, L, Dqk)");
  check_rank4(key, "key", "(B, Hkv, S, Dqk)");
  check_rank4(value, "value", "(B, Hkv, S, Dv)");
  const Problem p = make_problem(query, key, value, options);
  const Backend backend = pass == Pass::forward ? resolve_backend<T>(options.backend, p, options.need_weights)
                                                : resolve_backward_backend<T>(options.backend, p);
  check(backend != Backend::reference,
        "options.backend: the reference runs no parallel tasks of its own, so it has no work split (use cpu_flash, "
        "decode or automatic on float, bfloat16 or float16)");
  std::vector<detail::TaskLoop> loops;
  if constexpr (!std::is_same_v<T, double>) {
    if (pass == Pass::backward) {
      loops = detail::cpu_flash_backward_loops<T>(p);
    } else {
      loops = backend == Backend::decode ? detail::decode_loops(p) : detail::cpu_flash_forward_loops(p);
    }
  }
  WorkSplit split = detail::share(loops, threads);
  split.backend = backend;
  return split;
}

template <class T>
void merge_partial(View<double> output, View<double> logsumexp, View<const T> block_output,
                   View<const double> block_logsumexp) {
  const Rows<double> out = rows_of(output, "output", "(B, H, L, Dv)");
  const Rows<const T> blk = rows_of(block_output, "block_output", "(B, H, L, Dv)");
  check_shape(block_output.shape(), output.shape(), "block_output");
  const Shape lse_shape{output.size(0), output.size(1), output.size(2)};
  check_shape(logsumexp.shape(), lse_shape, "logsumexp");
  check_shape(block_logsumexp.shape(), lse_shape, "block_logsumexp");
  const Rows<double> lse = lse_rows_of(logsumexp);
  const Rows<const double> blk_lse = lse_rows_of(block_logsumexp);
  const int64_t B = output.size(0), H = output.size(1), L = output.size(2), D = output.size(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        double& l = *lse.row(b, h, i);
        const double lb = *blk_lse.row(b, h, i);
        if (lb == -std::numeric_limits<double>::infinity()) continue;  // the block adds nothing
        const double hi = std::max(l, lb), lo = std::min(l, lb);
        const double merged = std::isnan(l) || std::isnan(lb) ? std::nan("") : hi + std::log1p(std::exp(lo - hi));
        const double keep = std::exp(l - merged), add = std::exp(lb - merged);
        double* o = out.row(b, h, i);
        const T* ob = blk.row(b, h, i);
        for (int64_t d = 0; d < D; ++d) o[d] = keep * o[d] + add * static_cast<double>(widen(ob[d]));
        l = merged;
      }
}

#define MHA_INSTANTIATE(T)                                                                                      \
  template ForwardResult<T> sdpa_forward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Options<T>&); \
  template Gradients<T> sdpa_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,    \
                                      const Tensor<double>&, const Tensor<T>&, const Options<T>&);              \
  template void sdpa_forward_into(View<const T>, View<const T>, View<const T>, const ForwardOutputs<T>&,        \
                                  const Options<T>&);                                                         \
  template void sdpa_backward_into(View<const T>, View<const T>, View<const T>, View<const T>, View<const double>, \
                                   View<const T>, const GradientOutputs<T>&, const Options<T>&);              \
  template void merge_partial(View<double>, View<double>, View<const T>, View<const double>);                 \
  template WorkSplit work_split(const Shape&, const Shape&, const Shape&, const Options<T>&, Pass, int);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace mha::attention
