// The decode backend (decode.h): flash-decoding over fixed chunks of keys, then a merge of the
// chunks' (max, sum, output) partials.
#include "decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "../tiles/tiles.h"
#include "bf16_kernels.h"
#include "int8_kernels.h"
#include "kernels.h"
#include "../work_split.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/half.h"
#include "mha/core/int8.h"

namespace mha::attention::detail {
namespace {

using tiles::Buffer;
using tiles::round_up;
using tiles::to_size;

// Keys per block inside a task: the score tile's width (a multiple of every target's lanes). A
// block of keys and values (256 × d floats each) stays in L2 while the task's row blocks use it.
constexpr size_t kBlockKeys = 256;
// Rows per block: the score tile's height.
constexpr size_t kBlockRows = 64;

// Keys per chunk (one task): 4 blocks for up to 16 rows, growing with the rows up to 16 blocks, so
// that a task streams a long run of the cache (the hardware prefetcher's stream) and the
// partials it leaves (R rows × Dv) stay at most about 1/128 of the keys and values it read, while
// a long cache still gives many tasks. A function of the shape only (not the threads). (Chunks
// halved down to one block until a call had 128 tasks cost the float32 step at B 1, Hkv 8,
// S 4 096 a quarter, 0.48 → 0.59–0.63 ms on 2 threads: the shorter streams.)
int64_t chunk_keys(size_t rows) {
  return static_cast<int64_t>(4 * kBlockKeys * std::clamp<size_t>(rows / 16, 1, 4));
}

// Whether a task prefetches the next block's keys while it sums a block's values (decode_chunk):
// on AMD Zen 4 that took bfloat16 steps at Hkv 8 from 69–77% of the read bandwidth to 80–87%
// (docs/generation.md). Not where the CPU has AMX tiles: on that Intel host the hardware
// prefetcher alone brings the keys sooner (bfloat16 cache, 2 threads, alternating runs: B 8, Hkv 8,
// S 4 096 7.12 → 6.58 ms; B 1, S 32 768 6.97 → 6.56; Hkv 32 11.43 → 10.79; a float32 cache within
// 1% either way). AMX marks that family of CPUs here (bf16_gemm::path(), the one bf16 decision,
// which a ScopedPath pins: pinned below AMX, a run takes the other family's choice); the results
// are the same bits either way.
bool keys_prefetched() { return bf16_gemm::path() != bf16_gemm::Path::amx; }

// The call's shape as decode cuts it: the rows of a (b, kv head) and the key chunks.
struct Plan {
  int64_t B, Hq, Hkv, L, G;
  size_t R;  // rows of a (b, kv head): row r is query head kv·G + r / L, query r % L
  size_t Dqk, Dv, N;
  // Rows are read in place (and converted to float as they are loaded) when they are whole
  // vectors; otherwise each block is first converted into a zero-padded float buffer.
  bool stage_k, stage_v;
  size_t dq, dv;
  int64_t chunk, chunks, tasks;

  explicit Plan(const Problem& p)
      : B(p.batch), Hq(p.query_heads), Hkv(p.kv_heads), L(p.query_len), G(p.group_size()), R(to_size(G * L)),
        Dqk(to_size(p.qk_head_dim)), Dv(to_size(p.v_head_dim)), N(decode::lanes()), stage_k(Dqk % N != 0),
        stage_v(Dv % N != 0), dq(round_up(std::max<size_t>(Dqk, 1), N)), dv(round_up(std::max<size_t>(Dv, 1), N)),
        chunk(chunk_keys(R)) {
    // Chunks up to the last key any sequence's rows see; a chunk past a sequence's own range is a
    // task that reads nothing.
    int64_t keys = 0;
    for (int64_t b = 0; b < B; ++b) keys = std::max(keys, p.visible_keys(b, 0, L).end);
    chunks = (keys + chunk - 1) / chunk;
    tasks = B * Hkv * chunks;
  }
  // The keys task `task` reads: chunk c's part of those sequence b's rows see.
  KeyRange task_keys(const Problem& p, int64_t task) const {
    const KeyRange keys = p.visible_keys(task / chunks / Hkv, 0, L);
    const int64_t chunk0 = (task % chunks) * chunk;
    return {std::max(chunk0, tiles::key_walk_start(keys)), std::min(keys.end, chunk0 + chunk)};
  }
  // (query head, query) of row r of kv head kv.
  std::pair<int64_t, int64_t> row(int64_t kv, size_t r) const {
    return {kv * G + static_cast<int64_t>(r) / L, static_cast<int64_t>(r) % L};
  }
};

// Each task's partial per row: max m, sum l, unnormalised output o (R × dv).
struct Partials {
  Buffer<double> max;
  Buffer<double> sum;
  Buffer<float> out;

