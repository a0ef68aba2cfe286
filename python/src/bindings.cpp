// _mha: the two scaled dot-product attention calls of mha/attention/attention.h, the two
// multi-head attention calls of mha/nn/multihead_attention.h and the sentence encoder of
// mha/models/sentence_encoder.h, for Python.
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
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/variant.h>
#include <omp.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "mha/attention/attention.h"
#include "mha/core/bf16_gemm.h"
#include "mha/models/sentence_encoder.h"
#include "mha/nn/multihead_attention.h"
#include "mha/nn/paged_kv_cache.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using mha::attention::Causal;
using mha::attention::Scoring;

// bfloat16 and float16 arrays arrive as their bits, uint16 (numpy has no bfloat16, and neither
// numpy's buffer protocol nor its DLPack export takes ml_dtypes' bfloat16): the functions of those
// types carry the type in their name (sdpa_forward_bfloat16), and view() reads the bits as it.
template <class T>
struct Stored {
  using type = T;
};
template <>
struct Stored<mha::bfloat16> {
  using type = uint16_t;
};
template <>
struct Stored<mha::float16> {
  using type = uint16_t;
};
template <class T>
using In = nb::ndarray<const typename Stored<T>::type, nb::device::cpu>;
template <class T>
using Out = nb::ndarray<typename Stored<T>::type, nb::device::cpu>;

