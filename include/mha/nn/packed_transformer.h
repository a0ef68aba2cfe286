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
// What it takes is what an encoder in inference needs: batch-first src (N, L, E) and an optional
// key padding mask (N, L), bool, PyTorch's polarity (true = padding, not attended to). Dropout
// is not applied (eval mode). Later changes to the layer's weights are not seen: build a new one.
#include <cstdint>
#include <vector>

#include "mha/core/panel_gemm.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/transformer.h"

namespace mha::nn {

class PackedTransformerEncoderLayer {
 public:
  explicit PackedTransformerEncoderLayer(TransformerEncoderLayer<float>& layer);

  // src: contiguous (N, L, d_model). key_padding_mask: undefined, or contiguous (N, L).
  // Returns (N, L, d_model). mha::Error naming the argument for anything else.
  Tensor<float> forward(View<const float> src, View<const bool> key_padding_mask = {}) const;

  const TransformerEncoderLayerOptions& options() const { return options_; }

 private:
  TransformerEncoderLayerOptions options_;
  MultiheadAttentionOptions attention_options_;  // self_attn's
  panel_gemm::PackedLinear in_proj_, out_proj_, linear1_, linear2_;
  LayerNorm<float> norm1_, norm2_;
};

}  // namespace mha::nn
