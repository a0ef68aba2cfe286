#pragma once
// A paged key/value cache for serving many sequences at once: every layer's keys and values in
// one pool of pages of P tokens (vLLM's blocks, FlashAttention's block_table), each sequence
// holding the pages its tokens fill, so that memory follows what is written rather than the
// longest sequence; a fork shares its parent's pages (a common prompt is stored once).
//
//   PagedKVCache<bfloat16> cache(layers, pages, 256, kv_heads, head_dim, head_dim);
//   int64_t a = cache.add(), b = cache.fork(a);      // b shares a's tokens
//   cache.extend(seqs, counts);                       // room for each sequence's new tokens
//   for each layer l:
//     cache.write(l, seqs, key, value, cu_seqlens);   // (1, Hkv, T, D): the new tokens, packed
//     out = attend(cache, l, seqs, query, cu_seqlens_q);  // prefill chunks and decode rows at once
//   cache.release(a);
//
// Storage Kv: float, bfloat16, float16, or int8_t: symmetric int8 with a float scale per token
// and kv head (mha/core/int8.h: scale = max|x|/127 over the row's D numbers, each number within
// scale/2 of what was written; a row holding a NaN or an infinity stands for NaNs);
// docs/generation.md derives what that does to attention's output.
//
// Layout: per layer, keys (pages, Hkv, P, Dqk) and values (pages, Hkv, P, Dv), so that a (sequence,
// kv head) reads P·D contiguous numbers a page (FlashAttention's (pages, P, Hkv, D) would
// interleave the heads: attention::PagedKv reads either). The pool is reserved once and the
// memory of a page is the system's only once it is written (anonymous mapping); a page no
// sequence holds any more is given back to the system where it spans whole system pages.
#include <cstdint>
#include <span>
#include <vector>

#include "mha/attention/attention.h"
#include "mha/attention/options.h"
#include "mha/core/half.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"

namespace mha::nn {

template <class Kv>  // float, bfloat16, float16 or int8_t
class PagedKVCache {
 public:
  // Every size >= 1 (head dims may be 0).
  PagedKVCache(int64_t layers, int64_t pages, int64_t page_size, int64_t kv_heads, int64_t qk_head_dim,
               int64_t v_head_dim);
  ~PagedKVCache();
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;

  // A new empty sequence: its id (ids of released sequences are used again).
  int64_t add();
  // A new sequence holding `parent`'s tokens, sharing its pages: the shared last page, when
  // partly filled, is copied by whichever of the two is extended into it first.
  int64_t fork(int64_t parent);
  // The sequence's pages go back to the pool (those no other sequence holds); its id is free.
  void release(int64_t sequence);
  // Tokens held by a sequence.
  int64_t length(int64_t sequence) const;

  // Room for counts[i] more tokens in sequence seqs[i] (pages taken from the pool, a shared last
  // page copied first): each sequence's length grows by its count. All or nothing: throws
  // mha::Error, changing nothing, when the pool has too few free pages or an id is not a live
  // sequence (or appears twice).
  void extend(std::span<const int64_t> seqs, std::span<const int64_t> counts);
  // Layer `layer`'s keys and values of tokens of seqs: key (1, Hkv, T, Dqk) and value (1, Hkv, T, Dv)
  // float (rows contiguous, any other strides), sequence seqs[i] taking tokens
  // [cu_seqlens[i], cu_seqlens[i + 1]) as its last ones (positions length − n .. length − 1; they
  // must lie in pages it alone holds: extend first). int8 storage quantizes each row.
  void write(int64_t layer, std::span<const int64_t> seqs, View<const float> key, View<const float> value,
             std::span<const int64_t> cu_seqlens);

  // Rows 0..N of the block table of seqs, (N, most pages any holds; at least 1), unused entries 0.
  Tensor<int32_t> block_table(std::span<const int64_t> seqs) const;
  // The layer's pages (and scales, int8) with `table`, as attention::paged_forward_into reads them.
  attention::PagedKv<Kv> pages(int64_t layer, const Tensor<int32_t>& table) const;

  int64_t layers() const { return layers_; }
  int64_t page_count() const { return pages_; }
  int64_t page_size() const { return page_size_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t qk_head_dim() const { return qk_dim_; }
  int64_t v_head_dim() const { return v_dim_; }
  // Pages that some sequence holds, and pages free.
  int64_t pages_in_use() const { return pages_ - static_cast<int64_t>(free_.size()); }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> pages;
  };
  // One array of the pool, reserved as an anonymous mapping: pages × page_elems numbers of E.
  template <class E>
  struct Array {
    E* data = nullptr;
    size_t bytes = 0;
    int64_t page_elems = 0;
    E* page(int64_t p) const { return data + p * page_elems; }
  };
  template <class E>
  Array<E> reserve(int64_t page_elems);
  template <class E>
  void unmap(Array<E>& a);
  void unmap_all();
  template <class E>
  void give_back(const Array<E>& a, int32_t page);
  Sequence& live(int64_t sequence, const char* where);
  const Sequence& live(int64_t sequence, const char* where) const;
  void drop(int32_t page);

  int64_t layers_, pages_, page_size_, kv_heads_, qk_dim_, v_dim_;
  std::vector<Array<Kv>> keys_, values_;                 // per layer
  std::vector<Array<float>> key_scales_, value_scales_;  // per layer, int8 only
  std::vector<int32_t> refs_, free_;
  std::vector<Sequence> sequences_;
  std::vector<int64_t> free_ids_;
};

// Attention of the newest tokens of seqs over layer `layer` of the cache: query (1, Hq, T, Dqk)
// float, sequence seqs[i]'s queries at [cu_seqlens_q[i], cu_seqlens_q[i + 1]), its last tokens
// (each sees the sequence's tokens up to itself: bottom-right causality on its own length). A
// prefill chunk and decode rows go in one call (attention::paged_forward_into). `scoring` holds
// the other settings (scale, window, softcap, chunks); its causal alignment must be none or
// bottom_right (the cache's own, applied in any case), no dropout. Returns (1, Hq, T, Dv).
template <class Kv>
Tensor<float> attend(const PagedKVCache<Kv>& cache, int64_t layer, std::span<const int64_t> seqs,
                     View<const float> query, std::span<const int64_t> cu_seqlens_q,
                     const attention::Scoring& scoring = {});

}  // namespace mha::nn
