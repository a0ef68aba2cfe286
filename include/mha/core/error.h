#pragma once
// mha::Error: the one exception type mha throws for bad input. Messages name the argument,
// what was expected and what was received, e.g.
//   "query: expected a 3-D tensor (L, N, E) or 2-D (L, E), got shape [4]".
// A message often quotes text from outside (a tensor name from a file, a path, a flag, another
// library's message), so every message goes through escape() as it is made: what() is valid
// UTF-8 with no control character but the line break, whatever the message quoted. check()'s
// string parts (text from outside: names, paths) are escaped whole, line breaks included, so that
// a name's "a\nb" is not shown as the message's own line break (or, on one line, as "a b"); its
// literal parts keep theirs.
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "mha/core/escape.h"

namespace mha {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(escape(message, /*keep_newlines=*/true)) {}
};

namespace detail {
template <class Part>
void append(std::ostringstream& out, const Part& part) {
  if constexpr (std::is_same_v<Part, std::string> || std::is_same_v<Part, std::string_view>) {
    out << escape(part);
  } else if constexpr (std::is_same_v<Part, std::vector<int64_t>>) {  // a Shape: "[2, 3, 4]"
    out << '[';
    for (size_t i = 0; i < part.size(); ++i) out << (i ? ", " : "") << part[i];
    out << ']';
  } else {
    out << part;
  }
}
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (append(out, parts), ...);
  return out.str();
}
}  // namespace detail

// check(condition, "argument", ": expected ", x, ", got ", y) throws mha::Error with the
// concatenated message when condition is false. The parts are only formatted on failure, so
// pass shapes (std::vector<int64_t>, printed "[2, 3, 4]") as they are, not to_string'ed: a
// check on a hot path then costs a comparison.
template <class... Parts>
void check(bool condition, const Parts&... parts) {
  if (!condition) throw Error(detail::concat(parts...));
}

}  // namespace mha