template <class T, class Array>
mha::View<T> view(const Array& a) {
  mha::Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  static_assert(sizeof(*a.data()) == sizeof(T));
  return mha::View<T>(reinterpret_cast<T*>(a.data()), std::move(shape), std::move(strides));
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

// The element type of a view of Options<T> (View<const E>: bool, T or int64_t) or of a module
// call's (MultiheadAttentionArgs: std::optional<Tensor<T>>).
template <class V>
struct Element {
  using type = std::remove_const_t<typename V::value_type>;
};
template <class E>
struct Element<std::optional<mha::Tensor<E>>> {
  using type = E;
};
template <class V>
using element_of = typename Element<std::remove_cvref_t<V>>::type;

// What a view of Options<T> holds, for Python: "bool" (a mask), "value" (the call's element
// type: sinks, slopes, an additive mask) or "index" (int64 lengths and offsets).
template <class T, class E>
constexpr const char* view_kind() {
  if constexpr (std::is_same_v<E, bool>) return "bool";
  else if constexpr (std::is_same_v<E, T>) return "value";
  else return "index";
}

// The arrays of `views`, a sequence in the order of Holder::visit_views (None for an absent one),
// each handed to set(member, array, std::type_identity<E>{}) as given (noconvert: a wrong dtype is
// a TypeError naming the view). Needs the GIL.
template <class Holder, class T, class Set>
void read_views(const nb::sequence& views, const char* what, Set&& set) {
  size_t index = 0, count = 0;
  Holder::visit_views([&](const char*, auto) { ++count; });
  mha::check(nb::len(views) == count, "views: expected ", count, " entries (", what, ", in order), got ",
             nb::len(views));
  Holder::visit_views([&](const char* name, auto member) {
    const nb::handle array = views[index++];
    if (array.is_none()) return;
    using E = element_of<std::remove_cvref_t<decltype(std::declval<Holder&>().*member)>>;
    In<E> in;
    if (!nb::try_cast(array, in, /*convert=*/false))
      throw nb::type_error((std::string(name) + ": expected a CPU array of the element type mha takes (" +
                            view_kind<T, E>() + "), got " + nb::inst_name(array).c_str())
                               .c_str());
    set(member, in, std::type_identity<E>{});
  });
}

// Options<T>'s typed views from `views` (read_views), each array taken in place: the arrays stay
// the caller's, who holds them for the call.
template <class T>
mha::attention::Options<T> options(const Scoring& scoring, const nb::sequence& views) {
  mha::attention::Options<T> opt;
  static_cast<Scoring&>(opt) = scoring;
  read_views<mha::attention::Options<T>, T>(views, "mha's Options views", [&](auto member, const auto& in, auto e) {
    opt.*member = view<const typename decltype(e)::type>(in);
  });
  return opt;
}

template <class T>
void sdpa_forward(const In<T>& query, const In<T>& key, const In<T>& value, const Out<T>& output,
                  const Out<double>& logsumexp, const Scoring& scoring, const nb::sequence& views, int num_threads,
                  const std::optional<Out<T>>& weights) {
  mha::attention::ForwardOutputs<T> out{view<T>(output), view<double>(logsumexp),
                                        weights ? view<T>(*weights) : mha::View<T>()};
  auto opt = options<T>(scoring, views);
  opt.need_weights = weights.has_value();
  nb::gil_scoped_release released;
  OpenMPThreads threads(num_threads);
  mha::attention::sdpa_forward_into<T>(view<const T>(query), view<const T>(key), view<const T>(value), out, opt);
}

template <class T>
void sdpa_backward(const In<T>& query, const In<T>& key, const In<T>& value, const In<T>& output,
                   const In<double>& logsumexp, const In<T>& grad_output, const Out<T>& grad_query,
                   const Out<T>& grad_key, const Out<T>& grad_value, const Scoring& scoring,
                   const nb::sequence& views, int num_threads, const std::optional<Out<T>>& grad_sinks) {
  mha::attention::GradientOutputs<T> grads{view<T>(grad_query), view<T>(grad_key), view<T>(grad_value), false,
                                           grad_sinks ? view<T>(*grad_sinks) : mha::View<T>()};
  const auto opt = options<T>(scoring, views);
  nb::gil_scoped_release released;
  OpenMPThreads threads(num_threads);
  mha::attention::sdpa_backward_into<T>(view<const T>(query), view<const T>(key), view<const T>(value),
                                        view<const T>(output), view<const double>(logsumexp),
                                        view<const T>(grad_output), grads, opt);
}

template <class T>
void merge_partial(const Out<double>& output, const Out<double>& logsumexp, const In<T>& block_output,
                   const In<double>& block_logsumexp) {
  mha::attention::merge_partial<T>(view<double>(output), view<double>(logsumexp), view<const T>(block_output),
                                   view<const double>(block_logsumexp));
}

// paged_forward_into on pages of Kv (float32, bfloat16, float16 as their bits, or int8 with its
// scales), a float32 query and outputs.
template <class Kv>
void paged_forward(const In<float>& query, const In<Kv>& key_pages, const In<Kv>& value_pages,
                   const In<int32_t>& block_table, const std::optional<In<float>>& key_scales,
                   const std::optional<In<float>>& value_scales, const Out<float>& output,
                   const Out<double>& logsumexp, const Scoring& scoring, const nb::sequence& views, int num_threads) {
  const mha::attention::PagedKv<Kv> kv{view<const Kv>(key_pages), view<const Kv>(value_pages),
                                       view<const int32_t>(block_table),
                                       key_scales ? view<const float>(*key_scales) : mha::View<const float>(),
                                       value_scales ? view<const float>(*value_scales) : mha::View<const float>()};
  const auto opt = options<float>(scoring, views);
  nb::gil_scoped_release released;
  OpenMPThreads threads(num_threads);
  mha::attention::paged_forward_into<Kv>(view<const float>(query), kv, {view<float>(output), view<double>(logsumexp), {}},
                                         opt);
}

template <class Kv>
void define_paged(nb::module_& m) {
  m.def((std::string("paged_forward_") + mha::storage_name<Kv>()).c_str(), &paged_forward<Kv>, "query"_a.noconvert(),
        "key_pages"_a.noconvert(), "value_pages"_a.noconvert(), "block_table"_a.noconvert(),
        "key_scales"_a.noconvert().none(), "value_scales"_a.noconvert().none(), "output"_a.noconvert(),
        "logsumexp"_a.noconvert(), "scoring"_a, "views"_a, "num_threads"_a,
        "Attention of packed queries (1, Hq, T, Dqk) over paged keys and values (pages, Hkv, P, D) through a "
        "block table (N, blocks) int32 (mha/attention/attention.h, paged_forward_into).");
}

// A settings struct as a Python class whose attributes are its fields, each bound from the
// struct's own list (visit_fields): a new Scoring field reaches Python with no edit here.
template <class Settings>
void bind_settings(nb::module_& m, const char* name) {
  nb::class_<Settings> cls(m, name);
  cls.def(nb::init<>());
  Settings::visit_fields([&](const char* field, auto member) { cls.def_rw(field, member); });
}

// ---------------------------------------------------------------------------------------------
// nn.MultiheadAttention's computation (mha::nn::multihead_attention_forward / _backward) on
// torch's parameters, read in place. Between forward and backward the cache travels through
// Python: forward returns what backward needs as arrays that own mha's tensors (no copy), torch
// saves them, and backward views them again. The masks are not among them: backward recomputes
// their canonical form from the module's own masks (multihead_attention_masks), which is cheap
// next to the attention and keeps the saved set to plain tensors.

// A mask as the module takes it (bool: True = blocked, or float: added); copied into an
// mha::Tensor (the module's argument type), hence contiguous.
template <class T>
using MaskArray = std::variant<nb::ndarray<const bool, nb::device::cpu, nb::c_contig>,
                               nb::ndarray<const typename Stored<T>::type, nb::device::cpu, nb::c_contig>>;

template <class E, class Array>
mha::Tensor<E> tensor_copy(const Array& a) {
  mha::Shape shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<int64_t>(a.shape(i));
  static_assert(sizeof(*a.data()) == sizeof(E));  // (a half type's bits)
  return mha::Tensor<E>(shape, std::span<const E>(reinterpret_cast<const E*>(a.data()), a.size()));
}

template <class T>
std::optional<mha::nn::Mask<T>> module_mask(const std::optional<MaskArray<T>>& m) {
  if (!m) return std::nullopt;
  if (const auto* b = std::get_if<0>(&*m)) return mha::nn::Mask<T>(tensor_copy<bool>(*b));
  return mha::nn::Mask<T>(tensor_copy<T>(std::get<1>(*m)));
}

template <class T>
mha::View<const T> optional_view(const std::optional<In<T>>& a) {
  return a ? view<const T>(*a) : mha::View<const T>();
}
template <class T>
mha::View<T> optional_out(const std::optional<Out<T>>& a) {
  return a ? view<T>(*a) : mha::View<T>();
}

// The parameters in state_dict order, each None when the module has none.
template <class T>
struct WeightArrays {
  std::optional<In<T>> in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, bias_k,
      bias_v;
  In<T> out_proj_weight;
  std::optional<In<T>> out_proj_bias;

  mha::nn::MultiheadAttentionWeights<T> views() const {
    return {optional_view<T>(in_proj_weight), optional_view<T>(q_proj_weight),   optional_view<T>(k_proj_weight),
            optional_view<T>(v_proj_weight),  optional_view<T>(in_proj_bias),    optional_view<T>(bias_k),
            optional_view<T>(bias_v),         view<const T>(out_proj_weight), optional_view<T>(out_proj_bias)};
  }
};

// The module's options: the sizes and settings are the module's; bias and add_bias_kv follow from
// which parameters it has (multihead_attention_forward checks that the rest agree).
template <class T>
mha::nn::MultiheadAttentionOptions module_options(const WeightArrays<T>& w, int64_t embed_dim, int64_t kdim,
                                                  int64_t vdim, int64_t num_heads, bool add_zero_attn,
                                                  bool batch_first, double dropout_p, const Scoring& scoring) {
  mha::nn::MultiheadAttentionOptions o;
  o.scoring = scoring;
  o.embed_dim = embed_dim;
  o.kdim = kdim;
  o.vdim = vdim;
  o.num_heads = num_heads;
  o.dropout = dropout_p;
  o.bias = w.in_proj_bias.has_value();
  o.add_bias_kv = w.bias_k.has_value();
  o.add_zero_attn = add_zero_attn;
  o.batch_first = batch_first;
  return o;
}

// A module call's arguments, its views (MultiheadAttentionArgs::visit_views) copied from `views`.
template <class T>
mha::nn::MultiheadAttentionArgs<T> module_args(const std::optional<MaskArray<T>>& key_padding_mask, bool need_weights,
                                               const std::optional<MaskArray<T>>& attn_mask, bool average_attn_weights,
                                               bool is_causal, const nb::sequence& views) {
  mha::nn::MultiheadAttentionArgs<T> args{module_mask<T>(key_padding_mask), need_weights, module_mask<T>(attn_mask),
                                          average_attn_weights, is_causal};
  read_views<mha::nn::MultiheadAttentionArgs<T>, T>(views, "the module's call views",
                                                    [&](auto member, const auto& in, auto e) {
                                                      args.*member = tensor_copy<typename decltype(e)::type>(in);
                                                    });
  return args;
}

// An mha::Tensor handed to numpy: the array owns it (freed with the array), no copy. A half
// type's tensor is its uint16 bits.
template <class T>
nb::ndarray<nb::numpy, typename Stored<T>::type> to_numpy(mha::Tensor<T>&& t) {
  using S = typename Stored<T>::type;
  auto* owned = new mha::Tensor<T>(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<mha::Tensor<T>*>(p); });
  std::vector<size_t> shape(owned->shape().begin(), owned->shape().end());
  return nb::ndarray<nb::numpy, S>(reinterpret_cast<S*>(owned->data()), shape.size(), shape.data(), owner);
}

