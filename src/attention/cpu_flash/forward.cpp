// cpu_flash forward: FlashAttention-2's loop, one task per block of query rows.
//
//   for each block of Br queries (a task):
//     m = −inf, l = 0, O = 0        (per row; with a sink: m = sink, l = 1)
//     for each block of Bc keys the block can see:
//       S = scale·Q·Kᵀ + masks                                   (Br × Bc, never more)
//       m' = max(m, rowmax S);  P = exp(S − m');  l = e^(m − m')·l + rowsum P
//       O = e^(m − m')·O + (P ∘ dropout)·V
//     O /= l;  logsumexp = m + log l
//
// Why it is exact: after any prefix of key blocks, O = Σ_j exp(s_j − m)·z_j·v_j and
// l = Σ_j exp(s_j − m) for the current m; multiplying both by e^(m − m') re-bases them on the
// new maximum, so the final O / l is Σ_j softmax(s)_j·z_j·v_j whatever the order of blocks.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>

#include "blocks.h"
#include "cpu_flash.h"
#include "mha/core/bf16_gemm.h"

namespace mha::attention::detail {

using namespace cpu_flash;

namespace {

// The kv head's B operands over its keys [first, first + count), in one of two forms:
//   float panels (panel_gemm): Kᵀ (Dqk × count, panels of keys) for S = Q·Kᵀ and V (count × Dv,
//     panels of value columns) for O += P·V; a tile's Kᵀ columns are taken from inside a panel
//     when they start there (packed_columns). Float operands, or half ones widened as packed.
//   bf16 pairs (bf16_gemm), for bfloat16 operands where the CPU has AVX512_BF16: Kᵀ and V in the
//     pair layout VDPBF16PS reads, pairs over Dqk and over the keys. For float16 operands on AMX
//     tiles the split products (forward_on_split): Kᵀ split to split_depth(Dqk) rows (kt_ld keys
//     apart), V as two packs, V_hi and V_lo.
// `first` is a walk's start (walk_start).
struct PackedKv {
  float* kt = nullptr;
  float* v = nullptr;
  int64_t first = 0, count = 0;
  bfloat16* kt_pairs = nullptr;
  bfloat16* v_pairs = nullptr;
  size_t kt_ld = 0;          // Kᵀ's pair rows are 2·kt_ld bfloat16s apart
  bfloat16* v_lo = nullptr;  // split: V's lo pack (v_pairs holds its hi)

  bool pairs() const { return kt_pairs != nullptr; }
};

// One thread's scratch for query blocks of at most Br rows: the score tile and its additions
// (Br × Bc, row stride Bc), the output accumulator and the per-row state.
struct Scratch {
  size_t dv_padded, q_depth;  // q_depth: Q's row stride on bf16 pairs (split: split_depth(Dqk))
  Buffer<float> scores, bias, factors, out, q_scaled, lse_hi, lse_lo;
  // With bf16 pairs: Q (row stride q_depth) and P; split, P's hi and then its lo tile.
  Buffer<bfloat16> q_pairs, p_pairs;
  Buffer<double> row_max, row_sum;  // the online softmax's m and l (online_softmax_tile)
  Buffer<int64_t> first, end;
  std::vector<KeyRange> visible;  // each row's key range

  Scratch(const Problem& p, bool masked, size_t Dqk, size_t dv_padded, size_t q_depth, size_t p_tiles)
      : dv_padded(dv_padded),
        q_depth(q_depth),
        scores(kForwardQueries * kForwardKeys),
        bias(masked ? kForwardQueries * kForwardKeys : 0),
        factors(p.dropout() ? kForwardQueries * kForwardKeys : 0),
        out(kForwardQueries * dv_padded),
        q_scaled(kForwardQueries * Dqk),
        lse_hi(kForwardQueries),
        lse_lo(kForwardQueries),
        q_pairs(kForwardQueries * q_depth),
        p_pairs(p_tiles * kForwardQueries * kForwardKeys),
        row_max(kForwardQueries),
        row_sum(kForwardQueries),
        first(kForwardQueries),
        end(kForwardQueries),
        visible(kForwardQueries) {}

