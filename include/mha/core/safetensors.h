#pragma once
// safetensors read/write (https://github.com/huggingface/safetensors, format section).
// Layout: 8-byte little-endian header size N, N bytes of JSON beginning with '{' (may be
// padded with spaces), then the data buffer. Every rule of the reference reader is enforced:
// header size limit, tensors in offset order covering the buffer with no gaps or overlaps,
// shape × dtype size equal to the byte range, no trailing bytes, no duplicate keys.
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "mha/core/tensor.h"

namespace mha::safetensors {

enum class DType { BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64 };

std::string to_string(DType dtype);
DType dtype_from_string(const std::string& name);  // throws mha::Error on an unknown name
size_t dtype_size(DType dtype);

// The largest header we accept, as in the reference implementation.
inline constexpr uint64_t kMaxHeaderSize = 100'000'000;

// One tensor as stored: dtype, shape and its little-endian bytes.
struct TensorData {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<std::byte> bytes;
};

struct File {
  std::map<std::string, TensorData> tensors;
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" entry
};

// Parse a whole file image. Throws mha::Error (naming the tensor or header field) on any
// violation of the format; never reads out of bounds and never allocates from an unchecked size.
File parse(std::span<const std::byte> bytes);
File load(const std::string& path);

// Serialise: tensors in name order, header padded with spaces to a multiple of 8.
std::vector<std::byte> serialize(const File& file);
// Atomic: writes `path` + a unique suffix, then renames over `path`; on failure no file is left.
void save(const File& file, const std::string& path);

// Typed conversions. to_tensor converts any float/int/bool dtype to T (F16/BF16 exactly,
// int -> float rounding as static_cast). `name` is used in error messages.
template <class T>
Tensor<T> to_tensor(const TensorData& data, const std::string& name);
// from_tensor stores float as F32, double as F64, bool as BOOL, int64 as I64, int32 as I32.
template <class T>
TensorData from_tensor(const Tensor<T>& tensor);
// Store a float/double tensor as another float dtype (F16, BF16 round to nearest even).
template <class T>
TensorData from_tensor(const Tensor<T>& tensor, DType dtype);

// Looks up `name` in `file`; throws mha::Error "<what>: no tensor named '<name>'" if absent.
const TensorData& require(const File& file, const std::string& name, const std::string& what);

}  // namespace mha::safetensors
