// Context-parallel attention: ring and all-to-all (Ulysses), on the attention core's public API
// (Options::positions, GradientOutputs::accumulate, merge_partial). Design and cost model:
// docs/distributed.md.
#include "mha/distributed/context_parallel.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mha::distributed {
namespace {

using attention::Causal;
using attention::Options;

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

void check_rank4(const Shape& s, const char* name, const char* layout) {
  check(s.size() == 4, name, ": expected a 4-D tensor ", layout, ", got shape ", s);
}

template <class M>
void check_mask(const View<const M>& mask, const Call& c, const char* name) {
  if (!mask.defined()) return;
  const Shape full{c.batch, c.query_heads, c.query_len, c.key_len};
  bool ok = mask.dim() >= 1 && mask.dim() <= 4;
  for (int64_t a = 0; ok && a < mask.dim(); ++a) {
    const int64_t want = full[static_cast<size_t>(4 - mask.dim() + a)];
    ok = mask.size(a) == want || mask.size(a) == 1;
  }
  check(ok, "options.", name, ": expected a mask broadcastable to the whole call's (B, Hq, L, S) = ", full, ", got ",
        mask.shape());
}

// Checks this rank's arguments, then that every rank makes the same call (one all_gather of the
// call's description; a difference is an error on every rank, so none waits for the others).
template <class T>
Call make_call(Communicator& comm, Scheme scheme, const char* function, const Tensor<T>& q, const Tensor<T>& k,
               const Tensor<T>& v, const Sequence& seq, const Options<T>& options) {
  check_rank4(q.shape(), "query", "(B, Hq, Nq, Dqk)");
  check_rank4(k.shape(), "key", "(B, Hkv, Nk, Dqk)");
  check_rank4(v.shape(), "value", "(B, Hkv, Nk, Dv)");
  Call c;
  c.batch = q.size(0);
  c.query_heads = q.size(1);
  c.kv_heads = k.size(1);
  c.qk_dim = q.size(3);
  c.v_dim = v.size(3);
  c.query_len = seq.query_len;
  c.key_len = seq.key_len;
  c.layout = seq.layout;
  c.rank = comm.rank();
  c.ranks = comm.size();
  check(c.query_len >= 0 && c.key_len >= 0, "sequence: expected lengths >= 0, got ", c.query_len, " queries and ",
        c.key_len, " keys");
  check(c.kv_heads > 0 && c.query_heads % c.kv_heads == 0, "key: number of key/value heads must divide the ",
        c.query_heads, " query heads (grouped-query attention), got ", c.kv_heads);
  const int64_t nq = c.query_rows(c.rank), nk = c.key_rows(c.rank);
  check(q.size(2) == nq, "query: expected rank ", c.rank, "'s ", nq, " of the ", c.query_len, " query rows, got ",
        q.shape());
  check_shape(k.shape(), {c.batch, c.kv_heads, nk, c.qk_dim}, "key");
  check_shape(v.shape(), {c.batch, c.kv_heads, nk, c.v_dim}, "value");
  check(!options.need_weights, "options.need_weights: context-parallel attention does not return the weights");
  const attention::Positions& pos = options.positions;
  check(pos.query_offset == 0 && pos.key_offset == 0 && pos.head_offset == 0 && pos.query_len == 0 &&
            pos.key_len == 0 && pos.heads == 0,
        "options.positions: expected the default (context-parallel attention sets the positions)");
  check_mask(options.attend_mask, c, "attend_mask");
  check_mask(options.additive_mask, c, "additive_mask");

  const char* fields[] = {"scheme", "layout",    "batch",     "query heads",  "kv heads", "query head size",
                          "value head size", "query length", "key length", "causal", "dropout_p",
                          "dropout_seed", "scale", "attend_mask", "additive_mask", "dtype"};
  const int64_t mine[] = {static_cast<int64_t>(scheme), static_cast<int64_t>(seq.layout), c.batch, c.query_heads,
                          c.kv_heads, c.qk_dim, c.v_dim, c.query_len, c.key_len,
                          static_cast<int64_t>(options.causal), std::bit_cast<int64_t>(options.dropout_p),
                          static_cast<int64_t>(options.dropout_seed),
                          std::bit_cast<int64_t>(options.scale.value_or(std::numeric_limits<double>::quiet_NaN())),
                          options.attend_mask.defined() ? 1 : 0, options.additive_mask.defined() ? 1 : 0,
                          static_cast<int64_t>(sizeof(T))};
  constexpr size_t n = std::size(mine);
  const std::vector<int64_t> all = comm.all_gather(std::span<const int64_t>(mine, n));
  for (int r = 1; r < c.ranks; ++r)
    for (size_t f = 0; f < n; ++f)
      check(all[static_cast<size_t>(r) * n + f] == all[f], function, ": every rank must make the same call, but rank ",
            r, "'s ", fields[f], " (", all[static_cast<size_t>(r) * n + f], ") differs from rank 0's (", all[f], ")");
  return c;
}

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

// Whether a causal mask leaves any key of `keys` visible to a query of `rows` (whole-call rows).
bool any_visible(Causal causal, const Call& c, Range rows, Range keys) {
  if (rows.length == 0 || keys.length == 0) return false;
  const int64_t last = rows.start + rows.length;  // keys below last (+ S − L) are visible to the last row
  if (causal == Causal::top_left) return keys.start < last;
  if (causal == Causal::bottom_right) return keys.start < last + (c.key_len - c.query_len);
  return true;
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

// ---------------------------------------------------------------------------------------------
// Ring

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
// ranges and the owner's key ranges that a causal mask does not hide entirely.
template <class F>
void for_each_visible_pair(const Call& c, Causal causal, int owner, F&& fn) {
  int64_t qa = 0;
  for (const Range& rows : c.query_ranges(c.rank)) {
    int64_t ka = 0;
    for (const Range& keys : c.key_ranges(owner)) {
      if (any_visible(causal, c, rows, keys)) fn(rows, qa, keys, ka);
      ka += keys.length;
    }
    qa += rows.length;
  }
}

template <class T>
Options<T> block_options(const Options<T>& options, const Call& c, Range rows, Range keys) {
  Options<T> o = options;
  o.positions = {rows.start, keys.start, 0, c.query_len, c.key_len, c.query_heads};
  const Range heads{0, c.query_heads};
  o.attend_mask = mask_block(options.attend_mask, c, rows, keys, heads);
  o.additive_mask = mask_block(options.additive_mask, c, rows, keys, heads);
  return o;
}

// The ring's loop: at each step the block of keys and values held (rank owner_at(step)'s) goes on
// to rank + 1 while attend(keys, values, query rows, local offset, key rows, owner) runs on every
// pair of this rank's query rows and the block's key rows that causality leaves visible; then
// after_step(step).
template <class T, class Attend, class AfterStep>
void around_the_ring(Communicator& comm, const Call& c, Causal causal, const Tensor<T>& k, const Tensor<T>& v,
                     Attend&& attend, AfterStep&& after_step) {
  KvBlock<T> current(c), next(c);
  current.fill(c.rank, k, v);
  for (int step = 0; step < c.ranks; ++step) {
    const int owner = owner_at(c, step);
    Communicator::Transfer transfer;
    if (step + 1 < c.ranks) transfer = pass_on(comm, c, step, current, next);
    for_each_visible_pair(c, causal, owner, [&](Range q_rows, int64_t qa, Range keys, int64_t ka) {
      attend(current.keys(owner).slice(2, ka, keys.length), current.values(owner).slice(2, ka, keys.length), q_rows,
             qa, keys, ka, owner);
      transfer.test();  // lets MPI move a large block along between the calls
    });
    transfer.wait();
    after_step(step);
    std::swap(current, next);
  }
}

template <class T>
attention::ForwardResult<T> ring_forward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                         const Tensor<T>& v, const Options<T>& options) {
  const int64_t nq = q.size(2);
  Tensor<double> merged({c.batch, c.query_heads, nq, c.v_dim}), lse({c.batch, c.query_heads, nq});
  std::fill(lse.values().begin(), lse.values().end(), -std::numeric_limits<double>::infinity());
  Tensor<T> block_out({c.batch, c.query_heads, nq, c.v_dim});
  Tensor<double> block_lse({c.batch, c.query_heads, nq});
  around_the_ring(
      comm, c, options.causal, k, v,
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
  attention::Gradients<T> g{Tensor<T>(q.shape()), Tensor<T>(), Tensor<T>()};
  KvBlock<T> grads(c), grads_next(c);  // the dK, dV accumulator of the block held, and the next's
  around_the_ring(
      comm, c, options.causal, k, v,
      [&](View<T> keys, View<T> values, Range q_rows, int64_t qa, Range key_rows, int64_t ka, int owner) {
        const int64_t n = q_rows.length;
        attention::sdpa_backward_into<T>(
            rows(q, qa, n), keys, values, rows(out, qa, n), rows(lse, qa, n), rows(dout, qa, n),
            {rows(g.grad_query, qa, n), grads.keys(owner).slice(2, ka, key_rows.length),
             grads.values(owner).slice(2, ka, key_rows.length), /*accumulate=*/true},
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

// ---------------------------------------------------------------------------------------------
// Ulysses

// Appends heads [heads.start, +heads.length) of t, (B, H, N) rows of X bytes, rows `rows` of
// each, to `buffer`.
void pack(std::vector<std::byte>& buffer, const std::byte* t, const Shape& shape, Range heads,
          const std::vector<Range>& rows) {
  const int64_t H = shape[1], N = shape[2], X = shape[3];
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t h = heads.start; h < heads.start + heads.length; ++h)
      for (const Range& r : rows) {
        if (r.length == 0) continue;  // an empty tensor's data may be null
        const std::byte* src = t + ((b * H + h) * N + r.start) * X;
        buffer.insert(buffer.end(), src, src + r.length * X);
      }
}

// pack's inverse: reads what pack wrote into t's heads and rows; returns the end of what it read.
const std::byte* unpack(const std::byte* in, std::byte* t, const Shape& shape, Range heads,
                        const std::vector<Range>& rows) {
  const int64_t H = shape[1], N = shape[2], X = shape[3];
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t h = heads.start; h < heads.start + heads.length; ++h)
      for (const Range& r : rows) {
        if (r.length == 0) continue;  // nothing received: `in` may be null
        std::memcpy(t + ((b * H + h) * N + r.start) * X, in, static_cast<size_t>(r.length * X));
        in += r.length * X;
      }
  return in;
}

// The Ulysses exchange: every rank packs, for each destination in turn, what `send(j, buffer)`
// appends; receives each source's part and hands it to `receive(i, bytes)`.
template <class Send, class Receive>
void exchange(Communicator& comm, Send&& send, const std::vector<int64_t>& receive_counts, Receive&& receive) {
  std::vector<std::byte> out;
  std::vector<int64_t> send_counts;
  for (int j = 0; j < comm.size(); ++j) {
    const size_t before = out.size();
    send(j, out);
    send_counts.push_back(static_cast<int64_t>(out.size() - before));
  }
  int64_t total = 0;
  for (int64_t n : receive_counts) total += n;
  std::vector<std::byte> in(static_cast<size_t>(total));
  comm.all_to_all(out, send_counts, in, receive_counts);
  const std::byte* at = in.data();
  for (int i = 0; i < comm.size(); ++i) {
    const std::byte* end = receive(i, at);
    check(end == at + receive_counts[static_cast<size_t>(i)], "ulysses: internal error: rank ", i,
          "'s part has an unexpected size");
    at = end;
  }
}

std::vector<Range> all_rows(int64_t n) { return {{0, n}}; }

// This rank's heads for ulysses: kv heads and query heads.
struct Heads {
  Range kv, query;
};
Heads heads_of(const Call& c, int rank) {
  const Range kv = ulysses_heads(c.kv_heads, rank, c.ranks);
  return {kv, {kv.start * c.group(), kv.length * c.group()}};
}

template <class T>
Options<T> head_options(const Options<T>& options, const Call& c, Range heads) {
  Options<T> o = options;
  o.positions = {0, 0, heads.start, c.query_len, c.key_len, c.query_heads};
  const Range rows{0, c.query_len}, keys{0, c.key_len};
  o.attend_mask = mask_block(options.attend_mask, c, rows, keys, heads);
  o.additive_mask = mask_block(options.additive_mask, c, rows, keys, heads);
  return o;
}

// One (B, heads, rows, width) tensor that Ulysses exchanges: its memory, whether its rows are key
// rows (else query rows) and its heads kv heads (else query heads), and its row's size.
struct Operand {
  const void* data;
  bool keys;
  bool kv_heads;
  int64_t width;   // elements per row
  size_t element;  // bytes per element
};

// Gathers each operand's whole sequence for this rank's heads; returns them as byte vectors of
// (B, heads, L or S, width).
std::vector<std::vector<std::byte>> to_heads(Communicator& comm, const Call& c, const std::vector<Operand>& ops) {
  const Heads mine = heads_of(c, c.rank);
  auto rows_of = [&](const Operand& o, int r) { return o.keys ? c.key_rows(r) : c.query_rows(r); };
  auto heads = [&](const Operand& o, const Heads& h) { return o.kv_heads ? h.kv : h.query; };
  std::vector<int64_t> receive_counts;
  for (int i = 0; i < c.ranks; ++i) {
    int64_t n = 0;
    for (const Operand& o : ops)
      n += static_cast<int64_t>(o.element) * c.batch * heads(o, mine).length * rows_of(o, i) * o.width;
    receive_counts.push_back(n);
  }
  std::vector<std::vector<std::byte>> whole;
  for (const Operand& o : ops)
    whole.emplace_back(o.element * static_cast<size_t>(c.batch * heads(o, mine).length *
                                                       (o.keys ? c.key_len : c.query_len) * o.width));
  exchange(
      comm,
      [&](int j, std::vector<std::byte>& out) {
        for (const Operand& o : ops) {
          const int64_t H = o.kv_heads ? c.kv_heads : c.query_heads;
          const auto* bytes = static_cast<const std::byte*>(o.data);
          // Byte-wise pack: rows of width·element bytes.
          const Shape s{c.batch, H, rows_of(o, c.rank), o.width * static_cast<int64_t>(o.element)};
          pack(out, bytes, s, heads(o, heads_of(c, j)), all_rows(rows_of(o, c.rank)));
        }
      },
      receive_counts,
      [&](int i, const std::byte* in) {
        for (size_t k = 0; k < ops.size(); ++k) {
          const Operand& o = ops[k];
          const int64_t N = o.keys ? c.key_len : c.query_len;
          const Shape s{c.batch, heads(o, mine).length, N, o.width * static_cast<int64_t>(o.element)};
          in = unpack(in, whole[k].data(), s, {0, heads(o, mine).length},
                      o.keys ? c.key_ranges(i) : c.query_ranges(i));
        }
        return in;
      });
  return whole;
}

// The way back: each operand (B, this rank's heads, L or S, width) returned to every rank as its
// rows, into `local` (B, all heads, its rows, width).
void to_sequence(Communicator& comm, const Call& c, const std::vector<Operand>& ops, const std::vector<void*>& local) {
  const Heads mine = heads_of(c, c.rank);
  auto heads = [&](const Operand& o, const Heads& h) { return o.kv_heads ? h.kv : h.query; };
  auto rows_of = [&](const Operand& o, int r) { return o.keys ? c.key_rows(r) : c.query_rows(r); };
  std::vector<int64_t> receive_counts;
  for (int j = 0; j < c.ranks; ++j) {
    int64_t n = 0;
    for (const Operand& o : ops)
      n += static_cast<int64_t>(o.element) * c.batch * heads(o, heads_of(c, j)).length * rows_of(o, c.rank) * o.width;
    receive_counts.push_back(n);
  }
  exchange(
      comm,
      [&](int i, std::vector<std::byte>& out) {
        for (const Operand& o : ops) {
          const int64_t N = o.keys ? c.key_len : c.query_len;
          const Shape s{c.batch, heads(o, mine).length, N, o.width * static_cast<int64_t>(o.element)};
          pack(out, static_cast<const std::byte*>(o.data), s, {0, heads(o, mine).length},
               o.keys ? c.key_ranges(i) : c.query_ranges(i));
        }
      },
      receive_counts,
      [&](int j, const std::byte* in) {
        for (size_t k = 0; k < ops.size(); ++k) {
          const Operand& o = ops[k];
          const int64_t H = o.kv_heads ? c.kv_heads : c.query_heads;
          const Shape s{c.batch, H, rows_of(o, c.rank), o.width * static_cast<int64_t>(o.element)};
          in = unpack(in, static_cast<std::byte*>(local[k]), s, heads(o, heads_of(c, j)), all_rows(rows_of(o, c.rank)));
        }
        return in;
      });
}

template <class T>
Tensor<T> as_tensor(const std::vector<std::byte>& bytes, const Shape& shape) {
  Tensor<T> t(shape);
  if (t.numel() > 0) std::memcpy(t.data(), bytes.data(), bytes.size());
  return t;
}

template <class T>
attention::ForwardResult<T> ulysses_forward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                            const Tensor<T>& v, const Options<T>& options) {
  const Heads mine = heads_of(c, c.rank);
  const auto whole = to_heads(comm, c,
                              {{q.data(), false, false, c.qk_dim, sizeof(T)},
                               {k.data(), true, true, c.qk_dim, sizeof(T)},
                               {v.data(), true, true, c.v_dim, sizeof(T)}});
  const Tensor<T> hq = as_tensor<T>(whole[0], {c.batch, mine.query.length, c.query_len, c.qk_dim});
  const Tensor<T> hk = as_tensor<T>(whole[1], {c.batch, mine.kv.length, c.key_len, c.qk_dim});
  const Tensor<T> hv = as_tensor<T>(whole[2], {c.batch, mine.kv.length, c.key_len, c.v_dim});
  // A rank with no heads (fewer kv heads than ranks) computes nothing but still exchanges.
  const auto r = mine.kv.length > 0 ? attention::sdpa_forward(hq, hk, hv, head_options(options, c, mine.query))
                                    : attention::ForwardResult<T>{hq, Tensor<double>({c.batch, 0, c.query_len}), {}};
  attention::ForwardResult<T> out{Tensor<T>({c.batch, c.query_heads, q.size(2), c.v_dim}),
                                  Tensor<double>({c.batch, c.query_heads, q.size(2)}), std::nullopt};
  to_sequence(comm, c,
              {{r.output.data(), false, false, c.v_dim, sizeof(T)}, {r.logsumexp.data(), false, false, 1, sizeof(double)}},
              {out.output.data(), out.logsumexp.data()});
  return out;
}

template <class T>
attention::Gradients<T> ulysses_backward(Communicator& comm, const Call& c, const Tensor<T>& q, const Tensor<T>& k,
                                         const Tensor<T>& v, const Tensor<T>& out, const Tensor<double>& lse,
                                         const Tensor<T>& dout, const Options<T>& options) {
  const Heads mine = heads_of(c, c.rank);
  const auto whole = to_heads(comm, c,
                              {{q.data(), false, false, c.qk_dim, sizeof(T)},
                               {k.data(), true, true, c.qk_dim, sizeof(T)},
                               {v.data(), true, true, c.v_dim, sizeof(T)},
                               {out.data(), false, false, c.v_dim, sizeof(T)},
                               {lse.data(), false, false, 1, sizeof(double)},
                               {dout.data(), false, false, c.v_dim, sizeof(T)}});
  const int64_t hq_n = mine.query.length, hkv_n = mine.kv.length;
  const Tensor<T> hq = as_tensor<T>(whole[0], {c.batch, hq_n, c.query_len, c.qk_dim});
  const Tensor<T> hk = as_tensor<T>(whole[1], {c.batch, hkv_n, c.key_len, c.qk_dim});
  const Tensor<T> hv = as_tensor<T>(whole[2], {c.batch, hkv_n, c.key_len, c.v_dim});
  const Tensor<T> ho = as_tensor<T>(whole[3], {c.batch, hq_n, c.query_len, c.v_dim});
  const Tensor<double> hl = as_tensor<double>(whole[4], {c.batch, hq_n, c.query_len});
  const Tensor<T> hd = as_tensor<T>(whole[5], {c.batch, hq_n, c.query_len, c.v_dim});
  const auto g = mine.kv.length > 0 ? attention::sdpa_backward(hq, hk, hv, ho, hl, hd, head_options(options, c, mine.query))
                                    : attention::Gradients<T>{hq, hk, hv};
  attention::Gradients<T> r{Tensor<T>(q.shape()), Tensor<T>(k.shape()), Tensor<T>(v.shape())};
  to_sequence(comm, c,
              {{g.grad_query.data(), false, false, c.qk_dim, sizeof(T)},
               {g.grad_key.data(), true, true, c.qk_dim, sizeof(T)},
               {g.grad_value.data(), true, true, c.v_dim, sizeof(T)}},
              {r.grad_query.data(), r.grad_key.data(), r.grad_value.data()});
  return r;
}

// ---------------------------------------------------------------------------------------------
// The module's core

// A contiguous copy of a (B, H, N, X) view whose rows are contiguous.
template <class T>
Tensor<T> contiguous_copy(View<const T> v) {
  Tensor<T> t(v.shape());
  T* out = t.data();
  for (int64_t b = 0; b < v.size(0); ++b)
    for (int64_t h = 0; h < v.size(1); ++h)
      for (int64_t i = 0; i < v.size(2); ++i, out += v.size(3))
        std::copy_n(v.data() + b * v.stride(0) + h * v.stride(1) + i * v.stride(2), v.size(3), out);
  return t;
}

// t into a view of its shape with contiguous rows.
template <class T>
void write_into(const View<T>& out, const Tensor<T>& t) {
  const T* in = t.data();
  for (int64_t b = 0; b < out.size(0); ++b)
    for (int64_t h = 0; h < out.size(1); ++h)
      for (int64_t i = 0; i < out.size(2); ++i, in += out.size(3))
        std::copy_n(in, out.size(3), out.data() + b * out.stride(0) + h * out.stride(1) + i * out.stride(2));
}

// The whole (B, H, length, X) from every rank's rows of it (all-gather, then unshard).
template <class T>
Tensor<T> all_rows(Communicator& comm, const Tensor<T>& local, int64_t length, Layout layout) {
  const auto parts = comm.all_gather_bytes(std::as_bytes(std::span<const T>(local.data(), static_cast<size_t>(local.numel()))));
  std::vector<Tensor<T>> shards;
  for (int r = 0; r < comm.size(); ++r) {
    Shape shape = local.shape();
    shape[2] = shard_length(length, layout, r, comm.size());
    Tensor<T> t(shape);
    const auto& bytes = parts[static_cast<size_t>(r)];
    check(bytes.size() == sizeof(T) * static_cast<size_t>(t.numel()), "context_parallel_core: rank ", r,
          " sent rows of another shape");
    if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
    shards.push_back(std::move(t));
  }
  return unshard(shards, 2, layout);
}

}  // namespace

template <class T>
nn::AttentionCore<T> context_parallel_core(Communicator& comm, Scheme scheme, Layout layout) {
  Communicator* c = &comm;
  auto local = [c, layout](View<const T> whole) {
    return shard(View<const T>(contiguous_copy(whole)), 2, layout, c->rank(), c->size());
  };
  auto lse_shape = [](const Tensor<double>& t) { return Shape{t.size(0), t.size(1), t.size(2), 1}; };
  nn::AttentionCore<T> core;
  core.forward = [=](View<const T> q, View<const T> k, View<const T> v, const attention::ForwardOutputs<T>& out,
                     const Options<T>& options) {
    const Sequence seq{q.size(2), k.size(2), layout};
    auto r = context_parallel_forward(*c, scheme, local(q), local(k), local(v), seq, options);
    write_into(out.output, all_rows(*c, r.output, seq.query_len, layout));
    const Shape shape = lse_shape(r.logsumexp);
    const Tensor<double> lse = all_rows(*c, std::move(r.logsumexp).reshape(shape), seq.query_len, layout);
    for (int64_t i = 0; i < lse.numel(); ++i) {  // (B, H, L) at the output view's strides
      const int64_t b = i / (lse.size(1) * lse.size(2)), h = i / lse.size(2) % lse.size(1), row = i % lse.size(2);
      out.logsumexp.data()[b * out.logsumexp.stride(0) + h * out.logsumexp.stride(1) + row * out.logsumexp.stride(2)] =
          lse[i];
    }
  };
  core.backward = [=](View<const T> q, View<const T> k, View<const T> v, View<const T> o, View<const double> lse,
                      View<const T> dout, const attention::GradientOutputs<T>& grads, const Options<T>& options) {
    check(!grads.accumulate, "context_parallel_core: expected gradients to overwrite (accumulate is not supported)");
    const Sequence seq{q.size(2), k.size(2), layout};
    const Tensor<double> lse4 = contiguous_copy(View<const double>(lse.data(), {lse.size(0), lse.size(1), lse.size(2), 1},
                                                                   {lse.stride(0), lse.stride(1), lse.stride(2), 1}));
    Tensor<double> lse_local = shard(View<const double>(lse4), 2, layout, c->rank(), c->size());
    lse_local = std::move(lse_local).reshape({lse_local.size(0), lse_local.size(1), lse_local.size(2)});
    const auto g = context_parallel_backward(*c, scheme, local(q), local(k), local(v), local(o), lse_local, local(dout),
                                             seq, options);
    write_into(grads.grad_query, all_rows(*c, g.grad_query, seq.query_len, layout));
    write_into(grads.grad_key, all_rows(*c, g.grad_key, seq.key_len, layout));
    write_into(grads.grad_value, all_rows(*c, g.grad_value, seq.key_len, layout));
  };
  return core;
}

Range ulysses_heads(int64_t kv_heads, int rank, int ranks) {
  check(ranks >= 1 && rank >= 0 && rank < ranks, "ulysses_heads: rank: expected 0 to ", ranks - 1, ", got ", rank);
  check(kv_heads >= 0, "ulysses_heads: kv_heads: expected >= 0, got ", kv_heads);
  const int64_t start = kv_heads * rank / ranks, end = kv_heads * (rank + 1) / ranks;
  return {start, end - start};
}

template <class T>
attention::ForwardResult<T> context_parallel_forward(Communicator& comm, Scheme scheme, const Tensor<T>& query,
                                                     const Tensor<T>& key, const Tensor<T>& value,
                                                     const Sequence& sequence, const Options<T>& options) {
  const Call c = make_call(comm, scheme, "context_parallel_forward", query, key, value, sequence, options);
  if (scheme == Scheme::ulysses) return ulysses_forward(comm, c, query, key, value, options);
  return ring_forward(comm, c, query, key, value, options);
}

template <class T>
attention::Gradients<T> context_parallel_backward(Communicator& comm, Scheme scheme, const Tensor<T>& query,
                                                  const Tensor<T>& key, const Tensor<T>& value,
                                                  const Tensor<T>& output, const Tensor<double>& logsumexp,
                                                  const Tensor<T>& grad_output, const Sequence& sequence,
                                                  const Options<T>& options) {
  const Call c = make_call(comm, scheme, "context_parallel_backward", query, key, value, sequence, options);
  const Shape out_shape{c.batch, c.query_heads, query.size(2), c.v_dim};
  check_shape(output.shape(), out_shape, "output");
  check_shape(grad_output.shape(), out_shape, "grad_output");
  check_shape(logsumexp.shape(), {c.batch, c.query_heads, query.size(2)}, "logsumexp");
  if (scheme == Scheme::ulysses) return ulysses_backward(comm, c, query, key, value, output, logsumexp, grad_output, options);
  return ring_backward(comm, c, query, key, value, output, logsumexp, grad_output, options);
}

#define MHA_INSTANTIATE(T)                                                                                          \
  template attention::ForwardResult<T> context_parallel_forward(Communicator&, Scheme, const Tensor<T>&,            \
                                                                const Tensor<T>&, const Tensor<T>&, const Sequence&, \
                                                                const Options<T>&);                                 \
  template attention::Gradients<T> context_parallel_backward(Communicator&, Scheme, const Tensor<T>&,               \
                                                             const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,  \
                                                             const Tensor<double>&, const Tensor<T>&,               \
                                                             const Sequence&, const Options<T>&);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
#undef MHA_INSTANTIATE
template nn::AttentionCore<float> context_parallel_core(Communicator&, Scheme, Layout);
template nn::AttentionCore<double> context_parallel_core(Communicator&, Scheme, Layout);

}  // namespace mha::distributed
