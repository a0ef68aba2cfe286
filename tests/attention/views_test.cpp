// sdpa_forward_into / sdpa_backward_into on views of caller-owned memory: strided inputs and
// outputs give bitwise what the Tensor calls give on contiguous copies (every backend, with masks
// read through broadcast strides, GQA, causality, dropout, weights); outputs are overwritten
// whatever they held; and every bad view is refused with the argument named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/assertions.h"
#include "../support/attention_cases.h"
#include "../support/gradient_check.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/core/view.h"

namespace mha::attention {
namespace {

using mha::testing::expect_error;
using mha::testing::random_tensor;  // uniform in [-1, 1)

// (B, H, N, D) data stored as (B, N, H, D) with `pad` unused elements after each row of H·D
// (a slice of a wider buffer): the layout of projections split into heads without a copy.
// The unused elements hold NaN, so reading them would show.
template <class T>
struct Interleaved {
  std::vector<T> storage;
  View<T> view;

  Interleaved(const Shape& bhnd, int64_t pad) {
    const int64_t b = bhnd[0], h = bhnd[1], n = bhnd[2], d = bhnd[3];
    const int64_t row = h * d + pad;
    storage.assign(static_cast<size_t>(b * n * row + 1), std::numeric_limits<T>::quiet_NaN());
    view = View<T>(storage.data(), bhnd, {n * row, d, row, 1});
  }
  void fill_from(const Tensor<T>& t) {
    for (int64_t i = 0; i < t.numel(); ++i) at(i) = t[i];
  }
  Tensor<T> to_tensor() const {
    Tensor<T> t(view.shape());
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = at(i);
    return t;
  }
  // Element i of the row-major (B, H, N, D) order (the view's memory is the storage's).
  T& at(int64_t i) const {
    int64_t offset = 0;
    for (int64_t a = 3; a >= 0; --a) {
      offset += (i % view.size(a)) * view.stride(a);
      i /= view.size(a);
    }
    return view.data()[offset];
  }
};

template <class T>
void expect_bitwise(const Tensor<T>& got, const Tensor<T>& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(T) * static_cast<size_t>(got.numel())), 0) << what;
}

// A case on a backend: a (S) key mask and an additive (L, S) mask (MaskKind::bool_keys_additive_2d).
struct ViewCase {
  Backend backend;
  test_cases::Case c;

  ViewCase(Backend b, Causal causal, double dropout, bool need_weights) : backend(b), c(test_cases::sized(2, 4, 2, 37, 29, 16, 8)) {
    c.mask = test_cases::MaskKind::bool_keys_additive_2d;
    c.scoring.causal = causal;
    c.scoring.dropout_p = dropout;
    c.scoring.dropout_seed = 11;
    c.need_weights = need_weights;
  }
};

template <class T>
void check_views_match_tensors(const ViewCase& vc) {
  const test_cases::Case& c = vc.c;
  SCOPED_TRACE(std::string(test_cases::name_of(vc.backend)) + " " + c.describe());
  const int64_t B = c.batch, Hq = c.q_heads, Hkv = c.kv_heads, L = c.q_len, S = c.k_len, D = c.qk_dim, Dv = c.v_dim;
  const test_cases::Inputs in = test_cases::make_inputs(c, 7);
  const Tensor<T> q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v), dout = cast<T>(in.dout);
  // Masks as views: the (S) key mask expanded to (B, Hq, L, S) with strides 0 (as torch's expand
  // gives), against the same mask materialised.
  const Tensor<bool>& keys = *in.attend;
  Tensor<bool> keys_full({B, Hq, L, S});
  for (int64_t i = 0; i < keys_full.numel(); ++i) keys_full[i] = keys[i % S];

  test_cases::Held<T> held;
  Options<T> opt = test_cases::options_of<T>(c, in, vc.backend, held);
  opt.attend_mask = keys_full;
  const ForwardResult<T> want = sdpa_forward(q, k, v, opt);
  const Gradients<T> want_grads = sdpa_backward(q, k, v, want.output, want.logsumexp, dout, opt);

  opt.attend_mask = View<const bool>(keys.data(), {B, Hq, L, S}, {0, 0, 0, 1});
  Interleaved<T> qi({B, Hq, L, D}, 3), ki({B, Hkv, S, D}, 0), vi({B, Hkv, S, Dv}, 5), douti({B, Hq, L, Dv}, 1);
  qi.fill_from(q);
  ki.fill_from(k);
  vi.fill_from(v);
  douti.fill_from(dout);
  // Outputs start as garbage: every element must be written.
  Interleaved<T> out({B, Hq, L, Dv}, 2);
  Tensor<double> lse({B, Hq, L}, std::numeric_limits<double>::quiet_NaN());
  Tensor<T> weights({B, Hq, L, S}, T(5));
  std::fill(out.storage.begin(), out.storage.end(), T(3));
  ForwardOutputs<T> outs{out.view, lse, c.need_weights ? View<T>(weights) : View<T>()};
  sdpa_forward_into<T>(qi.view, ki.view, vi.view, outs, opt);
  expect_bitwise(out.to_tensor(), want.output, "output");
  expect_bitwise(lse, want.logsumexp, "logsumexp");
  if (c.need_weights) expect_bitwise(weights, *want.weights, "weights");

  Interleaved<T> dq({B, Hq, L, D}, 1), dk({B, Hkv, S, D}, 4), dv({B, Hkv, S, Dv}, 0);
  for (auto* g : {&dq, &dk, &dv}) std::fill(g->storage.begin(), g->storage.end(), T(-2));
  sdpa_backward_into<T>(qi.view, ki.view, vi.view, out.view, lse, douti.view, {dq.view, dk.view, dv.view}, opt);
  expect_bitwise(dq.to_tensor(), want_grads.grad_query, "grad_query");
  expect_bitwise(dk.to_tensor(), want_grads.grad_key, "grad_key");
  expect_bitwise(dv.to_tensor(), want_grads.grad_value, "grad_value");
}

