// safetensors: writing a File, to memory (serialize) or to a file (save).
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mha/core/atomic_file.h"
#include "mha/core/safetensors.h"
#include "safetensors_format.h"

namespace mha::safetensors {

using format::kHeaderSizeBytes;

std::vector<std::byte> serialize(const File& file) {
  const std::string header_text = format::header_text(file);
  size_t data_size = 0;
  for (const auto& [name, tensor] : file.tensors) data_size += tensor.bytes.size();
  std::vector<std::byte> out(kHeaderSizeBytes + header_text.size() + data_size);
  std::byte* at = out.data();
  auto put = [&](const void* bytes, size_t size) {
    if (size > 0) std::memcpy(at, bytes, size);
    at += size;
  };
  const uint64_t header_size = header_text.size();
  put(&header_size, sizeof(header_size));
  put(header_text.data(), header_text.size());
  for (const auto& [name, tensor] : file.tensors) put(tensor.bytes.data(), tensor.bytes.size());
  return out;
}

void save(const File& file, const std::string& path) {
  // The header first: an invalid File must not touch the disk at all. Then the size, the header
  // and each tensor's bytes go to the file as they are, with no image of the whole file built.
  const std::string header = format::header_text(file);
  const uint64_t header_size = header.size();
  write_file_atomically(path, "safetensors", [&](std::FILE* out) {
    // errno is read after fwrite has failed: as two arguments of one check(), the order in which
    // they were evaluated was unspecified, and GCC read errno first (a stale "Success").
    auto write = [&](const void* bytes, size_t size) {
      if (size == 0) return;  // an empty tensor's bytes may be a null pointer, which fwrite must not get
      if (std::fwrite(bytes, 1, size, out) != size)
        throw Error(detail::concat("safetensors: cannot write '", path, "': ", std::strerror(errno)));
    };
    write(&header_size, sizeof(header_size));
    write(header.data(), header.size());
    for (const auto& [name, tensor] : file.tensors) write(tensor.bytes.data(), tensor.bytes.size());
  });
}

}  // namespace mha::safetensors
