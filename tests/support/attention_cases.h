#pragma once
// The one description of a random attention problem that the attention tests share (the backend
// sweeps, the reference's gradient checks, whole-call blocks, views, per-sequence lengths and the
// context-parallel schemes): a case's shapes, its mask kind, its Scoring and need_weights; its
// inputs (normal values, masks of every kind and broadcast shape), a run on one backend, the
// error measure, the FlashAttention rule and the reference's results it holds a fast backend to
// (computed once for a case checked on every SIMD target), and the sweep the fast backends share.
// A test with further axes (a backend, a scheme, a layout) wraps a Case in a struct of its own.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "max_diff.h"
#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/core/simd.h"
#include "mha/core/view.h"

namespace mha::attention::test_cases {

using mha::testing::max_diff;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Masks: which tensors are given, the shape they broadcast from, and how they are drawn.
enum class MaskKind {
  none,
  bool_full,               // attend_mask (B, Hq, L, S)
  bool_2d,                 // attend_mask (L, S)
  bool_keys,               // attend_mask (S): 1-D, broadcast over everything else
  bool_padding,            // attend_mask (B, 1, 1, S), random
  additive_2d,             // additive_mask (L, S) with some −inf
  additive_heads,          // additive_mask (Hq, 1, S)
  both,                    // additive (B, 1, L, S) and attend (L, S)
  // (The sweeps cycle through the kinds above; those below are shapes and fills other tests need.)
  bool_batch,              // attend_mask (B, 1, L, S)
  bool_batch_additive_2d,  // attend (B, 1, L, S) and additive (L, S)
  bool_keys_additive_2d,   // attend (S) and additive (L, S)
  key_padding,             // attend_mask (B, 1, 1, S): the last 3·(b + 1) keys of sequence b hidden
  empty_rows,              // attend_mask (B, 1, L, S): rows i % 5 == 2 see no key, others some
  additive_full,           // additive_mask (B, Hq, L, S)
  count
};

inline const char* name_of(MaskKind m) {
  static const char* const names[] = {"none",          "bool_full",   "bool_2d",
                                      "bool_keys",     "bool_padding", "additive_2d",
                                      "additive_heads", "both",        "bool_batch",
                                      "bool_batch_additive_2d", "bool_keys_additive_2d", "key_padding",
                                      "empty_rows",    "additive_full"};
  static_assert(std::size(names) == static_cast<size_t>(MaskKind::count));
  const auto i = static_cast<size_t>(m);
  return i < std::size(names) ? names[i] : "?";
}

inline const char* name_of(Causal c) {
  switch (c) {
    case Causal::none: return "none";
    case Causal::top_left: return "top_left";
    case Causal::bottom_right: return "bottom_right";
  }
  return "?";
}

inline const char* name_of(Backend b) {
  switch (b) {
    case Backend::automatic: return "automatic";
    case Backend::reference: return "reference";
    case Backend::cpu_flash: return "cpu_flash";
    case Backend::decode: return "decode";
  }
  return "?";
}

// One settings field as text: Causal by name, an absent optional as "default", other enums as
// their number, numbers as C++ prints them.
template <class V>
std::string field_text(const V& v) {
  if constexpr (std::is_same_v<V, Causal>) {
    return name_of(v);
  } else if constexpr (requires { v.has_value(); *v; }) {
    return v.has_value() ? field_text(*v) : "default";
  } else if constexpr (std::is_same_v<V, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_enum_v<V>) {
    return std::to_string(static_cast<long long>(static_cast<std::underlying_type_t<V>>(v)));
  } else {
    std::ostringstream out;
    out << v;
    return out.str();
  }
}

// " name=value" for every Scoring field, by its list (for_each_field: WholeCall's as
// "outer.inner=value").
inline void describe_fields(const mha::attention::Scoring& settings, std::string& out) {
  mha::attention::for_each_field(settings, [&](const std::string& name, const auto& value) {
    out += " " + name + "=" + field_text(value);
  });
}

// Options<T>'s per-head views: ALiBi slopes absent, (Hq) or (B, Hq).
enum class Slopes { none, heads, batch_heads };

struct Case {
  int64_t batch = 1, q_heads = 2, kv_heads = 1, q_len = 7, k_len = 7, qk_dim = 8, v_dim = 8;
  MaskKind mask = MaskKind::none;
  Scoring scoring{.dropout_seed = 1234};
  bool need_weights = false;
  bool sinks = false;  // Options::sinks, one logit per query head
  Slopes alibi = Slopes::none;
  bool left_padded = false;  // Options::key_starts, sequence b's keys from a start drawn in [-S - 1, S]