template <class T>
nb::tuple multihead_attention_forward(
    const In<T>& query, const In<T>& key, const In<T>& value, const std::optional<In<T>>& in_proj_weight,
    const std::optional<In<T>>& q_proj_weight, const std::optional<In<T>>& k_proj_weight,
    const std::optional<In<T>>& v_proj_weight, const std::optional<In<T>>& in_proj_bias,
    const std::optional<In<T>>& bias_k, const std::optional<In<T>>& bias_v, const In<T>& out_proj_weight,
    const std::optional<In<T>>& out_proj_bias, const std::optional<MaskArray<T>>& key_padding_mask,
    const std::optional<MaskArray<T>>& attn_mask, int64_t embed_dim, int64_t kdim, int64_t vdim,
    int64_t num_heads, bool add_zero_attn, bool batch_first, bool need_weights, bool average_attn_weights,
    bool is_causal, double dropout_p, uint64_t dropout_seed, const Scoring& scoring, const nb::sequence& views,
    int num_threads) {
  const WeightArrays<T> weights{in_proj_weight, q_proj_weight, k_proj_weight,   v_proj_weight, in_proj_bias,
                                bias_k,         bias_v,        out_proj_weight, out_proj_bias};
  const auto options =
      module_options(weights, embed_dim, kdim, vdim, num_heads, add_zero_attn, batch_first, dropout_p, scoring);
  const auto args =
      module_args<T>(key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal, views);
  mha::nn::MultiheadAttentionOutput<T> out;
  mha::nn::MultiheadAttentionCache<T> cache;
  {
    nb::gil_scoped_release released;
    OpenMPThreads threads(num_threads);
    out = mha::nn::multihead_attention_forward<T>(
        options, weights.views(), view<const T>(query), view<const T>(key), view<const T>(value), args,
        dropout_p > 0, dropout_seed, mha::attention::Backend::automatic, &cache);
  }
  nb::object attn_weights = nb::none();
  if (out.attn_weights) attn_weights = nb::cast(to_numpy(std::move(*out.attn_weights)));
  return nb::make_tuple(to_numpy(std::move(out.output)), attn_weights, to_numpy(std::move(cache.q)),
                        to_numpy(std::move(cache.k)), to_numpy(std::move(cache.v)),
                        to_numpy(std::move(cache.logsumexp)), to_numpy(std::move(cache.merged)));
}

