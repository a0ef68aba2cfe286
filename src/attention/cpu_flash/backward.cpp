// cpu_flash backward: the probabilities recomputed from logsumexp, one block of queries at a time.
//
// With s = scale·q·k + masks, P = exp(s − logsumexp) (the forward's softmax), Z the dropout
// factors, O = (P∘Z)·V and upstream dO:
//   dV = (P∘Z)ᵀ·dO
//   dP = (dO·Vᵀ)∘Z
//   dS = P∘(dP − D),  D_i = Σ_j P_ij dP_ij  (= dO_i·O_i in exact arithmetic)
//   dQ = scale·dS·K,  dK = scale·dSᵀ·Q
//
// D_i is summed from the very P and dP that dS then uses, as the reference does, and divided by
// Σ_j P_ij (1 up to the rounding of P): then Σ_j dS_ij = Σ_j P_ij dP_ij − D_i Σ_j P_ij cancels to
// rounding, and gradients that are exactly zero (a query that sees one key, a bias added to
// every key) come out zero or nearly. FlashAttention-2's dO_i·O_i would carry the forward's
// rounding of O into every dS_ij of the row (measured: up to 7× the float reference's error in
// dQ, and 1e-4 where the exact gradient is 0). Since D_i needs all of row i's keys before any
// dS_ij, each block of Br queries takes two passes over its keys:
//   pass A  S = Q·Kᵀ, dP = dO·Vᵀ; P, dP∘Z and D kept for the whole row block (Br × S floats)
//   pass B  dS = P∘(dP − D); dVᵀ += dOᵀ·(P∘Z), dKᵀ += Qᵀ·dS, dQ += dS·K
// still five matrix products per tile, and O(Br·S) scratch per thread, never L×S.
//
// Long key sequences (S > kLongKeys, tiles.h) would make that O(Br·S) scratch and the per-task
// dKᵀ, dVᵀ large, so the keys are taken in segments of kBackwardKeySegment: a first sweep over
// the segments runs pass A only, to sum D's two sums over all keys (the same tiles in the same
// order, so the same D); the second sweep runs passes A and B segment by segment, each task
// adding its segment's part of dQ. Seven products per tile instead of five, O(d·segment) memory.
//
// Parallel tasks: (b, kv head, chunk of that kv head's (query head, query block) pairs). The query
// heads of a GQA group are in the same task, so the task's dK, dV accumulators gather them
// without atomics; each chunk owns its dQ rows and writes its own partial dKᵀ, dVᵀ, summed
// afterwards in chunk order. The number of chunks depends on the shape only (more than one only
// when B·Hkv is small; the whole call's Hkv for a block of heads), so the result is bitwise the
// same for any number of threads, and for a block of heads the whole call's.
//
// The products that read a tile transposed (dV += Pᵀ·dO, dK += dSᵀ·Q) are computed transposed,
// dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS: P and dS then enter as the panel operand B exactly as they are
// stored, and dOᵀ, Qᵀ are transposed once per head (O(L·d)) instead of every tile (O(L·S)).
#include <cmath>
#include <limits>

#include "cpu_flash.h"
#include "tiles.h"

