// Attention heatmaps: layout, colours, labels, PNG round trip through libpng, and input errors.
#include "mha/viz/heatmap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "mha/viz/font.h"
#include "../support/assertions.h"

namespace mha::viz {
namespace {

namespace fs = std::filesystem;
using Colour = std::array<uint8_t, 3>;
using mha::testing::throws_error;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr Colour kWhite = {255, 255, 255};

Colour pixel(const Image& image, int x, int y) {
  const size_t at = (static_cast<size_t>(y) * static_cast<size_t>(image.width) + static_cast<size_t>(x)) * 3;
  return {image.rgb[at], image.rgb[at + 1], image.rgb[at + 2]};
}

// Every pixel of the cell for weight (h, i, j).
std::set<Colour> cell_colours(const Heatmap& heatmap, int h, int i, int j) {
  const int cell = heatmap.layout.cell_size;
  const auto [x0, y0] = heatmap.layout.grids[static_cast<size_t>(h)];
  std::set<Colour> colours;
  for (int y = y0 + i * cell; y < y0 + (i + 1) * cell; ++y)
    for (int x = x0 + j * cell; x < x0 + (j + 1) * cell; ++x) colours.insert(pixel(heatmap.image, x, y));
  return colours;
}

Colour cell_centre(const Heatmap& heatmap, int h, int i, int j) {
  const int cell = heatmap.layout.cell_size;
  const auto [x0, y0] = heatmap.layout.grids[static_cast<size_t>(h)];
  return pixel(heatmap.image, x0 + j * cell + cell / 2, y0 + i * cell + cell / 2);
}

// A (2, 3, 4) tensor with the extremes, intermediate values and one NaN.
Tensor<float> known_weights() {
  return Tensor<float>({2, 3, 4}, {1.0f, 0.0f, 0.0f, 0.0f,  //
                                   0.25f, 0.25f, 0.25f, 0.25f,  //
                                   0.1f, 0.2f, 0.3f, 0.4f,  //
                                   0.0f, 1.0f, 0.0f, 0.0f,  //
                                   kNaN, 0.5f, 0.5f, 0.0f,  //
                                   0.7f, 0.1f, 0.1f, 0.1f});
}

HeatmapOptions known_options() {
  HeatmapOptions options;
  options.query_tokens = {"a", "bb", "ccc"};
  options.key_tokens = {"w", "x", "y", "zz"};
  options.cell_size = 20;
  return options;
}

class HeatmapFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mha_viz_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  size_t files_in_dir() const { return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {})); }

  fs::path dir_;
};

TEST(Colormap, IsViridisWithFixedScaleAndMagentaNaN) {
  EXPECT_EQ(colormap(0.0f), (Colour{68, 1, 84}));     // viridis' dark purple
  EXPECT_EQ(colormap(0.5f), (Colour{33, 145, 140}));  // teal
  EXPECT_EQ(colormap(1.0f), (Colour{253, 231, 37}));  // yellow
  EXPECT_EQ(colormap(-3.0f), colormap(0.0f));
  EXPECT_EQ(colormap(7.0f), colormap(1.0f));
  EXPECT_EQ(colormap(-std::numeric_limits<float>::infinity()), colormap(0.0f));
  EXPECT_EQ(colormap(std::numeric_limits<float>::infinity()), colormap(1.0f));
  EXPECT_EQ(colormap(kNaN), kNanColour);
  // Interpolated between table entries: brightness (green) rises steadily.
  for (int k = 1; k <= 100; ++k)
    EXPECT_GE(colormap(static_cast<float>(k) / 100)[1], colormap(static_cast<float>(k - 1) / 100)[1]) << k;
}

TEST(HeatmapLayout, SizeFollowsTheDocumentedLayout) {
  const HeatmapLayout layout = heatmap_layout({2, 3, 4}, known_options());
  // cell 20 >= 17: labels at scale 2, so n characters are (6n - 1) * 2 pixels long.
  const int query_labels = (6 * 3 - 1) * 2 + 4;  // "ccc"
  const int key_labels = (6 * 2 - 1) * 2 + 4;    // "zz"
  const int panel_title = 22;                     // "head 0" (70 wide) fits over the 80-wide grid
  const int panel_width = query_labels + 4 * 20, panel_height = panel_title + key_labels + 3 * 20;
  EXPECT_EQ(layout.cell_size, 20);
  EXPECT_EQ(layout.columns, 2);
  EXPECT_EQ(layout.rows, 1);
  EXPECT_EQ(layout.width, 16 + 2 * panel_width + 24 + 24 + 57 + 16);
  // The grids are 60 high, so the colour bar's minimum of 96 (and the NaN key) sets the height.
  EXPECT_EQ(layout.height, 16 + std::max(panel_height, panel_title + key_labels + 96 + 32) + 16);
  ASSERT_EQ(layout.grids.size(), 2u);
  EXPECT_EQ(layout.grids[0].x, 16 + query_labels);
  EXPECT_EQ(layout.grids[0].y, 16 + panel_title + key_labels);
  EXPECT_EQ(layout.grids[1].x, 16 + panel_width + 24 + query_labels);
  EXPECT_EQ(layout.grids[1].y, layout.grids[0].y);
}

