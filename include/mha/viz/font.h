#pragma once
// A tiny embedded bitmap font for the labels of mha's pictures: printable ASCII (32..126),
// 5 pixels wide and 7 high plus one row for descenders, so pictures need no font files or font
// libraries at run time.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mha::viz::font {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 8;  // 7 rows, and one for the descenders of g, j, p, q, y
inline constexpr int kCapHeight = 7;    // the rows above the descenders: what to centre on
inline constexpr int kAdvance = kGlyphWidth + 1;     // one blank column between characters
inline constexpr int kLineHeight = kGlyphHeight + 1;  // one blank row between lines

// One glyph as kGlyphWidth columns; bit r of column x set means pixel (x, r) is ink, r = 0 at the top.
using Glyph = std::array<uint8_t, kGlyphWidth>;

// The glyph of `c`; characters outside printable ASCII get the glyph of '?'.
const Glyph& glyph(char c);

// `text` reduced to what the font can draw: each UTF-8 sequence or control character becomes
// one '?' (so "café" is "caf?", not "caf??"); longer than `max_chars` is cut to
// max_chars - 2 characters followed by "..".
std::string printable(std::string_view text, size_t max_chars);

// Width in pixels of `chars` characters at scale 1 (no trailing blank column).
inline constexpr int text_width(size_t chars) { return chars == 0 ? 0 : static_cast<int>(chars) * kAdvance - 1; }

}  // namespace mha::viz::font
