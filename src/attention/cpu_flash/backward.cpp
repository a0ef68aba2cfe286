// cpu_flash backward: the probabilities recomputed from logsumexp, one block of queries at a time.
//
// With s = scale·q·k + masks, P = exp(s − logsumexp) (the forward's softmax), Z the dropout
// factors, O = (P∘Z)·V and upstream dO:
//   dV = (P∘Z)ᵀ·dO
//   dP = (dO·Vᵀ)∘Z
//   dS = P∘(dP − D)∘cap',  D_i = Σ_j P_ij dP_ij  (= dO_i·O_i in exact arithmetic); cap' the
//        soft-cap's derivative (1 without one), P normalised with the row's sink, if any
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
// Long key sequences (S > kLongKeys, blocks.h) would make that O(Br·S) scratch and the per-task
// dKᵀ, dVᵀ large, so the keys are taken in segments of kBackwardKeySegment: a first sweep over
// the segments runs pass A only, to sum D's two sums over all keys (the same tiles in the same
// order, so the same D); the second sweep runs passes A and B segment by segment, each task
// adding its segment's part of dQ (a bfloat16/float16 dQ in a float copy, rounded once at the
// end: transfer_dq). Seven products per tile instead of five, O(d·segment) memory per task.
//
// Parallel tasks: (b, kv head, chunk of that kv head's (query head, query block) pairs). The query
// heads of a GQA group are in the same task, so the task's dK, dV accumulators gather them
// without atomics; each chunk owns its dQ rows and writes its own partial dKᵀ, dVᵀ, summed
// afterwards in chunk order. The number of chunks depends on the shape only (more than one only
// when B·Hkv is small or the keys long: split_items; the whole call's Hkv for a block of heads),
// so the result is bitwise the same for any number of threads, and for a block of heads the
// whole call's.
//
// The products that read a tile transposed (dV += Pᵀ·dO, dK += dSᵀ·Q) are computed transposed,
// dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS: P and dS then enter as the panel operand B exactly as they are
// stored, and dOᵀ, Qᵀ are transposed once per head (O(L·d)) instead of every tile (O(L·S)).
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "blocks.h"
#include "cpu_flash.h"
#include "mha/core/bf16_gemm.h"
#include "products.h"
#include "../work_split.h"

