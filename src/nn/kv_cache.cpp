// KVCache and attend (mha/nn/kv_cache.h).
#include "mha/nn/kv_cache.h"

#include <algorithm>

#include "mha/attention/attention.h"
#include "mha/core/error.h"

namespace mha::nn {

template <class Kv>
KVCache<Kv>::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t qk_head_dim, int64_t v_head_dim) {
  check(batch >= 1, "KVCache: batch: expected >= 1, got ", batch);
  check(kv_heads >= 1, "KVCache: kv_heads: expected >= 1, got ", kv_heads);
  check(capacity >= 1, "KVCache: capacity: expected >= 1, got ", capacity);
  check(qk_head_dim >= 0 && v_head_dim >= 0, "KVCache: head dims: expected >= 0, got qk_head_dim ", qk_head_dim,
        " and v_head_dim ", v_head_dim);
  checked_numel({batch, kv_heads, capacity, std::max<int64_t>({qk_head_dim, v_head_dim, 1})}, "KVCache: the storage");
  keys_ = Tensor<Kv>({batch, kv_heads, capacity, qk_head_dim});
  values_ = Tensor<Kv>({batch, kv_heads, capacity, v_head_dim});
  lengths_.assign(static_cast<size_t>(batch), 0);
  last_counts_.assign(static_cast<size_t>(batch), 0);
}

template <class Kv>
int64_t KVCache<Kv>::length() const {
  return *std::max_element(lengths_.begin(), lengths_.end());
}

template <class Kv>
void KVCache<Kv>::append(View<const float> key, View<const float> value, std::span<const int64_t> counts) {
  const Shape want_k{batch(), kv_heads(), key.dim() == 4 ? key.size(2) : 0, qk_head_dim()};
  check(key.dim() == 4 && key.shape() == want_k, "KVCache::append: key: expected (B, Hkv, T, Dqk) = (", batch(), ", ",
        kv_heads(), ", T, ", qk_head_dim(), "), got ", key.shape());
  const int64_t T = key.size(2);
  const Shape want_v{batch(), kv_heads(), T, v_head_dim()};
  check(value.shape() == want_v, "KVCache::append: value: expected ", want_v, " (as key ", key.shape(), "), got ",
        value.shape());
  for (const auto& [name, x] : {std::pair<const char*, const View<const float>*>{"key", &key}, {"value", &value}})
    check(x->numel() == 0 || x->size(3) <= 1 || x->stride(3) == 1, "KVCache::append: ", name,
          ": expected a contiguous last dimension (stride 1), got strides ", x->strides());
  check(counts.empty() || counts.size() == lengths_.size(), "KVCache::append: counts: expected ", batch(),
        " counts (one per sequence) or none, got ", counts.size());
  std::vector<int64_t> n(lengths_.size(), T);
  for (size_t b = 0; b < counts.size(); ++b) {
    check(counts[b] >= 0 && counts[b] <= T, "KVCache::append: counts[", b, "]: expected 0..", T, " (the new tokens), got ",
          counts[b]);
    n[b] = counts[b];
  }
  for (size_t b = 0; b < n.size(); ++b)
    check(lengths_[b] + n[b] <= capacity(), "KVCache::append: sequence ", b, " holds ", lengths_[b], " tokens; ", n[b],
          " more would pass the capacity ", capacity());
  auto write = [&](const View<const float>& src, Tensor<Kv>& dst) {
    const int64_t D = dst.size(3);
    for (int64_t b = 0; b < batch(); ++b)
      for (int64_t h = 0; h < kv_heads(); ++h)
        for (int64_t t = 0; t < n[static_cast<size_t>(b)]; ++t)
          convert(src.data() + b * src.stride(0) + h * src.stride(1) + t * src.stride(2),
                  dst.data() + ((b * kv_heads() + h) * capacity() + lengths_[static_cast<size_t>(b)] + t) * D,
                  static_cast<size_t>(D));
  };
  write(key, keys_);
  write(value, values_);
  for (size_t b = 0; b < n.size(); ++b) lengths_[b] += n[b];
  last_counts_ = std::move(n);
}

template <class Kv>
View<const Kv> KVCache<Kv>::keys() const {
  const int64_t D = qk_head_dim(), C = capacity();
  return View<const Kv>(keys_.data(), {batch(), kv_heads(), length(), D}, {kv_heads() * C * D, C * D, D, 1});
}

template <class Kv>
View<const Kv> KVCache<Kv>::values() const {
  const int64_t D = v_head_dim(), C = capacity();
  return View<const Kv>(values_.data(), {batch(), kv_heads(), length(), D}, {kv_heads() * C * D, C * D, D, 1});
}

template <class Kv>
void KVCache<Kv>::truncate(int64_t length) {
  check(length >= 0, "KVCache::truncate: length: expected >= 0, got ", length);
  for (auto& l : lengths_) l = std::min(l, length);
  std::fill(last_counts_.begin(), last_counts_.end(), 0);
}

template <class Kv>
void KVCache<Kv>::reset() {
  truncate(0);
}

template <class Kv>
void attend_into(const KVCache<Kv>& cache, View<const float> query, View<float> output,
                 const attention::Scoring& scoring) {
  check(query.dim() == 4 && query.size(0) == cache.batch(), "attend: query: expected (B, Hq, T, Dqk) with B = ",
        cache.batch(), ", got ", query.shape());
  const int64_t B = cache.batch(), T = query.size(2);
  const auto& lengths = cache.lengths();
  const auto& counts = cache.last_counts();
  for (int64_t b = 0; b < B; ++b)
    check(counts[static_cast<size_t>(b)] <= T, "attend: query: expected T >= ", counts[static_cast<size_t>(b)],
          " (the tokens sequence ", b, " last appended), got shape ", query.shape());
  // Query t of sequence b sees slots 0..p, p = lengths[b] − counts[b] + t its position: bottom-right
  // causality on the sequence's own lengths (counts[b] queries, lengths[b] keys), and queries past
  // counts[b] see nothing. The core walks each row's keys only up to its sequence's length.
  check(scoring.causal == attention::Causal::none || scoring.causal == attention::Causal::bottom_right,
        "attend: scoring.causal: expected none or bottom_right (the cache's own alignment), got top_left");
  check(scoring.whole_call == attention::WholeCall{},
        "attend: scoring.whole_call: expected the default (a cache call is a whole call)");
  attention::Options<float> opt;
  static_cast<attention::Scoring&>(opt) = scoring;
  opt.causal = attention::Causal::bottom_right;
  opt.query_lengths = View<const int64_t>(counts.data(), {B});
  opt.key_lengths = View<const int64_t>(lengths.data(), {B});
  Tensor<double> logsumexp({B, query.size(1), T});
  attention::sdpa_forward_into(query, cache.keys(), cache.values(), {output, logsumexp, {}}, opt);
}

template <class Kv>
Tensor<float> attend(const KVCache<Kv>& cache, View<const float> query, const attention::Scoring& scoring) {
  check(query.dim() == 4, "attend: query: expected a 4-D tensor (B, Hq, T, Dqk), got shape ", query.shape());
  Tensor<float> out({query.size(0), query.size(1), query.size(2), cache.v_head_dim()});
  attend_into(cache, query, out, scoring);
  return out;
}

#define MHA_INSTANTIATE(Kv)                                                                               \
  template class KVCache<Kv>;                                                                             \
  template void attend_into(const KVCache<Kv>&, View<const float>, View<float>, const attention::Scoring&); \
  template Tensor<float> attend(const KVCache<Kv>&, View<const float>, const attention::Scoring&);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace mha::nn
