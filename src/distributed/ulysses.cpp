// Context-parallel attention by all-to-all over heads (Ulysses): each rank gets the whole sequence
// for its share of the heads (docs/distributed.md).
#include "call.h"

#include <cstring>
#include <vector>

namespace mha::distributed {

Range ulysses_heads(int64_t kv_heads, int rank, int ranks) {
  check(ranks >= 1 && rank >= 0 && rank < ranks, "ulysses_heads: rank: expected 0 to ", ranks - 1, ", got ", rank);
  check(kv_heads >= 0, "ulysses_heads: kv_heads: expected >= 0, got ", kv_heads);
  const int64_t start = kv_heads * rank / ranks, end = kv_heads * (rank + 1) / ranks;
  return {start, end - start};
}

namespace detail {
namespace {

using attention::Options;

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
  o.whole_call = {0, 0, heads.start, c.query_len, c.key_len, c.query_heads};
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

}  // namespace

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
                                    : attention::Gradients<T>{hq, hk, hv, std::nullopt};
  attention::Gradients<T> r{Tensor<T>(q.shape()), Tensor<T>(k.shape()), Tensor<T>(v.shape()), std::nullopt};
  to_sequence(comm, c,
              {{g.grad_query.data(), false, false, c.qk_dim, sizeof(T)},
               {g.grad_key.data(), true, true, c.qk_dim, sizeof(T)},
               {g.grad_value.data(), true, true, c.v_dim, sizeof(T)}},
              {r.grad_query.data(), r.grad_key.data(), r.grad_value.data()});
  return r;
}

#define MHA_INSTANTIATE(T)                                                                                       \
  template attention::ForwardResult<T> ulysses_forward(Communicator&, const Call&, const Tensor<T>&,             \
                                                       const Tensor<T>&, const Tensor<T>&, const Options<T>&);   \
  template attention::Gradients<T> ulysses_backward(Communicator&, const Call&, const Tensor<T>&, const Tensor<T>&, \
                                                    const Tensor<T>&, const Tensor<T>&, const Tensor<double>&,   \
                                                    const Tensor<T>&, const Options<T>&);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
#undef MHA_INSTANTIATE

}  // namespace detail
}  // namespace mha::distributed
