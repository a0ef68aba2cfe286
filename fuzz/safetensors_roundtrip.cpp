// Fuzz target: a structured round trip through the safetensors writer and reader.
//
// The bytes describe a File: up to 5 tensors, each with a name (up to 12 arbitrary bytes), a dtype, a
// rank of 0 to 4 with dimensions 0 to 6 (so empty tensors and scalars occur) and its raw element
// bytes; up to 3 metadata entries; and whether to go through a file on disk.
// Properties:
//   - serialize refuses exactly the files that cannot be written (a name or metadata string that
//     is not valid UTF-8, a tensor named __metadata__), with mha::Error;
//   - what it writes has an 8-byte-aligned data buffer and parses back to the same tensors
//     (dtype, shape, bytes) and metadata, which serialise to the same bytes again; save + load
//     through a file gives the same;
//   - the typed conversions round-trip every element bit for bit: to_tensor<double> then
//     from_tensor for the float dtypes (a NaN stays a NaN, its payload may be quieted),
//     to_tensor<int64_t> for the integer dtypes, to_tensor<bool> for BOOL, which refuses exactly
//     the bytes other than 0 and 1.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "fuzz.h"
#include "mha/core/safetensors.h"
#include "safetensors_files.h"

namespace {

namespace st = mha::safetensors;
using mha::fuzz::finding;
using mha::fuzz::FuzzInput;
using mha::fuzz::same;

bool is_nan_element(const std::byte* p, st::DType dtype) {
  uint16_t u16 = 0;
  switch (dtype) {
    case st::DType::F16:
      std::memcpy(&u16, p, 2);
      return (u16 & 0x7C00) == 0x7C00 && (u16 & 0x03FF) != 0;
    case st::DType::BF16:
      std::memcpy(&u16, p, 2);
      return (u16 & 0x7F80) == 0x7F80 && (u16 & 0x007F) != 0;
    case st::DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case st::DType::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return std::isnan(d);
    }
    default:
      return false;
  }
}

void check_typed_round_trip(const std::string& name, const st::TensorData& data) {
  const size_t size = st::dtype_size(data.dtype);
  switch (data.dtype) {
    case st::DType::F16:
    case st::DType::BF16:
    case st::DType::F32:
    case st::DType::F64: {
      const st::TensorData back = st::from_tensor(st::to_tensor<double>(data, name), data.dtype);
      if (back.bytes.size() != data.bytes.size())
        finding("float round trip changed the size of '" + name + "'");
      for (size_t at = 0; at < data.bytes.size(); at += size) {
        const bool nan = is_nan_element(data.bytes.data() + at, data.dtype);
        const bool same_bits = std::memcmp(data.bytes.data() + at, back.bytes.data() + at, size) == 0;
        if (nan ? !is_nan_element(back.bytes.data() + at, data.dtype) : !same_bits)
          finding("tensor '" + name + "' of " + st::to_string(data.dtype) + ": element " +
                  std::to_string(at / size) + " changed through to_tensor<double> and from_tensor");
      }
      break;
    }
    case st::DType::BOOL: {
      bool all_0_or_1 = true;
      for (std::byte b : data.bytes) all_0_or_1 = all_0_or_1 && std::to_integer<int>(b) <= 1;
      try {
        const st::TensorData back = st::from_tensor(st::to_tensor<bool>(data, name));
        if (!all_0_or_1) finding("to_tensor<bool> accepted a BOOL byte other than 0 and 1 in '" + name + "'");
        if (back.bytes != data.bytes) finding("BOOL tensor '" + name + "' changed through to_tensor<bool>");
      } catch (const mha::Error& e) {
        mha::fuzz::check_printable_message(e.what());
        if (all_0_or_1) finding("to_tensor<bool> refused valid BOOL bytes: " + std::string(e.what()));
      }
      break;
    }
    default: {  // every integer dtype fits int64 exactly
      const st::TensorData back = st::from_tensor(st::to_tensor<int64_t>(data, name), data.dtype);
      if (back.bytes != data.bytes)
        finding("tensor '" + name + "' of " + st::to_string(data.dtype) +
                " changed through to_tensor<int64_t>");
    }
  }
}