  // The shapes, the mask and every Scoring field (so a new field shows in every test's trace).
  std::string describe() const {
    std::string s = "B" + std::to_string(batch) + " Hq" + std::to_string(q_heads) + " Hkv" + std::to_string(kv_heads) +
                    " L" + std::to_string(q_len) + " S" + std::to_string(k_len) + " Dqk" + std::to_string(qk_dim) +
                    " Dv" + std::to_string(v_dim) + " mask " + name_of(mask);
    describe_fields(scoring, s);
    if (need_weights) s += " need_weights";
    if (sinks) s += " sinks";
    if (alibi != Slopes::none) s += alibi == Slopes::heads ? " alibi(Hq)" : " alibi(B,Hq)";
    if (left_padded) s += " key_starts";
    return s;
  }
};

// A case of the given shapes, the rest default.
inline Case sized(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t q_len, int64_t k_len, int64_t qk_dim,
                  int64_t v_dim) {
  Case c;
  std::tie(c.batch, c.q_heads, c.kv_heads, c.q_len, c.k_len, c.qk_dim, c.v_dim) =
      std::tuple(batch, q_heads, kv_heads, q_len, k_len, qk_dim, v_dim);
  return c;
}

inline Tensor<float> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<float> t(shape);
  for (auto& x : t.values()) x = static_cast<float>(gen.normal());
  return t;
}

// The inputs of one case, in float (what flash and ref32 see) and the masks as float tensors.
struct Inputs {
  Tensor<float> q, k, v, dout;
  std::optional<Tensor<bool>> attend;
  std::optional<Tensor<float>> additive, sinks, alibi_slopes;
  std::optional<Tensor<int64_t>> key_starts;
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
    case MaskKind::bool_batch: in.attend = attend({B, 1, L, S}); break;
    case MaskKind::bool_batch_additive_2d:
      in.attend = attend({B, 1, L, S});
      in.additive = additive({L, S});
      break;
    case MaskKind::bool_keys_additive_2d:
      in.attend = attend({S});
      in.additive = additive({L, S});
      break;
    case MaskKind::key_padding:
      in.attend = Tensor<bool>({B, 1, 1, S});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < S; ++j) (*in.attend)[b * S + j] = j < S - 3 * (b + 1);
      break;
    case MaskKind::empty_rows:
      in.attend = attend({B, 1, L, S});
      for (int64_t i = 0; i < in.attend->numel(); ++i)
        if ((i / S) % L % 5 == 2) (*in.attend)[i] = false;
      break;
    case MaskKind::additive_full: in.additive = additive({B, H, L, S}); break;
    case MaskKind::count: break;
  }
  // Sinks around the scores' size (normal, spread 2), one of them −inf (no sink) when there are
  // several heads; ALiBi slopes in (0, 1) as Bloom's 2^(−8h/H) are, one negative.
  if (c.sinks) {
    in.sinks = random_tensor({H}, gen);
    for (auto& x : in.sinks->values()) x *= 2;
    if (H > 2) (*in.sinks)[1] = -kInf;
  }
  if (c.alibi != Slopes::none) {
    in.alibi_slopes = Tensor<float>(c.alibi == Slopes::heads ? Shape{H} : Shape{B, H});
    for (auto& x : in.alibi_slopes->values()) x = static_cast<float>(gen.uniform());
    (*in.alibi_slopes)[0] = -0.25f;
  }
  // Left padding: the first sequence's keys start a third of the way in, the second began d + 1
  // keys before the call (a negative start, d drawn in [0, S]), the others anywhere in [0, S] (S:
  // a sequence of padding alone).
  if (c.left_padded) {
    in.key_starts = Tensor<int64_t>(Shape{B});
    for (int64_t b = 0; b < B; ++b) {
      const int64_t d = b == 0 ? S / 3 : std::min<int64_t>(S, static_cast<int64_t>(gen.uniform() * (S + 1)));
      (*in.key_starts)[b] = b == 1 ? -d - 1 : d;
    }
  }
  return in;
}