TEST(HeatmapLayout, PanelsWrapFourPerRowAndATitleAddsALine) {
  HeatmapOptions options;
  options.cell_size = 10;
  const HeatmapLayout plain = heatmap_layout({6, 5, 5}, options);
  EXPECT_EQ(plain.columns, 4);
  EXPECT_EQ(plain.rows, 2);
  EXPECT_EQ(plain.grids[4].x, plain.grids[0].x);
  EXPECT_GT(plain.grids[4].y, plain.grids[3].y + 5 * 10);
  options.title = "layer 0";
  const HeatmapLayout titled = heatmap_layout({6, 5, 5}, options);
  EXPECT_EQ(titled.width, plain.width);
  EXPECT_EQ(titled.height, plain.height + 32);
}

TEST(HeatmapLayout, AutomaticCellSizeLeavesRoomForLabels) {
  EXPECT_EQ(heatmap_layout({2, 3, 4}).cell_size, 32);   // small: capped at 32
  EXPECT_EQ(heatmap_layout({1, 60, 60}).cell_size, 4);  // about 240 pixels per panel
  HeatmapOptions options;
  options.query_tokens.assign(60, "tok");
  EXPECT_EQ(heatmap_layout({1, 60, 60}, options).cell_size, 9);  // room for small labels
  options.query_tokens.assign(30, "tok");
  EXPECT_EQ(heatmap_layout({1, 30, 30}, options).cell_size, 17);  // room for full-size labels
}

TEST(HeatmapLayout, LongTokensAreCutSoTheyCannotWidenThePanel) {
  HeatmapOptions at_limit, long_token;
  at_limit.query_tokens = {std::string(16, 'x'), "a"};
  long_token.query_tokens = {std::string(200, 'x'), "a"};
  EXPECT_EQ(heatmap_layout({2, 2}, long_token).grids[0].x, heatmap_layout({2, 2}, at_limit).grids[0].x);
  EXPECT_EQ(heatmap_layout({2, 2}, long_token).width, heatmap_layout({2, 2}, at_limit).width);
}

TEST(BitmapFont, LabelsArePrintableAsciiAndCutWithDots) {
  EXPECT_EQ(font::printable("hello", 16), "hello");
  EXPECT_EQ(font::printable("caf\xC3\xA9", 16), "caf?");       // one '?' per UTF-8 character
  EXPECT_EQ(font::printable("\xE2\x96\x81the", 16), "?the");   // SentencePiece's word marker
  EXPECT_EQ(font::printable("a\tb\n", 16), "a?b?");
  EXPECT_EQ(font::printable("abcdefghijklmnopqrstuvwxyz", 16), "abcdefghijklmn..");
  EXPECT_EQ(font::printable("abcdefghijklmnopqrstuvwxyz", 16).size(), 16u);
  EXPECT_EQ(font::glyph('\x7F'), font::glyph('?'));
  EXPECT_NE(font::glyph('p'), font::glyph('P'));
}

TEST(Heatmap, CellsHaveTheColourOfTheirWeight) {
  const Tensor<float> weights = known_weights();
  const Heatmap heatmap = render_attention_heatmap(weights, known_options());
  ASSERT_EQ(heatmap.image.width, heatmap.layout.width);
  ASSERT_EQ(heatmap.image.height, heatmap.layout.height);
  ASSERT_EQ(heatmap.image.rgb.size(), static_cast<size_t>(heatmap.image.width) * heatmap.image.height * 3);
  EXPECT_EQ(heatmap.nan_count, 1);

  EXPECT_EQ(cell_centre(heatmap, 0, 0, 0), colormap(1.0f));  // weight 1: the top colour
  EXPECT_EQ(cell_centre(heatmap, 0, 0, 0), (Colour{253, 231, 37}));
  EXPECT_EQ(cell_centre(heatmap, 0, 0, 1), (Colour{68, 1, 84}));  // weight 0: the bottom colour
  EXPECT_EQ(cell_centre(heatmap, 1, 0, 1), colormap(1.0f));
  EXPECT_EQ(cell_centre(heatmap, 1, 1, 0), kNanColour);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) {
        const std::set<Colour> colours = cell_colours(heatmap, h, i, j);
        ASSERT_EQ(colours.size(), 1u) << "cell " << h << "," << i << "," << j << " is not one flat colour";
        EXPECT_EQ(*colours.begin(), colormap(weights[(h * 3 + i) * 4 + j])) << h << "," << i << "," << j;
      }
}

