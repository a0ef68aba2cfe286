// mha::escape, the one function that makes untrusted text safe to print: hand-derived cases for
// each kind of byte a terminal acts on or that is not UTF-8, the text it must leave alone, and
// sweeps (every 1- and 2-byte string, every code point, random byte strings) checked by the tests'
// own UTF-8 reader (tests/support/printable.h), independent of escape's (utf8proc).
#include "mha/core/escape.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../support/printable.h"
#include "mha/core/error.h"

namespace mha {
namespace {

using testing::acts_on_terminal;
using testing::code_points;
using testing::printable;
using testing::shown;

std::string encode(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

std::string bytes(std::initializer_list<unsigned> values) {
  std::string out;
  for (unsigned v : values) out += static_cast<char>(v);
  return out;
}

// The reader itself, on text whose status is known: a check that cannot fail proves nothing.
TEST(EscapeTestReader, TellsWellFormedFromIllFormed) {
  EXPECT_TRUE(code_points("").has_value());
  EXPECT_EQ(*code_points("caf\xc3\xa9"), (std::vector<char32_t>{'c', 'a', 'f', 0xE9}));
  EXPECT_EQ(*code_points(bytes({0xF0, 0x9F, 0x91, 0xA9})), (std::vector<char32_t>{0x1F469}));
  EXPECT_EQ(*code_points(bytes({0xF4, 0x8F, 0xBF, 0xBF})), (std::vector<char32_t>{0x10FFFF}));
  EXPECT_EQ(*code_points(bytes({0xED, 0x9F, 0xBF})), (std::vector<char32_t>{0xD7FF}));
  for (const std::string& bad :
       {bytes({0xFF}), bytes({0xC0, 0x80}), bytes({0xC1, 0xBF}), bytes({0xE0, 0x9F, 0xBF}),
        bytes({0xED, 0xA0, 0x80}), bytes({0xF0, 0x8F, 0xBF, 0xBF}), bytes({0xF4, 0x90, 0x80, 0x80}),
        bytes({0xE2, 0x82}), bytes({0x80}), bytes({0xE2, 0x28, 0xA1})})
    EXPECT_FALSE(code_points(bad).has_value()) << shown(bad);
  EXPECT_TRUE(printable("a\nb", true));
  EXPECT_FALSE(printable("a\nb", false));
  EXPECT_FALSE(printable("\x7f", true));
  EXPECT_FALSE(printable(bytes({0xC2, 0x9B}), true));
  EXPECT_FALSE(printable(bytes({0xE2, 0x80, 0xAE}), true));
  EXPECT_TRUE(printable(bytes({0xC2, 0xA0}), false));  // NBSP, the first character after C1
}

// --- Hand-derived cases --------------------------------------------------------------------

struct Case {
  const char* what;
  std::string input;
  std::string expected;  // with keep_newlines = false
};

std::vector<Case> cases() {
  std::vector<Case> out = {
      // Terminal escape sequences: the ESC and the BEL shown, the rest is printable text.
      {"CSI clear screen", "\x1b[2J", "\\x1b[2J"},
      {"OSC retitle", "\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"},
      {"SGR inside a name", "name\x1b[31mred\x1b[0m", "name\\x1b[31mred\\x1b[0m"},
      {"DEL", "a\x7f", "a\\x7f"},
      // C1 controls, U+0080..U+009F, each two bytes in UTF-8; 8-bit CSI is U+009B.
      {"C1 CSI (U+009B)", bytes({0xC2, 0x9B}) + "2J", "\\u009b2J"},
      {"C1 first (U+0080)", bytes({0xC2, 0x80}), "\\u0080"},
      {"C1 NEL (U+0085)", bytes({0xC2, 0x85}), "\\u0085"},
      {"C1 OSC (U+009D)", bytes({0xC2, 0x9D}), "\\u009d"},
      {"C1 last (U+009F)", bytes({0xC2, 0x9F}), "\\u009f"},
      // Characters that reorder or break the displayed line.
      {"RLO (U+202E)", "ab" + bytes({0xE2, 0x80, 0xAE}) + "cd", "ab\\u202ecd"},
      {"LRE (U+202A)", bytes({0xE2, 0x80, 0xAA}), "\\u202a"},
      {"LRI (U+2066)", bytes({0xE2, 0x81, 0xA6}), "\\u2066"},
      {"PDI (U+2069)", bytes({0xE2, 0x81, 0xA9}), "\\u2069"},
      {"RLM (U+200F)", bytes({0xE2, 0x80, 0x8F}), "\\u200f"},
      {"ALM (U+061C)", bytes({0xD8, 0x9C}), "\\u061c"},
      {"line separator (U+2028)", "a" + bytes({0xE2, 0x80, 0xA8}) + "b", "a\\u2028b"},
      {"paragraph separator (U+2029)", bytes({0xE2, 0x80, 0xA9}), "\\u2029"},
      // Not UTF-8: each byte of the broken sequence shown, reading resumes at the next byte.
      {"lone 0xFF", "a" + bytes({0xFF}) + "z", "a\\xffz"},
      {"0xFE", bytes({0xFE}), "\\xfe"},
      {"overlong NUL (C0 80)", bytes({0xC0, 0x80}), "\\xc0\\x80"},
      {"overlong '/' (C1 AF)", bytes({0xC1, 0xAF}), "\\xc1\\xaf"},
      {"overlong 3 bytes (E0 80 80)", bytes({0xE0, 0x80, 0x80}), "\\xe0\\x80\\x80"},
      {"overlong 4 bytes (F0 8F BF BF)", bytes({0xF0, 0x8F, 0xBF, 0xBF}), "\\xf0\\x8f\\xbf\\xbf"},
      {"surrogate (ED A0 80)", bytes({0xED, 0xA0, 0x80}), "\\xed\\xa0\\x80"},
      {"low surrogate (ED BF BF)", bytes({0xED, 0xBF, 0xBF}), "\\xed\\xbf\\xbf"},
      {"above U+10FFFF (F4 90 80 80)", bytes({0xF4, 0x90, 0x80, 0x80}), "\\xf4\\x90\\x80\\x80"},
      {"F5 lead byte", bytes({0xF5, 0x80, 0x80, 0x80}), "\\xf5\\x80\\x80\\x80"},
      {"truncated 3-byte sequence at the end", "ab" + bytes({0xE2, 0x82}), "ab\\xe2\\x82"},
      {"truncated sequence before ASCII", bytes({0xE2, 0x82}) + "z", "\\xe2\\x82z"},
      {"truncated 4-byte sequence before a valid one", bytes({0xF0, 0x9F, 0x91}) + "caf\xc3\xa9",
       "\\xf0\\x9f\\x91caf\xc3\xa9"},
      {"stray continuation byte", "a" + bytes({0x80}) + "z", "a\\x80z"},
      {"continuation byte after a complete character", "\xc3\xa9" + bytes({0xA9}), "\xc3\xa9\\xa9"},
      // Kept as they are.
      {"empty", "", ""},
      {"accented", "caf\xc3\xa9", "caf\xc3\xa9"},
      {"CJK", "\xe6\xb3\xa8\xe6\x84\x8f\xe5\x8a\x9b", "\xe6\xb3\xa8\xe6\x84\x8f\xe5\x8a\x9b"},
      {"emoji ZWJ sequence (woman technologist)",
       bytes({0xF0, 0x9F, 0x91, 0xA9, 0xE2, 0x80, 0x8D, 0xF0, 0x9F, 0x92, 0xBB}),
       bytes({0xF0, 0x9F, 0x91, 0xA9, 0xE2, 0x80, 0x8D, 0xF0, 0x9F, 0x92, 0xBB})},
      {"NBSP (U+00A0, just after C1)", bytes({0xC2, 0xA0}), bytes({0xC2, 0xA0})},
      {"U+10FFFF", bytes({0xF4, 0x8F, 0xBF, 0xBF}), bytes({0xF4, 0x8F, 0xBF, 0xBF})},
      {"backslashes", "C:\\dir\\x1b\\u202e\\", "C:\\dir\\x1b\\u202e\\"},
  };
  // Every printable ASCII character, in one string.
  std::string ascii;
  for (char c = 0x20; c < 0x7F; ++c) ascii += c;
  out.push_back({"printable ASCII", ascii, ascii});
  // Every C0 control, one case each.
  const char* const c0[32] = {"\\x00", "\\x01", "\\x02", "\\x03", "\\x04", "\\x05", "\\x06", "\\x07",
                              "\\x08", "\\t",   "\\n",   "\\x0b", "\\x0c", "\\r",   "\\x0e", "\\x0f",
                              "\\x10", "\\x11", "\\x12", "\\x13", "\\x14", "\\x15", "\\x16", "\\x17",
                              "\\x18", "\\x19", "\\x1a", "\\x1b", "\\x1c", "\\x1d", "\\x1e", "\\x1f"};
  for (int c = 0; c < 32; ++c)
    out.push_back({c0[c], "<" + std::string(1, static_cast<char>(c)) + ">", std::string("<") + c0[c] + ">"});
  return out;
}

TEST(Escape, HandDerivedCases) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(escape(c.input), c.expected);
    EXPECT_TRUE(printable(escape(c.input), false)) << shown(escape(c.input));
  }
}

TEST(Escape, IsIdempotent) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    for (const bool keep : {false, true})
      EXPECT_EQ(escape(escape(c.input, keep), keep), escape(c.input, keep));
  }
}

