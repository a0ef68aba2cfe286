#pragma once
// The attention classifier of tutorial 002, trainable, with options:
//
//   x (N, L, input_dim)                          an image: L = 28 rows (tokens) of 28 pixels
//   → input_projection (Linear input_dim → E)    optional; without it E must equal input_dim
//   → + positions (1, L, E)                      optional learned position vectors
//   → num_blocks × [ x + MHA(norm(x)) ]          self-attention with a residual; norm is a
//                                                pre-norm LayerNorm with pre_norm, else identity
//   → norm (LayerNorm)                           with pre_norm only
//   → mean over the L positions (N, E)
//   → fc1 (E → hidden) → ReLU → dropout → fc2 (hidden → classes) = logits (N, classes)
//
// With the defaults (E = 28, 4 heads, hidden 128, one block, nothing optional) it is exactly the
// tutorial's MultiHeadSelfAttentionClassifier. Parameter names are those of the PyTorch twin
// (scripts/twin/train_twin.py): input_projection.{weight,bias}, positions,
// blocks.<i>.norm.{weight,bias}, blocks.<i>.attention.{in_proj_weight,in_proj_bias,
// out_proj.weight,out_proj.bias}, norm.{weight,bias}, fc1.{weight,bias}, fc2.{weight,bias}.
//
// Two implementations of forward/backward compute the same function; the path is chosen when
// the model is built (the constructor's `path`), and a Cache holds the state of one of them:
//   ComputePath::fused (the default) is written for these small shapes and for speed. The batch
//     is cut into chunks of kChunk = 16 images, kept with the image index innermost so that
//     SIMD lanes hold images; each chunk runs the whole network (one BLAS call per projection,
//     a SIMD attention core that keeps the probabilities for backward) on one OpenMP thread,
//     with its own parameter-gradient buffer; the buffers are summed in chunk order at the end.
//     So a step has one parallel region for forward and one for backward, and its results are
//     bitwise the same for any number of threads (src/models/attention_classifier_fused.cpp).
//     It calls BLAS single-threaded (mha/core/blas_threads.h).
//   ComputePath::module runs the layers' own forward/backward (nn::Linear, nn::LayerNorm,
//     nn::MultiheadAttention with batch_first, need_weights=false, ...): the reference that the
//     tests hold the fused path to. It is 3–5× slower here (8× when left to OpenBLAS's own
//     threads; docs/training.md has the figures): MultiheadAttention's general path permutes
//     q/k/v into (N, H, L, d) copies and its attention backends are built for long sequences.
#include <cstdint>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "mha/core/random.h"
#include "mha/core/tensor.h"
#include "mha/nn/dropout.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/linear.h"
#include "mha/nn/module.h"
#include "mha/nn/multihead_attention.h"
#include "mha/nn/relu.h"

namespace mha::models {

struct AttentionClassifierConfig {
  int64_t sequence_length = 28;  // L: tokens per input (image rows)
  int64_t input_dim = 28;        // features per token (image columns)
  int64_t embed_dim = 28;        // E, the width; equal to input_dim unless input_projection
  int64_t num_heads = 4;
  int64_t hidden_dim = 128;
  int64_t num_classes = 10;
  int64_t num_blocks = 1;
  bool input_projection = false;
  bool learned_positions = false;
  bool pre_norm = false;  // LayerNorm before each attention and before the pooling
  double dropout = 0.0;   // after the ReLU, in training mode only

  // Throws mha::Error naming the field: every size >= 1, E divisible by num_heads, E equal to
  // input_dim without input_projection, dropout in [0, 1).
  void check_valid() const;
};

enum class ComputePath { fused, module };

template <class T>
class AttentionClassifier : public nn::Module<T> {
 public:
  // Images per chunk on the fused path (a fixed number, so results do not depend on threads).
  static constexpr int64_t kChunk = 16;  // = the image lanes of src/models/lanes_kernels.h