  TileScratch tile() {
    return {bias.size() ? bias.data() : nullptr, factors.size() ? factors.data() : nullptr, nullptr, first.data(),
            end.data()};
  }
};

// Queries [i0, i0 + rows) of (b, h): the online softmax over the key blocks they see, then the
// output and logsumexp rows, then (when asked) the weights.
template <class T, class Kv>
void forward_query_block(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a,
                         const PackedKv& kv, Scratch& s, int64_t b, int64_t h, int64_t i0, size_t rows) {
  const size_t Dqk = to_size(p.qk_head_dim), Dv = to_size(p.v_head_dim);
  const size_t W = panel_width(), Bc = kForwardKeys, dv_padded = s.dv_padded;
  // The row state before any key: m = −inf, l = 0, or the sink's logit with its term, m = sink, l = 1.
  const float sink = static_cast<float>(a.sinks.of(b, h));
  std::fill(s.row_max.data(), s.row_max.data() + rows, sink);
  std::fill(s.row_sum.data(), s.row_sum.data() + rows, sink == -std::numeric_limits<float>::infinity() ? 0.0 : 1.0);
  std::fill(s.out.data(), s.out.data() + rows * dv_padded, 0.0f);
  // The A operand of S = Q·Kᵀ: scale·Q in float, scaled once for every key block; or, on bf16
  // pairs, Q itself in rows of even stride, or split (the kernels then scale each score as they
  // read it: scale·Q would not be a bfloat16).
  const bool pairs = kv.pairs(), split = pairs && std::is_same_v<T, float16>;
  const size_t dq_pairs = s.q_depth;
  const size_t depth = split ? dq_pairs : Dqk;  // of S = Q·Kᵀ
  for (size_t r = 0; r < rows; ++r) {
    const T* q = a.query.row(b, h, i0 + static_cast<int64_t>(r));
    if constexpr (!std::is_same_v<T, float>) {
      if (pairs) {
        if constexpr (std::is_same_v<T, bfloat16>)
          std::copy_n(q, Dqk, s.q_pairs.data() + r * dq_pairs);
        else
          bf16_gemm::split_a(q, Dqk, s.q_pairs.data() + r * dq_pairs);
        continue;
      }
    }
    for (size_t e = 0; e < Dqk; ++e) s.q_scaled[r * Dqk + e] = static_cast<float>(p.scale) * widen(q[e]);
  }
  for (size_t r = 0; r < rows; ++r) s.visible[r] = p.visible_keys(b, i0 + static_cast<int64_t>(r));
  // Under a narrow window each group of kBandRows rows multiplies only the columns it sees, in both
  // products (for_each_band).
  const bool banded = narrow_window(p);
  const size_t step = key_step();
  // The score tile of keys [j0, j0 + cols): S = (scale·Q)·Kᵀ on each group's band (zero beside it,
  // where the tile's edges hide every column), and the additions the kernels apply.
  auto score_tile = [&](int64_t j0, size_t cols) {
    for_each_band(banded, s.visible.data(), rows, j0, cols, step, [&](const Band& g) {
      const size_t c = to_size(j0 - kv.first) + g.first_col, width = g.end_col - g.first_col;
      float* scores = s.scores.data() + g.first_row * Bc + g.first_col;
      if (width > 0 && pairs) {
        bf16_gemm::multiply(g.rows, width, depth, s.q_pairs.data() + g.first_row * dq_pairs, dq_pairs,
                            kv.kt_pairs + 2 * c, kv.kt_ld, scores, Bc, false);
      } else if (width > 0) {
        multiply(g.rows, width, Dqk, {s.q_scaled.data() + g.first_row * Dqk, Dqk}, packed_columns(kv.kt, Dqk, c, W),
                 {scores, Bc}, false);
      }
      fill_beside_band(g, s.scores.data(), Bc, cols);
    });
    ScoreTile t = make_tile(p, additions, s.tile(), s.scores.data(), Bc, b, rows, j0, cols,
                            [&](size_t r) { return std::pair{h, i0 + static_cast<int64_t>(r)}; }, s.visible.data());
    if (pairs) {
      t.scale = static_cast<float>(p.scale);  // the kernels scale q·k as they read it
      t.probs_bf16 = s.p_pairs.data();        // and write P in bfloat16 for P·V (split: hi and lo)
      if (split) t.probs_bf16_lo = s.p_pairs.data() + kForwardQueries * Bc;
    }
    return t;
  };
  // O += P·V over each group's band (P is 0 beside it). On bf16 pairs P is the online softmax's
  // bfloat16 copy, rounded as PyTorch's CPU kernel multiplies it (the row sums l keep the float P).
  // Split: P_hi·V_hi + P_lo·V_hi + P_hi·V_lo, the float P as P_hi + P_lo (within 2⁻¹⁶·P) and V
  // exactly; P_lo·V_lo, at most 2⁻¹⁶·P·|v|, left out (forward_on_split).
  auto add_values = [&](int64_t j0, size_t cols) {
    for_each_band(banded, s.visible.data(), rows, j0, cols, step, [&](const Band& g) {
      const size_t key = to_size(j0 - kv.first) + g.first_col, width = g.end_col - g.first_col;
      float* out = s.out.data() + g.first_row * dv_padded;
      if (width > 0 && split) {
        const bfloat16* p_hi = s.p_pairs.data() + g.first_row * Bc + g.first_col;
        const bfloat16* p_lo = p_hi + kForwardQueries * Bc;
        for (const auto& [p_part, v] :
             {std::pair{p_hi, kv.v_pairs}, std::pair{p_lo, kv.v_pairs}, std::pair{p_hi, kv.v_lo}})
          bf16_gemm::multiply(g.rows, Dv, width, p_part, Bc, v + key * Dv, Dv, out, dv_padded, true);
      } else if (width > 0 && pairs) {
        bf16_gemm::multiply(g.rows, Dv, width, s.p_pairs.data() + g.first_row * Bc + g.first_col, Bc,
                            kv.v_pairs + key * Dv, Dv, out, dv_padded, true);
      } else if (width > 0) {
        multiply(g.rows, Dv, width, {s.scores.data() + g.first_row * Bc + g.first_col, Bc},
                 {kv.v + key * W, W, to_size(kv.count) * W}, {out, dv_padded}, true);
      }
    });
  };
  // The key blocks some row of the block sees, the last one trimmed to the last such key.
  const KeyRange keys = p.visible_keys(b, i0, i0 + static_cast<int64_t>(rows));
  auto for_each_key_block = [&](auto&& step) {
    for (int64_t j0 = walk_start(keys); j0 < keys.end; j0 += static_cast<int64_t>(Bc))
      step(j0, std::min<size_t>(Bc, to_size(keys.end - j0)));
  };

  // 1. The online softmax over the key blocks.
  for_each_key_block([&](int64_t j0, size_t cols) {
    const ScoreTile t = score_tile(j0, cols);
    online_softmax_tile(t, s.row_max.data(), s.row_sum.data(), s.out.data(), dv_padded, Dv);
    add_values(j0, cols);
  });

  // 2. O = O / l and logsumexp = m + log l (in double: see attention.h). A row that saw
  // nothing has l = 0 (its scores were all −inf): O = 0, logsumexp = −inf (with a sink, l = 1:
  // O = 0, logsumexp = the sink). A NaN score left
  // l = NaN (whatever m is), so O and logsumexp are NaN. Otherwise l >= 1 (the maximum's
  // own term).
  for (size_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + static_cast<int64_t>(r);
    T* o = a.output.row(b, h, i);
    double& lse = *a.logsumexp.row(b, h, i);
    if (s.row_sum[r] == 0.0) {
      lse = -std::numeric_limits<double>::infinity();
      std::fill(o, o + Dv, T{});  // every output row is written here (attention.cpp relies on it)
      continue;
    }
    lse = s.row_max[r] + std::log(s.row_sum[r]);
    const float inv_sum = static_cast<float>(1.0 / s.row_sum[r]);
    float* row = s.out.data() + r * dv_padded;
    if constexpr (std::is_same_v<T, float>) {
      for (size_t c = 0; c < Dv; ++c) o[c] = row[c] * inv_sum;
    } else {  // the vector conversion (mha/core/half.h), as narrow<T> rounds
      for (size_t c = 0; c < Dv; ++c) row[c] *= inv_sum;
      convert(row, o, Dv);
    }
  }

  // 3. The weights, only when asked: P = exp(s − m) ∘ dropout · (1 / l), block by block, from m
  // and l themselves, the product in double rounded to float (as softmax divides by the sum: a
  // float exp(s − m − log l) would add log l's rounding; a half type's weights are the float
  // ones rounded once more, as every output of the half calls). A row that saw nothing gets the
  // kernels' mark for P = 0 and a NaN row NaN (its m may be +inf, which is that mark), as
  // split_logsumexp gives them.
  if (!a.weights.present()) return;
  for (size_t r = 0; r < rows; ++r) {
    const double lse = *a.logsumexp.row(b, h, i0 + static_cast<int64_t>(r));
    if (std::isnan(lse) || s.row_sum[r] == 0.0) {
      split_logsumexp(lse, s.lse_hi[r], s.lse_lo[r]);
      s.row_sum[r] = 1.0;  // from here on: the factor of the row's weights
    } else {
      split_logsumexp(s.row_max[r], s.lse_hi[r], s.lse_lo[r]);  // m, as a float and what it loses
      s.row_sum[r] = 1.0 / s.row_sum[r];
    }
  }
  for_each_key_block([&](int64_t j0, size_t cols) {
    const ScoreTile t = score_tile(j0, cols);
    probabilities_tile(t, s.lse_hi.data(), s.lse_lo.data(), nullptr, nullptr, nullptr);
    for (size_t r = 0; r < rows; ++r) {
      T* weights = a.weights.row(b, h, i0 + static_cast<int64_t>(r)) + j0;
      for (size_t c = 0; c < cols; ++c) weights[c] = narrow<T>(static_cast<float>(s.scores[r * Bc + c] * s.row_sum[r]));
    }
  });
}

}  // namespace

template <class T, class Kv>
void cpu_flash_forward(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  // output (B, Hq, L, Dv)  logsumexp (B, Hq, L)  weights (B, Hq, L, S), rows at any strides
  const int64_t B = p.batch, Hq = p.query_heads, Hkv = p.kv_heads, L = p.query_len, S = p.key_len;
  const size_t Dqk = to_size(p.qk_head_dim), Dv = to_size(p.v_head_dim);
  if (B * Hq * L == 0) return;

  const size_t W = panel_width();
  const size_t keys_padded = round_up(to_size(S), W);  // keys as columns of Kᵀ, whole panels
  const bool split = forward_on_split<T, Kv>();        // float16 on AMX tiles
  const bool pairs = forward_on_pairs<T, Kv>() || split;
  const size_t dv_padded = round_up(Dv, W);
  const int64_t Br = block_rows(p, kForwardQueries);

  // One task per (b, h, block of Br queries); tasks run in parallel, each writes only its rows.
  const QueryBlocks blocks(p, Br);
  const int64_t query_blocks = blocks.count();
  const int64_t tasks = B * Hq * query_blocks;
  // The packed kv head (PackedKv). Short keys: each thread packs the keys its task's walk reads
  // when they are not packed yet (consecutive tasks mostly share one kv head), those keys and up to
  // kPackAhead more (or as many as the walk, whichever is more) of the same sequence: a dense call
  // packs a kv head in a few growing steps, a sliding window the band it slides over (O(W·d) per
  // step, in cache) instead of the whole head. Long keys: one shared copy, the kv heads taken one
  // after another.
  const bool shared_packs = S > kLongKeys;
  auto kt_ld = [&](size_t keys) { return split ? split_width(keys) : keys; };  // Kᵀ's packed width
  const size_t q_depth = !pairs ? 0 : split ? bf16_gemm::split_depth(Dqk) : round_up(Dqk, 2);
  // The packs' sizes: float panels, or bf16 pairs (Kᵀ's pairs over Dqk, V's over the keys; split:
  // over split_depth(Dqk), and V's hi and lo).
  const size_t kt_size = pairs ? 0 : keys_padded * Dqk, v_size = pairs ? 0 : dv_padded * to_size(S);
  const size_t kt_pairs_size = pairs ? bf16_gemm::packed_size(split ? q_depth : Dqk, kt_ld(to_size(S))) : 0,
               v_pairs_size = pairs ? (split ? 2 : 1) * bf16_gemm::packed_size(to_size(S), Dv) : 0;
  auto buffers = [&](bool own) {  // a thread's own packs, or the shared ones
    const bool here = own != shared_packs;
    return std::tuple(Buffer<float>(here ? kt_size : 0, Buffer<float>::Uninitialized),
                      Buffer<float>(here ? v_size : 0, Buffer<float>::Uninitialized),
                      Buffer<bfloat16>(here ? kt_pairs_size : 0, Buffer<bfloat16>::Uninitialized),
                      Buffer<bfloat16>(here ? v_pairs_size : 0, Buffer<bfloat16>::Uninitialized));
  };
  auto view = [&](auto& packs) {
    auto& [kt, v, kt_pairs, v_pairs] = packs;
    return pairs ? PackedKv{nullptr, nullptr, 0, 0, kt_pairs.data(), v_pairs.data()} : PackedKv{kt.data(), v.data()};
  };
  auto shared = buffers(false);
  // Keys [first, first + count) of kv head kv (= b·Hkv + kv head) into `to` (bfloat16 or float16
  // keys and values, a KV cache's, widened to float here on float panels: the only float copy of
  // them is the pack).
  auto pack_kv_head = [&](int64_t kv, int64_t first, int64_t count, PackedKv& to) {
    const Kv* k = a.key.row(kv / Hkv, kv % Hkv, first);
    const Kv* v = a.value.row(kv / Hkv, kv % Hkv, first);
    if constexpr (std::is_same_v<Kv, bfloat16>) {
      if (pairs) {
        bf16_gemm::pack_b_transposed(k, to_size(a.key.stride_row), to_size(count), Dqk, to.kt_pairs);
        bf16_gemm::pack_b(v, to_size(a.value.stride_row), to_size(count), Dv, to.v_pairs);
      }
    } else if constexpr (std::is_same_v<Kv, float16>) {
      if (pairs) {
        bf16_gemm::pack_split_b_transposed(k, to_size(a.key.stride_row), to_size(count), Dqk, to.kt_pairs,
                                           kt_ld(to_size(count)));
        to.v_lo = to.v_pairs + bf16_gemm::packed_size(to_size(count), Dv);
        bf16_gemm::pack_split_b(v, to_size(a.value.stride_row), to_size(count), Dv, to.v_pairs, to.v_lo);
      }
    }
    if (!pairs) {
      pack_transposed(k, to_size(a.key.stride_row), to_size(count), Dqk, to.kt);
      pack_rows(v, to_size(a.value.stride_row), to_size(count), Dv, to.v);
    }
    to.first = first;
    to.count = count;
    to.kt_ld = kt_ld(to_size(count));
  };
  PackedKv shared_packed = view(shared);
#pragma omp parallel
  {
    auto own = buffers(true);
    PackedKv packed = shared_packs ? shared_packed : view(own);
    int64_t packed_kv = -1;
    Scratch scratch(p, additions.present(), Dqk, dv_padded, q_depth, !pairs ? 0 : split ? 2 : 1);

    auto run_task = [&](int64_t task) {
      const int64_t bh = task / query_blocks, b = bh / Hq, h = bh % Hq, kv = b * Hkv + h / p.group_size();
      const QueryBlocks::Block block = blocks[task % query_blocks];
      const KeyRange keys = p.visible_keys(b, block.first, block.first + static_cast<int64_t>(block.rows));
      const int64_t first = walk_start(keys);
      if (!shared_packs && !keys.empty() &&
          (kv != packed_kv || first < packed.first || keys.end > packed.first + packed.count)) {
        const int64_t limit = p.packed.present() ? p.packed.k(p.sequence_of(b, block.first).index + 1) : S;
        const int64_t end = std::min(limit, keys.end + std::max(kPackAhead, keys.end - first));
        pack_kv_head(kv, first, end - first, packed);
        packed_kv = kv;
      }
      forward_query_block(p, additions, a, packed, scratch, b, h, block.first, block.rows);
    };

    if (!shared_packs) {
      // Runs of consecutive query blocks share one pack (kPackAhead keys past a block), so a thread
      // takes a run at a time, as long as every thread still gets a few runs.
      const int64_t run = std::clamp<int64_t>(std::min(kPackAhead / Br, tasks / (4 * omp_get_num_threads())), 1, query_blocks);
#pragma omp for schedule(dynamic, run)
      for (int64_t task = 0; task < tasks; ++task) run_task(task);
    } else {
      // A kv head's tasks are consecutive: its query heads (a GQA group) × their query blocks.
      const int64_t tasks_per_kv = p.group_size() * query_blocks;
      for (int64_t kv = 0; kv < B * Hkv; ++kv) {
#pragma omp single
        pack_kv_head(kv, 0, S, shared_packed);  // O(S·d), against O(L·S·d) of work
        packed = shared_packed;  // (the single's writes are seen after its barrier)
#pragma omp for schedule(dynamic)
        for (int64_t task = kv * tasks_per_kv; task < (kv + 1) * tasks_per_kv; ++task) run_task(task);
      }
    }
  }
}

template void cpu_flash_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, bfloat16>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, float16>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<bfloat16>&, const ForwardArgs<bfloat16, bfloat16>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<float16>&, const ForwardArgs<float16, float16>&);

}  // namespace mha::attention::detail