namespace mha::attention::detail {

using namespace cpu_flash;

namespace {

// Chunks per (b, kv head) pair, from the shape alone. Each chunk packs its kv head's keys and
// leaves a partial dKᵀ, dVᵀ (written, then summed by sum_chunks), traffic that costs beside the
// work (2 threads, Zen 5: 4 chunks of 11 query blocks each took (4, 8, 4096, 64) causal from 422
// to 537–557 ms, (4, 8, 2048, 64) from 199 to 224–228 ms). So a pair is cut only where there would
// be too few tasks for a few cores: into kFewestTasks / pairs chunks for fewer than kFewestTasks
// pairs; and with long keys, whose segments are loops of their own (a barrier after each), into
// up to kTasks / pairs chunks (one task per thread up to 128 threads) of kItemsPerChunk items or
// more, a power of two (thread counts mostly are), as long as all their partials together stay
// within kPartialBytes: the long-key path exists to bound the extra memory (blocks.h: under 64 MiB
// at L = S = 65536, d = 64, where each partial is 2.1 MB: 16 chunks, about 48 MiB in all; 128
// chunks had taken it to 275 MiB). The items are dealt to the chunks back and forth (0, 1, …,
// K − 1, then K − 1, …, 0, …), so that a causal call's chunks, whose items' work grows along each
// head, get nearly the same work.
constexpr int64_t kFewestTasks = 8;
constexpr int64_t kTasks = 128;
constexpr int64_t kItemsPerChunk = 5;
constexpr size_t kPartialBytes = size_t{40} << 20;

struct Chunks {
  int64_t count = 0;  // chunks per (b, kv head)
  int64_t items = 0;  // (query head, query block) pairs of a (b, kv head)
  // Item r of chunk c (r = 0, 1, … while below `items`): round r's turn, back and forth.
  int64_t item(int64_t c, int64_t r) const { return r * count + (r % 2 == 0 ? c : count - 1 - c); }
};

// `partial_floats`: the size of one chunk's partial dKᵀ, dVᵀ.
Chunks split_items(int64_t kv_pairs, int64_t items, bool long_keys, size_t partial_floats) {
  if (items == 0) return {};
  auto per_pair = [&](int64_t tasks) { return (tasks + kv_pairs - 1) / kv_pairs; };
  int64_t wanted = std::min(per_pair(kFewestTasks), items);
  if (long_keys) {
    const auto affordable = static_cast<int64_t>(kPartialBytes / (sizeof(float) * partial_floats)) / kv_pairs;
    int64_t many = 1;
    while (2 * many <= std::min({per_pair(kTasks), items / kItemsPerChunk, affordable})) many *= 2;
    wanted = std::max(wanted, many);
  }
  return {wanted, items};
}

// The most keys a block's walk reads (Problem::visible_keys from its walk_start), rounded up to
// whole panels of W: a walk within a segment is at most this wide.
size_t widest_walk(const Problem& p, int64_t B, const QueryBlocks& blocks, size_t W) {
  int64_t widest = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < blocks.count(); ++n) {
      const QueryBlocks::Block block = blocks[n];
      const KeyRange keys = p.visible_keys(b, block.first, block.first + static_cast<int64_t>(block.rows));
      if (!keys.empty()) widest = std::max(widest, keys.end - walk_start(keys));
    }
  return round_up(to_size(widest), W);
}

// Rows per backward block. Pass B of each block sweeps the task's dKᵀ and dVᵀ over the segment's
// keys ((Dqk + Dv) × segment floats) once. bfloat16 on AMX tiles, whose products are fast, is held
// back by those sweeps once the accumulators outgrow a core's L2 (2 MiB): blocks of twice the rows
// halve them (measured: 6–15% off the non-causal backward at (4, 8, 2048, 128), (2, 8, 4096, 64)
// and longer; docs/bfloat16.md, "Backward row blocks"), for twice the P and dP rows per thread.
// Where the accumulators fit, 192 rows were up to 12% slower (those rows, and twice the causal
// diagonal's hidden scores), and float16's split products and the float path did not move beyond
// the noise: 96 rows there. A narrow window's blocks sweep only their band of keys: block_rows'.
size_t backward_rows(const Problem& p, bool pairs, size_t segment) {
  constexpr size_t kL2 = size_t{2} << 20;
  const size_t accumulators = to_size(p.qk_head_dim + p.v_head_dim) * segment * sizeof(float);
  const bool sweeps_weigh =
      pairs && bf16_gemm::path() == bf16_gemm::Path::amx && accumulators >= kL2 && !narrow_window(p);
  return to_size(block_rows(p, sweeps_weigh ? 2 * kBackwardQueries : kBackwardQueries));
}

// How the work is cut: key segments, tasks and their chunks, row strides. A function of the shape
// alone (never of the thread count).
struct Plan {
  int64_t B, Hq, Hkv, L, S, G;
  size_t Dqk, Dv, W;
  // Key segments: all keys at once, or kBackwardKeySegment at a time for long ones (see above).
  bool two_sweeps;
  size_t segment;
  size_t Br, Bc = kBackwardKeys;  // rows and keys of a block (backward_rows)
  int64_t segments;
  size_t segment_padded, dqk_padded;
  // Rows that span a segment's keys (the dKᵀ, dVᵀ accumulators) or a block's walk over them (the P
  // and dS row blocks, counted from the walk's first key) have a stride off a power of two: P and
  // dS are the B operand of dVᵀ, dKᵀ, whose panel the micro-kernel keeps in L1, and rows 2^k bytes
  // apart would all fall in the same L1 cache set.
  size_t key_stride;
  QueryBlocks blocks;  // of Br rows (within each packed sequence)
  int64_t query_blocks;
  size_t walk_stride;  // the widest walk of a block within a segment (a window's: about Br + W keys)
  // Tasks: (b, kv head, chunk of that kv head's (query head, query block) pairs), the chunks from
  // the whole call's (b, kv head) pairs (Options::whole_call): a block of heads sums its gradients
  // in the very order the whole call does.
  Chunks chunks;
  int64_t tasks;
  size_t kvt_size;  // dKᵀ then dVᵀ of one task
  bool partial;     // a block of the rows' keys (Problem::partial_keys)
  bool banded;      // S, dP and dQ by groups of rows (for_each_band)
  // The five products on bf16 pairs (bf16_gemm; bfloat16 operands where the CPU has AVX512_BF16)
  // instead of float panels; then Q's and dO's rows and their transposes are copied with even
  // strides. Split (float16 on AMX tiles, backward_on_split): Q's and dO's rows split to
  // split_depth (dq2, dv2), their transposes, P and dS as hi and lo, K, Kᵀ and Vᵀ split.
  bool pairs, split;
  size_t dq2, dv2, br2;
  size_t step;  // where a band's columns may begin