template <class T>
nb::tuple multihead_attention_backward(
    const In<T>& grad_output, const In<T>& query, const In<T>& key, const In<T>& value,
    const std::optional<In<T>>& in_proj_weight, const std::optional<In<T>>& q_proj_weight,
    const std::optional<In<T>>& k_proj_weight, const std::optional<In<T>>& v_proj_weight,
    const std::optional<In<T>>& in_proj_bias, const std::optional<In<T>>& bias_k,
    const std::optional<In<T>>& bias_v, const In<T>& out_proj_weight,
    const std::optional<In<T>>& out_proj_bias, const std::optional<MaskArray<T>>& key_padding_mask,
    const std::optional<MaskArray<T>>& attn_mask, int64_t embed_dim, int64_t kdim, int64_t vdim,
    int64_t num_heads, bool add_zero_attn, bool batch_first, bool need_weights, bool is_causal,
    double dropout_p, uint64_t dropout_seed, const Scoring& scoring, const nb::sequence& views, const In<T>& q,
    const In<T>& k, const In<T>& v,
    const In<double>& logsumexp, const In<T>& merged, const std::optional<Out<T>>& grad_in_proj_weight,
    const std::optional<Out<T>>& grad_q_proj_weight, const std::optional<Out<T>>& grad_k_proj_weight,
    const std::optional<Out<T>>& grad_v_proj_weight, const std::optional<Out<T>>& grad_in_proj_bias,
    const std::optional<Out<T>>& grad_bias_k, const std::optional<Out<T>>& grad_bias_v,
    const std::optional<Out<T>>& grad_out_proj_weight, const std::optional<Out<T>>& grad_out_proj_bias,
    int num_threads) {
  const WeightArrays<T> weights{in_proj_weight, q_proj_weight, k_proj_weight,   v_proj_weight, in_proj_bias,
                                bias_k,         bias_v,        out_proj_weight, out_proj_bias};
  const auto options =
      module_options(weights, embed_dim, kdim, vdim, num_heads, add_zero_attn, batch_first, dropout_p, scoring);
  const mha::nn::MultiheadAttentionWeightGradients<T> grad_views{
      optional_out<T>(grad_in_proj_weight), optional_out<T>(grad_q_proj_weight),
      optional_out<T>(grad_k_proj_weight),  optional_out<T>(grad_v_proj_weight),
      optional_out<T>(grad_in_proj_bias),   optional_out<T>(grad_bias_k),
      optional_out<T>(grad_bias_v),         optional_out<T>(grad_out_proj_weight),
      optional_out<T>(grad_out_proj_bias)};
  const auto args = module_args<T>(key_padding_mask, need_weights, attn_mask, true, is_causal, views);
  mha::nn::MultiheadAttentionGradients<T> out;
  {
    nb::gil_scoped_release released;
    OpenMPThreads threads(num_threads);
    // The canonical masks, as forward made them from the same arguments.
    mha::check(query.ndim() == 2 || query.ndim() == 3, "query: expected 2-D or 3-D, got ", query.ndim(),
               "-D");
    mha::check(key.ndim() == query.ndim(), "key: expected ", query.ndim(), "-D like query, got ", key.ndim(),
               "-D");
    const bool unbatched = query.ndim() == 2;
    const size_t batch_axis = batch_first ? 0 : 1, seq_axis = unbatched || !batch_first ? 0 : 1;
    const auto n = unbatched ? int64_t{1} : static_cast<int64_t>(query.shape(batch_axis));
    const auto masks = mha::nn::multihead_attention_masks<T>(
        mha::nn::resolved_options(options), args, n, static_cast<int64_t>(query.shape(seq_axis)),
        static_cast<int64_t>(key.shape(seq_axis)), unbatched);
    mha::nn::MultiheadAttentionSaved<T> saved;
    saved.query = view<const T>(query);
    saved.key = view<const T>(key);
    saved.value = view<const T>(value);
    saved.q = view<const T>(q);
    saved.k = view<const T>(k);
    saved.v = view<const T>(v);
    saved.logsumexp = view<const double>(logsumexp);
    saved.merged = view<const T>(merged);
    saved.core = masks.core_options(mha::nn::module_scoring(options, dropout_p, dropout_seed));
    out = mha::nn::multihead_attention_backward<T>(options, weights.views(), view<const T>(grad_output),
                                                   saved, grad_views);
  }
  nb::object grad_sinks = nb::none();
  if (out.grad_sinks) grad_sinks = nb::cast(to_numpy(std::move(*out.grad_sinks)));
  return nb::make_tuple(to_numpy(std::move(out.grad_query)), to_numpy(std::move(out.grad_key)),
                        to_numpy(std::move(out.grad_value)), grad_sinks);
}

