// PagedKVCache and its attend (mha/nn/paged_kv_cache.h).
#include "mha/nn/paged_kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "mha/core/error.h"
#include "mha/core/int8.h"

namespace mha::nn {
namespace {

constexpr bool fits_int32(int64_t x) { return x <= std::numeric_limits<int32_t>::max(); }

}  // namespace

template <class Kv>
PagedKVCache<Kv>::PagedKVCache(int64_t layers, int64_t pages, int64_t page_size, int64_t kv_heads,
                               int64_t qk_head_dim, int64_t v_head_dim)
    : layers_(layers), pages_(pages), page_size_(page_size), kv_heads_(kv_heads), qk_dim_(qk_head_dim),
      v_dim_(v_head_dim) {
  check(layers >= 1, "PagedKVCache: layers: expected >= 1, got ", layers);
  check(pages >= 1 && fits_int32(pages), "PagedKVCache: pages: expected 1 to 2^31 − 1 (int32 page ids), got ", pages);
  check(page_size >= 1, "PagedKVCache: page_size: expected >= 1, got ", page_size);
  check(kv_heads >= 1, "PagedKVCache: kv_heads: expected >= 1, got ", kv_heads);
  check(qk_head_dim >= 0 && v_head_dim >= 0, "PagedKVCache: head dims: expected >= 0, got qk_head_dim ",
        qk_head_dim, " and v_head_dim ", v_head_dim);
  checked_numel({layers, pages, kv_heads, page_size, std::max<int64_t>({qk_head_dim, v_head_dim, 1})},
                "PagedKVCache: the pool");
  try {
    for (int64_t l = 0; l < layers; ++l) {
      keys_.push_back(reserve<Kv>(kv_heads * page_size * qk_head_dim));
      values_.push_back(reserve<Kv>(kv_heads * page_size * v_head_dim));
      if constexpr (std::is_same_v<Kv, int8_t>) {
        key_scales_.push_back(reserve<float>(kv_heads * page_size));
        value_scales_.push_back(reserve<float>(kv_heads * page_size));
      }
    }
  } catch (...) {
    unmap_all();
    throw;
  }
  refs_.assign(static_cast<size_t>(pages), 0);
  for (int64_t p = pages; p-- > 0;) free_.push_back(static_cast<int32_t>(p));  // page 0 taken first
}

template <class Kv>
PagedKVCache<Kv>::~PagedKVCache() {
  unmap_all();
}

template <class Kv>
void PagedKVCache<Kv>::unmap_all() {
  for (auto& a : keys_) unmap(a);
  for (auto& a : values_) unmap(a);
  for (auto& a : key_scales_) unmap(a);
  for (auto& a : value_scales_) unmap(a);
}

template <class Kv>
template <class E>
typename PagedKVCache<Kv>::template Array<E> PagedKVCache<Kv>::reserve(int64_t page_elems) {
  Array<E> a;
  a.page_elems = page_elems;
  a.bytes = static_cast<size_t>(pages_ * std::max<int64_t>(page_elems, 1)) * sizeof(E);
  void* p = mmap(nullptr, a.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  a.data = static_cast<E*>(p);
  return a;
}

template <class Kv>
template <class E>
void PagedKVCache<Kv>::unmap(Array<E>& a) {
  if (a.data) munmap(a.data, a.bytes);
  a.data = nullptr;
}

// The whole system pages inside a freed page go back to the system (they read as zero after).
template <class Kv>
template <class E>
void PagedKVCache<Kv>::give_back(const Array<E>& a, int32_t page) {
  static const uintptr_t system_page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(a.page(page)),
                  end = reinterpret_cast<uintptr_t>(a.page(page + 1));
  const uintptr_t first = (begin + system_page - 1) / system_page * system_page, last = end / system_page * system_page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

template <class Kv>
typename PagedKVCache<Kv>::Sequence& PagedKVCache<Kv>::live(int64_t sequence, const char* where) {
  check(sequence >= 0 && sequence < static_cast<int64_t>(sequences_.size()) &&
            sequences_[static_cast<size_t>(sequence)].live,
        "PagedKVCache::", where, ": sequence: expected the id of a live sequence (add, fork), got ", sequence);
  return sequences_[static_cast<size_t>(sequence)];
}

template <class Kv>
const typename PagedKVCache<Kv>::Sequence& PagedKVCache<Kv>::live(int64_t sequence, const char* where) const {
  return const_cast<PagedKVCache*>(this)->live(sequence, where);
}

template <class Kv>
void PagedKVCache<Kv>::drop(int32_t page) {
  if (--refs_[static_cast<size_t>(page)] > 0) return;
  for (int64_t l = 0; l < layers_; ++l) {
    give_back(keys_[static_cast<size_t>(l)], page);
    give_back(values_[static_cast<size_t>(l)], page);
    if constexpr (std::is_same_v<Kv, int8_t>) {
      give_back(key_scales_[static_cast<size_t>(l)], page);
      give_back(value_scales_[static_cast<size_t>(l)], page);
    }
  }
  free_.push_back(page);
}

template <class Kv>
int64_t PagedKVCache<Kv>::add() {
  int64_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int64_t>(sequences_.size());
    sequences_.emplace_back();
  }
  sequences_[static_cast<size_t>(id)] = Sequence{true, 0, {}};
  return id;
}

template <class Kv>
int64_t PagedKVCache<Kv>::fork(int64_t parent) {
  live(parent, "fork");
  const int64_t id = add();
  Sequence& child = sequences_[static_cast<size_t>(id)];  // (add may have moved the vector)
  child.length = sequences_[static_cast<size_t>(parent)].length;
  child.pages = sequences_[static_cast<size_t>(parent)].pages;
  for (int32_t p : child.pages) ++refs_[static_cast<size_t>(p)];
  return id;
}

template <class Kv>
void PagedKVCache<Kv>::release(int64_t sequence) {
  Sequence& s = live(sequence, "release");
  for (int32_t p : s.pages) drop(p);
  s = Sequence{};
  free_ids_.push_back(sequence);
}

template <class Kv>
int64_t PagedKVCache<Kv>::length(int64_t sequence) const {
  return live(sequence, "length").length;
}

template <class Kv>
void PagedKVCache<Kv>::extend(std::span<const int64_t> seqs, std::span<const int64_t> counts) {
  check(seqs.size() == counts.size(), "PagedKVCache::extend: counts: expected one per sequence (", seqs.size(),
        "), got ", counts.size());
  // Pages needed, checked before anything changes.
  int64_t needed = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = live(seqs[i], "extend");
    for (size_t k = 0; k < i; ++k)
      check(seqs[k] != seqs[i], "PagedKVCache::extend: seqs: expected distinct ids, got ", seqs[i], " twice");
    check(counts[i] >= 0, "PagedKVCache::extend: counts[", i, "]: expected >= 0, got ", counts[i]);
    const int64_t have = static_cast<int64_t>(s.pages.size());
    const int64_t want = (s.length + counts[i] + page_size_ - 1) / page_size_;
    const bool copy = counts[i] > 0 && s.length % page_size_ != 0 && refs_[static_cast<size_t>(s.pages.back())] > 1;
    needed += want - have + (copy ? 1 : 0);
  }
  check(needed <= free_pages(), "PagedKVCache::extend: expected at most ", free_pages(), " free pages to be needed (",
        pages_in_use(), " of ", pages_, " in use), got ", needed);
  auto take = [&] {
    const int32_t p = free_.back();
    free_.pop_back();
    refs_[static_cast<size_t>(p)] = 1;
    return p;
  };
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = sequences_[static_cast<size_t>(seqs[i])];
    if (counts[i] == 0) continue;
    if (s.length % page_size_ != 0 && refs_[static_cast<size_t>(s.pages.back())] > 1) {
      // Copy on write: the shared, partly filled last page becomes this sequence's own.
      const int32_t old = s.pages.back(), copy = take();
      auto duplicate = [&](auto& arrays) {
        for (auto& a : arrays)
          std::memcpy(a.page(copy), a.page(old), static_cast<size_t>(a.page_elems) * sizeof(*a.data));
      };
      duplicate(keys_);
      duplicate(values_);
      duplicate(key_scales_);
      duplicate(value_scales_);
      s.pages.back() = copy;
      --refs_[static_cast<size_t>(old)];
    }
    s.length += counts[i];
    while (static_cast<int64_t>(s.pages.size()) * page_size_ < s.length) s.pages.push_back(take());
  }
}

