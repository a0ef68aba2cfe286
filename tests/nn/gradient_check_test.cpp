// The finite-difference helper itself: it must accept a right gradient and reject a wrong one.
#include <gtest/gtest.h>

#include "../support/gradient_check.h"

namespace {

using mha::Generator;
using mha::Tensor;
using namespace mha::testing;

// f(x) = x² · c elementwise (c a captured tensor), gradient 2·x·c·g.
TEST(GradientCheck, AcceptsRightAndRejectsWrongGradients) {
  Generator gen(1);
  const Tensor<double> x = random_tensor({3, 4}, gen);
  Tensor<double> c = random_tensor({3, 4}, gen);
  const Tensor<double> g = random_tensor({3, 4}, gen);
  auto f = [&](const Tensor<double>& v) {
    Tensor<double> y(v.shape());
    for (int64_t i = 0; i < v.numel(); ++i) y[i] = v[i] * v[i] * c[i];
    return y;
  };
  Tensor<double> grad_x(x.shape()), grad_c(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    grad_x[i] = 2 * x[i] * c[i] * g[i];
    grad_c[i] = x[i] * x[i] * g[i];
  }
  EXPECT_TRUE(check_gradient(f, x, g, grad_x));
  Tensor<double> x_copy = x;
  EXPECT_TRUE(check_gradient(replacing(c, [&] { return f(x_copy); }), c, g, grad_c));

  Tensor<double> wrong = grad_x;
  wrong[5] *= 1.0001;  // a 1e-4 relative error in one entry
  const auto result = check_gradient(f, x, g, wrong);
  EXPECT_FALSE(result);
  EXPECT_NE(std::string(result.message()).find("flat index 5"), std::string::npos)
      << result.message();
  EXPECT_FALSE(gradients_close(grad_x, Tensor<double>({4, 3})));  // shape mismatch
}

TEST(GradientCheck, RandomShapesStayInRange) {
  Generator gen(2);
  for (int i = 0; i < 100; ++i) {
    const mha::Shape s = random_shape(gen, 3);
    ASSERT_EQ(s.size(), 3u);
    for (int64_t d : s) {
      EXPECT_GE(d, 1);
      EXPECT_LE(d, 7);
    }
  }
}

}  // namespace
