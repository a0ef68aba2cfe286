#include "mha/nn/embedding.h"

#include <algorithm>

namespace mha::nn {

template <class T>
Embedding<T>::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen)
    : Embedding(num_embeddings, embedding_dim, std::nullopt, gen) {}

template <class T>
Embedding<T>::Embedding(int64_t num_embeddings, int64_t embedding_dim,
                        std::optional<int64_t> padding_idx, Generator& gen)
    : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  check(num_embeddings >= 0, "Embedding: num_embeddings: expected >= 0, got ", num_embeddings);
  check(embedding_dim >= 0, "Embedding: embedding_dim: expected >= 0, got ", embedding_dim);
  if (padding_idx) {
    const int64_t p = *padding_idx;
    check(p >= -num_embeddings && p < num_embeddings,
          "Embedding: padding_idx: expected a value in [", -num_embeddings, ", ", num_embeddings,
          ") (num_embeddings = ", num_embeddings, "), got ", p);
    padding_idx_ = p < 0 ? p + num_embeddings : p;
  }
  weight = Tensor<T>({num_embeddings, embedding_dim});
  for (T& v : weight.values()) v = narrow<T>(gen.normal());
  if (padding_idx_) std::fill_n(weight.data() + *padding_idx_ * embedding_dim, embedding_dim, narrow<T>(0.0));
  grad_weight = Tensor<T>(weight.shape());
}

template <class T>
Tensor<T> Embedding<T>::forward(const Tensor<int64_t>& indices, Cache* cache) const {
  check_shape(weight.shape(), Shape{num_embeddings_, embedding_dim_}, "Embedding: weight");
  check(indices.defined(),
        "Embedding: input: expected a tensor of indices, got an undefined tensor");
  for (int64_t i = 0; i < indices.numel(); ++i) {
    const int64_t idx = indices[i];
    check(idx >= 0 && idx < num_embeddings_, "Embedding: input: index ", idx, " at position ", i,
          " of a tensor of shape ", to_string(indices.shape()), " is out of range [0, ",
          num_embeddings_, ") (num_embeddings = ", num_embeddings_, ")");
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(embedding_dim_);
  Tensor<T> y(out_shape);
  const int64_t d = embedding_dim_;
  for (int64_t i = 0; i < indices.numel(); ++i)
    std::copy_n(weight.data() + indices[i] * d, d, y.data() + i * d);
  if (cache != nullptr) cache->indices = indices;
  return y;
}

template <class T>
void Embedding<T>::backward(const Tensor<T>& grad_output, const Cache& cache) {
  check(cache.indices.defined(),
        "Embedding::backward: cache: expected the cache filled by forward, got an empty cache");
  check_shape(grad_weight.shape(), Shape{num_embeddings_, embedding_dim_},
              "Embedding: grad_weight");
  Shape expected = cache.indices.shape();
  expected.push_back(embedding_dim_);
  check(grad_output.defined(), "Embedding::backward: grad_output: expected shape ",
        to_string(expected), ", got an undefined tensor");
  check_shape(grad_output.shape(), expected, "Embedding::backward: grad_output");
  const int64_t d = embedding_dim_;
  for (int64_t i = 0; i < cache.indices.numel(); ++i) {
    const int64_t idx = cache.indices[i];
    check(idx >= 0 && idx < num_embeddings_, "Embedding::backward: cache: index ", idx,
          " out of range [0, ", num_embeddings_, ")");
    if (padding_idx_ && idx == *padding_idx_) continue;
    T* g = grad_weight.data() + idx * d;
    const T* go = grad_output.data() + i * d;
    for (int64_t j = 0; j < d; ++j) g[j] = narrow<T>(widen(g[j]) + widen(go[j]));  // bfloat16: each sum rounded
  }
}

template class Embedding<float>;
template class Embedding<double>;
template class Embedding<bfloat16>;

}  // namespace mha::nn
