#pragma once
// One struct describes an attention call; every backend takes the same struct.
//
// Shapes (B batch, Hq query heads, Hkv key/value heads, L queries, S keys,
//         Dqk query/key head size, Dv value head size):
//   query (B, Hq, L, Dqk)   key (B, Hkv, S, Dqk)   value (B, Hkv, S, Dv)
//   output (B, Hq, L, Dv)   logsumexp (B, Hq, L)   weights (B, Hq, L, S)
// Hq must be a multiple of Hkv: query head h reads key/value head h / (Hq / Hkv) (GQA).
#include <cstdint>
#include <optional>

#include "mha/core/view.h"

namespace mha::attention {

// Which keys a query may see when `causal` is on. Query i, key j:
//   top_left     j <= i            (PyTorch's is_causal, tril(ones(L, S)))
//   bottom_right j <= i + (S − L)  (the last query sees every key: KV-cache decoding)
enum class Causal { none, top_left, bottom_right };

// Which implementation runs the call. Every backend takes the same Options and honours the same
// contract (attention.h); they differ only in speed and in float rounding.
//   automatic  float: decode for at most 16 query rows per head without weights, cpu_flash
//              otherwise; double: reference (the default)
//   reference  the definition written plainly, one query row at a time (any scalar type)
//   cpu_flash  the fused, tiled CPU kernel: never builds the L×S score matrix unless weights are
//              asked for, SIMD through Highway with run-time dispatch (float only)
//   decode     flash-decoding for few query rows against many keys (generation against a KV
//              cache): the keys split into fixed chunks across threads, partial results merged by
//              log-sum-exp; reads bfloat16/float16 keys and values in place (float only; no
//              weights; a forward kernel: sdpa_backward runs cpu_flash for it, with the
//              logsumexp of a cpu_flash forward, whose scores it recomputes bit for bit)
enum class Backend { automatic, reference, cpu_flash, decode };

// Where the call sits in a larger one (context parallelism: a process holding a slice of the
// sequence, or of the heads). Query row i of the call is row query_offset + i of the whole call,
// key j is key key_offset + j, query head h is head head_offset + h; the whole call has query_len
// queries, key_len keys and heads query heads (0: the call's own size). Causal masks and dropout
// use the whole call's positions, so a block of queries given all keys returns exactly the whole
// call's rows (bit for bit), and blocks of keys merged by log-sum-exp return them up to rounding.
// The masks are given for the block itself. A call whose keys are a part of the whole (keys given
// with an offset or fewer than key_len) has a backward that takes D_i = dO_i·O_i from the output
// given, which must be the whole call's (merged) output, and the whole call's logsumexp.
struct Positions {
  int64_t query_offset = 0, key_offset = 0, head_offset = 0;
  int64_t query_len = 0, key_len = 0, heads = 0;
};

template <class T>
struct Options {
  // Masks are broadcast to (B, Hq, L, S): each may have rank 1..4, aligned on the right, with
  // every dimension either 1 or the full size. The names carry the polarity:
  //   attend_mask   true = the query MAY attend to the key (SDPA's bool polarity);
  //   additive_mask added to the scaled scores (−inf blocks, as a float mask in PyTorch).
  // Both may be given; they are combined. Views (any strides, 0 included: an expanded torch mask
  // is read in place); the memory must outlive the call. A Tensor converts to one.
  View<const bool> attend_mask;
  View<const T> additive_mask;
  Causal causal = Causal::none;
  // Multiplies q·k; defaults to 1/sqrt(Dqk). Any finite value (negative included) is allowed.
  std::optional<double> scale;
  // Dropout on the probabilities, survivors scaled by 1/(1 − p). Always applied when p > 0
  // (the caller decides training vs eval). The mask is a pure function of (seed, element).
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  // Also return the (B, Hq, L, S) probabilities (after dropout, as PyTorch's MHA returns them).
  bool need_weights = false;
  Backend backend = Backend::automatic;
  Positions positions;
};

}  // namespace mha::attention
