#pragma once
// The SIMD building blocks of the cpu_flash kernel, as forward.cpp and backward.cpp see them.
// Each call goes through Highway's dynamic dispatch to the best target this CPU supports; the
// per-target code is in kernels-inl.h.
//
// One matrix product serves all six products of attention (S = Q·Kᵀ, O += P·V, dP = dO·Vᵀ,
// dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS, dQ += dS·K):
//
//   C[m × n] (+)= A[m × k] · B[k × n]
//
// A is any row-major matrix (a row stride, no copy). B is read in column panels of
// panel_width() = W floats: within a panel, row kk is W contiguous floats, so the micro-kernel
// streams B with whole-vector loads while it broadcasts A one element at a time. A packed
// matrix (pack_rows, pack_transposed) stores its panels one after the other; a row-major tile
// is already in panel form (panel p starts at column p·W, rows keep the tile's stride), which is
// how P and dS enter as B without a copy.
//
// Every function here has the same contract on every target; only W and the speed differ.
#include <cstddef>
#include <cstdint>

namespace mha::attention::detail::cpu_flash {

// A[r][kk] = data[r·stride + kk].
struct MatrixA {
  const float* data;
  size_t stride;
};

// B[kk][p·W + c] = data[p·panel_stride + kk·stride + c], 0 <= c < W.
struct PanelsB {
  const float* data;
  size_t stride;
  size_t panel_stride;
};

// C[r][c] = data[r·stride + c].
struct MatrixC {
  float* data;
  size_t stride;
};

// Floats per B panel on the chosen target: 64 with AVX-512 (6 × 4 vectors micro-kernel), 16 with
// AVX2, 8 with SSE4 (6 × 2), 2 for scalar code. Always a divisor of 64.
size_t panel_width();

// C = A·B, or C += A·B when `accumulate`. The micro-kernel writes whole vectors: every row of C
// must have room for n rounded up to a multiple of W; the extra columns get A·(B's extra
// columns), so B must hold finite numbers there (the packers write zeros), and then an
// accumulating C keeps its values in them.
void gemm(size_t m, size_t n, size_t k, MatrixA a, PanelsB b, MatrixC c, bool accumulate);

// Panel layouts (panel_stride = k·W, columns beyond n zero-filled up to the panel's end):
//   pack_rows:       B = X,  X is k × n (row stride ld);  dst[p·k·W + kk·W + c] = X[kk][p·W + c]
//   pack_transposed: B = Xᵀ, X is n × k (row stride ld);  dst[p·k·W + kk·W + c] = X[p·W + c][kk]
// dst must hold round_up(n, W)·k floats.
void pack_rows(const float* x, size_t ld, size_t k, size_t n, float* dst);
void pack_transposed(const float* x, size_t ld, size_t n, size_t k, float* dst);

// The per-element additions to one tile of scores S[rows × cols] (row r is query i0 + r,
// column c is key j0 + c), on top of q·k (the kernels' callers fold the scale into q):
//   bias     the masks (additive values, −inf where attend_mask is false), or null;
//   visible  per row, the number of leading columns causality leaves visible (the others get
//            −inf added), or null when every column is visible;
//   dropout  the dropout factor of each probability (0 or 1/(1 − p)), or null when p = 0.
struct ScoreTile {
  float* scores;  // in: scale·q·k; out: probabilities. Rows have room for cols rounded up to W.
  size_t stride, rows, cols;  // rows <= 256 (online_softmax_tile keeps per-row scratch on the stack)
  const float* bias = nullptr;
  const int64_t* visible = nullptr;
  const float* dropout = nullptr;  // bias and dropout share `stride` with the scores
};

// One step of the online softmax over a block of keys (forward). Per row r, with
// s = scale·q·k + additions and m, l the running max and sum over the key blocks seen so far:
//   m' = max(m, max_c s_c);  α = exp(m − m');  l' = α·l + Σ_c exp(s_c − m');  out_r ← α·out_r
// and the tile becomes exp(s − m')·dropout, ready for out += P·V. l counts the probabilities
// before dropout (the normaliser is dropout's business only through P·V). A row whose scores
// are all −inf so far keeps m = −inf, l = 0; a NaN score makes its row's l NaN.
// `out` rows have out_cols used columns (stride out_stride, room up to a multiple of W).
void online_softmax_tile(const ScoreTile& tile, float* row_max, double* row_sum, float* out, size_t out_stride,
                         size_t out_cols);

// Probabilities from the row's log normaliser lse = lse_hi + lse_lo, two floats so that a huge lse
// (a −1e9 mask fill) keeps its fractional part: per row r,
//   P = exp((s − lse_hi_r) − lse_lo_r)
// with (lse_hi, lse_lo) = (m, log l) in the forward (the weights) and split_logsumexp(logsumexp)
// in the backward; a row with lse_hi = +inf is a fully masked row: P = 0.
//   dprob null (the weights): the tile becomes P ∘ dropout.
//   dprob given (backward, dprob holding dP = dO·Vᵀ): the tile becomes P, dprob becomes
//     dP ∘ dropout, row_dot[r] += Σ_c P ∘ dP ∘ dropout and row_mass[r] += Σ_c P: these
//     columns' parts of the sums that make D_r (backward.cpp).
void probabilities_tile(const ScoreTile& tile, const float* lse_hi, const float* lse_lo, float* dprob,
                        double* row_dot, double* row_mass);

// dS = P ∘ (dP − D_r), written over dprob (which holds dP ∘ dropout), then P ← P ∘ dropout when
// dropout is not null. Row stride `stride` for all three tiles. With `renormalize` given, row r's
// P is first multiplied by renormalize[r] (rows whose P from logsumexp must be divided by its sum,
// backward.cpp), and P is rewritten even without dropout.
void score_gradients_tile(float* probs, float* dprob, size_t stride, size_t rows, size_t cols, const float* delta,
                          const float* dropout, const float* renormalize);

// factor[r][c] = kept if dropout_keep(seed, batch_head, i0 + r, j0 + c, p) (mha/core/random.h)
// else 0, for r < rows, c < cols: the same Philox bits as the reference, N elements at a time.
void dropout_tile(uint64_t seed, uint64_t batch_head, uint32_t i0, size_t rows, uint32_t j0, size_t cols, double p,
                  float kept, float* factor, size_t stride);

// (The list of targets and the pinning for tests are declared in cpu_flash.h, defined with the
// dispatch tables in kernels.cpp.)

}  // namespace mha::attention::detail::cpu_flash