std::filesystem::path scratch_file() {
  std::error_code error;
  // tmpfs where there is one: the fsync of the atomic write is then cheap.
  const std::filesystem::path dir =
      std::filesystem::is_directory("/dev/shm", error) ? "/dev/shm" : std::filesystem::temp_directory_path();
  return dir / ("mha_fuzz_roundtrip_" + std::to_string(::getpid()) + ".safetensors");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  constexpr st::DType kDTypes[] = {st::DType::BOOL, st::DType::U8,  st::DType::I8,  st::DType::I16,
                                   st::DType::I32,  st::DType::I64, st::DType::F16, st::DType::BF16,
                                   st::DType::F32,  st::DType::F64};
  st::File file;
  const int64_t tensors = in.in_range(0, 5);
  for (int64_t t = 0; t < tensors; ++t) {
    const std::string name = in.text(12);
    st::TensorData tensor;
    tensor.dtype = kDTypes[in.in_range(0, 9)];
    const int64_t rank = in.in_range(0, 4);
    int64_t numel = 1;
    for (int64_t d = 0; d < rank; ++d) {
      tensor.shape.push_back(in.in_range(0, 6));
      numel *= tensor.shape.back();
    }
    tensor.bytes.resize(static_cast<size_t>(numel) * st::dtype_size(tensor.dtype));
    for (std::byte& b : tensor.bytes) b = static_cast<std::byte>(in.byte());
    file.tensors[name] = std::move(tensor);
  }
  const int64_t entries = in.in_range(0, 3);
  for (int64_t m = 0; m < entries; ++m) {
    const std::string key = in.text(8), value = in.text(16);
    file.metadata[key] = value;
  }
  const bool through_disk = in.flag();

  // Writable unless a string that ended up in the file (a repeated name or key replaces the
  // earlier entry) is not UTF-8, or a tensor is named __metadata__.
  bool writable = true;
  std::string unwritable;  // the first such string, for the report
  const auto note = [&](const std::string& text, bool ok) {
    if (!ok && writable) unwritable = mha::fuzz::hex(text);
    writable = writable && ok;
  };
  for (const auto& [name, tensor] : file.tensors)
    note(name, mha::fuzz::valid_utf8(name) && name != "__metadata__");
  for (const auto& [key, value] : file.metadata) {
    note(key, mha::fuzz::valid_utf8(key));
    note(value, mha::fuzz::valid_utf8(value));
  }

  std::vector<std::byte> image;
  try {
    image = st::serialize(file);
  } catch (const mha::Error& e) {
    mha::fuzz::check_printable_message(e.what());
    if (writable) finding(std::string("serialize refused a valid file: ") + e.what());
    return 0;
  }
  if (!writable)
    finding("serialize accepted a string that is not valid UTF-8, or '__metadata__': bytes " + unwritable);
  uint64_t header_size = 0;
  std::memcpy(&header_size, image.data(), 8);
  if (header_size % 8 != 0)
    finding("the data buffer is not 8-byte aligned: header size " + std::to_string(header_size));

  st::File back;
  try {
    back = st::parse(image);
  } catch (const mha::Error& e) {
    mha::fuzz::check_printable_message(e.what());
    finding(std::string("parse refused what serialize wrote: ") + e.what());
  }
  if (!same(file, back)) finding("a file written and read back differs");
  if (st::serialize(back) != image) finding("the file read back serialises to other bytes");
  for (const auto& [name, tensor] : back.tensors) check_typed_round_trip(name, tensor);

  if (through_disk) {
    const std::filesystem::path path = scratch_file();
    st::save(file, path.string());
    const st::File loaded = st::load(path.string());
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
    if (!same(file, loaded)) finding("a file saved and loaded differs");
  }
  return 0;
}
