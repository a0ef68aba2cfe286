#pragma once
// Drawing primitives on an RGB image (white to start with); everything is clipped to the image.
// Shared by the heatmaps and the training charts.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "mha/viz/font.h"
#include "mha/viz/heatmap.h"

namespace mha::viz::detail {

using Colour = std::array<uint8_t, 3>;

class Canvas {
 public:
  Canvas(int width, int height) {
    image_.width = width;
    image_.height = height;
    image_.rgb.assign(static_cast<size_t>(width) * static_cast<size_t>(height) * 3, 255);  // white
  }

  void fill(int x, int y, int w, int h, const Colour& colour) {
    const int x0 = std::max(x, 0), x1 = std::min(x + w, image_.width);
    const int y0 = std::max(y, 0), y1 = std::min(y + h, image_.height);
    for (int row = y0; row < y1; ++row) {
      uint8_t* p = &image_.rgb[(static_cast<size_t>(row) * static_cast<size_t>(image_.width) + x0) * 3];
      for (int col = x0; col < x1; ++col, p += 3) std::copy(colour.begin(), colour.end(), p);
    }
  }

  // A one-pixel rectangle just outside the box (x, y, w, h).
  void frame(int x, int y, int w, int h, const Colour& colour) {
    fill(x - 1, y - 1, w + 2, 1, colour);
    fill(x - 1, y + h, w + 2, 1, colour);
    fill(x - 1, y, 1, h, colour);
    fill(x + w, y, 1, h, colour);
  }

  // A line `thickness` pixels wide from (x0, y0) to (x1, y1) (Bresenham, square brush).
  void line(int x0, int y0, int x1, int y1, const Colour& c, int thickness = 1) {
    const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1, dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      fill(x0 - thickness / 2, y0 - thickness / 2, thickness, thickness, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }

  // Horizontal text with its top-left corner at (x, y).
  void text(int x, int y, std::string_view s, int scale, const Colour& colour) {
    draw(s, scale, colour, [&](int along, int across) { return std::pair{x + along, y + across}; });
  }

  // Text turned a quarter turn anticlockwise, read bottom to top: it starts at y_bottom and
  // the tops of the characters face left, towards x.
  void text_up(int x, int y_bottom, std::string_view s, int scale, const Colour& colour) {
    draw(s, scale, colour, [&](int along, int across) { return std::pair{x + across, y_bottom - along - scale}; });
  }

  Image take() { return std::move(image_); }

 private:
  // place(along, across) gives the top-left pixel of the scale×scale square for font pixel
  // (along, across), measured along the line of text and across it.
  template <class Place>
  void draw(std::string_view s, int scale, const Colour& colour, Place place) {
    for (size_t k = 0; k < s.size(); ++k) {
      const font::Glyph& glyph = font::glyph(s[k]);
      for (int column = 0; column < font::kGlyphWidth; ++column)
        for (int row = 0; row < font::kGlyphHeight; ++row)
          if (glyph[static_cast<size_t>(column)] >> row & 1) {
            const auto [px, py] = place((static_cast<int>(k) * font::kAdvance + column) * scale, row * scale);
            fill(px, py, scale, scale, colour);
          }
    }
  }

  Image image_;
};

}  // namespace mha::viz::detail
