#pragma once
// What every backend receives after sdpa_forward/backward have checked the arguments: the sizes
// and settings (Problem, which answers "which keys does query i see"), and the masks as one
// object that answers "what is added to score (b,h,i,j)" (ScoreAdditions).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "mha/attention/options.h"
#include "mha/core/half.h"

namespace mha::attention::detail {

// Element (b, h, i, j) of a mask of rank 2..4 broadcast to (B, Hq, L, S): a size-1 dimension
// gets stride 0, so no broadcast copy is ever made.
template <class M>
struct BroadcastView {
  const M* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_i = 0, stride_j = 0;

  bool present() const { return data != nullptr; }
  // The row of S entries for (b, h, i); step through it with stride_j.
  const M* row(int64_t b, int64_t h, int64_t i) const {
    return data + b * stride_b + h * stride_h + i * stride_i;
  }
};

// A (B, H, N, D) operand as the backends read or write it: rows of D contiguous elements at any
// batch, head and row strides (sdpa_forward_into / sdpa_backward_into checked the view).
// logsumexp (B, H, N) is one too, with D = 1.
// Paged (a paged KV cache's keys, values or int8 scales: attention.h, PagedKv): row i of sequence b
// is row i % page_size of page pages[b · pages_stride + i / page_size], stride_b being a page's
// stride; a decode block or a gather reads at most run(i) rows from row i at stride_row.
template <class T>
struct Rows {
  T* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_row = 0;
  const int32_t* pages = nullptr;
  int64_t pages_stride = 0, page_size = 0;

  bool present() const { return data != nullptr; }
  T* row(int64_t b, int64_t h, int64_t i) const {
    if (pages)
      return data + static_cast<int64_t>(pages[b * pages_stride + i / page_size]) * stride_b + h * stride_h +
             (i % page_size) * stride_row;
    return data + b * stride_b + h * stride_h + i * stride_row;
  }
  // The rows from row i on that lie at stride_row from row(b, h, i): to the end of i's page.
  int64_t run(int64_t i) const { return pages ? page_size - i % page_size : std::numeric_limits<int64_t>::max(); }
};

// Per-sequence lengths (Options::query_lengths, key_lengths) and starts (key_starts): element b of
// a (B) view (one per packed sequence with cu_seqlens), or `whole` when absent.
struct SequenceLengths {
  const int64_t* data = nullptr;
  int64_t stride = 0;

  int64_t of(int64_t b, int64_t whole) const { return data ? data[b * stride] : whole; }
};

// Packed variable-length sequences (Options::cu_seqlens_q, cu_seqlens_k): sequence s has the
// call's queries [q(s), q(s + 1)) and keys [k(s), k(s + 1)) (batch 1).
struct PackedSequences {
  const int64_t* cu_q = nullptr;
  const int64_t* cu_k = nullptr;
  int64_t stride_q = 0, stride_k = 0, count = 0;

  bool present() const { return cu_q != nullptr; }
  int64_t q(int64_t s) const { return cu_q[s * stride_q]; }
  int64_t k(int64_t s) const { return cu_k[s * stride_k]; }
  // The sequence holding query row i (q(s) <= i < q(s + 1); empty sequences hold none).
  int64_t holding(int64_t i) const {
    int64_t lo = 0, hi = count;  // the last s with q(s) <= i, by bisection
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (q(mid) <= i ? lo : hi) = mid;
    }
    return lo;
  }
};

// The sequence a query row belongs to, in the call's numbering: its index (b, or the packed
// sequence), where its queries and keys start (negative for a block of a larger call: the whole
// call's first query is row −query_offset), where its rows end, and the queries and keys it has.
struct Sequence {
  int64_t index, query_start, key_start, query_end, query_len, key_len;
};

struct Problem {
  int64_t batch = 0, query_heads = 0, kv_heads = 0;
  int64_t query_len = 0, key_len = 0, qk_head_dim = 0, v_head_dim = 0;
  // The call's settings as given (checked), with whole_call's totals resolved (never 0).
  Scoring settings;
  double scale = 1.0;  // settings.scale, or 1/sqrt(Dqk)
  SequenceLengths query_lengths, key_lengths, key_starts;  // per sequence (b, or packed)
  PackedSequences packed;