template <class Kv>
void PagedKVCache<Kv>::write(int64_t layer, std::span<const int64_t> seqs, View<const float> key,
                             View<const float> value, std::span<const int64_t> cu_seqlens) {
  check(layer >= 0 && layer < layers_, "PagedKVCache::write: layer: expected 0 to ", layers_ - 1, ", got ", layer);
  const Shape want_k{1, kv_heads_, key.dim() == 4 ? key.size(2) : 0, qk_dim_};
  check(key.dim() == 4 && key.shape() == want_k, "PagedKVCache::write: key: expected (1, Hkv, T, Dqk) = (1, ",
        kv_heads_, ", T, ", qk_dim_, "), got ", key.shape());
  const int64_t T = key.size(2);
  const Shape want_v{1, kv_heads_, T, v_dim_};
  check(value.shape() == want_v, "PagedKVCache::write: value: expected ", want_v, " (as key ", key.shape(), "), got ",
        value.shape());
  for (const auto& [name, x] : {std::pair<const char*, const View<const float>*>{"key", &key}, {"value", &value}})
    check(x->numel() == 0 || x->size(3) <= 1 || x->stride(3) == 1, "PagedKVCache::write: ", name,
          ": expected a contiguous last dimension (stride 1), got strides ", x->strides());
  check(cu_seqlens.size() == seqs.size() + 1, "PagedKVCache::write: cu_seqlens: expected ", seqs.size() + 1,
        " values (one more than seqs), got ", cu_seqlens.size());
  check(cu_seqlens.front() == 0 && cu_seqlens.back() == T, "PagedKVCache::write: cu_seqlens: expected to start at 0 ",
        "and end at T = ", T, ", got ", cu_seqlens.front(), " and ", cu_seqlens.back());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = live(seqs[i], "write");
    const int64_t n = cu_seqlens[i + 1] - cu_seqlens[i];
    check(n >= 0 && n <= s.length, "PagedKVCache::write: cu_seqlens: sequence ", seqs[i], " (", s.length,
          " tokens) expected 0 to ", s.length, " new tokens, got ", n);
    for (int64_t j = s.length - n; j < s.length; j += page_size_ - j % page_size_)
      check(refs_[static_cast<size_t>(s.pages[static_cast<size_t>(j / page_size_)])] == 1,
            "PagedKVCache::write: sequence ", seqs[i], "'s token ", j,
            " lies in a page another sequence shares (a fork): extend it first");
  }
  const size_t l = static_cast<size_t>(layer);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = sequences_[static_cast<size_t>(seqs[i])];
    const int64_t n = cu_seqlens[i + 1] - cu_seqlens[i];
    for (int64_t t = 0; t < n; ++t) {
      const int64_t j = s.length - n + t, page = s.pages[static_cast<size_t>(j / page_size_)],
                    slot = j % page_size_, from = cu_seqlens[i] + t;
      for (int64_t h = 0; h < kv_heads_; ++h) {
        const int64_t row = h * page_size_ + slot;
        auto put = [&](const View<const float>& src, const Array<Kv>& to, int64_t D, std::vector<Array<float>>& scales) {
          const float* x = src.data() + h * src.stride(1) + from * src.stride(2);
          Kv* dst = to.page(page) + row * D;
          if constexpr (std::is_same_v<Kv, int8_t>) {
            scales[l].page(page)[row] = quantize_int8(x, static_cast<size_t>(D), dst);
          } else {
            convert(x, dst, static_cast<size_t>(D));
          }
        };
        put(key, keys_[l], qk_dim_, key_scales_);
        put(value, values_[l], v_dim_, value_scales_);
      }
    }
  }
}

