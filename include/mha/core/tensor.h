#pragma once
// Tensor<T>: an owning, contiguous, row-major n-d array. Deliberately small: shape, data and
// the few whole-tensor operations the layers above need. Views are plain pointers plus shapes
// inside the kernels; there is no stride machinery to get wrong.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mha/core/error.h"
#include "mha/core/half.h"

namespace mha {

using Shape = std::vector<int64_t>;

// "[2, 3, 4]": used in every shape error message.
std::string to_string(const Shape& shape);

// Product of the dimensions; throws mha::Error naming `what` when a dimension is negative or
// the product overflows int64 (so no allocation is ever sized from a wrapped number).
int64_t checked_numel(const Shape& shape, std::string_view what = "shape");

namespace detail {
// Storage for tensors: 64-byte aligned; blocks of 4 MiB and more are 2 MiB aligned and marked
// for transparent huge pages (madvise), so that the first touch of a large fresh tensor takes
// one page fault per 2 MiB instead of one per 4 KiB (Debian's default THP mode is "madvise").
// Throws std::bad_alloc. Freed with std::free.
void* allocate_storage(size_t bytes);
struct FreeStorage {
  void operator()(void* p) const;
};
}  // namespace detail

template <class T>
class Tensor {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>,
                "Tensor holds plain numbers (its storage is raw memory)");

 public:
  using value_type = T;

  Tensor() = default;
  explicit Tensor(Shape shape, T fill = T{}) : shape_(std::move(shape)) {
    numel_ = checked_numel(shape_);
    allocate();
    std::fill_n(data_.get(), numel_, fill);
  }
  Tensor(Shape shape, std::span<const T> values) : shape_(std::move(shape)) {
    numel_ = checked_numel(shape_);
    check(static_cast<int64_t>(values.size()) == numel_, "Tensor: shape ", to_string(shape_),
          " needs ", numel_, " values, got ", values.size());
    allocate();
    std::copy(values.begin(), values.end(), data_.get());
  }
  Tensor(Shape shape, std::initializer_list<T> values)
      : Tensor(std::move(shape), std::span<const T>(values.begin(), values.size())) {}

  // A tensor whose values are unspecified, for a result the caller then writes in full. It skips
  // the fill: on a large fresh tensor that is a second pass over memory the kernel has just
  // zeroed, and the first touch moves to the (often parallel) code that writes the values.
  static Tensor uninitialized(Shape shape) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.numel_ = checked_numel(t.shape_);
    t.allocate();
    return t;
  }

  Tensor(const Tensor& other) : shape_(other.shape_), numel_(other.numel_) {
    if (other.data_) {
      allocate();
      std::copy_n(other.data_.get(), numel_, data_.get());
    }
  }
  Tensor& operator=(const Tensor& other) {
    if (this != &other) *this = Tensor(other);
    return *this;
  }
  // A moved-from tensor is undefined like a default-constructed one, never a shape without data.
  Tensor(Tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, {})), numel_(std::exchange(other.numel_, 0)), data_(std::move(other.data_)) {}
  Tensor& operator=(Tensor&& other) noexcept {
    shape_ = std::exchange(other.shape_, {});
    numel_ = std::exchange(other.numel_, 0);
    data_ = std::move(other.data_);
    return *this;
  }

  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // size(-1) is the last dimension, as in PyTorch.
  int64_t size(int64_t axis) const {
    const int64_t d = dim();
    const int64_t a = axis < 0 ? axis + d : axis;
    check(a >= 0 && a < d, "Tensor::size: axis ", axis, " out of range for shape ", to_string(shape_));
    return shape_[static_cast<size_t>(a)];
  }
  int64_t numel() const { return numel_; }
  bool defined() const { return data_ != nullptr || (!shape_.empty() && numel_ == 0); }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::span<T> values() { return {data_.get(), static_cast<size_t>(numel_)}; }
  std::span<const T> values() const { return {data_.get(), static_cast<size_t>(numel_)}; }
  T& operator[](int64_t i) { return data_[static_cast<size_t>(i)]; }
  const T& operator[](int64_t i) const { return data_[static_cast<size_t>(i)]; }

  // Same data, new shape with the same number of elements; one dimension may be -1.
  Tensor reshape(Shape new_shape) const& {
    Tensor out(*this);
    out.reshape_in_place(std::move(new_shape));
    return out;
  }
  Tensor reshape(Shape new_shape) && {
    reshape_in_place(std::move(new_shape));
    return std::move(*this);
  }

 private:
  void reshape_in_place(Shape new_shape);
  void allocate() {
    data_.reset(static_cast<T*>(detail::allocate_storage(static_cast<size_t>(numel_) * sizeof(T))));
  }

  Shape shape_;
  int64_t numel_ = 0;
  std::unique_ptr<T[], detail::FreeStorage> data_;
};

