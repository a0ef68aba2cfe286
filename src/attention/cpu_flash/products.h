#pragma once
// The operand representations of cpu_flash's products, one type each (flash-attention's element
// policy, ggml's per-type traits): how a kv head's keys and values are packed as the B operands,
// how query rows become the A operands, and how the forward's S = Q·Kᵀ and O += P·V and the
// backward's S, dP = dO·Vᵀ, dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS and dQ += dS·K are multiplied. forward.cpp's
// and backward.cpp's loops are written once over them; a call resolves its representation once
// (with_forward_products, with_backward_products) from the one bf16 decision, bf16_gemm::path()
// (blocks.h's forward_on_pairs, forward_on_split, backward_on_pairs), which the tests' ScopedPath
// pins. A new representation (int8 keys, another CPU's instructions) is a new type here, its case
// in the two with_ functions, and its tests against the reference.
//
// The forward's part of each type:
//   Pack               the element of the packs (float or bfloat16);
//   A                  the element of the A operand of S (float or bfloat16);
//   p_copies           the bfloat16 copies of P the tile kernels write for O += P·V (0, 1, 2);
//   a_depth(Dqk)       an A row's stride, and the depth of S = Q·Kᵀ;
//   kt_ld(keys)        the packed Kᵀ's row width for `keys` keys;
//   kt_size, v_size    the packs' sizes for S keys;
//   pack(...)          keys [first, first + count) of a kv head into a PackedKv;
//   load_q(...)        one query row into A;
//   scores(...)        S (a band of the tile) = A·Kᵀ over a band of keys;
//   prepare(tile, ...) what the tile kernels must do for this representation (scale, P's copies);
//   add_values(...)    O += P·V over a band.
// The backward's (templates on backward.cpp's Plan `n` and thread Scratch `s`, whose buffers they
// fill; `pairs` and `split` are the flags its Plan sizes them by):
//   pack_keys          a segment's Kᵀ and Vᵀ (and K for dQ, in the second pass) into s;
//   load_rows          a block's Q and dO rows as the A operands of S and dP;
//   scores             S and dP over a band of a tile;
//   transposes         the block's Qᵀ and dOᵀ, the A operands of dKᵀ and dVᵀ, a fully masked row's
//                      columns zeroed (so that an Inf or NaN in its inputs cannot reach a gradient);
//   operands           where score_gradients_tile writes P and dS for the products (null: in the
//                      float tiles themselves);
//   add_kv_gradients   dVᵀ += dOᵀ·(P∘Z), dKᵀ += Qᵀ·dS over a tile;
//   add_dq             dQ += dS·K over a band.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "blocks.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/panel_gemm.h"

