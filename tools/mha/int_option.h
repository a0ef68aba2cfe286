#pragma once
// Bounds for integer flags with a plain message: "--batch-size: expected an integer >= 1, got 0".
// CLI11's PositiveNumber names its upper end, the largest double, written out in full (309
// digits), and being a double range it lets "2.5" through to a conversion error instead.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace mha::tools {

// Accepts an integer in [min, max]; with max left out, any integer >= min.
inline CLI::Validator integer_bounds(int64_t min, int64_t max = std::numeric_limits<int64_t>::max()) {
  const bool bounded = max != std::numeric_limits<int64_t>::max();
  const std::string expected = bounded ? "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]"
                                       : "an integer >= " + std::to_string(min);
  return CLI::Validator(
      [min, max, expected](std::string& input) {
        int64_t value = 0;
        const bool ok = CLI::detail::lexical_cast(input, value) && value >= min && value <= max;
        return ok ? std::string() : "expected " + expected + ", got " + input;
      },
      bounded ? "in [" + std::to_string(min) + ", " + std::to_string(max) + "]" : ">= " + std::to_string(min));
}

}  // namespace mha::tools
