// The one SIMD pin of the library (mha/core/simd.h): the target list does not depend on the
// pin, a scoped pin is undone however its scope ends, and a bad name is refused with the list.
#include "mha/core/simd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/assertions.h"

namespace {

using mha::testing::throws_error;

TEST(Simd, PinsAndUnpinsEveryTarget) {
  const std::vector<std::string> targets = mha::simd_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(mha::pinned_simd_target(), "");
  for (const std::string& target : targets) {
    {
      const mha::ScopedSimdTarget pin(target);
      EXPECT_EQ(mha::pinned_simd_target(), target);
      EXPECT_EQ(mha::simd_targets(), targets);  // the pin hides no target from the list
    }
    EXPECT_EQ(mha::pinned_simd_target(), "");
  }
  mha::pin_simd_target(targets.back());
  {
    const mha::ScopedSimdTarget pin(targets.front());
    EXPECT_EQ(mha::pinned_simd_target(), targets.front());
  }
  EXPECT_EQ(mha::pinned_simd_target(), targets.back());  // the earlier pin is restored
  mha::pin_simd_target("");
  EXPECT_EQ(mha::pinned_simd_target(), "");
}

TEST(Simd, ScopedPinIsUndoneWhenItsScopeThrows) {
  const std::string target = mha::simd_targets().back();
  EXPECT_THROW(
      {
        const mha::ScopedSimdTarget pin(target);
        throw std::runtime_error("a failing test");
      },
      std::runtime_error);
  EXPECT_EQ(mha::pinned_simd_target(), "");
}

TEST(Simd, RefusesAnUnknownTarget) {
  const std::string best = mha::simd_targets().front();
  EXPECT_TRUE(throws_error([] { mha::pin_simd_target("AVX9"); },
                           {"pin_simd_target: name", "expected", best, "got \"AVX9\""}));
  EXPECT_EQ(mha::pinned_simd_target(), "");
}

// MHA_CPU_TARGET, as this test runs (ctest may run the suite under a ceiling): the ceiling reads
// it in Highway's spelling, and the best target listed (the one dispatch takes) is the ceiling
// itself where the CPU runs it. (tests/cli/cpu_target_test.cpp sets it for a whole process.)
TEST(Simd, TheCeilingIsTheEnvironmentsAndBoundsTheList) {
  const char* value = std::getenv("MHA_CPU_TARGET");
  std::string expected = value ? value : "";
  for (char& c : expected) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(mha::simd_target_ceiling(), expected);
  const std::vector<std::string> targets = mha::simd_targets();
  if (!expected.empty() && std::find(targets.begin(), targets.end(), expected) != targets.end())
    EXPECT_EQ(targets.front(), expected);
}

}  // namespace
