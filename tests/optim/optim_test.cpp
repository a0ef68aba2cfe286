// AdamW and the warm-up + cosine schedule against PyTorch (tests/goldens/training/), state
// save/restore, and input checks.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "../support/assertions.h"
#include "../support/golden.h"
#include "mha/core/random.h"
#include "mha/core/safetensors.h"
#include "mha/optim/adamw.h"
#include "mha/optim/schedule.h"

namespace {

namespace st = mha::safetensors;
using mha::Tensor;
using mha::testing::throws_error;

struct TwoParameters {
  Tensor<float> a, b, grad_a, grad_b;
  std::vector<mha::nn::Parameter<float>> list() { return {{"a", &a, &grad_a}, {"b", &b, &grad_b}}; }
};

// |x − y| ≤ 4 ulp of max(|x|, |y|), or both tiny.
::testing::AssertionResult close_ulps(const Tensor<float>& got, const Tensor<float>& expected) {
  if (got.shape() != expected.shape()) return ::testing::AssertionFailure() << "shapes differ";
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double scale = std::max(std::abs(got[i]), std::abs(expected[i]));
    if (std::abs(got[i] - expected[i]) > 4 * 1.2e-7 * scale + 1e-30)
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs PyTorch " << expected[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(AdamW, MatchesPyTorchStepByStep) {
  const st::File g = st::load(mha::testing::goldens_dir() + "/training/adamw.safetensors");
  auto f32 = [&](const std::string& name) { return st::to_tensor<float>(st::require(g, name, "adamw golden"), name); };
  TwoParameters p{f32("initial.a"), f32("initial.b"), Tensor<float>({5, 3}), Tensor<float>({4})};
  mha::optim::AdamWOptions options;
  options.weight_decay = std::stod(g.metadata.at("weight_decay"));
  options.beta1 = std::stod(g.metadata.at("beta1"));
  options.beta2 = std::stod(g.metadata.at("beta2"));
  options.eps = std::stod(g.metadata.at("eps"));
  mha::optim::AdamW<float> opt(p.list(), options);
  const Tensor<double> lr = st::to_tensor<double>(st::require(g, "lr", "adamw golden"), "lr");
  const int steps = std::stoi(g.metadata.at("steps"));
  for (int k = 0; k < steps; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    p.grad_a = f32("grad." + std::to_string(k) + ".a");
    p.grad_b = f32("grad." + std::to_string(k) + ".b");
    opt.set_lr(lr[k]);
    opt.step();
    EXPECT_TRUE(close_ulps(p.a, f32("after." + std::to_string(k) + ".a")));
    EXPECT_TRUE(close_ulps(p.b, f32("after." + std::to_string(k) + ".b")));
  }
  const auto state = opt.state_dict();
  EXPECT_TRUE(close_ulps(state.at("a.exp_avg"), f32("exp_avg.a")));
  EXPECT_TRUE(close_ulps(state.at("a.exp_avg_sq"), f32("exp_avg_sq.a")));
  EXPECT_TRUE(close_ulps(state.at("b.exp_avg_sq"), f32("exp_avg_sq.b")));
  EXPECT_EQ(state.at("a.step")[0], static_cast<float>(steps));
  EXPECT_EQ(opt.steps(), steps);
}

TEST(AdamW, StateDictRoundTripContinuesBitwise) {
  mha::Generator gen(5);
  auto random = [&](mha::Shape s) {
    Tensor<float> t(s);
    for (auto& v : t.values()) v = static_cast<float>(gen.normal());
    return t;
  };
  TwoParameters x{random({3, 2}), random({2}), Tensor<float>({3, 2}), Tensor<float>({2})};
  TwoParameters y = x;
  mha::optim::AdamW<float> ox(x.list()), oy(y.list());
  std::vector<Tensor<float>> grads;
  for (int k = 0; k < 8; ++k) grads.push_back(random({3, 2})), grads.push_back(random({2}));
  for (int k = 0; k < 3; ++k) {
    x.grad_a = y.grad_a = grads[2 * k];
    x.grad_b = y.grad_b = grads[2 * k + 1];
    ox.step();
    oy.step();
  }
  // A fresh optimizer given y's state continues exactly as x's does.
  mha::optim::AdamW<float> resumed(y.list());
  resumed.load_state_dict(oy.state_dict());
  EXPECT_EQ(resumed.steps(), 3);
  for (int k = 3; k < 8; ++k) {
    x.grad_a = y.grad_a = grads[2 * k];
    x.grad_b = y.grad_b = grads[2 * k + 1];
    ox.step();
    resumed.step();
  }
  for (int64_t i = 0; i < x.a.numel(); ++i) EXPECT_EQ(x.a[i], y.a[i]);
  for (int64_t i = 0; i < x.b.numel(); ++i) EXPECT_EQ(x.b[i], y.b[i]);
}

TEST(AdamW, RefusesBadOptionsAndState) {
  TwoParameters p{Tensor<float>({2}), Tensor<float>({1}), Tensor<float>({2}), Tensor<float>({1})};
  mha::optim::AdamWOptions o;
  o.lr = -1;
  EXPECT_TRUE(throws_error([&] { mha::optim::AdamW<float>(p.list(), o); }, {"lr", ">= 0", "-1"}));
  o = {};
  o.beta2 = 1.0;
  EXPECT_TRUE(throws_error([&] { mha::optim::AdamW<float>(p.list(), o); }, {"beta2", "[0, 1)", "1"}));
  o = {};
  o.weight_decay = NAN;
  EXPECT_TRUE(throws_error([&] { mha::optim::AdamW<float>(p.list(), o); }, {"weight_decay"}));
  auto dup = p.list();
  dup[1].name = "a";
  EXPECT_TRUE(throws_error([&] { mha::optim::AdamW<float>(dup, {}); }, {"unique", "'a'"}));
  auto wrong_grad = p.list();
  Tensor<float> g3({3});
  wrong_grad[0].grad = &g3;
  EXPECT_TRUE(throws_error([&] { mha::optim::AdamW<float>(wrong_grad, {}); }, {"gradient of 'a'", "[2]", "[3]"}));

  mha::optim::AdamW<float> opt(p.list());
  EXPECT_TRUE(throws_error([&] { opt.set_lr(-0.5); }, {"lr", "-0.5"}));
  auto state = opt.state_dict();
  state.erase("b.exp_avg");
  state["c.exp_avg"] = Tensor<float>({1});
  state["a.exp_avg_sq"] = Tensor<float>({7});
  EXPECT_TRUE(throws_error([&] { opt.load_state_dict(state); },
                           {"missing tensor 'b.exp_avg'", "unexpected tensor 'c.exp_avg'", "'a.exp_avg_sq'",
                            "expected shape [2], got [7]"}));
  state = opt.state_dict();
  state["a.step"] = Tensor<float>(mha::Shape{}, 2.5f);
  EXPECT_TRUE(throws_error([&] { opt.load_state_dict(state); }, {"a.step", "whole number"}));
}

TEST(Schedule, MatchesPyTorchSchedulers) {
  const st::File g = st::load(mha::testing::goldens_dir() + "/training/schedule.safetensors");
  std::stringstream cases(g.metadata.at("cases"));
  for (std::string name; std::getline(cases, name, ',');) {
    SCOPED_TRACE(name);
    mha::optim::WarmupCosineSchedule s;
    s.base_lr = std::stod(g.metadata.at(name + ".base_lr"));
    s.min_lr = std::stod(g.metadata.at(name + ".min_lr"));
    s.warmup_steps = std::stoll(g.metadata.at(name + ".warmup"));
    s.total_steps = std::stoll(g.metadata.at(name + ".total"));
    const Tensor<double> expected = st::to_tensor<double>(st::require(g, name + ".lr", "schedule golden"), "lr");
    ASSERT_EQ(expected.numel(), s.total_steps);
    for (int64_t step = 0; step < s.total_steps; ++step)
      EXPECT_NEAR(s.lr_at(step), expected[step], 1e-12 * s.base_lr) << "step " << step;
    // Past the end: the floor.
    EXPECT_EQ(s.lr_at(s.total_steps), s.min_lr);
    EXPECT_EQ(s.lr_at(s.total_steps + 100), s.min_lr);
  }
}

TEST(Schedule, RefusesBadSettings) {
  mha::optim::WarmupCosineSchedule s;
  s.total_steps = 10;
  s.warmup_steps = 10;
  EXPECT_TRUE(throws_error([&] { s.lr_at(0); }, {"warmup_steps", "0 to total_steps - 1 = 9", "got 10"}));
  s.warmup_steps = 0;
  s.min_lr = 1.0;
  EXPECT_TRUE(throws_error([&] { s.lr_at(0); }, {"min_lr", "[0, base_lr"}));
  s.min_lr = 0;
  EXPECT_TRUE(throws_error([&] { s.lr_at(-1); }, {"step", ">= 0", "-1"}));
  s.total_steps = 0;
  EXPECT_TRUE(throws_error([&] { s.lr_at(0); }, {"total_steps", ">= 1"}));
}

}  // namespace
