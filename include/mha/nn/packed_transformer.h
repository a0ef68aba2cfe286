#pragma once
// PackedTransformerEncoderLayer: the eval-mode forward of a TransformerEncoderLayer<float>, for
// inference (a sentence encoder runs nothing else), on a snapshot of its weights taken at
// construction: the four projections packed once for core's panel micro-kernel
// (panel_gemm::PackedLinear), attention read and written in place in the packed q/k/v rows.
//
// Why a second path: TransformerEncoderLayer's forward runs its projections through BLAS,
// which packs each weight again on every call; at the few rows of one sentence that packing is
// half the time (sgemm 20×384×1152 on this machine: 61–66 GFLOP/s through OpenBLAS, 140–165 with
// the weight packed once, one thread). The tests hold this path to TransformerEncoderLayer's own
// forward (eval mode), for both norm orders and both activations.
//
// What it takes is what an encoder in inference needs, without padding: the real tokens of N
// sequences back to back (T, E) and their offsets cu_seqlens (N + 1), FlashAttention's packed
// layout. Each token attends to its own sequence's tokens, which is the layer's forward on the
// padded batch (N, L, E) with the key padding mask, row for row at the real tokens; padding costs
// nothing (no product, no attention row is spent on it). Dropout is not applied (eval mode).
// Later changes to the layer's weights are not seen: build a new one.
//
// T = bfloat16: the same layer with the activations between its steps in bfloat16 and the
// weights rounded to bfloat16 once (PyTorch's model.to(torch.bfloat16)); the projections on
// bf16_gemm::PackedLinear (VDPBF16PS where the CPU has AVX512_BF16, float products of the same
// values elsewhere), attention on the bfloat16 cpu_flash, the LayerNorms on bfloat16 input and
// output with double statistics. Each step's bias, activation and residual are added to the
// product in float before it is rounded once. The sentence encoder's dtype bfloat16 runs it; the
// tests hold it to PyTorch's bar on all-MiniLM-L6-v2 (within twice sentence-transformers'
// bfloat16 error against float64, token states and embeddings).
#include <cstdint>
#include <type_traits>
#include <vector>

#include "mha/core/bf16_gemm.h"
#include "mha/core/panel_gemm.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/transformer.h"

namespace mha::nn {

template <class T>
class PackedTransformerEncoderLayer {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>, "float or bfloat16 activations");

 public:
  explicit PackedTransformerEncoderLayer(TransformerEncoderLayer<float>& layer);

  // tokens: contiguous (T, d_model). cu_seqlens: contiguous (N + 1), non-decreasing from 0 to T
  // (empty sequences allowed), or undefined for one sequence of all T tokens.
  // Returns (T, d_model). mha::Error naming the argument for anything else.
  Tensor<T> forward(View<const T> tokens, View<const int64_t> cu_seqlens = {}) const;

  const TransformerEncoderLayerOptions& options() const { return options_; }

 private:
  TransformerEncoderLayerOptions options_;
  MultiheadAttentionOptions attention_options_;  // self_attn's
  using Linear = std::conditional_t<std::is_same_v<T, float>, panel_gemm::PackedLinear, bf16_gemm::PackedLinear>;
  Linear in_proj_, out_proj_, linear1_, linear2_;
  LayerNorm<T> norm1_, norm2_;
};

}  // namespace mha::nn
