// Context-parallel attention around a ring: queries stay, keys and values travel from rank to
// rank + 1 (docs/distributed.md).
#include "call.h"

#include <algorithm>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace mha::distributed::detail {
namespace {

using attention::Options;

// Whether any query of `rows` sees a key of `keys` (whole-call rows; attention::visible_keys, the
// core's own definition, so a pair skipped here is one the core would have computed as nothing).
bool any_visible(const attention::Scoring& scoring, const Call& c, Range rows, Range keys) {
  if (rows.length == 0 || keys.length == 0) return false;
  const attention::KeyRange seen =
      attention::visible_keys(scoring, c.query_len, c.key_len, rows.start, rows.start + rows.length);
  return seen.begin < keys.start + keys.length && keys.start < seen.end;
}

// Rows [start, start + n) of a (B, H, N, ...) tensor.
template <class T>
View<const T> rows(const Tensor<T>& t, int64_t start, int64_t n) {
  return View<const T>(t).slice(2, start, n);
}
template <class T>
View<T> rows(Tensor<T>& t, int64_t start, int64_t n) {
  return View<T>(t).slice(2, start, n);
}

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v, int64_t count) {
  return std::as_bytes(std::span<const T>(v.data(), static_cast<size_t>(count)));
}
template <class T>
std::span<std::byte> bytes_of(std::vector<T>& v, int64_t count) {
  return std::as_writable_bytes(std::span<T>(v.data(), static_cast<size_t>(count)));
}

// One block of keys and values as it travels: (B, Hkv, Nk, Dqk) keys, then (B, Hkv, Nk, Dv)
// values, contiguous; or their gradients, laid out alike.
template <class T>
struct KvBlock {
  const Call* c;
  std::vector<T> data;

  explicit KvBlock(const Call& call) : c(&call) {
    int64_t rows = 0;
    for (int r = 0; r < call.ranks; ++r) rows = std::max(rows, call.key_rows(r));
    data.assign(static_cast<size_t>(elements(rows)), T(0));
  }
  int64_t elements(int64_t rows) const { return c->batch * c->kv_heads * rows * (c->qk_dim + c->v_dim); }
  // Rank `owner`'s block: its key rows.
  View<T> keys(int owner) { return View<T>(data.data(), {c->batch, c->kv_heads, c->key_rows(owner), c->qk_dim}); }
  View<T> values(int owner) {
    const int64_t nk = c->key_rows(owner);
    return View<T>(data.data() + c->batch * c->kv_heads * nk * c->qk_dim, {c->batch, c->kv_heads, nk, c->v_dim});
  }
  static Tensor<T> copy(View<T> part) {
    Tensor<T> t(part.shape());
    std::copy_n(part.data(), part.numel(), t.data());
    return t;
  }
  void fill(int owner, const Tensor<T>& k, const Tensor<T>& v) {
    std::copy_n(k.data(), k.numel(), keys(owner).data());
    std::copy_n(v.data(), v.numel(), values(owner).data());
  }
};

// Rank r's block of keys and values at step s of the ring is rank r − s's.
int owner_at(const Call& c, int step) { return (c.rank - step % c.ranks + c.ranks) % c.ranks; }

// Sends `from` (rank owner_at(step)'s block) on to rank + 1 and receives rank − 1's, the block of
// owner_at(step + 1), into `to`.
template <class T>
Communicator::Transfer pass_on(Communicator& comm, const Call& c, int step, KvBlock<T>& from, KvBlock<T>& to) {
  return comm.ring_shift(bytes_of(std::as_const(from.data), from.elements(c.key_rows(owner_at(c, step)))),
                         bytes_of(to.data, to.elements(c.key_rows(owner_at(c, step + 1)))));
}

// Calls fn(query rows, local offset, key rows, local offset) for every pair of this rank's query
// ranges and the owner's key ranges that the key ranges do not hide entirely.
template <class F>
void for_each_visible_pair(const Call& c, const attention::Scoring& scoring, int owner, F&& fn) {
  int64_t qa = 0;
  for (const Range& rows : c.query_ranges(c.rank)) {
    int64_t ka = 0;
    for (const Range& keys : c.key_ranges(owner)) {
      if (any_visible(scoring, c, rows, keys)) fn(rows, qa, keys, ka);
      ka += keys.length;
    }
    qa += rows.length;
  }
}

template <class T>
Options<T> block_options(const Options<T>& options, const Call& c, Range rows, Range keys) {
  Options<T> o = options;
  o.whole_call = {rows.start, keys.start, 0, c.query_len, c.key_len, c.query_heads};
  const Range heads{0, c.query_heads};
  o.attend_mask = mask_block(options.attend_mask, c, rows, keys, heads);
  o.additive_mask = mask_block(options.additive_mask, c, rows, keys, heads);
  return o;
}

