#pragma once
// What every fuzz target shares: FuzzInput, which decodes the fuzzer's bytes, and finding(),
// which reports a broken property.
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

}  // namespace mha::fuzz
