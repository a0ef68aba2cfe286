#pragma once
// What the context-parallel schemes share (not a public API): the whole call's sizes and the
// checks that make them (call.cpp), the block of a mask a part of the call sees, and the schemes'
// entry points (ring.cpp, ulysses.cpp), which context_parallel.cpp calls after make_call.
#include <cstdint>
#include <vector>

#include "mha/distributed/context_parallel.h"

namespace mha::distributed::detail {

// The whole call's sizes, from this rank's tensors and the sequence.
struct Call {
  int64_t batch = 0, query_heads = 0, kv_heads = 0, qk_dim = 0, v_dim = 0;
  int64_t query_len = 0, key_len = 0;
  Layout layout = Layout::contiguous;
  int rank = 0, ranks = 1;

  std::vector<Range> query_ranges(int r) const { return shard_ranges(query_len, layout, r, ranks); }
  std::vector<Range> key_ranges(int r) const { return shard_ranges(key_len, layout, r, ranks); }
  int64_t query_rows(int r) const { return shard_length(query_len, layout, r, ranks); }
  int64_t key_rows(int r) const { return shard_length(key_len, layout, r, ranks); }
  int64_t group() const { return query_heads / kv_heads; }
};

// Checks this rank's arguments, then that every rank makes the same call (one all_gather of the
// call's description; a difference is an error on every rank, so none waits for the others).
template <class T>
Call make_call(Communicator& comm, Scheme scheme, const char* function, const Tensor<T>& q, const Tensor<T>& k,
               const Tensor<T>& v, const Sequence& seq, const attention::Options<T>& options);

// The block (rows, keys, heads) of a mask broadcastable to the whole call's (B, Hq, L, S).
template <class M>
View<const M> mask_block(View<const M> mask, const Call& c, Range rows, Range keys, Range heads) {
  if (!mask.defined()) return mask;
  const int64_t d = mask.dim();
  if (mask.size(d - 1) == c.key_len) mask = mask.slice(d - 1, keys.start, keys.length);
  if (d >= 2 && mask.size(d - 2) == c.query_len) mask = mask.slice(d - 2, rows.start, rows.length);
  if (d >= 3 && mask.size(d - 3) == c.query_heads) mask = mask.slice(d - 3, heads.start, heads.length);
  return mask;
}

// The schemes, on a call make_call checked (docs/distributed.md).
template <class T>
attention::ForwardResult<T> ring_forward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                         const Tensor<T>& v, const attention::Options<T>& options);
template <class T>
attention::Gradients<T> ring_backward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                      const Tensor<T>& v, const Tensor<T>& out, const Tensor<double>& lse,
                                      const Tensor<T>& dout, const attention::Options<T>& options);
template <class T>
attention::ForwardResult<T> ulysses_forward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                            const Tensor<T>& v, const attention::Options<T>& options);
template <class T>
attention::Gradients<T> ulysses_backward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                         const Tensor<T>& v, const Tensor<T>& out, const Tensor<double>& lse,
                                         const Tensor<T>& dout, const attention::Options<T>& options);

}  // namespace mha::distributed::detail