using FloatTensor = Tensor<float>;
using DoubleTensor = Tensor<double>;
using BoolTensor = Tensor<bool>;

template <class T>
void Tensor<T>::reshape_in_place(Shape new_shape) {
  int64_t infer_at = -1;
  Shape known_dims;  // every dimension but the -1
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == -1) {
      check(infer_at < 0, "reshape: at most one -1 allowed, got ", to_string(new_shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      check(new_shape[i] >= 0, "reshape: dimensions must be >= 0, got ", to_string(new_shape));
      known_dims.push_back(new_shape[i]);
    }
  }
  // Checked: a plain product of the requested dimensions could overflow (undefined behaviour) and
  // wrap onto the element count.
  const int64_t known = checked_numel(known_dims, "reshape to " + to_string(new_shape));
  if (infer_at >= 0) {
    check(known != 0 && numel_ % known == 0, "reshape: cannot reshape ", to_string(shape_), " to ",
          to_string(new_shape));
    new_shape[static_cast<size_t>(infer_at)] = numel_ / known;
  }
  check(checked_numel(new_shape) == numel_, "reshape: cannot reshape ", to_string(shape_), " (",
        numel_, " elements) to ", to_string(new_shape));
  shape_ = std::move(new_shape);
}

// Element type conversion (float <-> double, bool -> float as 0/1, bfloat16/float16 <-> float or
// double, rounded once to nearest even).
template <class To, class From>
Tensor<To> cast(const Tensor<From>& from) {
  if (!from.defined()) return {};
  if constexpr ((is_half_v<To> && std::is_same_v<From, float>) || (std::is_same_v<To, float> && is_half_v<From>)) {
    Tensor<To> out = Tensor<To>::uninitialized(from.shape());  // the bulk conversions: the same bits
    convert(from.data(), out.data(), static_cast<size_t>(from.numel()));
    return out;
  }
  Tensor<To> out(from.shape());
  for (int64_t i = 0; i < from.numel(); ++i) {
    if constexpr (is_half_v<To> && is_half_v<From>) out[i] = narrow<To>(widen(from[i]));
    else if constexpr (is_half_v<To>) out[i] = narrow<To>(static_cast<double>(from[i]));
    else if constexpr (is_half_v<From>) out[i] = static_cast<To>(widen(from[i]));
    else out[i] = static_cast<To>(from[i]);
  }
  return out;
}

// Generic axis permutation: out.shape[i] = in.shape[axes[i]] (torch.permute).
template <class T>
Tensor<T> permute(const Tensor<T>& in, const std::vector<int>& axes);

// Insert / remove a size-1 dimension (torch.unsqueeze / squeeze(dim)).
template <class T>
Tensor<T> unsqueeze(const Tensor<T>& in, int64_t axis);
template <class T>
Tensor<T> squeeze(const Tensor<T>& in, int64_t axis);

// Broadcast to `shape` (torch.expand followed by contiguous): `in` has the same rank, and each
// of its dimensions equals the target's or is 1.
template <class T>
Tensor<T> expand(const Tensor<T>& in, const Shape& shape);

// Throws mha::Error "<what>: expected shape [..], got [..]" unless the shapes are equal.
void check_shape(const Shape& got, const Shape& expected, const std::string& what);

}  // namespace mha
