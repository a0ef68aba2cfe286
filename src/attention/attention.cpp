// sdpa_forward / sdpa_backward: argument checks, then dispatch to the chosen backend.
#include "mha/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_flash/cpu_flash.h"
#include "decode/decode.h"
#include "mha/core/half.h"
#include "problem.h"
#include "reference.h"

namespace mha::attention {
namespace {

using detail::BroadcastView;
using detail::Problem;
using detail::Rows;
using detail::ScoreAdditions;
using detail::SequenceLengths;

// A (B, H, N, D) operand: rank 4, rows contiguous (a view of no elements reads no memory: any
// strides; numpy gives empty arrays all-zero strides).
template <class T>
Rows<T> rows_of(const View<T>& v, const char* name, const char* layout) {
  check(v.dim() == 4, name, ": expected a 4-D tensor ", layout, ", got shape ", v.shape());
  check(v.numel() == 0 || v.size(3) <= 1 || v.stride(3) == 1, name, ": expected a contiguous last dimension (stride 1), got shape ",
        v.shape(), " with strides ", v.strides());
  return {v.data(), v.stride(0), v.stride(1), v.stride(2)};
}

// logsumexp (B, H, L): any strides.
template <class T>
Rows<T> lse_rows_of(const View<T>& v) {
  return {v.data(), v.stride(0), v.stride(1), v.stride(2)};
}

// A mask of rank 1..4 whose dimensions, aligned on the right, are 1 or the full size.
template <class M>
BroadcastView<M> broadcast_view(const View<const M>& mask, const Problem& p, const char* name) {
  BroadcastView<M> view;
  if (!mask.defined()) return view;
  const Shape full{p.batch, p.query_heads, p.query_len, p.key_len};
  const Shape& s = mask.shape();
  bool ok = !s.empty() && s.size() <= 4;
  for (size_t i = 0; ok && i < s.size(); ++i) {
    const int64_t want = full[4 - s.size() + i];
    ok = s[i] == want || s[i] == 1;
  }
  check(ok, name, ": expected a 1-D to 4-D shape broadcastable to (B, Hq, L, S) = ", full,
        ", got ", s);
  // The mask's own strides, 0 where it broadcasts; a missing leading dimension broadcasts too.
  int64_t stride[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < s.size(); ++i) stride[4 - s.size() + i] = s[i] == 1 ? 0 : mask.stride(static_cast<int64_t>(i));
  view.data = mask.data();
  view.stride_b = stride[0];
  view.stride_h = stride[1];
  view.stride_i = stride[2];
  view.stride_j = stride[3];
  return view;
}

// Options::whole_call with its zero totals resolved to the call's own sizes, checked: the call's
// queries, keys and heads lie inside the whole call's.
WholeCall whole_call(WholeCall w, const Problem& p) {
  if (w.query_len == 0) w.query_len = p.query_len;
  if (w.key_len == 0) w.key_len = p.key_len;
  if (w.heads == 0) w.heads = p.query_heads;
  auto inside = [](int64_t offset, int64_t size, int64_t total) {
    return offset >= 0 && total >= 0 && offset <= total && size <= total - offset;
  };
  check(inside(w.query_offset, p.query_len, w.query_len), "options.whole_call: expected the call's ", p.query_len,
        " queries from query_offset ", w.query_offset, " to lie inside the whole call's ", w.query_len);
  check(inside(w.key_offset, p.key_len, w.key_len), "options.whole_call: expected the call's ", p.key_len,
        " keys from key_offset ", w.key_offset, " to lie inside the whole call's ", w.key_len);
  check(inside(w.head_offset, p.query_heads, w.heads), "options.whole_call: expected the call's ", p.query_heads,
        " query heads from head_offset ", w.head_offset, " to lie inside the whole call's ", w.heads);
  return w;
}

}  // namespace

void check_scoring(const Scoring& s, std::string_view prefix) {
  const std::string at(prefix);
  check(std::isfinite(s.dropout_p) && s.dropout_p >= 0.0 && s.dropout_p <= 1.0, at,
        "dropout_p: expected a probability in [0, 1], got ", s.dropout_p);
  check(s.causal == Causal::none || s.causal == Causal::top_left || s.causal == Causal::bottom_right, at,
        "causal: expected none, top_left or bottom_right, got the value ", static_cast<int>(s.causal));
  check(s.window_left >= -1, at, "window_left: expected -1 (unbounded) or a number of keys >= 0, got ", s.window_left);
  check(s.window_right >= -1, at, "window_right: expected -1 (unbounded) or a number of keys >= 0, got ",
        s.window_right);
  check(std::isfinite(s.softcap) && s.softcap >= 0.0, at, "softcap: expected 0 (none) or a finite cap > 0, got ",
        s.softcap);
  // (The kernels keep the cap as a float, where one below float's least subnormal would be 0: none.)
  check(s.softcap == 0.0 || static_cast<float>(s.softcap) > 0.0f, at,
        "softcap: expected 0 (none) or a cap of at least 1.4e-45 (float's least subnormal), got ", s.softcap);
  check(s.chunk_size >= 0, at, "chunk_size: expected 0 (no chunks) or a number of keys > 0, got ", s.chunk_size);
  check(!s.scale || std::isfinite(*s.scale), at, "scale: expected a finite number, got ", s.scale.value_or(0.0));
}

namespace {

// Options::query_lengths, key_lengths or key_starts: absent, or one per sequence with sequence b's
// in [least, whole(b)].
template <class Whole>
SequenceLengths sequence_lengths(const View<const int64_t>& lengths, int64_t sequences, const char* name, Whole whole,
                                 const char* what = "lengths", int64_t least = 0, const char* least_text = "0") {
  if (!lengths.defined()) return {};
  check(lengths.dim() == 1 && lengths.size(0) == sequences, name, ": expected a 1-D tensor of ", sequences, " ", what,
        " (one per sequence), got shape ", lengths.shape());
  for (int64_t b = 0; b < sequences; ++b) {
    const int64_t n = lengths.data()[b * lengths.stride(0)];
    check(n >= least && n <= whole(b), name, ": expected ", what, " in [", least_text, ", ", whole(b), "], got ", n,
          " for sequence ", b);
  }
  return {lengths.data(), lengths.stride(0)};
}

// Options::cu_seqlens_q / cu_seqlens_k: both or neither; N + 1 offsets each, from 0, non-decreasing,
// to L and S; batch 1, and the call not a block of a larger one.
template <class T>
detail::PackedSequences packed_sequences(const Options<T>& options, const Problem& p) {
  const View<const int64_t>& q = options.cu_seqlens_q;
  const View<const int64_t>& k = options.cu_seqlens_k;
  check(q.defined() == k.defined(), "cu_seqlens_q, cu_seqlens_k: expected both (packed sequences) or neither, got ",
        q.defined() ? "cu_seqlens_q only" : "cu_seqlens_k only");
  if (!q.defined()) return {};
  check(p.batch == 1, "query: expected batch size 1 with cu_seqlens (the sequences packed along L and S), got ", p.batch);
  check(options.whole_call == WholeCall{}, "options.whole_call: expected the default with cu_seqlens (a packed call is "
        "not a block of a larger one)");
  check(q.dim() == 1 && q.size(0) >= 1 && k.dim() == 1 && k.size(0) == q.size(0),
        "cu_seqlens_q, cu_seqlens_k: expected two 1-D tensors of N + 1 offsets (N sequences), got shapes ", q.shape(),
        " and ", k.shape());
  auto check_offsets = [](const View<const int64_t>& cu, int64_t total, const char* name, const char* dim) {
    const int64_t n = cu.size(0);
    auto at = [&](int64_t s) { return cu.data()[s * cu.stride(0)]; };
    check(at(0) == 0, name, ": expected to start at 0, got ", at(0));
    for (int64_t s = 0; s + 1 < n; ++s)
      check(at(s + 1) >= at(s), name, ": expected non-decreasing offsets, got ", at(s + 1), " after ", at(s),
            " at index ", s + 1);
    check(at(n - 1) == total, name, ": expected to end at ", dim, " = ", total, " (the packed total), got ", at(n - 1));
  };
  check_offsets(q, p.query_len, "cu_seqlens_q", "L");
  check_offsets(k, p.key_len, "cu_seqlens_k", "S");
  return {q.data(), k.data(), q.stride(0), k.stride(0), q.size(0) - 1};
}

template <class T>
Problem make_problem(const Shape& q, const Shape& k, const Shape& v, const Options<T>& options) {
  check(k[0] == q[0] && v[0] == q[0], "key/value: expected batch size ", q[0],
        " (from query ", q, "), got key ", k, " and value ", v);
  check(k[1] == v[1], "value: expected ", k[1], " heads (as key ", k, "), got ",
        v);
  check(k[2] == v[2], "value: expected sequence length ", k[2], " (as key ", k, "), got ",
        v);
  check(k[3] == q[3], "key: expected head size ", q[3], " (as query ", q, "), got ",
        k);
  // (No heads at all is an empty call, as in PyTorch.)
  check(k[1] > 0 ? q[1] % k[1] == 0 : q[1] == 0, "key: number of key/value heads must divide the ", q[1],
        " query heads (grouped-query attention), got ", k[1]);
  // The sizes the call works with, checked before anything is allocated: the output
  // (B, Hq, L, Dv), the logsumexp (B, Hq, L) and the score matrix (B, Hq, L, S), whose element
  // count is also the work, built or not. A product past 64 bits would wrap into a wrong size.
  checked_numel({q[0], q[1], q[2], v[3]}, "query and value: the output (B, Hq, L, Dv)");
  checked_numel({q[0], q[1], q[2]}, "query: the logsumexp (B, Hq, L)");
  checked_numel({q[0], q[1], q[2], k[2]}, "query and key: the score matrix (B, Hq, L, S)");

  Problem p;
  p.batch = q[0];
  p.query_heads = q[1];
  p.kv_heads = k[1];
  p.query_len = q[2];
  p.key_len = k[2];
  p.qk_head_dim = q[3];
  p.v_head_dim = v[3];
  // The settings, then each checked (and whole_call's totals resolved).
  Scoring& s = p.settings = options;
  check_scoring(s);
  s.whole_call = whole_call(s.whole_call, p);
  if (s.scale) {
    p.scale = *s.scale;
  } else {
    check(p.qk_head_dim > 0, "query: head size must be > 0 for the default scale 1/sqrt(Dqk), got ",
          q);
    p.scale = 1.0 / std::sqrt(static_cast<double>(p.qk_head_dim));
  }
  p.packed = packed_sequences(options, p);
  // One length per sequence (b, or packed), each at most the sequence's own.
  const int64_t sequences = p.sequences();
  p.query_lengths = sequence_lengths(options.query_lengths, sequences, "query_lengths", [&](int64_t b) {
    return p.packed.present() ? p.packed.q(b + 1) - p.packed.q(b) : s.whole_call.query_len;
  });
  p.key_lengths = sequence_lengths(options.key_lengths, sequences, "key_lengths", [&](int64_t b) {
    return p.packed.present() ? p.packed.k(b + 1) - p.packed.k(b) : s.whole_call.key_len;
  });
  // Each start at most its sequence's key length (where its keys end); a negative one (a sequence
  // begun before the call's first key) only without cu_seqlens, where it would reach the previous
  // sequence's keys, and at least -2^62 (its positions' sums kept in range).
  p.key_starts = sequence_lengths(options.key_starts, sequences, "key_starts", [&](int64_t b) {
    return p.key_lengths.of(b, p.packed.present() ? p.packed.k(b + 1) - p.packed.k(b) : s.whole_call.key_len);
  }, "starts", p.packed.present() ? 0 : -(int64_t{1} << 62), p.packed.present() ? "0" : "-2^62");
  return p;
}

// A per-head view (Options::alibi_slopes, sinks): absent, (Hq), or (B, Hq) where `per_batch`.
template <class T>
detail::HeadValues<T> head_values(const View<const T>& v, const Problem& p, bool per_batch, const char* name) {
  if (!v.defined()) return {};
  const int64_t sequences = p.sequences();  // (B, Hq): one row per sequence
  const bool heads = v.dim() == 1 && v.size(0) == p.query_heads;
  const bool batch_heads = per_batch && v.dim() == 2 && v.size(0) == sequences && v.size(1) == p.query_heads;
  if (per_batch) {
    check(heads || batch_heads, name, ": expected shape (Hq) = ", Shape{p.query_heads}, " or (B, Hq) = ",
          Shape{sequences, p.query_heads}, ", got ", v.shape());
  } else {
    check(heads, name, ": expected shape (Hq) = ", Shape{p.query_heads}, ", one per query head, got ", v.shape());
  }
  return {v.data(), batch_heads ? v.stride(0) : 0, v.stride(v.dim() - 1)};
}

template <class T>
ScoreAdditions<T> make_additions(const Problem& p, const Options<T>& options) {
  const detail::HeadValues<T> slopes = head_values(options.alibi_slopes, p, true, "alibi_slopes");
  if (slopes.present())
    for (int64_t b = 0; b < (slopes.stride_b ? p.sequences() : 1); ++b)
      for (int64_t h = 0; h < p.query_heads; ++h)
        check(std::isfinite(widen(slopes.of(b, h))), "alibi_slopes: expected finite slopes, got ", widen(slopes.of(b, h)),
              " at (b, h) = (", b, ", ", h, ")");
  return {broadcast_view<bool>(options.attend_mask, p, "attend_mask"),
          broadcast_view<T>(options.additive_mask, p, "additive_mask"), slopes};
}

// Options::sinks, checked; absent in a block of keys that does not hold the whole call's key 0.
template <class T>
detail::Sinks<T> make_sinks(const Problem& p, const Options<T>& options) {
  const detail::HeadValues<T> logits = head_values(options.sinks, p, false, "sinks");
  for (int64_t h = 0; logits.present() && h < p.query_heads; ++h) {
    const double x = widen(logits.of(0, h));
    check(!std::isnan(x) && x != std::numeric_limits<double>::infinity(),
          "sinks: expected finite logits (or -inf: no sink), got ", x, " for head ", h);
  }
  if (p.whole().key_offset != 0) return {};
  return {logits};
}

// The largest number of query rows (per head) the automatic choice sends to the decode backend;
// past it cpu_flash's tiles of 96 query rows are the better use of the keys read.
constexpr int64_t kDecodeRows = 16;

// The backend that runs the forward: `automatic` is decode for float, bfloat16 and float16 with at
// most kDecodeRows query rows and no weights asked for, cpu_flash for their other calls, reference
// for double (the double path exists for checking, where the plain definition is what is wanted).
template <class T>
Backend resolve_backend(Backend requested, const Problem& p, bool need_weights) {
  constexpr bool fused = !std::is_same_v<T, double>;
  if (requested == Backend::automatic) {
    if (!fused) return Backend::reference;
    return p.query_len <= kDecodeRows && !need_weights && !p.packed.present() ? Backend::decode : Backend::cpu_flash;
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

// An output: the expected shape, no element written twice, no overlap with what the call reads
// (`inputs`) or with the outputs checked before it (`written`, which it joins).
template <class T>
void check_output(const View<T>& out, const Shape& shape, const char* name,
                  const std::vector<std::pair<const char*, const char*>>& inputs,
                  std::vector<std::pair<const char*, const char*>>& written) {
  check_shape(out.shape(), shape, name);
  check(elements_distinct(out), name, ": expected an output whose elements do not share memory, got strides ",
        out.strides(), " for shape ", out.shape());
  const auto [first, last] = byte_range(out);
  auto overlaps = [&, first = first, last = last](const std::pair<const char*, const char*>& r) {
    return first && r.first && first < r.second && r.first < last;
  };
  for (const auto& r : inputs) check(!overlaps(r), name, ": the output overlaps an input of the call");
  for (const auto& r : written) check(!overlaps(r), name, ": the output overlaps another output of the call");
  written.push_back({first, last});
}

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

// f(offset, n) for the n-th element of v in row-major order (any rank, any strides), offset its
// place in v's memory.
template <class V, class F>
void for_each_element(const V& v, F f) {
  const int64_t d = v.dim();
  for (int64_t n = 0; n < v.numel(); ++n) {
    int64_t offset = 0, rest = n;
    for (int64_t a = d - 1; a >= 0; --a) {
      offset += (rest % v.size(a)) * v.stride(a);
      rest /= v.size(a);
    }
    f(offset, n);
  }
}

// A contiguous float copy of a view (any rank and strides; a broadcast one is made whole): the
// reference's operands in a bfloat16 or float16 call.
template <class H>
Tensor<float> to_float(const View<const H>& v) {
  Tensor<float> t(v.shape());
  for_each_element(v, [&](int64_t offset, int64_t n) { t.data()[n] = widen(v.data()[offset]); });
  return t;
}

// dst (+)= src, stored as T: the reference's float results into a bfloat16 or float16 call's outputs.
template <class T>
void store(const View<T>& dst, const Tensor<float>& src, bool accumulate) {
  for_each_element(dst, [&](int64_t offset, int64_t n) {
    T& x = dst.data()[offset];
    x = narrow<T>(accumulate ? widen(x) + src.data()[n] : src.data()[n]);
  });
}

// A half-precision call's options for the reference, which runs it in float: every view by the
// list (Options::visit_views), those of T (a mask, the sinks, the slopes) copied to float (`held`
// keeps the copies), the others (bool, int64) as they are.
template <class T>
Options<float> float_options(const Options<T>& options, std::vector<Tensor<float>>& held) {
  Options<float> o;
  static_cast<Scoring&>(o) = options;
  o.need_weights = options.need_weights;
  o.backend = Backend::reference;
  int index = 0;  // the two lists' entries are the same views in the same order
  Options<T>::visit_views([&](const char*, auto from) {
    int other = 0;
    Options<float>::visit_views([&](const char*, auto to) {
      if (other++ != index) return;
      const auto& v = options.*from;
      using From = std::remove_cvref_t<decltype(v)>;
      using To = std::remove_cvref_t<decltype(o.*to)>;
      if constexpr (std::is_same_v<From, View<const T>> && std::is_same_v<To, View<const float>>) {
        if (v.defined()) o.*to = held.emplace_back(to_float(v));
      } else if constexpr (std::is_same_v<From, To>) {
        o.*to = v;
      }
    });
    ++index;
  });
  return o;
}

using ByteRanges = std::vector<std::pair<const char*, const char*>>;

// The bytes a call reads: its operands' (given) and every view's.
template <class T>
ByteRanges input_ranges(ByteRanges operands, const Options<T>& options) {
  Options<T>::visit_views([&](const char*, auto member) { operands.push_back(byte_range(options.*member)); });
  return operands;
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

template <class T, class Kv>
void forward_in_float(View<const T> query, View<const Kv> key, View<const Kv> value, const ForwardOutputs<T>& out,
                      const Options<T>& options);
template <class T>
void backward_in_float(View<const T> query, View<const T> key, View<const T> value, View<const T> output,
                       View<const double> logsumexp, View<const T> grad_output, const GradientOutputs<T>& grads,
                       const Options<T>& options);

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
    if (backend == Backend::reference) return forward_in_float(query, key, value, out, options);
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
//   grad_sinks[h] (+)= −Σ_{b,i} exp(sink_h − lse_bhi) · D_bhi,   D_bhi = dO_bhi · O_bhi
// in double, rows in order (the same sum for any thread count). A block of keys without the sink
// (make_sinks) adds 0; a row that sees no key has O = 0, so D = 0.
template <class T>
void sink_gradients(const Problem& p, const detail::BackwardArgs<T>& a, const View<T>& grad_sinks, bool accumulate) {
  for (int64_t h = 0; h < p.query_heads; ++h) {
    double sum = 0;
    const double sink = a.sinks.of(0, h);
    for (int64_t b = 0; b < p.batch && sink != -std::numeric_limits<double>::infinity(); ++b)
      for (int64_t i = 0; i < p.query_len; ++i) {
        const T* dout = a.grad_output.row(b, h, i);
        const T* out = a.output.row(b, h, i);
        double d = 0;
        for (int64_t e = 0; e < p.v_head_dim; ++e) d += static_cast<double>(widen(dout[e])) * static_cast<double>(widen(out[e]));
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
  if (grads.grad_sinks.defined()) sink_gradients(p, a, grads.grad_sinks, grads.accumulate);
  a.grad_query = rows_of(grads.grad_query, "grad_query", "(B, Hq, L, Dqk)");
  a.grad_key = rows_of(grads.grad_key, "grad_key", "(B, Hkv, S, Dqk)");
  a.grad_value = rows_of(grads.grad_value, "grad_value", "(B, Hkv, S, Dv)");
  if (!fresh && !grads.accumulate) {
    zero(grads.grad_query);
    zero(grads.grad_key);
    zero(grads.grad_value);
  }
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
      Tensor<T> output_again({p.batch, p.query_heads, p.query_len, p.v_head_dim});
      Tensor<double> logsumexp_again({p.batch, p.query_heads, p.query_len});
      detail::ForwardArgs<T> f{a.sinks, a.query, a.key, a.value, rows_of(View<T>(output_again), "output", ""),
                               lse_rows_of(View<double>(logsumexp_again)), {}};
      detail::cpu_flash_forward(p, additions, f);
      a.logsumexp = lse_rows_of(View<const double>(logsumexp_again));
      return detail::cpu_flash_backward(p, additions, a);
    }
  }
  switch (backend) {
    case Backend::reference:
      if constexpr (is_half_v<T>) {
        return backward_in_float(query, key, value, output, logsumexp, grad_output, grads, options);
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
}

// The reference on a call with bfloat16 or float16 operands (the check path, which the fused
// backends are tested against): the operands and options copied to float, the float call, its
// results stored in the call's type. The outputs are checked (and zero where asked) already.
template <class T, class Kv>
void forward_in_float(View<const T> query, View<const Kv> key, View<const Kv> value, const ForwardOutputs<T>& out,
                      const Options<T>& options) {
  std::vector<Tensor<float>> held;
  const Options<float> o = float_options(options, held);
  const Tensor<float> q = to_float(query), k = to_float(key), v = to_float(value);
  if constexpr (std::is_same_v<T, float>) {
    forward<float, float>(query, k, v, out, o, /*fresh=*/false);
  } else {
    Tensor<float> output(out.output.shape());
    Tensor<float> weights(out.weights.defined() ? out.weights.shape() : Shape{0});
    forward<float, float>(q, k, v, {output, out.logsumexp, out.weights.defined() ? View<float>(weights) : View<float>()},
                          o, /*fresh=*/false);
    store(out.output, output, false);
    if (out.weights.defined()) store(out.weights, weights, false);
  }
}

// The backward's (sink gradients are the caller's, made before).
template <class T>
void backward_in_float(View<const T> query, View<const T> key, View<const T> value, View<const T> output,
                       View<const double> logsumexp, View<const T> grad_output, const GradientOutputs<T>& grads,
                       const Options<T>& options) {
  std::vector<Tensor<float>> held;
  const Options<float> o = float_options(options, held);
  Tensor<float> dq(query.shape()), dk(key.shape()), dv(value.shape());
  backward<float>(to_float(query), to_float(key), to_float(value), to_float(output), logsumexp, to_float(grad_output),
                  {dq, dk, dv, false, {}}, o, /*fresh=*/true);
  store(grads.grad_query, dq, grads.accumulate);
  store(grads.grad_key, dk, grads.accumulate);
  store(grads.grad_value, dv, grads.accumulate);
}

void check_rank4(const Shape& shape, const char* name, const char* layout) {
  check(shape.size() == 4, name, ": expected a 4-D tensor ", layout, ", got shape ", shape);
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
  template void merge_partial(View<double>, View<double>, View<const T>, View<const double>);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace mha::attention
