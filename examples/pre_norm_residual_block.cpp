// Tutorial 001's block, done right: separate query, key and value inputs through the pre-norm
// residual multi-head attention block
//
//   out = Q + Dropout(out_fc(attention(fc_Q(LN(Q)), fc_K(LN(K)), fc_V(LN(V)), mask)))
//
// 32-wide, 4 heads of 8, 50 tokens, batch 2, with the last tokens of the second sequence padded.
// Forward and backward: the gradients of sum(out ∘ grad_output) for Q, K, V and every parameter.
//
// What the tutorial gets wrong and this does not: the scale is 1/sqrt(head_dim) computed from the
// shapes (not torch.sqrt of a Python int, not a hard-coded 8 ** 0.5), no shape is hard-coded, the
// mask's polarity is stated and padding gets −inf, and "one projection then a split into heads" is
// shown to be the paper's per-head projections (the plain formula below projects head by head).
// Checked against that formula, against mha::nn::MultiheadAttention, and the backward against
// central finite differences.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mha/attention/attention.h"
#include "mha/nn/dropout.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/linear.h"
#include "mha/nn/multihead_attention.h"
#include "support/example_files.h"

namespace {

using mha::Shape;
using mha::Tensor;

constexpr int64_t kBatch = 2, kSeqLen = 50, kEmbedDim = 32, kNumHeads = 4;
constexpr int64_t kHeadDim = kEmbedDim / kNumHeads;
constexpr int64_t kPaddedTokens = 10;  // trailing padding of the second sequence
constexpr double kDropoutP = 0.1;
constexpr uint64_t kSeed = 0;

void print_shape(const char* stage, const Shape& shape) {
  std::printf("  %-52s %s\n", stage, mha::to_string(shape).c_str());
}

template <class T>
Tensor<T> add(Tensor<T> a, const Tensor<T>& b) {
  mha::check_shape(b.shape(), a.shape(), "add");
  for (int64_t i = 0; i < a.numel(); ++i) a[i] += b[i];
  return a;
}

// (N, L, E) → (N, H, L, head_dim): the tutorial's reshape(b, L, 4, 8).permute(0, 2, 1, 3), with
// L taken from the tensor instead of a literal 50 (K and V may be longer than Q).
template <class T>
Tensor<T> split_heads(const Tensor<T>& x) {
  return mha::permute(x.reshape({x.size(0), x.size(1), kNumHeads, kHeadDim}), {0, 2, 1, 3});
}

// (N, H, L, head_dim) → (N, L, E): the inverse of split_heads (and its gradient).
template <class T>
Tensor<T> merge_heads(const Tensor<T>& x) {
  return mha::permute(x, {0, 2, 1, 3}).reshape({x.size(0), x.size(2), kEmbedDim});
}

// The tutorial's padding mask has MHA polarity: true = padding = may NOT be attended to. SDPA's
// bool mask means the opposite (true = may attend), so it is negated here, once, and shaped
// (N, 1, 1, S) to broadcast over heads and queries.
Tensor<bool> attend_mask_from_padding(const Tensor<bool>& is_padding) {
  Tensor<bool> attend({is_padding.size(0), 1, 1, is_padding.size(1)});
  for (int64_t i = 0; i < is_padding.numel(); ++i) attend[i] = !is_padding[i];
  return attend;
}

// Everything backward needs, saved by forward.
template <class T>
struct BlockCache {
  typename mha::nn::LayerNorm<T>::Cache norm_q, norm_k, norm_v;
  typename mha::nn::Linear<T>::Cache fc_q, fc_k, fc_v, out_fc;
  Tensor<bool> attend;                  // (N, 1, 1, S), true = may attend
  Tensor<T> q_heads, k_heads, v_heads;  // (N, H, ·, head_dim)
  Tensor<T> attention;                  // (N, H, L, head_dim)
  Tensor<double> logsumexp;             // (N, H, L)
  typename mha::nn::Dropout<T>::Cache dropout;
};

template <class T>
struct BlockGradients {
  Tensor<T> query, key, value;
};

// The tutorial's MultiHead module. Parameter names are those of the PyTorch twin
// (scripts/goldens/examples/pre_norm_residual_block.py): fc_Q, fc_K, fc_V, out_fc, norm.
// A template so the finite-difference check can run the very same code in double.
template <class T>
struct PreNormResidualBlock : mha::nn::Module<T> {
  mha::Generator init{kSeed};
  mha::nn::Linear<T> fc_Q{kEmbedDim, kEmbedDim, init}, fc_K{kEmbedDim, kEmbedDim, init},
      fc_V{kEmbedDim, kEmbedDim, init}, out_fc{kEmbedDim, kEmbedDim, init};
  mha::nn::LayerNorm<T> norm{kEmbedDim};  // one LayerNorm shared by Q, K and V, as in the tutorial
  mha::nn::Dropout<T> dropout{kDropoutP, kSeed};