namespace mha::attention::detail {

using namespace cpu_flash;

namespace {

// dst (cols × rows, row stride ld) = srcᵀ, src rows × cols (row stride src_ld).
void transpose(const float* src, size_t src_ld, size_t rows, size_t cols, float* dst, size_t ld) {
  constexpr size_t kBlock = 32;  // cache-sized squares
  for (size_t r0 = 0; r0 < rows; r0 += kBlock)
    for (size_t c0 = 0; c0 < cols; c0 += kBlock)
      for (size_t r = r0; r < std::min(rows, r0 + kBlock); ++r)
        for (size_t c = c0; c < std::min(cols, c0 + kBlock); ++c) dst[c * ld + r] = src[r * src_ld + c];
}

// At least kMinTasks tasks when the shape allows, so that a call with few (b, kv head) pairs
// still keeps every core busy; fixed by the shape alone.
constexpr int64_t kMinTasks = 8;

struct Chunks {
  int64_t count = 0;           // chunks per (b, kv head)
  int64_t items_per_chunk = 0;  // (query head, query block) pairs per chunk
};

Chunks split_items(int64_t kv_pairs, int64_t items) {
  if (items == 0) return {};
  int64_t wanted = kv_pairs >= kMinTasks ? 1 : (kMinTasks + kv_pairs - 1) / kv_pairs;
  wanted = std::min(wanted, items);
  Chunks chunks;
  chunks.items_per_chunk = (items + wanted - 1) / wanted;
  chunks.count = (items + chunks.items_per_chunk - 1) / chunks.items_per_chunk;
  return chunks;
}

}  // namespace

void cpu_flash_backward(const Problem& p, const Masks<float>& masks, const BackwardArgs<float>& a) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  // grad_output (B, Hq, L, Dv)  logsumexp (B, Hq, L), rows at any strides; the output is read
  // only by a block of the rows' keys (D = dO·O, see the loop); the gradients are added to (they
  // start at 0, or hold what a caller accumulates into).
  const int64_t B = p.batch, Hq = p.query_heads, Hkv = p.kv_heads, L = p.query_len, S = p.key_len;
  const int64_t G = p.group_size();
  const size_t Dqk = to_size(p.qk_head_dim), Dv = to_size(p.v_head_dim);
  if (B * Hq * L == 0 || S == 0) return;

  const size_t W = panel_width();
  const size_t Br = kBackwardQueries, Bc = kBackwardKeys;
  const float scale = static_cast<float>(p.scale);
  constexpr auto uninitialized = Buffer<float>::Uninitialized;  // every element written before use

  // Key segments: all keys at once, or kBackwardKeySegment at a time for long ones (see above).
  const bool two_sweeps = S > kLongKeys;
  const size_t segment = two_sweeps ? kBackwardKeySegment : to_size(S);
  const int64_t segments = (S + static_cast<int64_t>(segment) - 1) / static_cast<int64_t>(segment);
  const size_t segment_padded = round_up(segment, W), dqk_padded = round_up(Dqk, W);