namespace mha::attention::detail::cpu_flash {

// A kv head's B operands over its keys [first, first + count), as the representation packed them:
//   float panels: Kᵀ (Dqk × count, panels of keys) and V (count × Dv, panels of value columns); a
//     tile's Kᵀ columns are taken from inside a panel when they start there (packed_columns);
//   bf16 pairs: Kᵀ and V in the pair layout VDPBF16PS and the AMX tiles read, pairs over Dqk and
//     over the keys (kt, v), and for split float16 V's lo pack after its hi one (v_lo).
// `first` is a walk's start (walk_start).
template <class Pack>
struct PackedKv {
  Pack* kt = nullptr;
  Pack* v = nullptr;
  int64_t first = 0, count = 0;
  size_t kt_ld = 0;       // bf16 pairs: Kᵀ's pair rows are 2·kt_ld bfloat16s apart
  Pack* v_lo = nullptr;   // split: V's lo pack (v holds its hi)
};

// dst (cols × rows, row stride ld) = srcᵀ, src rows × cols (row stride src_ld): widened to float,
// or bfloat16 as it is (the bf16 pairs' A operands).
template <class T, class U>
void transpose(const T* src, size_t src_ld, size_t rows, size_t cols, U* dst, size_t ld) {
  constexpr size_t kBlock = 32;  // cache-sized squares
  for (size_t r0 = 0; r0 < rows; r0 += kBlock)
    for (size_t c0 = 0; c0 < cols; c0 += kBlock)
      for (size_t r = r0; r < std::min(rows, r0 + kBlock); ++r)
        for (size_t c = c0; c < std::min(cols, c0 + kBlock); ++c) {
          if constexpr (std::is_same_v<T, U>) {
            dst[c * ld + r] = src[r * src_ld + c];
          } else {
            dst[c * ld + r] = widen(src[r * src_ld + c]);
          }
        }
}

// The backward's Qᵀ and dOᵀ (qt, dot: Dqk and Dv rows of `ld`) from a block's Q and dO rows, a
// fully masked row's columns zeroed (`transposes` of each representation).
template <class T, class U, class Plan, class Scratch>
void transpose_rows(const T* q, size_t q_ld, const T* dout, size_t dout_ld, size_t rows, const Plan& n,
                    const Scratch& s, U* qt, U* dot, size_t ld) {
  transpose(q, q_ld, rows, n.Dqk, qt, ld);
  transpose(dout, dout_ld, rows, n.Dv, dot, ld);
  for (size_t r = 0; r < rows; ++r) {
    if (!s.fully_masked(r)) continue;
    for (size_t d = 0; d < n.Dqk; ++d) qt[d * ld + r] = U{0};
    for (size_t d = 0; d < n.Dv; ++d) dot[d * ld + r] = U{0};
  }
}

// A band's P, as the online softmax left it: in float (the score tile) and, where the
// representation asks, in bfloat16 (hi, and split lo), all with row stride ld.
struct BandProbs {
  const float* p;
  const bfloat16* p16;
  const bfloat16* p16_lo;
  size_t ld;
};

// Float panels: the float32 micro-kernel (panel_gemm). Float operands, and half ones widened as
// they are packed (a KV cache's bfloat16 or float16 keys: the pack is their only float copy).
struct FloatPanels {
  using Pack = float;
  using A = float;
  static constexpr size_t p_copies = 0;
  static size_t a_depth(size_t Dqk) { return Dqk; }
  static size_t kt_ld(size_t keys) { return keys; }
  static size_t kt_size(size_t S, size_t Dqk) { return round_up(S, panel_width()) * Dqk; }
  static size_t v_size(size_t S, size_t Dv) { return round_up(Dv, panel_width()) * S; }

  template <class Kv>
  static void pack(const Kv* k, size_t k_ld, const Kv* v, size_t v_ld, size_t count, size_t Dqk, size_t Dv,
                   PackedKv<Pack>& to) {
    pack_transposed(k, k_ld, count, Dqk, to.kt);
    pack_rows(v, v_ld, count, Dv, to.v);
  }
  // scale·q in float, scaled once for every key block.
  template <class T>
  static void load_q(const T* q, size_t Dqk, float scale, A* dst) {
    for (size_t e = 0; e < Dqk; ++e) dst[e] = scale * widen(q[e]);
  }
  static void scores(size_t rows, size_t width, size_t Dqk, const A* a, size_t lda, const PackedKv<Pack>& kv,
                     size_t col, float* c, size_t ldc) {
    multiply(rows, width, Dqk, {a, lda}, packed_columns(kv.kt, Dqk, col, panel_width()), {c, ldc}, false);
  }
  static void prepare(ScoreTile&, float, bfloat16*, size_t) {}
  static void add_values(size_t rows, size_t Dv, size_t width, const BandProbs& p, const PackedKv<Pack>& kv,
                         size_t key, float* out, size_t ldo) {
    const size_t W = panel_width();
    multiply(rows, Dv, width, {p.p, p.ld}, {kv.v + key * W, W, static_cast<size_t>(kv.count) * W}, {out, ldo}, true);
  }

