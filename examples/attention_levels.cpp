// The third tutorial's "four levels" of self-attention, done right and checked:
//   V1  separate q, k, v projections: softmax(q kᵀ / sqrt(d)) v
//   V2  one fused projection Linear(hidden, 3·hidden), split into q, k, v: the same numbers as
//       V1 when its weight stacks V1's three weights
//   V3  V2 plus an attention_mask (0 = blocked) and dropout on the attention weights, which is
//       active only in training (survivors scaled by 1/(1 − p)) and reproducible from a seed
//   V4  multi-head: the hidden size split into heads, the (batch, seq, seq) mask shared by the
//       heads, and the output projection.
//
// The tutorial's V4 scales by 1/sqrt(hidden_dim), but each head's scores are dot products of
// head_dim numbers, so the scale is 1/sqrt(head_dim) (what sdpa uses by default); it also builds
// out_proj and never applies it. docs/attention_levels.md lists these and the tutorial's other
// mistakes.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

#include "mha/attention/attention.h"
#include "mha/nn/linear.h"
#include "support/example_files.h"
#include "support/plain_math.h"

namespace {

namespace plain = mha::examples::plain;
using mha::Shape;
using mha::Tensor;
using Linear = mha::nn::Linear<float>;
using Parameters = std::vector<mha::nn::Parameter<float>>;

// V1–V3: the tutorial's padding example, 3 sequences of 4 tokens with 3, 2 and 1 real tokens
// (hidden 16 rather than its 2 and 4, so that the numbers mean something).
constexpr int64_t kBatch = 3, kSeqLen = 4, kHidden = 16;
constexpr std::array<int64_t, kBatch> kLengths{3, 2, 1};
// V4: 8 heads of size 8; the second sequence has 3 padding tokens.
constexpr int64_t kMultiBatch = 2, kMultiSeqLen = 8, kMultiHidden = 64, kNumHeads = 8;
constexpr std::array<int64_t, kMultiBatch> kMultiLengths{8, 5};
constexpr double kDropout = 0.1;

void print_shape(const char* stage, const Shape& shape) {
  std::printf("  %-52s %s\n", stage, mha::to_string(shape).c_str());
}

// (B, len, H·d) → (B, H, len, d): head h owns features [h·d, (h+1)·d). H = 1 is the
// single-head layout sdpa takes.
Tensor<float> split_heads(const Tensor<float>& x, int64_t heads) {
  return mha::permute(x.reshape({x.size(0), x.size(1), heads, -1}), {0, 2, 1, 3});
}

// (B, H, len, d) → (B, len, H·d): transpose back first, then merge.
Tensor<float> merge_heads(const Tensor<float>& x) {
  return mha::permute(x, {0, 2, 1, 3}).reshape({x.size(0), x.size(2), -1});
}

// The last dimension cut into `parts` equal pieces (torch.split(x, size, dim=-1)).
std::vector<Tensor<float>> split_last(const Tensor<float>& x, int64_t parts) {
  const int64_t width = x.size(-1), piece = width / parts, rows = x.numel() / width;
  Shape shape = x.shape();
  shape.back() = piece;
  std::vector<Tensor<float>> out;
  for (int64_t p = 0; p < parts; ++p) {
    Tensor<float> part(shape);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(x.data() + r * width + p * piece, piece, part.data() + r * piece);
    out.push_back(std::move(part));
  }
  return out;
}

struct Attended {
  Tensor<float> output;   // (B, L, hidden)
  Tensor<float> weights;  // (B, H, L, L), after dropout
};

// softmax(q kᵀ · scale, blocked keys −inf), dropout, · v on (B, L, H·d) projections, with
// the heads split off and merged back. The scale defaults to sdpa's 1/sqrt(d), d the head size.
Attended attend(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v, int64_t heads,
                const Tensor<bool>* may_attend, double dropout_p = 0, uint64_t dropout_seed = 0,
                std::optional<double> scale = std::nullopt) {
  mha::attention::Options<float> options;
  if (may_attend) options.attend_mask = *may_attend;
  options.dropout_p = dropout_p;
  options.dropout_seed = dropout_seed;
  options.scale = scale;
  options.need_weights = true;
  auto result = mha::attention::sdpa_forward(split_heads(q, heads), split_heads(k, heads),
                                             split_heads(v, heads), options);
  return {merge_heads(result.output), std::move(*result.weights)};
}

// The tutorial's attention_mask, 1 = real token, 0 = padding, (B, L) → (B, L, L) by
// mask.unsqueeze(1).repeat(1, L, 1): every query row lists the keys it may see.
Tensor<int64_t> padding_attention_mask(int64_t seq_len, const std::vector<int64_t>& lengths) {
  const auto batch = static_cast<int64_t>(lengths.size());
  Tensor<int64_t> mask({batch, seq_len, seq_len});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seq_len; ++i)
      for (int64_t j = 0; j < lengths[static_cast<size_t>(b)]; ++j) mask[(b * seq_len + i) * seq_len + j] = 1;
  return mask;
}