TEST(Heatmap, IsNotBlank) {
  const Heatmap heatmap = render_attention_heatmap(known_weights(), known_options());
  std::set<Colour> colours;
  size_t background = 0;
  for (int y = 0; y < heatmap.image.height; ++y)
    for (int x = 0; x < heatmap.image.width; ++x) {
      colours.insert(pixel(heatmap.image, x, y));
      background += pixel(heatmap.image, x, y) == kWhite;
    }
  EXPECT_GE(colours.size(), 50u);  // cells, the colour bar's gradient, text, frames
  EXPECT_LT(background, static_cast<size_t>(heatmap.image.width) * heatmap.image.height * 9 / 10);
  EXPECT_EQ(pixel(heatmap.image, 0, 0), kWhite);
}

TEST(Heatmap, LabelsAreDrawnWhereTheLayoutLeavesRoom) {
  const Tensor<float> weights = known_weights();
  HeatmapOptions without_tokens;
  without_tokens.cell_size = 20;
  const Heatmap with = render_attention_heatmap(weights, known_options());
  const Heatmap without = render_attention_heatmap(weights, without_tokens);
  auto ink_left_of_grid = [](const Heatmap& heatmap) {
    int ink = 0;
    const auto [x0, y0] = heatmap.layout.grids[0];
    for (int y = y0; y < y0 + 3 * heatmap.layout.cell_size; ++y)
      for (int x = 0; x < x0 - 1; ++x) ink += pixel(heatmap.image, x, y) != kWhite;
    return ink;
  };
  EXPECT_GT(ink_left_of_grid(with), 20);
  EXPECT_EQ(ink_left_of_grid(without), 0);
}

TEST(Heatmap, TwoDimensionalWeightsAreOnePanelWithoutTitle) {
  const Heatmap heatmap = render_attention_heatmap(Tensor<float>({3, 4}, 0.25f));
  EXPECT_EQ(heatmap.layout.columns, 1);
  EXPECT_EQ(heatmap.layout.grids.size(), 1u);
  EXPECT_EQ(heatmap.layout.grids[0].y, 16);  // no panel title above the grid
  EXPECT_EQ(heatmap.nan_count, 0);
}

