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

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "blocks.h"
#include "cpu_flash.h"
#include "mha/core/bf16_gemm.h"
#include "products.h"
#include "../work_split.h"

namespace mha::attention::detail {

using namespace cpu_flash;

namespace {

// One thread's scratch for query blocks of at most Br rows: the score tile and its additions
// (Br × Bc, row stride Bc), the output accumulator and the per-row state, Q as the products'
// A operand (row stride q_depth) and the bfloat16 copies of P they ask for (hi, then lo).
template <class Products>
struct Scratch {
  using A = typename Products::A;
  size_t dv_padded, q_depth;
  Buffer<float> scores, bias, factors, out, lse_hi, lse_lo;
  Buffer<A> q;
  Buffer<bfloat16> p16;
  Buffer<double> row_max, row_sum;  // the online softmax's m and l (online_softmax_tile)
  Buffer<int64_t> first, end;
  std::vector<KeyRange> visible;  // each row's key range

  Scratch(const Problem& p, bool masked, size_t Dqk, size_t dv_padded)
      : dv_padded(dv_padded),
        q_depth(Products::a_depth(Dqk)),
        scores(kForwardQueries * kForwardKeys),
        bias(masked ? kForwardQueries * kForwardKeys : 0),
        factors(p.dropout() ? kForwardQueries * kForwardKeys : 0),
        out(kForwardQueries * dv_padded),
        lse_hi(kForwardQueries),
        lse_lo(kForwardQueries),
        q(kForwardQueries * q_depth),
        p16(Products::p_copies * kForwardQueries * kForwardKeys),
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
// output and logsumexp rows, then (when asked) the weights, on the products of `Products`.
template <class Products, class T, class Kv>
void forward_query_block(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a,
                         const PackedKv<typename Products::Pack>& kv, Scratch<Products>& s, int64_t b, int64_t h,
                         int64_t i0, size_t rows) {
  const size_t Dqk = to_size(p.qk_head_dim), Dv = to_size(p.v_head_dim);
  const size_t Bc = kForwardKeys, dv_padded = s.dv_padded, q_depth = s.q_depth;
  // The row state before any key: m = −inf, l = 0, or the sink's logit with its term, m = sink, l = 1.
  const float sink = static_cast<float>(a.sinks.of(b, h));
  std::fill(s.row_max.data(), s.row_max.data() + rows, sink);
  std::fill(s.row_sum.data(), s.row_sum.data() + rows, sink == -std::numeric_limits<float>::infinity() ? 0.0 : 1.0);
  std::fill(s.out.data(), s.out.data() + rows * dv_padded, 0.0f);
  // The A operand of S = Q·Kᵀ (Products::load_q).
  for (size_t r = 0; r < rows; ++r)
    Products::load_q(a.query.row(b, h, i0 + static_cast<int64_t>(r)), Dqk, static_cast<float>(p.scale),
                     s.q.data() + r * q_depth);
  for (size_t r = 0; r < rows; ++r) s.visible[r] = p.visible_keys(b, i0 + static_cast<int64_t>(r));
  // Under a narrow window each group of kBandRows rows multiplies only the columns it sees, in both
  // products (for_each_band).
  const bool banded = narrow_window(p);
  const size_t step = key_step();
  // The score tile of keys [j0, j0 + cols): S = Q·Kᵀ on each group's band (zero beside it, where
  // the tile's edges hide every column), and the additions the kernels apply.
  constexpr size_t lo_offset = kForwardQueries * kForwardKeys;  // P's lo tile after its hi one
  auto score_tile = [&](int64_t j0, size_t cols) {
    for_each_band(banded, s.visible.data(), rows, j0, cols, step, [&](const Band& g) {
      const size_t c = to_size(j0 - kv.first) + g.first_col, width = g.end_col - g.first_col;
      if (width > 0)
        Products::scores(g.rows, width, Dqk, s.q.data() + g.first_row * q_depth, q_depth, kv, c,
                         s.scores.data() + g.first_row * Bc + g.first_col, Bc);
      fill_beside_band(g, s.scores.data(), Bc, cols);
    });
    ScoreTile t = make_tile(p, additions, s.tile(), s.scores.data(), Bc, b, rows, j0, cols,
                            [&](size_t r) { return std::pair{h, i0 + static_cast<int64_t>(r)}; }, s.visible.data());
    Products::prepare(t, static_cast<float>(p.scale), s.p16.data(), lo_offset);
    return t;
  };
  // O += P·V over each group's band (P is 0 beside it), on P as the products ask for it.
  auto add_values = [&](int64_t j0, size_t cols) {
    for_each_band(banded, s.visible.data(), rows, j0, cols, step, [&](const Band& g) {
      const size_t key = to_size(j0 - kv.first) + g.first_col, width = g.end_col - g.first_col;
      const size_t at = g.first_row * Bc + g.first_col;
      const bfloat16* p16 = s.p16.size() ? s.p16.data() + at : nullptr;
      if (width > 0)
        Products::add_values(g.rows, Dv, width, {s.scores.data() + at, p16, p16 ? p16 + lo_offset : nullptr, Bc}, kv,
                             key, s.out.data() + g.first_row * dv_padded, dv_padded);
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

// How the forward cuts its work: one task per (b, h, block of Br queries), in that order; tasks
// run in parallel, each writes only its rows. The packed kv head (PackedKv): with short keys each
// thread packs the keys its task's walk reads when they are not packed yet (consecutive tasks
// mostly share one kv head), those keys and up to kPackAhead more (or as many as the walk,
// whichever is more) of the same sequence: a dense call packs a kv head in a few growing steps, a
// sliding window the band it slides over (O(W·d) per step, in cache) instead of the whole head.
// With long keys, one shared copy, the kv heads taken one after another (a loop per kv head).
struct ForwardPlan {
  int64_t Hq, Br;
  QueryBlocks blocks;
  int64_t tasks, tasks_per_kv;  // a kv head's tasks are consecutive: its query heads × their blocks
  bool shared_packs;

  explicit ForwardPlan(const Problem& p)
      : Hq(p.query_heads), Br(block_rows(p, kForwardQueries)), blocks(p, Br),
        tasks(p.batch * Hq * blocks.count()), tasks_per_kv(p.group_size() * blocks.count()),
        shared_packs(p.key_len > kLongKeys) {}

  struct Task {
    int64_t b, h;
    QueryBlocks::Block block;
  };
  Task task(int64_t t) const {
    const int64_t bh = t / blocks.count();
    return {bh / Hq, bh % Hq, blocks[t % blocks.count()]};
  }
  KeyRange keys(const Problem& p, int64_t t) const {
    const Task x = task(t);
    return p.visible_keys(x.b, x.block.first, x.block.first + static_cast<int64_t>(x.block.rows));
  }
};

template <class Products, class T, class Kv>
void forward_on(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  // output (B, Hq, L, Dv)  logsumexp (B, Hq, L)  weights (B, Hq, L, S), rows at any strides
  const int64_t B = p.batch, Hq = p.query_heads, Hkv = p.kv_heads, L = p.query_len, S = p.key_len;
  const size_t Dqk = to_size(p.qk_head_dim), Dv = to_size(p.v_head_dim);
  if (B * Hq * L == 0) return;

  using Pack = typename Products::Pack;
  const size_t dv_padded = round_up(Dv, panel_width());
  const ForwardPlan plan(p);
  const int64_t tasks = plan.tasks;
  const bool shared_packs = plan.shared_packs;
  const size_t kt_size = Products::kt_size(to_size(S), Dqk), v_size = Products::v_size(to_size(S), Dv);
  auto buffers = [&](bool own) {  // a thread's own packs, or the shared ones
    const bool here = own != shared_packs;
    return std::pair(Buffer<Pack>(here ? kt_size : 0, Buffer<Pack>::Uninitialized),
                     Buffer<Pack>(here ? v_size : 0, Buffer<Pack>::Uninitialized));
  };
  auto view = [](auto& packs) { return PackedKv<Pack>{packs.first.data(), packs.second.data()}; };
  auto shared = buffers(false);
  // Keys [first, first + count) of kv head kv (= b·Hkv + kv head) into `to` (a KV cache's bfloat16
  // or float16 keys and values, on float panels widened as packed: the only float copy of them).
  auto pack_kv_head = [&](int64_t kv, int64_t first, int64_t count, PackedKv<Pack>& to) {
    Products::pack(a.key.row(kv / Hkv, kv % Hkv, first), to_size(a.key.stride_row),
                   a.value.row(kv / Hkv, kv % Hkv, first), to_size(a.value.stride_row), to_size(count), Dqk, Dv, to);
    to.first = first;
    to.count = count;
    to.kt_ld = Products::kt_ld(to_size(count));
  };
  PackedKv<Pack> shared_packed = view(shared);
#pragma omp parallel
  {
    auto own = buffers(true);
    PackedKv<Pack> packed = shared_packs ? shared_packed : view(own);
    int64_t packed_kv = -1;
    Scratch<Products> scratch(p, additions.present(), Dqk, dv_padded);

    auto run_task = [&](int64_t task) {
      const auto [b, h, block] = plan.task(task);
      const int64_t kv = b * Hkv + h / p.group_size();
      const KeyRange keys = plan.keys(p, task);
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
      // One block at a time: a thread packs a kv head's keys (and kPackAhead more) for the first
      // block it takes of that head and finds them packed for the next ones it takes.
#pragma omp for schedule(dynamic)
      for (int64_t task = 0; task < tasks; ++task) run_task(task);
    } else {
      const int64_t tasks_per_kv = plan.tasks_per_kv;
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


}  // namespace

std::vector<TaskLoop> cpu_flash_forward_loops(const Problem& p) {
  const ForwardPlan plan(p);
  // A task's work: its rows × the keys its walk reads (walk_start on), two products.
  auto work = [&](int64_t t) {
    const KeyRange keys = plan.keys(p, t);
    return keys.empty() ? 0.0 : 2.0 * static_cast<double>(plan.task(t).block.rows * to_size(keys.end - walk_start(keys)));
  };
  std::vector<TaskLoop> loops;
  const int64_t per_loop = plan.shared_packs ? plan.tasks_per_kv : plan.tasks;
  for (int64_t t0 = 0; per_loop > 0 && t0 < plan.tasks; t0 += per_loop) {
    TaskLoop& loop = loops.emplace_back();
    for (int64_t t = t0; t < t0 + per_loop; ++t) loop.work.push_back(work(t));
  }
  return loops;
}

template <class T, class Kv>
void cpu_flash_forward(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a) {
  with_forward_products<T, Kv>([&](auto products) { forward_on<decltype(products)>(p, additions, a); });
}

template void cpu_flash_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, bfloat16>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float, float16>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<bfloat16>&, const ForwardArgs<bfloat16, bfloat16>&);
template void cpu_flash_forward(const Problem&, const ScoreAdditions<float16>&, const ForwardArgs<float16, float16>&);

}  // namespace mha::attention::detail