  // Item `item` of kv pair kv (= b·Hkv + kv head): its query head and block.
  std::pair<int64_t, QueryBlocks::Block> item(int64_t kv, int64_t item) const {
    return {(kv % Hkv) * G + item / query_blocks, blocks[item % query_blocks]};
  }
  // Segment seg's keys [segment_start, segment_start + segment_keys).
  int64_t segment_start(int64_t seg) const { return seg * static_cast<int64_t>(segment); }
  size_t segment_keys(int64_t seg) const { return std::min<size_t>(segment, to_size(S - segment_start(seg))); }
  // The keys the walk of queries [i0, i0 + rows) of sequence b reads in segment seg (empty: none).
  KeyRange walk(const Problem& p, int64_t b, int64_t i0, size_t rows, int64_t seg) const {
    const KeyRange keys = p.visible_keys(b, i0, i0 + static_cast<int64_t>(rows));
    const int64_t s0 = segment_start(seg);
    return {std::max(s0, walk_start(keys)), std::min(s0 + static_cast<int64_t>(segment_keys(seg)), keys.end)};
  }

  size_t parts() const { return split ? 2 : 1; }  // of each bf16 operand: hi (and lo)
  // The packed width of Kᵀ and Vᵀ on pairs: the segment's keys, or split_width's for split ones.
  size_t kt_width(size_t seg_keys) const { return split ? split_width(segment) : seg_keys; }
  size_t kt_width() const { return kt_width(segment); }
  size_t k_lo() const { return bf16_gemm::packed_size(segment, Dqk); }  // split: where K's lo pack starts

  Plan(const Problem& p, bool pairs, bool split)
      : B(p.batch), Hq(p.query_heads), Hkv(p.kv_heads), L(p.query_len), S(p.key_len), G(p.group_size()),
        Dqk(to_size(p.qk_head_dim)), Dv(to_size(p.v_head_dim)), W(panel_width()),
        two_sweeps(S > kLongKeys),
        segment(two_sweeps ? kBackwardKeySegment : to_size(S)),
        Br(backward_rows(p, pairs && !split, segment)),
        segments((S + static_cast<int64_t>(segment) - 1) / static_cast<int64_t>(segment)),
        segment_padded(round_up(segment, W)), dqk_padded(round_up(Dqk, W)),
        key_stride(segment_padded + 16),
        blocks(p, static_cast<int64_t>(Br)), query_blocks(blocks.count()),
        walk_stride(std::min(segment_padded, widest_walk(p, B, blocks, W)) + 16),
        chunks(split_items(B * (p.whole().heads / G), G * query_blocks, two_sweeps, (Dqk + Dv) * key_stride)),
        tasks(B * Hkv * chunks.count),
        kvt_size((Dqk + Dv) * key_stride),
        partial(p.partial_keys()), banded(narrow_window(p)), pairs(pairs || split), split(split),
        dq2(split ? bf16_gemm::split_depth(Dqk) : round_up(Dqk, 2)),
        dv2(split ? bf16_gemm::split_depth(Dv) : round_up(Dv, 2)),
        br2(round_up(Br, 2)), step(key_step()) {}
};

constexpr auto uninitialized = Buffer<float>::Uninitialized;  // every element written before use

// One thread's buffers, all O(segment·d) or O(Br·segment).
struct Scratch {
  // The B operands of the task's kv head over the segment, in panels: Kᵀ (panels of keys) for
  // S = Q·Kᵀ, Vᵀ (panels of keys) for dP = dO·Vᵀ, K (panels of Dqk columns) for dQ += dS·K; and
  // the task's accumulators dKᵀ, dVᵀ.
  Buffer<float> kt_packed, vt_packed, k_packed, kvt;
  // One block of query rows × the segment's keys, and the block's A operands: scale·Q for
  // S = Q·Kᵀ, Qᵀ and dOᵀ (row stride Br) for dKᵀ += Qᵀ·dS and dVᵀ += dOᵀ·P.
  Buffer<float> probs, dprobs, bias, factors, q_scaled, qt, dot, dq, delta, lse_hi, lse_lo, renorm;
  Buffer<double> row_dot, row_mass, mass;
  Buffer<int64_t> first, end;
  std::vector<KeyRange> visible;  // each row's key range
  Buffer<float> dout;  // a bfloat16/float16 block's dO widened (a float block's is read in place)
  std::pair<const float*, size_t> dout_rows;  // on float panels: the block's dO rows (in place or dout)
  Buffer<float> cap_slope;  // with a soft-cap: its derivative at each of the block's scores
  // On bf16 pairs: the B operands Kᵀ, Vᵀ (pairs over d) and K (pairs over keys); the block's Q and
  // dO rows, their transposes, a tile's P and dS packed over the rows, and its dS rows.
  Buffer<bfloat16> kt_pairs, vt_pairs, k_pairs, q16, dout16, qt16, dot16, p_pairs, ds_pairs, ds16;