// mha::nn::PagedKVCache<Kv> as a Python class (PagedKVCache_<dtype>): the pool and its sequences;
// pages(layer) returns the layer's pages (and int8 scales) as arrays of the cache's own memory,
// which keep the cache alive, for paged_forward.
template <class Kv>
void define_paged_cache(nb::module_& m) {
  using Cache = mha::nn::PagedKVCache<Kv>;
  using S = typename Stored<Kv>::type;
  auto memory = [](nb::handle owner, const auto& v) {
    using E = std::conditional_t<std::is_same_v<std::remove_cvref_t<decltype(*v.data())>, float>, float, S>;
    std::vector<size_t> shape(v.shape().begin(), v.shape().end());
    return nb::ndarray<nb::numpy, const E>(reinterpret_cast<const E*>(v.data()), shape.size(), shape.data(), owner);
  };
  nb::class_<Cache>(m, (std::string("PagedKVCache_") + mha::storage_name<Kv>()).c_str())
      .def(nb::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>(), "layers"_a, "pages"_a, "page_size"_a,
           "kv_heads"_a, "qk_head_dim"_a, "v_head_dim"_a)
      .def("add", &Cache::add)
      .def("fork", &Cache::fork, "sequence"_a)
      .def("release", &Cache::release, "sequence"_a)
      .def("length", &Cache::length, "sequence"_a)
      .def(
          "extend",
          [](Cache& c, const std::vector<int64_t>& seqs, const std::vector<int64_t>& counts) { c.extend(seqs, counts); },
          "seqs"_a, "counts"_a)
      .def(
          "write",
          [](Cache& c, int64_t layer, const std::vector<int64_t>& seqs, const In<float>& key, const In<float>& value,
             const std::vector<int64_t>& cu_seqlens) {
            const auto k = view<const float>(key), v = view<const float>(value);
            nb::gil_scoped_release released;
            c.write(layer, seqs, k, v, cu_seqlens);
          },
          "layer"_a, "seqs"_a, "key"_a.noconvert(), "value"_a.noconvert(), "cu_seqlens"_a)
      .def(
          "block_table", [](const Cache& c, const std::vector<int64_t>& seqs) { return to_numpy(c.block_table(seqs)); },
          "seqs"_a)
      .def(
          "pages",
          [memory](nb::handle self, int64_t layer) {
            const Cache& c = nb::cast<const Cache&>(self);
            const mha::Tensor<int32_t> none({0, 1});
            const auto kv = c.pages(layer, none);
            nb::object scales[2] = {nb::none(), nb::none()};
            if constexpr (std::is_same_v<Kv, int8_t>) {
              scales[0] = nb::cast(memory(self, kv.key_scales));
              scales[1] = nb::cast(memory(self, kv.value_scales));
            }
            return nb::make_tuple(memory(self, kv.key_pages), memory(self, kv.value_pages), scales[0], scales[1]);
          },
          "layer"_a,
          "(key_pages (pages, Hkv, P, Dqk), value_pages, key_scales (pages, Hkv, P) or None, value_scales): the "
          "cache's own memory, read-only")
      .def_prop_ro("layers", &Cache::layers)
      .def_prop_ro("page_count", &Cache::page_count)
      .def_prop_ro("page_size", &Cache::page_size)
      .def_prop_ro("kv_heads", &Cache::kv_heads)
      .def_prop_ro("qk_head_dim", &Cache::qk_head_dim)
      .def_prop_ro("v_head_dim", &Cache::v_head_dim)
      .def_prop_ro("pages_in_use", &Cache::pages_in_use)
      .def_prop_ro("free_pages", &Cache::free_pages);
}

