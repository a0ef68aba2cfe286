// The attention classifier: PyTorch names and shapes, gradients against finite differences
// (module path, double), the fused path against the module path (double and float, every SIMD
// target the CPU runs), determinism across thread counts, and input checks.
#include "mha/models/attention_classifier.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/gradient_check.h"
#include "mha/core/simd.h"

namespace {

using mha::Tensor;
using mha::models::AttentionClassifier;
using mha::models::AttentionClassifierConfig;
using mha::models::ComputePath;
using mha::testing::throws_error;

AttentionClassifierConfig small_config(bool projection, bool positions, bool pre_norm, int64_t blocks) {
  AttentionClassifierConfig c;
  c.sequence_length = 5;
  c.input_dim = 3;
  c.embed_dim = projection ? 6 : 3;
  c.num_heads = projection ? 2 : 1;
  c.hidden_dim = 4;
  c.num_classes = 3;
  c.num_blocks = blocks;
  c.input_projection = projection;
  c.learned_positions = positions;
  c.pre_norm = pre_norm;
  return c;
}

template <class T>
Tensor<T> random_tensor(const mha::Shape& shape, uint64_t seed, double scale = 1.0) {
  mha::Generator gen(seed);
  Tensor<T> t(shape);
  for (auto& v : t.values()) v = static_cast<T>(gen.normal(0.0, scale));
  return t;
}

// Random parameters everywhere (biases and LayerNorm included), so no gradient is trivially 0.
template <class T>
void randomize(AttentionClassifier<T>& model, uint64_t seed) {
  mha::Generator gen(seed);
  for (auto& p : model.parameters())
    for (auto& v : p.value->values()) v = static_cast<T>(gen.normal(0.0, 0.5));
}

struct Variant {
  bool projection, positions, pre_norm;
  int64_t blocks;
};
const Variant kVariants[] = {{false, false, false, 1}, {true, true, false, 2}, {true, false, true, 1},
                             {false, true, true, 2}};

TEST(AttentionClassifier, TutorialDefaultsAndPyTorchNames) {
  AttentionClassifier<float> model(AttentionClassifierConfig{}, 0);
  std::vector<std::pair<std::string, mha::Shape>> expected = {
      {"blocks.0.attention.in_proj_weight", {84, 28}}, {"blocks.0.attention.in_proj_bias", {84}},
      {"blocks.0.attention.out_proj.weight", {28, 28}}, {"blocks.0.attention.out_proj.bias", {28}},
      {"fc1.weight", {128, 28}}, {"fc1.bias", {128}}, {"fc2.weight", {10, 128}}, {"fc2.bias", {10}}};
  auto params = model.parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, expected[i].first);
    EXPECT_EQ(params[i].value->shape(), expected[i].second) << params[i].name;
  }
  AttentionClassifierConfig wide;
  wide.embed_dim = 64;
  wide.num_blocks = 2;
  wide.input_projection = wide.learned_positions = wide.pre_norm = true;
  AttentionClassifier<float> big(wide, 1);
  std::vector<std::string> names;
  for (auto& p : big.parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "input_projection.weight", "input_projection.bias", "positions", "blocks.0.norm.weight",
                       "blocks.0.norm.bias", "blocks.0.attention.in_proj_weight", "blocks.0.attention.in_proj_bias",
                       "blocks.0.attention.out_proj.weight", "blocks.0.attention.out_proj.bias",
                       "blocks.1.norm.weight", "blocks.1.norm.bias", "blocks.1.attention.in_proj_weight",
                       "blocks.1.attention.in_proj_bias", "blocks.1.attention.out_proj.weight",
                       "blocks.1.attention.out_proj.bias", "norm.weight", "norm.bias", "fc1.weight", "fc1.bias",
                       "fc2.weight", "fc2.bias"}));
  // The same seed gives the same weights; the state dict loads back.
  AttentionClassifier<float> again(wide, 1);
  again.load_state_dict(big.state_dict());
  const auto a = big.state_dict(), b = AttentionClassifier<float>(wide, 1).state_dict();
  for (const auto& [name, t] : a)
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t[i], b.at(name)[i]) << name;
}

// Every gradient of the module path against central differences, in double.
TEST(AttentionClassifier, ModulePathGradientsMatchFiniteDifferences) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE("projection " + std::to_string(v.projection) + " positions " + std::to_string(v.positions) +
                 " pre_norm " + std::to_string(v.pre_norm) + " blocks " + std::to_string(v.blocks));
    const AttentionClassifierConfig c = small_config(v.projection, v.positions, v.pre_norm, v.blocks);
    AttentionClassifier<double> model(c, 7, ComputePath::module);
    randomize(model, 8);
    model.eval();
    const Tensor<double> x = random_tensor<double>({2, c.sequence_length, c.input_dim}, 9);
    const Tensor<double> grad_out = random_tensor<double>({2, c.num_classes}, 10);
    AttentionClassifier<double>::Cache cache;
    model.forward(x, &cache);
    model.zero_grad();
    const Tensor<double> grad_x = model.backward(grad_out, cache);
    auto f = [&](const Tensor<double>& input) { return model.forward(input); };
    EXPECT_TRUE(mha::testing::check_gradient(f, x, grad_out, grad_x, {1e-6, 1e-5, 1e-7}));
    for (auto& p : model.parameters()) {
      SCOPED_TRACE(p.name);
      const Tensor<double> analytic = *p.grad;
      EXPECT_TRUE(mha::testing::check_gradient(mha::testing::replacing(*p.value, [&] { return model.forward(x); }),
                                               *p.value, grad_out, analytic, {1e-6, 1e-5, 1e-7}));
    }
  }
}

