// Black-box: every module golden runs through the `mha attention` command with the flags the
// golden records, and the output file is compared with PyTorch's numbers — in float32 under the
// FlashAttention rule (on the default backend, cpu_flash, and on the reference), and in float64
// against PyTorch's float64 at 1e-10.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../support/cli.h"
#include "../support/golden.h"

namespace mha {
namespace {

class AttentionCliGolden : public testing::TempDirTest<::testing::TestWithParam<fs::path>> {};

TEST_P(AttentionCliGolden, MatchesPyTorch) {
  const fs::path dir = GetParam();
  const auto inputs = safetensors::load(dir / "inputs.safetensors");
  const std::string args = inputs.metadata.at("args");
  const auto expected = safetensors::load(dir / "expected_f64.safetensors");
  const auto torch32 = testing::load_peer(dir / "torch_f32.safetensors");
  const std::string out = path("output.safetensors");
  for (const std::string dtype : {"float32", "float32 --backend reference", "float64"}) {
    fs::remove(out);
    const std::string command = "attention " + args + " --dtype " + dtype + " --weights " +
                                (dir / "weights.safetensors").string() + " --inputs " +
                                (dir / "inputs.safetensors").string() + " --output " + out;
    const testing::CliResult run = testing::run_cli(command);
    ASSERT_EQ(run.exit_code, 0) << "mha " << command << "\n" << run.output;
    const double worst = testing::expect_matches_golden(safetensors::load(out), expected, torch32,
                                                        dir.filename().string() + " " + dtype,
                                                        dtype == "float64" ? 1e-10 : 0.0);
    std::cout << "[golden] " << dir.filename().string() << " " << dtype << " largest fraction of the allowed error " << worst << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Module, AttentionCliGolden, ::testing::ValuesIn(testing::golden_cases("module")),
                         [](const auto& info) { return info.param.filename().string(); });

}  // namespace
}  // namespace mha