// The attention calls of one element type: float32 and float64 as overloads of one name (nanobind
// picks the one whose dtypes match, noconvert), bfloat16 and float16 under their own names
// (`suffix`: their arrays are all uint16).
template <class T>
void define_attention(nb::module_& m, const std::string& suffix) {
  m.def(("sdpa_forward" + suffix).c_str(), &sdpa_forward<T>, "query"_a.noconvert(), "key"_a.noconvert(),
        "value"_a.noconvert(), "output"_a.noconvert(), "logsumexp"_a.noconvert(), "scoring"_a, "views"_a,
        "num_threads"_a, "weights"_a.noconvert().none() = nb::none(),
        "Scaled dot-product attention forward into `output` (B, Hq, L, Dv) and `logsumexp` (B, Hq, L), and the "
        "probabilities into `weights` (B, Hq, L, S) when given; `views`: Options' typed views in the order of "
        "views() (None where absent).");
  m.def(("sdpa_backward" + suffix).c_str(), &sdpa_backward<T>, "query"_a.noconvert(), "key"_a.noconvert(),
        "value"_a.noconvert(), "output"_a.noconvert(), "logsumexp"_a.noconvert(), "grad_output"_a.noconvert(),
        "grad_query"_a.noconvert(), "grad_key"_a.noconvert(), "grad_value"_a.noconvert(), "scoring"_a, "views"_a,
        "num_threads"_a, "grad_sinks"_a.noconvert().none() = nb::none(),
        "Scaled dot-product attention backward into `grad_query`, `grad_key`, `grad_value` (and `grad_sinks`).");
  m.def(("merge_partial" + suffix).c_str(), &merge_partial<T>, "output"_a.noconvert(), "logsumexp"_a.noconvert(),
        "block_output"_a.noconvert(), "block_logsumexp"_a.noconvert(), nb::call_guard<nb::gil_scoped_release>(),
        "Log-sum-exp merge of a block's attention (B, H, L, Dv), (B, H, L) into the float64 accumulators.");
}