TEST_F(HeatmapFiles, PngReadsBackWithLibpngAsTheSamePixels) {
  const Heatmap heatmap = render_attention_heatmap(known_weights(), known_options());
  const std::string png = path("weights.png");
  EXPECT_EQ(write_attention_heatmap(png, known_weights(), known_options()), 1);

  // The header, parsed by hand: PNG signature, then IHDR with big-endian width and height,
  // bit depth 8 and colour type 2 (RGB).
  std::ifstream in(png, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 33u);
  EXPECT_EQ(std::vector<unsigned char>(bytes.begin(), bytes.begin() + 8),
            (std::vector<unsigned char>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'}));
  auto be32 = [&](size_t at) { return bytes[at] << 24 | bytes[at + 1] << 16 | bytes[at + 2] << 8 | bytes[at + 3]; };
  EXPECT_EQ(std::string(bytes.begin() + 12, bytes.begin() + 16), "IHDR");
  EXPECT_EQ(be32(16), heatmap.image.width);
  EXPECT_EQ(be32(20), heatmap.image.height);
  EXPECT_EQ(bytes[24], 8);
  EXPECT_EQ(bytes[25], 2);

  // The pixels, decoded by libpng.
  const Image decoded = read_png(png);
  EXPECT_EQ(decoded.width, heatmap.image.width);
  EXPECT_EQ(decoded.height, heatmap.image.height);
  EXPECT_TRUE(decoded.rgb == heatmap.image.rgb) << "decoded pixels differ from the rendered image";
  EXPECT_EQ(files_in_dir(), 1u);  // no temporary file left beside it
}

TEST_F(HeatmapFiles, WritePngReplacesAnExistingFile) {
  const std::string png = path("out.png");
  std::ofstream(png) << "old contents";
  Image image{2, 1, {1, 2, 3, 4, 5, 6}};
  write_png(png, image);
  const Image decoded = read_png(png);
  EXPECT_EQ(decoded.rgb, image.rgb);
}

TEST_F(HeatmapFiles, UnwritablePathsThrowAndLeaveNoFile) {
  EXPECT_TRUE(throws_error([&] { write_attention_heatmap(path("no_such_dir/out.png"), known_weights()); },
                           {"write_png: cannot write '", "no_such_dir/out.png", "No such file or directory"}));
  EXPECT_FALSE(fs::exists(path("no_such_dir")));
  // A directory in the way: not a regular file, so it would be written in place, and opening it
  // for writing fails; nothing is created beside it or inside it.
  fs::create_directories(path("a_directory/inside"));
  EXPECT_TRUE(throws_error([&] { write_attention_heatmap(path("a_directory"), known_weights()); },
                           {"write_png: cannot write '", "a_directory", "': Is a directory"}));
  EXPECT_TRUE(fs::is_directory(path("a_directory/inside")));
  EXPECT_EQ(files_in_dir(), 1u);
  // Bad input never touches the disk.
  EXPECT_TRUE(throws_error([&] { write_attention_heatmap(path("bad.png"), Tensor<float>({4}, 0.5f)); },
                           {"weights: expected"}));
  EXPECT_TRUE(throws_error([&] { write_png(path("bad.png"), Image{2, 2, std::vector<uint8_t>(11)}); },
                           {"write_png: image.rgb: expected width * height * 3 = 12 bytes, got 11"}));
  EXPECT_TRUE(throws_error([&] { write_png(path("bad.png"), Image{}); },
                           {"write_png: image: expected width and height in 1..16384, got 0 x 0"}));
  EXPECT_EQ(files_in_dir(), 1u);
}

TEST_F(HeatmapFiles, ReadPngReportsLibpngErrors) {
  std::ofstream(path("not.png")) << "this is not a PNG file";
  EXPECT_TRUE(throws_error([&] { read_png(path("not.png")); }, {"read_png: cannot read '", "not.png", "libpng: "}));
  EXPECT_TRUE(throws_error([&] { read_png(path("missing.png")); }, {"read_png: cannot read '", "missing.png"}));
  // A truncated PNG fails inside libpng's decoder: an mha::Error, not an abort.
  const std::string png = path("whole.png");
  write_attention_heatmap(png, known_weights(), known_options());
  std::ifstream in(png, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path("truncated.png"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_TRUE(throws_error([&] { read_png(path("truncated.png")); }, {"read_png: cannot read '", "truncated.png"}));
}

TEST(HeatmapErrors, NameTheArgumentExpectedAndReceived) {
  EXPECT_TRUE(throws_error([] { render_attention_heatmap(Tensor<float>({2, 2, 3, 4}, 0.5f)); },
                           {"weights: expected a 2-D (L, S) or 3-D (H, L, S) tensor, got shape [2, 2, 3, 4]"}));
  EXPECT_TRUE(throws_error([] { render_attention_heatmap(Tensor<float>({12}, 0.5f)); }, {"got shape [12]"}));
  EXPECT_TRUE(throws_error([] { render_attention_heatmap(Tensor<float>()); }, {"got shape []"}));
  EXPECT_TRUE(throws_error([] { render_attention_heatmap(Tensor<float>({2, 0, 4})); },
                           {"weights: expected no empty dimension, got shape [2, 0, 4]"}));

  HeatmapOptions options;
  options.query_tokens = {"a", "b"};
  EXPECT_TRUE(throws_error([&] { render_attention_heatmap(known_weights(), options); },
                           {"query_tokens: expected 3 (L, the rows of weights [2, 3, 4]) or none, got 2"}));
  options = {};
  options.key_tokens = {"a", "b", "c", "d", "e"};
  EXPECT_TRUE(throws_error([&] { render_attention_heatmap(known_weights(), options); },
                           {"key_tokens: expected 4 (S, the columns of weights [2, 3, 4]) or none, got 5"}));
  options = {};
  options.panel_titles = {"only one"};
  EXPECT_TRUE(throws_error([&] { render_attention_heatmap(known_weights(), options); },
                           {"panel_titles: expected 2 (H, the heads of weights [2, 3, 4]) or none, got 1"}));
  options = {};
  options.cell_size = -1;
  EXPECT_TRUE(throws_error([&] { render_attention_heatmap(known_weights(), options); },
                           {"cell_size: expected 0 (automatic) or 1..256 pixels, got -1"}));
}

TEST(HeatmapErrors, PicturesOverTheSizeLimitAreRefusedBeforeAllocating) {
  HeatmapOptions options;
  options.cell_size = 32;
  EXPECT_TRUE(throws_error([&] { heatmap_layout({1, 4, 1000}, options); },
                           {"heatmap: the picture of weights [1, 4, 1000] at cell_size 32 would be ",
                            "pixels, over the limit of 16384 x 16384"}));
  EXPECT_TRUE(throws_error([] { heatmap_layout({20000, 4}); },
                           {"weights: shape [20000, 4] cannot fit in the largest picture, 16384 x 16384 pixels"}));
  EXPECT_TRUE(throws_error([] { heatmap_layout({int64_t{1} << 40, int64_t{1} << 40}); }, {"cannot fit"}));
}

}  // namespace
}  // namespace mha::viz
