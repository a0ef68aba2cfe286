#pragma once
// The random attention problems the backend tests share (cpu_flash_test, decode_test): a case's
// shapes and options, its inputs (normal values, masks of every kind and broadcast shape), a run
// on one backend, and the error measure of the FlashAttention rule.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "mha/attention/attention.h"
#include "mha/core/random.h"

namespace mha::attention::test_cases {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Masks of the sweep: which tensors are given and the shape they broadcast from.
enum class MaskKind {
  none,
  bool_full,        // attend_mask (B, Hq, L, S)
  bool_2d,          // attend_mask (L, S)
  bool_keys,        // attend_mask (S): 1-D, broadcast over everything else
  bool_padding,     // attend_mask (B, 1, 1, S): key padding
  additive_2d,      // additive_mask (L, S) with some −inf
  additive_heads,   // additive_mask (Hq, 1, S)
  both,             // additive (B, 1, L, S) and attend (L, S)
  count
};

struct Case {
  int64_t batch = 1, q_heads = 2, kv_heads = 1, q_len = 7, k_len = 7, qk_dim = 8, v_dim = 8;
  MaskKind mask = MaskKind::none;
  Causal causal = Causal::none;
  double dropout = 0.0;
  std::optional<double> scale;
  bool need_weights = false;

  std::string describe() const {
    return "B" + std::to_string(batch) + " Hq" + std::to_string(q_heads) + " Hkv" + std::to_string(kv_heads) + " L" +
           std::to_string(q_len) + " S" + std::to_string(k_len) + " Dqk" + std::to_string(qk_dim) + " Dv" +
           std::to_string(v_dim) + " mask " + std::to_string(static_cast<int>(mask)) + " causal " +
           std::to_string(static_cast<int>(causal)) + " dropout " + std::to_string(dropout) +
           (scale ? " scale " + std::to_string(*scale) : "");
  }
};

inline Tensor<float> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<float> t(shape);
  for (auto& x : t.values()) x = static_cast<float>(gen.normal());
  return t;
}

// The inputs of one case, in float (what flash and ref32 see) and the masks as float tensors.
struct Inputs {
  Tensor<float> q, k, v, dout;
  std::optional<Tensor<bool>> attend;
  std::optional<Tensor<float>> additive;
};

inline Inputs make_inputs(const Case& c, uint64_t seed) {
  Generator gen(seed);
  Inputs in;
  in.q = random_tensor({c.batch, c.q_heads, c.q_len, c.qk_dim}, gen);
  in.k = random_tensor({c.batch, c.kv_heads, c.k_len, c.qk_dim}, gen);
  in.v = random_tensor({c.batch, c.kv_heads, c.k_len, c.v_dim}, gen);
  in.dout = random_tensor({c.batch, c.q_heads, c.q_len, c.v_dim}, gen);
  const int64_t B = c.batch, H = c.q_heads, L = c.q_len, S = c.k_len;
  auto attend = [&](Shape shape) {
    Tensor<bool> m(std::move(shape));
    for (auto& x : m.values()) x = gen.uniform() > 0.3;
    return m;
  };
  auto additive = [&](Shape shape) {
    Tensor<float> m(std::move(shape));
    for (auto& x : m.values()) x = gen.uniform() < 0.15 ? -kInf : static_cast<float>(gen.normal(0.0, 0.5));
    return m;
  };
  switch (c.mask) {
    case MaskKind::none: break;
    case MaskKind::bool_full: in.attend = attend({B, H, L, S}); break;
    case MaskKind::bool_2d: in.attend = attend({L, S}); break;
    case MaskKind::bool_keys: in.attend = attend({S}); break;
    case MaskKind::bool_padding: in.attend = attend({B, 1, 1, S}); break;
    case MaskKind::additive_2d: in.additive = additive({L, S}); break;
    case MaskKind::additive_heads: in.additive = additive({H, 1, S}); break;
    case MaskKind::both:
      in.additive = additive({B, 1, L, S});
      in.attend = attend({L, S});
      break;
    case MaskKind::count: break;
  }
  return in;
}

template <class T>
struct Results {
  ForwardResult<T> fwd;
  Gradients<T> grads;
};

template <class T>
Results<T> run(const Case& c, const Inputs& in, Backend backend) {
  const Tensor<T> q = mha::cast<T>(in.q), k = mha::cast<T>(in.k), v = mha::cast<T>(in.v), dout = mha::cast<T>(in.dout);
  std::optional<Tensor<T>> additive;
  if (in.additive) additive = mha::cast<T>(*in.additive);
  Options<T> opt;
  if (in.attend) opt.attend_mask = *in.attend;
  if (additive) opt.additive_mask = *additive;
  opt.causal = c.causal;
  opt.scale = c.scale;
  opt.dropout_p = c.dropout;
  opt.dropout_seed = 1234;
  opt.need_weights = c.need_weights;
  opt.backend = backend;
  ForwardResult<T> fwd = sdpa_forward(q, k, v, opt);
  Gradients<T> grads = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
  return {std::move(fwd), std::move(grads)};
}

// max |a − b| where equal infinities and NaN against NaN count as 0 and a NaN on one side only
// as infinite.
template <class A, class B>
double max_diff(const Tensor<A>& a, const Tensor<B>& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    const double d = std::abs(x - y);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

}  // namespace mha::attention::test_cases
