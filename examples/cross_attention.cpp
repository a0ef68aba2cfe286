// The second tutorial's Multi_atten(emd_size, q_k_size, v_size, head), done right: one
// multi-head attention layer used for self-attention (x_q attends to itself) and for
// cross-attention (x_q attends to another sequence x_kv), with a query/key head size (16) that
// differs from the value head size (32), a (batch, q_len, kv_len) mask shared by all heads, and
// the output projection the tutorial leaves out. Forward and backward, checked against the plain
// formula in double.
//
// The tutorial's bugs, and where this file avoids them (docs/cross_attention.md has the list):
// its mask is never applied (masked_fill's result is dropped, and the fill value is 1e-9, not
// −inf), its heads are merged without the transpose (the result has shape (B, H, L·Dv)), and it
// has no W_O. Here the mask says where a query MAY attend, the heads are transposed back before
// they are merged, and out_proj maps H·Dv back to emd_size.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mha/attention/attention.h"
#include "mha/nn/linear.h"
#include "support/example_files.h"

namespace {

using mha::Shape;
using mha::Tensor;
using Linear = mha::nn::Linear<float>;

// The tutorial's scenario: 8 heads, 5 queries, 7 keys/values, a batch of 2. The embedding is
// 64 wide instead of the tutorial's 128 so that the PyTorch golden of this example stays small
// (its weights would be 393 KB at 128); the head sizes are the ones that matter here.
constexpr int64_t kBatch = 2, kQueryLen = 5, kKeyValueLen = 7, kEmbedDim = 64, kNumHeads = 8;
constexpr int64_t kQKHeadDim = 16;  // per-head size of q and k: fixes the scale 1/sqrt(16)
constexpr int64_t kVHeadDim = 32;   // per-head size of v: fixes the width of what the heads return
// Valid tokens of each x_kv sequence: the second is padding after 4 tokens.
constexpr std::array<int64_t, kBatch> kKeyValueLengths{7, 4};

void print_shape(const char* stage, const Shape& shape) {
  std::printf("  %-52s %s\n", stage, mha::to_string(shape).c_str());
}

// (B, len, H·d) → (B, H, len, d): head h owns features [h·d, (h+1)·d).
Tensor<float> split_heads(const Tensor<float>& x) {
  return mha::permute(x.reshape({x.size(0), x.size(1), kNumHeads, -1}), {0, 2, 1, 3});
}

// (B, H, len, d) → (B, len, H·d). The transpose comes first: reshaping (B, H, len, d) directly
// (the tutorial's discarded atten.transpose(1, 2)) would mix positions of one head into a row.
Tensor<float> merge_heads(const Tensor<float>& x) {
  return mha::permute(x, {0, 2, 1, 3}).reshape({x.size(0), x.size(2), -1});
}

// What backward needs from one forward pass.
struct ForwardPass {
  Linear::Cache q_input, k_input, v_input, out_input;
  Tensor<float> q, k, v;                           // (B, H, L, Dqk), (B, H, S, Dqk), (B, H, S, Dv)
  Tensor<bool> may_attend;                         // (B, 1, L, S), broadcast over the heads
  mha::attention::ForwardResult<float> attention;  // heads (B, H, L, Dv), logsumexp, weights
  Tensor<float> output;                            // (B, L, E)
};

struct InputGradients {
  Tensor<float> x_q, x_kv;
};

// The tutorial's Multi_atten plus the output projection. Parameter names as the PyTorch twin's
// (scripts/goldens/examples/cross_attention.py). Not mha::nn::MultiheadAttention, whose heads
// all have size E / num_heads for q, k and v alike.
class MultiHeadAttention : public mha::nn::Module<float> {
 public:
  mha::Generator gen{0};
  Linear q_proj{kEmbedDim, kNumHeads* kQKHeadDim, gen};
  Linear k_proj{kEmbedDim, kNumHeads* kQKHeadDim, gen};
  Linear v_proj{kEmbedDim, kNumHeads* kVHeadDim, gen};
  Linear out_proj{kNumHeads * kVHeadDim, kEmbedDim, gen};

  std::vector<mha::nn::Parameter<float>> parameters() override {
    std::vector<mha::nn::Parameter<float>> out;
    append_prefixed(out, q_proj.parameters(), "q_proj");
    append_prefixed(out, k_proj.parameters(), "k_proj");
    append_prefixed(out, v_proj.parameters(), "v_proj");
    append_prefixed(out, out_proj.parameters(), "out_proj");
    return out;
  }

