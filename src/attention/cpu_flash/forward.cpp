// cpu_flash forward: FlashAttention-2's loop, one task per block of query rows.
//
//   for each block of Br queries (a task):
//     m = −inf, l = 0, O = 0                                     (per row)
//     for each block of Bc keys the block can see:
//       S = scale·Q·Kᵀ + masks                                   (Br × Bc, never more)
//       m' = max(m, rowmax S);  P = exp(S − m');  l = e^(m − m')·l + rowsum P
//       O = e^(m − m')·O + (P ∘ dropout)·V
//     O /= l;  logsumexp = m + log l
//
// Why it is exact: after any prefix of key blocks, O = Σ_j exp(s_j − m)·z_j·v_j and
// l = Σ_j exp(s_j − m) for the current m; multiplying both by e^(m − m') re-bases them on the
// new maximum, so the final O / l is Σ_j softmax(s)_j·z_j·v_j whatever the order of blocks.
#include <cmath>
#include <limits>

#include "cpu_flash.h"
#include "tiles.h"

namespace mha::attention::detail {

using namespace cpu_flash;

void cpu_flash_forward(const Problem& p, const Masks<float>& masks, const ForwardArgs<float>& a) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  // output (B, Hq, L, Dv)  logsumexp (B, Hq, L)  weights (B, Hq, L, S), rows at any strides
  const int64_t B = p.batch, Hq = p.query_heads, Hkv = p.kv_heads, L = p.query_len, S = p.key_len;
  const size_t Dqk = to_size(p.qk_head_dim), Dv = to_size(p.v_head_dim);
  const bool need_weights = a.weights.present();
  if (B * Hq * L == 0) return;

