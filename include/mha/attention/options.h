#pragma once
// One struct describes an attention call; every backend takes the same struct.
//
// Shapes (B batch, Hq query heads, Hkv key/value heads, L queries, S keys,
//         Dqk query/key head size, Dv value head size):
//   query (B, Hq, L, Dqk)   key (B, Hkv, S, Dqk)   value (B, Hkv, S, Dv)
//   output (B, Hq, L, Dv)   logsumexp (B, Hq, L)   weights (B, Hq, L, S)
// Hq must be a multiple of Hkv: query head h reads key/value head h / (Hq / Hkv) (GQA).
//
// The settings of a call are split in two: `Scoring`, plain values (causal alignment, scale,
// dropout, where the call sits in a larger one) that can be copied, compared, printed and sent to
// another process, and the typed views of `Options<T>` (masks, per-sequence lengths), which point
// at the caller's memory. Adding an attention variant: docs/architecture.md, the last section.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "mha/core/view.h"

namespace mha::attention {

// Which keys a query may see when `causal` is on. Query i, key j:
//   top_left     j <= i            (PyTorch's is_causal, tril(ones(L, S)))
//   bottom_right j <= i + (S − L)  (the last query sees every key: KV-cache decoding)
// With per-sequence lengths (Options::query_lengths, key_lengths), L and S are sequence b's own.
enum class Causal { none, top_left, bottom_right };

// Which implementation runs the call. Every backend takes the same Options and honours the same
// contract (attention.h); they differ only in speed and in float rounding.
//   automatic  float: decode for at most 16 query rows per head without weights, cpu_flash
//              otherwise; double: reference (the default)
//   reference  the definition written plainly, one query row at a time (any scalar type)
//   cpu_flash  the fused, tiled CPU kernel: never builds the L×S score matrix unless weights are
//              asked for, SIMD through Highway with run-time dispatch (float only; reads
//              bfloat16/float16 keys and values in place, widened as it packs them)
//   decode     flash-decoding for few query rows against many keys (generation against a KV
//              cache): the keys split into fixed chunks across threads, partial results merged by
//              log-sum-exp; reads bfloat16/float16 keys and values in place (float only; no
//              weights; a forward kernel: its calls' backward runs on cpu_flash)
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
struct WholeCall {
  int64_t query_offset = 0, key_offset = 0, head_offset = 0;
  int64_t query_len = 0, key_len = 0, heads = 0;

  bool operator==(const WholeCall&) const = default;
  template <class Visitor>
  static constexpr void visit_fields(Visitor&& v) {
    v("query_offset", &WholeCall::query_offset);
    v("key_offset", &WholeCall::key_offset);
    v("head_offset", &WholeCall::head_offset);
    v("query_len", &WholeCall::query_len);
    v("key_len", &WholeCall::key_len);
    v("heads", &WholeCall::heads);
  }
};

// The settings of a call that are plain values: how a score is made and which keys a query sees.
struct Scoring {
  Causal causal = Causal::none;
  // Multiplies q·k; defaults to 1/sqrt(Dqk). Any finite value (negative included) is allowed.
  std::optional<double> scale;
  // Dropout on the probabilities, survivors scaled by 1/(1 − p). Always applied when p > 0
  // (the caller decides training vs eval). The mask is a pure function of (seed, element).
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  WholeCall whole_call;
  // Sliding window (FlashAttention-2's window_size): query i sees key j only when
  // i + diagonal − window_left <= j <= i + diagonal + window_right, −1 = unbounded on that side.
  // The diagonal is the causal alignment's: 0 for top_left, S − L for bottom_right and for no
  // causality (FlashAttention's). Causality is window_right = 0 on top of the window. Hugging
  // Face's sliding_window = W is (W − 1, 0) with causality. A row's keys outside the window cost
  // nothing: the backends walk only the keys a block of queries sees.
  int64_t window_left = -1, window_right = -1;
  // Logit soft-capping (Gemma 2; FlashAttention's softcap): scale·q·k becomes c·tanh(scale·q·k / c)
  // before anything is added to it (masks, ALiBi); 0 = none, else a finite c > 0.
  double softcap = 0.0;
  // Chunked attention (Llama 4's attention_chunk_size, FlashAttention-3's attention_chunk): the keys
  // fall into chunks of C = chunk_size positions, [0, C), [C, 2C), ..., and query i sees only the
  // chunk holding its own key i + diagonal (the diagonal as for the window), on top of causality
  // and the window; 0 = no chunks. Positions are each sequence's own (key_starts, cu_seqlens), so a
  // left-padded sequence's chunks start at its first key, as transformers' chunked_overlay aligns
  // them. Like the window, keys outside the chunk cost nothing.
  int64_t chunk_size = 0;

