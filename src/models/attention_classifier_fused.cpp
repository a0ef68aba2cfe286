// The attention classifier's fused path (see attention_classifier.h): the whole network for a
// chunk of kChunk = 16 images on one OpenMP thread, per-chunk parameter gradients summed in
// chunk order at the end. It computes what the module path computes, layer for layer:
//
//   h = W_p x + b_p (+ positions)                        input projection, positions
//   per block: a = LN(h) or h; qkv = W_in a + b_in        PyTorch's packed q, k, v rows
//              merged = attention(q, k, v) per head
//              h = h + W_o merged + b_o                   out_proj and the residual
//   f = LN(h) or h; pooled = mean over positions of f; z = W_1 pooled + b_1;
//   r = dropout(relu(z)); logits = W_2 r + b_2
//
// Layout: inside a chunk every activation is a (features, L, 16) array with the image index
// innermost, x[(f·L + i)·16 + m] (the "lanes" layout of lanes_kernels.h). Then each
// projection is one BLAS call for the whole chunk, Y (out, L·16) = W (out, in) · X (in, L·16),
// its weight gradient one more, dW += dY · Xᵀ, with K = L·16; the attention kernels read a
// head's q, k, v rows as they are; LayerNorm, pooling and the residual adds are vertical loops
// over the 16 images. Only the input (and the input gradient, when asked for) and the logits
// are transposed, between this layout and the caller's (N, L, input_dim) / (N, classes).
// Lanes past the end of a partial chunk hold zeros: they stay finite and get zero gradient, so
// they add nothing to the parameter gradients.
//
// Every thread is an OpenMP thread and each BLAS call is single-threaded (SingleThreadedBlas; why
// not OpenBLAS's own threads: mha/core/blas_threads.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "mha/core/blas_threads.h"
#include "mha/core/gemm.h"
#include "mha/models/attention_classifier.h"
#include "mha/nn/dropout.h"
#include "lanes_kernels.h"

namespace mha::models {
namespace {

// A parameter's value and the offset of its gradient in a chunk's gradient buffer.
template <class T>
struct Slot {
  const T* value = nullptr;
  int64_t offset = -1;
};

// Every parameter the fused path reads, found by its PyTorch name.
template <class T>
struct Weights {
  Slot<T> proj_w, proj_b, positions;
  std::vector<Slot<T>> norm_w, norm_b, in_w, in_b, out_w, out_b;  // per block
  Slot<T> final_norm_w, final_norm_b, fc1_w, fc1_b, fc2_w, fc2_b;
  std::vector<nn::Parameter<T>> parameters;  // in order; offsets are cumulative
  int64_t total = 0;                         // values in a gradient buffer

