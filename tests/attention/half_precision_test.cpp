// Attention on bfloat16 and float16 operands: queries, keys, values, masks, sinks, ALiBi slopes,
// outputs, weights and every gradient in the half type, read and written in place, computed in
// float (scores, softmax, logsumexp, accumulators).
//   - every backend and every variant of the sweeps, forward and backward: the half call equals
//     the float call on the same (rounded) values with its results rounded once to the half type,
//     bit for bit (the reference runs on float copies; cpu_flash and decode widen where they pack
//     or read): a half call adds exactly one rounding, of each result;
//   - grad_sinks, summed in double, is rounded once from it (the float call rounds it to float
//     first): within one unit of the half type's last place;
//     (on the path a CPU without AVX512_BF16 takes, forced: bf16_gemm::ScopedFloat32Fallback);
//   - bfloat16 on the CPU's bf16 instructions (products in bf16, P rounded to bfloat16 for P·V)
//     against the reference in double, within a bound derived from those roundings; with value
//     heads of another size its backward is the float call's rounded once; float16 on AMX tiles
//     (split products), forward and backward, likewise;
//   - the same on every SIMD target and each path of the products (AMX tiles, VDPBF16PS, float32),
//     and bitwise the same for 1, 2, 3 and 8 threads on each;
//   - strided views in place (a (B, L, H, D) layout), and accumulate into given gradients.
// The accuracy bar against PyTorch's own bfloat16/float16 SDPA is in python/tests (test_half_precision.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <string>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "mha/attention/attention.h"
#include "mha/core/bf16_gemm.h"
#include "mha/core/random.h"
#include "mha/core/simd.h"

