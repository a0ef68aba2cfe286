#pragma once
// Running one check on every (scalar type, attention backend) pair, and comparing a result with
// hand-derived values: shared by the numerical edge-case tests of the core and of the module.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mha/attention/options.h"
#include "mha/core/tensor.h"

namespace mha::testing {

// fn.template operator()<T>(backend, tolerance) for double on the reference (1e-12) and float on
// the reference and on cpu_flash (1e-6).
template <class F>
void for_every_backend(F fn) {
  {
    SCOPED_TRACE("double, reference");
    fn.template operator()<double>(attention::Backend::reference, 1e-12);
  }
  for (attention::Backend backend : {attention::Backend::reference, attention::Backend::cpu_flash}) {
    SCOPED_TRACE(backend == attention::Backend::cpu_flash ? "float, cpu_flash" : "float, reference");
    fn.template operator()<float>(backend, 1e-6);
  }
}

// |got − expected| <= tolerance · (1 + |expected|), elementwise, after checking the shape.
template <class T>
void expect_values(const Tensor<T>& got, const Shape& shape, const std::vector<double>& expected,
                   double tolerance, const std::string& what) {
  ASSERT_EQ(got.shape(), shape) << what;
  ASSERT_EQ(static_cast<size_t>(got.numel()), expected.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(static_cast<double>(got[static_cast<int64_t>(i)]), expected[i],
                tolerance * (1 + std::abs(expected[i])))
        << what << " element " << i;
}

}  // namespace mha::testing