  Scratch(const Plan& n, bool masked, bool dropout, bool softcapped, bool half)
      : kt_packed(n.pairs ? 0 : n.segment_padded * n.Dqk, uninitialized),
        vt_packed(n.pairs ? 0 : n.segment_padded * n.Dv, uninitialized),
        k_packed(n.pairs ? 0 : n.dqk_padded * n.segment, uninitialized), kvt(n.kvt_size),
        probs(n.Br * n.walk_stride), dprobs(n.Br * n.walk_stride), bias(masked ? n.Br * n.walk_stride : 0),
        factors(dropout ? n.Br * n.walk_stride : 0), q_scaled(n.Br * n.Dqk, uninitialized), qt(n.Dqk * n.Br),
        dot(n.Dv * n.Br), dq(n.Br * n.dqk_padded), delta(n.Br), lse_hi(n.Br), lse_lo(n.Br), renorm(n.Br),
        row_dot(n.Br), row_mass(n.Br), mass(n.Br), first(n.Br), end(n.Br), visible(n.Br),
        dout(half ? n.Br * n.Dv : 0), cap_slope(softcapped ? n.Br * n.walk_stride : 0),
        kt_pairs(n.pairs ? bf16_gemm::packed_size(n.split ? n.dq2 : n.Dqk, n.kt_width()) : 0),
        vt_pairs(n.pairs ? bf16_gemm::packed_size(n.split ? n.dv2 : n.Dv, n.kt_width()) : 0),
        k_pairs(n.pairs ? n.parts() * n.k_lo() : 0), q16(n.pairs ? n.Br * n.dq2 : 0),
        dout16(n.pairs ? n.Br * n.dv2 : 0), qt16(n.pairs ? n.parts() * n.Dqk * n.br2 : 0),
        dot16(n.pairs ? n.parts() * n.Dv * n.br2 : 0),
        p_pairs(n.pairs ? n.parts() * bf16_gemm::packed_size(n.Br, n.Bc) : 0),
        ds_pairs(n.pairs ? n.parts() * bf16_gemm::packed_size(n.Br, n.Bc) : 0),
        ds16(n.pairs ? n.parts() * n.Br * n.Bc : 0) {}

  float* dkt() { return kvt.data(); }
  float* dvt(const Plan& n) { return kvt.data() + n.Dqk * n.key_stride; }
  // The tile scratch of the block's walk's columns from c0 on.
  TileScratch tile(size_t c0) {
    return {bias.size() ? bias.data() + c0 : nullptr, factors.size() ? factors.data() + c0 : nullptr,
            cap_slope.size() ? cap_slope.data() + c0 : nullptr, first.data(), end.data()};
  }
  bool fully_masked(size_t r) const { return lse_hi[r] == std::numeric_limits<float>::infinity(); }  // split_logsumexp
};

// gradient[0, n) += values[0, n), stored as T: a float gradient in place; a bfloat16 or float16 one
// widened, added to and rounded back by the vector conversions (mha/core/half.h; as narrow<T>
// rounds), values serving as the scratch.
template <class T>
void add_row(T* gradient, float* values, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (size_t i = 0; i < n; ++i) gradient[i] += values[i];
  } else {
    thread_local std::vector<float> widened;
    widened.resize(n);
    convert(gradient, widened.data(), n);
    for (size_t i = 0; i < n; ++i) values[i] += widened[i];
    convert(values, gradient, n);
  }
}

// The backward of one call: the plan, what every thread shares, and the steps. T: the operands'
// and gradients' type (float, bfloat16, float16), computed in float; Products: the representation
// its products run on (products.h).
template <class T, class Products>
class Backward {
 public:
  Backward(const Problem& p, const ScoreAdditions<T>& additions, const BackwardArgs<T>& a)
      : p_(p), additions_(additions), a_(a),
        n_(p, Products::pairs && !Products::split, Products::split),
        kvt_partial_(n_.chunks.count > 1 ? to_size(n_.tasks) * n_.kvt_size : 0, uninitialized),
        all_row_dot_(n_.two_sweeps ? to_size(n_.B * n_.Hq * n_.L) : 0),
        all_row_mass_(n_.two_sweeps ? to_size(n_.B * n_.Hq * n_.L) : 0),
        dq_sum_(is_half_v<T> && n_.segments > 1 ? to_size(n_.B * n_.Hq * n_.L) * n_.Dqk : 0, uninitialized) {}

  void run() {
#pragma omp parallel
    {
      Scratch s(n_, additions_.present(), p_.dropout(), p_.softcapped(), is_half_v<T>);
      if (dq_sum_.size()) transfer_dq(false);
      for (int sweep = n_.two_sweeps && !n_.partial ? 0 : 1; sweep < 2; ++sweep) {
        const bool gradients = sweep == 1;  // sweep 0 only sums D's parts (two sweeps)
        for (int64_t seg = 0; seg < n_.segments; ++seg) {
#pragma omp for schedule(dynamic)
          for (int64_t task = 0; task < n_.tasks; ++task) run_task(s, task, seg, gradients);
          // (the loop's end is a barrier: every chunk's part is written)
          if (gradients && n_.chunks.count > 1) sum_chunks(seg);
        }
      }
      if (dq_sum_.size()) transfer_dq(true);
    }
  }