  static constexpr bool pairs = false, split = false;
  template <class T, class Plan, class Scratch>
  static void pack_keys(const T* k, size_t k_ld, const T* v, size_t v_ld, size_t keys, bool gradients,
                        const Plan& n, Scratch& s) {
    pack_transposed(k, k_ld, keys, n.Dqk, s.kt_packed.data());
    pack_transposed(v, v_ld, keys, n.Dv, s.vt_packed.data());
    if (gradients) pack_rows(k, k_ld, keys, n.Dqk, s.k_packed.data());
  }
  // scale·Q in float; dO read in place (float) or widened into s.dout.
  template <class T, class Plan, class Scratch>
  static void load_rows(const T* q, size_t q_ld, const T* dout, size_t dout_ld, size_t rows, float scale,
                        const Plan& n, Scratch& s) {
    for (size_t r = 0; r < rows; ++r) load_q(q + r * q_ld, n.Dqk, scale, s.q_scaled.data() + r * n.Dqk);
    if constexpr (std::is_same_v<T, float>) {
      s.dout_rows = {dout, dout_ld};
    } else {
      for (size_t r = 0; r < rows; ++r)
        for (size_t e = 0; e < n.Dv; ++e) s.dout[r * n.Dv + e] = widen(dout[r * dout_ld + e]);
      s.dout_rows = {s.dout.data(), n.Dv};
    }
  }
  template <class Plan, class Scratch>
  static void scores(const Band& g, size_t c, size_t, const Plan& n, Scratch& s, float* probs, float* dprobs,
                     size_t ld) {
    const size_t width = g.end_col - g.first_col, W = n.W;
    multiply(g.rows, width, n.Dqk, {s.q_scaled.data() + g.first_row * n.Dqk, n.Dqk},
             packed_columns(s.kt_packed.data(), n.Dqk, c, W), {probs + g.first_row * ld + g.first_col, ld}, false);
    multiply(g.rows, width, n.Dv, {s.dout_rows.first + g.first_row * s.dout_rows.second, s.dout_rows.second},
             packed_columns(s.vt_packed.data(), n.Dv, c, W), {dprobs + g.first_row * ld + g.first_col, ld}, false);
  }
  template <class T, class Plan, class Scratch>
  static void transposes(const T* q, size_t q_ld, const T* dout, size_t dout_ld, size_t rows, const Plan& n,
                         Scratch& s) {
    transpose_rows(q, q_ld, dout, dout_ld, rows, n, s, s.qt.data(), s.dot.data(), n.Br);
  }
  template <class Plan, class Scratch>
  static const Bf16Operands* operands(const Plan&, Scratch&, Bf16Operands&) { return nullptr; }
  template <class Plan, class Scratch>
  static void add_kv_gradients(size_t rows, size_t cols, size_t c0, const float* p, const float* ds, size_t ld,
                               const Plan& n, Scratch& s) {
    multiply(n.Dv, cols, rows, {s.dot.data(), n.Br}, {p, ld, n.W}, {s.dvt(n) + c0, n.key_stride}, true);
    multiply(n.Dqk, cols, rows, {s.qt.data(), n.Br}, {ds, ld, n.W}, {s.dkt() + c0, n.key_stride}, true);
  }
  template <class Plan, class Scratch>
  static void add_dq(const Band& g, size_t c0, const float* ds, size_t ld, size_t seg_keys, const Plan& n,
                     Scratch& s) {
    multiply(g.rows, n.Dqk, g.end_col - g.first_col, {ds + g.first_row * ld + g.first_col, ld},
             {s.k_packed.data() + (c0 + g.first_col) * n.W, n.W, seg_keys * n.W},
             {s.dq.data() + g.first_row * n.dqk_padded, n.dqk_padded}, true);
  }
};

// bfloat16 pairs (bf16_gemm: AMX tiles or VDPBF16PS), for bfloat16 queries, keys and values where
// the CPU has the bf16 instructions. Q as it is (scale·q would not be a bfloat16: the kernels scale
// each score as they read it), P rounded to bfloat16 for P·V as PyTorch's CPU kernel multiplies it
// (the row sums l keep the float P).
struct Bf16Pairs {
  using Pack = bfloat16;
  using A = bfloat16;
  static constexpr size_t p_copies = 1;
  static size_t a_depth(size_t Dqk) { return round_up(Dqk, 2); }
  static size_t kt_ld(size_t keys) { return keys; }
  static size_t kt_size(size_t S, size_t Dqk) { return bf16_gemm::packed_size(Dqk, S); }
  static size_t v_size(size_t S, size_t Dv) { return bf16_gemm::packed_size(S, Dv); }

  static void pack(const bfloat16* k, size_t k_ld, const bfloat16* v, size_t v_ld, size_t count, size_t Dqk,
                   size_t Dv, PackedKv<Pack>& to) {
    bf16_gemm::pack_b_transposed(k, k_ld, count, Dqk, to.kt);
    bf16_gemm::pack_b(v, v_ld, count, Dv, to.v);
  }
  static void load_q(const bfloat16* q, size_t Dqk, float, A* dst) { std::copy_n(q, Dqk, dst); }
  static void scores(size_t rows, size_t width, size_t Dqk, const A* a, size_t lda, const PackedKv<Pack>& kv,
                     size_t col, float* c, size_t ldc) {
    bf16_gemm::multiply(rows, width, Dqk, a, lda, kv.kt + 2 * col, kv.kt_ld, c, ldc, false);
  }
  static void prepare(ScoreTile& t, float scale, bfloat16* p16, size_t) {
    t.scale = scale;      // the kernels scale q·k as they read it
    t.probs_bf16 = p16;   // and write P in bfloat16 for P·V
  }
  static void add_values(size_t rows, size_t Dv, size_t width, const BandProbs& p, const PackedKv<Pack>& kv,
                         size_t key, float* out, size_t ldo) {
    bf16_gemm::multiply(rows, Dv, width, p.p16, p.ld, kv.v + key * Dv, Dv, out, ldo, true);
  }

