#include "mha/core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <new>
#include <sstream>

namespace mha {

namespace detail {

void* allocate_storage(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20, kLarge = size_t{4} << 20;
  const size_t alignment = bytes >= kLarge ? kHugePage : 64;
  // aligned_alloc wants a multiple of the alignment; at least one block, so that a tensor of no
  // elements still has an address.
  const size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  if (rounded < bytes) throw std::bad_alloc();  // wrapped
  void* p = std::aligned_alloc(alignment, rounded);
  if (!p) throw std::bad_alloc();
  // Advice only: a kernel without THP refuses it and the memory works the same.
  if (alignment == kHugePage) (void)madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

void FreeStorage::operator()(void* p) const { std::free(p); }

}  // namespace detail

std::string to_string(const Shape& shape) { return detail::concat(shape); }

int64_t checked_numel(const Shape& shape, std::string_view what) {
  for (int64_t d : shape) check(d >= 0, what, ": dimensions must be >= 0, got ", shape);
  // A zero anywhere makes the product 0 whatever the other dimensions are.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (n > std::numeric_limits<int64_t>::max() / d)
      throw Error(detail::concat(what, ": number of elements overflows 64 bits for shape ", shape));
    n *= d;
  }
  return n;
}

void check_shape(const Shape& got, const Shape& expected, const std::string& what) {
  check(got == expected, what, ": expected shape ", expected, ", got ", got);
}

template <class T>
Tensor<T> permute(const Tensor<T>& in, const std::vector<int>& axes) {
  const int64_t rank = in.dim();
  check(static_cast<int64_t>(axes.size()) == rank, "permute: expected ", rank, " axes, got ",
        axes.size());
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  Shape out_shape(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) {
    const int a = axes[static_cast<size_t>(i)];
    check(a >= 0 && a < rank && !seen[static_cast<size_t>(a)], "permute: axes must be a permutation of 0..",
          rank - 1);
    seen[static_cast<size_t>(a)] = true;
    out_shape[static_cast<size_t>(i)] = in.shape()[static_cast<size_t>(a)];
  }
  Tensor<T> out(out_shape);
  if (in.numel() == 0) return out;
  // Trailing axes that stay in place form contiguous runs of `run` elements, copied whole (a
  // head split (N, L, H, d) → (N, H, L, d) copies runs of d). The output is walked run by run with
  // an odometer over the other axes; large tensors are cut into chunks of runs, one per thread.
  int64_t kept = rank, run = 1;
  while (kept > 0 && axes[static_cast<size_t>(kept - 1)] == kept - 1) run *= in.shape()[static_cast<size_t>(--kept)];
  std::vector<int64_t> in_stride(static_cast<size_t>(rank), 1);
  for (int64_t i = rank - 2; i >= 0; --i)
    in_stride[static_cast<size_t>(i)] = in_stride[static_cast<size_t>(i + 1)] * in.shape()[static_cast<size_t>(i + 1)];
  std::vector<int64_t> stride(static_cast<size_t>(kept));
  for (int64_t i = 0; i < kept; ++i) stride[static_cast<size_t>(i)] = in_stride[static_cast<size_t>(axes[static_cast<size_t>(i)])];
  const int64_t runs = out.numel() / run;
  constexpr int64_t kChunkElements = int64_t{1} << 16;  // below this, one thread does it all
  const int64_t runs_per_chunk = std::max<int64_t>(1, kChunkElements / run);
  const int64_t chunks = (runs + runs_per_chunk - 1) / runs_per_chunk;
  const T* src_data = in.data();
  T* dst_data = out.data();
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t first = chunk * runs_per_chunk, last = std::min(runs, first + runs_per_chunk);
    // The odometer at run `first`: its index over the kept output axes, and the input offset.
    std::vector<int64_t> index(static_cast<size_t>(kept), 0);
    int64_t src = 0;
    for (int64_t i = kept - 1, rest = first; i >= 0; --i) {
      const auto u = static_cast<size_t>(i);
      index[u] = rest % out_shape[u];
      rest /= out_shape[u];
      src += index[u] * stride[u];
    }
    for (int64_t r = first; r < last; ++r) {
      std::copy_n(src_data + src, run, dst_data + r * run);
      for (int64_t i = kept - 1; i >= 0; --i) {
        const auto u = static_cast<size_t>(i);
        if (++index[u] < out_shape[u]) {
          src += stride[u];
          break;
        }
        src -= stride[u] * (out_shape[u] - 1);
        index[u] = 0;
      }
    }
  }
  return out;
}

template <class T>
Tensor<T> unsqueeze(const Tensor<T>& in, int64_t axis) {
  Shape s = in.shape();
  const int64_t a = axis < 0 ? axis + in.dim() + 1 : axis;
  check(a >= 0 && a <= in.dim(), "unsqueeze: axis ", axis, " out of range for shape ", s);
  s.insert(s.begin() + a, 1);
  return in.reshape(s);
}

template <class T>
Tensor<T> squeeze(const Tensor<T>& in, int64_t axis) {
  Shape s = in.shape();
  const int64_t a = axis < 0 ? axis + in.dim() : axis;
  check(a >= 0 && a < in.dim() && s[static_cast<size_t>(a)] == 1, "squeeze: axis ", axis,
        " is not a size-1 dimension of shape ", s);
  s.erase(s.begin() + a);
  return in.reshape(s);
}

template <class T>
Tensor<T> expand(const Tensor<T>& in, const Shape& shape) {
  const Shape& from = in.shape();
  bool ok = from.size() == shape.size();
  for (size_t i = 0; ok && i < from.size(); ++i) ok = from[i] == shape[i] || from[i] == 1;
  check(ok, "expand: cannot broadcast shape ", from, " to ", shape);
  Tensor<T> out(shape);
  // Walk the output with an odometer; a broadcast dimension (size 1) never advances the source.
  const size_t rank = shape.size();
  std::vector<int64_t> stride(rank, 0), index(rank, 0);
  for (int64_t running = 1, i = static_cast<int64_t>(rank) - 1; i >= 0; --i) {
    const auto u = static_cast<size_t>(i);
    stride[u] = from[u] == 1 ? 0 : running;
    running *= from[u];
  }
  int64_t src = 0;
  for (int64_t n = 0; n < out.numel(); ++n) {
    out[n] = in[src];
    for (size_t i = rank; i-- > 0;) {
      if (++index[i] < shape[i]) {
        src += stride[i];
        break;
      }
      src -= stride[i] * (shape[i] - 1);
      index[i] = 0;
    }
  }
  return out;
}

#define MHA_INSTANTIATE(T)                                                  \
  template Tensor<T> expand(const Tensor<T>&, const Shape&);               \
  template Tensor<T> permute(const Tensor<T>&, const std::vector<int>&);   \
  template Tensor<T> unsqueeze(const Tensor<T>&, int64_t);                 \
  template Tensor<T> squeeze(const Tensor<T>&, int64_t);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bool)
MHA_INSTANTIATE(int64_t)
MHA_INSTANTIATE(int32_t)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace mha
