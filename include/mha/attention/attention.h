#pragma once
// Scaled dot-product attention, forward and backward, dispatched to a backend.
//
//   scores  = cap(scale · q kᵀ) + additive_mask + ALiBi, −inf where attend_mask is false or
//             causality, the window or the sequence's lengths hide the key (cap: Scoring::softcap)
//   P       = softmax(scores) per row, the row's sink logit joining the denominator (Options::sinks);
//             a row whose scores are all −inf gives P = 0 (output 0, gradient 0, never NaN), as
//             PyTorch's SDPA does
//   output  = dropout(P) v
//   logsumexp[i] = log(Σ_j exp(scores_ij) + exp(sink)) (−inf for a fully masked row without a
//             sink; the sink alone for a fully masked row with one): all backward needs.
//             Kept in double whatever T is: with a large finite mask fill (−1e9) the row
//             maximum m dwarfs log Σ exp(s − m), which a float would round away, and then
//             backward's exp(s − logsumexp) would be up to S times too large.
#include <optional>

#include "mha/attention/options.h"
#include "mha/core/half.h"

namespace mha::attention {

template <class T>
struct ForwardResult {
  Tensor<T> output;                  // (B, Hq, L, Dv)
  Tensor<double> logsumexp;          // (B, Hq, L)
  std::optional<Tensor<T>> weights;  // (B, Hq, L, S), when options.need_weights
};

template <class T>
struct Gradients {
  Tensor<T> grad_query;  // (B, Hq, L, Dqk)
  Tensor<T> grad_key;    // (B, Hkv, S, Dqk)
  Tensor<T> grad_value;  // (B, Hkv, S, Dv)
  std::optional<Tensor<T>> grad_sinks;  // (Hq), when options.sinks is given
};

// Checks every shape and option (mha::Error naming the argument) and runs options.backend.
template <class T>
ForwardResult<T> sdpa_forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                              const Options<T>& options = {});

// Gradients of sum(output ∘ grad_output) with respect to query, key and value, given the
// forward's output and logsumexp (the probabilities are recomputed, not stored). The options
// must be the forward's (same masks, scale, dropout seed).
template <class T>
Gradients<T> sdpa_backward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                           const Tensor<T>& output, const Tensor<double>& logsumexp,
                           const Tensor<T>& grad_output, const Options<T>& options = {});

// The same two calls on memory the caller owns (numpy arrays, torch tensors, slices of a bigger
// buffer), writing into outputs the caller allocated; the Tensor versions above allocate and
// call these. Inputs and outputs are views of the shapes above with any strides whose last
// dimension is contiguous (stride 1), so (B, L, H, D) memory viewed as (B, H, L, D) is read and
// written in place; logsumexp may have any strides. Every output is overwritten (or, for the
// gradients, added to when asked); no two of its
// elements may share memory, and no output may overlap an input or another output.
template <class T>
struct ForwardOutputs {
  View<T> output;          // (B, Hq, L, Dv)
  View<double> logsumexp;  // (B, Hq, L)
  View<T> weights;         // (B, Hq, L, S): given exactly when options.need_weights
};

template <class T>
struct GradientOutputs {
  View<T> grad_query;  // (B, Hq, L, Dqk)
  View<T> grad_key;    // (B, Hkv, S, Dqk)
  View<T> grad_value;  // (B, Hkv, S, Dv)
  // Add the gradients to what the outputs hold instead of overwriting them (blocks of a
  // longer sequence summing into one accumulator, Options::whole_call).
  bool accumulate = false;
  // (Hq): the gradient of options.sinks, summed over the batch and the rows; may be absent (not
  // computed) when options.sinks is given, and must be absent when it is not.
  View<T> grad_sinks;
};

template <class T>
void sdpa_forward_into(View<const T> query, View<const T> key, View<const T> value, const ForwardOutputs<T>& out,
                       const Options<T>& options = {});

template <class T>
void sdpa_backward_into(View<const T> query, View<const T> key, View<const T> value, View<const T> output,
                        View<const double> logsumexp, View<const T> grad_output, const GradientOutputs<T>& grads,
                        const Options<T>& options = {});

