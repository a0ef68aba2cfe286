// paged_forward_into (mha/attention/attention.h): a paged call checked, its sequences of few
// queries run together on decode over the pages, its longer ones on cpu_flash (or any on the
// reference) over a contiguous copy of the sequence's keys and values, one kv head at a time.
#include <algorithm>
#include <cstdint>
#include <map>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "decode/decode.h"
#include "mha/attention/attention.h"
#include "mha/core/int8.h"
#include "problem.h"

namespace mha::attention {
namespace {

using detail::Rows;

// Element i of a (N) view of int64 (cu_seqlens, lengths).
int64_t at(const View<const int64_t>& v, int64_t i) { return v.data()[i * v.stride(0)]; }

// A query row as the call computes with it: as given, or, against int8 keys and values, rounded
// to int8 as they are (mha/core/int8.h: its scale times its int8 numbers, in float), so that the
// decode kernels may multiply int8 by int8 and every path computes the same thing.
template <class Kv>
void query_row(const float* x, int64_t n, float* out) {
  if constexpr (std::is_same_v<Kv, int8_t>) {
    thread_local std::vector<int8_t> q;
    q.resize(static_cast<size_t>(n));
    const float scale = quantize_int8(x, static_cast<size_t>(n), q.data());
    for (int64_t e = 0; e < n; ++e) out[e] = scale * static_cast<float>(q[static_cast<size_t>(e)]);
  } else {
    std::copy_n(x, n, out);
  }
}

// A paged call's sizes and sequences, checked.
struct PagedCall {
  int64_t N = 0, T = 0, Hq = 0, Hkv = 0, P = 0, Dqk = 0, Dv = 0, pages = 0, blocks = 0;
  std::vector<int64_t> q0, q_len, k_len, start;  // per sequence: first query, queries, tokens, first real token