// nn.MultiheadAttention's calls: float32 and float64 as overloads of one name, bfloat16 and
// float16 under their own (`suffix`), as the attention calls.
template <class T>
void define_module(nb::module_& m, const std::string& suffix) {
  // Not call_guard'ed: they release the GIL themselves, around the computation only (their
  // results become numpy arrays, which needs the GIL).
  m.def(("multihead_attention_forward" + suffix).c_str(), &multihead_attention_forward<T>, "query"_a.noconvert(),
        "key"_a.noconvert(), "value"_a.noconvert(), "in_proj_weight"_a.noconvert().none(),
        "q_proj_weight"_a.noconvert().none(), "k_proj_weight"_a.noconvert().none(),
        "v_proj_weight"_a.noconvert().none(), "in_proj_bias"_a.noconvert().none(),
        "bias_k"_a.noconvert().none(), "bias_v"_a.noconvert().none(), "out_proj_weight"_a.noconvert(),
        "out_proj_bias"_a.noconvert().none(), "key_padding_mask"_a.noconvert().none(),
        "attn_mask"_a.noconvert().none(), "embed_dim"_a, "kdim"_a, "vdim"_a, "num_heads"_a, "add_zero_attn"_a,
        "batch_first"_a, "need_weights"_a, "average_attn_weights"_a, "is_causal"_a, "dropout_p"_a,
        "dropout_seed"_a, "scoring"_a, "views"_a, "num_threads"_a,
        "nn.MultiheadAttention's forward on these parameters: (output, attn_weights or None, q, k, v, "
        "logsumexp, merged), the last five for multihead_attention_backward; `scoring`: the module's settings "
        "(MultiheadAttentionOptions::scoring), `views`: the call's in the order of module_views().");
  m.def(("multihead_attention_backward" + suffix).c_str(), &multihead_attention_backward<T>, "grad_output"_a.noconvert(),
        "query"_a.noconvert(), "key"_a.noconvert(), "value"_a.noconvert(),
        "in_proj_weight"_a.noconvert().none(), "q_proj_weight"_a.noconvert().none(),
        "k_proj_weight"_a.noconvert().none(), "v_proj_weight"_a.noconvert().none(),
        "in_proj_bias"_a.noconvert().none(), "bias_k"_a.noconvert().none(), "bias_v"_a.noconvert().none(),
        "out_proj_weight"_a.noconvert(), "out_proj_bias"_a.noconvert().none(),
        "key_padding_mask"_a.noconvert().none(), "attn_mask"_a.noconvert().none(), "embed_dim"_a, "kdim"_a,
        "vdim"_a, "num_heads"_a, "add_zero_attn"_a, "batch_first"_a, "need_weights"_a, "is_causal"_a,
        "dropout_p"_a, "dropout_seed"_a, "scoring"_a, "views"_a, "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(),
        "logsumexp"_a.noconvert(), "merged"_a.noconvert(), "grad_in_proj_weight"_a.noconvert().none(),
        "grad_q_proj_weight"_a.noconvert().none(), "grad_k_proj_weight"_a.noconvert().none(),
        "grad_v_proj_weight"_a.noconvert().none(), "grad_in_proj_bias"_a.noconvert().none(),
        "grad_bias_k"_a.noconvert().none(), "grad_bias_v"_a.noconvert().none(),
        "grad_out_proj_weight"_a.noconvert().none(), "grad_out_proj_bias"_a.noconvert().none(),
        "num_threads"_a,
        "nn.MultiheadAttention's backward: (grad_query, grad_key, grad_value, grad_sinks or None); parameter "
        "gradients are added into the grad_* arrays given.");
}

}  // namespace