  Weights(std::vector<nn::Parameter<T>> params, const AttentionClassifierConfig& c) : parameters(std::move(params)) {
    std::map<std::string, Slot<T>> by_name;
    for (const auto& p : parameters) {
      by_name[p.name] = {p.value->data(), total};
      total += p.value->numel();
    }
    auto get = [&](const std::string& name, bool wanted) {
      if (!wanted) return Slot<T>{};
      auto it = by_name.find(name);
      check(it != by_name.end(), "AttentionClassifier (fused): no parameter '", name, "'");
      return it->second;
    };
    proj_w = get("input_projection.weight", c.input_projection);
    proj_b = get("input_projection.bias", c.input_projection);
    positions = get("positions", c.learned_positions);
    for (int64_t b = 0; b < c.num_blocks; ++b) {
      const std::string prefix = "blocks." + std::to_string(b) + ".";
      norm_w.push_back(get(prefix + "norm.weight", c.pre_norm));
      norm_b.push_back(get(prefix + "norm.bias", c.pre_norm));
      in_w.push_back(get(prefix + "attention.in_proj_weight", true));
      in_b.push_back(get(prefix + "attention.in_proj_bias", true));
      out_w.push_back(get(prefix + "attention.out_proj.weight", true));
      out_b.push_back(get(prefix + "attention.out_proj.bias", true));
    }
    final_norm_w = get("norm.weight", c.pre_norm);
    final_norm_b = get("norm.bias", c.pre_norm);
    fc1_w = get("fc1.weight", true);
    fc1_b = get("fc1.bias", true);
    fc2_w = get("fc2.weight", true);
    fc2_b = get("fc2.bias", true);
  }
};

constexpr int64_t kW = detail::kLanes;  // images per chunk = lanes
constexpr double kEps = 1e-5;           // nn::LayerNorm's default, which the model uses

// Y (out, cols) = W (out, in) · X (in, cols) + b, b broadcast along each row.
template <class T>
void linear(const T* w, const T* b, int64_t out, int64_t in, const T* x, int64_t cols, T* y) {
  for (int64_t o = 0; o < out; ++o) std::fill_n(y + o * cols, cols, b[o]);
  gemm<T>(Transpose::no, Transpose::no, out, cols, in, T(1), w, in, x, cols, T(1), y, cols);
}

// Backward of linear: grad_w (out, in) += dY · Xᵀ; grad_b (out) += row sums of dY (in double,
// as nn::linear_backward); dX (in, cols) = Wᵀ · dY unless dx is null.
template <class T>
void linear_backward(const T* w, int64_t out, int64_t in, const T* x, int64_t cols, const T* dy, T* grad_w, T* grad_b,
                     T* dx) {
  gemm<T>(Transpose::no, Transpose::yes, out, in, cols, T(1), dy, cols, x, cols, T(1), grad_w, in);
  // cols is a multiple of the 16 lanes: 16 running sums, one per lane, vectorise without
  // reordering any sum; they are added together at the end.
  for (int64_t o = 0; o < out; ++o) {
    double lane_sums[kW] = {};
    for (int64_t c = 0; c < cols; c += kW)
      for (int64_t m = 0; m < kW; ++m) lane_sums[m] += static_cast<double>(dy[o * cols + c + m]);
    double sum = 0;
    for (double v : lane_sums) sum += v;
    grad_b[o] += static_cast<T>(sum);
  }
  if (dx) gemm<T>(Transpose::yes, Transpose::no, in, cols, out, T(1), w, in, dy, cols, T(0), dx, cols);
}

// Per-thread buffers for one chunk, grown as needed and reused across calls.
template <class T>
struct Scratch {
  std::vector<T> x, h, a, normalized, rstd, qkv, merged, f, pooled, z, r, logits;  // forward
  std::vector<T> dh, da, dqkv, dmerged, dpooled, dz, dlogits, dx;                // backward
  std::vector<T> attention, stats;
  static T* get(std::vector<T>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
  }
};

template <class T>
Scratch<T>& thread_scratch() {
  thread_local Scratch<T> scratch;
  return scratch;
}

// The tensor, reallocated only when its shape changes (every element is overwritten by the
// fused forward, so stale values never survive).
template <class E>
E* reuse(Tensor<E>& t, const Shape& shape) {
  if (t.shape() != shape || !t.defined()) t = Tensor<E>(shape);
  return t.data();
}

}  // namespace

template <class T>
Tensor<T> AttentionClassifier<T>::fused_forward(const Tensor<T>& x, FusedCache* cache) {
  const AttentionClassifierConfig& c = config_;
  const int64_t N = x.size(0), L = c.sequence_length, Din = c.input_dim, E = c.embed_dim, H = c.num_heads,
                d = E / H, hidden = c.hidden_dim, C = c.num_classes, B = c.num_blocks, cols = L * kW;
  static_assert(kChunk == detail::kLanes, "a chunk is one set of kernel lanes");
  const Weights<T> w(parameters(), c);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));

  // Dropout, as nn::Dropout draws it: one mask for the whole (N, hidden) batch per training
  // forward, from (seed, counter); the counter advances even when p is 0.
  Tensor<bool> keep;
  if (this->is_training()) {
    if (c.dropout > 0) keep = nn::dropout_mask({N, hidden}, c.dropout, dropout_.seed(), dropout_.counter());
    dropout_.set_counter(dropout_.counter() + 1);
  }
  const T keep_scale = static_cast<T>(1.0 / (1.0 - c.dropout));

  const int64_t chunks = (N + kChunk - 1) / kChunk;
  if (cache) {
    reuse(cache->input, {chunks, Din, L, kW});
    for (int64_t b = 0; b < B; ++b) {
      typename FusedCache::BlockCache& bc = cache->blocks[static_cast<size_t>(b)];
      reuse(bc.attention_input, {chunks, E, L, kW});
      if (c.pre_norm) {
        reuse(bc.normalized, {chunks, E, L, kW});
        reuse(bc.rstd, {chunks, L, kW});
      }
      reuse(bc.qkv, {chunks, 3 * E, L, kW});
      reuse(bc.probabilities, {chunks, H, L, L, kW});
      reuse(bc.merged, {chunks, E, L, kW});
    }
    if (c.pre_norm) {
      reuse(cache->normalized, {chunks, E, L, kW});
      reuse(cache->rstd, {chunks, L, kW});
    }
    reuse(cache->pooled, {chunks, E, kW});
    reuse(cache->fc1_output, {chunks, hidden, kW});
    reuse(cache->fc2_input, {chunks, hidden, kW});
    cache->keep = keep;
  }
  Tensor<T> logits({N, C});
  const SingleThreadedBlas single_threaded_blas;

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t s0 = chunk * kChunk, n = std::min(kChunk, N - s0);
    Scratch<T>& s = thread_scratch<T>();
    T* attention_scratch = Scratch<T>::get(s.attention, detail::attention_scratch_size(L));
    // Where this chunk's activations go: the cache's slices, or scratch reused block to block.
    auto place = [&](Tensor<T>* cached, int64_t per_chunk, std::vector<T>& scratch) -> T* {
      return cache ? cached->data() + chunk * per_chunk : Scratch<T>::get(scratch, per_chunk);
    };

    // The chunk's images in the lanes layout; missing images are zeros.
    T* x0 = place(cache ? &cache->input : nullptr, Din * cols, s.x);
    std::fill_n(x0, Din * cols, T(0));
    for (int64_t m = 0; m < n; ++m)
      for (int64_t i = 0; i < L; ++i) {
        const T* row = x.data() + ((s0 + m) * L + i) * Din;
        for (int64_t k = 0; k < Din; ++k) x0[(k * L + i) * kW + m] = row[k];
      }
    T* h = Scratch<T>::get(s.h, E * cols);
    if (c.input_projection)
      linear(w.proj_w.value, w.proj_b.value, E, Din, x0, cols, h);
    else
      std::copy_n(x0, E * cols, h);
    if (c.learned_positions)
      for (int64_t f = 0; f < E; ++f)
        for (int64_t i = 0; i < L; ++i) {
          const T p = w.positions.value[i * E + f];
          for (int64_t m = 0; m < kW; ++m) h[(f * L + i) * kW + m] += p;
        }

    for (int64_t b = 0; b < B; ++b) {
      typename FusedCache::BlockCache* bc = cache ? &cache->blocks[static_cast<size_t>(b)] : nullptr;
      T* a = place(bc ? &bc->attention_input : nullptr, E * cols, s.a);
      if (c.pre_norm)
        detail::layer_norm_lanes(h, E, cols, w.norm_w[b].value, w.norm_b[b].value, static_cast<T>(kEps), a,
                                 place(bc ? &bc->normalized : nullptr, E * cols, s.normalized),
                                 place(bc ? &bc->rstd : nullptr, cols, s.rstd));
      else
        std::copy_n(h, E * cols, a);
      T* qkv = place(bc ? &bc->qkv : nullptr, 3 * E * cols, s.qkv);
      T* merged = place(bc ? &bc->merged : nullptr, E * cols, s.merged);
      linear(w.in_w[b].value, w.in_b[b].value, 3 * E, E, a, cols, qkv);
      for (int64_t head = 0; head < H; ++head)
        detail::attention_chunk_forward(qkv + head * d * cols, qkv + (E + head * d) * cols,
                                        qkv + (2 * E + head * d) * cols, L, d, scale, merged + head * d * cols,
                                        cache ? bc->probabilities.data() + (chunk * H + head) * L * L * kW : nullptr,
                                        attention_scratch);
      // h += W_o merged + b_o: out_proj and the residual.
      for (int64_t f = 0; f < E; ++f) {
        const T bias = w.out_b[b].value[f];
        for (int64_t j = 0; j < cols; ++j) h[f * cols + j] += bias;
      }
      gemm<T>(Transpose::no, Transpose::no, E, cols, E, T(1), w.out_w[b].value, E, merged, cols, T(1), h, cols);
    }
    const T* f = h;
    if (c.pre_norm) {
      T* y = Scratch<T>::get(s.f, E * cols);
      detail::layer_norm_lanes(h, E, cols, w.final_norm_w.value, w.final_norm_b.value, static_cast<T>(kEps), y,
                               place(cache ? &cache->normalized : nullptr, E * cols, s.normalized),
                               place(cache ? &cache->rstd : nullptr, cols, s.rstd));
      f = y;
    }
    // Mean over positions, summed in position order as the module path does.
    T* pooled = place(cache ? &cache->pooled : nullptr, E * kW, s.pooled);
    for (int64_t e = 0; e < E; ++e) {
      T* p = pooled + e * kW;
      std::fill_n(p, kW, T(0));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t m = 0; m < kW; ++m) p[m] += f[(e * L + i) * kW + m];
      for (int64_t m = 0; m < kW; ++m) p[m] /= static_cast<T>(L);
    }
    T* z = place(cache ? &cache->fc1_output : nullptr, hidden * kW, s.z);
    T* r = place(cache ? &cache->fc2_input : nullptr, hidden * kW, s.r);
    linear(w.fc1_w.value, w.fc1_b.value, hidden, E, pooled, kW, z);
    for (int64_t j = 0; j < hidden; ++j)
      for (int64_t m = 0; m < kW; ++m) {
        const T zj = z[j * kW + m], relu = !(zj <= T(0)) ? zj : T(0);  // NaN kept (nn::relu)
        r[j * kW + m] = keep.defined() ? (m < n && keep[(s0 + m) * hidden + j] ? relu * keep_scale : T(0)) : relu;
      }
    T* out = Scratch<T>::get(s.logits, C * kW);
    linear(w.fc2_w.value, w.fc2_b.value, C, hidden, r, kW, out);
    for (int64_t m = 0; m < n; ++m)
      for (int64_t k = 0; k < C; ++k) logits[(s0 + m) * C + k] = out[k * kW + m];
  }
  return logits;
}