  int64_t group() const { return Hq / Hkv; }
  // Page of token j of sequence s.
  template <class Kv>
  int32_t page(const PagedKv<Kv>& kv, int64_t s, int64_t j) const {
    return kv.block_table.data()[s * kv.block_table.stride(0) + (j / P) * kv.block_table.stride(1)];
  }
};

template <class Kv>
PagedCall check_paged(const View<const float>& query, const PagedKv<Kv>& kv, const ForwardOutputs<float>& out,
                      const Options<float>& o) {
  using detail::check_rank4;
  check_rank4(query.shape(), "query", "(1, Hq, T, Dqk)");
  check(query.size(0) == 1, "query: expected (1, Hq, T, Dqk), the sequences' queries back to back, got shape ",
        query.shape());
  check_rank4(kv.key_pages.shape(), "key_pages", "(pages, Hkv, P, Dqk)");
  check_rank4(kv.value_pages.shape(), "value_pages", "(pages, Hkv, P, Dv)");
  detail::rows_of(kv.key_pages, "key_pages", "(pages, Hkv, P, Dqk)");
  detail::rows_of(kv.value_pages, "value_pages", "(pages, Hkv, P, Dv)");
  detail::rows_of(query, "query", "(1, Hq, T, Dqk)");
  PagedCall c;
  c.pages = kv.key_pages.size(0);
  c.Hkv = kv.key_pages.size(1);
  c.P = kv.key_pages.size(2);
  c.Dqk = kv.key_pages.size(3);
  c.Dv = kv.value_pages.size(3);
  c.Hq = query.size(1);
  c.T = query.size(2);
  check(kv.value_pages.size(0) == c.pages && kv.value_pages.size(1) == c.Hkv && kv.value_pages.size(2) == c.P,
        "value_pages: expected (", c.pages, ", ", c.Hkv, ", ", c.P, ", Dv) as key_pages ", kv.key_pages.shape(),
        ", got shape ", kv.value_pages.shape());
  check(c.P >= 1 && c.Hkv >= 1, "key_pages: expected at least one kv head and a page size >= 1, got shape ",
        kv.key_pages.shape());
  check(query.size(3) == c.Dqk, "query: expected Dqk = ", c.Dqk, " (key_pages' last dimension), got shape ",
        query.shape());
  check(c.Hq % c.Hkv == 0, "query: expected a number of heads that is a multiple of the ", c.Hkv,
        " kv heads (key_pages' dimension 1), got shape ", query.shape());
  check(kv.block_table.dim() == 2, "block_table: expected a 2-D tensor (N sequences, blocks), got shape ",
        kv.block_table.shape());
  c.N = kv.block_table.size(0);
  c.blocks = kv.block_table.size(1);
  constexpr bool quantized = std::is_same_v<Kv, int8_t>;
  for (const auto& [name, scales] : {std::pair<const char*, const View<const float>*>{"key_scales", &kv.key_scales},
                                     {"value_scales", &kv.value_scales}}) {
    if (quantized) {
      check(scales->defined() && scales->shape() == Shape{c.pages, c.Hkv, c.P}, name, ": expected (pages, Hkv, P) = (",
            c.pages, ", ", c.Hkv, ", ", c.P, ") for int8 pages, got ",
            scales->defined() ? to_string(scales->shape()) : std::string("none"));
    } else {
      check(!scales->defined(), name, ": expected none (only int8 pages have scales), got shape ", scales->shape());
    }
  }

  // The options a paged call takes (attention.h).
  check(o.causal != Causal::top_left,
        "options.causal: expected none or bottom_right (a sequence's queries are its last tokens), got top_left");
  check(o.dropout_p == 0.0, "options.dropout_p: expected 0 (a paged call has no dropout), got ", o.dropout_p);
  check(o.whole_call == WholeCall{}, "options.whole_call: expected the default (a paged call is a whole call)");
  check(!o.need_weights, "options.need_weights: expected false (a paged call returns no weights)");
  for (const auto& [name, given] : {std::pair<const char*, bool>{"attend_mask", o.attend_mask.defined()},
                                    {"additive_mask", o.additive_mask.defined()},
                                    {"query_lengths", o.query_lengths.defined()},
                                    {"cu_seqlens_k", o.cu_seqlens_k.defined()}})
    check(!given, "options.", name, ": expected none in a paged call (cu_seqlens_q and key_lengths say the sequences)");
  check(!o.key_starts.defined() || o.key_starts.shape() == Shape{c.N}, "options.key_starts: expected (", c.N,
        "): each sequence's first real token (left padding), or none, got shape ", o.key_starts.shape());
  check(o.cu_seqlens_q.defined() && o.cu_seqlens_q.shape() == Shape{c.N + 1}, "options.cu_seqlens_q: expected (",
        c.N + 1, "): where each of block_table's ", c.N, " sequences' queries start, and T, got ",
        o.cu_seqlens_q.defined() ? to_string(o.cu_seqlens_q.shape()) : std::string("none"));
  check(o.key_lengths.defined() && o.key_lengths.shape() == Shape{c.N}, "options.key_lengths: expected (", c.N,
        "): each of block_table's sequences' tokens, got ",
        o.key_lengths.defined() ? to_string(o.key_lengths.shape()) : std::string("none"));
  check(at(o.cu_seqlens_q, 0) == 0 && at(o.cu_seqlens_q, c.N) == c.T, "options.cu_seqlens_q: expected to start at 0 ",
        "and end at T = ", c.T, " (query's dimension 2), got ", at(o.cu_seqlens_q, 0), " and ", at(o.cu_seqlens_q, c.N));
  for (int64_t s = 0; s < c.N; ++s) {
    const int64_t q0 = at(o.cu_seqlens_q, s), q1 = at(o.cu_seqlens_q, s + 1), k = at(o.key_lengths, s);
    check(q1 >= q0, "options.cu_seqlens_q: expected non-decreasing values, got ", q0, " then ", q1, " at ", s);
    check(k >= q1 - q0 && k <= c.blocks * c.P, "options.key_lengths[", s, "]: expected ", q1 - q0, " to ",
          c.blocks * c.P, " (its queries are its last tokens; block_table holds ", c.blocks, " pages of ", c.P,
          "), got ", k);
    for (int64_t j = 0; j < k; j += c.P) {
      const int32_t page = c.page(kv, s, j);
      check(page >= 0 && page < c.pages, "block_table[", s, ", ", j / c.P, "]: expected a page 0 to ", c.pages - 1,
            " (sequence ", s, " has ", k, " tokens), got ", page);
    }
    const int64_t start = o.key_starts.defined() ? at(o.key_starts, s) : 0;
    check(start >= 0 && start <= k, "options.key_starts[", s, "]: expected 0 to ", k, " (the sequence's tokens), got ",
          start);
    c.q0.push_back(q0);
    c.q_len.push_back(q1 - q0);
    c.k_len.push_back(k);
    c.start.push_back(start);
  }
  if (o.alibi_slopes.defined())
    check(o.alibi_slopes.shape() == Shape{c.Hq} || o.alibi_slopes.shape() == Shape{c.N, c.Hq},
          "options.alibi_slopes: expected (", c.Hq, ") or (", c.N, ", ", c.Hq, "), got shape ", o.alibi_slopes.shape());
  if (o.sinks.defined())
    check(o.sinks.shape() == Shape{c.Hq}, "options.sinks: expected (", c.Hq, "), got shape ", o.sinks.shape());
  check_scoring(o, "options.");

  const detail::ByteRanges inputs = detail::input_ranges(
      {byte_range(query), byte_range(kv.key_pages), byte_range(kv.value_pages), byte_range(kv.block_table),
       byte_range(kv.key_scales), byte_range(kv.value_scales)},
      o);
  detail::ByteRanges written;
  detail::check_output(out.output, {1, c.Hq, c.T, c.Dv}, "output", inputs, written);
  detail::check_output(out.logsumexp, {1, c.Hq, c.T}, "logsumexp", inputs, written);
  check(!out.weights.defined(), "weights: expected none (a paged call returns no weights), got one");
  detail::rows_of(out.output, "output", "(1, Hq, T, Dv)");
  return c;
}

// Rows of pages (keys, values or scales) as decode reads them, sequence b's pages in table row b.
template <class T>
Rows<const T> paged_rows(const View<const T>& pages, const Tensor<int32_t>& table, int64_t P) {
  return {pages.data(), pages.stride(0), pages.stride(1), pages.stride(2), table.data(), table.size(1), P};
}

// The sequences `seqs` (as many queries each) together on decode: their queries gathered into an
// (n, Hq, L, Dqk) batch, the pages read in place through their rows of the block table.
template <class Kv>
void run_on_decode(const View<const float>& query, const PagedKv<Kv>& kv, const ForwardOutputs<float>& out,
                   const Options<float>& o, const PagedCall& c, const std::vector<int64_t>& seqs) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  int64_t L = 0, S = 0;
  for (int64_t s : seqs) {
    L = std::max(L, c.q_len[static_cast<size_t>(s)]);
    S = std::max(S, c.k_len[static_cast<size_t>(s)]);
  }
  Tensor<float> q({n, c.Hq, L, c.Dqk}), result({n, c.Hq, L, c.Dv});
  Tensor<double> lse({n, c.Hq, L});
  Tensor<int32_t> table({n, c.blocks});
  Tensor<int64_t> q_len({n}), k_len({n}), start({n});
  Tensor<float> slopes;  // (N, Hq) ALiBi slopes: the rows of these sequences
  const bool slope_rows = o.alibi_slopes.dim() == 2;
  if (slope_rows) slopes = Tensor<float>({n, c.Hq});
  for (int64_t b = 0; b < n; ++b) {
    const int64_t s = seqs[static_cast<size_t>(b)];
    const size_t si = static_cast<size_t>(s);
    q_len[b] = c.q_len[si];
    k_len[b] = c.k_len[si];
    start[b] = c.start[si];
    for (int64_t j = 0; j < c.blocks; ++j)
      table[b * c.blocks + j] = kv.block_table.data()[s * kv.block_table.stride(0) + j * kv.block_table.stride(1)];
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t i = 0; i < c.q_len[si]; ++i)
        query_row<Kv>(query.data() + h * query.stride(1) + (c.q0[si] + i) * query.stride(2), c.Dqk,
                      q.data() + ((b * c.Hq + h) * L + i) * c.Dqk);
      if (slope_rows) slopes[b * c.Hq + h] = o.alibi_slopes.data()[s * o.alibi_slopes.stride(0) + h * o.alibi_slopes.stride(1)];
    }
  }
  Options<float> sub;
  static_cast<Scoring&>(sub) = o;
  sub.query_lengths = q_len;
  sub.key_lengths = k_len;
  if (o.key_starts.defined()) sub.key_starts = start;
  sub.sinks = o.sinks;
  sub.alibi_slopes = slope_rows ? View<const float>(slopes) : o.alibi_slopes;
  const detail::Problem p =
      detail::make_problem(Shape{n, c.Hq, L, c.Dqk}, Shape{n, c.Hkv, S, c.Dqk}, Shape{n, c.Hkv, S, c.Dv}, sub);
  detail::ForwardArgs<float, Kv> a;
  a.query = detail::rows_of(View<const float>(q), "query", "");
  a.key = paged_rows(kv.key_pages, table, c.P);
  a.value = paged_rows(kv.value_pages, table, c.P);
  if constexpr (std::is_same_v<Kv, int8_t>) {
    a.key_scales = paged_rows(kv.key_scales, table, c.P);
    a.value_scales = paged_rows(kv.value_scales, table, c.P);
  }
  a.output = detail::rows_of(View<float>(result), "output", "");
  a.logsumexp = detail::lse_rows_of(View<double>(lse));
  a.sinks = detail::make_sinks(p, sub);
  detail::decode_forward(p, detail::make_additions(p, sub), a);
  for (int64_t b = 0; b < n; ++b) {
    const size_t si = static_cast<size_t>(seqs[static_cast<size_t>(b)]);
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.q_len[si]; ++i) {
        const int64_t row = (b * c.Hq + h) * L + i, to = c.q0[si] + i;
        std::copy_n(result.data() + row * c.Dv, c.Dv,
                    out.output.data() + h * out.output.stride(1) + to * out.output.stride(2));
        out.logsumexp.data()[h * out.logsumexp.stride(1) + to * out.logsumexp.stride(2)] = lse[row];
      }
  }
}