// The fused path computes what the module path computes: logits, input gradient and every
// parameter gradient, in double to 1e-12, for batches that fill one chunk, several, and part of one.
template <class T>
void expect_fused_matches_module(const AttentionClassifierConfig& c, int64_t batch, double tolerance, bool training) {
  AttentionClassifier<T> fused(c, 3), reference(c, 3, ComputePath::module);
  randomize(fused, 4);
  randomize(reference, 4);
  fused.train(training);
  reference.train(training);
  const Tensor<T> x = random_tensor<T>({batch, c.sequence_length, c.input_dim}, 5);
  const Tensor<T> grad_out = random_tensor<T>({batch, c.num_classes}, 6);
  typename AttentionClassifier<T>::Cache fc, rc;
  const Tensor<T> y_fused = fused.forward(x, &fc), y_reference = reference.forward(x, &rc);
  fused.zero_grad();
  reference.zero_grad();
  const Tensor<T> gx_fused = fused.backward(grad_out, fc), gx_reference = reference.backward(grad_out, rc);
  auto expect_close = [&](const Tensor<T>& a, const Tensor<T>& b, const std::string& what) {
    ASSERT_EQ(a.shape(), b.shape()) << what;
    double scale = 0, error = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      scale = std::max(scale, std::abs(static_cast<double>(b[i])));
      error = std::max(error, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    }
    EXPECT_LE(error, tolerance * std::max(1.0, scale)) << what << " (max |value| " << scale << ")";
  };
  expect_close(y_fused, y_reference, "logits");
  expect_close(gx_fused, gx_reference, "grad input");
  auto fp = fused.parameters(), rp = reference.parameters();
  for (size_t i = 0; i < fp.size(); ++i) expect_close(*fp[i].grad, *rp[i].grad, "grad " + fp[i].name);
  EXPECT_EQ(fused.dropout_counter(), reference.dropout_counter());
}

TEST(AttentionClassifier, FusedPathMatchesModulePath) {
  for (const Variant& v : kVariants)
    for (int64_t batch : {1, 16, 37}) {
      SCOPED_TRACE("projection " + std::to_string(v.projection) + " positions " + std::to_string(v.positions) +
                   " pre_norm " + std::to_string(v.pre_norm) + " blocks " + std::to_string(v.blocks) + " batch " +
                   std::to_string(batch));
      const AttentionClassifierConfig c = small_config(v.projection, v.positions, v.pre_norm, v.blocks);
      expect_fused_matches_module<double>(c, batch, 1e-12, false);
      expect_fused_matches_module<float>(c, batch, 2e-5, false);
    }
}

TEST(AttentionClassifier, FusedPathMatchesModulePathWithDropoutAndRealShapes) {
  AttentionClassifierConfig c;  // the tutorial's model: L = E = 28, 4 heads of 7
  c.dropout = 0.3;
  expect_fused_matches_module<double>(c, 20, 1e-12, true);
  AttentionClassifierConfig wide;
  wide.embed_dim = 64;
  wide.num_blocks = 2;
  wide.input_projection = wide.learned_positions = wide.pre_norm = true;
  expect_fused_matches_module<double>(wide, 18, 1e-12, true);
  expect_fused_matches_module<float>(wide, 18, 1e-4, true);
}

// A NaN reaching the ReLU stays NaN on both paths, as in PyTorch (relu(NaN) = NaN): a checkpoint
// with a NaN in fc1 gives NaN logits, not a finite loss (the ReLU had mapped NaN to 0).
TEST(AttentionClassifier, NaNThroughTheReluOnBothPaths) {
  const AttentionClassifierConfig c = small_config(false, false, false, 1);
  for (ComputePath path : {ComputePath::fused, ComputePath::module}) {
    AttentionClassifier<float> model(c, 3, path);
    for (auto& p : model.parameters())
      if (p.name == "fc1.bias") (*p.value)[0] = std::numeric_limits<float>::quiet_NaN();
    const Tensor<float> y = model.forward(random_tensor<float>({2, c.sequence_length, c.input_dim}, 5), nullptr);
    for (float v : y.values()) EXPECT_TRUE(std::isnan(v)) << (path == ComputePath::fused ? "fused" : "module");
  }
}

