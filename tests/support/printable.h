#pragma once
// Whether text is safe to print, judged by a UTF-8 reader of the tests' own, independent of
// mha::escape (which reads with utf8proc): the tests of escape() and of every message that
// quotes untrusted text check their output with it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace mha::testing {

// The well-formed byte sequences of the Unicode Standard (chapter 3, table 3-7), one row per
// range of first bytes with the range the second byte must lie in. Everything outside the table
// (overlong forms, surrogates, > U+10FFFF, stray continuation bytes, truncated sequences, 0xC0,
// 0xC1, 0xF5..0xFF) is ill-formed.
struct WellFormedRow {
  unsigned first_lo, first_hi;
  int length;
  unsigned second_lo, second_hi;  // the other continuation bytes are 0x80..0xBF
};
inline constexpr WellFormedRow kWellFormed[] = {
    {0x00, 0x7F, 1, 0, 0},       {0xC2, 0xDF, 2, 0x80, 0xBF}, {0xE0, 0xE0, 3, 0xA0, 0xBF},
    {0xE1, 0xEC, 3, 0x80, 0xBF}, {0xED, 0xED, 3, 0x80, 0x9F}, {0xEE, 0xEF, 3, 0x80, 0xBF},
    {0xF0, 0xF0, 4, 0x90, 0xBF}, {0xF1, 0xF3, 4, 0x80, 0xBF}, {0xF4, 0xF4, 4, 0x80, 0x8F},
};

// The code points of `text`, or nothing when it is not well-formed UTF-8.
inline std::optional<std::vector<char32_t>> code_points(const std::string& text) {
  std::vector<char32_t> out;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  for (size_t i = 0; i < text.size();) {
    const WellFormedRow* row = nullptr;
    for (const WellFormedRow& r : kWellFormed)
      if (byte(i) >= r.first_lo && byte(i) <= r.first_hi) row = &r;
    if (row == nullptr || i + static_cast<size_t>(row->length) > text.size()) return std::nullopt;
    if (row->length == 1) {
      out.push_back(byte(i++));
      continue;
    }
    if (byte(i + 1) < row->second_lo || byte(i + 1) > row->second_hi) return std::nullopt;
    for (size_t k = 2; k < static_cast<size_t>(row->length); ++k)
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return std::nullopt;
    // The payload bits: 11, 16 or 21 of them.
    char32_t c = byte(i) & (0xFFu >> (row->length + 1));
    for (size_t k = 1; k < static_cast<size_t>(row->length); ++k) c = (c << 6) | (byte(i + k) & 0x3Fu);
    out.push_back(c);
    i += static_cast<size_t>(row->length);
  }
  return out;
}

// What escape() promises never to leave in its output: C0 controls (but the line break with
// keep_newlines), DEL, C1 controls, the line and paragraph separators, and the characters that
// reorder text (ALM, LRM, RLM, LRE..RLO, LRI..PDI).
inline bool acts_on_terminal(char32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0x2028 || c == 0x2029 || c == 0x061C || c == 0x200E ||
         c == 0x200F || (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

// `text` is well-formed UTF-8 with nothing a terminal acts on (line breaks allowed if asked).
inline bool printable(const std::string& text, bool newlines_allowed) {
  const auto points = code_points(text);
  if (!points) return false;
  for (char32_t c : *points)
    if (acts_on_terminal(c) && !(newlines_allowed && c == '\n')) return false;
  return true;
}

// `text` for a failure message, whatever it holds: printable ASCII as it is, every other byte
// as <XX> (so a test that fails on raw escape sequences does not send them to the terminal).
inline std::string shown(const std::string& text) {
  std::string out;
  char hex[8];
  for (const unsigned char b : text) {
    if (b >= 0x20 && b < 0x7F) {
      out += static_cast<char>(b);
    } else {
      std::snprintf(hex, sizeof hex, "<%02X>", b);
      out += hex;
    }
  }
  return out;
}

// For EXPECT_TRUE: printable(text, newlines_allowed), showing the bytes of text that is not.
inline ::testing::AssertionResult is_printable(const std::string& text, bool newlines_allowed = true) {
  if (printable(text, newlines_allowed)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "not printable (raw control or invalid UTF-8 bytes): " << shown(text);
}

// For EXPECT_TRUE: `text` is printable (line breaks allowed) and holds `part`.
inline ::testing::AssertionResult printable_and_holds(const std::string& text, const std::string& part) {
  if (!printable(text, true))
    return ::testing::AssertionFailure()
           << "not printable (raw control or invalid UTF-8 bytes): " << shown(text);
  if (text.find(part) == std::string::npos)
    return ::testing::AssertionFailure()
           << "\"" << shown(text) << "\" does not hold \"" << shown(part) << "\"";
  return ::testing::AssertionSuccess();
}

}  // namespace mha::testing
