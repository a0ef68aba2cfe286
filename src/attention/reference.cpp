#include "reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "mha/core/random.h"

namespace mha::attention::detail {
namespace {

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Scores of query row i against every key: cap(scale·q_i·k_j) + additions (−inf where blocked),
// cap(x) = c·tanh(x / c) with a soft-cap c (Scoring::softcap), else x. With `slopes`, also
// cap'(x) = 1 − tanh²(x / c) per key, for the backward (1 without a soft-cap).
template <class T>
void score_row(const Problem& p, const ScoreAdditions<T>& additions, const T* q, const Rows<const T>& key, int64_t b,
               int64_t kvh, int64_t h, int64_t i, T* scores, T* slopes = nullptr) {
  additions.fill_row(p, b, h, i, scores);
  const T scale = static_cast<T>(p.scale), cap = static_cast<T>(p.settings.softcap);
  // The product is added even where the mask holds −inf, as PyTorch adds the mask to the full
  // score matrix: a NaN in a key propagates the same way it does there.
  for (int64_t j = 0; j < p.key_len; ++j) {
    T x = scale * dot(q, key.row(b, kvh, j), p.qk_head_dim);
    if (p.softcapped()) {
      const T t = std::tanh(x / cap);
      x = cap * t;
      if (slopes) slopes[j] = T(1) - t * t;
    } else if (slopes) {
      slopes[j] = T(1);
    }
    scores[j] += x;
  }
}

// Turns the scores of one row into probabilities in place and returns log(Σ exp(scores) +
// exp(sink)) (in double: see attention.h); the sink (Options::sinks; −inf: none) is one more logit
// of the row whose probability is left out.
// A row whose scores and sink are all −inf may attend to nothing: it gets probabilities 0 and
// returns −inf. A NaN anywhere makes the whole row NaN, as in PyTorch (NaN must not pass for
// "masked").
template <class T>
double softmax_row(T* scores, int64_t n, T sink) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  T max_score = sink;
  // Once max_score is NaN no comparison replaces it, so a NaN sticks.
  for (int64_t j = 0; j < n; ++j)
    if (std::isnan(scores[j]) || max_score < scores[j]) max_score = scores[j];
  if (max_score == neg_inf) {
    std::fill_n(scores, n, T(0));
    return -std::numeric_limits<double>::infinity();
  }
  // Subtracting the maximum keeps every exp ≤ 1, so nothing overflows. The normaliser is summed
  // in double so that Σ_j P_j = 1 to rounding of the P_j themselves: backward relies on it
  // (Σ_j dS_ij = D_i (1 − Σ_j P_ij) must vanish), and a sequential float sum over S keys would be
  // off by ~S·eps — the largest error in gradients that are zero in exact arithmetic.
  double sum = std::exp(static_cast<double>(sink) - static_cast<double>(max_score));
  for (int64_t j = 0; j < n; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
  for (int64_t j = 0; j < n; ++j) scores[j] = static_cast<T>(scores[j] / sum);
  return static_cast<double>(max_score) + std::log(sum);
}

// The dropout multiplier of probability (bh, i, j): 0 if dropped, 1/(1 − p) if kept (at the
// whole call's positions).
inline double dropout_factor(const Problem& p, int64_t bh, int64_t i, int64_t j) {
  if (!p.dropout()) return 1.0;
  return dropout_keep(p.settings.dropout_seed, p.dropout_stream(bh), p.dropout_row(i), p.dropout_column(j),
                      p.settings.dropout_p)
             ? p.dropout_scale()
             : 0.0;
}

}  // namespace

template <class T>
void reference_forward(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T>& a) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv); the outputs start at 0
  const int64_t B = p.batch, Hq = p.query_heads, L = p.query_len, S = p.key_len, Dv = p.v_head_dim;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores(static_cast<size_t>(S));

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / p.group_size();  // GQA: query head h reads key/value head kvh
      for (int64_t i = 0; i < L; ++i) {
        const T* q = a.query.row(b, h, i);
        T* out = a.output.row(b, h, i);
        T* weights = a.weights.present() ? a.weights.row(b, h, i) : nullptr;
        double& lse = *a.logsumexp.row(b, h, i);

        // Pass 1: scores; pass 2: softmax (a row that may attend to nothing stays 0).
        score_row(p, additions, q, a.key, b, kvh, h, i, scores.data());
        lse = softmax_row(scores.data(), S, static_cast<T>(a.sinks.of(b, h)));
        if (lse == neg_inf) continue;
        // Pass 3: dropout on the probabilities, then the weighted sum of values.
        for (int64_t j = 0; j < S; ++j) {
          const T prob = scores[j] * static_cast<T>(dropout_factor(p, b * Hq + h, i, j));
          if (weights) weights[j] = prob;
          const T* v = a.value.row(b, kvh, j);
          for (int64_t d = 0; d < Dv; ++d) out[d] += prob * v[d];
        }
      }
    }
  }
}

