// `mha attention --window LEFT,RIGHT`: the module's sliding window from the command line. The
// file it writes (forward and --backward, float64 on the reference backend) is byte for byte the
// file of the same call given the window as a bool attn_mask (True = blocked) built here from
// the definition: query i sees key j when i + d − LEFT <= j <= i + d + RIGHT, d = S − L without
// causality. Bad windows are one-line errors that leave no file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../support/cli.h"
#include "mha/core/random.h"
#include "mha/core/safetensors.h"

namespace mha {
namespace {

namespace fs = std::filesystem;
namespace st = mha::safetensors;

using mha::testing::CliResult;
using mha::testing::run_cli;

class AttentionWindowCli : public mha::testing::CliTest {
 protected:
  static constexpr int64_t kLen = 7, kSrc = 11, kEmbed = 8;

  // Inputs (L, N, E) with distinct keys and values, and the same with the window as a mask.
  void SetUp() override {
    Generator gen(3);
    auto random = [&](Shape shape) {
      Tensor<double> t(std::move(shape));
      for (auto& x : t.values()) x = gen.normal();
      return t;
    };
    st::File inputs;
    inputs.tensors["query"] = st::from_tensor(random({kLen, 2, kEmbed}));
    inputs.tensors["key"] = st::from_tensor(random({kSrc, 2, kEmbed}));
    inputs.tensors["value"] = st::from_tensor(random({kSrc, 2, kEmbed}));
    inputs.tensors["grad_output"] = st::from_tensor(random({kLen, 2, kEmbed}));
    st::save(inputs, path("inputs.safetensors"));
    Tensor<bool> blocked({kLen, kSrc});
    for (int64_t i = 0; i < kLen; ++i)
      for (int64_t j = 0; j < kSrc; ++j) {
        const int64_t d = kSrc - kLen;
        blocked[i * kSrc + j] = !(j >= i + d - 2 && j <= i + d + 1);  // window 2,1
      }
    inputs.tensors["attn_mask"] = st::from_tensor(blocked);
    st::save(inputs, path("masked.safetensors"));
  }

  std::string bytes(const std::string& name) const {
    std::ifstream in(path(name), std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
};

TEST_F(AttentionWindowCli, WritesTheFileOfTheWindowAsAMask) {
  const std::string common = "attention --embed-dim 8 --num-heads 2 --dtype float64 --backward --seed 4 ";
  const CliResult windowed = run_cli(common + "--window 2,1 --inputs " + path("inputs.safetensors") + " --output " +
                                     path("windowed.safetensors"));
  ASSERT_EQ(windowed.exit_code, 0) << windowed.output;
  const CliResult masked = run_cli(common + "--inputs " + path("masked.safetensors") + " --output " +
                                   path("masked_out.safetensors"));
  ASSERT_EQ(masked.exit_code, 0) << masked.output;
  const CliResult plain = run_cli(common + "--inputs " + path("inputs.safetensors") + " --output " +
                                  path("plain.safetensors"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(bytes("windowed.safetensors"), bytes("masked_out.safetensors"));
  EXPECT_NE(bytes("windowed.safetensors"), bytes("plain.safetensors"));  // the window does something
}

TEST_F(AttentionWindowCli, BadWindowsAreRefused) {
  const std::string common = "attention --embed-dim 8 --num-heads 2 --inputs " + path("inputs.safetensors") +
                             " --output " + path("out.safetensors") + " --window ";
  for (auto [window, needle] : {std::pair<std::string, std::string>{"-2,0", "window_left: expected -1 (unbounded)"},
                                {"3,-9", "window_right: expected -1 (unbounded)"},
                                {"3", "--window"},
                                {"a,b", "--window"}}) {
    const CliResult r = run_cli(common + window);
    EXPECT_NE(r.exit_code, 0) << window;
    EXPECT_NE(r.output.find(needle), std::string::npos) << window << ": " << r.output;
    EXPECT_FALSE(fs::exists(path("out.safetensors"))) << window;
  }
}

}  // namespace
}  // namespace mha