 private:
  // One task over one segment: pack the kv head's keys and values there, run the task's query
  // blocks, then hand over its dKᵀ, dVᵀ.
  void run_task(Scratch& s, int64_t task, int64_t seg, bool gradients) {
    const int64_t kv = task / n_.chunks.count, chunk = task % n_.chunks.count;  // kv = b·Hkv + kv head
    const int64_t b = kv / n_.Hkv, s0 = n_.segment_start(seg);
    const size_t seg_keys = n_.segment_keys(seg);
    const T* k_seg = a_.key.row(b, kv % n_.Hkv, s0);
    const size_t k_ld = to_size(a_.key.stride_row);
    const T* v_seg = a_.value.row(b, kv % n_.Hkv, s0);
    const size_t v_ld = to_size(a_.value.stride_row);
    Products::pack_keys(k_seg, k_ld, v_seg, v_ld, seg_keys, gradients, n_, s);
    if (gradients) std::fill(s.kvt.data(), s.kvt.data() + n_.kvt_size, 0.0f);
    for (int64_t r = 0, item; (item = n_.chunks.item(chunk, r)) < n_.chunks.items; ++r) {
      const auto [h, block] = n_.item(kv, item);
      query_block(s, b, h, block.first, block.rows, seg, gradients);
    }
    if (gradients) hand_over_kv_gradients(s, task, seg);
  }

  // Queries [i0, i0 + rows) of (b, h) against the segment's keys they see.
  void query_block(Scratch& s, int64_t b, int64_t h, int64_t i0, size_t rows, int64_t seg, bool gradients) {
    const int64_t s0 = n_.segment_start(seg);
    const auto [s_begin, s_end] = n_.walk(p_, b, i0, rows, seg);
    if (s_end <= s_begin) return;
    Products::load_rows(a_.query.row(b, h, i0), to_size(a_.query.stride_row), a_.grad_output.row(b, h, i0),
                        to_size(a_.grad_output.stride_row), rows, static_cast<float>(p_.scale), n_, s);
    for (size_t r = 0; r < rows; ++r) split_logsumexp(*a_.logsumexp.row(b, h, i0 + static_cast<int64_t>(r)), s.lse_hi[r], s.lse_lo[r]);

    // The sums that make D go to the whole-row totals in the first of two sweeps; otherwise to
    // this block's own (used with one sweep, already summed by the first with two).
    const size_t row0 = to_size((b * n_.Hq + h) * n_.L + i0);  // index of query i0 in the row totals
    std::fill(s.row_dot.data(), s.row_dot.data() + rows, 0.0);
    std::fill(s.row_mass.data(), s.row_mass.data() + rows, 0.0);
    const bool totals = n_.two_sweeps && !gradients;
    pass_a(s, b, h, i0, rows, s0, s_begin, s_end, totals ? all_row_dot_.data() + row0 : s.row_dot.data(),
           totals ? all_row_mass_.data() + row0 : s.row_mass.data());
    if (!gradients) return;
    const double* dots = n_.two_sweeps ? all_row_dot_.data() + row0 : s.row_dot.data();
    const double* masses = n_.two_sweeps ? all_row_mass_.data() + row0 : s.row_mass.data();
    const bool renormalizing = row_constants(s, b, h, i0, rows, dots, masses);
    pass_b(s, b, h, i0, rows, s0, s_begin, s_end, renormalizing);
  }

  // Pass A: P and dP∘Z for every key block, and the sums that make D. The scores are those of the
  // forward, (scale·Q)·Kᵀ with the same products in the same order. The packed keys' columns are
  // counted from the segment's first key (c0 = j0 − s0), the P and dP rows' from the walk's
  // (t0 = j0 − s_begin).
  void pass_a(Scratch& s, int64_t b, int64_t h, int64_t i0, size_t rows, int64_t s0, int64_t s_begin, int64_t s_end,
              double* sum_dot, double* sum_mass) {
    const size_t ws = n_.walk_stride, seg_keys = n_.segment_keys(s0 / static_cast<int64_t>(n_.segment));
    const size_t ldb = n_.kt_width(seg_keys);  // on pairs: Kᵀ's and Vᵀ's packed width
    for (size_t r = 0; r < rows; ++r) s.visible[r] = p_.visible_keys(b, i0 + static_cast<int64_t>(r));
    for (int64_t j0 = s_begin; j0 < s_end; j0 += static_cast<int64_t>(n_.Bc)) {
      const size_t cols = std::min<size_t>(n_.Bc, to_size(s_end - j0)), c0 = to_size(j0 - s0),
                   t0 = to_size(j0 - s_begin);
      float* probs = s.probs.data() + t0;
      float* dprobs = s.dprobs.data() + t0;
      for_each_band(n_.banded, s.visible.data(), rows, j0, cols, n_.step, [&](const Band& g) {
        if (g.end_col > g.first_col) Products::scores(g, c0 + g.first_col, ldb, n_, s, probs, dprobs, ws);
        fill_beside_band(g, probs, ws, cols);
        fill_beside_band(g, dprobs, ws, cols);
      });
      ScoreTile t = make_tile(p_, additions_, s.tile(t0), probs, ws, b, rows, j0, cols,
                              [&](size_t r) { return std::pair{h, i0 + static_cast<int64_t>(r)}; }, s.visible.data());
      if (Products::pairs) t.scale = static_cast<float>(p_.scale);  // the products left q·k unscaled
      probabilities_tile(t, s.lse_hi.data(), s.lse_lo.data(), dprobs, sum_dot, sum_mass);
    }
  }

