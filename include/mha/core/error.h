#pragma once
// mha::Error: the one exception type mha throws for bad input. Messages name the argument,
// what was expected and what was received, e.g.
//   "query: expected a 3-D tensor (L, N, E) or 2-D (L, E), got shape [4]".
#include <sstream>
#include <stdexcept>
#include <string>

namespace mha {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// check(condition, "argument", ": expected ", x, ", got ", y) throws mha::Error with the
// concatenated message when condition is false. The parts are only formatted on failure.
template <class... Parts>
void check(bool condition, const Parts&... parts) {
  if (!condition) throw Error(detail::concat(parts...));
}

}  // namespace mha