template <class T>
struct Results {
  ForwardResult<T> fwd;
  Gradients<T> grads;
};

// The inputs' tensors in T that the options view (the additive mask, sinks, slopes), kept alive for
// the call.
template <class T>
struct Held {
  std::optional<Tensor<T>> additive, sinks, alibi_slopes;
};

// The case's options on `backend`, viewing `held`.
template <class T>
Options<T> options_of(const Case& c, const Inputs& in, Backend backend, Held<T>& held) {
  auto hold = [](const std::optional<Tensor<float>>& from, std::optional<Tensor<T>>& to) {
    to.reset();
    if (from) to = mha::cast<T>(*from);
  };
  hold(in.additive, held.additive);
  hold(in.sinks, held.sinks);
  hold(in.alibi_slopes, held.alibi_slopes);
  Options<T> opt;
  static_cast<Scoring&>(opt) = c.scoring;
  if (in.attend) opt.attend_mask = *in.attend;
  if (held.additive) opt.additive_mask = *held.additive;
  if (held.sinks) opt.sinks = *held.sinks;
  if (held.alibi_slopes) opt.alibi_slopes = *held.alibi_slopes;
  if (in.key_starts) opt.key_starts = *in.key_starts;
  opt.need_weights = c.need_weights;
  opt.backend = backend;
  return opt;
}

template <class T>
ForwardResult<T> run_forward(const Case& c, const Inputs& in, Backend backend) {
  Held<T> held;
  const Options<T> opt = options_of<T>(c, in, backend, held);
  return sdpa_forward(mha::cast<T>(in.q), mha::cast<T>(in.k), mha::cast<T>(in.v), opt);
}

template <class T>
Results<T> run(const Case& c, const Inputs& in, Backend backend) {
  const Tensor<T> q = mha::cast<T>(in.q), k = mha::cast<T>(in.k), v = mha::cast<T>(in.v), dout = mha::cast<T>(in.dout);
  Held<T> held;
  const Options<T> opt = options_of<T>(c, in, backend, held);
  ForwardResult<T> fwd = sdpa_forward(q, k, v, opt);
  Gradients<T> grads = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
  return {std::move(fwd), std::move(grads)};
}

// The sweeps' variety: masks (none to both), causality, GQA heads, dropout, scale, sliding
// windows, soft-caps, chunks, sinks, ALiBi slopes and left padding cycle with the case number, so that each appears with short, ragged and long sequences.
inline void vary_options(Case& c, int case_number, const std::pair<int64_t, int64_t>* heads, int head_choices) {
  c.batch = 1 + case_number % 2;
  std::tie(c.q_heads, c.kv_heads) = heads[case_number % head_choices];
  c.mask = static_cast<MaskKind>(case_number % (static_cast<int>(MaskKind::both) + 1));
  c.scoring.causal = static_cast<Causal>(case_number % 3);
  if (case_number % 5 == 2) c.scoring.dropout_p = 0.2;
  if (case_number % 7 == 3) c.scoring.scale = 0.3;
  if (case_number % 7 == 6) c.scoring.scale = -0.5;
  // Sliding windows: one-sided, two-sided (the right side counts without causality), one key.
  if (case_number % 11 == 4) c.scoring.window_left = 37;
  if (case_number % 11 == 7) {
    c.scoring.window_left = 300;
    c.scoring.window_right = 5;
  }
  if (case_number % 11 == 9) c.scoring.window_left = c.scoring.window_right = 0;
  // Soft-cap (one tight enough to bend most scores), sinks, ALiBi of both shapes.
  if (case_number % 13 == 5) c.scoring.softcap = 1.5;
  if (case_number % 13 == 10) c.scoring.softcap = 30;
  c.sinks = case_number % 4 == 1;
  if (case_number % 9 == 2) c.alibi = Slopes::heads;
  if (case_number % 9 == 6) c.alibi = Slopes::batch_heads;
  // Chunks (Llama 4's): shorter than a tile and longer; left padding, alone and under them.
  if (case_number % 17 == 8) c.scoring.chunk_size = 40;
  if (case_number % 17 == 13) c.scoring.chunk_size = 5;
  c.left_padded = case_number % 19 == 6 || case_number % 17 == 13;
}

