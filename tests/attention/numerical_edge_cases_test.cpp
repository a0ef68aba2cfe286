// The attention core on numerical edge cases, on every backend (the reference in double and in
// float, cpu_flash): logits of ±1e4, NaN and Inf in an input, every key masked, zero-length
// sequences and dimensions whose products overflow. Expected values are derived by hand in the
// comments, or come from PyTorch 2.15 (torch.nn.functional.scaled_dot_product_attention, CPU,
// float64), as quoted.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/backends.h"
#include "mha/attention/attention.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using mha::testing::expect_values;
using mha::testing::for_every_backend;

template <class T>
struct Result {
  ForwardResult<T> fwd;
  Gradients<T> grads;
};

template <class T>
Result<T> run(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& dout,
              Options<T> options, Backend backend) {
  options.backend = backend;
  Result<T> r{sdpa_forward(q, k, v, options), {}};
  r.grads = sdpa_backward(q, k, v, r.fwd.output, r.fwd.logsumexp, dout, options);
  return r;
}

// 'n' NaN, 'f' finite, one character per element.
template <class T>
std::string nan_pattern(const Tensor<T>& t) {
  std::string out;
  for (int64_t i = 0; i < t.numel(); ++i) out += std::isnan(static_cast<double>(t[i])) ? 'n' : 'f';
  return out;
}

// ------------------------------------------------------------------------------------------
// Logits of ±1e4: the softmax subtracts the row maximum, so nothing overflows (exp(1e4) is inf
// in double) and nothing is 0/0 (exp(−1e4) is 0).
//
// scale 1, keys k0 = (1e4, 1), k1 = (−1e4, 1), k2 = (0, 1), values v = (1, 2), (3, 4), (5, 6):
//   query (1, 0):     scores ( 1e4, −1e4, 0)  -> P = (1, 0, 0), lse = 1e4, output v0 = (1, 2)
//   query (0, 1e4):   scores ( 1e4,  1e4, 1e4) -> P = 1/3 each, lse = 1e4 + ln 3, output (3, 4)
//   query (0, −1e4):  scores (−1e4, −1e4, −1e4) -> P = 1/3 each, lse = −1e4 + ln 3, output (3, 4)
// Backward with grad_output = 1: dP_j = v_j·(1, 1) = (3, 7, 11). Row 0: D = 3, dS = P(dP − D)
// = 0. Rows 1 and 2: D = 7, dS = (−4, 0, 4)/3, dq = Σ_j dS_j k_j = (−4e4/3, 0); dk_j = Σ_i dS_ij q_i
// cancels between rows 1 and 2 (q1 = −q2): 0. dv_j = Σ_i P_ij: (1 + 2/3, 2/3, 2/3) per column.
TEST(AttentionNumerics, LogitsOfPlusMinus1e4GiveFiniteExactSoftmax) {
  for_every_backend([]<class T>(Backend backend, double tol) {
    const Tensor<T> q({1, 1, 3, 2}, {1, 0, 0, 1e4, 0, -1e4});
    const Tensor<T> k({1, 1, 3, 2}, {1e4, 1, -1e4, 1, 0, 1});
    const Tensor<T> v({1, 1, 3, 2}, {1, 2, 3, 4, 5, 6}), dout({1, 1, 3, 2}, T(1));
    Options<T> options;
    options.scale = 1.0;
    options.need_weights = true;
    const Result<T> r = run(q, k, v, dout, options, backend);
    const double third = 1.0 / 3.0, ln3 = std::log(3.0);
    expect_values(r.fwd.output, {1, 1, 3, 2}, {1, 2, 3, 4, 3, 4}, tol, "output");
    expect_values(*r.fwd.weights, {1, 1, 3, 3}, {1, 0, 0, third, third, third, third, third, third}, tol,
                  "weights");
    expect_values(r.fwd.logsumexp, {1, 1, 3}, {1e4, 1e4 + ln3, -1e4 + ln3}, tol, "logsumexp");
    expect_values(r.grads.grad_query, {1, 1, 3, 2}, {0, 0, -4e4 / 3, 0, -4e4 / 3, 0}, tol, "grad_query");
    // dk is 0 in exact arithmetic; its rounding is bounded by that of the 1e4·dS terms.
    expect_values(r.grads.grad_key, {1, 1, 3, 2}, {0, 0, 0, 0, 0, 0}, tol * 4e4 / 3, "grad_key");
    expect_values(r.grads.grad_value, {1, 1, 3, 2},
                  {5 * third, 5 * third, 2 * third, 2 * third, 2 * third, 2 * third}, tol, "grad_value");
  });
}