TEST(AttentionViews, StridedInputsAndOutputsGiveBitwiseWhatTensorsGive) {
  for (Backend backend : {Backend::reference, Backend::cpu_flash})
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
      for (double dropout : {0.0, 0.3})
        for (bool weights : {false, true}) {
          check_views_match_tensors<float>({backend, causal, dropout, weights});
          if (backend == Backend::reference) check_views_match_tensors<double>({backend, causal, dropout, weights});
        }
}

// Long keys take the kernels' other paths (a shared packed kv head, key segments in backward).
TEST(AttentionViews, LongKeysStrided) {
  const int64_t B = 1, H = 1, L = 7, S = 16385, D = 8;
  Generator gen(3);
  const Tensor<float> q = random_tensor<float>({B, H, L, D}, gen), k = random_tensor<float>({B, H, S, D}, gen),
                      v = random_tensor<float>({B, H, S, D}, gen), dout = random_tensor<float>({B, H, L, D}, gen);
  const ForwardResult<float> want = sdpa_forward(q, k, v);
  const Gradients<float> want_grads = sdpa_backward(q, k, v, want.output, want.logsumexp, dout);
  Interleaved<float> qi({B, H, L, D}, 1), ki({B, H, S, D}, 2), vi({B, H, S, D}, 3), out({B, H, L, D}, 1);
  qi.fill_from(q);
  ki.fill_from(k);
  vi.fill_from(v);
  Tensor<double> lse({B, H, L});
  sdpa_forward_into<float>(qi.view, ki.view, vi.view, {out.view, lse, {}});
  expect_bitwise(out.to_tensor(), want.output, "output");
  Interleaved<float> dq({B, H, L, D}, 1), dk({B, H, S, D}, 1), dv({B, H, S, D}, 1);
  sdpa_backward_into<float>(qi.view, ki.view, vi.view, out.view, lse, dout, {dq.view, dk.view, dv.view});
  expect_bitwise(dq.to_tensor(), want_grads.grad_query, "grad_query");
  expect_bitwise(dk.to_tensor(), want_grads.grad_key, "grad_key");
  expect_bitwise(dv.to_tensor(), want_grads.grad_value, "grad_value");
}