  // exp(sink − logsumexp) of row (b, h, i): the sink's probability, 0 without one.
  double sink_probability(int64_t b, int64_t h, int64_t i) const {
    const double sink = a_.sinks.of(b, h);
    return sink == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(sink - *a_.logsumexp.row(b, h, i));
  }

  // D and the renormalising factors of the block's rows; true when some row is renormalised.
  bool row_constants(Scratch& s, int64_t b, int64_t h, int64_t i0, size_t rows, const double* dots,
                     const double* masses) {
    // D = Σ_j P dP / Σ_j P: P = exp(s − lse) sums to 1 only up to the rounding of lse and of each
    // exp; dividing by the actual sum makes Σ_j dS_ij = Σ_j P dP − D·Σ_j P vanish to rounding
    // whatever that sum is (a fully masked row has both sums 0: D = 0).
    // A sink (Options::sinks) is one more term of the row's P, whose dP is 0: its P joins the sum
    // of P (the mass) and nothing else.
    // The sinks' gradient takes the same D, in double (BackwardArgs::row_deltas): from P and dP
    // in float it is far closer to dO·O than dO·O is from an output rounded to bfloat16 or
    // float16. (With two sweeps each segment writes the same values, barriers apart.)
    double* row_deltas = a_.row_deltas ? a_.row_deltas + (b * n_.Hq + h) * n_.L + i0 : nullptr;
    for (size_t r = 0; r < rows; ++r) {
      s.mass[r] = masses[r] + sink_probability(b, h, i0 + static_cast<int64_t>(r));
      const double delta = s.mass[r] > 0 ? dots[r] / s.mass[r] : 0.0;
      s.delta[r] = static_cast<float>(delta);
      if (row_deltas) row_deltas[r] = delta;
    }
    // A block of the rows' keys (Problem::partial_keys) sees only part of each row: D_i =
    // dO_i·O_i from the whole call's output, and P is exp(s − lse) as it stands.
    if (n_.partial) {
      const T* dout_block = a_.grad_output.row(b, h, i0);
      const size_t dout_ld = to_size(a_.grad_output.stride_row);
      for (size_t r = 0; r < rows; ++r) {
        const T* o = a_.output.row(b, h, i0 + static_cast<int64_t>(r));
        double d = 0;
        for (size_t e = 0; e < n_.Dv; ++e) d += static_cast<double>(widen(dout_block[r * dout_ld + e])) * widen(o[e]);
        s.delta[r] = static_cast<float>(d);
        if (row_deltas) row_deltas[r] = d;
      }
      return false;
    }
    // Rows whose logsumexp is too large to rebuild P exactly use P / Σ_j P (blocks.h).
    bool renormalizing = false;
    for (size_t r = 0; r < rows; ++r) {
      const bool renormalize =
          logsumexp_needs_renormalizing(*a_.logsumexp.row(b, h, i0 + static_cast<int64_t>(r))) && s.mass[r] > 0;
      s.renorm[r] = renormalize ? static_cast<float>(1.0 / s.mass[r]) : 1.0f;
      renormalizing = renormalizing || renormalize;
    }
    return renormalizing;
  }

