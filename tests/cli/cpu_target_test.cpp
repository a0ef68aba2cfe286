// MHA_CPU_TARGET (mha/core/simd.h) through the built `mha`: the ceiling holds for the whole process
// (the SIMD target its benches report, and bfloat16 products on float32 below AVX3), in any case
// of the name; a name no target compiled in has stops the program with the names it could be.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../support/cli.h"
#include "mha/core/simd.h"

namespace mha {
namespace {

// `mha arguments` with MHA_CPU_TARGET=value (and OPENBLAS_CORETYPE left as it is).
CliResult run_with_target(const std::string& value, const std::string& arguments) {
  return testing::run_program("env", "MHA_CPU_TARGET=" + testing::shell_quote(value) + " " + MHA_CLI_PATH + " " +
                                         arguments);
}

// Whether this process may run `target` (this CPU's, under the ceiling ctest may have been given).
bool cpu_runs(const std::string& target) {
  const std::vector<std::string> targets = simd_targets();
  return std::find(targets.begin(), targets.end(), target) != targets.end();
}

TEST(CpuTarget, CapsTheWholeProcess) {
  if (!cpu_runs("AVX2")) GTEST_SKIP() << "this CPU does not run AVX2";
  const CliResult r = run_with_target("avx2", "bench --gemm --quick --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SIMD target AVX2 (MHA_CPU_TARGET=AVX2)"), std::string::npos) << r.output;
  // An AVX2 CPU has no AVX512_BF16 or AMX: the bf16 products take float32 alone.
  EXPECT_NE(r.output.find("bf16 paths on this CPU (the last is the one taken): [float32 (operands widened)]\n"),
            std::string::npos)
      << r.output;
}

TEST(CpuTarget, ALowerCeilingListsOnlyTheTargetsUnderIt) {
  if (!cpu_runs("SSE4")) GTEST_SKIP() << "this CPU does not run SSE4";
  const CliResult r = run_with_target("SSE4", "bench --gemm --quick --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SIMD target SSE4 (MHA_CPU_TARGET=SSE4)"), std::string::npos) << r.output;
}

TEST(CpuTarget, AnUnknownNameStopsTheProgramNamingTheTargets) {
  const CliResult r = run_with_target("AVX9", "bench --quick");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("mha: MHA_CPU_TARGET: expected one of the targets compiled in ("), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("AVX2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("got \"AVX9\""), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mha
