#include "mha/core/escape.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstdio>

namespace mha {
namespace {

// Characters that reorder or break the displayed text without being controls (Unicode's Cf and
// Zl/Zp): ALM, LRM, RLM, LRE..RLO (U+202A..U+202E), LRI..PDI (U+2066..U+2069).
bool moves_text(utf8proc_int32_t c) {
  return c == 0x061C || c == 0x200E || c == 0x200F || (c >= 0x202A && c <= 0x202E) ||
         (c >= 0x2066 && c <= 0x2069);
}

void append_hex(std::string& out, const char* prefix, unsigned value, int digits) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%s%0*x", prefix, digits, value);
  out += buffer;
}

}  // namespace

std::string escape(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  const auto size = static_cast<utf8proc_ssize_t>(text.size());
  for (utf8proc_ssize_t at = 0; at < size;) {
    utf8proc_int32_t c = -1;
    const utf8proc_ssize_t length = utf8proc_iterate(bytes + at, size - at, &c);
    if (length <= 0 || c < 0) {  // not UTF-8: show the one byte, then resynchronise after it
      append_hex(out, "\\x", bytes[at], 2);
      at += 1;
      continue;
    }
    const std::string_view character = text.substr(static_cast<size_t>(at), static_cast<size_t>(length));
    at += length;
    if (c == '\n') {
      out += keep_newlines ? "\n" : "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      append_hex(out, "\\x", static_cast<unsigned>(c), 2);
    } else if (const auto category = utf8proc_category(c); category == UTF8PROC_CATEGORY_CC ||
               category == UTF8PROC_CATEGORY_ZL || category == UTF8PROC_CATEGORY_ZP || moves_text(c)) {
      append_hex(out, "\\u", static_cast<unsigned>(c), 4);
    } else {
      out += character;
    }
  }
  return out;
}

}  // namespace mha