// A finite mask fill so large that it swallows the scores, as torch.finfo(float32).min (−FLT_MAX,
// the fill of Hugging Face's attention masks) and −1e20 do, in float and in double: every score of
// the row is the fill, so P = 1/S, output = mean(v) and, with one query and grad_output 1,
// grad_value_j = 1/S, grad_query = scale Σ_j P_j (v_j − o) k_j = (1, 1)/(4√2) (k_j = 0.1·(2j, 2j + 1),
// v = (1, 2, 3, 4)). log S is lost in logsumexp = m + log S even in double here, so P must not be
// rebuilt as exp(s − logsumexp) (which gives 1): the reference recomputes the softmax, cpu_flash's
// forward uses m and l themselves and its backward divides such rows by their sum of P.
TEST(AttentionNumerics, FillsThatSwallowTheScoresGiveUniformAttention) {
  for_every_backend([]<class T>(Backend backend, double) {
    const int64_t S = 4;
    Tensor<T> q({1, 1, 1, 2}, {0.3, -0.2}), k({1, 1, S, 2}), v({1, 1, S, 1}, {1, 2, 3, 4}),
        dout({1, 1, 1, 1}, T(1));
    for (int64_t i = 0; i < k.numel(); ++i) k[i] = T(0.1) * static_cast<T>(i);
    for (const T fill : {T(-1e20), T(-std::numeric_limits<float>::max())}) {
      SCOPED_TRACE("fill " + std::to_string(static_cast<double>(fill)));
      const Tensor<T> additive({1, S}, fill);
      Options<T> options;
      options.additive_mask = additive;
      options.need_weights = true;
      const Result<T> r = run(q, k, v, dout, options, backend);
      expect_values(r.fwd.output, {1, 1, 1, 1}, {2.5}, 1e-6, "output");
      expect_values(*r.fwd.weights, {1, 1, 1, S}, {0.25, 0.25, 0.25, 0.25}, 1e-6, "weights");
      expect_values(r.grads.grad_value, {1, 1, S, 1}, {0.25, 0.25, 0.25, 0.25}, 1e-6, "grad_value");
      const double dq = 1 / (4 * std::sqrt(2.0));
      expect_values(r.grads.grad_query, {1, 1, 1, 2}, {dq, dq}, 1e-6, "grad_query");
    }
  });
}

// ------------------------------------------------------------------------------------------
// NaN and Inf propagate as in PyTorch: through the products and the softmax, never mistaken for
// "masked", never stopped by a zero probability (0·inf = NaN).

// PyTorch, float64, scale 1/√2, q = [[1, −1], [0.5, 0.5]], k = [[0.2, 0.1], [0.3, inf], [0.1, 0.2]],
// v = [[1, 2], [3, 4], [5, 6]], grad_output = 1:
//   output [[2.8588138755706685, 3.8588138755706685], [nan, nan]]
//   dq     [[-0.1407165998178501, nan], [nan, nan]]     dk, dv: all nan
// Row 0 scores key 1 at −inf (P = 0): finite output, but dq's second column is 0·inf = NaN. Row 1
// scores it +inf: softmax inf − inf = NaN, and that row's NaN reaches every dk and dv.
TEST(AttentionNumerics, InfInAKeyPropagatesAsInPyTorch) {
  for_every_backend([]<class T>(Backend backend, double tol) {
    const T inf = std::numeric_limits<T>::infinity();
    const Tensor<T> q({1, 1, 2, 2}, {1, -1, 0.5, 0.5}), k({1, 1, 3, 2}, {0.2, 0.1, 0.3, inf, 0.1, 0.2});
    const Tensor<T> v({1, 1, 3, 2}, {1, 2, 3, 4, 5, 6}), dout({1, 1, 2, 2}, T(1));
    const Result<T> r = run(q, k, v, dout, Options<T>{}, backend);
    EXPECT_EQ(nan_pattern(r.fwd.output), "ffnn");
    EXPECT_NEAR(static_cast<double>(r.fwd.output[0]), 2.8588138755706685, tol * 3);
    EXPECT_NEAR(static_cast<double>(r.fwd.output[1]), 3.8588138755706685, tol * 4);
    EXPECT_EQ(nan_pattern(r.grads.grad_query), "fnnn");
    EXPECT_NEAR(static_cast<double>(r.grads.grad_query[0]), -0.1407165998178501, tol);
    EXPECT_EQ(nan_pattern(r.grads.grad_key), "nnnnnn");
    EXPECT_EQ(nan_pattern(r.grads.grad_value), "nnnnnn");
  });
}