TEST(Escape, KeepNewlinesKeepsOnlyTheLineBreak) {
  EXPECT_EQ(escape("a\nb"), "a\\nb");
  EXPECT_EQ(escape("a\nb", true), "a\nb");
  EXPECT_EQ(escape("a\r\n\tb\x1b", true), "a\\r\n\\tb\\x1b");
  EXPECT_EQ(escape("\n\n", true), "\n\n");
  // Every other case escapes exactly as without keep_newlines.
  for (const Case& c : cases()) {
    if (c.input.find('\n') == std::string::npos) {
      EXPECT_EQ(escape(c.input, true), c.expected) << c.what;
    }
  }
}

// --- Sweeps --------------------------------------------------------------------------------

// The properties every input must have: the output is printable; escaping again changes nothing;
// and input that is already printable comes back unchanged.
void expect_safe(const std::string& input) {
  for (const bool keep : {false, true}) {
    const std::string out = escape(input, keep);
    if (!printable(out, keep)) {
      ADD_FAILURE() << "escape(" << shown(input) << ", " << keep << ") = " << shown(out)
                    << " is not printable";
      return;
    }
    if (escape(out, keep) != out) ADD_FAILURE() << "escape is not idempotent on " << shown(input);
    if (printable(input, keep) && out != input) ADD_FAILURE() << "printable input changed: " << shown(input);
  }
}