  bool operator==(const Scoring&) const = default;
  // Every field, in order, as (name, member pointer): the one list that the context-parallel
  // agreement check, the Python binding (and from it every Python door), the goldens' metadata
  // and the tests' descriptions walk (for_each_field). A new setting is a field here and a line in
  // this list.
  template <class Visitor>
  static constexpr void visit_fields(Visitor&& v) {
    v("causal", &Scoring::causal);
    v("scale", &Scoring::scale);
    v("dropout_p", &Scoring::dropout_p);
    v("dropout_seed", &Scoring::dropout_seed);
    v("whole_call", &Scoring::whole_call);
    v("window_left", &Scoring::window_left);
    v("window_right", &Scoring::window_right);
    v("softcap", &Scoring::softcap);
    v("chunk_size", &Scoring::chunk_size);
  }
};

// The checks of a call's settings that need no tensor (dropout_p, causal, the window, softcap,
// chunk_size, a finite scale): mha::Error naming the field, after `prefix` (make_problem's, and a
// module's for the settings it holds: "MultiheadAttention: scoring.").
void check_scoring(const Scoring& s, std::string_view prefix = {});

// f(name, field) for every plain field of a settings struct (its visit_fields list), a nested
// struct's fields by their own list as "outer.inner": the one walk over the list, for settings
// const or not.
template <class Settings, class F>
void for_each_field(Settings& settings, F&& f, const std::string& prefix = {}) {
  std::remove_const_t<Settings>::visit_fields([&](const char* name, auto member) {
    auto& value = settings.*member;
    using V = std::remove_cvref_t<decltype(value)>;
    if constexpr (requires { V::visit_fields([](const char*, auto) {}); }) {
      for_each_field(value, f, prefix + name + ".");
    } else {
      f(prefix + name, value);
    }
  });
}

template <class T>
struct Options : Scoring {
  // Masks are broadcast to (B, Hq, L, S): each may have rank 1..4, aligned on the right, with
  // every dimension either 1 or the full size. The names carry the polarity:
  //   attend_mask   true = the query MAY attend to the key (SDPA's bool polarity);
  //   additive_mask added to the scaled scores (−inf blocks, as a float mask in PyTorch).
  // Both may be given; they are combined. Views (any strides, 0 included: an expanded torch mask
  // is read in place); the memory must outlive the call. A Tensor converts to one.
  View<const bool> attend_mask;
  View<const T> additive_mask;
  // Per-sequence lengths of a padded batch (FlashAttention's seqused_q / seqused_k), each (B) or
  // absent: sequence b has its first query_lengths[b] queries and key_lengths[b] keys (in the whole
  // call's positions, Scoring::whole_call), the rest padding. A padding query sees no key (output
  // 0, logsumexp −inf, gradient 0); a padding key is seen by no query; bottom-right causality
  // aligns on the sequence's own lengths. Costs nothing per key: the key range of each row ends
  // at its sequence's length, where a mask would be read key by key.
  View<const int64_t> query_lengths;
  View<const int64_t> key_lengths;
  // Left padding (FlashAttention's cache_leftpad), (B) or absent: sequence b's keys begin at key
  // key_starts[b] (in [0, its key length]); the keys before it are padding, seen by no query. The
  // sequence's own positions begin there: with bottom-right causality its queries are aligned on
  // its last key, so a left-padded batch (transformers' generate()) needs no mask; windows,
  // chunks and ALiBi distances are measured in them. A negative start (−p, without cu_seqlens)
  // says the sequence began p keys before the call's first key (a sliding-window cache that let
  // them go): no key is padding, and its chunks are counted from where it began.
  View<const int64_t> key_starts;
  // Packed variable-length sequences (FlashAttention's cu_seqlens_q / cu_seqlens_k, padding-free
  // batches): the call has batch 1 and its N sequences back to back along L and S; sequence s has
  // queries [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and keys [cu_seqlens_k[s], cu_seqlens_k[s + 1]),
  // each (N + 1), starting at 0, non-decreasing, ending at L and S. A query sees only its own
  // sequence's keys; causality, windows and ALiBi are each sequence's own (bottom-right aligns on
  // its lengths). FlashAttention's (total, H, D) tensors are the views (1, H, total, D) of the same
  // memory. With them, query_lengths / key_lengths (FlashAttention's seqused_q / seqused_k) and
  // (B, Hq) ALiBi slopes have one entry per sequence. No work crosses a sequence boundary.
  View<const int64_t> cu_seqlens_q;
  View<const int64_t> cu_seqlens_k;
  // Attention sinks (gpt-oss's s_aux): one logit per query head of the call, (Hq), that joins the
  // denominator of every row's softmax and is left out of the output: P_ij = exp(s_ij − lse_i) with
  // lse_i = log(exp(sink_h) + Σ_j exp(s_ij)), which the logsumexp returned includes. Not scaled,
  // not soft-capped; −inf is no sink. A call that is a block of the whole call's keys
  // (whole_call.key_offset > 0) leaves the sink to the block that holds key 0, so blocks merged by
  // log-sum-exp count it once. Its gradient: Gradients::grad_sinks, GradientOutputs::grad_sinks.
  View<const T> sinks;
  // ALiBi (FlashAttention-2's alibi_slopes): (Hq) or (B, Hq) slopes; score (b, h, i, j) gets
  //   −slope[b, h] · |i + diagonal − j|
  // added after soft-capping, at the whole call's positions, with the diagonal of the causal
  // alignment (causal_diagonal). Under causality every visible key has j <= i + diagonal, and Bloom's
  // key-position form slope·j differs from it by a constant per row, which softmax ignores.
  View<const T> alibi_slopes;
  // Also return the (B, Hq, L, S) probabilities (after dropout, as PyTorch's MHA returns them).
  bool need_weights = false;
  Backend backend = Backend::automatic;