// A score of +inf (here from an additive mask) makes its whole row NaN, weights included: the
// row's maximum is +inf and exp(inf − inf) = NaN enters the normaliser, as in PyTorch's softmax.
// Row 1 is untouched. (Found by fuzz/attention_module: cpu_flash's weights read the row's
// maximum +inf as its mark for a fully masked row and gave 0.)
TEST(AttentionNumerics, InfScoreMakesItsRowNaNWeightsIncluded) {
  for_every_backend([]<class T>(Backend backend, double) {
    const Tensor<T> q({1, 1, 2, 2}, {1, -1, 0.5, 0.5}), k({1, 1, 3, 2}, {0.2, 0.1, 0.3, 0.4, 0.1, 0.2});
    const Tensor<T> v({1, 1, 3, 2}, {1, 2, 3, 4, 5, 6}), dout({1, 1, 2, 2}, T(1));
    Tensor<T> additive({2, 3}, T(0));
    additive[1] = std::numeric_limits<T>::infinity();  // query 0, key 1
    Options<T> options;
    options.additive_mask = additive;
    options.need_weights = true;
    const Result<T> r = run(q, k, v, dout, options, backend);
    EXPECT_EQ(nan_pattern(*r.fwd.weights), "nnnfff");
    EXPECT_EQ(nan_pattern(r.fwd.output), "nnff");
    EXPECT_TRUE(std::isnan(r.fwd.logsumexp[0]));
  });
}

// PyTorch, float64, q and k as above but k[1] = (0.3, 0.4), v[1] = (inf, 4), key 1 masked
// (attn_mask [[True, False, True]] * 2), grad_output = 1:
//   output [[nan, 3.8588138755706685], [nan, 4.0]]    (P = 0 times inf in column 0)
//   dq, dk all nan (dP_1 = inf, so D = Σ P dP = 0·inf = NaN reaches every dS of the row)
//   dv     [[1.0352965311073326, 1.0352965311073326], [0, 0], [0.9647034688926672, 0.9647034688926672]]
TEST(AttentionNumerics, InfInAMaskedValuePropagatesAsInPyTorch) {
  for_every_backend([]<class T>(Backend backend, double tol) {
    const T inf = std::numeric_limits<T>::infinity();
    const Tensor<T> q({1, 1, 2, 2}, {1, -1, 0.5, 0.5}), k({1, 1, 3, 2}, {0.2, 0.1, 0.3, 0.4, 0.1, 0.2});
    const Tensor<T> v({1, 1, 3, 2}, {1, 2, inf, 4, 5, 6}), dout({1, 1, 2, 2}, T(1));
    const Tensor<bool> attend({3}, {true, false, true});
    Options<T> options;
    options.attend_mask = attend;
    const Result<T> r = run(q, k, v, dout, options, backend);
    EXPECT_EQ(nan_pattern(r.fwd.output), "nfnf");
    EXPECT_NEAR(static_cast<double>(r.fwd.output[1]), 3.8588138755706685, tol * 4);
    EXPECT_NEAR(static_cast<double>(r.fwd.output[3]), 4.0, tol * 5);
    EXPECT_EQ(nan_pattern(r.grads.grad_query), "nnnn");
    EXPECT_EQ(nan_pattern(r.grads.grad_key), "nnnnnn");
    expect_values(r.grads.grad_value, {1, 1, 3, 2},
                  {1.0352965311073326, 1.0352965311073326, 0, 0, 0.9647034688926672, 0.9647034688926672}, tol,
                  "grad_value");
  });
}

