#pragma once
// Bounds for number flags with a plain message: "--batch-size: expected an integer >= 1, got 0".
// CLI11's Range and PositiveNumber are double ranges: they name their ends written out in full
// (the largest double: 309 digits), say "1.5 not in range 1 to 10" of a number in range that is
// not an integer, and its integer conversion saturates, so 99999999999999999999 passed as
// INT64_MAX. These parse the text themselves, whole and exactly.
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <system_error>

namespace mha::tools {

// The integer `input` spells in decimal (an optional sign), or nothing: not an integer, or past T.
template <class T>
std::optional<T> parse_integer(const std::string& input) {
  const char* first = input.data() + (input.size() > 1 && input[0] == '+' ? 1 : 0);
  const char* last = input.data() + input.size();
  T value{};
  const auto [end, error] = std::from_chars(first, last, value);
  if (first == last || error != std::errc() || end != last) return std::nullopt;
  return value;
}

// Accepts an integer in [min, max]; with max left out, any integer >= min.
inline CLI::Validator integer_bounds(int64_t min, int64_t max = std::numeric_limits<int64_t>::max()) {
  const bool bounded = max != std::numeric_limits<int64_t>::max();
  const std::string expected = bounded ? "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]"
                                       : "an integer >= " + std::to_string(min);
  return CLI::Validator(
      [min, max, expected](std::string& input) {
        const std::optional<int64_t> value = parse_integer<int64_t>(input);
        const bool ok = value && *value >= min && *value <= max;
        return ok ? std::string() : "expected " + expected + ", got " + input;
      },
      bounded ? "in [" + std::to_string(min) + ", " + std::to_string(max) + "]" : ">= " + std::to_string(min));
}

// Accepts an integer in [0, 2⁶⁴) (a seed): no wrap of -1, no saturation past the top.
inline CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& input) {
        return parse_integer<uint64_t>(input) ? std::string() : "expected an integer in [0, 2^64), got " + input;
      },
      "in [0, 2^64)");
}

// Accepts a finite number >= 0.
inline CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& input) {
        double value = 0;
        const bool ok = CLI::detail::lexical_cast(input, value) && std::isfinite(value) && value >= 0;
        return ok ? std::string() : "expected a finite number >= 0, got " + input;
      },
      ">= 0");
}

}  // namespace mha::tools