  std::vector<mha::nn::Parameter<T>> parameters() override {
    std::vector<mha::nn::Parameter<T>> out;
    this->append_prefixed(out, fc_Q.parameters(), "fc_Q");
    this->append_prefixed(out, fc_K.parameters(), "fc_K");
    this->append_prefixed(out, fc_V.parameters(), "fc_V");
    this->append_prefixed(out, out_fc.parameters(), "out_fc");
    this->append_prefixed(out, norm.parameters(), "norm");
    return out;
  }

  // The train/eval switch reaches the dropout layer, as module.train() does in PyTorch.
  void set_training(bool on) {
    this->train(on);
    dropout.train(on);
  }

  static mha::attention::Options<T> attention_options(const Tensor<bool>& attend) {
    mha::attention::Options<T> options;
    options.attend_mask = attend;
    options.scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));  // head_dim, not embed_dim
    return options;
  }

  // query (N, L, E), key and value (N, S, E), is_padding (N, S) → (N, L, E).
  Tensor<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                    const Tensor<bool>& is_padding, BlockCache<T>& c, bool print_stages = false) {
    // Pre-norm: normalise the inputs of the sublayer; the residual below adds the raw query.
    const Tensor<T> q = fc_Q.forward(norm.forward(query, &c.norm_q), &c.fc_q);
    const Tensor<T> k = fc_K.forward(norm.forward(key, &c.norm_k), &c.fc_k);
    const Tensor<T> v = fc_V.forward(norm.forward(value, &c.norm_v), &c.fc_v);
    c.q_heads = split_heads(q);
    c.k_heads = split_heads(k);
    c.v_heads = split_heads(v);
    c.attend = attend_mask_from_padding(is_padding);
    auto options = attention_options(c.attend);
    options.need_weights = print_stages;
    auto result = mha::attention::sdpa_forward(c.q_heads, c.k_heads, c.v_heads, options);
    c.attention = std::move(result.output);
    c.logsumexp = std::move(result.logsumexp);
    const Tensor<T> merged = merge_heads(c.attention);
    const Tensor<T> projected = out_fc.forward(merged, &c.out_fc);
    Tensor<T> out = add(dropout.forward(projected, &c.dropout), query);
    if (print_stages) {
      print_shape("Q, K, V inputs (N, L, E)", query.shape());
      print_shape("LayerNorm, then fc_Q / fc_K / fc_V (N, L, E)", q.shape());
      print_shape("split into heads (N, H, L, head_dim)", c.q_heads.shape());
      print_shape("padding mask as SDPA's attend mask (N, 1, 1, S)", c.attend.shape());
      print_shape("scores q k^T / sqrt(head_dim), softmax (N, H, L, S)", result.weights->shape());
      print_shape("weights @ v (N, H, L, head_dim)", c.attention.shape());
      print_shape("heads merged (N, L, E)", merged.shape());
      print_shape("out_fc, dropout, + Q (N, L, E)", out.shape());
      double padded_weight = 0;  // attention paid to padded keys: must be exactly 0
      const Tensor<T>& w = *result.weights;
      for (int64_t n = 0; n < w.size(0); ++n)
        for (int64_t h = 0; h < kNumHeads; ++h)
          for (int64_t i = 0; i < w.size(2); ++i)
            for (int64_t j = 0; j < w.size(3); ++j)
              if (is_padding[n * w.size(3) + j])
                padded_weight +=
                    static_cast<double>(w[((n * kNumHeads + h) * w.size(2) + i) * w.size(3) + j]);
      std::printf("  total attention weight on padded keys: %g\n", padded_weight);
    }
    return out;
  }

  Tensor<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                    const Tensor<bool>& is_padding) {
    BlockCache<T> unused;
    return forward(query, key, value, is_padding, unused);
  }

  // Gradients of sum(out ∘ grad_output) for query, key and value; parameter gradients are added
  // to the grad tensors of parameters(). Each step is the backward of a forward step, in reverse.
  BlockGradients<T> backward(const Tensor<T>& grad_output, const BlockCache<T>& c) {
    const Tensor<T> grad_merged = out_fc.backward(dropout.backward(grad_output, c.dropout), c.out_fc);
    const auto grad_heads =
        mha::attention::sdpa_backward(c.q_heads, c.k_heads, c.v_heads, c.attention, c.logsumexp,
                                      split_heads(grad_merged), attention_options(c.attend));
    BlockGradients<T> grads;
    // The shared LayerNorm's backward runs three times; its parameter gradients add up.
    grads.query = norm.backward(fc_Q.backward(merge_heads(grad_heads.grad_query), c.fc_q), c.norm_q);
    grads.key = norm.backward(fc_K.backward(merge_heads(grad_heads.grad_key), c.fc_k), c.norm_k);
    grads.value = norm.backward(fc_V.backward(merge_heads(grad_heads.grad_value), c.fc_v), c.norm_v);
    grads.query = add(std::move(grads.query), grad_output);  // the residual path
    return grads;
  }
};

