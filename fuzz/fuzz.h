#pragma once
// What every fuzz target shares: FuzzInput, which decodes the fuzzer's bytes; finding(), which
// reports a broken property; and check_printable_message(), the property of every mha::Error
// message a target catches.
//
// FuzzInput: the fuzzer's bytes read front to back as the values that describe one case. Once the bytes
// run out every read returns 0, so every input, the empty one included, is a valid case, and a
// seed written for an older version of a target still decodes (into some other case).
//
// Encoding (fuzz/make_seeds.py writes seeds with the same rules):
//   byte()            one byte
//   flag()            one byte, its lowest bit
//   in_range(lo, hi)  one byte (hi − lo < 256), else two bytes little-endian (< 65536), else
//                     eight; then lo + value % (hi − lo + 1)
//   pick(list)        list[in_range(0, size − 1)]
//   u64()             eight bytes little-endian
//   text(max)         a length in_range(0, max), then that many bytes
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

namespace mha::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  bool flag() { return (byte() & 1) != 0; }

  uint64_t u64() {
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value |= uint64_t{byte()} << (8 * i);
    return value;
  }

  int64_t in_range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);  // hi >= lo
    uint64_t raw = 0;
    if (span < 256) {
      raw = byte();
    } else if (span < 65536) {
      raw = byte();
      raw |= uint64_t{byte()} << 8;
    } else {
      raw = u64();
    }
    const uint64_t offset = span == UINT64_MAX ? raw : raw % (span + 1);
    return static_cast<int64_t>(static_cast<uint64_t>(lo) + offset);
  }

  template <class T>
  T pick(std::initializer_list<T> choices) {
    const auto i = static_cast<size_t>(in_range(0, static_cast<int64_t>(choices.size()) - 1));
    return choices.begin()[i];
  }

  std::string text(size_t max_length) {
    const auto length = static_cast<size_t>(in_range(0, static_cast<int64_t>(max_length)));
    std::string out;
    for (size_t i = 0; i < length; ++i) out.push_back(static_cast<char>(byte()));
    return out;
  }

  size_t remaining() const { return size_ - at_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// A property the target checks does not hold: print why and abort, which libFuzzer reports as a
// crash (saving the input) and the replay driver as a failed test.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// The code points of `text`, each given to visit(); false (having stopped) when `text` is not
// valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF). Written here,
// apart from mha::escape (which reads with utf8proc), so that the two are a check on each other.
template <class Visit>
bool for_each_code_point(const std::string& text, Visit visit) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t length = 0;
    uint32_t code = 0, min = 0;
    if (c < 0x80) {
      visit(uint32_t{c});
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      length = 2, code = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3, code = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4, code = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + length > n) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      code = (code << 6) | (s[i + k] & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    visit(code);
    i += length;
  }
  return true;
}

inline bool valid_utf8(const std::string& text) {
  return for_each_code_point(text, [](uint32_t) {});
}

// `text` as hex bytes ("1b 5b 32 4a"), for a report that must not print it raw.
inline std::string hex(const std::string& text) {
  std::string out;
  char buffer[4];
  for (unsigned char c : text) {
    std::snprintf(buffer, sizeof buffer, "%02x", c);
    out += out.empty() ? "" : " ";
    out += buffer;
  }
  return out.empty() ? "(empty)" : out;
}

// Every mha::Error message is escaped as it is made (mha/core/error.h), whatever it quotes from
// the input: valid UTF-8, and no character a terminal acts on but the line break: no other C0
// control, no DEL, no C1 control (U+0080..U+009F), no line or paragraph separator, no
// bidirectional override or isolate.
inline void check_printable_message(const char* message) {
  const std::string text = message;
  bool acts_on_terminal = false;
  const bool valid = for_each_code_point(text, [&](uint32_t c) {
    acts_on_terminal = acts_on_terminal || (c < 0x20 && c != '\n') || (c >= 0x7F && c <= 0x9F) ||
                       c == 0x2028 || c == 0x2029 || c == 0x061C || c == 0x200E || c == 0x200F ||
                       (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
  });
  if (!valid) finding("an mha::Error message is not valid UTF-8: bytes " + hex(text));
  if (acts_on_terminal)
    finding("an mha::Error message holds a control or bidi character: bytes " + hex(text));
}

}  // namespace mha::fuzz