  // x_q (B, L, E) attends to x_kv (B, S, E); self-attention is x_kv = x_q. may_attend (B, L, S):
  // true where the query may see the key. With `title`, prints the shape of every stage.
  ForwardPass forward(const Tensor<float>& x_q, const Tensor<float>& x_kv, const Tensor<bool>& may_attend,
                      const char* title = nullptr) {
    ForwardPass pass;
    pass.q = split_heads(q_proj.forward(x_q, &pass.q_input));
    pass.k = split_heads(k_proj.forward(x_kv, &pass.k_input));
    pass.v = split_heads(v_proj.forward(x_kv, &pass.v_input));
    // One mask for every head: (B, L, S) → (B, 1, L, S), which sdpa broadcasts over H.
    pass.may_attend = mha::unsqueeze(may_attend, 1);
    pass.attention = mha::attention::sdpa_forward(pass.q, pass.k, pass.v, options(pass.may_attend));
    pass.output = out_proj.forward(merge_heads(pass.attention.output), &pass.out_input);
    if (title) {
      std::printf("%s\n", title);
      print_shape("x_q (B, L, E)", x_q.shape());
      print_shape("x_kv (B, S, E)", x_kv.shape());
      print_shape("q = q_proj(x_q) (B, L, H*Dqk)", {x_q.size(0), x_q.size(1), kNumHeads * kQKHeadDim});
      print_shape("k = k_proj(x_kv) (B, S, H*Dqk)", {x_kv.size(0), x_kv.size(1), kNumHeads * kQKHeadDim});
      print_shape("v = v_proj(x_kv) (B, S, H*Dv)", {x_kv.size(0), x_kv.size(1), kNumHeads * kVHeadDim});
      print_shape("q split into heads (B, H, L, Dqk)", pass.q.shape());
      print_shape("k split into heads (B, H, S, Dqk)", pass.k.shape());
      print_shape("v split into heads (B, H, S, Dv)", pass.v.shape());
      print_shape("mask (B, L, S)", may_attend.shape());
      print_shape("mask.unsqueeze(1), broadcast over heads (B, 1, L, S)", pass.may_attend.shape());
      print_shape("scores q k^T / sqrt(Dqk), weights (B, H, L, S)", pass.attention.weights->shape());
      print_shape("weights * v, per head (B, H, L, Dv)", pass.attention.output.shape());
      print_shape("heads transposed and merged (B, L, H*Dv)", pass.out_input.input.shape());
      print_shape("out_proj back to emd_size (B, L, E)", pass.output.shape());
      std::printf("\n");
    }
    return pass;
  }

  // Gradients of sum(output ∘ grad_output) for the inputs (and, added into the layers' grad
  // tensors, for every parameter).
  InputGradients backward(const ForwardPass& pass, const Tensor<float>& grad_output) {
    const Tensor<float> grad_heads = split_heads(out_proj.backward(grad_output, pass.out_input));
    const auto grad =
        mha::attention::sdpa_backward(pass.q, pass.k, pass.v, pass.attention.output, pass.attention.logsumexp,
                                      grad_heads, options(pass.may_attend));
    InputGradients out;
    out.x_q = q_proj.backward(merge_heads(grad.grad_query), pass.q_input);
    // x_kv feeds both k and v, so its gradient is the sum of the two paths.
    out.x_kv = k_proj.backward(merge_heads(grad.grad_key), pass.k_input);
    const Tensor<float> through_v = v_proj.backward(merge_heads(grad.grad_value), pass.v_input);
    for (int64_t i = 0; i < out.x_kv.numel(); ++i) out.x_kv[i] += through_v[i];
    return out;
  }

 private:
  // The scale is sdpa's default, 1/sqrt(Dqk): the size of q·k, not of v and not of emd_size.
  static mha::attention::Options<float> options(const Tensor<bool>& may_attend) {
    mha::attention::Options<float> o;
    o.attend_mask = may_attend;
    o.need_weights = true;
    return o;
  }
};

// Decoder-style self-attention: query i may see keys 0..i (never an empty row: it sees itself).
Tensor<bool> causal_mask(int64_t batch, int64_t len) {
  Tensor<bool> may_attend({batch, len, len});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < len; ++i)
      for (int64_t j = 0; j <= i; ++j) may_attend[(b * len + i) * len + j] = true;
  return may_attend;
}