// The inputs: from --inputs when given (the PyTorch twin's), otherwise random.
struct Inputs {
  Tensor<float> query, key, value, grad_output;
  Tensor<bool> is_padding;  // (N, S), true = padding
};

Inputs make_inputs(const mha::examples::ExampleFiles& files) {
  mha::Generator gen(kSeed + 1);
  auto normal = [&gen](const Shape& shape) {
    Tensor<float> t(shape);
    for (auto& x : t.values()) x = static_cast<float>(gen.normal());
    return t;
  };
  const Shape shape{kBatch, kSeqLen, kEmbedDim};
  Inputs in;
  in.query = files.input("query", normal(shape));
  in.key = files.input("key", normal(shape));
  in.value = files.input("value", normal(shape));
  in.grad_output = files.input("grad_output", normal(shape));
  Tensor<bool> padding({kBatch, kSeqLen});
  for (int64_t j = kSeqLen - kPaddedTokens; j < kSeqLen; ++j) padding[(kBatch - 1) * kSeqLen + j] = true;
  in.is_padding = files.input("key_padding_mask", padding);
  return in;
}

double max_abs(const Tensor<float>& t) {
  double m = 0;
  for (float x : t.values()) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

double max_abs_diff(const Tensor<float>& a, const Tensor<float>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Training mode: dropout zeroes about 10% of the attention branch (those outputs are exactly Q)
// and scales the rest by 1/0.9; the same dropout seed gives the same output again.
bool demonstrate_dropout(PreNormResidualBlock<float>& block, const Inputs& in,
                         const Tensor<float>& eval_out) {
  const uint64_t seed = 1234;
  block.set_training(true);
  block.dropout.reseed(seed);
  const Tensor<float> first = block.forward(in.query, in.key, in.value, in.is_padding);
  block.dropout.reseed(seed);
  const Tensor<float> again = block.forward(in.query, in.key, in.value, in.is_padding);
  const Tensor<float> next = block.forward(in.query, in.key, in.value, in.is_padding);  // next counter
  block.set_training(false);
  int64_t dropped = 0;
  for (int64_t i = 0; i < first.numel(); ++i) dropped += first[i] == in.query[i];
  const bool same = std::equal(first.values().begin(), first.values().end(), again.values().begin());
  std::printf("\nDropout(p=%.1f) in training mode:\n", kDropoutP);
  std::printf("  max |train - eval| = %.3g; %lld of %lld outputs are exactly Q (branch dropped, %.1f%%)\n",
              max_abs_diff(first, eval_out), static_cast<long long>(dropped),
              static_cast<long long>(first.numel()), 100.0 * static_cast<double>(dropped) / first.numel());
  std::printf("  same seed again: %s; next call (new counter): max |diff| = %.3g\n",
              same ? "identical" : "DIFFERENT", max_abs_diff(first, next));
  std::printf("  eval mode: dropout is the identity (the golden and the checks below run in eval)\n");
  return same && dropped > 0;
}

// The same block with PyTorch's nn.MultiheadAttention as the core: its packed in_proj_weight is
// fc_Q, fc_K, fc_V stacked, out_proj is out_fc, and key_padding_mask takes the padding mask as is
// (MHA polarity). The tutorial's "the code differs from the paper" is the same computation.
double compare_with_multihead_attention(PreNormResidualBlock<float>& block, const Inputs& in,
                                        const Tensor<float>& eval_out) {
  mha::nn::MultiheadAttentionOptions options;
  options.embed_dim = kEmbedDim;
  options.num_heads = kNumHeads;
  options.batch_first = true;
  mha::nn::MultiheadAttention<float> attention(options);
  Tensor<float> in_proj_weight({3 * kEmbedDim, kEmbedDim}), in_proj_bias({3 * kEmbedDim});
  const mha::nn::Linear<float>* projections[] = {&block.fc_Q, &block.fc_K, &block.fc_V};
  for (int64_t p = 0; p < 3; ++p) {
    std::copy_n(projections[p]->weight.data(), kEmbedDim * kEmbedDim,
                in_proj_weight.data() + p * kEmbedDim * kEmbedDim);
    std::copy_n(projections[p]->bias.data(), kEmbedDim, in_proj_bias.data() + p * kEmbedDim);
  }
  attention.load_state_dict({{"in_proj_weight", in_proj_weight},
                             {"in_proj_bias", in_proj_bias},
                             {"out_proj.weight", block.out_fc.weight},
                             {"out_proj.bias", block.out_fc.bias}});
  attention.eval();
  mha::nn::MultiheadAttentionArgs<float> args;
  args.key_padding_mask = in.is_padding;
  args.need_weights = false;
  const auto result = attention.forward(block.norm.forward(in.query), block.norm.forward(in.key),
                                        block.norm.forward(in.value), args);
  return max_abs_diff(add(result.output, in.query), eval_out);
}

// The block written out in double, straight from the state dict, one head at a time with the
// paper's per-head projection W_h = rows [h·d, (h+1)·d) of fc_Q / fc_K / fc_V:
//   out = Q + out_fc(concat_h softmax(LN(Q) W_Qhᵀ (LN(K) W_Khᵀ)ᵀ / sqrt(d) + mask) LN(V) W_Vhᵀ)
std::vector<double> plain_block(const Inputs& in, const mha::nn::StateDict<float>& state) {
  const int64_t E = kEmbedDim, d = kHeadDim;
  auto layer_norm = [&](const Tensor<float>& x, int64_t n, int64_t t) {
    std::vector<double> row(static_cast<size_t>(E));
    double mean = 0, var = 0;
    for (int64_t i = 0; i < E; ++i) mean += (row[static_cast<size_t>(i)] = x[(n * kSeqLen + t) * E + i]);
    mean /= E;
    for (double v : row) var += (v - mean) * (v - mean);
    var /= E;  // biased, as LayerNorm
    for (int64_t i = 0; i < E; ++i)
      row[static_cast<size_t>(i)] =
          (row[static_cast<size_t>(i)] - mean) / std::sqrt(var + 1e-5) * state.at("norm.weight")[i] +
          state.at("norm.bias")[i];
    return row;
  };
  // Output features [first, first + count) of x Wᵀ + b.
  auto project = [&](const std::vector<double>& x, const std::string& layer, int64_t first, int64_t count) {
    const Tensor<float>&w = state.at(layer + ".weight"), &b = state.at(layer + ".bias");
    std::vector<double> y(static_cast<size_t>(count));
    for (int64_t o = 0; o < count; ++o) {
      double s = b[first + o];
      for (int64_t i = 0; i < E; ++i) s += x[static_cast<size_t>(i)] * w[(first + o) * E + i];
      y[static_cast<size_t>(o)] = s;
    }
    return y;
  };
  std::vector<double> out(static_cast<size_t>(kBatch * kSeqLen * E));
  for (int64_t n = 0; n < kBatch; ++n) {
    std::vector<std::vector<double>> q_norm, k_norm, v_norm, merged(static_cast<size_t>(kSeqLen));
    for (int64_t t = 0; t < kSeqLen; ++t) {
      q_norm.push_back(layer_norm(in.query, n, t));
      k_norm.push_back(layer_norm(in.key, n, t));
      v_norm.push_back(layer_norm(in.value, n, t));
    }
    for (int64_t h = 0; h < kNumHeads; ++h) {
      std::vector<std::vector<double>> k_h, v_h;
      for (int64_t s = 0; s < kSeqLen; ++s) {
        k_h.push_back(project(k_norm[static_cast<size_t>(s)], "fc_K", h * d, d));
        v_h.push_back(project(v_norm[static_cast<size_t>(s)], "fc_V", h * d, d));
      }
      for (int64_t t = 0; t < kSeqLen; ++t) {
        const auto q_h = project(q_norm[static_cast<size_t>(t)], "fc_Q", h * d, d);
        std::vector<double> p(static_cast<size_t>(kSeqLen));
        double max = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t s = 0; s < kSeqLen; ++s) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += q_h[static_cast<size_t>(c)] * k_h[static_cast<size_t>(s)][static_cast<size_t>(c)];
          p[static_cast<size_t>(s)] = in.is_padding[n * kSeqLen + s]
                                          ? -std::numeric_limits<double>::infinity()
                                          : dot / std::sqrt(double(d));
          max = std::max(max, p[static_cast<size_t>(s)]);
        }
        for (auto& x : p) sum += (x = std::exp(x - max));
        auto& row = merged[static_cast<size_t>(t)];
        row.resize(static_cast<size_t>(E));
        for (int64_t s = 0; s < kSeqLen; ++s)
          for (int64_t c = 0; c < d; ++c)
            row[static_cast<size_t>(h * d + c)] +=
                p[static_cast<size_t>(s)] / sum * v_h[static_cast<size_t>(s)][static_cast<size_t>(c)];
      }
    }
    for (int64_t t = 0; t < kSeqLen; ++t) {
      const auto y = project(merged[static_cast<size_t>(t)], "out_fc", 0, E);
      for (int64_t i = 0; i < E; ++i)
        out[static_cast<size_t>((n * kSeqLen + t) * E + i)] =
            in.query[(n * kSeqLen + t) * E + i] + y[static_cast<size_t>(i)];
    }
  }
  return out;
}