template <class Kv>
Tensor<int32_t> PagedKVCache<Kv>::block_table(std::span<const int64_t> seqs) const {
  size_t blocks = 1;
  for (int64_t id : seqs) blocks = std::max(blocks, live(id, "block_table").pages.size());
  Tensor<int32_t> table({static_cast<int64_t>(seqs.size()), static_cast<int64_t>(blocks)});
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& pages = sequences_[static_cast<size_t>(seqs[i])].pages;
    std::copy(pages.begin(), pages.end(), table.data() + i * blocks);
  }
  return table;
}

template <class Kv>
attention::PagedKv<Kv> PagedKVCache<Kv>::pages(int64_t layer, const Tensor<int32_t>& table) const {
  check(layer >= 0 && layer < layers_, "PagedKVCache::pages: layer: expected 0 to ", layers_ - 1, ", got ", layer);
  const size_t l = static_cast<size_t>(layer);
  attention::PagedKv<Kv> kv;
  kv.key_pages = View<const Kv>(keys_[l].data, {pages_, kv_heads_, page_size_, qk_dim_});
  kv.value_pages = View<const Kv>(values_[l].data, {pages_, kv_heads_, page_size_, v_dim_});
  kv.block_table = table;
  if constexpr (std::is_same_v<Kv, int8_t>) {
    kv.key_scales = View<const float>(key_scales_[l].data, {pages_, kv_heads_, page_size_});
    kv.value_scales = View<const float>(value_scales_[l].data, {pages_, kv_heads_, page_size_});
  }
  return kv;
}