  explicit Partials(const Plan& n)
      : max(to_size(n.tasks) * n.R, Buffer<double>::Uninitialized),
        sum(to_size(n.tasks) * n.R, Buffer<double>::Uninitialized),
        out(to_size(n.tasks) * n.R * n.dv, Buffer<float>::Uninitialized) {}
};

// A block of keys or values as the kernels read it: the cache's rows, or a staged float copy.
template <class Kv>
struct Operand {
  const Kv* rows;
  const float* staged;
  size_t stride;
};

// decode's representations of Q·Kᵀ, one type each (as cpu_flash's products.h): the query rows as
// the A operand (load_q returns what the row's scores must still be multiplied by), whether the
// keys are staged, the scores, and what the tile kernels must do. P·V is the float kernel's in
// all (the values read in place, or staged, as float).
//   FloatScores  scale·q in float (the scale folded in once), keys in place when their rows are
//                whole vectors, else staged as zero-padded floats (qk_scores);
//   Bf16Scores   bfloat16 queries and keys on the CPU's bf16 instructions (qk_scores_bf16: any row
//                length, read in place; q unscaled, the kernels scale each score as they read it),
//                where bf16_scores() says VDPBF16PS is the best of the CPU's bf16 paths;
//   Int8Scores   int8 queries (each row rounded as the keys are: mha/core/int8.h) and int8 keys on
//                the CPU's int8 dot products (qk_scores_int8: exact integer sums, any row length),
//                each row's scores then multiplied by its scale times the call's, where
//                int8_scores().
// An int8 key's own scale multiplies its column in every representation (decode_chunk).
// with_decode_scores resolves it once per call; a new representation is a type here and its case.
struct FloatScores {
  using A = float;
  static size_t a_stride(const Plan& n) { return n.dq; }
  static bool stages_keys(const Plan& n) { return n.stage_k; }
  template <class T>
  static float load_q(const T* q, const Plan& n, float scale, A* dst) {
    for (size_t e = 0; e < n.Dqk; ++e) dst[e] = scale * widen(q[e]);
    return 1.0f;
  }
  // The first row block prefetches the values of keys read in place (`prefetch_v`, rows as long).
  template <class Kv>
  static void scores(const Plan& n, const A* q, size_t rows, const Operand<Kv>& k, size_t cols, float* out, size_t ld,
                     const Kv* prefetch_v, size_t v_stride) {
    if (k.staged)
      decode::qk_scores(q, n.dq, rows, k.staged, k.stride, cols, n.dq, out, ld);
    else
      decode::qk_scores(q, n.dq, rows, k.rows, k.stride, cols, n.dq, out, ld, prefetch_v, v_stride);
  }
  static void prepare(tiles::ScoreTile&, float) {}
};

struct Bf16Scores {
  using A = bfloat16;
  static size_t a_stride(const Plan& n) { return n.Dqk; }
  static bool stages_keys(const Plan&) { return false; }
  static float load_q(const bfloat16* q, const Plan& n, float, A* dst) {
    std::copy_n(q, n.Dqk, dst);
    return 1.0f;
  }
  static void scores(const Plan& n, const A* q, size_t rows, const Operand<bfloat16>& k, size_t cols, float* out,
                     size_t ld, const bfloat16* prefetch_v, size_t v_stride) {
    decode::qk_scores_bf16(q, n.Dqk, rows, k.rows, k.stride, cols, n.Dqk, out, ld, prefetch_v, v_stride);
  }
  static void prepare(tiles::ScoreTile& t, float scale) { t.scale = scale; }
};

struct Int8Scores {
  using A = int8_t;
  static size_t a_stride(const Plan& n) { return n.Dqk; }
  static bool stages_keys(const Plan&) { return false; }
  // The row as int8 (its numbers are already int8 times a scale: paged_forward_into rounded them,
  // so this gives those numbers back).
  static float load_q(const float* q, const Plan& n, float scale, A* dst) {
    return quantize_int8(q, n.Dqk, dst) * scale;
  }
  static void scores(const Plan& n, const A* q, size_t rows, const Operand<int8_t>& k, size_t cols, float* out,
                     size_t ld, const int8_t* prefetch_v, size_t v_stride) {
    decode::qk_scores_int8(q, n.Dqk, rows, k.rows, k.stride, cols, n.Dqk, out, ld, prefetch_v, v_stride);
  }
  static void prepare(tiles::ScoreTile&, float) {}
};

template <class T, class Kv, class F>
void with_decode_scores(F&& f) {
  if constexpr (std::is_same_v<T, bfloat16> && std::is_same_v<Kv, bfloat16>) {
    if (decode::bf16_scores()) return f(Bf16Scores{});
  }
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Kv, int8_t>) {
    if (decode::int8_scores()) return f(Int8Scores{});
  }
  f(FloatScores{});
}

// One thread's buffers.
template <class Scores>
struct Scratch {
  Buffer<float> k_block, v_block;  // staged blocks (zero padding stays zero)
  Buffer<typename Scores::A> q;    // the group's query rows as the scores' A operand
  Buffer<float> scores, bias, factors;
  Buffer<int64_t> first, end;
  Buffer<float> row_factors;  // what load_q returned for each query row
  Buffer<double> merged;
  int64_t scaled_for = -1;  // the (b, kv head) whose queries q holds

