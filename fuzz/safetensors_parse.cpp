// Fuzz target: the safetensors reader on arbitrary bytes.
//
// Properties: parse() returns a File or throws mha::Error, nothing else (no crash, no sanitizer
// report, no other exception, no allocation beyond libFuzzer's limit). A file it accepts is
// usable: every tensor converts to each element type or is refused with mha::Error (a value that
// does not fit), and writing it back gives a file that reads as the same tensors and metadata
// and writes back to the same bytes (serialize is canonical).
#include <cstdint>
#include <span>
#include <string>

#include "fuzz.h"
#include "mha/core/safetensors.h"
#include "safetensors_files.h"

namespace {

namespace st = mha::safetensors;
using mha::fuzz::check_printable_message;
using mha::fuzz::finding;
using mha::fuzz::same;

template <class T>
void convert(const st::TensorData& tensor, const std::string& name) {
  try {
    const mha::Tensor<T> converted = st::to_tensor<T>(tensor, name);
    if (converted.shape() != tensor.shape) finding("to_tensor changed the shape of '" + name + "'");
  } catch (const mha::Error& e) {
    // A value that does not fit T (or a BOOL byte other than 0 and 1): refused, as it must be.
    check_printable_message(e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  st::File file;
  try {
    file = st::parse(bytes);
  } catch (const mha::Error& e) {
    check_printable_message(e.what());
    return 0;
  }
  for (const auto& [name, tensor] : file.tensors) {
    convert<float>(tensor, name);
    convert<double>(tensor, name);
    convert<bool>(tensor, name);
    convert<int64_t>(tensor, name);
    convert<int32_t>(tensor, name);
  }
  // Everything in an accepted file is valid, so writing it cannot fail.
  std::vector<std::byte> image;
  try {
    image = st::serialize(file);
  } catch (const mha::Error& e) {
    check_printable_message(e.what());
    finding(std::string("serialize refused a file that parse accepted: ") + e.what());
  }
  st::File back;
  try {
    back = st::parse(image);
  } catch (const mha::Error& e) {
    check_printable_message(e.what());
    finding(std::string("parse refused what serialize wrote: ") + e.what());
  }
  if (!same(file, back)) finding("a parsed file written and read back differs from itself");
  if (st::serialize(back) != image)
    finding("serialize is not canonical: the same file written twice differs");
  return 0;
}