// A contiguous copy of a view (any strides).
template <class T>
Tensor<std::remove_const_t<T>> copy_of(View<T> v) {
  Tensor<std::remove_const_t<T>> t(v.shape());
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t offset = 0, rest = i;
    for (int64_t a = v.dim() - 1; a >= 0; --a) {
      offset += (rest % v.size(a)) * v.stride(a);
      rest /= v.size(a);
    }
    t[i] = v.data()[offset];
  }
  return t;
}

template <class T>
bool bitwise_equal(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<size_t>(a.numel())) == 0;
}

// run() on one thread, then on 2, 3 (an odd count) and 8 (more than kFewestTasks' chunks and
// than the cores), the thread count restored after; same(first, later) checks each later result
// against the first: for the tests that every result is the same bits for any thread count.
template <class Run, class Same>
void on_thread_counts(Run&& run, Same&& same) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run();
  for (int n : {2, 3, 8}) {
    SCOPED_TRACE(std::to_string(n) + " threads");
    omp_set_num_threads(n);
    same(one, run());
  }
  omp_set_num_threads(threads);
}

// Every output and gradient of two runs bit for bit (threads counts, blocks against the whole).
template <class T>
void expect_bitwise(const Results<T>& a, const Results<T>& b) {
  EXPECT_TRUE(bitwise_equal(a.fwd.output, b.fwd.output)) << "output";
  EXPECT_TRUE(bitwise_equal(a.fwd.logsumexp, b.fwd.logsumexp)) << "logsumexp";
  EXPECT_TRUE(bitwise_equal(a.grads.grad_query, b.grads.grad_query)) << "grad_query";
  EXPECT_TRUE(bitwise_equal(a.grads.grad_key, b.grads.grad_key)) << "grad_key";
  EXPECT_TRUE(bitwise_equal(a.grads.grad_value, b.grads.grad_value)) << "grad_value";
  EXPECT_EQ(a.grads.grad_sinks.has_value(), b.grads.grad_sinks.has_value());
  if (a.grads.grad_sinks && b.grads.grad_sinks) EXPECT_TRUE(bitwise_equal(*a.grads.grad_sinks, *b.grads.grad_sinks));
}