// Every query may see the valid (non-padding) tokens of its x_kv sequence, and only those.
Tensor<bool> padding_mask(int64_t query_len, int64_t key_len, const std::array<int64_t, kBatch>& lengths) {
  Tensor<bool> may_attend({kBatch, query_len, key_len});
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t i = 0; i < query_len; ++i)
      for (int64_t j = 0; j < lengths[static_cast<size_t>(b)]; ++j)
        may_attend[(b * query_len + i) * key_len + j] = true;
  return may_attend;
}

// Uniform in [0, 1), like the tutorial's torch.rand.
Tensor<float> random_input(const Shape& shape, mha::Generator& gen) {
  Tensor<float> x(shape);
  for (auto& value : x.values()) value = static_cast<float>(gen.uniform());
  return x;
}

// ---- The plain formula, in double, straight from the state dict ----

using DoubleState = std::map<std::string, Tensor<double>>;

// y = x Wᵀ + b over the last dimension.
Tensor<double> plain_linear(const Tensor<double>& x, const Tensor<double>& w, const Tensor<double>& b) {
  const int64_t in = w.size(1), out = w.size(0), rows = x.numel() / in;
  Shape shape = x.shape();
  shape.back() = out;
  Tensor<double> y(shape);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = b[o];
      for (int64_t i = 0; i < in; ++i) sum += x[r * in + i] * w[o * in + i];
      y[r * out + o] = sum;
    }
  return y;
}

// Per head h: softmax(q_h k_hᵀ / sqrt(d_qk), −inf where the key is blocked) v_h, on the
// projections as they come out of the linear layers: q (B, L, H·d_qk), k (B, S, H·d_qk),
// v (B, S, H·d_v) → (B, L, H·d_v). A row with every key blocked gives 0.
Tensor<double> plain_attention(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                               const Tensor<bool>& may_attend) {
  const int64_t B = q.size(0), L = q.size(1), S = k.size(1);
  const int64_t dqk = q.size(2) / kNumHeads, dv = v.size(2) / kNumHeads;
  Tensor<double> out({B, L, kNumHeads * dv});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < kNumHeads; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> p(static_cast<size_t>(S), -std::numeric_limits<double>::infinity());
        double max = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          if (!may_attend[(b * L + i) * S + j]) continue;
          double s = 0;
          for (int64_t c = 0; c < dqk; ++c)
            s += q[(b * L + i) * kNumHeads * dqk + h * dqk + c] *
                 k[(b * S + j) * kNumHeads * dqk + h * dqk + c];
          p[static_cast<size_t>(j)] = s / std::sqrt(static_cast<double>(dqk));
          max = std::max(max, p[static_cast<size_t>(j)]);
        }
        if (max == -std::numeric_limits<double>::infinity()) continue;  // nothing to attend to
        for (auto& s : p) sum += (s = std::exp(s - max));
        for (int64_t j = 0; j < S; ++j)
          for (int64_t c = 0; c < dv; ++c)
            out[(b * L + i) * kNumHeads * dv + h * dv + c] +=
                p[static_cast<size_t>(j)] / sum * v[(b * S + j) * kNumHeads * dv + h * dv + c];
      }
  return out;
}

Tensor<double> plain_forward(const DoubleState& w, const Tensor<double>& x_q, const Tensor<double>& x_kv,
                             const Tensor<bool>& may_attend) {
  const Tensor<double> heads =
      plain_attention(plain_linear(x_q, w.at("q_proj.weight"), w.at("q_proj.bias")),
                      plain_linear(x_kv, w.at("k_proj.weight"), w.at("k_proj.bias")),
                      plain_linear(x_kv, w.at("v_proj.weight"), w.at("v_proj.bias")), may_attend);
  return plain_linear(heads, w.at("out_proj.weight"), w.at("out_proj.bias"));
}

// The example's loss: ½ Σ output², so its gradient for the output is the output itself.
double plain_loss(const DoubleState& w, const Tensor<double>& x_q, const Tensor<double>& x_kv,
                  const Tensor<bool>& may_attend) {
  const Tensor<double> output = plain_forward(w, x_q, x_kv, may_attend);
  double loss = 0;
  for (double y : output.values()) loss += 0.5 * y * y;
  return loss;
}