  const WholeCall& whole() const { return settings.whole_call; }
  // The number of sequences: B, or the packed ones.
  int64_t sequences() const { return packed.present() ? packed.count : batch; }
  int64_t group_size() const { return kv_heads > 0 ? query_heads / kv_heads : 1; }  // 1 for a call with no heads
  bool dropout() const { return settings.dropout_p > 0.0; }
  // The sequence of query row i of batch b (Sequence).
  Sequence sequence_of(int64_t b, int64_t i) const {
    // A left-padded sequence's keys (key_starts) begin past its padding.
    if (!packed.present()) {
      const WholeCall& w = whole();
      const int64_t start = key_starts.of(b, 0);
      return {b, -w.query_offset, start - w.key_offset, std::numeric_limits<int64_t>::max(),
              query_lengths.of(b, w.query_len), key_lengths.of(b, w.key_len) - start};
    }
    const int64_t s = packed.holding(i), q0 = packed.q(s), k0 = packed.k(s), start = key_starts.of(s, 0);
    return {s, q0, k0 + start, packed.q(s + 1), query_lengths.of(s, packed.q(s + 1) - q0),
            key_lengths.of(s, packed.k(s + 1) - k0) - start};
  }
  // The keys of this call that queries [i0, i1) of batch b may see: attention::visible_keys of
  // each row's sequence at the whole call's positions, moved to this call's key numbering and cut
  // to its keys. For one query (i1 = i0 + 1) it is that query's range; for a block, the union of
  // its rows' (over the packed sequences it spans).
  KeyRange visible_keys(int64_t b, int64_t i0, int64_t i1) const {
    KeyRange all{0, 0};
    for (int64_t i = i0; i < i1;) {
      const Sequence s = sequence_of(b, i);
      const int64_t end = std::min(i1, s.query_end);
      const KeyRange r = attention::visible_keys(settings, s.query_len, s.key_len, i - s.query_start, end - s.query_start);
      auto cut = [&](int64_t j) { return std::clamp<int64_t>(j + s.key_start, 0, key_len); };
      const KeyRange here{cut(r.begin), cut(r.end)};
      if (!here.empty()) all = all.empty() ? here : KeyRange{std::min(all.begin, here.begin), std::max(all.end, here.end)};
      i = end;
    }
    return all;
  }
  KeyRange visible_keys(int64_t b, int64_t i) const { return visible_keys(b, i, i + 1); }
  // The key of query i of batch b on its sequence's causal diagonal (causal_diagonal), in this
  // call's key numbering: where ALiBi's distance is 0.
  int64_t diagonal_key(int64_t b, int64_t i) const {
    const Sequence s = sequence_of(b, i);
    return s.key_start + (i - s.query_start) + causal_diagonal(settings, s.query_len, s.key_len);
  }
  // Whether scale·q·k is soft-capped (Scoring::softcap).
  bool softcapped() const { return settings.softcap > 0.0; }
  // This call's keys are a part of the whole call's: a row's softmax spans keys it does not see.
  bool partial_keys() const { return whole().key_offset != 0 || whole().key_len != key_len; }
  // The dropout stream of (b, h) and the whole call's row and column of (i, j): dropout_keep's
  // arguments (mha/core/random.h), so that a block draws the whole call's mask.
  uint64_t dropout_stream(int64_t batch_head) const {
    const int64_t b = batch_head / query_heads, h = batch_head % query_heads;
    return static_cast<uint64_t>(b * whole().heads + whole().head_offset + h);
  }
  uint32_t dropout_row(int64_t i) const { return static_cast<uint32_t>(whole().query_offset + i); }
  uint32_t dropout_column(int64_t j) const { return static_cast<uint32_t>(whole().key_offset + j); }
  // 1/(1 − p) for kept probabilities; p = 1 drops everything (and must not give 0·inf = NaN).
  double dropout_scale() const { return settings.dropout_p < 1.0 ? 1.0 / (1.0 - settings.dropout_p) : 0.0; }
};

// Per-head values of a call, element (b, h) of a (Hq) or (B, Hq) view: Options::alibi_slopes and
// Options::sinks.
template <class T>
struct HeadValues {
  const T* data = nullptr;
  int64_t stride_b = 0, stride_h = 0;

  bool present() const { return data != nullptr; }
  T of(int64_t b, int64_t h) const { return data[b * stride_b + h * stride_h]; }
};