template <class Kv>
Tensor<float> attend(const PagedKVCache<Kv>& cache, int64_t layer, std::span<const int64_t> seqs,
                     View<const float> query, std::span<const int64_t> cu_seqlens_q, const attention::Scoring& scoring) {
  check(scoring.causal != attention::Causal::top_left,
        "attend: scoring.causal: expected none or bottom_right (the cache's own alignment), got top_left");
  check(query.dim() == 4, "attend: query: expected a 4-D tensor (1, Hq, T, Dqk), got shape ", query.shape());
  check(cu_seqlens_q.size() == seqs.size() + 1, "attend: cu_seqlens_q: expected ", seqs.size() + 1,
        " values (one more than seqs), got ", cu_seqlens_q.size());
  const Tensor<int32_t> table = cache.block_table(seqs);
  std::vector<int64_t> lengths;
  for (int64_t id : seqs) lengths.push_back(cache.length(id));
  attention::Options<float> opt;
  static_cast<attention::Scoring&>(opt) = scoring;
  opt.causal = attention::Causal::bottom_right;
  opt.cu_seqlens_q = View<const int64_t>(cu_seqlens_q.data(), {static_cast<int64_t>(cu_seqlens_q.size())});
  opt.key_lengths = View<const int64_t>(lengths.data(), {static_cast<int64_t>(lengths.size())});
  Tensor<float> out({1, query.size(1), query.size(2), cache.v_head_dim()});
  Tensor<double> logsumexp({1, query.size(1), query.size(2)});
  attention::paged_forward_into(query, cache.pages(layer, table), {out, logsumexp, {}}, opt);
  return out;
}

#define MHA_INSTANTIATE(Kv)                                                                                      \
  template class PagedKVCache<Kv>;                                                                               \
  template Tensor<float> attend(const PagedKVCache<Kv>&, int64_t, std::span<const int64_t>, View<const float>, \
                                std::span<const int64_t>, const attention::Scoring&);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
MHA_INSTANTIATE(int8_t)
#undef MHA_INSTANTIATE

}  // namespace mha::nn
