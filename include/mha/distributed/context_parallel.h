#pragma once
// Context parallelism: one attention call whose sequence is split across the ranks of a
// communicator, forward and backward, with the results sdpa_forward / sdpa_backward give on the
// whole sequence (attention.h), each rank receiving its own rows of them.
//
// Every rank holds, in the layout's order (layout.h), its rows of the L queries (B, Hq, Nq, Dqk)
// and of the S keys and values (B, Hkv, Nk, D): batch, heads and head sizes whole. The options are
// the whole call's: causal alignment, scale, dropout (drawn at the whole call's positions, so the
// result does not depend on P or the layout) and masks broadcastable to the whole call's
// (B, Hq, L, S), which every rank holds (a key-padding mask is B·S bytes). need_weights and
// options.whole_call are refused (the schemes set it).
//
//   ring     queries stay; keys and values travel around the ring (rank r sends to r + 1), the
//            transfer of the next block overlapped with the attention of the current one; each
//            block's result merged into the rows' by log-sum-exp in double (merge_partial). The
//            backward gets the merged output and logsumexp and sends the keys and values around
//            again, with a dK, dV accumulator for each block travelling beside them and arriving
//            home after P hops. Messages per rank: P − 1 forward, 2P − 1 backward, each one block
//            of keys and values (or of their gradients): B·Hkv·Nk·(Dqk + Dv) elements. Pairs of
//            query and key rows a causal mask hides entirely are skipped, so with the zigzag
//            layout every rank does the same work. Equal to the whole call up to rounding.
//   ulysses  all-to-all over heads: each rank receives the whole sequence for its share of the
//            heads (whole GQA groups: the Hkv kv heads split as evenly as possible, so a count
//            that does not divide by P gives uneven shares, and ranks past Hkv get none), runs the
//            unchanged kernel on them, and a second all-to-all returns every rank its rows. Two
//            all-to-alls forward, two backward. Bit for bit the whole call's results.
//
// Every rank must make the same call (shapes, options, scheme); a rank whose call differs gets an
// mha::Error on every rank. Call it inside run_or_abort (communicator.h): an error on one rank
// then ends every rank instead of leaving them waiting.
#include <cstdint>

#include "mha/attention/attention.h"
#include "mha/distributed/communicator.h"
#include "mha/distributed/layout.h"
#include "mha/nn/multihead_attention.h"

namespace mha::distributed {

enum class Scheme { ring, ulysses };

// The whole call's sequence lengths, and how every rank holds its rows of them.
struct Sequence {
  int64_t query_len = 0, key_len = 0;
  Layout layout = Layout::contiguous;
};

template <class T>
attention::ForwardResult<T> context_parallel_forward(Communicator& comm, Scheme scheme, const Tensor<T>& query,
                                                     const Tensor<T>& key, const Tensor<T>& value,
                                                     const Sequence& sequence,
                                                     const attention::Options<T>& options = {});

// output and logsumexp: this rank's rows of context_parallel_forward's results.
template <class T>
attention::Gradients<T> context_parallel_backward(Communicator& comm, Scheme scheme, const Tensor<T>& query,
                                                  const Tensor<T>& key, const Tensor<T>& value,
                                                  const Tensor<T>& output, const Tensor<double>& logsumexp,
                                                  const Tensor<T>& grad_output, const Sequence& sequence,
                                                  const attention::Options<T>& options = {});

// nn::MultiheadAttention's attention core run context-parallel (nn::AttentionCore): every rank
// gives the module the whole inputs (so the projections run whole on every rank); the core takes
// its rows of the projected queries, keys and values in `layout`, runs context_parallel_forward
// or _backward, and all-gathers every rank's rows back into the whole results, the same on every
// rank. What `mha attention --context-parallel` runs. The attention's work is split P ways; the
// projections' is not (the library calls above split both memory and work).
template <class T>
nn::AttentionCore<T> context_parallel_core(Communicator& comm, Scheme scheme, Layout layout);

// The kv heads rank `rank` of `ranks` computes under ulysses (its query heads: these times Hq/Hkv).
Range ulysses_heads(int64_t kv_heads, int rank, int ranks);

}  // namespace mha::distributed