// The SIMD kernels (attention, LayerNorm) run on the best target by default; every compiled
// target the CPU supports must give the module path's results.
TEST(AttentionClassifier, EverySimdTargetMatchesModulePath) {
  const auto targets = mha::simd_targets();
  ASSERT_FALSE(targets.empty());
  std::string listed;
  for (const auto& t : targets) listed += " " + t;
  std::printf("SIMD kernel targets:%s\n", listed.c_str());
  AttentionClassifierConfig c;
  c.embed_dim = 24;
  c.num_heads = 3;  // head size 8
  c.input_projection = c.pre_norm = true;
  for (const std::string& target : targets) {
    SCOPED_TRACE(target);
    const mha::ScopedSimdTarget pin(target);
    expect_fused_matches_module<double>(c, 19, 1e-12, false);
    expect_fused_matches_module<float>(c, 19, 2e-5, false);
  }
}

TEST(AttentionClassifier, FusedPathIsBitwiseTheSameForAnyThreadCount) {
  AttentionClassifierConfig c;
  c.embed_dim = 32;
  c.input_projection = c.learned_positions = c.pre_norm = true;
  c.num_blocks = 2;
  const Tensor<float> x = random_tensor<float>({45, 28, 28}, 11);
  const Tensor<float> grad_out = random_tensor<float>({45, 10}, 12);
  std::vector<std::vector<float>> results;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    AttentionClassifier<float> model(c, 13);
    AttentionClassifier<float>::Cache cache;
    std::vector<float> r;
    const Tensor<float> logits = model.forward(x, &cache);
    r.assign(logits.values().begin(), logits.values().end());
    model.zero_grad();
    const Tensor<float> grad_x = model.backward(grad_out, cache);
    r.insert(r.end(), grad_x.values().begin(), grad_x.values().end());
    for (auto& p : model.parameters())
      for (float v : p.grad->values()) r.push_back(v);
    results.push_back(r);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(AttentionClassifier, ReusedCacheGivesTheSameResults) {
  AttentionClassifier<float> model(AttentionClassifierConfig{}, 2);
  AttentionClassifier<float>::Cache cache;
  const Tensor<float> a = random_tensor<float>({20, 28, 28}, 1), b = random_tensor<float>({33, 28, 28}, 2);
  model.forward(a, &cache);
  const Tensor<float> with_reuse = model.forward(b, &cache);
  AttentionClassifier<float>::Cache fresh;
  const Tensor<float> without = model.forward(b, &fresh);
  for (int64_t i = 0; i < with_reuse.numel(); ++i) ASSERT_EQ(with_reuse[i], without[i]);
}

TEST(AttentionClassifier, RefusesBadConfigAndInput) {
  AttentionClassifierConfig c;
  c.embed_dim = 30;
  EXPECT_TRUE(throws_error([&] { AttentionClassifier<float> m(c); }, {"embed_dim", "divisible by num_heads", "30"}));
  c.num_heads = 5;
  EXPECT_TRUE(throws_error([&] { AttentionClassifier<float> m(c); },
                           {"embed_dim", "input_dim = 28", "input_projection", "got 30"}));
  c = {};
  c.dropout = 1.0;
  EXPECT_TRUE(throws_error([&] { AttentionClassifier<float> m(c); }, {"dropout", "[0, 1)"}));
  c = {};
  c.num_blocks = 0;
  EXPECT_TRUE(throws_error([&] { AttentionClassifier<float> m(c); }, {"num_blocks", "got 0"}));
  AttentionClassifier<float> model(AttentionClassifierConfig{});
  EXPECT_TRUE(throws_error([&] { model.forward(Tensor<float>({2, 27, 28})); }, {"input", "(N, 28, 28)", "[2, 27, 28]"}));
  AttentionClassifier<float>::Cache empty;
  EXPECT_TRUE(throws_error([&] { model.backward(Tensor<float>({2, 10}), empty); }, {"cache", "empty"}));
  AttentionClassifier<float>::Cache cache;
  model.forward(Tensor<float>({2, 28, 28}), &cache);
  EXPECT_TRUE(throws_error([&] { model.backward(Tensor<float>({3, 10}), cache); }, {"grad_logits", "[2, 10]", "[3, 10]"}));
  // The path is the model's: a cache filled on the other one is refused, either way round.
  EXPECT_EQ(model.compute_path(), ComputePath::fused);
  AttentionClassifier<float> module_model(AttentionClassifierConfig{}, 0, ComputePath::module);
  EXPECT_EQ(module_model.compute_path(), ComputePath::module);
  EXPECT_TRUE(throws_error([&] { module_model.backward(Tensor<float>({2, 10}), cache); },
                           {"cache", "this model's module path", "filled on the fused path"}));
  AttentionClassifier<float>::Cache module_cache;
  module_model.forward(Tensor<float>({2, 28, 28}), &module_cache);
  EXPECT_TRUE(throws_error([&] { model.backward(Tensor<float>({2, 10}), module_cache); },
                           {"cache", "this model's fused path", "filled on the module path"}));
  EXPECT_TRUE(throws_error([&] { module_model.backward(Tensor<float>({2, 10}), empty); }, {"cache", "empty"}));
}

}  // namespace