// attention_mask == 0 is blocked, so true = may attend is attention_mask != 0.
Tensor<bool> may_attend_from(const Tensor<int64_t>& attention_mask) {
  Tensor<bool> may_attend(attention_mask.shape());
  for (int64_t i = 0; i < attention_mask.numel(); ++i) may_attend[i] = attention_mask[i] != 0;
  return may_attend;
}

// ---- The four levels. Parameter names as the PyTorch twin's (scripts/goldens/examples). ----

class SelfAttentionV1 : public mha::nn::Module<float> {
 public:
  SelfAttentionV1(int64_t hidden, mha::Generator& gen)
      : query_proj(hidden, hidden, gen), key_proj(hidden, hidden, gen), value_proj(hidden, hidden, gen) {}

  Parameters parameters() override {
    Parameters out;
    append_prefixed(out, query_proj.parameters(), "query_proj");
    append_prefixed(out, key_proj.parameters(), "key_proj");
    append_prefixed(out, value_proj.parameters(), "value_proj");
    return out;
  }

  // x (B, L, hidden) → (B, L, hidden). One head, so its size is hidden and 1/sqrt(hidden) is
  // the right scale here.
  Tensor<float> forward(const Tensor<float>& x) const {
    return attend(query_proj.forward(x), key_proj.forward(x), value_proj.forward(x), 1, nullptr).output;
  }

  Linear query_proj, key_proj, value_proj;
};

class SelfAttentionV2 : public mha::nn::Module<float> {
 public:
  SelfAttentionV2(int64_t hidden, mha::Generator& gen) : proj(hidden, 3 * hidden, gen) {}

  // The fused layer that computes exactly V1's q, k and v: its weight rows are V1's query,
  // key and value weights stacked, and its bias likewise.
  static SelfAttentionV2 fused_from(const SelfAttentionV1& v1) {
    const int64_t hidden = v1.query_proj.in_features();
    mha::Generator gen{0};  // the random initialisation is overwritten just below
    SelfAttentionV2 v2(hidden, gen);
    const Linear* parts[] = {&v1.query_proj, &v1.key_proj, &v1.value_proj};
    for (int64_t p = 0; p < 3; ++p) {
      std::copy_n(parts[p]->weight.data(), hidden * hidden, v2.proj.weight.data() + p * hidden * hidden);
      std::copy_n(parts[p]->bias.data(), hidden, v2.proj.bias.data() + p * hidden);
    }
    return v2;
  }

  Parameters parameters() override {
    Parameters out;
    append_prefixed(out, proj.parameters(), "proj");
    return out;
  }

  // One (B, L, 3·hidden) projection instead of three, split into q, k, v along the last axis.
  Tensor<float> forward(const Tensor<float>& x) const {
    const auto qkv = split_last(proj.forward(x), 3);
    return attend(qkv[0], qkv[1], qkv[2], 1, nullptr).output;
  }

  Linear proj;
};

class SelfAttentionV3 : public mha::nn::Module<float> {
 public:
  SelfAttentionV3(int64_t hidden, double dropout_p, mha::Generator& gen)
      : proj(hidden, 3 * hidden, gen), dropout_p(dropout_p) {}