template <class T>
void reference_backward(const Problem& p, const ScoreAdditions<T>& additions, const BackwardArgs<T>& a) {
  // With P = softmax(scores), Pd = dropout(P), O = Pd·V and upstream dO:
  //   dV_j  += Σ_i Pd_ij dO_i
  //   dPd_ij = dO_i · v_j,   dP_ij = dPd_ij · (dropout factor of ij)
  //   dS_ij  = P_ij (dP_ij − D_i)  with D_i = Σ_j P_ij dP_ij  (= dO_i · O_i in exact arithmetic),
  //            times cap'(x_ij) = 1 − tanh²(x_ij / c) under a soft-cap c (x = scale·q·k)
  // (a sink's own column of dS gives grad_sinks: attention.cpp's sink_gradients, for every backend)
  //   dQ_i  += scale Σ_j dS_ij k_j,   dK_j += scale Σ_i dS_ij q_i
  // The reference recomputes P with the same softmax as the forward rather than as
  // exp(s − lse): when a row's scores are huge (a finite mask fill such as −1e9), lse = m + log l
  // rounds to m and exp(s − lse) would be up to S times too large. It takes D_i from that same P
  // (as PyTorch's softmax backward does) rather than from the stored output: then Σ_j dS_ij
  // cancels to rounding, where dO·O carries the forward's rounding into every dS_ij and so into
  // gradients that are exactly zero in exact arithmetic (e.g. a key bias, which softmax ignores).
  // So neither the stored output nor logsumexp is read, except by a call that is a block of a
  // row's keys (Problem::partial_keys), which has only part of the row: P = exp(s − logsumexp)
  // and D_i = dO_i·O_i then. The gradients start at 0 or hold what is added to (accumulate).
  const int64_t B = p.batch, Hq = p.query_heads, L = p.query_len, S = p.key_len;
  const int64_t Dqk = p.qk_head_dim, Dv = p.v_head_dim;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T scale = static_cast<T>(p.scale);
  std::vector<T> prob(static_cast<size_t>(S)), dprob(static_cast<size_t>(S)), cap_slope(static_cast<size_t>(S));

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / p.group_size();
      for (int64_t i = 0; i < L; ++i) {
        const T* q = a.query.row(b, h, i);
        const T* dout = a.grad_output.row(b, h, i);
        T* dq = a.grad_query.row(b, h, i);

        score_row(p, additions, q, a.key, b, kvh, h, i, prob.data(), cap_slope.data());
        if (p.partial_keys()) {
          // A block of the row's keys (Options::whole_call): P from the whole row's logsumexp.
          const double lse = *a.logsumexp.row(b, h, i);
          if (lse == -std::numeric_limits<double>::infinity()) continue;
          for (int64_t j = 0; j < S; ++j) prob[j] = static_cast<T>(std::exp(static_cast<double>(prob[j]) - lse));
        } else if (softmax_row(prob.data(), S, static_cast<T>(a.sinks.of(b, h))) == neg_inf) {
          continue;  // masked row: every gradient term is 0
        }
        // dP_ij and D_i; then dV, dS, dQ, dK. Every key takes part, as in PyTorch's matrix
        // products: a key with P = 0 (masked or underflowed) adds exactly 0 while its key, value
        // and grad_output are finite, and NaN (0·inf) where one holds an Inf or NaN, as there.
        // D_i is summed in double: dS_ij = P_ij (dP_ij − D_i) cancels, and a sequential float
        // sum's rounding in D_i would reach every dS_ij of the row.
        // A block of the row's keys takes D_i = dO_i·O_i from the whole call's output instead.
        double row_dot = 0;
        for (int64_t j = 0; j < S; ++j) {
          dprob[j] = dot(dout, a.value.row(b, kvh, j), Dv) * static_cast<T>(dropout_factor(p, b * Hq + h, i, j));
          if (!p.partial_keys()) row_dot += prob[j] * dprob[j];
        }
        if (p.partial_keys()) {
          const T* out = a.output.row(b, h, i);
          for (int64_t d = 0; d < Dv; ++d) row_dot += static_cast<double>(dout[d]) * out[d];
        }
        for (int64_t j = 0; j < S; ++j) {
          const T factor = static_cast<T>(dropout_factor(p, b * Hq + h, i, j));
          T* dv = a.grad_value.row(b, kvh, j);
          for (int64_t d = 0; d < Dv; ++d) dv[d] += prob[j] * factor * dout[d];
          const T dscore = static_cast<T>(prob[j] * (dprob[j] - row_dot)) * cap_slope[j];
          const T* k = a.key.row(b, kvh, j);
          T* dk = a.grad_key.row(b, kvh, j);
          for (int64_t d = 0; d < Dqk; ++d) {
            dq[d] += scale * dscore * k[d];
            dk[d] += scale * dscore * q[d];
          }
        }
      }
    }
  }
}

template void reference_forward(const Problem&, const ScoreAdditions<float>&, const ForwardArgs<float>&);
template void reference_forward(const Problem&, const ScoreAdditions<double>&, const ForwardArgs<double>&);
template void reference_backward(const Problem&, const ScoreAdditions<float>&, const BackwardArgs<float>&);
template void reference_backward(const Problem&, const ScoreAdditions<double>&, const BackwardArgs<double>&);

}  // namespace mha::attention::detail
