#pragma once
// View<T>: a non-owning n-d view of memory someone else owns (a Tensor, a numpy array, a torch
// tensor): a pointer, a shape and a stride per dimension, counted in elements. T is const for a
// read-only view. Tensor<T>& converts to View<T> and const Tensor<T>& to View<const T>, so any
// function taking views takes tensors too, without a copy.
//
// Strides may be anything >= 0 (0 repeats an element: a broadcast); what a function accepts
// beyond that (a contiguous last dimension, outputs whose elements do not overlap) it checks and
// states in its own header.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "mha/core/tensor.h"

namespace mha {

template <class T>
class View {
 public:
  using value_type = T;

  View() = default;
  // A row-major (contiguous) view of `shape`.
  View(T* data, Shape shape) : View(data, shape, contiguous_strides(shape)) {}
  View(T* data, Shape shape, Shape strides) : data_(data), shape_(std::move(shape)), strides_(std::move(strides)) {
    check(strides_.size() == shape_.size(), "View: expected one stride per dimension, got shape ",
          shape_, " and strides ", strides_);
    numel_ = checked_numel(shape_, "View: shape");
    for (int64_t s : strides_) check(s >= 0, "View: strides must be >= 0, got ", strides_);
    check(data_ != nullptr || numel_ == 0, "View: null data for shape ", shape_);
  }
  // From tensors and from a mutable view of the same type.
  View(Tensor<std::remove_const_t<T>>& t) : View(t.data(), t.shape()) {}  // NOLINT: implicit by design
  template <class U = T, class = std::enable_if_t<std::is_const_v<U>>>
  View(const Tensor<std::remove_const_t<T>>& t) : View(t.data(), t.shape()) {}  // NOLINT
  template <class U = T, class = std::enable_if_t<std::is_const_v<U>>>
  View(const View<std::remove_const_t<T>>& v)  // NOLINT
      : data_(v.data()), shape_(v.shape()), strides_(v.strides()), numel_(v.numel()) {}

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const { return shape_[static_cast<size_t>(axis)]; }
  int64_t stride(int64_t axis) const { return strides_[static_cast<size_t>(axis)]; }
  int64_t numel() const { return numel_; }
  // An empty View() is undefined; a view of zero elements (any pointer) is defined.
  bool defined() const { return data_ != nullptr || !shape_.empty(); }

  // Elements [start, start + length) along `axis`: the same memory, no copy.
  View slice(int64_t axis, int64_t start, int64_t length) const {
    check(axis >= 0 && axis < dim(), "View::slice: axis: expected 0 to ", dim() - 1, ", got ", axis);
    check(start >= 0 && length >= 0 && start <= size(axis) && length <= size(axis) - start,
          "View::slice: expected [start, start + length) inside [0, ", size(axis), "), got start ", start,
          " and length ", length);
    Shape shape = shape_;
    shape[static_cast<size_t>(axis)] = length;
    const bool empty = length == 0 || numel_ == 0;
    return View(empty ? data_ : data_ + start * stride(axis), shape, strides_);
  }

  // Row-major with no gaps: the strides a Tensor of this shape has (size-1 dimensions excepted).
  // A view of no elements is (it addresses no memory).
  bool contiguous() const {
    if (numel_ == 0) return true;
    int64_t expected = 1;
    for (size_t i = shape_.size(); i-- > 0;) {
      if (shape_[i] != 1 && strides_[i] != expected) return false;
      expected *= shape_[i];
    }
    return true;
  }

  // A shape with a 0 gets strides 0, as numpy gives: no element is addressed, and the products
  // of the other dimensions, which need not fit 64 bits then, are never formed.
  static Shape contiguous_strides(const Shape& shape) {
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return Shape(shape.size(), 0);
    Shape strides(shape.size(), 1);
    for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
    return strides;
  }

 private:
  T* data_ = nullptr;
  Shape shape_, strides_;
  int64_t numel_ = 0;
};

// Memory a function may read as row-major: a contiguous view, or an empty one (it addresses no
// memory, so its strides do not matter; numpy >= 2 gives empty arrays strides of 0).
template <class T>
bool row_major(const View<T>& v) {
  return v.numel() == 0 || v.contiguous();
}

// The half-open address range [first, last + 1) of a view's elements, in bytes; empty for a view
// of no elements. Two views whose ranges do not intersect share no element.
template <class T>
std::pair<const char*, const char*> byte_range(const View<T>& v) {
  if (v.numel() == 0) return {nullptr, nullptr};
  int64_t last = 0;
  for (int64_t i = 0; i < v.dim(); ++i) last += (v.size(i) - 1) * v.stride(i);
  const char* first = reinterpret_cast<const char*>(v.data());
  return {first, reinterpret_cast<const char*>(v.data() + last + 1)};
}

template <class A, class B>
bool ranges_overlap(const View<A>& a, const View<B>& b) {
  const auto [a0, a1] = byte_range(a);
  const auto [b0, b1] = byte_range(b);
  return a0 && b0 && a0 < b1 && b0 < a1;
}

// True when no two index tuples of `v` reach the same element: sorted by stride, each dimension
// steps past everything the smaller ones span (size-1 dimensions ignored). A view of no elements
// has none to share.
template <class T>
bool elements_distinct(const View<T>& v) {
  if (v.numel() == 0) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t i = 0; i < v.dim(); ++i)
    if (v.size(i) > 1) dims.emplace_back(v.stride(i), v.size(i));
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dimensions so far, from the first
  for (const auto& [stride, size] : dims) {
    if (stride < span) return false;
    span = stride * (size - 1) + span;
  }
  return true;
}

}  // namespace mha