template <class T>
Tensor<T> AttentionClassifier<T>::fused_backward(const Tensor<T>& grad_logits, FusedCache& cache,
                                                 bool want_input_grad) {
  const AttentionClassifierConfig& c = config_;
  const int64_t N = cache.batch, L = c.sequence_length, Din = c.input_dim, E = c.embed_dim, H = c.num_heads,
                d = E / H, hidden = c.hidden_dim, C = c.num_classes, B = c.num_blocks, cols = L * kW;
  const int64_t chunks = (N + kChunk - 1) / kChunk;
  check(cache.input.defined() && cache.input.size(0) == chunks && cache.pooled.defined(),
        "AttentionClassifier::backward: cache: expected the cache filled by a fused forward");
  const Weights<T> w(parameters(), c);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - c.dropout));
  const Tensor<bool>& keep = cache.keep;

  cache.chunk_grads.resize(static_cast<size_t>(chunks));
  for (auto& g : cache.chunk_grads) g.assign(static_cast<size_t>(w.total), T(0));
  std::vector<T>& summed = cache.summed_grads;
  summed.resize(static_cast<size_t>(w.total));
  Tensor<T> grad_x = want_input_grad ? Tensor<T>({N, L, Din}) : Tensor<T>();
  const SingleThreadedBlas single_threaded_blas;