// Sequence s on cpu_flash or the reference (`backend`), one kv head at a time: that head's keys and
// values copied out of the pages (int8 widened with its scales, to float), and its G query heads'
// rows read and written in place.
template <class Kv>
void run_on_copy(const View<const float>& query, const PagedKv<Kv>& kv, const ForwardOutputs<float>& out,
                 const Options<float>& o, const PagedCall& c, int64_t s, Backend backend) {
  using Copy = std::conditional_t<std::is_same_v<Kv, int8_t>, float, Kv>;
  const size_t si = static_cast<size_t>(s);
  // The sequence's tokens from its first real one (key_starts: its own positions start there).
  const int64_t first = c.start[si], S = c.k_len[si] - first, Lq = c.q_len[si], G = c.group();
  if (Lq == 0) return;
  Tensor<Copy> keys({1, 1, S, c.Dqk}), values({1, 1, S, c.Dv});
  auto gather = [&](const View<const Kv>& pages, const View<const float>& scales, int64_t g, Tensor<Copy>& to) {
    const int64_t D = to.size(3);
    for (int64_t j = 0; j < S; ++j) {
      const int64_t page = c.page(kv, s, first + j), slot = (first + j) % c.P;
      const Kv* row = pages.data() + page * pages.stride(0) + g * pages.stride(1) + slot * pages.stride(2);
      Copy* dst = to.data() + j * D;
      if constexpr (std::is_same_v<Kv, int8_t>) {
        const float scale = scales.data()[page * scales.stride(0) + g * scales.stride(1) + slot * scales.stride(2)];
        for (int64_t e = 0; e < D; ++e) dst[e] = scale * static_cast<float>(row[e]);
      } else {
        std::copy_n(row, D, dst);
      }
    }
  };
  for (int64_t g = 0; g < c.Hkv; ++g) {
    gather(kv.key_pages, kv.key_scales, g, keys);
    gather(kv.value_pages, kv.value_scales, g, values);
    Options<float> sub;
    static_cast<Scoring&>(sub) = o;
    sub.backend = backend;
    if (o.sinks.defined()) sub.sinks = o.sinks.slice(0, g * G, G);
    if (o.alibi_slopes.dim() == 1) sub.alibi_slopes = o.alibi_slopes.slice(0, g * G, G);
    if (o.alibi_slopes.dim() == 2) sub.alibi_slopes = o.alibi_slopes.slice(0, s, 1).slice(1, g * G, G);
    View<const float> q = query.slice(1, g * G, G).slice(2, c.q0[si], Lq);
    Tensor<float> rounded;  // int8: the rows rounded (query_row)
    if constexpr (std::is_same_v<Kv, int8_t>) {
      rounded = Tensor<float>({1, G, Lq, c.Dqk});
      for (int64_t h = 0; h < G; ++h)
        for (int64_t i = 0; i < Lq; ++i)
          query_row<Kv>(q.data() + h * q.stride(1) + i * q.stride(2), c.Dqk, rounded.data() + (h * Lq + i) * c.Dqk);
      q = rounded;
    }
    sdpa_forward_into(q, View<const Copy>(keys), View<const Copy>(values),
                      {out.output.slice(1, g * G, G).slice(2, c.q0[si], Lq),
                       out.logsumexp.slice(1, g * G, G).slice(2, c.q0[si], Lq), {}},
                      sub);
  }
}

}  // namespace