// What is added to score (b, h, i, j) on top of cap(scale·q·k): the additive mask's value, plus
// −inf where attend_mask is false, plus ALiBi's −slope·|i + diagonal − j|, and −inf for a key
// outside the query's visible_keys. The one per-element definition, which the reference applies
// row by row (fill_row, in T) and the tiles apply tile by tile (tiles.h, in float; the key range
// there goes to the kernels as the tile's edges). Blocking ADDS −inf, as PyTorch adds a bool mask
// turned into −inf: a +inf or NaN in the float mask then gives NaN there, exactly as in PyTorch.
template <class T>
struct ScoreAdditions {
  BroadcastView<bool> attend;
  BroadcastView<T> additive;
  HeadValues<T> alibi_slopes;

  bool present() const { return additive.present() || attend.present() || alibi_slopes.present(); }

  // Row (b, h, i) of the additions but the key range, key by key (j counted in this call's keys),
  // in T's computing type (float for bfloat16 and float16 masks and slopes).
  struct Row {
    using A = widened_t<T>;
    const T* add = nullptr;
    int64_t add_stride = 0;
    const bool* keep = nullptr;
    int64_t keep_stride = 0;
    A slope = 0;         // ALiBi's, 0 without
    int64_t origin = 0;  // the query's own key (i + diagonal), in this call's key numbering

    A operator()(int64_t j) const {
      A v = add ? widen(add[j * add_stride]) : A(0);
      if (keep && !keep[j * keep_stride]) v += -std::numeric_limits<A>::infinity();
      if (slope != A(0)) v += -slope * static_cast<A>(origin > j ? origin - j : j - origin);
      return v;
    }
  };
  Row row(const Problem& p, int64_t b, int64_t h, int64_t i) const {
    Row r{additive.present() ? additive.row(b, h, i) : nullptr, additive.stride_j,
          attend.present() ? attend.row(b, h, i) : nullptr, attend.stride_j};
    if (alibi_slopes.present()) {
      r.slope = widen(alibi_slopes.of(p.sequence_of(b, i).index, h));
      r.origin = p.diagonal_key(b, i);
    }
    return r;
  }

  // scores[0..S) of query row i of (b, h) = everything added there: backends add cap(scale·q·k).
  void fill_row(const Problem& p, int64_t b, int64_t h, int64_t i, T* scores) const {
    const KeyRange visible = p.visible_keys(b, i);
    const Row additions = row(p, b, h, i);
    for (int64_t j = 0; j < p.key_len; ++j) {
      T v = additions(j);
      if (!visible.contains(j)) v += -std::numeric_limits<T>::infinity();
      scores[j] = v;
    }
  }
};

// Options::sinks as a backend reads it: the sink logit of (b, h), −inf when there is none (no
// sinks, or a block of the whole call's keys that does not hold key 0: Options::sinks).
template <class T>
struct Sinks {
  HeadValues<T> logits;

  bool present() const { return logits.present(); }
  double of(int64_t b, int64_t h) const {
    return logits.present() ? static_cast<double>(widen(logits.of(b, h))) : -std::numeric_limits<double>::infinity();
  }
};

// What a backend's forward reads and writes. Every backend writes every element of logsumexp;
// cpu_flash also every element of output, which the reference adds into (it starts at 0 there).
// The weights start at 0 (cpu_flash leaves the keys causality hides unwritten); absent unless
// the call asked for them. Keys and values may be stored in another type than the queries
// (Kv: bfloat16 or float16 in a KV cache, read by the decode and cpu_flash backends; int8_t with
// a scale per row, read by decode).
template <class T, class Kv = T>
struct ForwardArgs {
  Sinks<T> sinks;
  Rows<const T> query;
  Rows<const Kv> key, value;
  Rows<T> output;
  Rows<double> logsumexp;
  Rows<T> weights;
  // int8 keys and values (Kv = int8_t, decode only): the float scale of each row, key (b, h, j)
  // standing for key_scales(b, h, j) · key(b, h, j) (rows of one number).
  Rows<const float> key_scales, value_scales;
};

// What a backend's backward reads and writes; the gradients are zero when the backend starts.
// row_deltas, where given (B·Hq·L doubles, row (b, h, i) at (b·Hq + h)·L + i, zero at the start):
// each row's D = Σ_j P_ij dP_ij as the backend's dS uses it, for the sinks' gradient
// (sink_gradients, attention.cpp); cpu_flash writes it, the reference does not.
template <class T>
struct BackwardArgs {
  Sinks<T> sinks;
  Rows<const T> query, key, value, output, grad_output;
  Rows<const double> logsumexp;
  Rows<T> grad_query, grad_key, grad_value;
  double* row_deltas = nullptr;
};

}  // namespace mha::attention::detail
