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

// One tensor as stored, without its bytes copied: they stay where they are (in a MappedFile,
// or a TensorData), and the view is valid as long as that lives.
struct TensorRef {
  DType dtype = DType::F32;
  Shape shape;
  std::span<const std::byte> bytes;
};

// Parse a whole file image. Throws mha::Error (naming the tensor or header field) on any
// violation of the format; never reads out of bounds and never allocates from an unchecked size.
File parse(std::span<const std::byte> bytes);

// A file opened for reading: mapped into memory (mmap), its header validated exactly as parse()
// validates it, its tensors' bytes left in the mapping. Each tensor is then decoded once,
// straight from the mapping into the Tensor that to_tensor returns; nothing else copies the file.
// Errors name the file. (Like any mapped file, it must not be truncated by another process while
// open: reading a page past the new end would raise SIGBUS.)
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor `name`; throws mha::Error "<what>: no tensor named '<name>' (have: ...)" if absent.
  const TensorRef& require(const std::string& name, const std::string& what) const;
  // The tensor `name` decoded into T (see to_tensor below); throws if absent.
  template <class T>
  Tensor<T> to_tensor(const std::string& name) const;

 private:
  void unmap();
  std::string path_;
  const std::byte* data_ = nullptr;  // the mapping (null for an empty file)
  size_t size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorRef> tensors_;  // views into the mapping
};

// The whole file in memory: a MappedFile's tensors copied into a File.
File load(const std::string& path);

// Serialise: tensors in name order, header padded with spaces to a multiple of 8.
std::vector<std::byte> serialize(const File& file);
// Atomic (mha/core/atomic_file.h): on failure no file is left. The header and then each
// tensor's bytes are written as they are, with no image of the whole file built in memory.
void save(const File& file, const std::string& path);

// Typed conversions. to_tensor converts any float/int/bool dtype to T (F16/BF16 exactly,
// int -> float rounding as static_cast). `name` is used in error messages.
template <class T>
Tensor<T> to_tensor(const TensorRef& data, const std::string& name);
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