// max |ours − expected| ≤ tolerance · max(1, max |expected|); prints the comparison.
bool check(const char* what, const Tensor<float>& ours, const Tensor<double>& expected, double tolerance) {
  double max_error = 0, max_value = 0;
  for (int64_t i = 0; i < ours.numel(); ++i) {
    max_error = std::max(max_error, std::abs(ours[i] - expected[i]));
    max_value = std::max(max_value, std::abs(expected[i]));
  }
  const bool ok = max_error <= tolerance * std::max(1.0, max_value);
  std::printf("  %-34s max |mha - formula| = %.3g (max |value| %.3g): %s\n", what, max_error, max_value,
              ok ? "OK" : "MISMATCH");
  return ok;
}

// Central differences of the double loss at every 37th element of `x` (which is x_q or x_kv
// inside `loss_of`), against the gradient from backward.
template <class LossOf>
bool check_gradient(const char* what, const Tensor<float>& grad, Tensor<double> x, LossOf loss_of) {
  constexpr double kStep = 1e-5;
  double max_error = 0, max_value = 0;
  for (const float g : grad.values()) max_value = std::max(max_value, std::abs(static_cast<double>(g)));
  for (int64_t i = 0; i < x.numel(); i += 37) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double up = loss_of(x);
    x[i] = saved - kStep;
    const double down = loss_of(x);
    x[i] = saved;
    max_error = std::max(max_error, std::abs(grad[i] - (up - down) / (2 * kStep)));
  }
  // float32 backward through four projections vs a double central difference (error ~1e-8).
  const bool ok = max_error <= 1e-5 * std::max(1.0, max_value);
  std::printf("  %-34s max |mha - central difference| = %.3g (max |grad| %.3g): %s\n", what, max_error,
              max_value, ok ? "OK" : "MISMATCH");
  return ok;
}