// The ring's loop: at each step the block of keys and values held (rank owner_at(step)'s) goes on
// to rank + 1 while attend(keys, values, query rows, local offset, key rows, owner) runs on every
// pair of this rank's query rows and the block's key rows that the key ranges leave visible; then
// after_step(step).
template <class T, class Attend, class AfterStep>
void around_the_ring(Communicator& comm, const Call& c, const attention::Scoring& scoring, const Tensor<T>& k, const Tensor<T>& v,
                     Attend&& attend, AfterStep&& after_step) {
  KvBlock<T> current(c), next(c);
  current.fill(c.rank, k, v);
  for (int step = 0; step < c.ranks; ++step) {
    const int owner = owner_at(c, step);
    Communicator::Transfer transfer;
    if (step + 1 < c.ranks) transfer = pass_on(comm, c, step, current, next);
    for_each_visible_pair(c, scoring, owner, [&](Range q_rows, int64_t qa, Range keys, int64_t ka) {
      attend(current.keys(owner).slice(2, ka, keys.length), current.values(owner).slice(2, ka, keys.length), q_rows,
             qa, keys, ka, owner);
      transfer.test();  // lets MPI move a large block along between the calls
    });
    transfer.wait();
    after_step(step);
    std::swap(current, next);
  }
}

}  // namespace

template <class T>
attention::ForwardResult<T> ring_forward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                         const Tensor<T>& v, const Options<T>& options) {
  const int64_t nq = q.size(2);
  Tensor<double> merged({c.batch, c.query_heads, nq, c.v_dim}), lse({c.batch, c.query_heads, nq});
  std::fill(lse.values().begin(), lse.values().end(), -std::numeric_limits<double>::infinity());
  Tensor<T> block_out({c.batch, c.query_heads, nq, c.v_dim});
  Tensor<double> block_lse({c.batch, c.query_heads, nq});
  around_the_ring(
      comm, c, options, k, v,
      [&](View<T> keys, View<T> values, Range q_rows, int64_t qa, Range key_rows, int64_t, int) {
        const int64_t n = q_rows.length;
        const View<T> out = rows(block_out, qa, n);
        const View<double> out_lse = rows(block_lse, qa, n);
        attention::sdpa_forward_into<T>(rows(q, qa, n), keys, values, {out, out_lse, {}},
                                        block_options(options, c, q_rows, key_rows));
        attention::merge_partial<T>(rows(merged, qa, n), rows(lse, qa, n), out, out_lse);
      },
      [](int) {});
  return {cast<T>(merged), std::move(lse), std::nullopt};
}

template <class T>
attention::Gradients<T> ring_backward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                      const Tensor<T>& v, const Tensor<T>& out, const Tensor<double>& lse,
                                      const Tensor<T>& dout, const Options<T>& options) {
  attention::Gradients<T> g{Tensor<T>(q.shape()), Tensor<T>(), Tensor<T>(), std::nullopt};
  KvBlock<T> grads(c), grads_next(c);  // the dK, dV accumulator of the block held, and the next's
  around_the_ring(
      comm, c, options, k, v,
      [&](View<T> keys, View<T> values, Range q_rows, int64_t qa, Range key_rows, int64_t ka, int owner) {
        const int64_t n = q_rows.length;
        attention::sdpa_backward_into<T>(
            rows(q, qa, n), keys, values, rows(out, qa, n), rows(lse, qa, n), rows(dout, qa, n),
            {rows(g.grad_query, qa, n), grads.keys(owner).slice(2, ka, key_rows.length),
             grads.values(owner).slice(2, ka, key_rows.length), /*accumulate=*/true, {}},
            block_options(options, c, q_rows, key_rows));
      },
      [&](int step) {
        // The accumulator goes on with its block; after the last step's hop it is home (with one
        // rank it is home already).
        if (c.ranks == 1) return;
        pass_on(comm, c, step, grads, grads_next).wait();
        std::swap(grads, grads_next);
      });
  g.grad_key = grads.copy(grads.keys(c.rank));
  g.grad_value = grads.copy(grads.values(c.rank));
  return g;
}

#define MHA_INSTANTIATE(T)                                                                                    \
  template attention::ForwardResult<T> ring_forward(Communicator&, const Call&, const Tensor<T>&, const Tensor<T>&, \
                                                    const Tensor<T>&, const Options<T>&);                           \
  template attention::Gradients<T> ring_backward(Communicator&, const Call&, const Tensor<T>&, const Tensor<T>&,    \
                                                 const Tensor<T>&, const Tensor<T>&, const Tensor<double>&,         \
                                                 const Tensor<T>&, const Options<T>&);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
#undef MHA_INSTANTIATE

}  // namespace mha::distributed::detail