// The analytic gradients (the block's backward, run in double) against central differences
//   ∂f/∂x ≈ (f(x + h) − f(x − h)) / 2h,   f = sum(out ∘ grad_output),
// on a few elements of every input and parameter, among them a padded key and value (whose
// gradient must be exactly 0). Also returns how far the float gradients are from the double ones.
struct GradientCheck {
  double fd_error = 0, fd_scale = 0, float_error = 0, float_scale = 0;
};

GradientCheck check_gradients(PreNormResidualBlock<float>& block, const Inputs& in,
                              const BlockGradients<float>& g32) {
  PreNormResidualBlock<double> block64;
  mha::nn::StateDict<double> state64;
  for (const auto& [name, t] : block.state_dict()) state64.emplace(name, mha::cast<double>(t));
  block64.load_state_dict(state64);
  block64.set_training(false);
  Tensor<double> query = mha::cast<double>(in.query), key = mha::cast<double>(in.key),
                 value = mha::cast<double>(in.value);
  const Tensor<double> grad_output = mha::cast<double>(in.grad_output);
  BlockCache<double> cache;
  block64.forward(query, key, value, in.is_padding, cache);
  block64.zero_grad();
  const BlockGradients<double> g64 = block64.backward(grad_output, cache);

  auto objective = [&] {
    const Tensor<double> out = block64.forward(query, key, value, in.is_padding);
    double f = 0;
    for (int64_t i = 0; i < out.numel(); ++i) f += out[i] * grad_output[i];
    return f;
  };
  GradientCheck check;
  auto compare = [&](const std::string& name, Tensor<double>& x, const Tensor<double>& analytic,
                     std::vector<int64_t> elements) {
    const double h = 1e-5;
    double worst = 0;
    for (int64_t i : elements) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = objective();
      x[i] = saved - h;
      const double down = objective();
      x[i] = saved;
      worst = std::max(worst, std::abs((up - down) / (2 * h) - analytic[i]));
      check.fd_scale = std::max(check.fd_scale, std::abs(analytic[i]));
    }
    check.fd_error = std::max(check.fd_error, worst);
    std::printf("  %-20s %zu elements, max |analytic - finite difference| = %.2g\n", name.c_str(),
                elements.size(), worst);
  };
  auto at = [](int64_t n, int64_t t, int64_t i) { return (n * kSeqLen + t) * kEmbedDim + i; };
  const int64_t padded_token = kSeqLen - 1;  // of the second sequence
  std::printf("\nBackward vs central finite differences (double, h = 1e-5):\n");
  compare("grad_query", query, g64.query, {at(0, 3, 5), at(1, 17, 30), at(1, padded_token, 2)});
  compare("grad_key", key, g64.key, {at(0, 10, 1), at(1, 20, 7), at(1, padded_token, 9)});
  compare("grad_value", value, g64.value, {at(0, 0, 0), at(1, 39, 31), at(1, padded_token, 4)});
  for (auto& p : block64.parameters()) {
    const int64_t n = p.value->numel();
    compare("grad." + p.name, *p.value, *p.grad, {0, n / 2 + 1, n - 1});
  }
  // Padded keys and values cannot influence the output, so their gradient is exactly zero.
  double padded_grad = 0;
  for (int64_t t = kSeqLen - kPaddedTokens; t < kSeqLen; ++t)
    for (int64_t i = 0; i < kEmbedDim; ++i)
      padded_grad = std::max({padded_grad, std::abs(static_cast<double>(g32.key[at(1, t, i)])),
                              std::abs(static_cast<double>(g32.value[at(1, t, i)]))});
  std::printf("  grad_key, grad_value on the padded tokens: max |.| = %g\n", padded_grad);
  check.fd_error = std::max(check.fd_error, padded_grad);

  // The float32 gradients (written to --output) against the same computation in double.
  auto float_vs_double = [&](const Tensor<float>& f, const Tensor<double>& d) {
    for (int64_t i = 0; i < f.numel(); ++i) {
      check.float_error = std::max(check.float_error, std::abs(static_cast<double>(f[i]) - d[i]));
      check.float_scale = std::max(check.float_scale, std::abs(d[i]));
    }
  };
  float_vs_double(g32.query, g64.query);
  float_vs_double(g32.key, g64.key);
  float_vs_double(g32.value, g64.value);
  auto params32 = block.parameters();
  auto params64 = block64.parameters();
  for (size_t p = 0; p < params32.size(); ++p) float_vs_double(*params32[p].grad, *params64[p].grad);
  return check;
}

}  // namespace

