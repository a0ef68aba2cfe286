#pragma once
// The arguments of sdpa_forward / sdpa_backward checked into what the backends receive
// (problem.h): the operands' rows, the sizes and settings (make_problem), the masks and slopes
// (make_additions), the sinks (make_sinks), and the outputs (check_output). Every message names
// the argument, what was expected and what was received.
#include <utility>
#include <vector>

#include "mha/attention/attention.h"
#include "problem.h"

namespace mha::attention::detail {

// A (B, H, N, D) operand: rank 4, rows contiguous (a view of no elements reads no memory: any
// strides; numpy gives empty arrays all-zero strides).
template <class T>
Rows<T> rows_of(const View<T>& v, const char* name, const char* layout) {
  check(v.dim() == 4, name, ": expected a 4-D tensor ", layout, ", got shape ", v.shape());
  check(v.numel() == 0 || v.size(3) <= 1 || v.stride(3) == 1, name, ": expected a contiguous last dimension (stride 1), got shape ",
        v.shape(), " with strides ", v.strides());
  return {v.data(), v.stride(0), v.stride(1), v.stride(2)};
}

// logsumexp (B, H, L): any strides.
template <class T>
Rows<T> lse_rows_of(const View<T>& v) {
  return {v.data(), v.stride(0), v.stride(1), v.stride(2)};
}

template <class T>
Problem make_problem(const Shape& query, const Shape& key, const Shape& value, const Options<T>& options);

template <class T>
ScoreAdditions<T> make_additions(const Problem& p, const Options<T>& options);

// Options::sinks, checked; absent in a block of keys that does not hold the whole call's key 0.
template <class T>
Sinks<T> make_sinks(const Problem& p, const Options<T>& options);

// A shape of rank 4, checked before anything is allocated from it.
void check_rank4(const Shape& shape, const char* name, const char* layout);

using ByteRanges = std::vector<std::pair<const char*, const char*>>;

// The bytes a call reads: its operands' (given) and every view's.
template <class T>
ByteRanges input_ranges(ByteRanges operands, const Options<T>& options) {
  Options<T>::visit_views([&](const char*, auto member) { operands.push_back(byte_range(options.*member)); });
  return operands;
}

// An output: the expected shape, no element written twice, no overlap with what the call reads
// (`inputs`) or with the outputs checked before it (`written`, which it joins).
template <class T>
void check_output(const View<T>& out, const Shape& shape, const char* name,
                  const ByteRanges& inputs, ByteRanges& written) {
  check_shape(out.shape(), shape, name);
  check(elements_distinct(out), name, ": expected an output whose elements do not share memory, got strides ",
        out.strides(), " for shape ", out.shape());
  const auto [first, last] = byte_range(out);
  auto overlaps = [&, first = first, last = last](const std::pair<const char*, const char*>& r) {
    return first && r.first && first < r.second && r.first < last;
  };
  for (const auto& r : inputs) check(!overlaps(r), name, ": the output overlaps an input of the call");
  for (const auto& r : written) check(!overlaps(r), name, ": the output overlaps another output of the call");
  written.push_back({first, last});
}

}  // namespace mha::attention::detail