  // The backward: its five products on pairs, P∘Z and dS rounded to bfloat16 by the tile kernels
  // (as PyTorch's kernel multiplies them), packed over the rows for dVᵀ and dKᵀ (ldb Bc) and dS
  // also as rows for dQ. F16Split's are the same on hi and lo parts (`terms`).
  static constexpr bool pairs = true, split = false;
  template <class T, class Plan, class Scratch>
  static void pack_keys(const T* k, size_t k_ld, const T* v, size_t v_ld, size_t keys, bool gradients,
                        const Plan& n, Scratch& s) {
    bf16_gemm::pack_b_transposed(k, k_ld, keys, n.Dqk, s.kt_pairs.data());
    bf16_gemm::pack_b_transposed(v, v_ld, keys, n.Dv, s.vt_pairs.data());
    if (gradients) bf16_gemm::pack_b(k, k_ld, keys, n.Dqk, s.k_pairs.data());
  }
  // Q and dO rows as Self::load_q takes them (here as they are; F16Split's split), rows of even
  // stride (the kernels apply the scale).
  template <class Self = Bf16Pairs, class T, class Plan, class Scratch>
  static void load_rows(const T* q, size_t q_ld, const T* dout, size_t dout_ld, size_t rows, float,
                        const Plan& n, Scratch& s) {
    for (size_t r = 0; r < rows; ++r) {
      Self::load_q(q + r * q_ld, n.Dqk, 1.0f, s.q16.data() + r * n.dq2);
      Self::load_q(dout + r * dout_ld, n.Dv, 1.0f, s.dout16.data() + r * n.dv2);
    }
  }
  // On split operands (the depths four times; Kᵀ and Vᵀ split_width's keys wide) as on pairs.
  template <class Plan, class Scratch>
  static void scores(const Band& g, size_t c, size_t ldb, const Plan& n, Scratch& s, float* probs, float* dprobs,
                     size_t ld) {
    const size_t width = g.end_col - g.first_col;
    const size_t dqk = n.split ? n.dq2 : n.Dqk, dv = n.split ? n.dv2 : n.Dv;
    bf16_gemm::multiply(g.rows, width, dqk, s.q16.data() + g.first_row * n.dq2, n.dq2, s.kt_pairs.data() + 2 * c,
                        ldb, probs + g.first_row * ld + g.first_col, ld, false);
    bf16_gemm::multiply(g.rows, width, dv, s.dout16.data() + g.first_row * n.dv2, n.dv2, s.vt_pairs.data() + 2 * c,
                        ldb, dprobs + g.first_row * ld + g.first_col, ld, false);
  }
  template <class T, class Plan, class Scratch>
  static void transposes(const T* q, size_t q_ld, const T* dout, size_t dout_ld, size_t rows, const Plan& n,
                         Scratch& s) {
    transpose_rows(q, q_ld, dout, dout_ld, rows, n, s, s.qt16.data(), s.dot16.data(), n.br2);
  }
  // Split: the lo parts after the hi ones.
  template <class Plan, class Scratch>
  static const Bf16Operands* operands(const Plan& n, Scratch& s, Bf16Operands& storage) {
    const size_t pairs_size = bf16_gemm::packed_size(n.Br, n.Bc);
    storage = {s.p_pairs.data(),
               s.ds_pairs.data(),
               n.Bc,
               s.ds16.data(),
               n.Bc,
               n.split ? s.p_pairs.data() + pairs_size : nullptr,
               n.split ? s.ds_pairs.data() + pairs_size : nullptr,
               n.split ? s.ds16.data() + n.Br * n.Bc : nullptr};
    return &storage;
  }
  // Each product on its operands' hi parts, and split also lo·hi and hi·lo (blocks.h).
  template <class Plan, class Multiply>
  static void terms(const Plan& n, const bfloat16* a, size_t a_lo, const bfloat16* b, size_t b_lo, Multiply&& m) {
    m(a, b);
    if (!n.split) return;
    m(a + a_lo, b);
    m(a, b + b_lo);
  }
  template <class Plan, class Scratch>
  static void add_kv_gradients(size_t rows, size_t cols, size_t c0, const float*, const float*, size_t,
                               const Plan& n, Scratch& s) {
    const size_t pairs_size = bf16_gemm::packed_size(n.Br, n.Bc);
    terms(n, s.dot16.data(), n.Dv * n.br2, s.p_pairs.data(), pairs_size, [&](const bfloat16* a, const bfloat16* b) {
      bf16_gemm::multiply(n.Dv, cols, rows, a, n.br2, b, n.Bc, s.dvt(n) + c0, n.key_stride, true);
    });
    terms(n, s.qt16.data(), n.Dqk * n.br2, s.ds_pairs.data(), pairs_size, [&](const bfloat16* a, const bfloat16* b) {
      bf16_gemm::multiply(n.Dqk, cols, rows, a, n.br2, b, n.Bc, s.dkt() + c0, n.key_stride, true);
    });
  }
  template <class Plan, class Scratch>
  static void add_dq(const Band& g, size_t c0, const float*, size_t, size_t, const Plan& n, Scratch& s) {
    terms(n, s.ds16.data() + g.first_row * n.Bc + g.first_col, n.Br * n.Bc, s.k_pairs.data() + (c0 + g.first_col) * n.Dqk,
          n.k_lo(), [&](const bfloat16* a, const bfloat16* b) {
            bf16_gemm::multiply(g.rows, n.Dqk, g.end_col - g.first_col, a, n.Bc, b, n.Dqk,
                                s.dq.data() + g.first_row * n.dqk_padded, n.dqk_padded, true);
          });
  }
};

// float16 on the bf16 products (forward_on_split: where they run on AMX tiles): every float16 is
// exactly hi + lo, two bfloat16s (bf16_gemm::split_depth), so Q·Kᵀ runs at four times the depth
// with every term exact, and P·V as P_hi·V_hi + P_lo·V_hi + P_hi·V_lo, the float P as P_hi + P_lo
// (within 2⁻¹⁶·P) and V exactly; P_lo·V_lo, at most 2⁻¹⁶·P·|v|, left out.
struct F16Split {
  using Pack = bfloat16;
  using A = bfloat16;
  static constexpr size_t p_copies = 2;
  static size_t a_depth(size_t Dqk) { return bf16_gemm::split_depth(Dqk); }
  static size_t kt_ld(size_t keys) { return split_width(keys); }
  static size_t kt_size(size_t S, size_t Dqk) { return bf16_gemm::packed_size(a_depth(Dqk), kt_ld(S)); }
  static size_t v_size(size_t S, size_t Dv) { return 2 * bf16_gemm::packed_size(S, Dv); }

