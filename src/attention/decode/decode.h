#pragma once
// The decode backend: attention for few query rows against many keys (token-by-token generation
// against a KV cache), where the work is reading the keys and values once: flash-decoding.
//
//   rows     the G = Hq/Hkv query heads of a GQA group × the L queries, R = G·L rows, go together,
//            so each key and value is read once for all the query heads that share it;
//   chunks   the keys a (b, kv head) pair's rows can see are cut into chunks of a fixed number of
//            keys (chunk_keys(R), a function of the shape only); a task is one (b, kv head, chunk):
//            it reads its keys in place (float) or converts them block by block to float
//            (bfloat16, float16), and keeps a partial (max m, sum l, unnormalised output o) per row;
//   merge    per row, the chunks' partials in chunk order: M = max m_c, l = Σ e^(m_c − M)·l_c,
//            O = Σ e^(m_c − M)·o_c / l, logsumexp = M + log l, in double.
// Chunk boundaries and the merge order do not depend on the number of threads, so the results
// are bitwise the same for any thread count. Every option holds: masks, both causal alignments,
// scale, dropout (the same Philox mask as every backend), GQA; weights are cpu_flash's business
// (sdpa_forward routes need_weights there).
#include "../problem.h"

namespace mha::attention::detail {

// The largest number of query rows (per head) the automatic choice sends to the decode backend;
// past it cpu_flash's tiles of 96 query rows are the better use of the keys read.
constexpr int64_t kDecodeRows = 16;

// T (queries, outputs, masks): float, bfloat16 or float16; Kv: float, T's own type
// (mha/core/half.h), or int8 with a float T (a scale per row: ForwardArgs). Computed in float; keys
// and values may be paged (Rows::pages: a block of keys ends where its page does).
template <class T, class Kv>
void decode_forward(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T, Kv>& a);

}  // namespace mha::attention::detail
