#pragma once
// The SIMD building blocks of the fused backends (cpu_flash's forward and backward, decode's
// softmax).
// Each call goes through Highway's dynamic dispatch to the best target this CPU supports; the
// per-target code is in kernels-inl.h.
//
// One matrix product (core's panel_gemm::multiply, mha/core/panel_gemm.h) serves all six products
// of attention (S = Q·Kᵀ, O += P·V, dP = dO·Vᵀ, dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS, dQ += dS·K); a
// row-major tile is already in panel form, which is how P and dS enter as B without a copy.
//
// Every function here has the same contract on every target; only W and the speed differ.
#include <cstddef>
#include <cstdint>

#include "mha/core/half.h"
#include "mha/core/panel_gemm.h"

namespace mha::attention::detail::tiles {

// The matrix product and the packers are core's (mha/core/panel_gemm.h).
using panel_gemm::multiply;
using panel_gemm::MatrixA;
using panel_gemm::MatrixC;
using panel_gemm::pack_rows;
using panel_gemm::pack_transposed;
using panel_gemm::panel_step;
using panel_gemm::panel_width;
using panel_gemm::PanelsB;

// The per-element additions to one tile of scores S[rows × cols] (row r is one query, column c
// is key j0 + c), on top of q·k (the kernels' callers fold the scale into q); make_tile (tiles.h)
// fills them:
//   bias     the masks (additive values, −inf where attend_mask is false), or null;
//   first_visible, end_visible
//            per row, the columns [first, end) the query sees (the others get −inf added; values
//            outside [0, cols] are clamped), or both null when every column is visible;
//   dropout  the dropout factor of each probability (0 or 1/(1 − p)), or null when p = 0;
//   softcap  c > 0: q·k becomes c·tanh(q·k / c) before the bias is added (Scoring::softcap), or 0;
//   cap_slope  with a soft-cap, where probabilities_tile writes cap' = 1 − tanh²(q·k / c) for the
//            backward (score_gradients_tile), or null.
struct ScoreTile {
  float* scores;  // in: scale·q·k (or q·k, see scale); out: probabilities. Rows have room for cols
                  // rounded up to W.
  size_t stride, rows, cols;  // rows <= 256 (online_softmax_tile keeps per-row scratch on the stack)
  // Multiplies the scores as the kernels read them, when the products left q·k unscaled (bfloat16
  // operands, whose scale·q would not be a bfloat16); 1 where they hold scale·q·k.
  float scale = 1.0f;
  // When given, online_softmax_tile writes the tile's probabilities here as bfloat16 (rounded to
  // nearest even, subnormals to 0 on AVX-512; row stride `stride`: the A operand of O += P·V on
  // bfloat16 operands) instead of into `scores`. Only where the CPU has AVX512_BF16: the kernels
  // round by VCVTNEPS2BF16 on every AVX-512 target, and only the bf16 products set this
  // (cpu_flash/products.h, chosen where bf16_gemm::path() is not float32, which needs it).
  bfloat16* probs_bf16 = nullptr;
  // With probs_bf16, for float16's split products (cpu_flash/blocks.h, forward_on_split): what
  // rounding P to probs_bf16 left, rounded to bfloat16 here (P within 2⁻¹⁶·P of the two together).
  bfloat16* probs_bf16_lo = nullptr;
  const float* bias = nullptr;
  const int64_t* first_visible = nullptr;
  const int64_t* end_visible = nullptr;
  const float* dropout = nullptr;  // bias, dropout and cap_slope share `stride` with the scores
  float softcap = 0.0f;
  float* cap_slope = nullptr;
};

// One step of the online softmax over a block of keys (forward). Per row r, with
// s = scale·q·k + additions and m, l the running max and sum over the key blocks seen so far:
//   m' = max(m, max_c s_c);  α = exp(m − m');  l' = α·l + Σ_c exp(s_c − m');  out_r ← α·out_r
// and the tile becomes exp(s − m')·dropout, ready for out += P·V. l counts the probabilities
// before dropout (the normaliser is dropout's business only through P·V). A row whose scores
// are all −inf so far keeps m = −inf, l = 0; a NaN score makes its row's l NaN. m is a double:
// with a deferred scale, the exact s·scale of the row's maximum where float's rounding of it
// would put that score's exponential far from 1 (|m| >= 2²⁰), so that m + log l is the
// logsumexp of the exact scores (kernels-inl.h).
// `out` rows have out_cols used columns (stride out_stride, room up to a multiple of W).
void online_softmax_tile(const ScoreTile& tile, double* row_max, double* row_sum, float* out, size_t out_stride,
                         size_t out_cols);

// Probabilities from the row's log normaliser lse = lse_hi + lse_lo, two floats so that a huge lse
// (a −1e9 mask fill) keeps its fractional part: per row r,
//   P = exp((s − lse_hi_r) − lse_lo_r)
// with (lse_hi, lse_lo) = (m, log l) in the forward (the weights) and split_logsumexp(logsumexp)
// in the backward; a row with lse_hi = +inf is a fully masked row: P = 0.
//   dprob null (the weights): the tile becomes P ∘ dropout.
//   dprob given (backward, dprob holding dP = dO·Vᵀ): the tile becomes P, dprob becomes
//     dP ∘ dropout, row_dot[r] += Σ_c P ∘ dP ∘ dropout and row_mass[r] += Σ_c P: these
//     columns' parts of the sums that make D_r (backward.cpp); and cap_slope, when given, cap'
//     (0 in a fully masked row and past cols).
void probabilities_tile(const ScoreTile& tile, const float* lse_hi, const float* lse_lo, float* dprob,
                        double* row_dot, double* row_mass);

// The bfloat16 outputs of score_gradients_tile (the bf16 products' operands, only where the CPU has
// AVX512_BF16), rounded to bfloat16 as probs_bf16 is:
//   p_pairs, ds_pairs  P ∘ dropout and dS packed in pairs over the rows, the B operands of
//                      dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS: bf16_gemm's layout with ldb = pairs_ld (row r,
//                      column c at (r / 2)·2·pairs_ld + 2c + r % 2; an odd row count gets a zero row);
//   ds_rows            dS by rows (row stride rows_ld), the A operand of dQ += dS·K.
// Both strides at least cols rounded up to 16 (the kernels write whole vectors).
// With the three *_lo given (float16's split products, cpu_flash/blocks.h): what rounding each of
// those to bfloat16 left, rounded to bfloat16 too, in the same layouts (within 2⁻¹⁶ of the float
// values together).
struct Bf16Operands {
  bfloat16* p_pairs;
  bfloat16* ds_pairs;
  size_t pairs_ld;
  bfloat16* ds_rows;
  size_t rows_ld;
  bfloat16* p_pairs_lo = nullptr;
  bfloat16* ds_pairs_lo = nullptr;
  bfloat16* ds_rows_lo = nullptr;
};

// dS = P ∘ (dP − D_r) ∘ cap_slope (cap_slope: the soft-cap's derivative, or null for none),
// written over dprob (which holds dP ∘ dropout), then P ← P ∘ dropout when dropout is not null.
// Row stride `stride` for all four tiles. With `renormalize` given, row r's
// P is first multiplied by renormalize[r] (rows whose P from logsumexp must be divided by its sum,
// backward.cpp), and P is rewritten even without dropout. With `bf16` given, P ∘ dropout and dS go
// there instead (Bf16Operands) and the float tiles are left as they were.
void score_gradients_tile(float* probs, float* dprob, size_t stride, size_t rows, size_t cols, const float* delta,
                          const float* dropout, const float* renormalize, const float* cap_slope,
                          const Bf16Operands* bf16 = nullptr);

// factor[r][c] = kept if dropout_keep(seed, batch_head, i0 + r, j0 + c, p) (mha/core/random.h)
// else 0, for r < rows, c < cols: the same Philox bits as the reference, N elements at a time.
void dropout_tile(uint64_t seed, uint64_t batch_head, uint32_t i0, size_t rows, uint32_t j0, size_t cols, double p,
                  float kept, float* factor, size_t stride);

// (The list of targets and the pinning for tests: mha/core/simd.h; the dispatch tables are in
// kernels.cpp.)

}  // namespace mha::attention::detail::tiles