int main(int argc, char** argv) {
  const char* description =
      "The tutorial's pre-norm residual multi-head attention block (separate Q, K, V, "
      "padding mask), forward and backward.";
  return mha::examples::example_main(argc, argv, description, /*draws=*/false, [](const auto& files) {
    std::printf("Pre-norm residual block: out = Q + Dropout(out_fc(MHA(LN(Q), LN(K), LN(V), mask)))\n");
    std::printf("  batch %lld, %lld tokens, embed_dim %lld, %lld heads of head_dim %lld\n",
                static_cast<long long>(kBatch), static_cast<long long>(kSeqLen),
                static_cast<long long>(kEmbedDim), static_cast<long long>(kNumHeads),
                static_cast<long long>(kHeadDim));

    PreNormResidualBlock<float> block;
    files.load_weights(block);
    block.set_training(false);
    const Inputs in = make_inputs(files);
    int64_t padded = 0;
    for (bool p : in.is_padding.values()) padded += p;
    std::printf("  padding mask (N, S), true = padding = may not be attended to: %lld padded tokens\n\n",
                static_cast<long long>(padded));

    // Forward and backward in eval mode (dropout is the identity).
    BlockCache<float> cache;
    const Tensor<float> out = block.forward(in.query, in.key, in.value, in.is_padding, cache, true);
    block.zero_grad();
    const BlockGradients<float> grads = block.backward(in.grad_output, cache);
    std::printf("\nBackward of sum(out * grad_output):\n");
    print_shape("grad_query, grad_key, grad_value (N, L, E)", grads.query.shape());
    for (auto& p : block.parameters()) print_shape(("grad." + p.name).c_str(), p.grad->shape());

    std::map<std::string, Tensor<float>> results{
        {"output", out}, {"grad_query", grads.query}, {"grad_key", grads.key}, {"grad_value", grads.value}};
    for (auto& p : block.parameters()) results.emplace("grad." + p.name, *p.grad);
    files.save(results);

    bool ok = demonstrate_dropout(block, in, out);

    // float32 against double: sums of 32 products, a LayerNorm and a softmax, so a few float
    // epsilons times the magnitude.
    const double scale = std::max(1.0, max_abs(out));
    const double mha_error = compare_with_multihead_attention(block, in, out);
    std::printf(
        "\nSame block with mha::nn::MultiheadAttention (in_proj = fc_Q; fc_K; fc_V, out_proj = out_fc):\n"
        "  max |difference| = %.3g\n",
        mha_error);
    ok = ok && mha_error <= 1e-5 * scale;

    const std::vector<double> expected = plain_block(in, block.state_dict());
    double formula_error = 0;
    for (int64_t i = 0; i < out.numel(); ++i)
      formula_error = std::max(formula_error, std::abs(out[i] - expected[static_cast<size_t>(i)]));
    std::printf("Check against the plain formula (double): max |block - formula| = %.3g (max |out| %.3g)\n",
                formula_error, max_abs(out));
    ok = ok && formula_error <= 1e-5 * scale;

    const GradientCheck g = check_gradients(block, in, grads);
    std::printf("  max over all: %.3g (max |gradient| %.3g)\n", g.fd_error, g.fd_scale);
    std::printf(
        "float32 gradients vs the same backward in double: max |difference| = %.3g (max |gradient| %.3g)\n",
        g.float_error, g.float_scale);
    ok = ok && g.fd_error <= 1e-6 * std::max(1.0, g.fd_scale) &&
         g.float_error <= 1e-4 * std::max(1.0, g.float_scale);

    std::printf("\n%s\n", ok ? "All checks OK" : "MISMATCH");
    return ok ? 0 : 1;
  });
}
