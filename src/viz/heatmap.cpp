// Attention heatmaps: layout (from shape and options only) and drawing into an RGB image.
#include "mha/viz/heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mha/core/error.h"
#include "mha/viz/font.h"
#include "canvas.h"

namespace mha::viz {
namespace {

using detail::Canvas;
using detail::Colour;

// Layout, in pixels. Text is the 5×8 bitmap font scaled up: kTextScale gives 10×16-pixel characters.
constexpr int kMargin = 16;     // around the picture
constexpr int kGap = 24;        // between panels, and between the panels and the colour bar
constexpr int kLabelGap = 4;    // between a label and what it labels
constexpr int kTextScale = 2;   // panel titles and colour-bar labels
constexpr int kTitleScale = 3;  // the picture's title
constexpr int kPanelsPerRow = 4;
constexpr int kMaxCellSize = 256;
constexpr int kAutoPanelSide = 240;  // automatic cell size aims at panels about this wide
constexpr int kMaxAutoCell = 32;
constexpr size_t kMaxTokenChars = 16, kMaxPanelTitleChars = 32;
constexpr int kBarWidth = 16, kMinBarHeight = 96, kTick = 3;
constexpr int kTextHeight = font::kGlyphHeight * kTextScale;
// The "0" label hangs about half a line below the bar; the NaN key sits under it.
constexpr int kLegendTop = kTextHeight / 2 + 2 * kLabelGap;
constexpr int kLegendHeight = kLegendTop + kTextHeight;
constexpr int kBarColumnWidth = kBarWidth + kTick + kLabelGap + font::text_width(3) * kTextScale;  // "0.5", "NaN"

constexpr Colour kBackground = {255, 255, 255}, kInk = {33, 33, 33}, kFrame = {150, 150, 150};

// matplotlib's viridis (CC0, by Smith, van der Walt and Firing) at 0, 0.1, ..., 1 in 8-bit RGB.
constexpr std::array<Colour, 11> kViridis = {{{68, 1, 84},
                                              {72, 36, 117},
                                              {65, 68, 135},
                                              {53, 95, 141},
                                              {42, 120, 142},
                                              {33, 145, 140},
                                              {34, 168, 132},
                                              {68, 191, 112},
                                              {122, 209, 81},
                                              {189, 223, 38},
                                              {253, 231, 37}}};

// Everything drawing needs, decided from the shape and options alone.
struct Plan {
  HeatmapLayout layout;
  int64_t heads = 0, rows = 0, cols = 0;  // H, L, S
  int token_scale = 1;                    // label characters are the font's pixels times this
  int label_stride = 1;                   // label every k-th row/column when cells are small
  std::vector<std::string> query_labels, key_labels, panel_titles;
  std::string title;
  int header = 0;  // from the top of a panel (its title) to the top of its grid
  int bar_x = 0, bar_y = 0, bar_height = 0;
};

int max_width(const std::vector<std::string>& labels, int scale) {
  size_t chars = 0;
  for (const auto& label : labels) chars = std::max(chars, label.size());
  return font::text_width(chars) * scale;
}

std::vector<std::string> printable_all(const std::vector<std::string>& texts, size_t max_chars) {
  std::vector<std::string> out;
  out.reserve(texts.size());
  for (const auto& text : texts) out.push_back(font::printable(text, max_chars));
  return out;
}

void check_count(const std::vector<std::string>& given, int64_t expected, const char* argument, const char* what,
                 const Shape& shape) {
  check(given.empty() || static_cast<int64_t>(given.size()) == expected, argument, ": expected ", expected, " (",
        what, " of weights ", to_string(shape), ") or none, got ", given.size());
}

// Cells at least this big fit a row label of full-size (kTextScale) or small (scale 1) characters.
constexpr int kFullSizeLabelCell = font::kGlyphHeight * kTextScale + 1;
constexpr int kSmallLabelCell = font::kGlyphHeight + 1;

int automatic_cell_size(int64_t rows, int64_t cols, bool has_tokens) {
  const int64_t n = std::max(rows, cols);
  int64_t cell = std::clamp<int64_t>(kAutoPanelSide / n, 1, kMaxAutoCell);
  // With labels, readable labels matter more than the panel size, up to a point.
  if (has_tokens && n <= 40) cell = std::max<int64_t>(cell, kFullSizeLabelCell);
  if (has_tokens && n <= 128) cell = std::max<int64_t>(cell, kSmallLabelCell);
  return static_cast<int>(cell);
}

Plan make_plan(const Shape& shape, const HeatmapOptions& options) {
  check(shape.size() == 2 || shape.size() == 3,
        "weights: expected a 2-D (L, S) or 3-D (H, L, S) tensor, got shape ", to_string(shape));
  for (const int64_t d : shape) check(d >= 1, "weights: expected no empty dimension, got shape ", to_string(shape));
  Plan plan;
  plan.heads = shape.size() == 3 ? shape[0] : 1;
  plan.rows = shape[shape.size() - 2];
  plan.cols = shape[shape.size() - 1];
  // Every cell is at least one pixel: this bounds all the arithmetic below.
  check(plan.heads <= kMaxImageSide && plan.rows <= kMaxImageSide && plan.cols <= kMaxImageSide, "weights: shape ",
        to_string(shape), " cannot fit in the largest picture, ", kMaxImageSide, " x ", kMaxImageSide, " pixels");
  check_count(options.query_tokens, plan.rows, "query_tokens", "L, the rows", shape);
  check_count(options.key_tokens, plan.cols, "key_tokens", "S, the columns", shape);
  check_count(options.panel_titles, plan.heads, "panel_titles", "H, the heads", shape);
  check(options.cell_size >= 0 && options.cell_size <= kMaxCellSize, "cell_size: expected 0 (automatic) or 1..",
        kMaxCellSize, " pixels, got ", options.cell_size);

  const bool has_tokens = !options.query_tokens.empty() || !options.key_tokens.empty();
  const int cell = options.cell_size ? options.cell_size : automatic_cell_size(plan.rows, plan.cols, has_tokens);
  plan.token_scale = cell >= kFullSizeLabelCell ? kTextScale : 1;
  const int label_pitch = font::kGlyphHeight * plan.token_scale + 1;
  plan.label_stride = (label_pitch + cell - 1) / cell;

  plan.query_labels = printable_all(options.query_tokens, kMaxTokenChars);
  plan.key_labels = printable_all(options.key_tokens, kMaxTokenChars);
  if (!options.panel_titles.empty()) {
    plan.panel_titles = printable_all(options.panel_titles, kMaxPanelTitleChars);
  } else if (shape.size() == 3) {
    for (int64_t h = 0; h < plan.heads; ++h) plan.panel_titles.push_back("head " + std::to_string(h));
  }

  // Panel: [query labels | cell grid], with the panel title and the key labels above the grid.
  const int64_t query_label_width =
      plan.query_labels.empty() ? 0 : max_width(plan.query_labels, plan.token_scale) + kLabelGap;
  const int64_t key_label_height =
      plan.key_labels.empty() ? 0 : max_width(plan.key_labels, plan.token_scale) + kLabelGap;
  const int64_t panel_title_height = plan.panel_titles.empty() ? 0 : font::kLineHeight * kTextScale + kLabelGap;
  const int64_t grid_width = plan.cols * cell, grid_height = plan.rows * cell;
  const int64_t panel_width = query_label_width + std::max<int64_t>(grid_width, max_width(plan.panel_titles, kTextScale));
  const int64_t header = panel_title_height + key_label_height;
  const int64_t panel_height = header + grid_height;

  const int64_t columns = std::min<int64_t>(plan.heads, kPanelsPerRow);
  const int64_t panel_rows = (plan.heads + columns - 1) / columns;
  const int64_t panels_width = columns * panel_width + (columns - 1) * kGap;
  const int64_t panels_height = panel_rows * panel_height + (panel_rows - 1) * kGap;
  const int64_t title_height = options.title.empty() ? 0 : font::kGlyphHeight * kTitleScale + 2 * kLabelGap;
  // The colour bar runs from the top of the first row of grids to the bottom of the last.
  const int64_t bar_height = std::max<int64_t>(panels_height - header, kMinBarHeight);

  const int64_t width = 2 * kMargin + panels_width + kGap + kBarColumnWidth;
  const int64_t height =
      2 * kMargin + title_height + std::max(panels_height, header + bar_height + kLegendHeight);
  check(width <= kMaxImageSide && height <= kMaxImageSide, "heatmap: the picture of weights ", to_string(shape),
        " at cell_size ", cell, " would be ", width, " x ", height, " pixels, over the limit of ", kMaxImageSide,
        " x ", kMaxImageSide, "; use a smaller cell_size or fewer heads");

  HeatmapLayout& layout = plan.layout;
  layout.width = static_cast<int>(width);
  layout.height = static_cast<int>(height);
  layout.cell_size = cell;
  layout.columns = static_cast<int>(columns);
  layout.rows = static_cast<int>(panel_rows);
  for (int64_t h = 0; h < plan.heads; ++h) {
    const int64_t x = kMargin + (h % columns) * (panel_width + kGap) + query_label_width;
    const int64_t y = kMargin + title_height + (h / columns) * (panel_height + kGap) + header;
    layout.grids.push_back({static_cast<int>(x), static_cast<int>(y)});
  }
  plan.header = static_cast<int>(header);
  plan.bar_x = static_cast<int>(kMargin + panels_width + kGap);
  plan.bar_y = static_cast<int>(kMargin + title_height + header);
  plan.bar_height = static_cast<int>(bar_height);
  // The title is cut to the picture's width rather than widening the picture.
  const size_t title_chars = static_cast<size_t>((width - 2 * kMargin + 1) / (font::kAdvance * kTitleScale));
  plan.title = font::printable(options.title, title_chars);
  return plan;
}


void draw_panel(Canvas& canvas, const Plan& plan, int64_t head, const float* weights, int64_t& nan_count) {
  const HeatmapLayout& layout = plan.layout;
  const auto [x, y] = layout.grids[static_cast<size_t>(head)];
  const int cell = layout.cell_size;
  const int grid_width = static_cast<int>(plan.cols) * cell, grid_height = static_cast<int>(plan.rows) * cell;

  for (int64_t i = 0; i < plan.rows; ++i)
    for (int64_t j = 0; j < plan.cols; ++j) {
      const float w = weights[i * plan.cols + j];
      nan_count += std::isnan(w);
      canvas.fill(x + static_cast<int>(j) * cell, y + static_cast<int>(i) * cell, cell, cell, colormap(w));
    }
  canvas.frame(x, y, grid_width, grid_height, kFrame);

  const int scale = plan.token_scale, cap_height = font::kCapHeight * scale;
  const int64_t stride = plan.label_stride;
  for (int64_t i = 0; i < static_cast<int64_t>(plan.query_labels.size()); i += stride) {
    const std::string& label = plan.query_labels[static_cast<size_t>(i)];
    const int label_width = font::text_width(label.size()) * scale;
    canvas.text(x - kLabelGap - label_width, y + static_cast<int>(i) * cell + (cell - cap_height) / 2, label,
                scale, kInk);
  }
  for (int64_t j = 0; j < static_cast<int64_t>(plan.key_labels.size()); j += stride)
    canvas.text_up(x + static_cast<int>(j) * cell + (cell - cap_height) / 2, y - kLabelGap,
                   plan.key_labels[static_cast<size_t>(j)], scale, kInk);

  if (!plan.panel_titles.empty()) {
    // Centred over the grid; a title wider than the grid starts at its left edge (the panel
    // was made wide enough for it).
    const std::string& title = plan.panel_titles[static_cast<size_t>(head)];
    const int title_width = font::text_width(title.size()) * kTextScale;
    canvas.text(x + std::max(0, (grid_width - title_width) / 2), y - plan.header, title, kTextScale, kInk);
  }
}

void draw_colour_bar(Canvas& canvas, const Plan& plan, int64_t nan_count) {
  const int x = plan.bar_x, y = plan.bar_y, height = plan.bar_height;
  for (int row = 0; row < height; ++row)
    canvas.fill(x, y + row, kBarWidth, 1, colormap(1.0f - static_cast<float>(row) / static_cast<float>(height - 1)));
  canvas.frame(x, y, kBarWidth, height, kFrame);
  const int label_x = x + kBarWidth + kTick + kLabelGap;
  for (const auto& [label, row] : {std::pair{"1", 0}, std::pair{"0.5", (height - 1) / 2}, std::pair{"0", height - 1}}) {
    canvas.fill(x + kBarWidth, y + row, kTick, 1, kInk);
    canvas.text(label_x, y + row - font::kCapHeight * kTextScale / 2, label, kTextScale, kInk);
  }
  if (nan_count > 0) {
    const int key_y = y + height + kLegendTop;
    canvas.fill(x, key_y, kBarWidth, font::kCapHeight * kTextScale, kNanColour);
    canvas.frame(x, key_y, kBarWidth, font::kCapHeight * kTextScale, kFrame);
    canvas.text(label_x, key_y, "NaN", kTextScale, kInk);
  }
}

}  // namespace

std::array<uint8_t, 3> colormap(float value) {
  if (std::isnan(value)) return kNanColour;
  const float position = std::clamp(value, 0.0f, 1.0f) * static_cast<float>(kViridis.size() - 1);
  const size_t below = std::min(static_cast<size_t>(position), kViridis.size() - 2);
  const float fraction = position - static_cast<float>(below);
  Colour out{};
  for (size_t c = 0; c < 3; ++c) {
    const float a = kViridis[below][c], b = kViridis[below + 1][c];
    out[c] = static_cast<uint8_t>(std::lround(a + (b - a) * fraction));
  }
  return out;
}

HeatmapLayout heatmap_layout(const Shape& weights_shape, const HeatmapOptions& options) {
  return make_plan(weights_shape, options).layout;
}

Heatmap render_attention_heatmap(const Tensor<float>& weights, const HeatmapOptions& options) {
  const Plan plan = make_plan(weights.shape(), options);
  Canvas canvas(plan.layout.width, plan.layout.height);
  if (!plan.title.empty()) {
    const int title_width = font::text_width(plan.title.size()) * kTitleScale;
    canvas.text((plan.layout.width - title_width) / 2, kMargin, plan.title, kTitleScale, kInk);
  }
  int64_t nan_count = 0;
  for (int64_t h = 0; h < plan.heads; ++h)
    draw_panel(canvas, plan, h, weights.data() + h * plan.rows * plan.cols, nan_count);
  draw_colour_bar(canvas, plan, nan_count);
  return {canvas.take(), plan.layout, nan_count};
}

int64_t write_attention_heatmap(const std::string& path, const Tensor<float>& weights,
                                const HeatmapOptions& options) {
  const Heatmap heatmap = render_attention_heatmap(weights, options);
  write_png(path, heatmap.image);
  return heatmap.nan_count;
}

}  // namespace mha::viz
