// The argument checks of sdpa_forward / sdpa_backward (checks.h).
#include "checks.h"

#include <cmath>
#include <limits>
#include <string>

#include "mha/core/half.h"

namespace mha::attention {

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

namespace detail {
namespace {

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
PackedSequences packed_sequences(const Options<T>& options, const Problem& p) {
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

}  // namespace

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

namespace {

// A per-head view (Options::alibi_slopes, sinks): absent, (Hq), or (B, Hq) where `per_batch`.
template <class T>
HeadValues<T> head_values(const View<const T>& v, const Problem& p, bool per_batch, const char* name) {
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

}  // namespace

template <class T>
ScoreAdditions<T> make_additions(const Problem& p, const Options<T>& options) {
  const HeadValues<T> slopes = head_values(options.alibi_slopes, p, true, "alibi_slopes");
  if (slopes.present())
    for (int64_t b = 0; b < (slopes.stride_b ? p.sequences() : 1); ++b)
      for (int64_t h = 0; h < p.query_heads; ++h)
        check(std::isfinite(widen(slopes.of(b, h))), "alibi_slopes: expected finite slopes, got ", widen(slopes.of(b, h)),
              " at (b, h) = (", b, ", ", h, ")");
  return {broadcast_view<bool>(options.attend_mask, p, "attend_mask"),
          broadcast_view<T>(options.additive_mask, p, "additive_mask"), slopes};
}

template <class T>
Sinks<T> make_sinks(const Problem& p, const Options<T>& options) {
  const HeadValues<T> logits = head_values(options.sinks, p, false, "sinks");
  for (int64_t h = 0; logits.present() && h < p.query_heads; ++h) {
    const double x = widen(logits.of(0, h));
    check(!std::isnan(x) && x != std::numeric_limits<double>::infinity(),
          "sinks: expected finite logits (or -inf: no sink), got ", x, " for head ", h);
  }
  if (p.whole().key_offset != 0) return {};
  return {logits};
}

void check_rank4(const Shape& shape, const char* name, const char* layout) {
  check(shape.size() == 4, name, ": expected a 4-D tensor ", layout, ", got shape ", shape);
}


#define MHA_INSTANTIATE(T)                                                                          \
  template Problem make_problem(const Shape&, const Shape&, const Shape&, const Options<T>&);       \
  template ScoreAdditions<T> make_additions(const Problem&, const Options<T>&);                    \
  template Sinks<T> make_sinks(const Problem&, const Options<T>&);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace detail
}  // namespace mha::attention
