// `mha heatmap` as a black box: weights in a .safetensors file in, a PNG out (read back with
// libpng through mha::viz::read_png); bad input gives a one-line message and no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <iterator>
#include <limits>
#include <set>
#include <string>

#include "../support/cli.h"
#include "mha/core/safetensors.h"
#include "mha/viz/heatmap.h"

namespace mha {
namespace {

class HeatmapCli : public mha::testing::CliTest {
 protected:
  void SetUp() override {
    // (N, H, L, S) = (2, 2, 3, 3), as `mha attention --no-average-attn-weights` writes them; batch
    // element 1 is the identity in head 0, so the chosen element shows in the picture.
    Tensor<float> weights({2, 2, 3, 3}, 0.0f);
    for (int64_t i = 0; i < weights.numel(); ++i) weights[i] = static_cast<float>(i % 7) / 6.0f;
    for (int64_t i = 0; i < 9; ++i) weights[18 + i] = i % 4 == 0 ? 1.0f : 0.0f;
    st::File file;
    file.tensors["attn_weights"] = st::from_tensor(weights);
    st::save(file, path("weights.safetensors"));
  }
};

TEST_F(HeatmapCli, DrawsTheChosenBatchElementWithTokens) {
  const CliResult r = run_cli("heatmap --input " + path("weights.safetensors") + " --output " + path("out.png") +
                              " --batch 1 --tokens 'the cat sat' --title 'batch 1'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");

  viz::HeatmapOptions options;
  options.query_tokens = options.key_tokens = {"the", "cat", "sat"};
  options.title = "batch 1";
  const viz::HeatmapLayout layout = viz::heatmap_layout({2, 3, 3}, options);
  const viz::Image image = viz::read_png(path("out.png"));
  EXPECT_EQ(image.width, layout.width);
  EXPECT_EQ(image.height, layout.height);

  std::set<std::array<uint8_t, 3>> colours;
  for (size_t at = 0; at + 2 < image.rgb.size(); at += 3) colours.insert({image.rgb[at], image.rgb[at + 1], image.rgb[at + 2]});
  EXPECT_GE(colours.size(), 50u) << "the picture looks blank";

  auto centre = [&](int h, int i, int j) {
    const int cell = layout.cell_size;
    const size_t x = static_cast<size_t>(layout.grids[static_cast<size_t>(h)].x + j * cell + cell / 2);
    const size_t y = static_cast<size_t>(layout.grids[static_cast<size_t>(h)].y + i * cell + cell / 2);
    const size_t at = (y * static_cast<size_t>(image.width) + x) * 3;
    return std::array<uint8_t, 3>{image.rgb[at], image.rgb[at + 1], image.rgb[at + 2]};
  };
  EXPECT_EQ(centre(0, 1, 1), viz::colormap(1.0f));  // batch 1, head 0: identity
  EXPECT_EQ(centre(0, 0, 1), viz::colormap(0.0f));
  EXPECT_EQ(centre(1, 0, 0), viz::colormap(static_cast<float>(27 % 7) / 6.0f));
}

TEST_F(HeatmapCli, BadInputGivesOneLineAndNoFile) {
  const std::string common = "heatmap --input " + path("weights.safetensors") + " --output " + path("out.png");
  struct Case {
    std::string flags, needle;
    bool one_line;  // every error is one line, CLI11's parse errors too (tools/mha/main.cpp)
  };
  for (const Case& c :
       {Case{" --tokens 'a b'", "--tokens: expected 3 tokens (L, the rows of the panels [2, 3, 3]), got 2", true},
        Case{" --key-tokens 'a b c d'", "--key-tokens: expected 3 tokens", true},
        Case{" --batch 2", "--batch: expected an index in [0, 2)", true},
        Case{" --tensor nope", "no tensor named 'nope'", true},
        Case{" --cell-size 999", "--cell-size", true}}) {
    const CliResult r = run_cli(common + c.flags);
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.flags << ": " << r.output;
    if (c.one_line) {
      EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    }
    EXPECT_FALSE(fs::exists(path("out.png"))) << c.flags;
  }
  const CliResult missing = run_cli("heatmap --input " + path("weights.safetensors"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--output is required"), std::string::npos) << missing.output;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), {}), 1);  // only the input: no temporary files
}

TEST_F(HeatmapCli, ThreeDimensionalWeightsAreHeadsUnlessBatchIsGiven) {
  st::File file;
  file.tensors["attn_weights"] = st::from_tensor(Tensor<float>({3, 4, 5}, 0.2f));
  st::save(file, path("three.safetensors"));
  const std::string common = "heatmap --input " + path("three.safetensors") + " --cell-size 10 --output ";
  ASSERT_EQ(run_cli(common + path("heads.png")).exit_code, 0);
  ASSERT_EQ(run_cli(common + path("batch.png") + " --batch 2").exit_code, 0);
  viz::HeatmapOptions options;
  options.cell_size = 10;
  EXPECT_EQ(viz::read_png(path("heads.png")).width, viz::heatmap_layout({3, 4, 5}, options).width);  // (H, L, S)
  EXPECT_EQ(viz::read_png(path("batch.png")).width, viz::heatmap_layout({4, 5}, options).width);     // (N, L, S)
  const CliResult r = run_cli("heatmap --input " + path("three.safetensors") + " --batch 3 --output " + path("x.png"));
  EXPECT_NE(r.output.find("--batch: expected an index in [0, 3)"), std::string::npos) << r.output;
}

TEST_F(HeatmapCli, ReportsNaNWeights) {
  Tensor<float> weights({2, 2}, 0.5f);
  weights[3] = std::numeric_limits<float>::quiet_NaN();
  st::File file;
  file.tensors["w"] = st::from_tensor(weights);
  st::save(file, path("nan.safetensors"));
  const CliResult r = run_cli("heatmap --input " + path("nan.safetensors") + " --tensor w --output " + path("nan.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: 1 NaN weight in tensor 'w'"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(path("nan.png")));
}

}  // namespace
}  // namespace mha