  // Pass B: dS, then dVᵀ += dOᵀ·(P∘Z), dKᵀ += Qᵀ·dS, dQ += dS·K block by block.
  void pass_b(Scratch& s, int64_t b, int64_t h, int64_t i0, size_t rows, int64_t s0, int64_t s_begin, int64_t s_end,
              bool renormalizing) {
    const size_t ws = n_.walk_stride, Dqk = n_.Dqk;
    // A fully masked row (P = 0, dS = 0) takes no part: its columns of Qᵀ and dOᵀ are zeroed
    // and its dQ left 0, so that an Inf or NaN in its q, grad_output or a key cannot make
    // 0·inf = NaN in any gradient (attention.h: such rows have gradient 0).
    Products::transposes(a_.query.row(b, h, i0), to_size(a_.query.stride_row), a_.grad_output.row(b, h, i0),
                         to_size(a_.grad_output.stride_row), rows, n_, s);
    std::fill(s.dq.data(), s.dq.data() + rows * n_.dqk_padded, 0.0f);
    const size_t seg_keys = n_.segment_keys(s0 / static_cast<int64_t>(n_.segment));
    for (int64_t j0 = s_begin; j0 < s_end; j0 += static_cast<int64_t>(n_.Bc)) {
      const size_t cols = std::min<size_t>(n_.Bc, to_size(s_end - j0)), c0 = to_size(j0 - s0),
                   t0 = to_size(j0 - s_begin);
      float* block_probs = s.probs.data() + t0;
      float* block_ds = s.dprobs.data() + t0;
      Bf16Operands operands;
      score_gradients_tile(block_probs, block_ds, ws, rows, cols, s.delta.data(),
                           p_.dropout() ? s.factors.data() + t0 : nullptr, renormalizing ? s.renorm.data() : nullptr,
                           p_.softcapped() ? s.cap_slope.data() + t0 : nullptr,
                           Products::operands(n_, s, operands));
      Products::add_kv_gradients(rows, cols, c0, block_probs, block_ds, ws, n_, s);
      for_each_band(n_.banded, s.visible.data(), rows, j0, cols, n_.step, [&](const Band& g) {
        if (g.end_col > g.first_col) Products::add_dq(g, c0, block_ds, ws, seg_keys, n_, s);
      });
    }
    // These query rows belong to this task alone (within the segment): dQ += scale·dS·K,
    // segments in order.
    const float scale = static_cast<float>(p_.scale);
    for (size_t r = 0; r < rows; ++r) {
      if (s.fully_masked(r)) continue;
      float* dq = s.dq.data() + r * n_.dqk_padded;
      for (size_t d = 0; d < Dqk; ++d) dq[d] *= scale;
      if (dq_sum_.size()) {
        float* sum = dq_sum_.data() + to_size((b * n_.Hq + h) * n_.L + i0 + static_cast<int64_t>(r)) * Dqk;
        for (size_t d = 0; d < Dqk; ++d) sum[d] += dq[d];
      } else {
        add_row(a_.grad_query.row(b, h, i0 + static_cast<int64_t>(r)), dq, Dqk);
      }
    }
  }

  // A bfloat16/float16 dQ over several key segments is summed in float (dq_sum_, from what
  // grad_query holds) and rounded once at the end, as the float call's: not once per segment.
  void transfer_dq(bool to_gradient) {
    const size_t Dqk = n_.Dqk;
#pragma omp for schedule(static)
    for (int64_t x = 0; x < n_.B * n_.Hq * n_.L; ++x) {
      T* g = a_.grad_query.row(x / (n_.Hq * n_.L), x / n_.L % n_.Hq, x % n_.L);
      float* sum = dq_sum_.data() + to_size(x) * Dqk;
      if (to_gradient) {
        convert(sum, g, Dqk);
      } else {
        convert(g, sum, Dqk);
      }
    }
  }

  // dK += scale·(dKᵀ)ᵀ, dV += (dVᵀ)ᵀ over keys [s0, s0 + seg_keys) of kv head kv from a sum laid out
  // as the task's accumulators.
  void add_kv_gradients(const float* sum, int64_t kv, int64_t seg) const {
    const float scale = static_cast<float>(p_.scale);
    const int64_t s0 = n_.segment_start(seg);
    std::vector<float> column(n_.Dqk + n_.Dv);  // key j's dK and dV, gathered from the columns
    for (size_t j = 0; j < n_.segment_keys(seg); ++j) {
      T* dk = a_.grad_key.row(kv / n_.Hkv, kv % n_.Hkv, s0 + static_cast<int64_t>(j));
      T* dv = a_.grad_value.row(kv / n_.Hkv, kv % n_.Hkv, s0 + static_cast<int64_t>(j));
      for (size_t d = 0; d < n_.Dqk; ++d) column[d] = scale * sum[d * n_.key_stride + j];
      for (size_t d = 0; d < n_.Dv; ++d) column[n_.Dqk + d] = sum[(n_.Dqk + d) * n_.key_stride + j];
      add_row(dk, column.data(), n_.Dqk);
      add_row(dv, column.data() + n_.Dqk, n_.Dv);
    }
  }

  // The task's dKᵀ, dVᵀ over the segment: the whole gradient of its kv head's keys there, or one
  // chunk's part of it (summed by sum_chunks).
  void hand_over_kv_gradients(Scratch& s, int64_t task, int64_t seg) {
    if (n_.chunks.count == 1) return add_kv_gradients(s.kvt.data(), task, seg);
    std::copy_n(s.kvt.data(), n_.kvt_size, kvt_partial_.data() + to_size(task) * n_.kvt_size);
  }

