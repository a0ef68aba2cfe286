// Every example, run on the weights and inputs of its PyTorch twin (scripts/goldens/examples),
// must reproduce PyTorch's numbers: float32 under the FlashAttention rule against PyTorch's
// float64 (tests/support/golden.h). The golden's metadata names the example program.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "../support/golden.h"

namespace mha {
namespace {

namespace fs = std::filesystem;

class ExampleGolden : public ::testing::TestWithParam<fs::path> {};

TEST_P(ExampleGolden, MatchesPyTorch) {
  const fs::path dir = GetParam();
  const auto expected = safetensors::load(dir / "expected_f64.safetensors");
  const auto torch32 = testing::load_peer(dir / "torch_f32.safetensors");
  const fs::path out = fs::temp_directory_path() / ("mha_example_" + dir.filename().string() + ".safetensors");
  fs::remove(out);
  std::string command = std::string(MHA_EXAMPLES_DIR) + "/" + expected.metadata.at("program") + " " +
                        expected.metadata.at("args") + " --weights " + (dir / "weights.safetensors").string() +
                        " --output " + out.string();
  if (fs::exists(dir / "inputs.safetensors")) command += " --inputs " + (dir / "inputs.safetensors").string();
  ASSERT_EQ(std::system((command + " > /dev/null").c_str()), 0) << command;
  const double used = testing::expect_matches_golden(safetensors::load(out), expected, torch32, dir.filename().string());
  std::cout << "[golden] example " << dir.filename().string() << " float32 largest fraction of the allowed error " << used
            << "\n";
  fs::remove(out);
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleGolden, ::testing::ValuesIn(testing::golden_cases("examples")),
                         [](const auto& info) { return info.param.filename().string(); });

}  // namespace
}  // namespace mha