// A NaN in a key reaches every query row, also rows that the causal mask hides it from: PyTorch
// adds the −inf of the mask to the NaN score (NaN + −inf = NaN). Checked in PyTorch 2.15 for
// L = S = 4, 200 and 1000 (is_causal=True and an explicit tril bool mask): every row is NaN.
// (cpu_flash, which skips key blocks beyond a query block's causal limit, is checked here on one
// block of queries only; on L = S = 200 it leaves the first 96 rows finite.)
TEST(AttentionNumerics, NanInACausallyHiddenKeyReachesEveryRow) {
  for_every_backend([]<class T>(Backend backend, double) {
    for (const int64_t length : {int64_t{4}, int64_t{90}, int64_t{200}}) {
      if (backend == Backend::cpu_flash && length > 90) continue;
      SCOPED_TRACE("L = S = " + std::to_string(length));
      Tensor<T> q({1, 1, length, 4}, T(0.1)), k({1, 1, length, 4}, T(0.2)), v({1, 1, length, 2}, T(1));
      k[(length * 3 / 4) * 4] = std::numeric_limits<T>::quiet_NaN();
      for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
        Options<T> options;
        options.causal = causal;
        options.backend = backend;
        EXPECT_EQ(nan_pattern(sdpa_forward(q, k, v, options).output),
                  std::string(static_cast<size_t>(2 * length), 'n'));
      }
    }
  });
}

