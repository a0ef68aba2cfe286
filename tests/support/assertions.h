#pragma once
// Assertions shared by the tests: clear-error checks and elementwise closeness.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "mha/core/error.h"
#include "mha/core/tensor.h"

namespace mha::testing {

// Success when f() throws mha::Error whose message contains every one of `parts`.
template <class F>
::testing::AssertionResult throws_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& part : parts)
      if (msg.find(part) == std::string::npos)
        return ::testing::AssertionFailure()
               << "mha::Error message \"" << msg << "\" does not contain \"" << part << "\"";
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-mha::Error exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// The message of the mha::Error that action() throws, or "<no mha::Error thrown>".
template <class Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no mha::Error thrown>";
}

// Shorthand for the common case: one expected fragment of the message.
template <class F>
void expect_error(F&& f, const std::string& fragment) {
  EXPECT_TRUE(throws_error(std::forward<F>(f), {fragment}));
}

// Elementwise |a − b| <= atol + rtol · |b| (b the reference).
template <class T, class U>
::testing::AssertionResult all_close(const Tensor<T>& a, const Tensor<U>& b, double rtol,
                                     double atol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure()
           << "shape " << to_string(a.shape()) << " vs reference " << to_string(b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (!(std::abs(x - y) <= atol + rtol * std::abs(y)))
      return ::testing::AssertionFailure() << "at flat index " << i << ": " << x << " vs reference "
                                           << y << " (shape " << to_string(a.shape()) << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace mha::testing