// Log-sum-exp merge of attention over blocks of keys (Options::whole_call): `output`, `logsumexp`
// hold the attention of each query row over the keys merged so far (start: 0 and −inf), and
// become that over those keys and the block's, whose result is block_output, block_logsumexp:
//   lse' = log(e^lse + e^lse_b),   output' = e^(lse − lse')·output + e^(lse_b − lse')·block_output
// in double. A block whose row is fully masked (lse_b = −inf) changes nothing, so a row no block
// sees stays 0 with −inf (never NaN); a NaN logsumexp makes the row NaN. Shapes (B, H, L, Dv) and
// (B, H, L), any strides with rows contiguous.
template <class T>
void merge_partial(View<double> output, View<double> logsumexp, View<const T> block_output,
                   View<const double> block_logsumexp);

// Keys and values stored in bfloat16 or float16 (a KV cache's), queries and outputs in float:
// the same call, contract and options. The decode backend (automatic's choice for at most 16
// query rows without weights) converts each block of keys and values to float as it reads it,
// cpu_flash as it packs a kv head's keys (never a float copy of the cache), and both compute in
// float; the reference runs on a float copy of the keys and values.
void sdpa_forward_into(View<const float> query, View<const bfloat16> key, View<const bfloat16> value,
                       const ForwardOutputs<float>& out, const Options<float>& options = {});
void sdpa_forward_into(View<const float> query, View<const float16> key, View<const float16> value,
                       const ForwardOutputs<float>& out, const Options<float>& options = {});

// Keys and values in pages (a paged KV cache, mha/nn/paged_kv_cache.h), read where they lie. A page
// holds P consecutive tokens of one sequence for every kv head:
//   key_pages (pages, Hkv, P, Dqk)   value_pages (pages, Hkv, P, Dv)
// views with any strides whose last dimension is contiguous (FlashAttention's (pages, P, Hkv, D)
// layout is that view with two strides swapped); block_table (N, blocks): token j of sequence s
// is row j % P of page block_table[s, j / P]. int8 storage (Kv = int8_t) carries a float scale
// per token and kv head, key_scales and value_scales (pages, Hkv, P), any strides: the token's
// number x stands for scale·x (mha/core/int8.h). Against int8 storage each query row is rounded
// to int8 the same way before it is used, on every path (so that decode multiplies int8 by int8
// where the CPU has VPDPBUSD, and every CPU computes the same thing). The other storages take no
// scales.
template <class Kv>
struct PagedKv {
  View<const Kv> key_pages, value_pages;
  View<const int32_t> block_table;
  View<const float> key_scales, value_scales;
};

// Attention of N sequences' newest tokens over their paged keys and values: prefill chunks and
// decode rows of many sequences in one call (FlashAttention's flash_attn_with_kvcache with a
// block table; vLLM's mixed batches). query (1, Hq, T, Dqk) float holds the sequences' queries
// back to back, options.cu_seqlens_q (N + 1) says where each starts, options.key_lengths (N) how
// many tokens each has in the pages, its queries being its last ones (so query i of sequence s, of
// q_s, is its token key_lengths[s] − q_s + i; with options.causal = bottom_right it sees the
// tokens up to itself). Writes out.output (1, Hq, T, Dv) and out.logsumexp (1, Hq, T) (any
// strides, as sdpa_forward_into's). The options a paged call takes: causal (none or
// bottom_right), scale, window, softcap, chunk_size, sinks, alibi_slopes ((Hq), or (N, Hq): one
// row per sequence) and key_starts ((N): left padding, a sequence's tokens before it seen by no
// query, its positions counted from it, and its queries before it padding: they see nothing and
// give 0); not masks, dropout, weights, query_lengths, cu_seqlens_k or whole_call (mha::Error
// naming the one given).
// Backends: automatic runs the sequences of at most 16 queries on decode, those of each query
// count together (tasks of (sequence, kv head, chunk of keys) over the pages), and each longer
// one (a prefill chunk) on cpu_flash, one kv head at a time over a contiguous copy of that
// sequence's keys and values (O(S·d) copied against O(L·S·d) work; int8 widened with its scales);
// decode or cpu_flash send every sequence to that path; reference runs each sequence's copy on
// the reference.
template <class Kv>
void paged_forward_into(View<const float> query, const PagedKv<Kv>& kv, const ForwardOutputs<float>& out,
                        const Options<float>& options);

}  // namespace mha::attention
