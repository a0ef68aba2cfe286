#pragma once
// torch.nn.Embedding: a lookup table of num_embeddings rows of size embedding_dim.
//   forward(indices) with indices of any shape (rank 0 included) -> (..., embedding_dim)
// Parameter "weight" (num_embeddings, embedding_dim), initialised normal(0, 1) from `gen`
// (row-major), with the padding row (if any) set to zero. The padding row receives no gradient.
// padding_idx may be negative (counted from the end, as in PyTorch) and is stored normalised.
#include <cstdint>
#include <optional>
#include <vector>

#include "mha/core/random.h"
#include "mha/core/tensor.h"
#include "mha/nn/module.h"

namespace mha::nn {

template <class T>
class Embedding : public Module<T> {
 public:
  struct Cache {
    Tensor<int64_t> indices;
  };

  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen);
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx,
            Generator& gen);

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }
  std::optional<int64_t> padding_idx() const { return padding_idx_; }

  // Every index must be in [0, num_embeddings): otherwise mha::Error naming the index value,
  // its position and the range.
  Tensor<T> forward(const Tensor<int64_t>& indices, Cache* cache = nullptr) const;
  // Adds grad_output rows into grad_weight (skipping padding_idx). Indices get no gradient.
  void backward(const Tensor<T>& grad_output, const Cache& cache);

  std::vector<Parameter<T>> parameters() override { return {{"weight", &weight, &grad_weight}}; }

  Tensor<T> weight;       // (num_embeddings, embedding_dim)
  Tensor<T> grad_weight;  // same shape, zero at construction

 private:
  int64_t num_embeddings_;
  int64_t embedding_dim_;
  std::optional<int64_t> padding_idx_;
};

}  // namespace mha::nn