namespace mha::attention {
namespace {

using namespace test_cases;

// x stored as H (rounded) and widened again: the values a half call's operand holds.
template <class H>
Tensor<float> rounded(const Tensor<float>& x) {
  Tensor<float> out(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = widen(narrow<H>(x[i]));
  return out;
}

template <class To, class From>
Tensor<To> converted(const Tensor<From>& x) {
  Tensor<To> out(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = narrow<To>(widen(x[i]));
  return out;
}

template <class H>
void round_inputs(Inputs& in) {
  for (Tensor<float>* t : {&in.q, &in.k, &in.v, &in.dout}) *t = rounded<H>(*t);
  for (std::optional<Tensor<float>>* t : {&in.additive, &in.sinks, &in.alibi_slopes})
    if (*t) **t = rounded<H>(**t);
}

template <class H>
void expect_rounded_of(const Tensor<H>& half, const Tensor<float>& f, const char* what) {
  EXPECT_TRUE(bitwise_equal(half, converted<H>(f))) << what << ": not the float call's result rounded once";
}

// The case in H on `backend` against the float call on the same values, forward and backward.
template <class H>
void check_half(const Case& c, uint64_t seed, Backend backend) {
  SCOPED_TRACE(std::string(storage_name<H>()) + " " + name_of(backend) + ":" + c.describe());
  Inputs in = make_inputs(c, seed);
  round_inputs<H>(in);
  const Results<float> f = run<float>(c, in, backend);
  const Results<H> h = run<H>(c, in, backend);
  expect_rounded_of(h.fwd.output, f.fwd.output, "output");
  EXPECT_TRUE(bitwise_equal(h.fwd.logsumexp, f.fwd.logsumexp)) << "logsumexp";
  if (c.need_weights) expect_rounded_of(*h.fwd.weights, *f.fwd.weights, "weights");
  expect_rounded_of(h.grads.grad_query, f.grads.grad_query, "grad_query");
  expect_rounded_of(h.grads.grad_key, f.grads.grad_key, "grad_key");
  expect_rounded_of(h.grads.grad_value, f.grads.grad_value, "grad_value");
  if (c.sinks) {
    // grad_sinks reads the output (D = dO·O), which the half call holds rounded: the float call's
    // backward given that output, its double sum rounded to float then H, against ours, rounded
    // once from the double sum: within one unit in H's last place.
    Held<float> held;
    const Gradients<float> given = sdpa_backward(in.q, in.k, in.v, mha::cast<float>(h.fwd.output), h.fwd.logsumexp,
                                                 in.dout, options_of<float>(c, in, backend, held));
    const Tensor<float> ours = mha::cast<float>(*h.grads.grad_sinks), theirs = rounded<H>(*given.grad_sinks);
    for (int64_t i = 0; i < ours.numel(); ++i) {
      const float ulp = std::max(std::abs(theirs[i]) * (std::is_same_v<H, bfloat16> ? 0x1p-7f : 0x1p-10f), 0x1p-24f);
      EXPECT_LE(std::abs(ours[i] - theirs[i]), ulp) << "grad_sinks[" << i << "]";
    }
  }
}

// bfloat16 on the CPU's bf16 instructions (bf16_gemm): every product of two bfloat16s is exact and
// summed in float; P is rounded to bfloat16 for P·V and, in the backward, P∘Z and dS for dV = PᵀdO,
// dK = scale·dSᵀQ and dQ = scale·dS·K (as PyTorch's CPU kernel multiplies them). So against the
// reference in double on the same values, u = 2⁻⁸ (bfloat16's unit roundoff), each result rounded
// once more (u·|g64|), float's own error within 2⁻¹⁶ of the largest:
//   |o − o64|       ≤ u·z·max_j |v_je| + u·|o64|           (Σ_j P_j·z·|v_je| ≤ z·max|v|, z = 1/(1 − p);
//                                                            decode's forward: its P·V in float, within it)
//   |dV − dV64|_je  ≤ u·Σ_i P_ij·|dO_ie| + u·|dV64_je|
//   |dK − dK64|_je  ≤ u·|scale|·Σ_i |dS_ij|·|q_ie| + u·|dK64_je|
//   |dQ − dQ64|_ie  ≤ u·|scale|·Σ_j |dS_ij|·|k_je| + u·|dQ64_ie|
// with |dS_ij| ≤ P_ij·(|dP_ij| + |D_i|) (a soft-cap's derivative is at most 1), P the reference's
// weights and dP, D from them here, in double (gradients checked without dropout: P there is the
// probabilities themselves); logsumexp (from the float P) within float's error. Where the CPU has
// no AVX512_BF16 this is the fallback's path, which meets the same bounds.
//
// float16 on AMX tiles, the split products (forward_on_split, backward_on_split in
// cpu_flash/blocks.h): every product of two float16s is exact (four bf16 products: bf16_gemm.h),
// summed in float; P and dS are taken as hi + lo and the products of P or dS with Q, K, V or dO
// leave out lo·lo. With u_b = 2⁻⁸: |x − x_hi| ≤ u_b·|x|, x_lo is x − x_hi within u_b of it, so
// |x − x_hi − x_lo| ≤ u_b²·|x|, and |x_lo·y_lo| ≤ u_b(1 + u_b)·|x|·u_b·|y|: together below
// 2⁻¹⁴·|x|·|y|. So the same bounds hold with 2⁻¹⁴ in the products' terms and float16's u = 2⁻¹¹
// for the results' own rounding. (Where the CPU has no AMX every float16 call takes the float
// products, which meet them too; the sweeps below hold that path to the float call bit for bit.)
//
// ProductBounds: the inputs and the reference in double the bounds are computed from, and their
// gradient terms; check_products: a call on the products' path and SIMD target pinned now, within them.
template <class Half>
struct ProductBounds {
  static constexpr bool bf16 = std::is_same_v<Half, bfloat16>;
  static constexpr double u = bf16 ? 0x1p-8 : 0x1p-11, u_products = bf16 ? 0x1p-8 : 0x1p-14;
  Inputs in;                           // the case's, rounded to Half
  Results<double> ref;                 // the reference in double on them
  double z = 1, max_v = 0;             // 1/(1 − p), max|v|
  Tensor<double> mag_q, mag_k, mag_v;  // the gradients' bounds but for u·|g64| (without dropout)
};

template <class T>
double largest_magnitude(const Tensor<T>& t) {
  double m = 0;
  for (auto x : t.values()) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

// The inputs, the reference and the magnitudes of the bounds above: none of them depends on the
// SIMD target or the products' path (the reference runs no SIMD-dispatched code), so a test of
// every target or path computes them once.
template <class Half>
ProductBounds<Half> product_bounds(const Case& c, uint64_t seed) {
  ProductBounds<Half> bounds;
  Inputs& in = bounds.in;
  in = make_inputs(c, seed);
  round_inputs<Half>(in);
  bounds.ref = run<double>(c, in, Backend::reference);
  const Results<double>& ref = bounds.ref;
  bounds.z = c.scoring.dropout_p > 0 ? 1 / (1 - c.scoring.dropout_p) : 1.0;
  bounds.max_v = largest_magnitude(in.v);
  if (c.scoring.dropout_p > 0) return bounds;
  // The magnitudes of the bounds above, from the reference's weights.
  Case with_weights = c;
  with_weights.need_weights = true;
  const Tensor<double> P = *run_forward<double>(with_weights, in, Backend::reference).weights;
  const int64_t B = c.batch, H = c.q_heads, G = c.q_heads / c.kv_heads, L = c.q_len, S = c.k_len, Dk = c.qk_dim,
                Dv = c.v_dim;
  const double scale = std::abs(c.scoring.scale.value_or(1 / std::sqrt(static_cast<double>(Dk))));
  Tensor<double> mag_q({B, H, L, Dk}), mag_k({B, c.kv_heads, S, Dk}), mag_v({B, c.kv_heads, S, Dv});
  // Besides the products' roundings (u_products), float's own error in each P: its score s within
  // γ·scale·Σ_e |q_e·k_e| of s64 (γ = (4·Dk + 2)·2⁻²⁴: the split products' 4·Dk terms, the scale
  // and the additions), its exponential's argument within 2⁻²³·(|s| + |logsumexp|) more, the
  // exponential within 2⁻²²: ε·P, which grows with the scores (ALiBi over 16 500 keys: |s| in the
  // thousands), negligible beside bfloat16's u but not beside 2⁻¹⁴. D = Σ P·dP / Σ P then errs
  // by at most 2·Σ_j ε_j·P_j·|dP_j|, and dS = P∘(dP − D) by (u_products + ε)·P·(|dP| + |D|) + P·ΔD.
  const double gamma = (4.0 * static_cast<double>(Dk) + 2) * 0x1p-24, u_products = ProductBounds<Half>::u_products;
  std::vector<double> dp(static_cast<size_t>(S)), eps(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hq = 0; hq < H; ++hq)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t kv = hq / G;
        const float* dout = &in.dout[((b * H + hq) * L + i) * Dv];
        const float* q = &in.q[((b * H + hq) * L + i) * Dk];
        const double* p = &P[((b * H + hq) * L + i) * S];
        const double lse = ref.fwd.logsumexp[(b * H + hq) * L + i];
        if (std::isinf(lse)) continue;  // a fully masked row: P = 0, no part in any gradient
        double d = 0, d_error = 0;
        for (int64_t j = 0; j < S; ++j) {
          const float* v = &in.v[((b * c.kv_heads + kv) * S + j) * Dv];
          const float* k = &in.k[((b * c.kv_heads + kv) * S + j) * Dk];
          double x = 0, qk = 0;
          for (int64_t e = 0; e < Dv; ++e) x += static_cast<double>(dout[e]) * v[e];
          for (int64_t e = 0; e < Dk; ++e) qk += std::abs(static_cast<double>(q[e]) * k[e]);
          const double score = p[j] > 0 ? std::abs(lse + std::log(p[j])) : 0.0;
          eps[static_cast<size_t>(j)] = gamma * scale * qk + 0x1p-23 * (score + std::abs(lse)) + 0x1p-22;
          dp[static_cast<size_t>(j)] = x;
          d += p[j] * x;
          d_error += 2 * eps[static_cast<size_t>(j)] * p[j] * std::abs(x);
        }
        for (int64_t j = 0; j < S; ++j) {
          const double f = u_products + eps[static_cast<size_t>(j)];
          const double ds = p[j] * (f * (std::abs(dp[static_cast<size_t>(j)]) + std::abs(d)) + d_error);
          const float* k = &in.k[((b * c.kv_heads + kv) * S + j) * Dk];
          for (int64_t e = 0; e < Dv; ++e)
            mag_v[((b * c.kv_heads + kv) * S + j) * Dv + e] += f * p[j] * std::abs(dout[e]);
          for (int64_t e = 0; e < Dk; ++e) {
            mag_k[((b * c.kv_heads + kv) * S + j) * Dk + e] += scale * ds * std::abs(q[e]);
            mag_q[((b * H + hq) * L + i) * Dk + e] += scale * ds * std::abs(k[e]);
          }
        }
      }
  bounds.mag_q = std::move(mag_q);
  bounds.mag_k = std::move(mag_k);
  bounds.mag_v = std::move(mag_v);
  return bounds;
}

// cpu_flash (and decode, with few rows) in Half on the bounds' inputs, on the products' path and
// SIMD target pinned now, within the bounds.
template <class Half>
void check_products(const Case& c, const ProductBounds<Half>& bounds) {
  SCOPED_TRACE(std::string(storage_name<Half>()) + " products on " + bf16_gemm::name(bf16_gemm::path()) +
               ": " + c.describe());
  const Inputs& in = bounds.in;
  const Results<double>& ref = bounds.ref;
  const Results<Half> h = run<Half>(c, in, Backend::cpu_flash);
  const double z = bounds.z, max_v = bounds.max_v;
  constexpr double u = ProductBounds<Half>::u, u_products = ProductBounds<Half>::u_products;
  // decode too (few rows): its Q·Kᵀ on VDPBF16PS where that is the path, on float FMAs on the AMX
  // path (decode::bf16_scores), P·V in float (within the same bound).
  std::vector<std::pair<const char*, Tensor<Half>>> outputs{{"cpu_flash", h.fwd.output}};
  if (c.q_len <= 16 && !c.need_weights)
    outputs.emplace_back("decode", run_forward<Half>(c, in, Backend::decode).output);
  for (const auto& [backend, output] : outputs)
    for (int64_t i = 0; i < ref.fwd.output.numel(); ++i) {
      const double o64 = ref.fwd.output[i], o = widen(output[i]);
      ASSERT_LE(std::abs(o - o64), u_products * z * max_v + u * std::abs(o64) + 0x1p-16 * max_v)
          << backend << " output[" << i << "]";
    }
  for (int64_t i = 0; i < ref.fwd.logsumexp.numel(); ++i) {
    const double l64 = ref.fwd.logsumexp[i], l = h.fwd.logsumexp[i];
    if (std::isinf(l64)) {
      EXPECT_EQ(l, l64) << "logsumexp[" << i << "]";
    } else {
      EXPECT_LE(std::abs(l - l64), 1e-5 * (1 + std::abs(l64))) << "logsumexp[" << i << "]";
    }
  }
  if (c.scoring.dropout_p > 0) return;
  auto expect_gradient = [&](const Tensor<Half>& g, const Tensor<double>& g64,
                             const Tensor<double>& magnitude, const char* name) {
    const double slack = 0x1p-16 * largest_magnitude(g64);
    for (int64_t i = 0; i < g64.numel(); ++i)
      ASSERT_LE(std::abs(widen(g[i]) - g64[i]), magnitude[i] + u * std::abs(g64[i]) + slack)
          << name << "[" << i << "]";
  };
  expect_gradient(h.grads.grad_query, ref.grads.grad_query, bounds.mag_q, "grad_query");
  expect_gradient(h.grads.grad_key, ref.grads.grad_key, bounds.mag_k, "grad_key");
  expect_gradient(h.grads.grad_value, ref.grads.grad_value, bounds.mag_v, "grad_value");
}

TEST(HalfPrecision, Bf16ProductsWithinTheirRounding) {
  const std::pair<int64_t, int64_t> heads[] = {{2, 2}, {4, 2}, {3, 1}};
  // The last length is past kLongKeys (blocks.h): the forward's shared pack, the backward's two
  // sweeps over key segments.
  const int64_t lengths[][2] = {{7, 7}, {1, 40}, {33, 300}, {130, 97}, {200, 513}, {4, 1100}, {5, 16500}};
  for (int n = 0; n < 28; ++n) {
    // Query and value heads of one size in every other case: the backward runs on the bf16 pairs
    // only then (of other sizes it is the float call's, below).
    const int64_t dqk = n % 3 == 0 ? 128 : n % 3 == 1 ? 19 : 40;
    Case c = sized(1, 2, 2, lengths[n % 7][0], lengths[n % 7][1], dqk, n % 2 ? 24 : dqk);
    vary_options(c, n, heads, 3);
    const ProductBounds<bfloat16> bounds = product_bounds<bfloat16>(c, 900 + static_cast<uint64_t>(n));
    // Each path the products can take here (AMX tiles and VDPBF16PS where the CPU has both).
    for (bf16_gemm::Path path : bf16_gemm::paths()) {
      if (path == bf16_gemm::Path::float32 && bf16_gemm::native()) continue;
      const bf16_gemm::ScopedPath pin(path);
      check_products(c, bounds);
    }
  }
}

// dKᵀ and dVᵀ of 256 × 2 600 floats (2.7 MB, past 2 MiB): on AMX tiles the backward takes blocks of
// 192 rows (backward_rows), here two and a ragged 16, under a causal mask, a padding mask and
// sinks; within the products' rounding on every path, and 1, 2, 3 and 8 threads bitwise.
TEST(HalfPrecision, Bf16BackwardInRowBlocksOfEitherSize) {
  Case c = sized(1, 4, 2, 400, 2600, 128, 128);
  c.mask = MaskKind::both;
  c.scoring.causal = Causal::bottom_right;
  c.sinks = true;
  Inputs in = make_inputs(c, 811);
  round_inputs<bfloat16>(in);
  const ProductBounds<bfloat16> bounds = product_bounds<bfloat16>(c, 810);  // once, before the paths
  for (bf16_gemm::Path path : bf16_gemm::paths()) {
    if (path == bf16_gemm::Path::float32 && bf16_gemm::native()) continue;
    SCOPED_TRACE(bf16_gemm::name(path));
    const bf16_gemm::ScopedPath pin(path);
    check_products(c, bounds);
    expect_bitwise_on_thread_counts([&] { return run<bfloat16>(c, in, Backend::cpu_flash); });
  }
}

TEST(HalfPrecision, Float16SplitProductsWithinTheirRounding) {
  const std::pair<int64_t, int64_t> heads[] = {{2, 2}, {4, 2}, {3, 1}};
  // The last length is past kLongKeys (blocks.h): the forward's shared pack.
  const int64_t lengths[][2] = {{7, 7}, {1, 40}, {33, 300}, {130, 97}, {200, 513}, {4, 1100}, {5, 16500}};
  for (int n = 0; n < 28; ++n) {
    Case c = sized(1, 2, 2, lengths[n % 7][0], lengths[n % 7][1],
                   n % 3 == 0   ? 128
                   : n % 3 == 1 ? 19
                                : 40,
                   n % 2 ? 24 : 64);
    vary_options(c, n, heads, 3);
    c.need_weights = n % 6 == 1;
    const ProductBounds<float16> bounds = product_bounds<float16>(c, 1100 + static_cast<uint64_t>(n));
    for (bf16_gemm::Path path : bf16_gemm::paths()) {
      const bf16_gemm::ScopedPath pin(path);
      check_products(c, bounds);
    }
  }
}

// bfloat16 with value heads of another size than the query's: the backward takes the float products
// on the widened operands (backward_on_pairs in cpu_flash/blocks.h: PyTorch's SDPA computes those
// shapes in float32), so its gradients are the float backward's, given the same output and
// logsumexp, rounded once, on the bf16 instructions' path too (the forward keeps that path). On a
// CPU without AVX512_BF16 every call takes this path.
TEST(HalfPrecision, Bf16BackwardWithValueHeadsOfAnotherSizeIsTheFloatCallRoundedOnce) {
  const std::pair<int64_t, int64_t> heads[] = {{2, 2}, {4, 2}, {3, 1}};
  const int64_t lengths[][2] = {{7, 7}, {33, 300}, {130, 97}, {5, 16500}};
  for (int n = 0; n < 12; ++n) {
    Case c = sized(1, 2, 2, lengths[n % 4][0], lengths[n % 4][1], n % 2 ? 40 : 128, n % 3 ? 24 : 64);
    vary_options(c, n, heads, 3);
    SCOPED_TRACE(c.describe());
    Inputs in = make_inputs(c, 1000 + static_cast<uint64_t>(n));
    round_inputs<bfloat16>(in);
    const Results<bfloat16> h = run<bfloat16>(c, in, Backend::cpu_flash);
    Held<float> held;
    const Gradients<float> f = sdpa_backward(in.q, in.k, in.v, mha::cast<float>(h.fwd.output), h.fwd.logsumexp,
                                             in.dout, options_of<float>(c, in, Backend::cpu_flash, held));
    expect_rounded_of(h.grads.grad_query, f.grad_query, "grad_query");
    expect_rounded_of(h.grads.grad_key, f.grad_key, "grad_key");
    expect_rounded_of(h.grads.grad_value, f.grad_value, "grad_value");
  }
}

// The bf16 path's softmax exponential (Exp2OfNonPositive in tiles/vectors-inl.h: 2^((s·scale − m)·
// log2 e), the scale applied in the argument's FMA) within float's error, on rows whose logsumexp
// is known in closed form: row i has scores 0 and a_i (keys (0, 0) and (1, 0), q_i = (a_i, 0),
// exact in bfloat16), so logsumexp = log(1 + exp(a_i·σ)) (σ = 0.3, not a power of 2). Against that
// in double, with u = 2⁻²⁴ (float's unit roundoff): σ rounded to float, |aσ|·u; the larger score's
// argument is the exact residual of m = fl(σ·max) (the FMA), times log2 e (2u relative of that
// residual: nothing); the smaller one's, −|aσ| within 3|aσ|·u, weighs e^(−|aσ|) of it: 3u/e at
// most; 2^f within 2u for each; the float sum of the two (u): |lse − lse64| <= (|aσ| + 6)·u. The
// float path (a CPU without AVX512_BF16, forced here too) rounds scale·q before the product, and
// targets without an FMA (SSE4 and below) round s·scale before subtracting m: one more |aσ|·u,
// (2|aσ| + 6)·u for all (measured: 0.33 of it on the bf16 path with FMA, 0.75 on the others). a·σ
// spans [−90, 90], past the cut to 0 at e⁻⁸⁰.
TEST(HalfPrecision, Bf16SoftmaxExponentialWithinFloatsError) {
  const int64_t L = 12000;
  const double sigma = 0.3;
  Tensor<bfloat16> q({1, 1, L, 2}), k({1, 1, 2, 2}), v({1, 1, 2, 2});
  k[2] = narrow<bfloat16>(1.0f);  // k1 = (1, 0); k0 = 0
  for (int64_t e = 0; e < v.numel(); ++e) v[e] = narrow<bfloat16>(1.0f);
  Generator gen(17);
  for (int64_t i = 0; i < L; ++i) q[2 * i] = narrow<bfloat16>(gen.uniform(-90.0, 90.0) / sigma);
  for (const std::string& target : simd_targets())
    for (bool fallback : {false, true}) {
      SCOPED_TRACE("target " + target + (fallback ? ", float products" : ""));
      const ScopedSimdTarget pin(target);
      std::optional<bf16_gemm::ScopedFloat32Fallback> float_products;
      if (fallback) float_products.emplace();
      Options<bfloat16> opt;
      opt.scale = sigma;
      opt.backend = Backend::cpu_flash;
      const ForwardResult<bfloat16> r = sdpa_forward(q, k, v, opt);
      double worst = 0;  // in units of the bound
      for (int64_t i = 0; i < L; ++i) {
        const double x = static_cast<double>(widen(q[2 * i])) * sigma;
        const double want = std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x)));
        const double bound = (2 * std::abs(x) + 6) * 0x1p-24;
        ASSERT_LE(std::abs(r.logsumexp[i] - want), bound)
            << "row " << i << ": a·σ = " << x << ", logsumexp " << r.logsumexp[i];
        worst = std::max(worst, std::abs(r.logsumexp[i] - want) / bound);
      }
      std::cout << "[bf16 softmax exp] " << target << ", " << bf16_gemm::name(bf16_gemm::path())
                << ": largest error " << worst << " of the bound\n";
    }
}

// The same rows with scores far past float's integers (|a·σ| from 1e3 to 1e10, bfloat16 q of
// magnitude 2^10..2^35): the bf16 path's exponentials subtract the row's maximum from the exact
// s·scale (one FMA), so its shift must be that exact maximum too, not its float rounding (up to 256
// off at 5e9: the row's own term came out as e^256 = inf, or every term as 0 and the row as 0/0).
// Expected, by hand: logsumexp = max(x, 0) within the same (2|x| + 6)·u (log1p(e^−|x|) < e^−1000);
// P one-hot, so the output is v of the larger score's key (v0 = (1, 0), v1 = (0, 1)) within the
// rounding of P to bfloat16 for P·V and of the output (u = 2⁻⁸ each: check_products' bound);
// with dO = 1, dV is the count of rows each key wins within the same two roundings (of each P and
// of the sum); dP = dO·v = 1 for both keys, so
// D = Σ P·dP / Σ P = p/p = 1 exactly (one nonzero P, p, times 1), dS = P∘(dP − D) = 0 and dQ, dK
// are exactly 0 (as they are in exact arithmetic: the weights do not move with the scores).
TEST(HalfPrecision, Bf16ScoresFarPastFloatsIntegers) {
  const int64_t L = 600;
  const double sigma = 0.3;
  Tensor<bfloat16> q({1, 1, L, 2}), k({1, 1, 2, 2}), v({1, 1, 2, 2}), dout({1, 1, L, 2});
  k[2] = narrow<bfloat16>(1.0f);  // k1 = (1, 0); k0 = 0
  v[0] = narrow<bfloat16>(1.0f);  // v0 = (1, 0)
  v[3] = narrow<bfloat16>(1.0f);  // v1 = (0, 1)
  for (int64_t i = 0; i < dout.numel(); ++i) dout[i] = narrow<bfloat16>(1.0f);
  Generator gen(23);
  int64_t wins1 = 0;  // rows whose larger score is key 1's
  for (int64_t i = 0; i < L; ++i) {
    const double magnitude = std::pow(10.0, gen.uniform(3.0, 10.0)) / sigma;
    q[2 * i] = narrow<bfloat16>(i % 2 ? magnitude : -magnitude);
    wins1 += i % 2;
  }
  for (const std::string& target : simd_targets())
    for (Backend backend : {Backend::cpu_flash, Backend::decode}) {
      const ScopedSimdTarget pin(target);
      SCOPED_TRACE(std::string(backend == Backend::decode ? "decode" : "cpu_flash") + " on " +
                   bf16_gemm::name(bf16_gemm::path()) + ", target " + target);
      Options<bfloat16> opt;
      opt.scale = sigma;
      opt.backend = backend;
      const ForwardResult<bfloat16> r = sdpa_forward(q, k, v, opt);
      for (int64_t i = 0; i < L; ++i) {
        const double x = static_cast<double>(widen(q[2 * i])) * sigma;
        ASSERT_LE(std::abs(r.logsumexp[i] - std::max(x, 0.0)), (2 * std::abs(x) + 6) * 0x1p-24)
            << "row " << i << ": a·σ = " << x << ", logsumexp " << r.logsumexp[i];
        ASSERT_LE(std::abs(widen(r.output[2 * i]) - (x > 0 ? 0.0 : 1.0)), 2 * 0x1p-8) << "output row " << i;
        ASSERT_LE(std::abs(widen(r.output[2 * i + 1]) - (x > 0 ? 1.0 : 0.0)), 2 * 0x1p-8)
            << "output row " << i;
      }
      if (backend == Backend::decode) continue;  // (the backward is cpu_flash's either way)
      const Gradients<bfloat16> g = sdpa_backward(q, k, v, r.output, r.logsumexp, dout, opt);
      for (int64_t i = 0; i < g.grad_query.numel(); ++i)
        ASSERT_EQ(widen(g.grad_query[i]), 0.0f) << "grad_query " << i;
      for (int64_t i = 0; i < g.grad_key.numel(); ++i)
        ASSERT_EQ(widen(g.grad_key[i]), 0.0f) << "grad_key " << i;
      for (int64_t e = 0; e < 2; ++e) {
        EXPECT_LE(std::abs(widen(g.grad_value[e]) - static_cast<double>(L - wins1)), 2 * 0x1p-8 * (L - wins1))
            << "key 0";
        EXPECT_LE(std::abs(widen(g.grad_value[2 + e]) - static_cast<double>(wins1)), 2 * 0x1p-8 * wins1)
            << "key 1";
      }
    }
}

template <class H>
void sweep(Backend backend, int cases, uint64_t seed) {
  // The path a CPU without AVX512_BF16 takes (bfloat16's products on widened operands; float16's
  // always): exactly the float call, rounded once. The bf16 instructions' path is checked below.
  const bf16_gemm::ScopedFloat32Fallback float_products;
  const std::pair<int64_t, int64_t> heads[] = {{2, 2}, {4, 2}, {3, 1}};
  // The last length is past kLongKeys (blocks.h): the backward's key segments, dQ summed over them.
  const int64_t lengths[][2] = {{7, 7}, {1, 40}, {33, 300}, {130, 97}, {16, 513}, {5, 16500}};
  for (int n = 0; n < cases; ++n) {
    Case c = sized(1, 2, 2, lengths[n % 6][0], lengths[n % 6][1], n % 3 == 0 ? 64 : 19, n % 2 ? 24 : 64);
    vary_options(c, n, heads, 3);
    if (backend == Backend::decode && c.q_len > 16) c.q_len = 16;
    c.need_weights = backend != Backend::decode && n % 6 == 1;
    check_half<H>(c, seed + static_cast<uint64_t>(n), backend);
  }
}

TEST(HalfPrecision, CpuFlashIsTheFloatCallRoundedOnce) {
  sweep<bfloat16>(Backend::cpu_flash, 26, 100);
  sweep<float16>(Backend::cpu_flash, 26, 200);
}

TEST(HalfPrecision, DecodeIsTheFloatCallRoundedOnce) {
  sweep<bfloat16>(Backend::decode, 26, 300);
  sweep<float16>(Backend::decode, 26, 400);
}

TEST(HalfPrecision, ReferenceIsTheFloatCallRoundedOnce) {
  sweep<bfloat16>(Backend::reference, 13, 500);
  sweep<float16>(Backend::reference, 13, 600);
}

TEST(HalfPrecision, AutomaticIsTheFloatCallRoundedOnce) {
  sweep<bfloat16>(Backend::automatic, 10, 700);  // decode for short rows, its backward on cpu_flash
}

TEST(HalfPrecision, EveryCompiledTargetAndThreadCount) {
  Case c = sized(2, 4, 2, 100, 300, 64, 64);
  c.mask = MaskKind::both;
  c.scoring.causal = Causal::bottom_right;
  c.scoring.softcap = 30;
  c.sinks = true;
  const ProductBounds<bfloat16> bf16_bounds = product_bounds<bfloat16>(c, 804);  // once, before the targets
  const ProductBounds<float16> f16_bounds = product_bounds<float16>(c, 805);
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    {
      const bf16_gemm::ScopedFloat32Fallback float_products;
      check_half<bfloat16>(c, 801, Backend::cpu_flash);
      check_half<float16>(c, 802, Backend::decode);
    }
    check_products(c, bf16_bounds);
    check_products(c, f16_bounds);
  }
  Inputs in = make_inputs(c, 803);
  round_inputs<bfloat16>(in);
  for (bf16_gemm::Path path : bf16_gemm::paths()) {
    SCOPED_TRACE(bf16_gemm::name(path));
    const bf16_gemm::ScopedPath pin(path);
    expect_bitwise_on_thread_counts([&] { return run<bfloat16>(c, in, Backend::cpu_flash); });
    expect_bitwise_on_thread_counts([&] { return run<float16>(c, in, Backend::cpu_flash); });
  }
}