  static void pack(const float16* k, size_t k_ld, const float16* v, size_t v_ld, size_t count, size_t Dqk,
                   size_t Dv, PackedKv<Pack>& to) {
    bf16_gemm::pack_split_b_transposed(k, k_ld, count, Dqk, to.kt, kt_ld(count));
    to.v_lo = to.v + bf16_gemm::packed_size(count, Dv);
    bf16_gemm::pack_split_b(v, v_ld, count, Dv, to.v, to.v_lo);
  }
  static void load_q(const float16* q, size_t Dqk, float, A* dst) { bf16_gemm::split_a(q, Dqk, dst); }
  static void scores(size_t rows, size_t width, size_t Dqk, const A* a, size_t lda, const PackedKv<Pack>& kv,
                     size_t col, float* c, size_t ldc) {
    bf16_gemm::multiply(rows, width, a_depth(Dqk), a, lda, kv.kt + 2 * col, kv.kt_ld, c, ldc, false);
  }
  // P's hi tile first, its lo tile `lo_offset` bfloat16s after.
  static void prepare(ScoreTile& t, float scale, bfloat16* p16, size_t lo_offset) {
    Bf16Pairs::prepare(t, scale, p16, lo_offset);
    t.probs_bf16_lo = p16 + lo_offset;
  }
  static void add_values(size_t rows, size_t Dv, size_t width, const BandProbs& p, const PackedKv<Pack>& kv,
                         size_t key, float* out, size_t ldo) {
    for (const auto& [p_part, v] : {std::pair{p.p16, kv.v}, std::pair{p.p16_lo, kv.v}, std::pair{p.p16, kv.v_lo}})
      bf16_gemm::multiply(rows, Dv, width, p_part, p.ld, v + key * Dv, Dv, out, ldo, true);
  }

