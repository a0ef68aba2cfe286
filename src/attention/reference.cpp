#include "reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "mha/core/random.h"

namespace mha::attention::detail {
namespace {

// Pointers to row `row` of a (B, H, N, D) tensor for batch b, head h.
template <class T>
T* head_row(T* base, int64_t heads, int64_t rows, int64_t dim, int64_t b, int64_t h, int64_t row) {
  return base + ((b * heads + h) * rows + row) * dim;
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Scores of query row i against every key: scale·q_i·k_j + mask (−inf where blocked).
template <class T>
void score_row(const Problem& p, const Masks<T>& masks, const T* q, const T* k_head, int64_t b,
               int64_t h, int64_t i, T* scores) {
  masks.fill_row(p, b, h, i, scores);
  const T scale = static_cast<T>(p.scale);
  // The product is added even where the mask holds −inf, as PyTorch adds the mask to the full
  // score matrix: a NaN in a key propagates the same way it does there.
  for (int64_t j = 0; j < p.key_len; ++j)
    scores[j] += scale * dot(q, k_head + j * p.qk_head_dim, p.qk_head_dim);
}

// The dropout multiplier of probability (bh, i, j): 0 if dropped, 1/(1 − p) if kept.
inline double dropout_factor(const Problem& p, int64_t bh, int64_t i, int64_t j) {
  if (p.dropout_p == 0.0) return 1.0;
  return dropout_keep(p.dropout_seed, static_cast<uint64_t>(bh), static_cast<uint32_t>(i),
                      static_cast<uint32_t>(j), p.dropout_p)
             ? p.dropout_scale()
             : 0.0;
}

}  // namespace

template <class T>
ForwardResult<T> reference_forward(const Problem& p, const Masks<T>& masks, const Tensor<T>& query,
                                   const Tensor<T>& key, const Tensor<T>& value, bool need_weights) {
  // query (B, Hq, L, Dqk)  key (B, Hkv, S, Dqk)  value (B, Hkv, S, Dv)
  const int64_t B = p.batch, Hq = p.query_heads, Hkv = p.kv_heads, L = p.query_len, S = p.key_len;
  const int64_t Dqk = p.qk_head_dim, Dv = p.v_head_dim;
  ForwardResult<T> r{Tensor<T>({B, Hq, L, Dv}), Tensor<T>({B, Hq, L}), std::nullopt};
  if (need_weights) r.weights = Tensor<T>({B, Hq, L, S});
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores(static_cast<size_t>(S));

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / p.group_size();  // GQA: query head h reads key/value head kvh
      const T* k_head = head_row(key.data(), Hkv, S, Dqk, b, kvh, 0);
      const T* v_head = head_row(value.data(), Hkv, S, Dv, b, kvh, 0);
      for (int64_t i = 0; i < L; ++i) {
        const T* q = head_row(query.data(), Hq, L, Dqk, b, h, i);
        T* out = head_row(r.output.data(), Hq, L, Dv, b, h, i);
        T* weights = need_weights ? head_row(r.weights->data(), Hq, L, S, b, h, i) : nullptr;
        T& lse = r.logsumexp[(b * Hq + h) * L + i];

        // Pass 1: scores and their maximum.
        score_row(p, masks, q, k_head, b, h, i, scores.data());
        T max_score = neg_inf;
        for (int64_t j = 0; j < S; ++j) max_score = std::max(max_score, scores[j]);
        // A row that may attend to nothing: output 0 (already), weights 0, logsumexp −inf.
        if (max_score == neg_inf) {
          lse = neg_inf;
          continue;
        }
        // Pass 2: softmax with the maximum subtracted, so exp never overflows.
        T sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        lse = max_score + std::log(sum);
        // Pass 3: dropout on the probabilities, then the weighted sum of values.
        for (int64_t j = 0; j < S; ++j) {
          const T prob = scores[j] / sum * static_cast<T>(dropout_factor(p, b * Hq + h, i, j));
          if (weights) weights[j] = prob;
          const T* v = v_head + j * Dv;
          for (int64_t d = 0; d < Dv; ++d) out[d] += prob * v[d];
        }
      }
    }
  }
  return r;
}