  // Tasks: (b, kv head, chunk of that kv head's (query head, query block) pairs). Rows that span
  // a segment's keys (the P, dS row blocks and the dKᵀ, dVᵀ accumulators) have a stride off a
  // power of two: P and dS are the B operand of dVᵀ, dKᵀ, whose panel the micro-kernel keeps in
  // L1, and rows 2^k bytes apart would all fall in the same L1 cache set.
  const size_t key_stride = segment_padded + 16;
  const int64_t query_blocks = (L + static_cast<int64_t>(Br) - 1) / static_cast<int64_t>(Br);
  // Chunks from the whole call's (b, kv head) pairs (Options::positions): a block of heads sums
  // its gradients in the very order the whole call does.
  const Chunks chunks = split_items(B * (p.whole.heads / G), G * query_blocks);
  const int64_t tasks = B * Hkv * chunks.count;
  const size_t kvt_size = (Dqk + Dv) * key_stride;  // dKᵀ then dVᵀ of one task
  // When a kv head is split into chunks, each chunk's dKᵀ, dVᵀ, summed afterwards in chunk order.
  Buffer<float> kvt_partial(chunks.count > 1 ? to_size(tasks) * kvt_size : 0, uninitialized);
  // Two sweeps: every query row's Σ_j P dP and Σ_j P, summed over all segments by the first.
  Buffer<double> all_row_dot(two_sweeps ? to_size(B * Hq * L) : 0), all_row_mass(two_sweeps ? to_size(B * Hq * L) : 0);
  const bool masked = has_masks(masks), dropout = p.dropout_p > 0.0, partial = p.partial_keys();
#pragma omp parallel
  {
    // The B operands of the task's kv head over the segment, in panels: Kᵀ (panels of keys) for
    // S = Q·Kᵀ, Vᵀ (panels of keys) for dP = dO·Vᵀ, K (panels of Dqk columns) for dQ += dS·K;
    // and the task's accumulators. All O(segment·d) per thread.
    Buffer<float> kt_packed(segment_padded * Dqk, uninitialized), vt_packed(segment_padded * Dv, uninitialized);
    Buffer<float> k_packed(dqk_padded * segment, uninitialized), kvt(kvt_size);
    float* dkt = kvt.data();
    float* dvt = dkt + Dqk * key_stride;
    // One block of query rows × the segment's keys (O(Br·segment) per thread), and the block's A
    // operands: scale·Q for S = Q·Kᵀ, Qᵀ and dOᵀ (row stride Br) for dKᵀ += Qᵀ·dS and dVᵀ += dOᵀ·P.
    const size_t row_block = Br * key_stride;
    Buffer<float> probs(row_block), dprobs(row_block), bias(masked ? row_block : 0), factors(dropout ? row_block : 0);
    Buffer<float> q_scaled(Br * Dqk, uninitialized), qt(Dqk * Br), dot(Dv * Br);
    Buffer<float> dq(Br * dqk_padded), delta(Br), lse_hi(Br), lse_lo(Br), renorm(Br);
    Buffer<double> row_dot(Br), row_mass(Br);
    Buffer<int64_t> visible(Br);
    auto fully_masked = [&](size_t r) { return lse_hi[r] == std::numeric_limits<float>::infinity(); };  // split_logsumexp

    for (int sweep = two_sweeps && !partial ? 0 : 1; sweep < 2; ++sweep) {
      const bool gradients = sweep == 1;  // sweep 0 only sums D's parts (two sweeps)
      for (int64_t seg = 0; seg < segments; ++seg) {
        const int64_t s0 = seg * static_cast<int64_t>(segment);
        const size_t seg_keys = std::min<size_t>(segment, to_size(S - s0));
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; ++task) {
          const int64_t kv = task / chunks.count, chunk = task % chunks.count;  // kv = b·Hkv + kv head
          const int64_t b = kv / Hkv;
          const float* k_seg = a.key.row(b, kv % Hkv, s0);
          const size_t k_ld = to_size(a.key.stride_row);
          pack_transposed(k_seg, k_ld, seg_keys, Dqk, kt_packed.data());
          pack_transposed(a.value.row(b, kv % Hkv, s0), to_size(a.value.stride_row), seg_keys, Dv, vt_packed.data());
          if (gradients) {
            pack_rows(k_seg, k_ld, seg_keys, Dqk, k_packed.data());
            std::fill(kvt.data(), kvt.data() + kvt_size, 0.0f);
          }
          const int64_t first_item = chunk * chunks.items_per_chunk;
          const int64_t end_item = std::min(G * query_blocks, first_item + chunks.items_per_chunk);

          for (int64_t item = first_item; item < end_item; ++item) {
            const int64_t h = (kv % Hkv) * G + item / query_blocks, bh = b * Hq + h;
            const int64_t i0 = (item % query_blocks) * static_cast<int64_t>(Br);
            const size_t rows = std::min<size_t>(Br, to_size(L - i0));
            const size_t row0 = to_size(bh * L + i0);  // index of query i0 in the row totals
            // Keys of the segment these queries see: all, or up to the causal limit of the last one.
            const int64_t keys_seen = p.causal == Causal::none ? S : p.causal_limit(i0 + static_cast<int64_t>(rows) - 1);
            const int64_t s_end = std::min(s0 + static_cast<int64_t>(seg_keys), keys_seen);
            if (s_end <= s0) continue;
            auto block_cols = [&](int64_t j0) { return std::min<size_t>(Bc, to_size(s_end - j0)); };
            const float* q_block = a.query.row(b, h, i0);
            const float* dout_block = a.grad_output.row(b, h, i0);
            const size_t q_ld = to_size(a.query.stride_row), dout_ld = to_size(a.grad_output.stride_row);
            auto lse_of = [&](size_t r) { return *a.logsumexp.row(b, h, i0 + static_cast<int64_t>(r)); };
            for (size_t r = 0; r < rows; ++r)
              for (size_t e = 0; e < Dqk; ++e) q_scaled[r * Dqk + e] = scale * q_block[r * q_ld + e];
            for (size_t r = 0; r < rows; ++r) split_logsumexp(lse_of(r), lse_hi[r], lse_lo[r]);

            // Pass A: P and dP∘Z for every key block, and the sums that make D. The scores are
            // those of the forward, (scale·Q)·Kᵀ with the same products in the same order. Tile
            // columns are counted from the segment's first key (c0 = j0 − s0).
            // The sums go to the whole-row totals in the first of two sweeps; otherwise to this
            // block's own (used with one sweep, already summed by the first with two).
            std::fill(row_dot.data(), row_dot.data() + rows, 0.0);
            std::fill(row_mass.data(), row_mass.data() + rows, 0.0);
            const bool totals = two_sweeps && !gradients;
            double* sum_dot = totals ? all_row_dot.data() + row0 : row_dot.data();
            double* sum_mass = totals ? all_row_mass.data() + row0 : row_mass.data();
            for (int64_t j0 = s0; j0 < s_end; j0 += static_cast<int64_t>(Bc)) {
              const size_t cols = block_cols(j0), c0 = to_size(j0 - s0);
              gemm(rows, cols, Dqk, {q_scaled.data(), Dqk}, {kt_packed.data() + c0 * Dqk, W, Dqk * W},
                   {probs.data() + c0, key_stride}, false);
              gemm(rows, cols, Dv, {dout_block, dout_ld}, {vt_packed.data() + c0 * Dv, W, Dv * W},
                   {dprobs.data() + c0, key_stride}, false);
              ScoreTile t{probs.data() + c0, key_stride, rows, cols};
              if (masked) {
                fill_mask_tile(masks, b, h, i0, rows, j0, cols, bias.data() + c0, key_stride);
                t.bias = bias.data() + c0;
              }
              if (!causal_block_open(p, i0, j0 + static_cast<int64_t>(cols))) {
                fill_visible(p, i0, rows, j0, visible.data());
                t.visible = visible.data();
              }
              if (dropout) {
                fill_dropout_tile(p, bh, i0, rows, j0, cols, factors.data() + c0, key_stride);
                t.dropout = factors.data() + c0;
              }
              probabilities_tile(t, lse_hi.data(), lse_lo.data(), dprobs.data() + c0, sum_dot, sum_mass);
            }
            if (!gradients) continue;
            // D = Σ_j P dP / Σ_j P: P = exp(s − lse) sums to 1 only up to the rounding of lse and
            // of each exp; dividing by the actual sum makes Σ_j dS_ij = Σ_j P dP − D·Σ_j P vanish
            // to rounding whatever that sum is (a fully masked row has both sums 0: D = 0).
            const double* dots = two_sweeps ? all_row_dot.data() + row0 : row_dot.data();
            const double* masses = two_sweeps ? all_row_mass.data() + row0 : row_mass.data();
            for (size_t r = 0; r < rows; ++r) delta[r] = masses[r] > 0 ? static_cast<float>(dots[r] / masses[r]) : 0.0f;
            // A block of the rows' keys (Problem::partial_keys) sees only part of each row: D_i =
            // dO_i·O_i from the whole call's output, and P is exp(s − lse) as it stands.
            if (partial) {
              for (size_t r = 0; r < rows; ++r) {
                const float* o = a.output.row(b, h, i0 + static_cast<int64_t>(r));
                double d = 0;
                for (size_t e = 0; e < Dv; ++e) d += static_cast<double>(dout_block[r * dout_ld + e]) * o[e];
                delta[r] = static_cast<float>(d);
              }
            }
            // Rows whose logsumexp is too large to rebuild P exactly use P / Σ_j P (tiles.h).
            bool renormalizing = false;
            for (size_t r = 0; r < rows && !partial; ++r) {
              const bool renormalize =
                  logsumexp_needs_renormalizing(lse_of(r)) && masses[r] > 0;
              renorm[r] = renormalize ? static_cast<float>(1.0 / masses[r]) : 1.0f;
              renormalizing = renormalizing || renormalize;
            }

            // Pass B: dS, then dVᵀ += dOᵀ·(P∘Z), dKᵀ += Qᵀ·dS, dQ += dS·K block by block.
            // A fully masked row (P = 0, dS = 0) takes no part: its columns of Qᵀ and dOᵀ are zeroed
            // and its dQ left 0, so that an Inf or NaN in its q, grad_output or a key cannot make
            // 0·inf = NaN in any gradient (attention.h: such rows have gradient 0).
            transpose(q_block, q_ld, rows, Dqk, qt.data(), Br);
            transpose(dout_block, dout_ld, rows, Dv, dot.data(), Br);
            for (size_t r = 0; r < rows; ++r) {
              if (!fully_masked(r)) continue;
              for (size_t d = 0; d < Dqk; ++d) qt[d * Br + r] = 0.0f;
              for (size_t d = 0; d < Dv; ++d) dot[d * Br + r] = 0.0f;
            }
            std::fill(dq.data(), dq.data() + rows * dqk_padded, 0.0f);
            for (int64_t j0 = s0; j0 < s_end; j0 += static_cast<int64_t>(Bc)) {
              const size_t cols = block_cols(j0), c0 = to_size(j0 - s0);
              float* block_probs = probs.data() + c0;
              float* block_ds = dprobs.data() + c0;
              score_gradients_tile(block_probs, block_ds, key_stride, rows, cols, delta.data(),
                                   dropout ? factors.data() + c0 : nullptr, renormalizing ? renorm.data() : nullptr);
              gemm(Dv, cols, rows, {dot.data(), Br}, {block_probs, key_stride, W}, {dvt + c0, key_stride}, true);
              gemm(Dqk, cols, rows, {qt.data(), Br}, {block_ds, key_stride, W}, {dkt + c0, key_stride}, true);
              gemm(rows, Dqk, cols, {block_ds, key_stride}, {k_packed.data() + c0 * W, W, seg_keys * W},
                   {dq.data(), dqk_padded}, true);
            }
            // These query rows belong to this task alone (within the segment): dQ += scale·dS·K,
            // segments in order.
            for (size_t r = 0; r < rows; ++r) {
              if (fully_masked(r)) continue;
              float* grad_q = a.grad_query.row(b, h, i0 + static_cast<int64_t>(r));
              for (size_t d = 0; d < Dqk; ++d) grad_q[d] += scale * dq[r * dqk_padded + d];
            }
          }
          if (!gradients) continue;

          // The task's dKᵀ, dVᵀ over the segment: the whole gradient of its kv head's keys there
          // (dK = scale·dKᵀᵀ, dV = dVᵀᵀ), or one chunk's part of it.
          if (chunks.count == 1) {
            for (size_t j = 0; j < seg_keys; ++j) {
              float* dk = a.grad_key.row(b, kv % Hkv, s0 + static_cast<int64_t>(j));
              float* dv = a.grad_value.row(b, kv % Hkv, s0 + static_cast<int64_t>(j));
              for (size_t d = 0; d < Dqk; ++d) dk[d] += scale * dkt[d * key_stride + j];
              for (size_t d = 0; d < Dv; ++d) dv[d] += dvt[d * key_stride + j];
            }
          } else {
            std::copy_n(kvt.data(), kvt_size, kvt_partial.data() + to_size(task) * kvt_size);
          }
        }

        // With chunks: dK += scale·Σ_chunk dKᵀᵀ and dV += Σ_chunk dVᵀᵀ over the segment, summed in
        // chunk order (after the loop above: its end is a barrier) into the first chunk's part.
        if (!gradients || chunks.count == 1) continue;
#pragma omp for schedule(static)
        for (int64_t kv = 0; kv < B * Hkv; ++kv) {
          float* sum = kvt_partial.data() + to_size(kv * chunks.count) * kvt_size;
          for (int64_t chunk = 1; chunk < chunks.count; ++chunk) {
            const float* part = kvt_partial.data() + to_size(kv * chunks.count + chunk) * kvt_size;
            for (size_t d = 0; d < Dqk + Dv; ++d)
              for (size_t j = 0; j < seg_keys; ++j) sum[d * key_stride + j] += part[d * key_stride + j];
          }
          for (size_t j = 0; j < seg_keys; ++j) {
            float* dk = a.grad_key.row(kv / Hkv, kv % Hkv, s0 + static_cast<int64_t>(j));
            float* dv = a.grad_value.row(kv / Hkv, kv % Hkv, s0 + static_cast<int64_t>(j));
            for (size_t d = 0; d < Dqk; ++d) dk[d] += scale * sum[d * key_stride + j];
            for (size_t d = 0; d < Dv; ++d) dv[d] += sum[(Dqk + d) * key_stride + j];
          }
        }
      }
    }
  }
}

}  // namespace mha::attention::detail