TEST(AttentionViews, BadViewsAreRefusedByName) {
  Generator gen(1);
  Tensor<float> q = random_tensor<float>({1, 2, 4, 8}, gen), k = random_tensor<float>({1, 2, 4, 8}, gen);
  Tensor<float> v = random_tensor<float>({1, 2, 4, 8}, gen);
  Tensor<float> out({1, 2, 4, 8});
  Tensor<double> lse({1, 2, 4});
  // A last dimension that is not contiguous (a transposed view).
  const View<const float> transposed(q.data(), {1, 2, 4, 8}, {64, 32, 1, 4});
  expect_error([&] { sdpa_forward_into<float>(transposed, k, v, {out, lse, {}}); },
               "query: expected a contiguous last dimension (stride 1)");
  // Outputs: overlapping an input, overlapping another output, elements repeated, wrong shape,
  // weights given or missing against need_weights.
  expect_error([&] { sdpa_forward_into<float>(q, k, v, {View<float>(v), lse, {}}); },
               "output: the output overlaps an input of the call");
  View<double> lse_in_out(reinterpret_cast<double*>(out.data()), {1, 2, 4});
  expect_error([&] { sdpa_forward_into<float>(q, k, v, {out, lse_in_out, {}}); },
               "logsumexp: the output overlaps another output of the call");
  expect_error([&] { sdpa_forward_into<float>(q, k, v, {View<float>(out.data(), {1, 2, 4, 8}, {0, 0, 8, 1}), lse, {}}); },
               "output: expected an output whose elements do not share memory");
  expect_error([&] { sdpa_forward_into<float>(q, k, v, {View<float>(out.data(), {1, 2, 4, 4}), lse, {}}); },
               "output: expected shape [1, 2, 4, 8], got [1, 2, 4, 4]");
  Tensor<float> weights({1, 2, 4, 4});
  expect_error([&] { sdpa_forward_into<float>(q, k, v, {out, lse, weights}); },
               "weights: expected none (options.need_weights is not set), got one");
  Options<float> with_weights;
  with_weights.need_weights = true;
  expect_error([&] { sdpa_forward_into<float>(q, k, v, {out, lse, {}}, with_weights); },
               "weights: expected an output for the weights (options.need_weights is set), got none");
  Tensor<float> dq({1, 2, 4, 8}), dk({1, 2, 4, 8}), dv({1, 2, 4, 8});
  expect_error([&] { sdpa_backward_into<float>(q, k, v, out, lse, out, {dq, View<float>(q), dv}); },
               "grad_key: the output overlaps an input of the call");
  expect_error([&] { sdpa_backward_into<float>(q, k, v, out, lse, out, {dq, dk, View<float>(dq)}); },
               "grad_value: the output overlaps another output of the call");
  // A mask with a bad broadcast shape, given as a view.
  Options<float> bad_mask;
  Tensor<bool> mask({3});
  bad_mask.attend_mask = mask;
  expect_error([&] { sdpa_forward_into<float>(q, k, v, {out, lse, {}}, bad_mask); },
               "attend_mask: expected a 1-D to 4-D shape broadcastable");
  // Views themselves: strides per dimension, none negative.
  expect_error([] { View<float>(nullptr, {2, 2}, {1}); }, "View: expected one stride per dimension");
  expect_error([&] { View<float>(out.data(), {2}, {-1}); }, "View: strides must be >= 0");
  expect_error([] { View<float>(nullptr, {2}); }, "View: null data for shape [2]");
}

// A view of no elements addresses no memory: numpy gives such arrays all-zero strides. No
// queries: nothing to do; no keys: every row attends to nothing (output 0, logsumexp −inf).
TEST(AttentionViews, EmptyViewsWithZeroStrides) {
  float x[1] = {0};
  double l[1] = {0};
  const View<const float> no_queries(x, {1, 2, 0, 8}, {0, 0, 0, 0}), kv(x, {1, 2, 3, 8}, {0, 0, 0, 1});
  View<float> no_output(x, {1, 2, 0, 8}, {0, 0, 0, 0});
  EXPECT_NO_THROW(sdpa_forward_into<float>(no_queries, kv, kv, {no_output, View<double>(l, {1, 2, 0}, {0, 0, 0}), {}}));

  const View<const float> no_keys(x, {1, 2, 0, 8}, {0, 0, 0, 0});
  Tensor<float> q({1, 2, 3, 8}, 1.0f), out({1, 2, 3, 8}, 7.0f);
  Tensor<double> lse({1, 2, 3});
  sdpa_forward_into<float>(q, no_keys, no_keys, {out, lse, {}});
  for (float o : out.values()) EXPECT_EQ(o, 0.0f);
  for (double v : lse.values()) EXPECT_EQ(v, -std::numeric_limits<double>::infinity());
}

TEST(AttentionViews, ElementsDistinct) {
  float x[64];
  EXPECT_TRUE(elements_distinct(View<float>(x, {2, 3, 4})));
  EXPECT_TRUE(elements_distinct(View<float>(x, {2, 3, 4}, {4, 8, 1})));    // heads/rows swapped
  EXPECT_FALSE(elements_distinct(View<float>(x, {2, 3, 4}, {0, 4, 1})));   // broadcast
  EXPECT_FALSE(elements_distinct(View<float>(x, {2, 3, 4}, {12, 3, 1})));  // rows overlap
  EXPECT_TRUE(elements_distinct(View<float>(x, {1, 3, 4}, {0, 4, 1})));    // size 1: stride unused
}

}  // namespace
}  // namespace mha::attention
