// _mha: the two scaled dot-product attention calls of mha/attention/attention.h, for Python.
//
// Only argument conversion lives here: each nb::ndarray becomes an mha::View of the same memory
// (shape, and strides in elements, as nanobind reports them) and the call writes into output
// arrays the caller allocated. Shapes, broadcasting, dtypes and defaults are the Python
// package's business (python/mha/_core.py); everything else is checked by mha itself, whose
// mha::Error becomes a ValueError carrying the same message.
//
// Every array argument is `noconvert`: an array of the wrong dtype or on another device is
// refused (TypeError) instead of silently copied, so what mha reads and writes is the caller's
// memory. Any strides are accepted here; mha checks what it needs (a contiguous last dimension).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <omp.h>

#include <cstdint>
#include <optional>

#include "mha/attention/attention.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using mha::attention::Causal;

template <class T>
using In = nb::ndarray<const T, nb::device::cpu>;
template <class T>
using Out = nb::ndarray<T, nb::device::cpu>;

template <class T, class Array>
mha::View<T> view(const Array& a) {
  mha::Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  return mha::View<T>(a.data(), std::move(shape), std::move(strides));
}

// The kernels' OpenMP team size for one call. omp_set_num_threads sets the calling thread's
// value, which other OpenMP code on that thread (numpy's BLAS, torch's kernels: one libgomp per
// process) also reads, so the previous value is put back afterwards.
class OpenMPThreads {
 public:
  explicit OpenMPThreads(int n) : saved_(omp_get_max_threads()) {
    mha::check(n >= 1, "num_threads: expected a count >= 1, got ", n);
    omp_set_num_threads(n);
  }
  ~OpenMPThreads() { omp_set_num_threads(saved_); }
  OpenMPThreads(const OpenMPThreads&) = delete;
  OpenMPThreads& operator=(const OpenMPThreads&) = delete;

 private:
  int saved_;
};

template <class T>
mha::attention::Options<T> options(const std::optional<In<bool>>& attend_mask,
                                   const std::optional<In<T>>& additive_mask, Causal causal,
                                   std::optional<double> scale, double dropout_p, uint64_t dropout_seed) {
  mha::attention::Options<T> opt;
  if (attend_mask) opt.attend_mask = view<const bool>(*attend_mask);
  if (additive_mask) opt.additive_mask = view<const T>(*additive_mask);
  opt.causal = causal;
  opt.scale = scale;
  opt.dropout_p = dropout_p;
  opt.dropout_seed = dropout_seed;
  return opt;
}

template <class T>
void sdpa_forward(const In<T>& query, const In<T>& key, const In<T>& value, const Out<T>& output,
                  const Out<double>& logsumexp, const std::optional<In<bool>>& attend_mask,
                  const std::optional<In<T>>& additive_mask, Causal causal, std::optional<double> scale,
                  double dropout_p, uint64_t dropout_seed, int num_threads) {
  OpenMPThreads threads(num_threads);
  mha::attention::ForwardOutputs<T> out{view<T>(output), view<double>(logsumexp), {}};
  mha::attention::sdpa_forward_into<T>(view<const T>(query), view<const T>(key), view<const T>(value), out,
                                       options<T>(attend_mask, additive_mask, causal, scale, dropout_p, dropout_seed));
}

template <class T>
void sdpa_backward(const In<T>& query, const In<T>& key, const In<T>& value, const In<T>& output,
                   const In<double>& logsumexp, const In<T>& grad_output, const Out<T>& grad_query,
                   const Out<T>& grad_key, const Out<T>& grad_value, const std::optional<In<bool>>& attend_mask,
                   const std::optional<In<T>>& additive_mask, Causal causal, std::optional<double> scale,
                   double dropout_p, uint64_t dropout_seed, int num_threads) {
  OpenMPThreads threads(num_threads);
  mha::attention::GradientOutputs<T> grads{view<T>(grad_query), view<T>(grad_key), view<T>(grad_value)};
  mha::attention::sdpa_backward_into<T>(view<const T>(query), view<const T>(key), view<const T>(value),
                                        view<const T>(output), view<const double>(logsumexp),
                                        view<const T>(grad_output), grads,
                                        options<T>(attend_mask, additive_mask, causal, scale, dropout_p, dropout_seed));
}

// One overload per element type; nanobind picks the one whose dtypes match (noconvert).
template <class T>
void define(nb::module_& m) {
  m.def("sdpa_forward", &sdpa_forward<T>, "query"_a.noconvert(), "key"_a.noconvert(), "value"_a.noconvert(),
        "output"_a.noconvert(), "logsumexp"_a.noconvert(), "attend_mask"_a.noconvert().none(),
        "additive_mask"_a.noconvert().none(), "causal"_a, "scale"_a.none(), "dropout_p"_a, "dropout_seed"_a,
        "num_threads"_a, nb::call_guard<nb::gil_scoped_release>(),
        "Scaled dot-product attention forward into `output` (B, Hq, L, Dv) and `logsumexp` (B, Hq, L).");
  m.def("sdpa_backward", &sdpa_backward<T>, "query"_a.noconvert(), "key"_a.noconvert(), "value"_a.noconvert(),
        "output"_a.noconvert(), "logsumexp"_a.noconvert(), "grad_output"_a.noconvert(), "grad_query"_a.noconvert(),
        "grad_key"_a.noconvert(), "grad_value"_a.noconvert(), "attend_mask"_a.noconvert().none(),
        "additive_mask"_a.noconvert().none(), "causal"_a, "scale"_a.none(), "dropout_p"_a, "dropout_seed"_a,
        "num_threads"_a, nb::call_guard<nb::gil_scoped_release>(),
        "Scaled dot-product attention backward into `grad_query`, `grad_key` and `grad_value`.");
}

}  // namespace

NB_MODULE(_mha, m) {
  m.doc() = "mha's scaled dot-product attention on caller-owned arrays (use the mha package, not this module)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const mha::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  nb::enum_<Causal>(m, "Causal")
      .value("none", Causal::none)
      .value("top_left", Causal::top_left)
      .value("bottom_right", Causal::bottom_right);
  define<float>(m);
  define<double>(m);
}