TEST(Escape, EveryOneAndTwoByteString) {
  for (unsigned a = 0; a < 256; ++a) {
    expect_safe(bytes({a}));
    for (unsigned b = 0; b < 256; ++b) expect_safe(bytes({a, b}));
  }
}

// Every code point, alone: kept when printable, otherwise the escape for it; every surrogate,
// encoded as if it were one, shown byte by byte.
TEST(Escape, EveryCodePoint) {
  char hex[16];
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    const std::string text = encode(c);
    std::string expected;
    if (c >= 0xD800 && c <= 0xDFFF) {
      for (unsigned char b : text) {
        std::snprintf(hex, sizeof hex, "\\x%02x", b);
        expected += hex;
      }
    } else if (c == '\n' || c == '\r' || c == '\t') {
      expected = c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned>(c));
      expected = hex;
    } else if (acts_on_terminal(c)) {
      std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(c));
      expected = hex;
    } else {
      expected = text;
    }
    const std::string got = escape(text);
    if (got != expected) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<unsigned>(c) << ": got " << shown(got) << ", expected "
                    << shown(expected);
      return;
    }
  }
}

// Random byte strings from a fixed seed, drawn so that broken sequences, controls and valid
// multi-byte characters all occur often.
TEST(Escape, RandomByteStrings) {
  std::mt19937_64 rng(20240613);
  // Pieces to splice in: ASCII, a backslash, a line break, ESC, BEL, DEL, C1 CSI, RLO, the line
  // separator, a valid word, an emoji and a ZWJ.
  const std::string c1_csi = bytes({0xC2, 0x9B}), rlo = bytes({0xE2, 0x80, 0xAE}),
                    line = bytes({0xE2, 0x80, 0xA8}), emoji = bytes({0xF0, 0x9F, 0x91, 0xA9}),
                    zwj = bytes({0xE2, 0x80, 0x8D});
  const std::vector<std::string> pieces = {"a",    "\\", "\n", "\x1b[",       "\x07", "\x7f",
                                           c1_csi, rlo,  line, "caf\xc3\xa9", emoji,  zwj};
  for (int n = 0; n < 20000; ++n) {
    std::string text;
    const int length = static_cast<int>(rng() % 24);
    for (int i = 0; i < length; ++i) {
      if (rng() % 3 == 0) {
        text += pieces[rng() % pieces.size()];
      } else {
        const unsigned kind = static_cast<unsigned>(rng() % 4);  // ASCII, continuation, lead byte, anything
        const unsigned b = static_cast<unsigned>(rng());
        text += static_cast<char>(kind == 0   ? b % 0x80
                                  : kind == 1 ? 0x80 | (b % 0x40)
                                  : kind == 2 ? 0xC0 | (b % 0x40)
                                              : b % 256);
      }
    }
    expect_safe(text);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "on case " << n << ": " << shown(text);
      return;
    }
  }
}

// --- mha::Error ------------------------------------------------------------------------------

TEST(Escape, ErrorMessagesAreEscapedWithTheirLineBreaks) {
  EXPECT_STREQ(Error("a\x1b[2Jb").what(), "a\\x1b[2Jb");
  EXPECT_STREQ(Error("name '" + bytes({0xFF}) + "'\n  second line\x07").what(),
               "name '\\xff'\n  second line\\x07");
  try {
    check(false, "tensor '", "\x1b]0;x\x07", "': expected F32, got ", bytes({0xC2, 0x9B}));
    ADD_FAILURE() << "check(false, ...) did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tensor '\\x1b]0;x\\x07': expected F32, got \\u009b");
  }
}

}  // namespace
}  // namespace mha
