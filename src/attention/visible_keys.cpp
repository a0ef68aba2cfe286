// attention::visible_keys (options.h): the one definition of which keys a query sees (causal
// alignment, sliding window, chunks, per-sequence lengths through its arguments). Problem
// (problem.h) calls it for every row and block of a call, the backends walk the range it gives,
// the tiles mask the edges of it, and the context-parallel schemes skip the blocks it hides.
#include <algorithm>

#include "mha/attention/options.h"

namespace mha::attention {

int64_t causal_diagonal(const Scoring& s, int64_t query_len, int64_t key_len) {
  return s.causal == Causal::top_left ? 0 : key_len - query_len;
}

KeyRange visible_keys(const Scoring& s, int64_t query_len, int64_t key_len, int64_t first_query, int64_t end_query) {
  // Queries past the sequence's length are padding: they see nothing.
  end_query = std::min(end_query, query_len);
  if (first_query >= end_query || key_len <= 0) return {0, 0};
  // Query i's own key is i + diagonal: top-left causality's, else the bottom-right alignment.
  const int64_t diagonal = causal_diagonal(s, query_len, key_len);
  // A window wider than the whole call is no window (and keeps the sums below in range).
  auto side = [&](int64_t w) { return w < 0 ? -1 : std::min(w, query_len + key_len); };
  // Causality is a right side of 0, whatever the window's.
  const int64_t left = side(s.window_left), right = s.causal != Causal::none ? 0 : side(s.window_right);
  const int64_t first = first_query + diagonal, last = end_query - 1 + diagonal;
  int64_t begin = left < 0 ? 0 : first - left;
  int64_t end = right < 0 ? key_len : last + right + 1;
  if (s.chunk_size > 0) {
    // The chunk of the first query's own key begins the union, that of the last one's ends it
    // (floor division: a query's own key is negative where L > S under bottom-right alignment).
    // A chunk longer than every position the call has cuts the same keys as one just longer
    // (and keeps the sums in range).
    const int64_t c = std::min(s.chunk_size, query_len + key_len + 1);
    auto chunk_start = [&](int64_t j) { return (j >= 0 ? j : j - c + 1) / c * c; };
    begin = std::max(begin, chunk_start(first));
    end = std::min(end, chunk_start(last) + c);
  }
  const int64_t b = std::clamp<int64_t>(begin, 0, key_len), e = std::clamp<int64_t>(end, 0, key_len);
  return {b, std::max(b, e)};
}

}  // namespace mha::attention
