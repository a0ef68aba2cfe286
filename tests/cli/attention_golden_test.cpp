// Black-box: every module golden runs through the `mha attention` command with the flags the
// golden records, and the output file is compared with PyTorch's numbers — in float32 under the
// FlashAttention rule, and in float64 against PyTorch's float64 at 1e-10.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "../support/golden.h"

namespace mha {
namespace {

namespace fs = std::filesystem;

int run_cli(const std::string& arguments) {
  const std::string command = std::string(MHA_CLI_PATH) + " " + arguments + " 2>&1";
  return std::system(command.c_str());
}

class AttentionCliGolden : public ::testing::TestWithParam<fs::path> {};

TEST_P(AttentionCliGolden, MatchesPyTorch) {
  const fs::path dir = GetParam();
  const auto inputs = safetensors::load(dir / "inputs.safetensors");
  const std::string args = inputs.metadata.at("args");
  const auto expected = safetensors::load(dir / "expected_f64.safetensors");
  const auto torch32 = safetensors::load(dir / "torch_f32.safetensors");
  const fs::path out = fs::temp_directory_path() / ("mha_golden_" + dir.filename().string() + ".safetensors");
  for (const char* dtype : {"float32", "float64"}) {
    fs::remove(out);
    const std::string command = "attention " + args + " --dtype " + dtype + " --weights " +
                                (dir / "weights.safetensors").string() + " --inputs " +
                                (dir / "inputs.safetensors").string() + " --output " + out.string();
    ASSERT_EQ(run_cli(command), 0) << "mha " << command;
    const double worst = testing::expect_matches_golden(safetensors::load(out), expected, torch32,
                                                        dir.filename().string() + " " + dtype,
                                                        std::string(dtype) == "float64" ? 1e-10 : 0.0);
    std::cout << "[golden] " << dir.filename().string() << " " << dtype << " largest fraction of the allowed error " << worst << "\n";
  }
  fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Module, AttentionCliGolden, ::testing::ValuesIn(testing::golden_cases("module")),
                         [](const auto& info) { return info.param.filename().string(); });

}  // namespace
}  // namespace mha
