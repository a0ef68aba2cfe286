#pragma once
// Attention-weight heatmaps as PNG pictures: one panel per head (laid out in a grid, 4 per row),
// query tokens to the left of each panel, key tokens above it (written bottom-to-top), a
// colour bar on the right. The colour scale is fixed to [0, 1] (weights are probabilities),
// so pictures of different heads, layers and inputs can be compared by eye.
//
// viz is a layer above core: it depends on core only, and on libpng privately.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mha/core/tensor.h"

namespace mha::viz {

// Largest width and height of a picture: beyond this, viewers struggle and memory use
// (3 bytes per pixel) becomes unreasonable for a diagnostic picture.
inline constexpr int kMaxImageSide = 16384;

// NaN weights are drawn in this colour (magenta: not on the colour scale) and counted.
inline constexpr std::array<uint8_t, 3> kNanColour = {255, 0, 255};

// The colour scale: viridis (perceptually uniform, readable in greyscale and by colour-blind
// readers), interpolated from a table sampled at 0, 0.1, ..., 1. Values are clamped to [0, 1]
// (+inf is drawn as 1, -inf as 0); NaN gives kNanColour.
std::array<uint8_t, 3> colormap(float value);

struct HeatmapOptions {
  std::vector<std::string> query_tokens;  // row labels; empty or exactly L
  std::vector<std::string> key_tokens;    // column labels; empty or exactly S
  std::vector<std::string> panel_titles;  // empty or exactly H; default "head i" for 3-D weights
                                          // and no panel title for 2-D weights
  int cell_size = 0;                      // pixels per cell, 1..256; 0 = automatic (see below)
  std::string title;                      // optional line above everything
};
// Labels are printable ASCII: other characters are drawn as '?' (one per UTF-8 character);
// tokens longer than 16 characters and panel titles longer than 32 are cut and end in "..".
// Automatic cell size: about 240 pixels per panel side, 1..32 pixels per cell; with tokens,
// at least 17 (room for full-size labels) up to 40 tokens and at least 9 (small labels) up to
// 128. When cells are smaller than the labels, only every k-th row and column is labelled.

// An RGB picture: row-major, 3 bytes per pixel, no padding.
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Where everything goes. Depends only on the weights' shape and the options, never on the
// values, so pictures of same-shaped weights line up. In pixels, with t = 2 when the cell size
// is at least 17 and 1 otherwise, and text of n characters (6n - 1)·s long at scale s:
//   panel:   the grid, S·cell wide and L·cell high; to its left the query tokens (longest at
//            scale t, + 4); above it the panel title (22 high, when there are titles) and the
//            key tokens (longest at scale t, + 4); at least as wide as its title at scale 2.
//   picture: a 16 margin all round; a 32-high title line when there is a title; min(H, 4)
//            panels per row, 24 apart; 24 further right the colour-bar column, 57 wide, its bar
//            spanning the grids (at least 96 high) with 32 below it for the NaN key.
struct HeatmapLayout {
  struct Point {
    int x = 0, y = 0;
  };
  int width = 0, height = 0;
  int cell_size = 0;         // the one chosen when options.cell_size is 0
  int columns = 0, rows = 0;  // panels per row, rows of panels
  // Top-left pixel of each panel's cell grid: weight (h, i, j) fills the cell_size square at
  // grids[h].x + j * cell_size, grids[h].y + i * cell_size.
  std::vector<Point> grids;
};

// Validates `weights_shape` ((L, S) or (H, L, S), no empty dimension) and `options`, and lays
// the picture out; throws mha::Error naming the argument, e.g. when the picture would exceed
// kMaxImageSide.
HeatmapLayout heatmap_layout(const Shape& weights_shape, const HeatmapOptions& options = {});

struct Heatmap {
  Image image;
  HeatmapLayout layout;
  int64_t nan_count = 0;  // weights drawn in kNanColour (a "NaN" key appears under the colour bar)
};

// Draws `weights` ((L, S) one panel, or (H, L, S) one panel per head) in memory.
Heatmap render_attention_heatmap(const Tensor<float>& weights, const HeatmapOptions& options = {});

// Renders and writes a PNG to `path` atomically (see write_png). Returns the NaN count so
// callers can warn about it.
int64_t write_attention_heatmap(const std::string& path, const Tensor<float>& weights,
                                const HeatmapOptions& options = {});

// Writes `image` as an 8-bit RGB PNG. Atomic: writes `path` + a unique suffix, then renames it
// over `path`; on any error (including one inside libpng) throws mha::Error and leaves no file.
void write_png(const std::string& path, const Image& image);

// Reads any PNG as 8-bit RGB (alpha composited onto white, 16-bit reduced to 8), at most
// kMaxImageSide on a side; throws mha::Error naming the file and libpng's message.
Image read_png(const std::string& path);

}  // namespace mha::viz