  Parameters parameters() override {
    Parameters out;
    append_prefixed(out, proj.parameters(), "proj");
    return out;
  }

  // attention_mask (B, L, L): 0 = blocked. Dropout acts on the attention weights after the
  // softmax, and only in training: eval() makes the layer deterministic.
  Attended forward(const Tensor<float>& x, const Tensor<int64_t>& attention_mask) const {
    const auto qkv = split_last(proj.forward(x), 3);
    // sdpa sees one head, (B, 1, L, L); the mask gets the same head axis.
    const Tensor<bool> may_attend = mha::unsqueeze(may_attend_from(attention_mask), 1);
    return attend(qkv[0], qkv[1], qkv[2], 1, &may_attend, is_training() ? dropout_p : 0.0, dropout_seed);
  }

  Linear proj;
  double dropout_p;
  uint64_t dropout_seed = 0;  // the dropout mask is a pure function of this seed
};

class SelfAttentionV4 : public mha::nn::Module<float> {
 public:
  // No default for num_heads: the tutorial's default of 0 divides by zero.
  SelfAttentionV4(int64_t hidden, int64_t num_heads, double dropout_p, mha::Generator& gen)
      : proj(hidden, 3 * hidden, gen),
        out_proj(hidden, hidden, gen),
        num_heads(num_heads),
        dropout_p(dropout_p) {}

  Parameters parameters() override {
    Parameters out;
    append_prefixed(out, proj.parameters(), "proj");
    append_prefixed(out, out_proj.parameters(), "out_proj");
    return out;
  }

  // x (B, L, hidden), attention_mask (B, L, L) with 0 = blocked → (B, L, hidden). `scale`
  // defaults to 1/sqrt(head_dim); passing 1/sqrt(hidden) reproduces the tutorial's mistake.
  Attended forward(const Tensor<float>& x, const Tensor<int64_t>& attention_mask,
                   std::optional<double> scale = std::nullopt) const {
    const auto qkv = split_last(proj.forward(x), 3);
    // One mask for every head: (B, L, L) → (B, 1, L, L), which sdpa broadcasts over H.
    const Tensor<bool> may_attend = mha::unsqueeze(may_attend_from(attention_mask), 1);
    Attended heads = attend(qkv[0], qkv[1], qkv[2], num_heads, &may_attend, is_training() ? dropout_p : 0.0,
                            dropout_seed, scale);
    heads.output = out_proj.forward(heads.output);
    return heads;
  }

  Linear proj, out_proj;
  int64_t num_heads;
  double dropout_p;
  uint64_t dropout_seed = 0;
};

// The levels with weights of their own, as one state dict (V2 is built from V1).
class AttentionLevels : public mha::nn::Module<float> {
 public:
  mha::Generator gen{0};
  SelfAttentionV1 v1{kHidden, gen};
  SelfAttentionV3 v3{kHidden, kDropout, gen};
  SelfAttentionV4 v4{kMultiHidden, kNumHeads, kDropout, gen};

  Parameters parameters() override {
    Parameters out;
    append_prefixed(out, v1.parameters(), "v1");
    append_prefixed(out, v3.parameters(), "v3");
    append_prefixed(out, v4.parameters(), "v4");
    return out;
  }
};

// Standard normal, like the tutorial's torch.randn.
Tensor<float> random_input(const Shape& shape, mha::Generator& gen) {
  Tensor<float> x(shape);
  for (auto& value : x.values()) value = static_cast<float>(gen.normal());
  return x;
}

// ---- The plain formula, in double ----

Tensor<double> as_double(const Tensor<float>& x) { return mha::cast<double>(x); }

// y = x W[rows]ᵀ + b[rows] over the last dimension, for the weight rows [row0, row0 + count):
// one of the q, k, v blocks of a fused weight, or all of an ordinary one.
Tensor<double> plain_linear(const Tensor<double>& x, const Linear& layer, int64_t row0, int64_t count) {
  const int64_t in = layer.in_features(), rows = x.numel() / in;
  Shape shape = x.shape();
  shape.back() = count;
  Tensor<double> y(shape);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < count; ++o) {
      double sum = layer.bias[row0 + o];
      for (int64_t i = 0; i < in; ++i)
        sum += x[r * in + i] * static_cast<double>(layer.weight[(row0 + o) * in + i]);
      y[r * count + o] = sum;
    }
  return y;
}