void print_weights(const Tensor<float>& weights, int64_t batch, int64_t head) {
  const int64_t L = weights.size(2), S = weights.size(3);
  std::printf("       ");
  for (int64_t j = 0; j < S; ++j) std::printf("  kv%-3lld", static_cast<long long>(j));
  std::printf("\n");
  for (int64_t i = 0; i < L; ++i) {
    std::printf("  q%-3lld", static_cast<long long>(i));
    for (int64_t j = 0; j < S; ++j)
      std::printf(" %6.3f", weights[((batch * kNumHeads + head) * L + i) * S + j]);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* description =
      "Self- and cross-attention with q/k head size 16, v head size 32 and a (B, L, S) mask.";
  return mha::examples::example_main(argc, argv, description, /*draws=*/true, [](const auto& files) {
    std::printf(
        "Multi-head self- and cross-attention: emd_size %lld, %lld heads, q/k head size %lld, "
        "v head size %lld\n\n",
        static_cast<long long>(kEmbedDim), static_cast<long long>(kNumHeads),
        static_cast<long long>(kQKHeadDim), static_cast<long long>(kVHeadDim));

    MultiHeadAttention model;
    files.load_weights(model);

    mha::Generator gen{2};
    const Tensor<float> x_q = files.input("x_q", random_input({kBatch, kQueryLen, kEmbedDim}, gen));
    const Tensor<float> x_kv = files.input("x_kv", random_input({kBatch, kKeyValueLen, kEmbedDim}, gen));
    const Tensor<bool> self_mask = causal_mask(kBatch, kQueryLen);
    const Tensor<bool> cross_mask = padding_mask(kQueryLen, kKeyValueLen, kKeyValueLengths);

    // 1. Self-attention: the same layer with x_kv = x_q, each query seeing itself and earlier ones.
    const ForwardPass self = model.forward(x_q, x_q, self_mask, "Self-attention (causal mask):");

    // 2. Cross-attention: the queries read x_kv, minus its padding.
    const ForwardPass cross = model.forward(x_q, x_kv, cross_mask, "Cross-attention (x_kv padding masked):");
    std::printf("Cross-attention weights, sequence 1 (valid x_kv tokens: %lld), head 0:\n",
                static_cast<long long>(kKeyValueLengths[1]));
    print_weights(*cross.attention.weights, 1, 0);

    // 3. Backward of loss = ½ Σ output²: grad_output is the output itself.
    const InputGradients grad = model.backward(cross, cross.output);
    std::printf("\nBackward of loss = 1/2 sum(cross_attention_output^2):\n");
    print_shape("grad x_q (B, L, E)", grad.x_q.shape());
    print_shape("grad x_kv (B, S, E), 0 on padding tokens", grad.x_kv.shape());

    // Heads of sequence 1 (its last x_kv tokens are padding).
    const Tensor<float>& w = *cross.attention.weights;
    const int64_t per_sequence = kNumHeads * kQueryLen * kKeyValueLen;
    mha::viz::HeatmapOptions picture;
    picture.title = "cross-attention, sequence 1: 8 heads, queries x keys";
    for (int64_t i = 0; i < kQueryLen; ++i) picture.query_tokens.push_back("q" + std::to_string(i));
    for (int64_t j = 0; j < kKeyValueLen; ++j)
      picture.key_tokens.push_back(j < kKeyValueLengths[1] ? "kv" + std::to_string(j) : "<pad>");
    files.draw(Tensor<float>({kNumHeads, kQueryLen, kKeyValueLen},
                             std::span<const float>(w.data() + per_sequence, static_cast<size_t>(per_sequence))),
               picture);
    files.save({{"self_attention_output", self.output},
                {"cross_attention_output", cross.output},
                {"cross_attention_weights", *cross.attention.weights},
                {"grad_x_q", grad.x_q},
                {"grad_x_kv", grad.x_kv}});

    // 4. A query row with every key blocked: sdpa gives 0 (as PyTorch's SDPA does), so the
    // layer outputs out_proj.bias there. masked_fill(−inf) + softmax would give NaN, and the
    // tutorial's fill value 1e-9 would not block anything.
    Tensor<bool> blocked_row_mask = cross_mask;
    for (int64_t j = 0; j < kKeyValueLen; ++j) blocked_row_mask[j] = false;  // sequence 0, query 0
    const ForwardPass blocked = model.forward(x_q, x_kv, blocked_row_mask);
    double blocked_row_max = 0, bias_error = 0;
    for (int64_t h = 0; h < kNumHeads; ++h)
      for (int64_t c = 0; c < kVHeadDim; ++c)
        blocked_row_max =
            std::max(blocked_row_max,
                     std::abs(static_cast<double>(blocked.attention.output[h * kQueryLen * kVHeadDim + c])));
    for (int64_t e = 0; e < kEmbedDim; ++e)
      bias_error =
          std::max(bias_error, std::abs(static_cast<double>(blocked.output[e] - model.out_proj.bias[e])));
    const bool blocked_ok = blocked_row_max == 0 && bias_error == 0;
    std::printf(
        "\nQuery 0 of sequence 0 with every key blocked: max |attention row| = %g, "
        "max |output row - out_proj.bias| = %g: %s\n",
        blocked_row_max, bias_error, blocked_ok ? "OK (0, not NaN)" : "MISMATCH");

    // 5. Everything against the plain formula in double.
    std::printf("\nCheck against the plain formula (double):\n");
    DoubleState state;
    for (const auto& [name, value] : model.state_dict()) state.emplace(name, mha::cast<double>(value));
    const Tensor<double> x_q64 = mha::cast<double>(x_q), x_kv64 = mha::cast<double>(x_kv);
    // float32 vs double through sums of 64–256 products: a few float epsilons of the magnitude.
    bool ok =
        check("self-attention output", self.output, plain_forward(state, x_q64, x_q64, self_mask), 1e-5);
    ok &=
        check("cross-attention output", cross.output, plain_forward(state, x_q64, x_kv64, cross_mask), 1e-5);
    ok &= check_gradient("grad x_q", grad.x_q, x_q64,
                         [&](const Tensor<double>& x) { return plain_loss(state, x, x_kv64, cross_mask); });
    ok &= check_gradient("grad x_kv", grad.x_kv, x_kv64,
                         [&](const Tensor<double>& x) { return plain_loss(state, x_q64, x, cross_mask); });
    ok &= blocked_ok;
    std::printf("%s\n", ok ? "All checks passed." : "SOME CHECKS FAILED.");
    return ok ? 0 : 1;
  });
}
