// Cross-entropy against PyTorch (tests/goldens/training/cross_entropy.safetensors) and against
// finite differences, and its input checks.
#include "mha/nn/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "../support/assertions.h"
#include "../support/golden.h"
#include "../support/gradient_check.h"
#include "mha/core/safetensors.h"

namespace {

namespace st = mha::safetensors;
using mha::Tensor;
using mha::testing::throws_error;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) out.push_back(part);
  return out;
}

TEST(CrossEntropy, MatchesPyTorch) {
  const std::string path = mha::testing::goldens_dir() + "/training/cross_entropy.safetensors";
  const st::File golden = st::load(path), peer = mha::testing::load_peer(path);  // peer: PyTorch's float32 here
  for (const std::string& name : split(golden.metadata.at("cases"))) {
    SCOPED_TRACE(name);
    auto get = [&](const std::string& t) { return st::to_tensor<double>(st::require(golden, name + "." + t, name), t); };
    auto get_peer = [&](const std::string& t) { return st::to_tensor<double>(st::require(peer, name + "." + t, name), t); };
    const Tensor<double> logits = get("logits"), expected_grad = get("grad_logits");
    const Tensor<int64_t> targets = st::to_tensor<int64_t>(st::require(golden, name + ".targets", name), "targets");
    const double expected_loss = get("loss")[0];

    // float64: the same numbers to rounding.
    mha::nn::CrossEntropyCache<double> cache64;
    const double loss64 = mha::nn::cross_entropy(logits, targets, &cache64);
    EXPECT_NEAR(loss64, expected_loss, 1e-12 * std::max(1.0, std::abs(expected_loss)));
    const Tensor<double> grad64 = mha::nn::cross_entropy_backward(cache64);
    EXPECT_LE(mha::testing::max_abs_diff(grad64, expected_grad), 1e-14);

    // float32 within the golden rule (twice PyTorch's own float32 error, + 1e-6 of the scale).
    mha::nn::CrossEntropyCache<float> cache32;
    const float loss32 = mha::nn::cross_entropy(mha::cast<float>(logits), targets, &cache32);
    const double torch_loss32 = get_peer("torch_f32.loss")[0];
    EXPECT_LE(std::abs(loss32 - expected_loss),
              2 * std::abs(torch_loss32 - expected_loss) + 1e-6 * std::max(1.0, std::abs(expected_loss)));
    const auto cmp = mha::testing::compare_with_golden(mha::cast<double>(mha::nn::cross_entropy_backward(cache32)),
                                                       expected_grad, get_peer("torch_f32.grad_logits"));
    EXPECT_TRUE(cmp.pass()) << "error " << cmp.error << " bound " << cmp.bound;
  }
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  mha::Generator gen(3);
  Tensor<double> logits({4, 6});
  for (auto& v : logits.values()) v = gen.normal(0.0, 2.0);
  const Tensor<int64_t> targets({4}, {5, 0, 2, 2});
  mha::nn::CrossEntropyCache<double> cache;
  mha::nn::cross_entropy(logits, targets, &cache);
  const double grad_loss = 0.7;
  const Tensor<double> analytic = mha::nn::cross_entropy_backward(cache, grad_loss);
  auto f = [&](const Tensor<double>& x) { return Tensor<double>({1}, {mha::nn::cross_entropy(x, targets)}); };
  EXPECT_TRUE(mha::testing::check_gradient(f, logits, Tensor<double>({1}, {grad_loss}), analytic));
}

TEST(CrossEntropy, IsStableForHugeLogits) {
  // Without subtracting the maximum, exp(1e4) overflows to inf and the loss is NaN.
  const Tensor<float> logits({2, 3}, {1e4f, 0.0f, -1e4f, -5e3f, 5e3f, 5e3f});
  const Tensor<int64_t> targets({2}, {0, 1});
  mha::nn::CrossEntropyCache<float> cache;
  const float loss = mha::nn::cross_entropy(logits, targets, &cache);
  EXPECT_NEAR(loss, std::log(2.0) / 2, 1e-6);
  // Named: ranging over .values() of a temporary would read the tensor after it is destroyed (the
  // range-for keeps only the span alive; AddressSanitizer reported the use after free).
  const Tensor<float> grad = mha::nn::cross_entropy_backward(cache);
  for (float g : grad.values()) EXPECT_TRUE(std::isfinite(g));
}

TEST(CrossEntropy, RefusesBadInput) {
  const Tensor<float> logits({2, 3});
  EXPECT_TRUE(throws_error([&] { mha::nn::cross_entropy(Tensor<float>({6}), Tensor<int64_t>({6})); },
                           {"logits", "2-D tensor (N, C)", "[6]"}));
  EXPECT_TRUE(throws_error([&] { mha::nn::cross_entropy(logits, Tensor<int64_t>({3})); },
                           {"targets", "expected shape [2]", "[3]"}));
  EXPECT_TRUE(throws_error([&] { mha::nn::cross_entropy(logits, Tensor<int64_t>({2}, {0, 3})); },
                           {"targets[1]", "[0, 3)", "got 3"}));
  EXPECT_TRUE(throws_error([&] { mha::nn::cross_entropy(logits, Tensor<int64_t>({2}, {-1, 0})); },
                           {"targets[0]", "got -1"}));
  Tensor<float> nan_logits({1, 2});
  nan_logits[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_error([&] { mha::nn::cross_entropy(nan_logits, Tensor<int64_t>({1})); },
                           {"logits[0, 1]", "finite"}));
  EXPECT_TRUE(throws_error([] { mha::nn::cross_entropy_backward(mha::nn::CrossEntropyCache<float>{}); },
                           {"cache", "empty"}));
}

}  // namespace