  const size_t W = panel_width();
  const size_t keys_padded = round_up(to_size(S), W);  // keys as columns of Kᵀ, whole panels
  const size_t dv_padded = round_up(Dv, W);
  const size_t Br = kForwardQueries, Bc = kForwardKeys;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  // One task per (b, h, block of Br queries); tasks run in parallel, each writes only its rows.
  const int64_t query_blocks = (L + static_cast<int64_t>(Br) - 1) / static_cast<int64_t>(Br);
  const int64_t tasks = B * Hq * query_blocks;
  const bool masked = has_masks(masks), dropout = p.dropout_p > 0.0;
  const size_t tile = Br * Bc;  // row stride Bc, a multiple of 64, so of W
  // The B operands of one (b, kv head), in panels: Kᵀ (Dqk × S, panels of keys) for S = Q·Kᵀ and
  // V (S × Dv, panels of value columns) for O += P·V. Short keys: each thread packs the kv head of
  // its task when that moves to another one (consecutive tasks mostly share one), O(S·d) per
  // thread. Long keys: one shared copy, the kv heads taken one after another.
  const bool shared_packs = S > kLongKeys;
  const size_t kt_size = keys_padded * Dqk, v_size = dv_padded * to_size(S);
  Buffer<float> shared_kt(shared_packs ? kt_size : 0, Buffer<float>::Uninitialized);
  Buffer<float> shared_v(shared_packs ? v_size : 0, Buffer<float>::Uninitialized);
  auto pack_kv_head = [&](int64_t kv, float* kt, float* v) {  // kv = b·Hkv + kv head
    pack_transposed(a.key.row(kv / Hkv, kv % Hkv, 0), to_size(a.key.stride_row), to_size(S), Dqk, kt);
    pack_rows(a.value.row(kv / Hkv, kv % Hkv, 0), to_size(a.value.stride_row), to_size(S), Dv, v);
  };
#pragma omp parallel
  {
    Buffer<float> own_kt(shared_packs ? 0 : kt_size, Buffer<float>::Uninitialized);
    Buffer<float> own_v(shared_packs ? 0 : v_size, Buffer<float>::Uninitialized);
    const float* kt_packed = shared_packs ? shared_kt.data() : own_kt.data();
    const float* v_packed = shared_packs ? shared_v.data() : own_v.data();
    int64_t packed_kv = -1;
    Buffer<float> scores(tile), bias(masked ? tile : 0), factors(dropout ? tile : 0), out(Br * dv_padded);
    Buffer<float> q_scaled(Br * Dqk), row_max(Br), lse_hi(Br), lse_lo(Br);
    Buffer<double> row_sum(Br);
    Buffer<int64_t> visible(Br);

    // The score tile of queries [i0, i0 + rows) × keys [j0, j0 + cols): S = (scale·Q)·Kᵀ (the
    // block's queries are scaled once, in q_scaled), and the additions the kernels apply on top.
    auto score_tile = [&](int64_t bh, int64_t i0, size_t rows, int64_t j0, size_t cols) {
      const int64_t b = bh / Hq, h = bh % Hq;
      gemm(rows, cols, Dqk, {q_scaled.data(), Dqk}, {kt_packed + to_size(j0) * Dqk, W, Dqk * W},
           {scores.data(), Bc}, false);
      ScoreTile t{scores.data(), Bc, rows, cols};
      if (masked) {
        fill_mask_tile(masks, b, h, i0, rows, j0, cols, bias.data(), Bc);
        t.bias = bias.data();
      }
      if (!causal_block_open(p, i0, j0 + static_cast<int64_t>(cols))) {
        fill_visible(p, i0, rows, j0, visible.data());
        t.visible = visible.data();
      }
      if (dropout) {
        fill_dropout_tile(p, bh, i0, rows, j0, cols, factors.data(), Bc);
        t.dropout = factors.data();
      }
      return t;
    };

    auto run_task = [&](int64_t task) {
      const int64_t bh = task / query_blocks, kv = (bh / Hq) * Hkv + (bh % Hq) / p.group_size();
      const int64_t i0 = (task % query_blocks) * static_cast<int64_t>(Br);
      const size_t rows = std::min<size_t>(Br, to_size(L - i0));
      const int64_t i_last = i0 + static_cast<int64_t>(rows) - 1;
      if (!shared_packs && kv != packed_kv) {
        pack_kv_head(kv, own_kt.data(), own_v.data());
        packed_kv = kv;
      }
      std::fill(row_max.data(), row_max.data() + rows, neg_inf);
      std::fill(row_sum.data(), row_sum.data() + rows, 0.0);
      std::fill(out.data(), out.data() + rows * dv_padded, 0.0f);
      const int64_t b = bh / Hq, h = bh % Hq;
      for (size_t r = 0; r < rows; ++r) {
        const float* q = a.query.row(b, h, i0 + static_cast<int64_t>(r));
        for (size_t e = 0; e < Dqk; ++e) q_scaled[r * Dqk + e] = static_cast<float>(p.scale) * q[e];
      }

      // 2a. The online softmax over the key blocks; causality ends the walk at the last key
      // any row of this block can see (keys_seen), trimming the last block to it.
      const int64_t keys_seen = p.causal == Causal::none ? S : p.causal_limit(i_last);
      for (int64_t j0 = 0; j0 < keys_seen; j0 += static_cast<int64_t>(Bc)) {
        const size_t cols = std::min<size_t>(Bc, to_size(keys_seen - j0));
        const ScoreTile t = score_tile(bh, i0, rows, j0, cols);
        online_softmax_tile(t, row_max.data(), row_sum.data(), out.data(), dv_padded, Dv);
        gemm(rows, Dv, cols, {scores.data(), Bc}, {v_packed + to_size(j0) * W, W, to_size(S) * W},
             {out.data(), dv_padded}, true);
      }

      // 2b. O = O / l and logsumexp = m + log l (in double: see attention.h). A row that saw
      // nothing has l = 0 (its scores were all −inf): O = 0, logsumexp = −inf. A NaN score left
      // l = NaN (whatever m is), so O and logsumexp are NaN. Otherwise l >= 1 (the maximum's
      // own term).
      for (size_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + static_cast<int64_t>(r);
        float* o = a.output.row(b, h, i);
        double& lse = *a.logsumexp.row(b, h, i);
        if (row_sum[r] == 0.0) {
          lse = -std::numeric_limits<double>::infinity();
          std::fill(o, o + Dv, 0.0f);  // every output row is written here (attention.cpp relies on it)
          continue;
        }
        lse = static_cast<double>(row_max[r]) + std::log(row_sum[r]);
        const float inv_sum = static_cast<float>(1.0 / row_sum[r]);
        for (size_t c = 0; c < Dv; ++c) o[c] = out[r * dv_padded + c] * inv_sum;
      }

      // 2c. The weights, only when asked: P = exp((s − m) − log l) ∘ dropout, block by block, from
      // m and l themselves rather than their sum logsumexp, whose double may have lost log l
      // (tiles.h). A row that saw nothing gets the kernels' mark for P = 0 and a NaN row NaN
      // (its m may be +inf, which is that mark), as split_logsumexp gives them.
      if (!need_weights) return;
      for (size_t r = 0; r < rows; ++r) {
        const double lse = *a.logsumexp.row(b, h, i0 + static_cast<int64_t>(r));
        if (std::isnan(lse) || row_sum[r] == 0.0) {
          split_logsumexp(lse, lse_hi[r], lse_lo[r]);
        } else {
          lse_hi[r] = row_max[r];
          lse_lo[r] = static_cast<float>(std::log(row_sum[r]));
        }
      }
      for (int64_t j0 = 0; j0 < keys_seen; j0 += static_cast<int64_t>(Bc)) {
        const size_t cols = std::min<size_t>(Bc, to_size(keys_seen - j0));
        const ScoreTile t = score_tile(bh, i0, rows, j0, cols);
        probabilities_tile(t, lse_hi.data(), lse_lo.data(), nullptr, nullptr, nullptr);
        for (size_t r = 0; r < rows; ++r)
          std::copy_n(scores.data() + r * Bc, cols, a.weights.row(b, h, i0 + static_cast<int64_t>(r)) + j0);
      }
    };

    if (!shared_packs) {
#pragma omp for schedule(dynamic)
      for (int64_t task = 0; task < tasks; ++task) run_task(task);
    } else {
      // A kv head's tasks are consecutive: its query heads (a GQA group) × their query blocks.
      const int64_t tasks_per_kv = p.group_size() * query_blocks;
      for (int64_t kv = 0; kv < B * Hkv; ++kv) {
#pragma omp single
        pack_kv_head(kv, shared_kt.data(), shared_v.data());  // O(S·d), against O(L·S·d) of work
#pragma omp for schedule(dynamic)
        for (int64_t task = kv * tasks_per_kv; task < (kv + 1) * tasks_per_kv; ++task) run_task(task);
      }
    }
  }
}

}  // namespace mha::attention::detail