// Every result of run() the same bits on 1, 2, 3 and 8 threads.
template <class Run>
void expect_bitwise_on_thread_counts(Run&& run) {
  on_thread_counts(run, [](const auto& one, const auto& other) { expect_bitwise(one, other); });
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

// The reference on one case's inputs (make_inputs(c, seed)), in float and double: what a fast
// backend is held to. With `backward` the gradients too (cpu_flash's check), else the forward
// alone (decode's: grads left empty). The reference runs no SIMD-dispatched code (plain loops on
// float and double), so its results are the same on every SIMD target: a sweep over the targets
// computes them once per case and seed.
struct Reference {
  Inputs in;
  bool backward = true;
  Results<float> ref32;
  Results<double> ref64;
};

inline Reference reference_of(const Case& c, uint64_t seed, bool backward) {
  Reference r{make_inputs(c, seed), backward, {}, {}};
  if (backward) {
    r.ref32 = run<float>(c, r.in, Backend::reference);
    r.ref64 = run<double>(c, r.in, Backend::reference);
  } else {
    r.ref32.fwd = run_forward<float>(c, r.in, Backend::reference);
    r.ref64.fwd = run_forward<double>(c, r.in, Backend::reference);
  }
  return r;
}

// A fast backend (cpu_flash or decode) on one case against the reference in float and double
// (`ref`, on the same inputs), under `rule`: the output and logsumexp, the weights when asked for,
// and (but for decode, a forward kernel whose backward is cpu_flash's) the three gradients.
inline void check_against_reference(Backend backend, const Case& c, const Reference& ref, FlashRule& rule) {
  SCOPED_TRACE(std::string(name_of(backend)) + " " + c.describe());
  const Results<float>& ref32 = ref.ref32;
  const Results<double>& ref64 = ref.ref64;
  if (backend == Backend::decode) {
    const ForwardResult<float> got = run_forward<float>(c, ref.in, backend);
    rule.expect(got.output, ref32.fwd.output, ref64.fwd.output, "output");
    rule.expect(got.logsumexp, ref32.fwd.logsumexp, ref64.fwd.logsumexp, "logsumexp");
    return;
  }
  ASSERT_TRUE(ref.backward) << "the reference's gradients were not computed";
  const Results<float> got = run<float>(c, ref.in, backend);
  rule.expect(got.fwd.output, ref32.fwd.output, ref64.fwd.output, "output");
  rule.expect(got.fwd.logsumexp, ref32.fwd.logsumexp, ref64.fwd.logsumexp, "logsumexp");
  rule.expect(got.grads.grad_query, ref32.grads.grad_query, ref64.grads.grad_query, "grad_query");
  rule.expect(got.grads.grad_key, ref32.grads.grad_key, ref64.grads.grad_key, "grad_key");
  rule.expect(got.grads.grad_value, ref32.grads.grad_value, ref64.grads.grad_value, "grad_value");
  // grad_sinks is a sum over all B·L rows of each head: two float backends' errors there are two
  // random walks, whose ratio is noisy for Hq <= 4 elements (cpu_flash / float reference, one
  // sweep case over 8 seeds: 1.0, 0.71, 1.0, 1.0, 1.63, 0.58, 1.0, 2.05), so it takes the rule's
  // form for values far from 1 (+ 1e-6 of the largest, as python/tests/test_torch.py).
  if (c.sinks) {
    FlashRule sums{rule.backend, true};
    sums.expect(*got.grads.grad_sinks, *ref32.grads.grad_sinks, *ref64.grads.grad_sinks, "grad_sinks");
    rule.worst_fraction = std::max(rule.worst_fraction, sums.worst_fraction);
  }
  if (c.need_weights) rule.expect(*got.fwd.weights, *ref32.fwd.weights, *ref64.fwd.weights, "weights");
}

// The same on the inputs of `seed`, the reference computed for this one check.
inline void check_against_reference(Backend backend, const Case& c, uint64_t seed, FlashRule& rule) {
  check_against_reference(backend, c, reference_of(c, seed, backend != Backend::decode), rule);
}

// The sweep of a fast backend: every (L, S) pair of `lengths` with every head size pair (Dqk, Dv:
// by default those of the contract, whole and ragged against the vector width, equal and not);
// masks, causality, GQA (`heads`), dropout and scale cycle with the case number (vary_options).
// Case n has seed first_seed + n. Returns the number of cases.
struct Sweep {
  std::vector<std::pair<int64_t, int64_t>> lengths;  // (L, S)
  std::vector<std::pair<int64_t, int64_t>> heads;    // (Hq, Hkv)
  uint64_t first_seed = 0;
  std::vector<std::pair<int64_t, int64_t>> head_dims = {{8, 8}, {59, 59}, {64, 64}, {128, 128}, {64, 32}, {24, 59}};
};

// Every (L, S) with L from `query_lengths` and S from `key_lengths`, L the outer loop.
inline std::vector<std::pair<int64_t, int64_t>> every_pair(const std::vector<int64_t>& query_lengths,
                                                           const std::vector<int64_t>& key_lengths) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t L : query_lengths)
    for (int64_t S : key_lengths) pairs.emplace_back(L, S);
  return pairs;
}