#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t s0 = chunk * kChunk, n = std::min(kChunk, N - s0);
      Scratch<T>& s = thread_scratch<T>();
      T* attention_scratch = Scratch<T>::get(s.attention, detail::attention_scratch_size(L));
      T* G = cache.chunk_grads[static_cast<size_t>(chunk)].data();
      auto grad = [&](const Slot<T>& slot) { return G + slot.offset; };
      auto at = [&](const Tensor<T>& t, int64_t per_chunk) { return t.data() + chunk * per_chunk; };

      // Head: fc2, dropout, ReLU, fc1. Lanes past the chunk's end get zero gradient.
      T* dl = Scratch<T>::get(s.dlogits, C * kW);
      std::fill_n(dl, C * kW, T(0));
      for (int64_t m = 0; m < n; ++m)
        for (int64_t k = 0; k < C; ++k) dl[k * kW + m] = grad_logits[(s0 + m) * C + k];
      T* dz = Scratch<T>::get(s.dz, hidden * kW);
      linear_backward(w.fc2_w.value, C, hidden, at(cache.fc2_input, hidden * kW), kW, dl, grad(w.fc2_w),
                      grad(w.fc2_b), dz);
      const T* z = at(cache.fc1_output, hidden * kW);
      for (int64_t j = 0; j < hidden; ++j)
        for (int64_t m = 0; m < kW; ++m) {
          T g = dz[j * kW + m];
          if (keep.defined()) g = m < n && keep[(s0 + m) * hidden + j] ? g * keep_scale : T(0);
          dz[j * kW + m] = !(z[j * kW + m] <= T(0)) ? g : T(0);
        }
      T* dpooled = Scratch<T>::get(s.dpooled, E * kW);
      linear_backward(w.fc1_w.value, hidden, E, at(cache.pooled, E * kW), kW, dz, grad(w.fc1_w), grad(w.fc1_b),
                      dpooled);
      // The mean spreads the gradient evenly over the positions.
      T* dh = Scratch<T>::get(s.dh, E * cols);
      T* da = Scratch<T>::get(s.da, E * cols);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t m = 0; m < kW; ++m) dh[(e * L + i) * kW + m] = dpooled[e * kW + m] / static_cast<T>(L);
      if (c.pre_norm) {
        detail::layer_norm_lanes_backward(dh, at(cache.normalized, E * cols), at(cache.rstd, cols), E, cols,
                                          w.final_norm_w.value, grad(w.final_norm_w), grad(w.final_norm_b), da,
                                          Scratch<T>::get(s.stats, 2 * cols));
        std::swap(dh, da);
      }

      T* dmerged = Scratch<T>::get(s.dmerged, E * cols);
      T* dqkv = Scratch<T>::get(s.dqkv, 3 * E * cols);
      for (int64_t b = B; b-- > 0;) {
        const typename FusedCache::BlockCache& bc = cache.blocks[static_cast<size_t>(b)];
        // out_proj, then the attention core head by head, then in_proj.
        linear_backward(w.out_w[b].value, E, E, at(bc.merged, E * cols), cols, dh, grad(w.out_w[b]),
                        grad(w.out_b[b]), dmerged);
        const T* qkv = at(bc.qkv, 3 * E * cols);
        for (int64_t head = 0; head < H; ++head)
          detail::attention_chunk_backward(qkv + head * d * cols, qkv + (E + head * d) * cols,
                                           qkv + (2 * E + head * d) * cols,
                                           bc.probabilities.data() + (chunk * H + head) * L * L * kW,
                                           dmerged + head * d * cols, L, d, scale, dqkv + head * d * cols,
                                           dqkv + (E + head * d) * cols, dqkv + (2 * E + head * d) * cols,
                                           attention_scratch);
        linear_backward(w.in_w[b].value, 3 * E, E, at(bc.attention_input, E * cols), cols, dqkv, grad(w.in_w[b]),
                        grad(w.in_b[b]), da);
        if (c.pre_norm) {
          // da is the gradient of the LayerNorm's output; dmerged is free to hold its input's.
          detail::layer_norm_lanes_backward(da, at(bc.normalized, E * cols), at(bc.rstd, cols), E, cols,
                                            w.norm_w[b].value, grad(w.norm_w[b]), grad(w.norm_b[b]), dmerged,
                                            Scratch<T>::get(s.stats, 2 * cols));
          for (int64_t j = 0; j < E * cols; ++j) dh[j] += dmerged[j];
        } else {
          for (int64_t j = 0; j < E * cols; ++j) dh[j] += da[j];  // the residual path
        }
      }
      if (c.learned_positions) {
        T* gp = grad(w.positions);
        for (int64_t f = 0; f < E; ++f)
          for (int64_t i = 0; i < L; ++i) {
            T sum = 0;
            for (int64_t m = 0; m < kW; ++m) sum += dh[(f * L + i) * kW + m];
            gp[i * E + f] += sum;
          }
      }
      const T* dx = dh;
      if (c.input_projection) {
        T* dx0 = want_input_grad ? Scratch<T>::get(s.dx, Din * cols) : nullptr;
        linear_backward(w.proj_w.value, E, Din, at(cache.input, Din * cols), cols, dh, grad(w.proj_w),
                        grad(w.proj_b), dx0);
        dx = dx0;
      }
      if (want_input_grad)
        for (int64_t m = 0; m < n; ++m)
          for (int64_t i = 0; i < L; ++i) {
            T* row = grad_x.data() + ((s0 + m) * L + i) * Din;
            for (int64_t k = 0; k < Din; ++k) row[k] = dx[(k * L + i) * kW + m];
          }
    }
    // Sum the chunks' gradients, in chunk order whatever thread ran them.
#pragma omp for schedule(static)
    for (int64_t j = 0; j < w.total; ++j) {
      T total = cache.chunk_grads[0][static_cast<size_t>(j)];
      for (int64_t k = 1; k < chunks; ++k) total += cache.chunk_grads[static_cast<size_t>(k)][static_cast<size_t>(j)];
      summed[static_cast<size_t>(j)] = total;
    }
  }
  int64_t offset = 0;
  for (const auto& p : w.parameters) {
    T* g = p.grad->data();
    for (int64_t j = 0; j < p.grad->numel(); ++j) g[j] += summed[static_cast<size_t>(offset + j)];
    offset += p.grad->numel();
  }
  return grad_x;
}

template Tensor<float> AttentionClassifier<float>::fused_forward(const Tensor<float>&, FusedCache*);
template Tensor<double> AttentionClassifier<double>::fused_forward(const Tensor<double>&, FusedCache*);
template Tensor<float> AttentionClassifier<float>::fused_backward(const Tensor<float>&, FusedCache&, bool);
template Tensor<double> AttentionClassifier<double>::fused_backward(const Tensor<double>&, FusedCache&, bool);

}  // namespace mha::models