  Scratch(const Plan& n, bool masked, bool dropout)
      : k_block(n.stage_k ? kBlockKeys * n.dq : 0), v_block(n.stage_v ? kBlockKeys * n.dv : 0),
        q(n.R * Scores::a_stride(n)), scores(std::min(n.R, kBlockRows) * kBlockKeys),
        bias(masked ? std::min(n.R, kBlockRows) * kBlockKeys : 0),
        factors(dropout ? std::min(n.R, kBlockRows) * kBlockKeys : 0), first(kBlockRows), end(kBlockRows),
        row_factors(n.R), merged(n.Dv) {}
};

// Numbers at a stride: int8 rows' scales.
struct Strided {
  const float* data = nullptr;
  int64_t stride = 0;
};

// tile[r·stride + c] *= row[r]·column[c] (r < rows, c < cols; row null: 1), row by row.
void scale_tile(float* tile, size_t stride, size_t rows, const float* row, const Strided& column, size_t cols) {
  thread_local std::vector<float> factors;
  const float* f = column.data;
  if (column.stride != 1) {
    factors.resize(cols);
    for (size_t c = 0; c < cols; ++c) factors[c] = column.data[static_cast<int64_t>(c) * column.stride];
    f = factors.data();
  }
  for (size_t r = 0; r < rows; ++r) {
    float* t = tile + r * stride;
    const float by = row ? row[r] : 1.0f;
    for (size_t c = 0; c < cols; ++c) t[c] *= by * f[c];
  }
}

// Task (b, kv head, chunk): the online softmax of the group's R rows over the chunk's keys that
// sequence b's rows see, left as the task's partials.
template <class Scores, class T, class Kv>
void decode_chunk(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a,
                  const Plan& n, Partials& part, Scratch<Scores>& s, int64_t task) {
  const int64_t bkv = task / n.chunks, b = bkv / n.Hkv, kv = bkv % n.Hkv;
  const size_t q_stride = Scores::a_stride(n);
  if (bkv != s.scaled_for) {  // the group's query rows, once per (b, kv head)
    for (size_t r = 0; r < n.R; ++r) {
      const auto [h, i] = n.row(kv, r);
      s.row_factors[r] = Scores::load_q(a.query.row(b, h, i), n, static_cast<float>(p.scale), s.q.data() + r * q_stride);
    }
    s.scaled_for = bkv;
  }
  double* m = part.max.data() + to_size(task) * n.R;
  double* l = part.sum.data() + to_size(task) * n.R;
  float* o = part.out.data() + to_size(task) * n.R * n.dv;
  std::fill(m, m + n.R, -std::numeric_limits<double>::infinity());
  std::fill(l, l + n.R, 0.0);
  std::fill(o, o + n.R * n.dv, 0.0f);

  const auto [j_begin, j_end] = n.task_keys(p, task);
  const size_t Rb = std::min(n.R, kBlockRows), Bc = kBlockKeys;
  constexpr bool quantized = std::is_same_v<Kv, int8_t>;
  // Blocks of Bc keys, cut where a page ends (paged keys and values: a block's rows at one stride).
  size_t cols = 0;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += static_cast<int64_t>(cols)) {
    cols = to_size(std::min<int64_t>({static_cast<int64_t>(Bc), j_end - j0, a.key.run(j0)}));
    // Each operand: its rows in place, or the staged copy (float, zero-padded to whole vectors).
    auto operand = [&](const Rows<const Kv>& rows, bool staged, Buffer<float>& block, size_t D, size_t padded) {
      if (staged)
        for (size_t c = 0; c < cols; ++c) {
          const Kv* row = rows.row(b, kv, j0 + static_cast<int64_t>(c));
          float* to = block.data() + c * padded;
          if constexpr (quantized) {
            std::copy_n(row, D, to);
          } else {
            convert(row, to, D);
          }
        }
      return staged ? Operand<Kv>{nullptr, block.data(), padded}
                    : Operand<Kv>{rows.row(b, kv, j0), nullptr, to_size(rows.stride_row)};
    };
    const Operand<Kv> k = operand(a.key, Scores::stages_keys(n), s.k_block, n.Dqk, n.dq);
    const Operand<Kv> v = operand(a.value, n.stage_v, s.v_block, n.Dv, n.dv);
    // int8: the block's scales (in the block's page, as its rows).
    const Strided key_scales = quantized ? Strided{a.key_scales.row(b, kv, j0), a.key_scales.stride_row} : Strided{},
                  value_scales =
                      quantized ? Strided{a.value_scales.row(b, kv, j0), a.value_scales.stride_row} : Strided{};

    // The next block's keys (when it has as many, read in place, rows as long as the values'),
    // prefetched by the first row block while it sums this block's values where keys_prefetched():
    // the hardware prefetcher follows the keys only while they are read, and would leave the
    // memory idle.
    const int64_t next0 = j0 + static_cast<int64_t>(cols);
    const bool prefetch_k = keys_prefetched() && next0 + static_cast<int64_t>(cols) <= j_end &&
                            a.key.run(next0) >= static_cast<int64_t>(cols) && k.rows && n.Dqk == n.Dv;
    const Kv* next_keys = prefetch_k ? a.key.row(b, kv, next0) : nullptr;
    // int8: the next block's scales too, which lie in the next page apart from its rows, a run of
    // one line per 16 keys too short for the hardware prefetcher to start on (Zen 5, 2 threads,
    // B 8, S 8 192, Hkv 8, in turns: pages of 256 5.45 → 5.37 ms, pages of 1 024 4.73 → 4.42).
    if constexpr (quantized)
      if (next0 < j_end)
        for (const Rows<const float>* scales : {&a.key_scales, &a.value_scales})
          if (scales->stride_row == 1) {
            const auto* first = reinterpret_cast<const char*>(scales->row(b, kv, next0));
            const int64_t count = std::min<int64_t>({static_cast<int64_t>(Bc), j_end - next0, scales->run(next0)});
            for (int64_t byte = 0; byte < count * static_cast<int64_t>(sizeof(float)); byte += 64)
              __builtin_prefetch(first + byte, /*rw=*/0, /*locality=*/2);
          }
    for (size_t r0 = 0; r0 < n.R; r0 += Rb) {
      const size_t rows = std::min(Rb, n.R - r0);
      const bool prefetch_v = r0 == 0 && v.rows && n.dq == n.dv;
      Scores::scores(n, s.q.data() + r0 * q_stride, rows, k, cols, s.scores.data(), Bc, prefetch_v ? v.rows : nullptr,
                     v.stride);
      // An int8 key's scale multiplies its scores (scale·q·k8 · ks = scale·q·(ks·k8)), and Int8Scores'
      // rows their own.
      if constexpr (quantized)
        scale_tile(s.scores.data(), Bc, rows, std::is_same_v<Scores, Int8Scores> ? s.row_factors.data() + r0 : nullptr,
                   key_scales, cols);
      // Consecutive rows may belong to different query heads.
      const tiles::TileScratch scratch{s.bias.size() ? s.bias.data() : nullptr,
                                       s.factors.size() ? s.factors.data() : nullptr, nullptr, s.first.data(),
                                       s.end.data()};
      tiles::ScoreTile t = tiles::make_tile(p, additions, scratch, s.scores.data(), Bc, b, rows, j0, cols,
                                            [&](size_t r) { return n.row(kv, r0 + r); });
      Scores::prepare(t, static_cast<float>(p.scale));
      tiles::online_softmax_tile(t, m + r0, l + r0, o + r0 * n.dv, n.dv, n.Dv);
      // And an int8 value's scale its probability, once l has counted it: p·(vs·v8) = (p·vs)·v8.
      if constexpr (quantized) scale_tile(s.scores.data(), Bc, rows, nullptr, value_scales, cols);
      if (v.staged) {
        decode::pv_accumulate(s.scores.data(), Bc, rows, v.staged, v.stride, cols, n.dv, o + r0 * n.dv, n.dv);
      } else {
        decode::pv_accumulate(s.scores.data(), Bc, rows, v.rows, v.stride, cols, n.dv, o + r0 * n.dv, n.dv,
                              r0 == 0 ? next_keys : nullptr, to_size(a.key.stride_row));
      }
    }
  }
}