  // Every typed view, in order, as (name, member pointer): the typed half's one list, beside
  // Scoring::visit_fields. The element type tells what a view holds: bool, T (the call's element
  // type) or int64_t (lengths and offsets). The Python binding takes the views in this order and
  // exports the list, from which every Python door's keywords, the torch operators' schemas and
  // their autograd are built; a half call's float copy and the call's overlap check walk it too.
  // A new per-head or per-sequence input is a member here and a line in this list.
  template <class Visitor>
  static constexpr void visit_views(Visitor&& v) {
    v("attend_mask", &Options::attend_mask);
    v("additive_mask", &Options::additive_mask);
    v("query_lengths", &Options::query_lengths);
    v("key_lengths", &Options::key_lengths);
    v("key_starts", &Options::key_starts);
    v("cu_seqlens_q", &Options::cu_seqlens_q);
    v("cu_seqlens_k", &Options::cu_seqlens_k);
    v("sinks", &Options::sinks);
    v("alibi_slopes", &Options::alibi_slopes);
  }
};

// Query i's own key is key i + causal_diagonal(...) (of a sequence of query_len queries and key_len
// keys): 0 for top-left causality, key_len − query_len otherwise (bottom-right, FlashAttention's
// alignment, also without causality). Windows and ALiBi distances are measured from it.
int64_t causal_diagonal(const Scoring& s, int64_t query_len, int64_t key_len);

// The keys [begin, end) a query may see. Empty when end <= begin.
struct KeyRange {
  int64_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  bool contains(int64_t j) const { return begin <= j && j < end; }
};

// The one definition of which keys a query sees (the masks aside): the union of the ranges of
// queries [first_query, end_query) of a sequence of query_len queries and key_len keys, by the
// causal alignment, the window and the chunks (both ends of a query's range never decrease from
// one query to the next, so the union runs from the first query's begin to the last one's end). Positions are the whole
// call's; queries at or past query_len (padding) see nothing. Every backend's key walk, the tiles' edges and
// the context-parallel schemes' skipping of hidden blocks ask this function.
KeyRange visible_keys(const Scoring& s, int64_t query_len, int64_t key_len, int64_t first_query, int64_t end_query);

}  // namespace mha::attention