template <class Kv>
void paged_forward_into(View<const float> query, const PagedKv<Kv>& kv, const ForwardOutputs<float>& out,
                        const Options<float>& options) {
  const PagedCall c = check_paged(query, kv, out, options);
  // The decode sequences by their query count, each count one task set: a row of 1 query padded
  // to a speculative step's 4 would cost 4 rows' products.
  std::map<int64_t, std::vector<int64_t>> on_decode;
  for (int64_t s = 0; s < c.N; ++s) {
    const int64_t rows = c.q_len[static_cast<size_t>(s)];
    if (rows == 0) continue;
    const bool decode = options.backend == Backend::decode ||
                        (options.backend == Backend::automatic && rows <= detail::kDecodeRows);
    if (decode) {
      on_decode[rows].push_back(s);
    } else {
      run_on_copy(query, kv, out, options, c, s,
                  options.backend == Backend::reference ? Backend::reference : Backend::cpu_flash);
    }
  }
  for (const auto& [rows, seqs] : on_decode) run_on_decode(query, kv, out, options, c, seqs);
}

template void paged_forward_into(View<const float>, const PagedKv<float>&, const ForwardOutputs<float>&,
                                 const Options<float>&);
template void paged_forward_into(View<const float>, const PagedKv<bfloat16>&, const ForwardOutputs<float>&,
                                 const Options<float>&);
template void paged_forward_into(View<const float>, const PagedKv<float16>&, const ForwardOutputs<float>&,
                                 const Options<float>&);
template void paged_forward_into(View<const float>, const PagedKv<int8_t>&, const ForwardOutputs<float>&,
                                 const Options<float>&);

}  // namespace mha::attention