Tensor<double> plain_linear(const Tensor<double>& x, const Linear& layer) {
  return plain_linear(x, layer, 0, layer.out_features());
}

// Per head h of size d: softmax(q_h k_hᵀ / sqrt(d), −inf where attention_mask == 0) v_h, on
// (B, L, H·d) projections. With `weights` (B, H, L, L) given, uses those instead of the softmax
// (to check a training-mode result whose weights went through dropout).
Tensor<double> plain_attention(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                               int64_t heads, const Tensor<int64_t>* attention_mask,
                               const Tensor<float>* weights = nullptr) {
  const int64_t B = q.size(0), L = q.size(1), width = q.size(2), d = width / heads;
  Tensor<double> out({B, L, width});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> p(static_cast<size_t>(L));
        for (int64_t j = 0; j < L; ++j) {
          const double s = plain::dot(&q[(b * L + i) * width + h * d], &k[(b * L + j) * width + h * d], d);
          const bool blocked = attention_mask && (*attention_mask)[(b * L + i) * L + j] == 0;
          p[static_cast<size_t>(j)] =
              blocked ? -std::numeric_limits<double>::infinity() : s / std::sqrt(double(d));
        }
        plain::softmax(p);
        for (int64_t j = 0; j < L; ++j) {
          const double w = weights ? (*weights)[((b * heads + h) * L + i) * L + j] : p[static_cast<size_t>(j)];
          for (int64_t c = 0; c < d; ++c)
            out[(b * L + i) * width + h * d + c] += w * v[(b * L + j) * width + h * d + c];
        }
      }
  return out;
}

// The fused q, k, v of `proj` (rows 0, hidden, 2·hidden), in double.
std::array<Tensor<double>, 3> plain_qkv(const Tensor<double>& x, const Linear& proj) {
  const int64_t hidden = proj.in_features();
  return {plain_linear(x, proj, 0, hidden), plain_linear(x, proj, hidden, hidden),
          plain_linear(x, proj, 2 * hidden, hidden)};
}

double max_abs_diff(const Tensor<float>& a, const Tensor<float>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

// max |ours − expected| ≤ 1e-5 · max(1, max |expected|): float32 against double through sums of
// up to 64 products is a few float epsilons of the magnitude. Prints the comparison.
bool check(const char* what, const Tensor<float>& ours, const Tensor<double>& expected) {
  double max_error = 0, max_value = 0;
  for (int64_t i = 0; i < ours.numel(); ++i) {
    max_error = std::max(max_error, std::abs(ours[i] - expected[i]));
    max_value = std::max(max_value, std::abs(expected[i]));
  }
  const bool ok = max_error <= 1e-5 * std::max(1.0, max_value);
  std::printf("  check: %-42s max |mha - formula| = %.3g (max |value| %.3g): %s\n", what, max_error,
              max_value, ok ? "OK" : "MISMATCH");
  return ok;
}

// The mean over query rows of the largest attention weight: 1/L for uniform attention, 1 when
// each query looks at one key.
double mean_peak_weight(const Tensor<float>& weights) {
  const int64_t L = weights.size(-1), rows = weights.numel() / L;
  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    total += *std::max_element(weights.data() + r * L, weights.data() + (r + 1) * L);
  return total / static_cast<double>(rows);
}

}  // namespace