// (B, L, H, D) memory viewed as (B, H, L, D), written in place; gradients added to what they hold.
TEST(HalfPrecision, StridedViewsAndAccumulation) {
  const int64_t B = 2, L = 37, S = 37, H = 4, D = 32;
  Generator gen(9);
  auto blhd = [&](int64_t n) { return converted<bfloat16>(random_tensor({B, n, H, D}, gen)); };
  auto bhld = [](Tensor<bfloat16>& t) {  // (B, n, H, D) as (B, H, n, D)
    const int64_t n = t.size(1);
    return View<bfloat16>(t.data(), {t.size(0), t.size(2), n, t.size(3)}, {n * t.size(2) * t.size(3), t.size(3), t.size(2) * t.size(3), 1});
  };
  Tensor<bfloat16> q = blhd(L), k = blhd(S), v = blhd(S), dout = blhd(L), out({B, L, H, D});
  Tensor<double> lse({B, H, L});
  Options<bfloat16> opt;
  opt.causal = Causal::top_left;
  sdpa_forward_into<bfloat16>(bhld(q), bhld(k), bhld(v), {bhld(out), lse, {}}, opt);
  const ForwardResult<bfloat16> whole = sdpa_forward(copy_of(View<const bfloat16>(bhld(q))),
                                                     copy_of(View<const bfloat16>(bhld(k))),
                                                     copy_of(View<const bfloat16>(bhld(v))), opt);
  EXPECT_TRUE(bitwise_equal(copy_of(View<const bfloat16>(bhld(out))), whole.output));
  // Gradients into views that hold 1 already: 1 + g, rounded once.
  Tensor<bfloat16> dq(q.shape(), narrow<bfloat16>(1.0f)), dk(k.shape(), narrow<bfloat16>(1.0f)),
      dv(v.shape(), narrow<bfloat16>(1.0f));
  sdpa_backward_into<bfloat16>(bhld(q), bhld(k), bhld(v), bhld(out), lse, bhld(dout),
                               {bhld(dq), bhld(dk), bhld(dv), /*accumulate=*/true}, opt);
  const Gradients<bfloat16> g =
      sdpa_backward(copy_of(View<const bfloat16>(bhld(q))), copy_of(View<const bfloat16>(bhld(k))),
                    copy_of(View<const bfloat16>(bhld(v))), whole.output, whole.logsumexp,
                    copy_of(View<const bfloat16>(bhld(dout))), opt);
  // The backend adds the float gradient to each element: 1 + (float g), where g alone is
  // rounded: compare within one bfloat16 unit of 1 + g.
  const Tensor<bfloat16> got = copy_of(View<const bfloat16>(bhld(dq)));
  for (int64_t i = 0; i < got.numel(); ++i)
    EXPECT_NEAR(widen(got[i]), 1.0f + widen(g.grad_query[i]), 0x1p-7f * (1.0f + std::abs(widen(g.grad_query[i]))))
        << "grad_query[" << i << "]";
}

}  // namespace
}  // namespace mha::attention