NB_MODULE(_mha, m) {
  m.doc() =
      "mha's scaled dot-product and multi-head attention on caller-owned arrays (use the mha package, not "
      "this module)";
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
  bind_settings<mha::attention::WholeCall>(m, "WholeCall");
  bind_settings<Scoring>(m, "Scoring");
  // The two lists the Python doors are built from (python/mha/_fields.py): Scoring's plain fields
  // (with WholeCall's, which Python does not set) and Options' typed views with what each holds.
  m.def(
      "scoring_fields",
      [] {
        std::vector<std::string> names;
        Scoring::visit_fields([&](const char* name, auto) { names.emplace_back(name); });
        return names;
      },
      "Scoring's fields in the order of Scoring::visit_fields.");
  m.def(
      "views",
      [] {
        std::vector<std::pair<std::string, std::string>> list;
        using Float = mha::attention::Options<float>;
        Float::visit_views([&](const char* name, auto member) {
          list.emplace_back(name, view_kind<float, element_of<decltype(Float{}.*member)>>());
        });
        return list;
      },
      "Options' typed views as (name, kind) in the order of Options::visit_views, kind \"bool\", \"value\" (the "
      "call's element type) or \"index\" (int64).");
  m.def(
      "module_views",
      [] {
        std::vector<std::string> names;
        mha::nn::MultiheadAttentionArgs<float>::visit_views([&](const char* name, auto) { names.emplace_back(name); });
        return names;
      },
      "A module call's views (MultiheadAttentionArgs::visit_views), in order.");
  m.def(
      "check_module_scoring",
      [](const Scoring& scoring) {
        mha::nn::MultiheadAttentionOptions o;
        o.embed_dim = o.num_heads = 1;
        o.scoring = scoring;
        mha::nn::resolved_options(o);
      },
      "scoring"_a, "MultiheadAttention's checks of its settings (MultiheadAttentionOptions::scoring).");
  define_attention<float>(m, "");
  define_attention<double>(m, "");
  define_attention<mha::bfloat16>(m, "_bfloat16");
  define_attention<mha::float16>(m, "_float16");
  define_paged<float>(m);
  define_paged<mha::bfloat16>(m);
  define_paged<mha::float16>(m);
  define_paged<int8_t>(m);
  define_paged_cache<float>(m);
  define_paged_cache<mha::bfloat16>(m);
  define_paged_cache<mha::float16>(m);
  define_paged_cache<int8_t>(m);
  define_module<float>(m, "");
  define_module<double>(m, "");
  define_module<mha::bfloat16>(m, "_bfloat16");
  define_module<mha::float16>(m, "_float16");
  m.def("bf16_native", &mha::bf16_gemm::native,
        "Whether bfloat16 attention's products run on the CPU's bf16 instructions (AMX or AVX512_BF16) here.");
  m.def(
      "bf16_path", [] { return std::string(mha::bf16_gemm::name(mha::bf16_gemm::path())); },
      "What bfloat16's products run on here: AMX tiles, VDPBF16PS or float32 (operands widened).");
  // mha::models::SentenceEncoder: loading (the directory's files) and encode, the GIL released.
  nb::class_<mha::models::SentenceEncoder>(m, "SentenceEncoder")
      .def(
          "__init__",
          [](mha::models::SentenceEncoder* self, const std::string& directory, const std::string& dtype) {
            new (self) mha::models::SentenceEncoder(directory, mha::models::dtype_from_name(dtype));
          },
          "directory"_a, "dtype"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "encode",
          [](const mha::models::SentenceEncoder& encoder, const std::vector<std::string>& sentences,
             int64_t batch_size, int num_threads) {
            mha::Tensor<float> out;
            {
              nb::gil_scoped_release released;
              OpenMPThreads threads(num_threads);
              out = encoder.encode(sentences, batch_size);
            }
            return to_numpy(std::move(out));
          },
          "sentences"_a, "batch_size"_a, "num_threads"_a)
      .def_prop_ro("dimension", &mha::models::SentenceEncoder::dimension)
      .def_prop_ro("dtype", [](const mha::models::SentenceEncoder& e) { return std::string(mha::models::dtype_name(e.dtype())); })
      .def_prop_ro("max_seq_length", &mha::models::SentenceEncoder::max_seq_length);
}