template <class T>
Gradients<T> reference_backward(const Problem& p, const Masks<T>& masks, const Tensor<T>& query,
                                const Tensor<T>& key, const Tensor<T>& value, const Tensor<T>& output,
                                const Tensor<T>& logsumexp, const Tensor<T>& grad_output) {
  // With P = softmax(scores), Pd = dropout(P), O = Pd·V and upstream dO:
  //   dV_j  += Σ_i Pd_ij dO_i
  //   dPd_ij = dO_i · v_j,   dP_ij = dPd_ij · (dropout factor of ij)
  //   dS_ij  = P_ij (dP_ij − D_i)  with D_i = Σ_j P_ij dP_ij = dO_i · O_i
  //   dQ_i  += scale Σ_j dS_ij k_j,   dK_j += scale Σ_i dS_ij q_i
  // P is recomputed from the stored logsumexp: P_ij = exp(s_ij − lse_i).
  const int64_t B = p.batch, Hq = p.query_heads, Hkv = p.kv_heads, L = p.query_len, S = p.key_len;
  const int64_t Dqk = p.qk_head_dim, Dv = p.v_head_dim;
  Gradients<T> g{Tensor<T>(query.shape()), Tensor<T>(key.shape()), Tensor<T>(value.shape())};
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T scale = static_cast<T>(p.scale);
  std::vector<T> prob(static_cast<size_t>(S));

  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / p.group_size();
      const T* k_head = head_row(key.data(), Hkv, S, Dqk, b, kvh, 0);
      const T* v_head = head_row(value.data(), Hkv, S, Dv, b, kvh, 0);
      T* dk_head = head_row(g.grad_key.data(), Hkv, S, Dqk, b, kvh, 0);
      T* dv_head = head_row(g.grad_value.data(), Hkv, S, Dv, b, kvh, 0);
      for (int64_t i = 0; i < L; ++i) {
        const T lse = logsumexp[(b * Hq + h) * L + i];
        if (lse == neg_inf) continue;  // fully masked row: P = 0, so every gradient term is 0
        const T* q = head_row(query.data(), Hq, L, Dqk, b, h, i);
        const T* o = head_row(output.data(), Hq, L, Dv, b, h, i);
        const T* dout = head_row(grad_output.data(), Hq, L, Dv, b, h, i);
        T* dq = head_row(g.grad_query.data(), Hq, L, Dqk, b, h, i);

        score_row(p, masks, q, k_head, b, h, i, prob.data());
        for (int64_t j = 0; j < S; ++j) prob[j] = std::exp(prob[j] - lse);
        const T row_dot = dot(dout, o, Dv);  // D_i
        for (int64_t j = 0; j < S; ++j) {
          if (prob[j] == T(0)) continue;  // masked or underflowed: contributes nothing
          const T factor = static_cast<T>(dropout_factor(p, b * Hq + h, i, j));
          const T* v = v_head + j * Dv;
          T* dv = dv_head + j * Dv;
          for (int64_t d = 0; d < Dv; ++d) dv[d] += prob[j] * factor * dout[d];
          const T dscore = prob[j] * (dot(dout, v, Dv) * factor - row_dot);
          const T* k = k_head + j * Dqk;
          T* dk = dk_head + j * Dqk;
          for (int64_t d = 0; d < Dqk; ++d) {
            dq[d] += scale * dscore * k[d];
            dk[d] += scale * dscore * q[d];
          }
        }
      }
    }
  }
  return g;
}

template ForwardResult<float> reference_forward(const Problem&, const Masks<float>&, const Tensor<float>&,
                                                const Tensor<float>&, const Tensor<float>&, bool);
template ForwardResult<double> reference_forward(const Problem&, const Masks<double>&, const Tensor<double>&,
                                                 const Tensor<double>&, const Tensor<double>&, bool);
template Gradients<float> reference_backward(const Problem&, const Masks<float>&, const Tensor<float>&,
                                             const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                             const Tensor<float>&, const Tensor<float>&);
template Gradients<double> reference_backward(const Problem&, const Masks<double>&, const Tensor<double>&,
                                              const Tensor<double>&, const Tensor<double>&,
                                              const Tensor<double>&, const Tensor<double>&,
                                              const Tensor<double>&);

}  // namespace mha::attention::detail
