// The decode backend (decode.h): flash-decoding over fixed chunks of keys, then a merge of the
// chunks' (max, sum, output) partials.
#include "decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "../cpu_flash/tiles.h"
#include "kernels.h"
#include "mha/core/half.h"

namespace mha::attention::detail {
namespace {

using cpu_flash::Buffer;
using cpu_flash::round_up;
using cpu_flash::to_size;

// Keys per block inside a task: the score tile's width (a multiple of every target's lanes). A
// block of keys and values (256 × d floats each) stays in L2 while the task's row blocks use it.
constexpr size_t kBlockKeys = 256;
// Rows per block: the score tile's height.
constexpr size_t kBlockRows = 64;

// Keys per chunk (one task): 4 blocks for up to 16 rows, growing with the rows up to 16 blocks, so
// that a task streams a long run of the cache (the hardware prefetcher's stream) and the
// partials it leaves (R rows × Dv) stay at most about 1/128 of the keys and values it read, while
// a long cache still gives many tasks. A function of the shape only (not the threads).
int64_t chunk_keys(size_t rows) {
  return static_cast<int64_t>(4 * kBlockKeys * std::clamp<size_t>(rows / 16, 1, 4));
}

}  // namespace

template <class Kv>
void decode_forward(const Problem& p, const Masks<float>& masks, const ForwardArgs<float, Kv>& a) {
  // A block of keys or values as the kernels read it: the cache's rows, or a staged float copy.
  struct Operand {
    const Kv* rows;
    const float* staged;
    size_t stride;
  };
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  // output (B, Hq, L, Dv)  logsumexp (B, Hq, L); rows at any strides
  const int64_t B = p.batch, Hq = p.query_heads, Hkv = p.kv_heads, L = p.query_len;
  const int64_t G = p.group_size();
  const size_t R = to_size(G * L);  // rows of a (b, kv head): row r is query head kv·G + r / L, query r % L
  const size_t Dqk = to_size(p.qk_head_dim), Dv = to_size(p.v_head_dim);
  const size_t N = decode::lanes();
  // Rows are read in place (and converted to float as they are loaded) when they are whole
  // vectors; otherwise each block is first converted into a zero-padded float buffer.
  const bool stage_k = Dqk % N != 0, stage_v = Dv % N != 0;
  const size_t dq = round_up(std::max<size_t>(Dqk, 1), N), dv = round_up(std::max<size_t>(Dv, 1), N);

  // The keys some row can see: all, or up to the last query's causal limit.
  const int64_t keys = p.causal == Causal::none ? p.key_len : p.causal_limit(L - 1);
  const int64_t chunk = chunk_keys(R);
  const int64_t chunks = (keys + chunk - 1) / chunk;
  const int64_t tasks = B * Hkv * chunks;
  Buffer<float> part_max(to_size(tasks) * R, Buffer<float>::Uninitialized);
  Buffer<double> part_sum(to_size(tasks) * R, Buffer<double>::Uninitialized);
  Buffer<float> part_out(to_size(tasks) * R * dv, Buffer<float>::Uninitialized);
  const bool masked = cpu_flash::has_masks(masks), causal = p.causal != Causal::none, dropout = p.dropout_p > 0.0;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const size_t Rb = std::min(R, kBlockRows), Bc = kBlockKeys;

#pragma omp parallel
  {
    Buffer<float> k_block(stage_k ? Bc * dq : 0), v_block(stage_v ? Bc * dv : 0);  // zero padding stays zero
    Buffer<float> q_scaled(R * dq), scores(Rb * Bc), bias(masked ? Rb * Bc : 0), factors(dropout ? Rb * Bc : 0);
    Buffer<int64_t> visible(Rb);
    Buffer<double> merged(Dv);
    int64_t scaled_for = -1;  // the (b, kv head) whose queries q_scaled holds

#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bkv = task / chunks, b = bkv / Hkv, kv = bkv % Hkv;
      if (bkv != scaled_for) {  // scale·q for the group's rows (the scale folded in once)
        for (size_t r = 0; r < R; ++r) {
          const float* q = a.query.row(b, kv * G + static_cast<int64_t>(r) / L, static_cast<int64_t>(r) % L);
          for (size_t e = 0; e < Dqk; ++e) q_scaled[r * dq + e] = static_cast<float>(p.scale) * q[e];
        }
        scaled_for = bkv;
      }
      float* m = part_max.data() + to_size(task) * R;
      double* l = part_sum.data() + to_size(task) * R;
      float* o = part_out.data() + to_size(task) * R * dv;
      std::fill(m, m + R, neg_inf);
      std::fill(l, l + R, 0.0);
      std::fill(o, o + R * dv, 0.0f);

      const int64_t j_end = std::min(keys, (task % chunks + 1) * chunk);
      for (int64_t j0 = (task % chunks) * chunk; j0 < j_end; j0 += static_cast<int64_t>(Bc)) {
        const size_t cols = std::min<size_t>(Bc, to_size(j_end - j0));
        // Each operand: its rows in place, or the staged copy (float, zero-padded to whole vectors).
        auto operand = [&](const Rows<const Kv>& rows, bool staged, Buffer<float>& block, size_t D, size_t padded) {
          if (staged)
            for (size_t c = 0; c < cols; ++c)
              convert(rows.row(b, kv, j0 + static_cast<int64_t>(c)), block.data() + c * padded, D);
          return staged ? Operand{nullptr, block.data(), padded} : Operand{rows.row(b, kv, j0), nullptr, to_size(rows.stride_row)};
        };
        const Operand k = operand(a.key, stage_k, k_block, Dqk, dq), v = operand(a.value, stage_v, v_block, Dv, dv);

        for (size_t r0 = 0; r0 < R; r0 += Rb) {
          const size_t rows = std::min(Rb, R - r0);
          if (k.staged) {
            decode::qk_scores(q_scaled.data() + r0 * dq, dq, rows, k.staged, k.stride, cols, dq, scores.data(), Bc);
          } else {  // the first row block prefetches these keys' values (read in place, rows as long)
            const bool prefetch_v = r0 == 0 && v.rows && dq == dv;
            decode::qk_scores(q_scaled.data() + r0 * dq, dq, rows, k.rows, k.stride, cols, dq, scores.data(), Bc,
                              prefetch_v ? v.rows : nullptr, v.stride);
          }
          cpu_flash::ScoreTile t{scores.data(), Bc, rows, cols};
          // The additions, row by row (consecutive rows may belong to different query heads).
          for (size_t r = 0; r < rows; ++r) {
            const int64_t h = kv * G + static_cast<int64_t>(r0 + r) / L, i = static_cast<int64_t>(r0 + r) % L;
            if (masked) cpu_flash::fill_mask_tile(masks, b, h, i, 1, j0, cols, bias.data() + r * Bc, Bc);
            if (causal) visible[r] = p.causal_limit(i) - j0;
            if (dropout) cpu_flash::fill_dropout_tile(p, b * Hq + h, i, 1, j0, cols, factors.data() + r * Bc, Bc);
          }
          if (masked) t.bias = bias.data();
          if (causal) t.visible = visible.data();
          if (dropout) t.dropout = factors.data();
          cpu_flash::online_softmax_tile(t, m + r0, l + r0, o + r0 * dv, dv, Dv);
          if (v.staged) {
            decode::pv_accumulate(scores.data(), Bc, rows, v.staged, v.stride, cols, dv, o + r0 * dv, dv);
          } else {
            decode::pv_accumulate(scores.data(), Bc, rows, v.rows, v.stride, cols, dv, o + r0 * dv, dv);
          }
        }
      }
    }

    // The merge, one row of one (b, kv head) at a time, chunks in order (see decode.h). A chunk
    // whose keys the row cannot see left l = 0 and adds nothing; a row that saw nothing at all
    // gets output 0 and logsumexp −inf; a NaN anywhere in a row's sums makes its row NaN.
#pragma omp for schedule(static)
    for (int64_t x = 0; x < B * Hkv * static_cast<int64_t>(R); ++x) {
      const int64_t bkv = x / static_cast<int64_t>(R), b = bkv / Hkv, kv = bkv % Hkv;
      const size_t r = to_size(x % static_cast<int64_t>(R));
      const int64_t h = kv * G + static_cast<int64_t>(r) / L, i = static_cast<int64_t>(r) % L;
      auto slot = [&](int64_t c) { return to_size(bkv * chunks + c) * R + r; };
      float row_max = neg_inf;
      for (int64_t c = 0; c < chunks; ++c)
        if (part_sum[slot(c)] != 0.0) row_max = std::max(row_max, part_max[slot(c)]);
      double total = 0.0;
      for (int64_t c = 0; c < chunks; ++c)
        if (part_sum[slot(c)] != 0.0) total += std::exp(static_cast<double>(part_max[slot(c)]) - row_max) * part_sum[slot(c)];
      float* out = a.output.row(b, h, i);
      double& lse = *a.logsumexp.row(b, h, i);
      if (total == 0.0) {
        std::fill(out, out + Dv, 0.0f);
        lse = -std::numeric_limits<double>::infinity();
        continue;
      }
      std::fill(merged.data(), merged.data() + Dv, 0.0);
      for (int64_t c = 0; c < chunks; ++c) {
        if (part_sum[slot(c)] == 0.0) continue;
        const double weight = std::exp(static_cast<double>(part_max[slot(c)]) - row_max) / total;
        const float* partial = part_out.data() + slot(c) * dv;
        for (size_t e = 0; e < Dv; ++e) merged[e] += weight * static_cast<double>(partial[e]);
      }
      for (size_t e = 0; e < Dv; ++e) out[e] = static_cast<float>(merged[e]);
      lse = static_cast<double>(row_max) + std::log(total);
    }
  }
}

template void decode_forward(const Problem&, const Masks<float>&, const ForwardArgs<float, float>&);
template void decode_forward(const Problem&, const Masks<float>&, const ForwardArgs<float, bfloat16>&);
template void decode_forward(const Problem&, const Masks<float>&, const ForwardArgs<float, float16>&);

}  // namespace mha::attention::detail