  // The backward (backward_on_split): S and dP at four times the depth, and dVᵀ, dKᵀ, dQ as three
  // products each on P and dS split as the forward's P (hi·hi + lo·hi + hi·lo; lo·lo, at most 2⁻¹⁶
  // of the term, left out), for any head sizes.
  static constexpr bool pairs = true, split = true;
  template <class Plan, class Scratch>
  static void pack_keys(const float16* k, size_t k_ld, const float16* v, size_t v_ld, size_t keys, bool gradients,
                        const Plan& n, Scratch& s) {
    const size_t width = n.kt_width(keys);
    bf16_gemm::pack_split_b_transposed(k, k_ld, keys, n.Dqk, s.kt_pairs.data(), width);
    bf16_gemm::pack_split_b_transposed(v, v_ld, keys, n.Dv, s.vt_pairs.data(), width);
    if (gradients) bf16_gemm::pack_split_b(k, k_ld, keys, n.Dqk, s.k_pairs.data(), s.k_pairs.data() + n.k_lo());
  }
  template <class Plan, class Scratch>
  static void load_rows(const float16* q, size_t q_ld, const float16* dout, size_t dout_ld, size_t rows, float scale,
                        const Plan& n, Scratch& s) {
    Bf16Pairs::load_rows<F16Split>(q, q_ld, dout, dout_ld, rows, scale, n, s);
  }
  template <class Plan, class Scratch>
  static void scores(const Band& g, size_t c, size_t ldb, const Plan& n, Scratch& s, float* probs, float* dprobs,
                     size_t ld) {
    Bf16Pairs::scores(g, c, ldb, n, s, probs, dprobs, ld);
  }
  // The float transposes (float16's values, exact in float) split into hi and lo.
  template <class Plan, class Scratch>
  static void transposes(const float16* q, size_t q_ld, const float16* dout, size_t dout_ld, size_t rows,
                         const Plan& n, Scratch& s) {
    FloatPanels::transposes(q, q_ld, dout, dout_ld, rows, n, s);
    for (size_t d = 0; d < n.Dqk; ++d)
      bf16_gemm::split(s.qt.data() + d * n.Br, rows, s.qt16.data() + d * n.br2, s.qt16.data() + (n.Dqk + d) * n.br2);
    for (size_t d = 0; d < n.Dv; ++d)
      bf16_gemm::split(s.dot.data() + d * n.Br, rows, s.dot16.data() + d * n.br2, s.dot16.data() + (n.Dv + d) * n.br2);
  }
  template <class Plan, class Scratch>
  static const Bf16Operands* operands(const Plan& n, Scratch& s, Bf16Operands& storage) {
    return Bf16Pairs::operands(n, s, storage);
  }
  template <class Plan, class Scratch>
  static void add_kv_gradients(size_t rows, size_t cols, size_t c0, const float* p, const float* ds, size_t ld,
                               const Plan& n, Scratch& s) {
    Bf16Pairs::add_kv_gradients(rows, cols, c0, p, ds, ld, n, s);
  }
  template <class Plan, class Scratch>
  static void add_dq(const Band& g, size_t c0, const float* ds, size_t ld, size_t seg_keys, const Plan& n,
                     Scratch& s) {
    Bf16Pairs::add_dq(g, c0, ds, ld, seg_keys, n, s);
  }
};

// f(Products{}) with the representation of a backward on T operands for the call p.
template <class T, class F>
void with_backward_products(const Problem& p, F&& f) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (backward_on_pairs<T>(p)) return f(Bf16Pairs{});
  } else if constexpr (std::is_same_v<T, float16>) {
    if (backward_on_split<T>()) return f(F16Split{});
  }
  f(FloatPanels{});
}

// f(Products{}) with the representation of a forward on T queries and Kv keys and values.
template <class T, class Kv, class F>
void with_forward_products(F&& f) {
  if constexpr (std::is_same_v<T, bfloat16> && std::is_same_v<Kv, bfloat16>) {
    if (forward_on_pairs<T, Kv>()) return f(Bf16Pairs{});
  } else if constexpr (std::is_same_v<T, float16> && std::is_same_v<Kv, float16>) {
    if (forward_on_split<T, Kv>()) return f(F16Split{});
  }
  f(FloatPanels{});
}

}  // namespace mha::attention::detail::cpu_flash
