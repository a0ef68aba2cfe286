#pragma once
// The random attention problems the backend tests share (cpu_flash_test, decode_test): a case's
// shapes and options, its inputs (normal values, masks of every kind and broadcast shape), a run
// on one backend, and the error measure of the FlashAttention rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
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

// The case's options on `backend`; `additive` keeps the mask in T alive for the call.
template <class T>
Options<T> options_of(const Case& c, const Inputs& in, Backend backend, std::optional<Tensor<T>>& additive) {
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
  return opt;
}

template <class T>
ForwardResult<T> run_forward(const Case& c, const Inputs& in, Backend backend) {
  std::optional<Tensor<T>> additive;
  const Options<T> opt = options_of<T>(c, in, backend, additive);
  return sdpa_forward(mha::cast<T>(in.q), mha::cast<T>(in.k), mha::cast<T>(in.v), opt);
}

template <class T>
Results<T> run(const Case& c, const Inputs& in, Backend backend) {
  const Tensor<T> q = mha::cast<T>(in.q), k = mha::cast<T>(in.k), v = mha::cast<T>(in.v), dout = mha::cast<T>(in.dout);
  std::optional<Tensor<T>> additive;
  const Options<T> opt = options_of<T>(c, in, backend, additive);
  ForwardResult<T> fwd = sdpa_forward(q, k, v, opt);
  Gradients<T> grads = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
  return {std::move(fwd), std::move(grads)};
}

// The sweeps' variety: masks, causality, GQA heads, dropout and scale cycle with the case number,
// so that each appears with short, ragged and long sequences.
inline void vary_options(Case& c, int case_number, const std::pair<int64_t, int64_t>* heads, int head_choices) {
  c.batch = 1 + case_number % 2;
  std::tie(c.q_heads, c.kv_heads) = heads[case_number % head_choices];
  c.mask = static_cast<MaskKind>(case_number % static_cast<int>(MaskKind::count));
  c.causal = static_cast<Causal>(case_number % 3);
  if (case_number % 5 == 2) c.dropout = 0.2;
  if (case_number % 7 == 3) c.scale = 0.3;
  if (case_number % 7 == 6) c.scale = -0.5;
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

// FlashAttention's rule for a fast backend: on the same float inputs, its error against the
// reference in double is at most twice the float reference's, + 1e-6 (`scaled`: + 1e-6 of the
// largest reference value, as python/tests/test_torch.py has it, for values far from 1). Keeps
// the largest error / allowed seen, for the report.
struct FlashRule {
  const char* backend;
  bool scaled = false;
  double worst_fraction = 0;

  template <class F>
  void expect(const Tensor<F>& got, const Tensor<F>& ref32, const Tensor<double>& ref64, const std::string& what) {
    ASSERT_EQ(got.shape(), ref64.shape()) << what;
    const double error = max_diff(got, ref64), ref_error = max_diff(ref32, ref64);
    double largest = 1;
    if (scaled)
      for (double x : ref64.values()) largest = std::max(largest, std::abs(x));
    const double allowed = 2 * ref_error + 1e-6 * largest;
    EXPECT_LE(error, allowed) << what << ": " << backend << " error " << error << ", float reference error "
                              << ref_error;
    worst_fraction = std::max(worst_fraction, error / allowed);
  }
};

}  // namespace mha::attention::test_cases
