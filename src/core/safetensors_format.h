#pragma once
// What the parts of the safetensors code share (not a public API): the layout's constants, the
// dtype table's lookups and byte sizes (safetensors.cpp), and the header read into an index of
// the tensors or written from a File (safetensors_header.cpp), which the reader
// (safetensors_read.cpp) and the writer (safetensors_write.cpp) use.
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mha/core/safetensors.h"

namespace mha::safetensors::format {

inline constexpr std::string_view kMetadataKey = "__metadata__";
inline constexpr size_t kHeaderSizeBytes = 8;

std::optional<DType> find_dtype(const std::string& name);
std::string known_dtype_names();

// Bytes that `shape` of `dtype` occupies. Throws when a dimension is negative, or when the element
// count overflows int64 (Tensor's count type) or the byte count overflows 64 bits, so no size
// computed here can wrap.
uint64_t byte_size(const Shape& shape, DType dtype, const std::string& where);

// A file image's header, validated: its metadata and tensors (each with its bytes inside the
// image), checked against every rule of the format before any tensor is read.
struct Index {
  std::map<std::string, std::string> metadata;
  std::map<std::string, TensorRef> tensors;
};

Index read_index(std::span<const std::byte> bytes);

// The header of `file` as written: JSON padded with spaces to a multiple of 8, after checking
// every tensor's byte count against its shape and dtype.
std::string header_text(const File& file);

}  // namespace mha::safetensors::format
