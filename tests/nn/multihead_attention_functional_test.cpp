// multihead_attention_forward / _backward on parameters the caller owns: bitwise what the module
// gives (the module calls them with views of its own tensors, so this pins the views, not the
// maths: the module's own tests check the maths), and weights that do not fit the options
// refused by name.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "../support/assertions.h"
#include "../support/gradient_check.h"
#include "mha/nn/multihead_attention.h"

namespace mha::nn {
namespace {

using mha::testing::expect_error;
using mha::testing::random_tensor;

struct FunctionalCase {
  const char* name;
  int64_t embed_dim = 8, num_heads = 2;
  std::optional<int64_t> kdim, vdim;
  bool bias = true, add_bias_kv = false, add_zero_attn = false, batch_first = false;
  int64_t batch = 2;  // 0 = unbatched
  bool masks = false, need_weights = true, average = true, dropout = false;
};

void PrintTo(const FunctionalCase& c, std::ostream* os) { *os << c.name; }

std::vector<FunctionalCase> functional_cases() {
  std::vector<FunctionalCase> cases;
  cases.push_back({"packed"});
  { FunctionalCase c{"separate_no_bias"}; c.kdim = 5; c.vdim = 3; c.bias = false; cases.push_back(c); }
  { FunctionalCase c{"bias_kv_zero_attn_masks"}; c.add_bias_kv = true; c.add_zero_attn = true; c.masks = true;
    c.average = false; cases.push_back(c); }
  { FunctionalCase c{"separate_bias_kv_batch_first"}; c.kdim = 6; c.add_bias_kv = true; c.batch_first = true;
    c.need_weights = false; cases.push_back(c); }
  { FunctionalCase c{"unbatched_zero_attn_masks"}; c.batch = 0; c.add_zero_attn = true; c.masks = true; cases.push_back(c); }
  { FunctionalCase c{"dropout_batch_first"}; c.batch_first = true; c.dropout = true; c.need_weights = false; cases.push_back(c); }
  return cases;
}

template <class T>
class FreeFunctionsMatchTheModule : public ::testing::Test {};
using ScalarTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FreeFunctionsMatchTheModule, ScalarTypes);

template <class T>
void expect_bitwise(const Tensor<T>& got, const Tensor<T>& expected, const std::string& what) {
  ASSERT_EQ(got.shape(), expected.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got[i], expected[i]) << what << " at " << i;
}

template <class T>
void run_case(const FunctionalCase& c) {
  SCOPED_TRACE(c.name);
  MultiheadAttentionOptions o;
  o.embed_dim = c.embed_dim;
  o.num_heads = c.num_heads;
  o.kdim = c.kdim;
  o.vdim = c.vdim;
  o.bias = c.bias;
  o.add_bias_kv = c.add_bias_kv;
  o.add_zero_attn = c.add_zero_attn;
  o.batch_first = c.batch_first;
  o.dropout = c.dropout ? 0.3 : 0.0;
  MultiheadAttention<T> module(o, 3);
  Generator gen(17);
  for (auto& p : module.parameters()) *p.value = random_tensor<T>(p.value->shape(), gen);
  module.train(c.dropout);

  const int64_t e = o.embed_dim, kd = module.kdim(), vd = module.vdim(), len = 5, src_len = 7;
  auto layout = [&](int64_t l, int64_t width) {
    if (c.batch == 0) return Shape{l, width};
    return c.batch_first ? Shape{c.batch, l, width} : Shape{l, c.batch, width};
  };
  const Tensor<T> query = random_tensor<T>(layout(len, e), gen);
  const Tensor<T> key = random_tensor<T>(layout(src_len, kd), gen);
  const Tensor<T> value = random_tensor<T>(layout(src_len, vd), gen);
  const Tensor<T> grad_output = random_tensor<T>(layout(len, e), gen);
  MultiheadAttentionArgs<T> args;
  args.need_weights = c.need_weights;
  args.average_attn_weights = c.average;
  if (c.masks) {
    const int64_t n = std::max<int64_t>(c.batch, 1);
    Tensor<bool> pad(c.batch == 0 ? Shape{src_len} : Shape{c.batch, src_len});
    pad[pad.numel() - 1] = true;
    args.key_padding_mask = pad;
    args.attn_mask = cast<T>(random_tensor(c.batch == 0 ? Shape{c.num_heads, len, src_len}
                                                        : Shape{n * c.num_heads, len, src_len}, gen));
  }

  // The module.
  MultiheadAttentionCache<T> module_cache;
  const MultiheadAttentionOutput<T> expected = module.forward(query, key, value, args, &module_cache);
  module.zero_grad();
  const MultiheadAttentionGradients<T> expected_grads = module.backward(grad_output, module_cache);

  // The free functions, on copies of its parameters that this test owns.
  std::map<std::string, Tensor<T>> params, grads;
  for (auto& p : module.parameters()) {
    params.emplace(p.name, *p.value);
    grads.emplace(p.name, Tensor<T>(p.value->shape()));
  }
  auto param = [&](const char* name) { return params.count(name) ? View<const T>(params.at(name)) : View<const T>(); };
  auto grad = [&](const char* name) { return grads.count(name) ? View<T>(grads.at(name)) : View<T>(); };
  const MultiheadAttentionWeights<T> weights{param("in_proj_weight"), param("q_proj_weight"), param("k_proj_weight"),
                                             param("v_proj_weight"), param("in_proj_bias"), param("bias_k"),
                                             param("bias_v"), param("out_proj.weight"), param("out_proj.bias")};
  const MultiheadAttentionWeightGradients<T> weight_grads{
      grad("in_proj_weight"), grad("q_proj_weight"), grad("k_proj_weight"), grad("v_proj_weight"), grad("in_proj_bias"),
      grad("bias_k"), grad("bias_v"), grad("out_proj.weight"), grad("out_proj.bias")};
  MultiheadAttentionCache<T> cache;
  const MultiheadAttentionOutput<T> got = multihead_attention_forward<T>(
      o, weights, query, key, value, args, c.dropout, module_cache.scoring.dropout_seed, attention::Backend::automatic, &cache);
  MultiheadAttentionSaved<T> saved = cache.saved();
  saved.query = query;  // the caller keeps the inputs
  saved.key = key;
  saved.value = value;
  const MultiheadAttentionGradients<T> got_grads =
      multihead_attention_backward<T>(o, weights, grad_output, saved, weight_grads);

  expect_bitwise(got.output, expected.output, "output");
  ASSERT_EQ(got.attn_weights.has_value(), expected.attn_weights.has_value());
  if (got.attn_weights) expect_bitwise(*got.attn_weights, *expected.attn_weights, "attn_weights");
  expect_bitwise(got_grads.grad_query, expected_grads.grad_query, "grad_query");
  expect_bitwise(got_grads.grad_key, expected_grads.grad_key, "grad_key");
  expect_bitwise(got_grads.grad_value, expected_grads.grad_value, "grad_value");
  for (auto& p : module.parameters()) expect_bitwise(grads.at(p.name), *p.grad, "grad " + p.name);
  if (c.dropout) EXPECT_NE(cache.scoring.dropout_seed, 0u);
}

TYPED_TEST(FreeFunctionsMatchTheModule, ForwardAndBackwardBitwise) {
  for (const FunctionalCase& c : functional_cases()) run_case<TypeParam>(c);
}

// Empty inputs address no memory, so any strides are taken (numpy >= 2 strides them 0).
TEST(MultiheadAttentionFreeFunctions, EmptyInputsMayHaveAnyStrides) {
  MultiheadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  o.batch_first = true;
  const Tensor<float> in_w({12, 4}), in_b({12}), out_w({4, 4}), out_b({4}), x({2, 3, 4});
  const MultiheadAttentionWeights<float> w{in_w, {}, {}, {}, in_b, {}, {}, out_w, out_b};
  const View<const float> no_keys(x.data(), {2, 0, 4}, {0, 0, 0});
  MultiheadAttentionCache<float> cache;
  const auto out = multihead_attention_forward<float>(o, w, x, no_keys, no_keys, {}, false, 0,
                                                      attention::Backend::automatic, &cache);
  EXPECT_EQ(out.output.shape(), (Shape{2, 3, 4}));
  MultiheadAttentionSaved<float> saved = cache.saved();
  saved.query = x;
  saved.key = saved.value = no_keys;
  const auto grads = multihead_attention_backward<float>(o, w, x, saved, {});
  EXPECT_EQ(grads.grad_key.shape(), (Shape{2, 0, 4}));
}

// Weights that do not fit the options: each refused with its name and what was expected.
TEST(MultiheadAttentionFreeFunctions, BadWeightsAreRefusedByName) {
  MultiheadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  const Tensor<float> in_w({12, 4}), in_b({12}), out_w({4, 4}), out_b({4}), square({4, 4}), bias_kv({1, 1, 4});
  const Tensor<float> x({3, 2, 4});
  const MultiheadAttentionWeights<float> good{in_w, {}, {}, {}, in_b, {}, {}, out_w, out_b};
  auto forward = [&](const MultiheadAttentionOptions& options, const MultiheadAttentionWeights<float>& w) {
    multihead_attention_forward<float>(options, w, x, x, x, {}, false, 0);
  };
  forward(o, good);

  auto w = good;
  w.in_proj_weight = {};
  expect_error([&] { forward(o, w); }, "weights: in_proj_weight: expected shape [12, 4] (kdim == vdim == embed_dim");
  w = good;
  w.q_proj_weight = square;
  expect_error([&] { forward(o, w); }, "weights: q_proj_weight: expected none (kdim == vdim == embed_dim");
  w = good;
  w.in_proj_weight = View<const float>(in_w.data(), {4, 12});
  expect_error([&] { forward(o, w); }, "weights: in_proj_weight: expected shape [12, 4], got [4, 12]");
  w = good;
  w.out_proj_weight = View<const float>(out_w.data(), {4, 4}, {1, 4});
  expect_error([&] { forward(o, w); }, "weights: out_proj_weight: expected contiguous (row-major) memory");
  w = good;
  w.out_proj_bias = {};
  expect_error([&] { forward(o, w); }, "weights: out_proj_bias: expected shape [4] (bias=true), got none");

  MultiheadAttentionOptions no_bias = o;
  no_bias.bias = false;
  expect_error([&] { forward(no_bias, good); }, "weights: in_proj_bias: expected none (bias=false), got shape [12]");

  MultiheadAttentionOptions with_bias_kv = o;
  with_bias_kv.add_bias_kv = true;
  w = good;
  w.bias_k = bias_kv;
  expect_error([&] { forward(with_bias_kv, w); }, "weights: bias_v: expected shape [1, 1, 4] (add_bias_kv=true), got none");

  MultiheadAttentionOptions separate = o;
  separate.kdim = 3;
  const Tensor<float> k_w({4, 3}), v_w({4, 4}), key({3, 2, 3});
  const MultiheadAttentionWeights<float> sep{{}, square, k_w, v_w, in_b, {}, {}, out_w, out_b};
  multihead_attention_forward<float>(separate, sep, x, key, x, {}, false, 0);
  w = sep;
  w.k_proj_weight = square;
  expect_error([&] { multihead_attention_forward<float>(separate, w, x, key, x, {}, false, 0); },
               "weights: k_proj_weight: expected shape [4, 3], got [4, 4]");
  expect_error([&] { multihead_attention_forward<float>(separate, good, x, key, x, {}, false, 0); },
               "weights: in_proj_weight: expected none (kdim or vdim differs from embed_dim");

  // Backward: gradients belong to given weights, have their shapes and do not overlap; the saved
  // tensors must be forward's.
  MultiheadAttentionCache<float> cache;
  multihead_attention_forward<float>(o, good, x, x, x, {}, false, 0, attention::Backend::automatic, &cache);
  MultiheadAttentionSaved<float> saved = cache.saved();
  saved.query = saved.key = saved.value = x;
  Tensor<float> g_in({12, 4}), g_out({4, 4}), g_sq({4, 4});
  auto backward = [&](const MultiheadAttentionWeightGradients<float>& g) {
    multihead_attention_backward<float>(o, good, x, saved, g);
  };
  backward({g_in, {}, {}, {}, {}, {}, {}, g_out, {}});
  expect_error([&] { backward({g_in, g_sq, {}, {}, {}, {}, {}, {}, {}}); },
               "grads: q_proj_weight: expected none (kdim == vdim == embed_dim");
  expect_error([&] { backward({{}, {}, {}, {}, {}, {}, {}, g_in, {}}); },
               "grads: out_proj_weight: expected shape [4, 4], got [12, 4]");
  expect_error([&] { backward({g_in, {}, {}, {}, {}, {}, {}, View<float>(g_in.data() + 4, {4, 4}), {}}); },
               "grads: out_proj_weight and in_proj_weight: expected separate memory");
  auto bad = saved;
  bad.q = {};
  expect_error([&] { multihead_attention_backward<float>(o, good, x, bad, {}); },
               "saved.q: expected what forward saved, got none");
  expect_error([&] { multihead_attention_backward<float>(o, good, Tensor<float>({2, 3, 4}), saved, {}); },
               "grad_output: expected shape [3, 2, 4], got [2, 3, 4]");
}

}  // namespace
}  // namespace mha::nn
