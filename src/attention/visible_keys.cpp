// attention::visible_keys (options.h): the one definition of which keys a query sees. Problem
// (problem.h) calls it for every row and block of a call, the backends walk the range it gives,
// the tiles mask the edges of it, and the context-parallel schemes skip the blocks it hides.
#include <algorithm>

#include "mha/attention/options.h"

namespace mha::attention {

KeyRange visible_keys(const Scoring& s, int64_t query_len, int64_t key_len, int64_t first_query, int64_t end_query) {
  // Queries past the sequence's length are padding: they see nothing.
  end_query = std::min(end_query, query_len);
  if (first_query >= end_query || key_len <= 0) return {0, 0};
  // Ranges grow with the query: the union ends where the last query's range ends.
  const int64_t last = end_query - 1;
  int64_t end = key_len;
  if (s.causal == Causal::top_left) end = last + 1;
  if (s.causal == Causal::bottom_right) end = last + 1 + (key_len - query_len);
  return {0, std::clamp<int64_t>(end, 0, key_len)};
}

}  // namespace mha::attention
