#pragma once
// What every backend receives after sdpa_forward/backward have checked the arguments: the sizes,
// the resolved scale, and the masks as one object that answers "what is added to score (b,h,i,j)".
#include <cmath>
#include <cstdint>
#include <limits>

#include "mha/attention/options.h"

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
template <class T>
struct Rows {
  T* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_row = 0;

  bool present() const { return data != nullptr; }
  T* row(int64_t b, int64_t h, int64_t i) const { return data + b * stride_b + h * stride_h + i * stride_row; }
};

struct Problem {
  int64_t batch = 0, query_heads = 0, kv_heads = 0;
  int64_t query_len = 0, key_len = 0, qk_head_dim = 0, v_head_dim = 0;
  double scale = 1.0;
  Causal causal = Causal::none;
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;

  // The whole call this one is a block of (Options::positions, resolved: totals never 0).
  Positions whole;

  int64_t group_size() const { return query_heads / kv_heads; }
  // Keys [0, causal_limit(i)) are visible to query i (all of them when not causal). The limit is
  // the whole call's, at query whole.query_offset + i, counted from this block's first key.
  int64_t causal_limit(int64_t i) const {
    const int64_t gi = whole.query_offset + i;
    int64_t limit = key_len;
    if (causal == Causal::top_left) limit = gi + 1 - whole.key_offset;
    if (causal == Causal::bottom_right) limit = gi + 1 + (whole.key_len - whole.query_len) - whole.key_offset;
    return limit < 0 ? 0 : (limit > key_len ? key_len : limit);
  }
  // This call's keys are a part of the whole call's: a row's softmax spans keys it does not see.
  bool partial_keys() const { return whole.key_offset != 0 || whole.key_len != key_len; }
  // The dropout stream of (b, h) and the whole call's row and column of (i, j): dropout_keep's
  // arguments (mha/core/random.h), so that a block draws the whole call's mask.
  uint64_t dropout_stream(int64_t batch_head) const {
    const int64_t b = batch_head / query_heads, h = batch_head % query_heads;
    return static_cast<uint64_t>(b * whole.heads + whole.head_offset + h);
  }
  uint32_t dropout_row(int64_t i) const { return static_cast<uint32_t>(whole.query_offset + i); }
  uint32_t dropout_column(int64_t j) const { return static_cast<uint32_t>(whole.key_offset + j); }
  // 1/(1 − p) for kept probabilities; p = 1 drops everything (and must not give 0·inf = NaN).
  double dropout_scale() const { return dropout_p < 1.0 ? 1.0 / (1.0 - dropout_p) : 0.0; }
};

template <class T>
struct Masks {
  BroadcastView<bool> attend;
  BroadcastView<T> additive;

  // Fills `scores[0..S)` for query row i of (b, h) with the mask contribution: 0, the additive
  // value, or −inf (attend false or hidden by causality). Backends add scale·q·k on top.
  void fill_row(const Problem& p, int64_t b, int64_t h, int64_t i, T* scores) const {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const int64_t visible = p.causal_limit(i);
    const T* add = additive.present() ? additive.row(b, h, i) : nullptr;
    const bool* keep = attend.present() ? attend.row(b, h, i) : nullptr;
    for (int64_t j = 0; j < p.key_len; ++j) {
      T v = add ? add[j * additive.stride_j] : T(0);
      // Blocking ADDS −inf, as PyTorch adds a bool mask turned into −inf: a +inf or NaN in the
      // float mask then gives NaN there, exactly as in PyTorch.
      if (j >= visible || (keep && !keep[j * attend.stride_j])) v += neg_inf;
      scores[j] = v;
    }
  }
};

// What a backend's forward reads and writes. Every backend writes every element of logsumexp;
// cpu_flash also every element of output, which the reference adds into (it starts at 0 there).
// The weights start at 0 (cpu_flash leaves the keys causality hides unwritten); absent unless
// the call asked for them. Keys and values may be stored in another type than the queries
// (Kv: bfloat16 or float16 in a KV cache, read by the decode backend).
template <class T, class Kv = T>
struct ForwardArgs {
  Rows<const T> query;
  Rows<const Kv> key, value;
  Rows<T> output;
  Rows<double> logsumexp;
  Rows<T> weights;
};

// What a backend's backward reads and writes; the gradients are zero when the backend starts.
template <class T>
struct BackwardArgs {
  Rows<const T> query, key, value, output, grad_output;
  Rows<const double> logsumexp;
  Rows<T> grad_query, grad_key, grad_value;
};

}  // namespace mha::attention::detail
