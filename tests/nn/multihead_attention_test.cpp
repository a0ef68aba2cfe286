// MultiheadAttention through its C++ API: gradients of inputs and every parameter by finite
// differences in double over the module's options, PyTorch's parameter names, shapes and
// initialisation distributions, strict state_dict loading, and a clear error for bad input.
// (Values against PyTorch itself: tests/cli/attention_golden_test.cpp, 64 golden cases.)
#include "mha/nn/multihead_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../support/assertions.h"
#include "../support/golden.h"
#include "../support/gradient_check.h"

namespace mha::nn {
namespace {

using mha::testing::check_gradient;
using mha::testing::expect_error;
using mha::testing::random_tensor;
using mha::testing::replacing;

struct ModuleCase {
  const char* name;
  MultiheadAttentionOptions options;
  int64_t batch = 2, query_len = 3, key_len = 4;  // batch 0 = unbatched
  bool key_padding = false, float_attn_mask = false, bool_attn_mask_3d = false, causal = false;
  bool need_weights = true;
};

void PrintTo(const ModuleCase& c, std::ostream* os) { *os << c.name; }

std::vector<ModuleCase> module_cases() {
  auto opts = [](int64_t e, int64_t h) {
    MultiheadAttentionOptions o;
    o.embed_dim = e;
    o.num_heads = h;
    return o;
  };
  std::vector<ModuleCase> cases;
  cases.push_back({"self_packed", opts(6, 2)});
  { ModuleCase c{"kdim_vdim_no_bias", opts(4, 2)}; c.options.kdim = 3; c.options.vdim = 5; c.options.bias = false; cases.push_back(c); }
  { ModuleCase c{"bias_kv_zero_attn_masks", opts(6, 3)}; c.options.add_bias_kv = true; c.options.add_zero_attn = true;
    c.key_padding = true; c.float_attn_mask = true; cases.push_back(c); }
  { ModuleCase c{"batch_first_bool_3d_mask", opts(4, 1)}; c.options.batch_first = true; c.bool_attn_mask_3d = true;
    c.need_weights = false; cases.push_back(c); }
  { ModuleCase c{"unbatched_padding", opts(6, 2)}; c.batch = 0; c.key_padding = true; cases.push_back(c); }
  { ModuleCase c{"is_causal_sdpa_path", opts(4, 2)}; c.causal = true; c.need_weights = false; c.key_len = 3; cases.push_back(c); }
  return cases;
}

class ModuleGradients : public ::testing::TestWithParam<ModuleCase> {};

TEST_P(ModuleGradients, MatchFiniteDifferencesForInputsAndEveryParameter) {
  const ModuleCase& c = GetParam();
  MultiheadAttention<double> module(c.options, 7);
  Generator gen(11);
  // Randomise every parameter, zero-initialised biases included, so no term can hide.
  for (auto& p : module.parameters()) *p.value = random_tensor(p.value->shape(), gen);
  const int64_t e = c.options.embed_dim, kd = module.kdim(), vd = module.vdim(), heads = c.options.num_heads;
  auto layout = [&](int64_t len, int64_t width) {
    if (c.batch == 0) return Shape{len, width};
    return c.options.batch_first ? Shape{c.batch, len, width} : Shape{len, c.batch, width};
  };
  Tensor<double> query = random_tensor(layout(c.query_len, e), gen);
  Tensor<double> key = random_tensor(layout(c.key_len, kd), gen);
  Tensor<double> value = random_tensor(layout(c.key_len, vd), gen);
  Tensor<double> grad_out = random_tensor(layout(c.query_len, e), gen);

  MultiheadAttentionArgs<double> args;
  args.need_weights = c.need_weights;
  const int64_t n = std::max<int64_t>(c.batch, 1);
  if (c.key_padding) {
    Tensor<bool> pad(c.batch == 0 ? Shape{c.key_len} : Shape{c.batch, c.key_len});
    pad[pad.numel() - 1] = true;  // the last key of the last sequence is padding
    args.key_padding_mask = pad;
  }
  if (c.float_attn_mask) args.attn_mask = random_tensor({c.query_len, c.key_len}, gen);
  if (c.bool_attn_mask_3d) {
    Tensor<bool> blocked({n * heads, c.query_len, c.key_len});
    for (int64_t i = 0; i < blocked.numel(); i += 3) blocked[i] = true;
    for (int64_t r = 0; r < n * heads * c.query_len; ++r) blocked[r * c.key_len + 1] = false;  // keep one key per row
    args.attn_mask = blocked;
  }
  if (c.causal) {
    Tensor<bool> future({c.query_len, c.key_len});
    for (int64_t i = 0; i < c.query_len; ++i)
      for (int64_t j = i + 1; j < c.key_len; ++j) future[i * c.key_len + j] = true;
    args.attn_mask = future;
    args.is_causal = true;
  }

  MultiheadAttentionCache<double> cache;
  module.forward(query, key, value, args, &cache);
  module.zero_grad();
  const MultiheadAttentionGradients<double> g = module.backward(grad_out, cache);
  auto forward = [&] { return module.forward(query, key, value, args).output; };
  EXPECT_TRUE(check_gradient(replacing(query, forward), query, grad_out, g.grad_query)) << "grad_query";
  EXPECT_TRUE(check_gradient(replacing(key, forward), key, grad_out, g.grad_key)) << "grad_key";
  EXPECT_TRUE(check_gradient(replacing(value, forward), value, grad_out, g.grad_value)) << "grad_value";
  for (auto& p : module.parameters())
    EXPECT_TRUE(check_gradient(replacing(*p.value, forward), *p.value, grad_out, *p.grad)) << "grad." << p.name;
}

INSTANTIATE_TEST_SUITE_P(Options, ModuleGradients, ::testing::ValuesIn(module_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

std::vector<std::pair<std::string, Shape>> names_and_shapes(MultiheadAttention<float>& m) {
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& p : m.parameters()) out.emplace_back(p.name, p.value->shape());
  return out;
}

TEST(MultiheadAttentionParameters, NamesAndShapesArePyTorchs) {
  MultiheadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  MultiheadAttention<float> packed(o);
  using V = std::vector<std::pair<std::string, Shape>>;
  EXPECT_EQ(names_and_shapes(packed), (V{{"in_proj_weight", {24, 8}}, {"in_proj_bias", {24}},
                                        {"out_proj.weight", {8, 8}}, {"out_proj.bias", {8}}}));
  o.kdim = 3;
  o.vdim = 5;
  o.add_bias_kv = true;
  MultiheadAttention<float> separate(o);
  EXPECT_EQ(names_and_shapes(separate),
            (V{{"q_proj_weight", {8, 8}}, {"k_proj_weight", {8, 3}}, {"v_proj_weight", {8, 5}},
               {"in_proj_bias", {24}}, {"bias_k", {1, 1, 8}}, {"bias_v", {1, 1, 8}},
               {"out_proj.weight", {8, 8}}, {"out_proj.bias", {8}}}));
  o.bias = false;
  o.add_bias_kv = false;
  o.kdim = 8;  // vdim still differs: separate weights, as PyTorch's _qkv_same_embed_dim
  MultiheadAttention<float> no_bias(o);
  EXPECT_EQ(names_and_shapes(no_bias), (V{{"q_proj_weight", {8, 8}}, {"k_proj_weight", {8, 8}},
                                         {"v_proj_weight", {8, 5}}, {"out_proj.weight", {8, 8}}}));
}

// PyTorch's _reset_parameters: xavier_uniform_ over the packed (3E, E) matrix, U(±1/√E) for
// out_proj.weight (nn.Linear's kaiming_uniform_(a=√5)), zero biases, xavier_normal_ bias_k/v.
TEST(MultiheadAttentionParameters, InitialisationFollowsPyTorchsDistributions) {
  MultiheadAttentionOptions o;
  o.embed_dim = 256;
  o.num_heads = 4;
  o.add_bias_kv = true;
  MultiheadAttention<double> m(o, 3);
  auto params = m.state_dict();
  auto expect_uniform = [](const Tensor<double>& t, double bound, const char* name) {
    double mean = 0, sq = 0, top = 0;
    for (double x : t.values()) {
      mean += x;
      sq += x * x;
      top = std::max(top, std::abs(x));
    }
    const double count = static_cast<double>(t.numel());
    mean /= count;
    EXPECT_LE(top, bound) << name;
    EXPECT_GT(top, 0.99 * bound) << name;                        // fills the whole range
    EXPECT_NEAR(sq / count, bound * bound / 3, 0.02 * bound * bound / 3) << name;  // variance b²/3
    EXPECT_NEAR(mean, 0.0, 0.01 * bound) << name;
  };
  expect_uniform(params.at("in_proj_weight"), std::sqrt(6.0 / (256 + 3 * 256)), "in_proj_weight");
  expect_uniform(params.at("out_proj.weight"), 1.0 / std::sqrt(256.0), "out_proj.weight");
  for (const char* zero : {"in_proj_bias", "out_proj.bias"})
    for (double x : params.at(zero).values()) EXPECT_EQ(x, 0.0) << zero;
  double sq = 0;
  for (const char* name : {"bias_k", "bias_v"})
    for (double x : params.at(name).values()) sq += x * x;
  EXPECT_NEAR(sq / 512, 1.0 / 256, 0.2 / 256);  // variance 1/E, 512 samples: ±3σ ≈ 19%
  // Same seed, same parameters; another seed, others.
  MultiheadAttention<double> again(o, 3), other(o, 4);
  EXPECT_EQ(again.state_dict().at("in_proj_weight")[5], params.at("in_proj_weight")[5]);
  EXPECT_NE(other.state_dict().at("in_proj_weight")[5], params.at("in_proj_weight")[5]);
}

// A half-precision module draws the same numbers from the same seed, each rounded once from the
// double drawn: within the half type's unit roundoff of the double module's (relative 2⁻⁸ for
// bfloat16's 8 significant bits, 2⁻¹¹ for float16's 11) plus half its subnormals' spacing
// (float16's 2⁻²⁴ below 2⁻¹⁴). (A static_cast of the double had stored it as the bits, truncated:
// every weight 0.)
template <class H>
void expect_initialisation_is_the_doubles_rounded() {
  MultiheadAttentionOptions o;
  o.embed_dim = 64;
  o.num_heads = 4;
  o.add_bias_kv = true;
  constexpr bool bf16 = std::is_same_v<H, bfloat16>;
  const double u = bf16 ? 0x1p-8 : 0x1p-11, tiny = bf16 ? 0x1p-134 : 0x1p-25;
  const auto wide = MultiheadAttention<double>(o, 3).state_dict();
  const auto half = MultiheadAttention<H>(o, 3).state_dict();
  ASSERT_EQ(half.size(), wide.size());
  for (const auto& [name, expected] : wide) {
    const Tensor<H>& got = half.at(name);
    ASSERT_EQ(got.numel(), expected.numel()) << name;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < expected.numel(); ++i) {
      ASSERT_LE(std::abs(static_cast<double>(widen(got[i])) - expected[i]), u * std::abs(expected[i]) + tiny)
          << name << "[" << i << "]";
      nonzero += expected[i] != 0;
    }
    if (name.find("bias") == std::string::npos || name == "bias_k" || name == "bias_v") EXPECT_GT(nonzero, 0) << name;
  }
}

TEST(MultiheadAttentionParameters, HalfPrecisionInitialisationIsTheDoublesRounded) {
  expect_initialisation_is_the_doubles_rounded<bfloat16>();
  expect_initialisation_is_the_doubles_rounded<float16>();
}

TEST(MultiheadAttentionParameters, LoadStateDictIsStrictAndNamesEveryProblem) {
  MultiheadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  MultiheadAttention<float> m(o);
  auto state = m.state_dict();
  state.at("in_proj_bias")[0] = 0.5f;
  m.load_state_dict(state);
  EXPECT_EQ(m.state_dict().at("in_proj_bias")[0], 0.5f);
  auto missing = state;
  missing.erase("out_proj.bias");
  expect_error([&] { m.load_state_dict(missing); }, "missing tensor 'out_proj.bias' with shape [4]");
  auto extra = state;
  extra.emplace("bias_k", Tensor<float>({1, 1, 4}));
  expect_error([&] { m.load_state_dict(extra); }, "unexpected tensor 'bias_k'");
  auto wrong = state;
  wrong.at("in_proj_weight") = Tensor<float>({4, 4});
  expect_error([&] { m.load_state_dict(wrong); }, "tensor 'in_proj_weight': expected shape [12, 4], got [4, 4]");
}

TEST(MultiheadAttentionErrors, BadConstructorArguments) {
  auto make = [](int64_t e, int64_t h, double dropout = 0.0) {
    MultiheadAttentionOptions o;
    o.embed_dim = e;
    o.num_heads = h;
    o.dropout = dropout;
    MultiheadAttention<float> m(o);
  };
  expect_error([&] { make(10, 3); }, "embed_dim must be divisible by num_heads, got embed_dim 10 and num_heads 3");
  expect_error([&] { make(0, 1); }, "embed_dim: expected 1 to 715827882, got 0");
  expect_error([&] { make(int64_t{1} << 62, 1); }, "embed_dim: expected 1 to 715827882, got 4611686018427387904");
  expect_error([&] { make(4, -2); }, "num_heads: expected > 0, got -2");
  expect_error([&] { make(4, 2, 1.5); }, "dropout: expected a probability in [0, 1], got 1.5");
}

TEST(MultiheadAttentionErrors, BadForwardArguments) {
  MultiheadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  o.kdim = 3;
  MultiheadAttention<float> m(o);
  const Tensor<float> q({5, 2, 4}), k({6, 2, 3}), v({6, 2, 4});
  expect_error([&] { m.forward(Tensor<float>({4}), k, v); }, "query: expected a 3-D tensor (L, N, E)");
  expect_error([&] { m.forward(q, Tensor<float>({6, 3}), v); }, "key/value: expected 3-D tensors like query");
  expect_error([&] { m.forward(Tensor<float>({5, 2, 5}), k, v); }, "query: expected last dimension embed_dim = 4");
  expect_error([&] { m.forward(q, Tensor<float>({6, 2, 4}), v); }, "key: expected last dimension kdim = 3");
  expect_error([&] { m.forward(q, Tensor<float>({6, 3, 3}), v); }, "key/value: expected batch size 2");
  expect_error([&] { m.forward(q, k, Tensor<float>({7, 2, 4})); }, "value: expected the same sequence length as key (6)");
  MultiheadAttentionArgs<float> args;
  args.attn_mask = Tensor<bool>({5, 5});
  expect_error([&] { m.forward(q, k, v, args); }, "attn_mask (2-D): expected shape [5, 6], got [5, 5]");
  args.attn_mask = Tensor<float>({2, 5, 6});
  expect_error([&] { m.forward(q, k, v, args); }, "attn_mask (3-D: N*num_heads, L, S): expected shape [4, 5, 6]");
  args.attn_mask = Tensor<float>({1, 1, 5, 6});
  expect_error([&] { m.forward(q, k, v, args); }, "attn_mask: expected a 2-D (L, S) or 3-D (N*num_heads, L, S) mask");
  args.attn_mask.reset();
  args.key_padding_mask = Tensor<bool>({6, 2});
  expect_error([&] { m.forward(q, k, v, args); }, "key_padding_mask (N, S): expected shape [2, 6], got [6, 2]");
  args.key_padding_mask.reset();
  args.is_causal = true;
  expect_error([&] { m.forward(q, k, v, args); }, "is_causal: PyTorch requires attn_mask");
  MultiheadAttentionCache<float> cache;
  expect_error([&] { m.backward(Tensor<float>({5, 2, 4}), cache); }, "cache: expected the cache filled by forward");
  m.forward(q, k, v, {}, &cache);
  expect_error([&] { m.backward(Tensor<float>({2, 5, 4}), cache); }, "grad_output: expected shape [5, 2, 4], got [2, 5, 4]");
}

// Where PyTorch's need_weights=True path returns NaN for a query whose keys are all masked,
// mha returns zero attention (the output row is then out_proj.bias), as PyTorch's SDPA path does.
TEST(MultiheadAttentionSemantics, FullyMaskedRowsGiveZeroAttentionOnEveryPath) {
  MultiheadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  MultiheadAttention<double> m(o, 1);
  Generator gen(2);
  auto state = m.state_dict();
  state.at("out_proj.bias") = random_tensor({4}, gen);
  m.load_state_dict(state);
  const Tensor<double> x = random_tensor({3, 2, 4}, gen);
  MultiheadAttentionArgs<double> args;
  Tensor<bool> pad({2, 3});
  for (int j = 0; j < 3; ++j) pad[3 + j] = true;  // every key of sequence 1 is padding
  args.key_padding_mask = pad;
  for (bool need_weights : {true, false}) {
    args.need_weights = need_weights;
    auto r = m.forward(x, x, x, args);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(r.output[(i * 2 + 1) * 4 + d], state.at("out_proj.bias")[d]);
    if (need_weights)
      for (int64_t i = 9; i < 18; ++i) EXPECT_EQ((*r.attn_weights)[i], 0.0);
  }
}

// Dropout acts only in training mode, is reproducible from the seed and differs between calls.
TEST(MultiheadAttentionSemantics, DropoutOnlyInTrainingAndSeeded) {
  MultiheadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  o.dropout = 0.5;
  Generator gen(5);
  const Tensor<double> x = random_tensor({6, 2, 8}, gen);
  MultiheadAttention<double> a(o, 9), b(o, 9);
  a.eval();
  MultiheadAttentionArgs<double> args;
  args.need_weights = false;
  const auto eval_out = a.forward(x, x, x, args).output;
  a.train();
  b.train();
  const auto first = a.forward(x, x, x, args).output, again = b.forward(x, x, x, args).output;
  const auto second = a.forward(x, x, x, args).output;
  EXPECT_EQ(mha::testing::max_abs_diff(first, again), 0.0);   // same seed, same masks
  EXPECT_GT(mha::testing::max_abs_diff(first, eval_out), 1e-3);  // dropout acted
  EXPECT_GT(mha::testing::max_abs_diff(first, second), 1e-3);    // a fresh mask per call
}

}  // namespace
}  // namespace mha::nn
