// The basic layers against PyTorch (tests/goldens/layers/*.safetensors, written by
// scripts/goldens/make_layer_goldens.py; the tensor scheme is described there).
//
// float64: every output and gradient within 1e-12 · max(1, max|expected|) of PyTorch's float64.
// float32: the goldens rule (tests/goldens/README.md): max|ours − f64| ≤ 2·max|torch_f32 − f64|
//          + 1e-6·max|f64|, i.e. at most twice as far from the truth as PyTorch's own float32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../support/golden.h"
#include "mha/core/safetensors.h"
#include "mha/nn/embedding.h"
#include "mha/nn/gelu.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/linear.h"
#include "mha/nn/relu.h"

namespace {

using mha::Shape;
using mha::Tensor;
namespace st = mha::safetensors;

struct Golden {
  st::File file;
  st::File peer;  // PyTorch's float32 results on this machine (golden.h's load_peer)
  std::string layer;

  static Golden load(const std::string& layer) {
    const std::string path = mha::testing::goldens_dir() + "/layers/" + layer + ".safetensors";
    return {st::load(path), mha::testing::load_peer(path), layer};
  }
  std::vector<std::string> cases() const {
    std::vector<std::string> out;
    std::stringstream list(meta("cases"));
    for (std::string c; std::getline(list, c, ',');) out.push_back(c);
    return out;
  }
  std::string meta(const std::string& key) const {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) throw mha::Error(layer + ": no metadata '" + key + "'");
    return it->second;
  }
  bool has(const std::string& name) const { return file.tensors.count(name) != 0; }
  template <class T>
  Tensor<T> get(const std::string& name) const {
    return st::to_tensor<T>(st::require(file, name, layer), name);
  }
};

double max_abs(const Tensor<double>& t) {
  double m = 0;
  for (double v : t.values()) m = std::max(m, std::abs(v));
  return m;
}

template <class T>
double max_abs_diff(const Tensor<T>& a, const Tensor<double>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

// Compares `ours` with "<prefix>.<name>" under the rule for T (see the top of the file).
template <class T>
void expect_golden(const Golden& g, const std::string& prefix, const std::string& name,
                   const Tensor<T>& ours) {
  const std::string what = g.layer + " " + prefix + "." + name;
  const Tensor<double> expected = g.get<double>(prefix + "." + name);
  ASSERT_EQ(ours.shape(), expected.shape()) << what;
  const double err = max_abs_diff(ours, expected);
  double bound;
  if constexpr (std::is_same_v<T, double>) {
    bound = 1e-12 * std::max(1.0, max_abs(expected));
  } else {
    const std::string peer = prefix + ".torch_f32." + name;
    const Tensor<double> torch32 = st::to_tensor<double>(st::require(g.peer, peer, g.layer), peer);
    bound = 2 * max_abs_diff(torch32, expected) + 1e-6 * max_abs(expected);
  }
  EXPECT_LE(err, bound) << what << " (" << (std::is_same_v<T, double> ? "double" : "float") << ")";
}

// check(g, c) on every case c of the layer's golden file g, which must hold `count` cases.
template <class Check>
void for_each_case(const std::string& layer, size_t count, Check check) {
  const Golden g = Golden::load(layer);
  ASSERT_EQ(g.cases().size(), count);
  for (const auto& c : g.cases()) {
    SCOPED_TRACE(c);
    check(g, c);
  }
}

template <class T>
class LayerGoldens : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LayerGoldens, Types);

TYPED_TEST(LayerGoldens, Linear) {
  using T = TypeParam;
  for_each_case("linear", 5, [](const Golden& g, const std::string& c) {
    const Tensor<T> weight = g.get<T>(c + ".weight");
    const bool bias = g.meta(c + ".bias") == "true";
    ASSERT_EQ(bias, g.has(c + ".bias"));
    mha::Generator gen(0);
    mha::nn::Linear<T> layer(weight.size(1), weight.size(0), bias, gen);
    layer.weight = weight;
    if (bias) layer.bias = g.get<T>(c + ".bias");
    typename mha::nn::Linear<T>::Cache cache;
    expect_golden(g, c, "output", layer.forward(g.get<T>(c + ".input"), &cache));
    expect_golden(g, c, "grad_input", layer.backward(g.get<T>(c + ".grad_output"), cache));
    expect_golden(g, c, "grad_weight", layer.grad_weight);
    if (bias) expect_golden(g, c, "grad_bias", layer.grad_bias);
  });
}

TYPED_TEST(LayerGoldens, LayerNorm) {
  using T = TypeParam;
  for_each_case("layer_norm", 6, [](const Golden& g, const std::string& c) {
    const bool affine = g.meta(c + ".elementwise_affine") == "true";
    const bool bias = g.meta(c + ".bias") == "true";
    const double eps = std::stod(g.meta(c + ".eps"));
    const Tensor<T> input = g.get<T>(c + ".input");
    Shape norm;
    std::stringstream dims(g.meta(c + ".normalized_shape"));
    for (std::string d; std::getline(dims, d, ',');) norm.push_back(std::stoll(d));
    mha::nn::LayerNorm<T> layer(norm, eps, affine, bias);
    if (affine) layer.weight = g.get<T>(c + ".weight");
    if (bias) layer.bias = g.get<T>(c + ".bias");
    typename mha::nn::LayerNorm<T>::Cache cache;
    expect_golden(g, c, "output", layer.forward(input, &cache));
    expect_golden(g, c, "grad_input", layer.backward(g.get<T>(c + ".grad_output"), cache));
    if (affine) expect_golden(g, c, "grad_weight", layer.grad_weight);
    if (bias) expect_golden(g, c, "grad_bias", layer.grad_bias);
  });
}

TYPED_TEST(LayerGoldens, Embedding) {
  using T = TypeParam;
  for_each_case("embedding", 4, [](const Golden& g, const std::string& c) {
    const Tensor<T> weight = g.get<T>(c + ".weight");
    const std::string pad_text = g.meta(c + ".padding_idx");
    std::optional<int64_t> pad;
    if (pad_text != "none") pad = std::stoll(pad_text);
    mha::Generator gen(0);
    mha::nn::Embedding<T> layer(weight.size(0), weight.size(1), pad, gen);
    layer.weight = weight;
    typename mha::nn::Embedding<T>::Cache cache;
    expect_golden(g, c, "output", layer.forward(g.get<int64_t>(c + ".input"), &cache));
    layer.backward(g.get<T>(c + ".grad_output"), cache);
    expect_golden(g, c, "grad_weight", layer.grad_weight);
  });
}

TYPED_TEST(LayerGoldens, GELU) {
  using T = TypeParam;
  for_each_case("gelu", 4, [](const Golden& g, const std::string& c) {
    mha::nn::GELU<T> layer(g.meta(c + ".approximate"));
    typename mha::nn::GELU<T>::Cache cache;
    expect_golden(g, c, "output", layer.forward(g.get<T>(c + ".input"), &cache));
    expect_golden(g, c, "grad_input", layer.backward(g.get<T>(c + ".grad_output"), cache));
  });
}

TYPED_TEST(LayerGoldens, ReLU) {
  using T = TypeParam;
  for_each_case("relu", 2, [](const Golden& g, const std::string& c) {
    mha::nn::ReLU<T> layer;
    typename mha::nn::ReLU<T>::Cache cache;
    expect_golden(g, c, "output", layer.forward(g.get<T>(c + ".input"), &cache));
    expect_golden(g, c, "grad_input", layer.backward(g.get<T>(c + ".grad_output"), cache));
  });
}

}  // namespace