int run_sweep(Backend backend, const Sweep& sweep, FlashRule& rule);

// One fast backend's checks and the rule they keep the largest error of, for the report:
//   BackendCheck check_case{Backend::cpu_flash};  check_case(c, seed);  check_case.sweep(s);
// (check_case(c, ref) with a Reference computed once, for a case checked on every SIMD target.)
struct BackendCheck {
  Backend backend;
  FlashRule rule{name_of(backend)};

  void operator()(const Case& c, uint64_t seed) { check_against_reference(backend, c, seed, rule); }
  void operator()(const Case& c, const Reference& ref) { check_against_reference(backend, c, ref, rule); }
  int sweep(const Sweep& s) { return run_sweep(backend, s, rule); }
};

inline int run_sweep(Backend backend, const Sweep& sweep, FlashRule& rule) {
  int case_number = 0;
  for (const auto& [qk, v] : sweep.head_dims)
    for (const auto& [L, S] : sweep.lengths) {
      Case c = sized(1, 1, 1, L, S, qk, v);
      vary_options(c, case_number, sweep.heads.data(), static_cast<int>(sweep.heads.size()));
      check_against_reference(backend, c, sweep.first_seed + static_cast<uint64_t>(case_number), rule);
      ++case_number;
    }
  std::cout << "[" << name_of(backend) << "] sweep of " << case_number
            << " cases: largest fraction of the allowed error " << rule.worst_fraction << "\n";
  return case_number;
}

// The same bits in every result of two calls (output, logsumexp, the three gradients): a variant
// and its dense-mask twin.
template <class T>
void expect_same_bits(const Results<T>& got, const Results<T>& want) {
  EXPECT_TRUE(bitwise_equal(got.fwd.output, want.fwd.output)) << "output " << max_diff(got.fwd.output, want.fwd.output);
  EXPECT_TRUE(bitwise_equal(got.fwd.logsumexp, want.fwd.logsumexp)) << "logsumexp";
  EXPECT_TRUE(bitwise_equal(got.grads.grad_query, want.grads.grad_query)) << "grad_query";
  EXPECT_TRUE(bitwise_equal(got.grads.grad_key, want.grads.grad_key)) << "grad_key";
  EXPECT_TRUE(bitwise_equal(got.grads.grad_value, want.grads.grad_value)) << "grad_value";
}

// cpu_flash, and decode where it runs (at most 16 query rows, no weights), against the reference
// on every SIMD target the CPU runs; case n has seed first_seed + n. The references are computed
// once, before the targets (decode's is the forward of cpu_flash's). Prints the largest fraction
// of the allowed error under `label`.
inline void expect_fused_backends_match_reference(const std::vector<Case>& cases, uint64_t first_seed,
                                                  const std::string& label) {
  const std::vector<std::string> targets = simd_targets();
  ASSERT_FALSE(targets.empty());
  std::vector<Reference> references;
  uint64_t seed = first_seed;
  for (const Case& c : cases) references.push_back(reference_of(c, seed++, true));
  FlashRule flash{"cpu_flash"}, decode{"decode"};
  for (const std::string& target : targets) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    for (size_t n = 0; n < cases.size(); ++n) {
      const Case& c = cases[n];
      check_against_reference(Backend::cpu_flash, c, references[n], flash);
      if (c.q_len <= 16 && !c.need_weights) check_against_reference(Backend::decode, c, references[n], decode);
    }
  }
  std::cout << "[" << label << "] largest fraction of the allowed error: cpu_flash " << flash.worst_fraction
            << ", decode " << decode.worst_fraction << "\n";
}

}  // namespace mha::attention::test_cases