  // With chunks: each kv head's parts summed in chunk order into the first chunk's, then added.
  void sum_chunks(int64_t seg) {
    const size_t seg_keys = n_.segment_keys(seg), stride = n_.key_stride;
#pragma omp for schedule(static)
    for (int64_t kv = 0; kv < n_.B * n_.Hkv; ++kv) {
      float* sum = kvt_partial_.data() + to_size(kv * n_.chunks.count) * n_.kvt_size;
      for (int64_t chunk = 1; chunk < n_.chunks.count; ++chunk) {
        const float* part = kvt_partial_.data() + to_size(kv * n_.chunks.count + chunk) * n_.kvt_size;
        for (size_t d = 0; d < n_.Dqk + n_.Dv; ++d)
          for (size_t j = 0; j < seg_keys; ++j) sum[d * stride + j] += part[d * stride + j];
      }
      add_kv_gradients(sum, kv, seg);
    }
  }

  const Problem& p_;
  const ScoreAdditions<T>& additions_;
  const BackwardArgs<T>& a_;
  const Plan n_;
  // When a kv head is split into chunks, each chunk's dKᵀ, dVᵀ, summed afterwards in chunk order.
  Buffer<float> kvt_partial_;
  // Two sweeps: every query row's Σ_j P dP and Σ_j P, summed over all segments by the first.
  Buffer<double> all_row_dot_, all_row_mass_;
  // bfloat16/float16 over several key segments: dQ summed in float (transfer_dq).
  Buffer<float> dq_sum_;
};

}  // namespace

template <class T>
std::vector<TaskLoop> cpu_flash_backward_loops(const Problem& p) {
  std::vector<TaskLoop> loops;
  if (p.batch * p.query_heads * p.query_len == 0 || p.key_len == 0) return loops;
  with_backward_products<T>(p, [&](auto products) {
    using Products = decltype(products);
    const Plan n(p, Products::pairs && !Products::split, Products::split);
    // Backward::run's loops: per sweep and segment, the tasks; a task's work is its items' rows ×
    // the keys their walks read there, × the products per tile (pass A's two alone in the first
    // of two sweeps, five with one sweep, seven in the second of two). sum_chunks' loop (static,
    // over the kv pairs, reading the partials) is left out.
    for (int sweep = n.two_sweeps && !n.partial ? 0 : 1; sweep < 2; ++sweep)
      for (int64_t seg = 0; seg < n.segments; ++seg) {
        const double products_per_tile = sweep == 0 ? 2 : n.two_sweeps ? 7 : 5;
        TaskLoop& loop = loops.emplace_back();
        for (int64_t task = 0; task < n.tasks; ++task) {
          const int64_t kv = task / n.chunks.count, b = kv / n.Hkv;
          double work = 0;
          for (int64_t r = 0, item; (item = n.chunks.item(task % n.chunks.count, r)) < n.chunks.items; ++r) {
            const QueryBlocks::Block block = n.item(kv, item).second;
            const KeyRange keys = n.walk(p, b, block.first, block.rows, seg);
            if (!keys.empty()) work += static_cast<double>(block.rows * to_size(keys.end - keys.begin));
          }
          loop.work.push_back(products_per_tile * work);
        }
      }
  });
  return loops;
}

template <class T>
void cpu_flash_backward(const Problem& p, const ScoreAdditions<T>& additions, const BackwardArgs<T>& a) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  // grad_output (B, Hq, L, Dv)  logsumexp (B, Hq, L), rows at any strides; the output is read
  // only by a block of the rows' keys (D = dO·O); the gradients are added to (they start at 0, or
  // hold what a caller accumulates into).
  if (p.batch * p.query_heads * p.query_len == 0 || p.key_len == 0) return;
  with_backward_products<T>(p, [&](auto products) { Backward<T, decltype(products)>(p, additions, a).run(); });
}

template std::vector<TaskLoop> cpu_flash_backward_loops<float>(const Problem&);
template std::vector<TaskLoop> cpu_flash_backward_loops<bfloat16>(const Problem&);
template std::vector<TaskLoop> cpu_flash_backward_loops<float16>(const Problem&);
template void cpu_flash_backward(const Problem&, const ScoreAdditions<float>&, const BackwardArgs<float>&);
template void cpu_flash_backward(const Problem&, const ScoreAdditions<bfloat16>&, const BackwardArgs<bfloat16>&);
template void cpu_flash_backward(const Problem&, const ScoreAdditions<float16>&, const BackwardArgs<float16>&);

}  // namespace mha::attention::detail