  // Everything backward needs, filled by forward: the state of the path the model runs. A
  // Cache may be reused from step to step; its buffers are then reused when the batch size is
  // unchanged.
  struct ModuleCache {  // the layers' own caches
    struct BlockCache {
      typename nn::LayerNorm<T>::Cache norm;  // with pre_norm
      nn::MultiheadAttentionCache<T> attention;
    };
    int64_t batch = 0;
    typename nn::Linear<T>::Cache input_projection;
    std::vector<BlockCache> blocks;
    typename nn::LayerNorm<T>::Cache norm;  // the final LayerNorm's (pre_norm)
    typename nn::Linear<T>::Cache fc1, fc2;
    typename nn::ReLU<T>::Cache relu;
    typename nn::Dropout<T>::Cache dropout;
  };
  struct FusedCache {  // per chunk of kChunk images, in the lanes layout (features, L, kChunk)
    struct BlockCache {
      Tensor<T> attention_input;  // (chunks, E, L, 16): the block's input, or its LayerNorm
      Tensor<T> normalized;       // (chunks, E, L, 16) and rstd (chunks, L, 16): the LayerNorm's
      Tensor<T> rstd;
      Tensor<T> qkv;              // (chunks, 3E, L, 16): packed q, k, v projections
      Tensor<T> probabilities;    // (chunks, H, L, L, 16): P[query][key] per image
      Tensor<T> merged;           // (chunks, E, L, 16): heads merged, the input of out_proj
    };
    int64_t batch = 0;
    Tensor<T> input;                          // (chunks, input_dim, L, 16)
    std::vector<BlockCache> blocks;
    Tensor<T> normalized, rstd;               // the final LayerNorm's (pre_norm)
    Tensor<T> pooled;                         // (chunks, E, 16)
    Tensor<T> fc1_output;                     // (chunks, hidden, 16), before the ReLU
    Tensor<T> fc2_input;                      // (chunks, hidden, 16), after ReLU and dropout
    Tensor<bool> keep;                        // the dropout mask (N, hidden), when one was drawn
    std::vector<std::vector<T>> chunk_grads;  // backward's per-chunk gradient buffers
    std::vector<T> summed_grads;              // and their sum
  };
  // Empty (std::monostate) until a forward fills it.
  using Cache = std::variant<std::monostate, ModuleCache, FusedCache>;

  // Parameters initialised from `seed` as PyTorch initialises each layer (Linear:
  // U(±1/sqrt(fan_in)); MultiheadAttention: xavier_uniform in_proj, zero biases; LayerNorm: 1, 0;
  // positions: N(0, 0.02²)). The dropout masks are drawn from `seed` too (mha/nn/dropout.h).
  // `path` picks the implementation of forward and backward for the model's lifetime.
  explicit AttentionClassifier(const AttentionClassifierConfig& config, uint64_t seed = 0,
                               ComputePath path = ComputePath::fused);

  const AttentionClassifierConfig& config() const { return config_; }
  ComputePath compute_path() const { return path_; }

  // x (N, L, input_dim) → logits (N, num_classes). In training mode the dropout layer draws a
  // new mask (and advances its counter).
  Tensor<T> forward(const Tensor<T>& x, Cache* cache = nullptr);
  // Adds every parameter's gradient of sum(logits ∘ grad_logits); returns the input's gradient
  // (an undefined tensor when want_input_grad is false, which saves its computation).
  // Throws mha::Error for an empty cache or one filled by a model on the other path.
  // The cache is not const: the fused path keeps its per-chunk gradient buffers in it.
  Tensor<T> backward(const Tensor<T>& grad_logits, Cache& cache, bool want_input_grad = true);

  std::vector<nn::Parameter<T>> parameters() override;

  // The dropout layer's counter: part of a checkpoint, so a resumed run draws the same masks.
  uint64_t dropout_counter() const { return dropout_.counter(); }
  void set_dropout_counter(uint64_t counter) { dropout_.set_counter(counter); }

 private:
  struct Block {
    std::optional<nn::LayerNorm<T>> norm;
    std::unique_ptr<nn::MultiheadAttention<T>> attention;
  };
  Tensor<T> module_forward(const Tensor<T>& x, ModuleCache* cache);
  Tensor<T> module_backward(const Tensor<T>& grad_logits, const ModuleCache& cache, bool want_input_grad);
  Tensor<T> fused_forward(const Tensor<T>& x, FusedCache* cache);
  Tensor<T> fused_backward(const Tensor<T>& grad_logits, FusedCache& cache, bool want_input_grad);

  AttentionClassifierConfig config_;
  ComputePath path_;
  std::optional<nn::Linear<T>> input_projection_;
  Tensor<T> positions_, grad_positions_;  // (1, L, E) when learned_positions
  std::vector<Block> blocks_;
  std::optional<nn::LayerNorm<T>> norm_;
  std::optional<nn::Linear<T>> fc1_, fc2_;
  nn::ReLU<T> relu_;
  nn::Dropout<T> dropout_;
};

}  // namespace mha::models