// The merge of row x (of B·Hkv·R), chunks in order (see decode.h). A chunk whose keys the row
// cannot see left l = 0 and adds nothing; a row that saw nothing at all gets output 0 and
// logsumexp −inf (or the sink's logit); a NaN anywhere in a row's sums makes its row NaN.
template <class T, class Kv, class Scores>
void merge_chunks(const ForwardArgs<T, Kv>& a, const Plan& n, const Partials& part, Scratch<Scores>& s, int64_t x) {
  const int64_t bkv = x / static_cast<int64_t>(n.R), b = bkv / n.Hkv, kv = bkv % n.Hkv;
  const size_t r = to_size(x % static_cast<int64_t>(n.R));
  const auto [h, i] = n.row(kv, r);
  auto slot = [&](int64_t c) { return to_size(bkv * n.chunks + c) * n.R + r; };
  // The sink (Options::sinks), if any, is one more partial: max = sink, sum = 1, output 0.
  const double sink = a.sinks.of(b, h);
  const bool has_sink = sink != -std::numeric_limits<double>::infinity();
  double row_max = static_cast<float>(sink);
  for (int64_t c = 0; c < n.chunks; ++c)
    if (part.sum[slot(c)] != 0.0) row_max = std::max(row_max, part.max[slot(c)]);
  double total = has_sink ? std::exp(sink - row_max) : 0.0;
  for (int64_t c = 0; c < n.chunks; ++c)
    if (part.sum[slot(c)] != 0.0) total += std::exp(part.max[slot(c)] - row_max) * part.sum[slot(c)];
  T* out = a.output.row(b, h, i);
  double& lse = *a.logsumexp.row(b, h, i);
  if (total == 0.0) {
    std::fill(out, out + n.Dv, T{});
    lse = -std::numeric_limits<double>::infinity();
    return;
  }
  std::fill(s.merged.data(), s.merged.data() + n.Dv, 0.0);
  for (int64_t c = 0; c < n.chunks; ++c) {
    if (part.sum[slot(c)] == 0.0) continue;
    const double weight = std::exp(part.max[slot(c)] - row_max) / total;
    const float* partial = part.out.data() + slot(c) * n.dv;
    for (size_t e = 0; e < n.Dv; ++e) s.merged[e] += weight * static_cast<double>(partial[e]);
  }
  for (size_t e = 0; e < n.Dv; ++e) out[e] = narrow<T>(static_cast<float>(s.merged[e]));
  lse = row_max + std::log(total);
}

}  // namespace