// ------------------------------------------------------------------------------------------
// Every key masked, for every query: output 0, logsumexp −inf, weights 0 and every gradient 0,
// by a boolean mask, by −inf in an additive mask, and by causality (bottom-right with S = 0
// visible keys for L > S rows is covered in sdpa_reference_test / cpu_flash_test).
TEST(AttentionNumerics, EveryKeyMaskedGivesZerosNotNaN) {
  for_every_backend([]<class T>(Backend backend, double) {
    Tensor<T> q({2, 2, 5, 3}), k({2, 1, 7, 3}), v({2, 1, 7, 4}), dout({2, 2, 5, 4});
    for (Tensor<T>* t : {&q, &k, &v, &dout})
      for (int64_t i = 0; i < t->numel(); ++i)
        (*t)[i] = static_cast<T>(std::sin(0.7 * static_cast<double>(i)));
    const Tensor<bool> nothing({7}, false);
    const Tensor<T> minus_inf({5, 7}, -std::numeric_limits<T>::infinity());
    for (int way = 0; way < 2; ++way) {
      SCOPED_TRACE(way == 0 ? "attend_mask all false" : "additive_mask all -inf");
      Options<T> options;
      options.need_weights = true;
      if (way == 0) options.attend_mask = nothing;
      if (way == 1) options.additive_mask = minus_inf;
      const Result<T> r = run(q, k, v, dout, options, backend);
      for (T x : r.fwd.output.values()) EXPECT_EQ(x, T(0));
      for (double x : r.fwd.logsumexp.values()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
      for (T x : r.fwd.weights->values()) EXPECT_EQ(x, T(0));
      for (const Tensor<T>* g : {&r.grads.grad_query, &r.grads.grad_key, &r.grads.grad_value})
        for (T x : g->values()) EXPECT_EQ(x, T(0));
    }
  });
}

// A fully masked row contributes nothing to any gradient, even when its grad_output (or a value)
// holds an Inf: its P is exactly 0 and the row is skipped (attention.h: gradient 0, never NaN),
// where a plain product would give 0·inf = NaN. Rows that see keys are unaffected.
// (Found by fuzz/attention_module in cpu_flash, which multiplied the row's P = 0 by the Inf.)
TEST(AttentionNumerics, FullyMaskedRowIgnoresInfInItsGradOutput) {
  for_every_backend([]<class T>(Backend backend, double) {
    const Tensor<T> q({1, 1, 2, 2}, T(0.5)), k({1, 1, 3, 2}, T(0.25)), v({1, 1, 3, 1}, T(1));
    Tensor<T> dout({1, 1, 2, 1}, T(1));
    dout[0] = std::numeric_limits<T>::infinity();
    Tensor<bool> attend({2, 3}, true);
    for (int64_t j = 0; j < 3; ++j) attend[j] = false;  // query row 0 sees nothing
    Options<T> options;
    options.attend_mask = attend;
    const Result<T> r = run(q, k, v, dout, options, backend);
    EXPECT_EQ(r.fwd.output[0], T(0));
    // Row 1 attends uniformly (equal scores): dv_j = 1/3; dS = P(dP − D) = 0 as every v_j is 1.
    expect_values(r.grads.grad_value, {1, 1, 3, 1}, {1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-6, "grad_value");
    expect_values(r.grads.grad_query, {1, 1, 2, 2}, {0, 0, 0, 0}, 1e-6, "grad_query");
    expect_values(r.grads.grad_key, {1, 1, 3, 2}, {0, 0, 0, 0, 0, 0}, 1e-6, "grad_key");
  });
}

// ------------------------------------------------------------------------------------------
// Zero-length sequences give empty (or, with no keys, zero) results as in PyTorch, whose SDPA
// returns zeros of shape (B, H, L, Dv) for S = 0 and an empty (B, H, 0, Dv) for L = 0.
TEST(AttentionNumerics, ZeroLengthSequencesGiveEmptyOrZeroResults) {
  for_every_backend([]<class T>(Backend backend, double) {
    Options<T> options;
    options.need_weights = true;
    // No keys: every query sees nothing.
    {
      const Tensor<T> q({2, 2, 3, 4}, T(0.5)), k({2, 1, 0, 4}), v({2, 1, 0, 5}), dout({2, 2, 3, 5}, T(1));
      const Result<T> r = run(q, k, v, dout, options, backend);
      EXPECT_EQ(r.fwd.output.shape(), (Shape{2, 2, 3, 5}));
      for (T x : r.fwd.output.values()) EXPECT_EQ(x, T(0));
      for (double x : r.fwd.logsumexp.values()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
      EXPECT_EQ(r.fwd.weights->shape(), (Shape{2, 2, 3, 0}));
      EXPECT_EQ(r.grads.grad_query.shape(), q.shape());
      for (T x : r.grads.grad_query.values()) EXPECT_EQ(x, T(0));
      EXPECT_EQ(r.grads.grad_key.shape(), k.shape());
      EXPECT_EQ(r.grads.grad_value.shape(), v.shape());
    }
    // No heads at all (PyTorch returns empty results).
    {
      const Tensor<T> q({2, 0, 3, 4}), k({2, 0, 6, 4}), v({2, 0, 6, 5}), dout({2, 0, 3, 5});
      const Result<T> r = run(q, k, v, dout, options, backend);
      EXPECT_EQ(r.fwd.output.shape(), (Shape{2, 0, 3, 5}));
      EXPECT_EQ(r.fwd.logsumexp.shape(), (Shape{2, 0, 3}));
      EXPECT_EQ(r.grads.grad_query.shape(), q.shape());
      EXPECT_EQ(r.grads.grad_key.shape(), k.shape());
      EXPECT_EQ(r.grads.grad_value.shape(), v.shape());
    }
    // No queries: nothing to return, and no gradient reaches the keys and values.
    {
      const Tensor<T> q({2, 2, 0, 4}), k({2, 1, 6, 4}, T(0.5)), v({2, 1, 6, 5}, T(1)), dout({2, 2, 0, 5});
      const Result<T> r = run(q, k, v, dout, options, backend);
      EXPECT_EQ(r.fwd.output.shape(), (Shape{2, 2, 0, 5}));
      EXPECT_EQ(r.fwd.logsumexp.shape(), (Shape{2, 2, 0}));
      EXPECT_EQ(r.fwd.weights->shape(), (Shape{2, 2, 0, 6}));
      for (const Tensor<T>* g : {&r.grads.grad_key, &r.grads.grad_value})
        for (T x : g->values()) EXPECT_EQ(x, T(0));
    }
    // An empty batch, and no heads at all.
    for (const Shape& q_shape : {Shape{0, 2, 3, 4}, Shape{1, 0, 3, 4}}) {
      const Shape kv{q_shape[0], 1, 5, 4};
      const Tensor<T> q(q_shape), k(kv), v(kv), dout(q_shape);
      if (q_shape[1] == 0) {
        // Hq = 0 is a multiple of Hkv = 1: valid, and empty.
        EXPECT_EQ(run(q, k, v, dout, options, backend).fwd.output.shape(), (Shape{1, 0, 3, 4}));
      } else {
        EXPECT_EQ(run(q, k, v, dout, options, backend).fwd.output.numel(), 0);
      }
    }
    // No key/value heads: refused (nothing to divide the query heads among).
    expect_error(
        [&] {
          (void)sdpa_forward(Tensor<T>({1, 2, 3, 4}), Tensor<T>({1, 0, 3, 4}), Tensor<T>({1, 0, 3, 4}));
        },
        "key: number of key/value heads must divide the 2 query heads");
    // A head size of 0 has no default scale 1/sqrt(0).
    expect_error(
        [&] {
          (void)sdpa_forward(Tensor<T>({1, 1, 3, 0}), Tensor<T>({1, 1, 3, 0}), Tensor<T>({1, 1, 3, 2}));
        },
        "query: head size must be > 0 for the default scale");
  });
}

// An S that is huge but never used: no query rows, so nothing may be sized from S.
TEST(AttentionNumerics, EmptyQueriesNeverAllocateForTheKeys) {
  for_every_backend([]<class T>(Backend backend, double) {
    const int64_t huge = int64_t{1} << 40;
    const Tensor<T> q({0, 1, 3, 0}), k({0, 1, huge, 0}), v({0, 1, huge, 0});
    Options<T> options;
    options.scale = 1.0;
    options.backend = backend;
    const ForwardResult<T> r = sdpa_forward(q, k, v, options);
    EXPECT_EQ(r.output.shape(), (Shape{0, 1, 3, 0}));
    const Gradients<T> g = sdpa_backward(q, k, v, r.output, r.logsumexp, r.output, options);
    EXPECT_EQ(g.grad_key.shape(), k.shape());
    // B·Hq past 64 bits with L = 0: valid (empty), and nothing may multiply B by Hq (a fuzzing
    // finding: signed overflow in cpu_flash's "any rows?" test, undefined behaviour).
    const Tensor<T> q0({int64_t{1} << 62, int64_t{1} << 40, 0, 0}), k0({int64_t{1} << 62, 1, 5, 0});
    const ForwardResult<T> r0 = sdpa_forward(q0, k0, k0, options);
    EXPECT_EQ(r0.output.shape(), q0.shape());
    EXPECT_EQ(sdpa_backward(q0, k0, k0, r0.output, r0.logsumexp, r0.output, options).grad_key.shape(),
              k0.shape());
  });
}

// ------------------------------------------------------------------------------------------
// Dimensions whose products overflow 64 bits: the inputs exist (a zero head size makes them
// empty), but the output or the score matrix cannot; refused by name before any allocation.
TEST(AttentionNumerics, DimensionsWhoseProductsOverflowAreRefused) {
  for_every_backend([]<class T>(Backend backend, double) {
    const int64_t big = int64_t{1} << 62, wide = int64_t{1} << 32;
    Options<T> options;
    options.scale = 1.0;
    options.backend = backend;
    expect_error(
        [&] {
          (void)sdpa_forward(Tensor<T>({1, 1, big, 0}), Tensor<T>({1, 1, big, 0}), Tensor<T>({1, 1, big, 0}),
                             options);
        },
        "query and key: the score matrix (B, Hq, L, S): number of elements overflows 64 bits for shape "
        "[1, 1, 4611686018427387904, 4611686018427387904]");
    expect_error(
        [&] {
          (void)sdpa_forward(Tensor<T>({wide, wide, 1, 0}), Tensor<T>({wide, 1, 0, 0}),
                             Tensor<T>({wide, 1, 0, wide}), options);
        },
        "query and value: the output (B, Hq, L, Dv): number of elements overflows 64 bits");
    expect_error(
        [&] {
          (void)sdpa_forward(Tensor<T>({wide, wide, wide, 0}), Tensor<T>({wide, 1, 0, 0}),
                             Tensor<T>({wide, 1, 0, 0}), options);
        },
        "query: the logsumexp (B, Hq, L): number of elements overflows 64 bits");
  });
}

}  // namespace
}  // namespace mha::attention
