// Context-parallel attention: ring and all-to-all (Ulysses), on the attention core's public API
// (Options::whole_call, GradientOutputs::accumulate, merge_partial). Design and cost model:
// docs/distributed.md. This file: the public entry points and the module's core; the call's
// checks are in call.cpp, the schemes in ring.cpp and ulysses.cpp.
#include "mha/distributed/context_parallel.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "call.h"

namespace mha::distributed {
namespace {

using attention::Options;

// ---------------------------------------------------------------------------------------------
// The module's core

// A contiguous copy of a (B, H, N, X) view whose rows are contiguous.
template <class T>
Tensor<T> contiguous_copy(View<const T> v) {
  Tensor<T> t(v.shape());
  T* out = t.data();
  for (int64_t b = 0; b < v.size(0); ++b)
    for (int64_t h = 0; h < v.size(1); ++h)
      for (int64_t i = 0; i < v.size(2); ++i, out += v.size(3))
        std::copy_n(v.data() + b * v.stride(0) + h * v.stride(1) + i * v.stride(2), v.size(3), out);
  return t;
}

// t into a view of its shape with contiguous rows.
template <class T>
void write_into(const View<T>& out, const Tensor<T>& t) {
  const T* in = t.data();
  for (int64_t b = 0; b < out.size(0); ++b)
    for (int64_t h = 0; h < out.size(1); ++h)
      for (int64_t i = 0; i < out.size(2); ++i, in += out.size(3))
        std::copy_n(in, out.size(3), out.data() + b * out.stride(0) + h * out.stride(1) + i * out.stride(2));
}

// The whole (B, H, length, X) from every rank's rows of it (all-gather, then unshard).
template <class T>
Tensor<T> all_rows(Communicator& comm, const Tensor<T>& local, int64_t length, Layout layout) {
  const auto parts = comm.all_gather_bytes(std::as_bytes(std::span<const T>(local.data(), static_cast<size_t>(local.numel()))));
  std::vector<Tensor<T>> shards;
  for (int r = 0; r < comm.size(); ++r) {
    Shape shape = local.shape();
    shape[2] = shard_length(length, layout, r, comm.size());
    Tensor<T> t(shape);
    const auto& bytes = parts[static_cast<size_t>(r)];
    check(bytes.size() == sizeof(T) * static_cast<size_t>(t.numel()), "context_parallel_core: rank ", r,
          " sent rows of another shape");
    if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
    shards.push_back(std::move(t));
  }
  return unshard(shards, 2, layout);
}

}  // namespace

template <class T>
nn::AttentionCore<T> context_parallel_core(Communicator& comm, Scheme scheme, Layout layout) {
  Communicator* c = &comm;
  auto local = [c, layout](View<const T> whole) {
    return shard(View<const T>(contiguous_copy(whole)), 2, layout, c->rank(), c->size());
  };
  auto lse_shape = [](const Tensor<double>& t) { return Shape{t.size(0), t.size(1), t.size(2), 1}; };
  nn::AttentionCore<T> core;
  core.forward = [=](View<const T> q, View<const T> k, View<const T> v, const attention::ForwardOutputs<T>& out,
                     const Options<T>& options) {
    const Sequence seq{q.size(2), k.size(2), layout};
    auto r = context_parallel_forward(*c, scheme, local(q), local(k), local(v), seq, options);
    write_into(out.output, all_rows(*c, r.output, seq.query_len, layout));
    const Shape shape = lse_shape(r.logsumexp);
    const Tensor<double> lse = all_rows(*c, std::move(r.logsumexp).reshape(shape), seq.query_len, layout);
    for (int64_t i = 0; i < lse.numel(); ++i) {  // (B, H, L) at the output view's strides
      const int64_t b = i / (lse.size(1) * lse.size(2)), h = i / lse.size(2) % lse.size(1), row = i % lse.size(2);
      out.logsumexp.data()[b * out.logsumexp.stride(0) + h * out.logsumexp.stride(1) + row * out.logsumexp.stride(2)] =
          lse[i];
    }
  };
  core.backward = [=](View<const T> q, View<const T> k, View<const T> v, View<const T> o, View<const double> lse,
                      View<const T> dout, const attention::GradientOutputs<T>& grads, const Options<T>& options) {
    check(!grads.accumulate, "context_parallel_core: expected gradients to overwrite (accumulate is not supported)");
    const Sequence seq{q.size(2), k.size(2), layout};
    const Tensor<double> lse4 = contiguous_copy(View<const double>(lse.data(), {lse.size(0), lse.size(1), lse.size(2), 1},
                                                                   {lse.stride(0), lse.stride(1), lse.stride(2), 1}));
    Tensor<double> lse_local = shard(View<const double>(lse4), 2, layout, c->rank(), c->size());
    lse_local = std::move(lse_local).reshape({lse_local.size(0), lse_local.size(1), lse_local.size(2)});
    const auto g = context_parallel_backward(*c, scheme, local(q), local(k), local(v), local(o), lse_local, local(dout),
                                             seq, options);
    write_into(grads.grad_query, all_rows(*c, g.grad_query, seq.query_len, layout));
    write_into(grads.grad_key, all_rows(*c, g.grad_key, seq.key_len, layout));
    write_into(grads.grad_value, all_rows(*c, g.grad_value, seq.key_len, layout));
  };
  return core;
}

template <class T>
attention::ForwardResult<T> context_parallel_forward(Communicator& comm, Scheme scheme, const Tensor<T>& query,
                                                     const Tensor<T>& key, const Tensor<T>& value,
                                                     const Sequence& sequence, const Options<T>& options) {
  const detail::Call c =
      detail::make_call(comm, scheme, "context_parallel_forward", query, key, value, sequence, options);
  if (scheme == Scheme::ulysses) return detail::ulysses_forward(comm, c, query, key, value, options);
  return detail::ring_forward(comm, c, query, key, value, options);
}

template <class T>
attention::Gradients<T> context_parallel_backward(Communicator& comm, Scheme scheme, const Tensor<T>& query,
                                                  const Tensor<T>& key, const Tensor<T>& value,
                                                  const Tensor<T>& output, const Tensor<double>& logsumexp,
                                                  const Tensor<T>& grad_output, const Sequence& sequence,
                                                  const Options<T>& options) {
  const detail::Call c =
      detail::make_call(comm, scheme, "context_parallel_backward", query, key, value, sequence, options);
  const Shape out_shape{c.batch, c.query_heads, query.size(2), c.v_dim};
  check_shape(output.shape(), out_shape, "output");
  check_shape(grad_output.shape(), out_shape, "grad_output");
  check_shape(logsumexp.shape(), {c.batch, c.query_heads, query.size(2)}, "logsumexp");
  if (scheme == Scheme::ulysses)
    return detail::ulysses_backward(comm, c, query, key, value, output, logsumexp, grad_output, options);
  return detail::ring_backward(comm, c, query, key, value, output, logsumexp, grad_output, options);
}

#define MHA_INSTANTIATE(T)                                                                                          \
  template attention::ForwardResult<T> context_parallel_forward(Communicator&, Scheme, const Tensor<T>&,            \
                                                                const Tensor<T>&, const Tensor<T>&, const Sequence&, \
                                                                const Options<T>&);                                 \
  template attention::Gradients<T> context_parallel_backward(Communicator&, Scheme, const Tensor<T>&,               \
                                                             const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,  \
                                                             const Tensor<double>&, const Tensor<T>&,               \
                                                             const Sequence&, const Options<T>&);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
#undef MHA_INSTANTIATE
template nn::AttentionCore<float> context_parallel_core(Communicator&, Scheme, Layout);
template nn::AttentionCore<double> context_parallel_core(Communicator&, Scheme, Layout);

}  // namespace mha::distributed