std::vector<TaskLoop> decode_loops(const Problem& p) {
  // decode_forward's first loop, a task's work the keys it reads (the merge's static loop, of
  // about 1/128 of that, left out).
  const Plan n(p);
  TaskLoop loop;
  for (int64_t task = 0; task < n.tasks; ++task) {
    const KeyRange keys = n.task_keys(p, task);
    loop.work.push_back(keys.empty() ? 0.0 : static_cast<double>(keys.end - keys.begin));
  }
  return {loop};
}

template <class T, class Kv>
void decode_forward(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  // output (B, Hq, L, Dv)  logsumexp (B, Hq, L); rows at any strides
  const Plan n(p);
  Partials part(n);
  with_decode_scores<T, Kv>([&](auto scores) {
    using Scores = decltype(scores);
#pragma omp parallel
    {
      Scratch<Scores> s(n, additions.present(), p.dropout());
#pragma omp for schedule(dynamic)
      for (int64_t task = 0; task < n.tasks; ++task) decode_chunk(p, additions, a, n, part, s, task);
#pragma omp for schedule(static)
      for (int64_t x = 0; x < n.B * n.Hkv * static_cast<int64_t>(n.R); ++x) merge_chunks(a, n, part, s, x);
    }
  });
}

template void decode_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, float>&);
template void decode_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, bfloat16>&);
template void decode_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, float16>&);
template void decode_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, int8_t>&);
template void decode_forward(const Problem&, const ScoreAdditions<bfloat16>&, const ForwardArgs<bfloat16, bfloat16>&);
template void decode_forward(const Problem&, const ScoreAdditions<float16>&, const ForwardArgs<float16, float16>&);

}  // namespace mha::attention::detail
