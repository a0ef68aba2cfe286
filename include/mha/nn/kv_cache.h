#pragma once
// A key/value cache for token-by-token generation: one per attention layer, holding the keys and
// values of the tokens seen so far, so that each new token computes only its own and attends
// over the rest. Storage is float32, bfloat16 or float16 (Kv); computing is always float (the
// decode backend converts each block it reads, mha/attention/options.h).
//
//   KVCache<bfloat16> cache(batch, kv_heads, capacity, head_dim, head_dim);
//   cache.append(key, value);                  // (B, Hkv, T, D) float: T new tokens per sequence
//   Tensor<float> out = attend(cache, query);  // (B, Hq, T, Dv): each new token sees the cache
//                                              // up to and including itself
//
// Sequences of one batch may have different lengths: append(key, value, counts) takes only the
// first counts[b] of the T new tokens of sequence b (the others are padding), each written at
// that sequence's own next position; attend reads each sequence only up to its length and
// gives padding queries output 0. truncate() rewinds (a rejected draft, a new turn over a shared
// prefix); reset() empties it for reuse without reallocating.
#include <cstdint>
#include <span>
#include <vector>

#include "mha/attention/options.h"
#include "mha/core/half.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"

namespace mha::nn {

template <class Kv>  // float, bfloat16 or float16
class KVCache {
 public:
  // Every size >= 1 (head dims may be 0); the storage, (B, Hkv, capacity, Dqk) and
  // (B, Hkv, capacity, Dv), is allocated here once.
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t qk_head_dim, int64_t v_head_dim);

  // key (B, Hkv, T, Dqk) and value (B, Hkv, T, Dv), float, rows contiguous (any batch, head and
  // token strides: a projection's (B, T, Hkv·D) memory seen as heads). Sequence b takes the
  // first counts[b] tokens (counts empty: all T), rounded to Kv, at positions
  // lengths()[b], lengths()[b] + 1, ... Throws mha::Error (and changes nothing) when a shape
  // differs, a count is outside [0, T] or a sequence would pass the capacity.
  void append(View<const float> key, View<const float> value, std::span<const int64_t> counts = {});

  // Tokens held per sequence, and the most any holds.
  const std::vector<int64_t>& lengths() const { return lengths_; }
  int64_t length() const;
  // The counts of the last append (all T when it had none): which queries attend() treats as real.
  const std::vector<int64_t>& last_counts() const { return last_counts_; }

  int64_t batch() const { return keys_.size(0); }
  int64_t kv_heads() const { return keys_.size(1); }
  int64_t capacity() const { return keys_.size(2); }
  int64_t qk_head_dim() const { return keys_.size(3); }
  int64_t v_head_dim() const { return values_.size(3); }

  // The first `length()` slots of every sequence, (B, Hkv, length(), D), as views of the storage
  // (slots past a sequence's own length hold stale or zero values: attend does not read them).
  View<const Kv> keys() const;
  View<const Kv> values() const;

  // Every sequence back to at most `length` tokens (0 <= length).
  void truncate(int64_t length);
  // Empties every sequence; the storage stays allocated.
  void reset();

 private:
  Tensor<Kv> keys_, values_;
  std::vector<int64_t> lengths_, last_counts_;
};

// Attention of the last appended tokens' queries over the cache: query (B, Hq, T, Dqk) float, T
// as in the last append and Hq a multiple of the cache's kv heads (GQA). Query t of sequence b is
// the token at position p = lengths()[b] − last_counts()[b] + t; it sees the cached positions
// 0..p (causal); queries t >= last_counts()[b] (padding) see nothing and give 0. Returns
// (B, Hq, T, Dv). `scoring` holds the call's other settings (scale, by default 1/sqrt(Dqk), and
// dropout); its causal alignment must be none or bottom_right (the cache's own, applied in any
// case) and its whole_call the default. The core reads each sequence's keys only up to its length
// (Options::key_lengths). Runs the decode backend for T <= 16 (automatic), cpu_flash on a float
// copy of the keys and values above that.
template <class Kv>
Tensor<float> attend(const KVCache<Kv>& cache, View<const float> query, const attention::Scoring& scoring = {});

// The same, written into `output` (B, Hq, T, Dv) with any strides whose last dimension is
// contiguous (the heads of a (B, T, Hq·Dv) buffer, as the module merges them).
template <class Kv>
void attend_into(const KVCache<Kv>& cache, View<const float> query, View<float> output,
                 const attention::Scoring& scoring = {});

}  // namespace mha::nn