int main(int argc, char** argv) {
  const char* description =
      "The four levels of self-attention: V1 separate, V2 fused, V3 masked with dropout, V4 multi-head.";
  return mha::examples::example_main(argc, argv, description, /*draws=*/false, [](const auto& files) {
    AttentionLevels model;
    files.load_weights(model);
    model.v3.eval();
    model.v4.eval();
    mha::Generator gen{3};
    const Tensor<float> x = files.input("x", random_input({kBatch, kSeqLen, kHidden}, gen));
    const Tensor<float> x_multihead =
        files.input("x_multihead", random_input({kMultiBatch, kMultiSeqLen, kMultiHidden}, gen));
    const Tensor<double> x64 = as_double(x), x_multihead64 = as_double(x_multihead);
    bool ok = true;

    // V1: three projections, one head of size hidden.
    std::printf("V1: separate q, k, v projections, softmax(q k^T / sqrt(%lld)) v\n",
                static_cast<long long>(kHidden));
    const Tensor<float> v1_output = model.v1.forward(x);
    print_shape("x (B, L, hidden)", x.shape());
    print_shape("q, k, v = query/key/value_proj(x) (B, L, hidden)", x.shape());
    print_shape("weights softmax(q k^T / sqrt(hidden)) (B, L, L)", {kBatch, kSeqLen, kSeqLen});
    print_shape("output weights * v (B, L, hidden)", v1_output.shape());
    ok &= check("V1 output", v1_output,
                plain_attention(plain_linear(x64, model.v1.query_proj), plain_linear(x64, model.v1.key_proj),
                                plain_linear(x64, model.v1.value_proj), 1, nullptr));

    // V2: the same three projections as one matrix product.
    std::printf("\nV2: one fused projection Linear(%lld, %lld), split into q, k, v\n",
                static_cast<long long>(kHidden), static_cast<long long>(3 * kHidden));
    const SelfAttentionV2 v2 = SelfAttentionV2::fused_from(model.v1);
    const Tensor<float> v2_output = v2.forward(x);
    print_shape("qkv = proj(x) (B, L, 3*hidden)", {kBatch, kSeqLen, 3 * kHidden});
    print_shape("q, k, v = split(qkv, hidden, dim=-1) (B, L, hidden)", x.shape());
    print_shape("output (B, L, hidden)", v2_output.shape());
    const double v1_v2_difference = max_abs_diff(v1_output, v2_output);
    // The same dot products in the same order, so equal up to the GEMM's blocking.
    const bool v2_ok = v1_v2_difference <= 1e-6;
    std::printf("  V2 with V1's weights stacked: max |V1 - V2| = %.3g: %s\n", v1_v2_difference,
                v2_ok ? "the same" : "MISMATCH");
    ok &= v2_ok;

    // V3: attention_mask and dropout on the attention weights.
    std::vector<int64_t> lengths(kLengths.begin(), kLengths.end());
    const Tensor<int64_t> attention_mask = padding_attention_mask(kSeqLen, lengths);
    std::printf("\nV3: attention_mask (0 = blocked) and dropout p = %.1f on the attention weights\n",
                kDropout);
    std::printf("  attention_mask rows of each sequence (the tutorial's [[1,1,1,0],[1,1,0,0],[1,0,0,0]]):\n");
    for (int64_t b = 0; b < kBatch; ++b) {
      std::printf("   ");
      for (int64_t j = 0; j < kSeqLen; ++j)
        std::printf(" %lld", static_cast<long long>(attention_mask[b * kSeqLen * kSeqLen + j]));
      std::printf("\n");
    }
    const Attended v3_eval = model.v3.forward(x, attention_mask);
    print_shape("attention_mask (B, L) repeated to (B, L, L)", attention_mask.shape());
    print_shape("weights, masked keys 0 (B, 1, L, L)", v3_eval.weights.shape());
    print_shape("output (B, L, hidden)", v3_eval.output.shape());
    const auto qkv3 = plain_qkv(x64, model.v3.proj);
    ok &= check("V3 output, eval (no dropout)", v3_eval.output,
                plain_attention(qkv3[0], qkv3[1], qkv3[2], 1, &attention_mask));

    model.v3.train();
    model.v3.dropout_seed = 7;
    const Attended v3_train = model.v3.forward(x, attention_mask);
    const Attended v3_train_again = model.v3.forward(x, attention_mask);
    model.v3.dropout_seed = 8;
    const Attended v3_train_other_seed = model.v3.forward(x, attention_mask);
    model.v3.eval();
    // Every training weight is either dropped (0) or the eval weight scaled by 1/(1 − p).
    int64_t dropped = 0, attended = 0;
    double survivor_error = 0;
    for (int64_t i = 0; i < v3_eval.weights.numel(); ++i) {
      if (v3_eval.weights[i] == 0) continue;  // masked key
      ++attended;
      if (v3_train.weights[i] == 0)
        ++dropped;
      else
        survivor_error =
            std::max(survivor_error, std::abs(v3_train.weights[i] - v3_eval.weights[i] / (1 - kDropout)));
    }
    const double same_seed = max_abs_diff(v3_train.output, v3_train_again.output);
    const double other_seed = max_abs_diff(v3_train.output, v3_train_other_seed.output);
    std::printf(
        "  training, seed 7: %lld of %lld unmasked weights dropped, survivors = eval weight / (1 - p) "
        "within %.2g\n",
        static_cast<long long>(dropped), static_cast<long long>(attended), survivor_error);
    std::printf("  training, seed 7 again: max difference %.3g (reproducible); seed 8: %.3g (another mask)\n",
                same_seed, other_seed);
    const bool dropout_ok = dropped > 0 && survivor_error <= 1e-6 && same_seed == 0 && other_seed > 0;
    ok &= dropout_ok;
    ok &= check("V3 output, training = dropped weights * v", v3_train.output,
                plain_attention(qkv3[0], qkv3[1], qkv3[2], 1, &attention_mask, &v3_train.weights));

    // V4: multi-head.
    const int64_t head_dim = kMultiHidden / kNumHeads;
    std::vector<int64_t> multi_lengths(kMultiLengths.begin(), kMultiLengths.end());
    const Tensor<int64_t> multi_mask = padding_attention_mask(kMultiSeqLen, multi_lengths);
    std::printf("\nV4: %lld heads of size %lld, scale 1/sqrt(head_dim) = 1/sqrt(%lld), out_proj\n",
                static_cast<long long>(kNumHeads), static_cast<long long>(head_dim),
                static_cast<long long>(head_dim));
    const Attended v4 = model.v4.forward(x_multihead, multi_mask);
    print_shape("x (B, L, hidden)", x_multihead.shape());
    print_shape("qkv = proj(x) (B, L, 3*hidden)", {kMultiBatch, kMultiSeqLen, 3 * kMultiHidden});
    print_shape("q, k, v split into heads (B, H, L, head_dim)",
                {kMultiBatch, kNumHeads, kMultiSeqLen, head_dim});
    print_shape("attention_mask (B, L, L)", multi_mask.shape());
    print_shape("attention_mask.unsqueeze(1) (B, 1, L, L)", {kMultiBatch, 1, kMultiSeqLen, kMultiSeqLen});
    print_shape("weights (B, H, L, L)", v4.weights.shape());
    print_shape("heads transposed and merged (B, L, hidden)", x_multihead.shape());
    print_shape("output = out_proj(merged) (B, L, hidden)", v4.output.shape());
    const auto qkv4 = plain_qkv(x_multihead64, model.v4.proj);
    ok &= check(
        "V4 output", v4.output,
        plain_linear(plain_attention(qkv4[0], qkv4[1], qkv4[2], kNumHeads, &multi_mask), model.v4.out_proj));

    // The tutorial's 1/sqrt(hidden) makes every head's scores sqrt(H) times too small, so its
    // softmax is flatter than the formula's.
    const Attended v4_tutorial_scale =
        model.v4.forward(x_multihead, multi_mask, 1.0 / std::sqrt(static_cast<double>(kMultiHidden)));
    std::printf(
        "  with the tutorial's 1/sqrt(hidden) = 1/sqrt(%lld): max |output difference| = %.3g, mean largest "
        "weight per query %.3f instead of %.3f\n",
        static_cast<long long>(kMultiHidden), max_abs_diff(v4.output, v4_tutorial_scale.output),
        mean_peak_weight(v4_tutorial_scale.weights), mean_peak_weight(v4.weights));

    files.save({{"v1_output", v1_output},
                {"v2_output", v2_output},
                {"v3_output_eval", v3_eval.output},
                {"v4_output", v4.output}});
    std::printf("\n%s\n", ok ? "All checks passed." : "SOME CHECKS FAILED.");
    return ok ? 0 : 1;
  });
}
