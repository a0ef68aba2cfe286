// safetensors: reading a file, mapped (MappedFile) or copied (load, parse).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "mha/core/safetensors.h"
#include "safetensors_format.h"

namespace mha::safetensors {
namespace {

namespace fs = std::filesystem;

// The tensor `name` of `tensors`, or an mha::Error listing the names there are.
template <class Tensors>
const typename Tensors::mapped_type& require_in(const Tensors& tensors, const std::string& name,
                                               const std::string& what) {
  const auto found = tensors.find(name);
  if (found != tensors.end()) return found->second;
  std::string names;
  for (const auto& [have, tensor] : tensors) names += (names.empty() ? "" : ", ") + have;
  throw Error(what + ": no tensor named '" + name + "' (have: " + (names.empty() ? "none" : names) + ")");
}

// A File holding its own copy of each tensor's bytes.
File owning_copy(const std::map<std::string, std::string>& metadata, const std::map<std::string, TensorRef>& tensors) {
  File file;
  file.metadata = metadata;
  for (const auto& [name, tensor] : tensors)
    file.tensors.emplace(name, TensorData{tensor.dtype, tensor.shape, {tensor.bytes.begin(), tensor.bytes.end()}});
  return file;
}

}  // namespace

File parse(std::span<const std::byte> bytes) {
  const format::Index index = format::read_index(bytes);
  return owning_copy(index.metadata, index.tensors);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  check(!error && fs::exists(status), "safetensors: cannot load '", path, "': ",
        error ? error.message() : "no such file");
  check(!fs::is_directory(status), "safetensors: cannot load '", path, "': it is a directory");
  // A FIFO or device would block the open (or never end); only a regular file has a size to check.
  check(fs::is_regular_file(status), "safetensors: cannot load '", path,
        "': not a regular file (a FIFO, socket or device)");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "safetensors: cannot open '", path, "': ", std::strerror(errno));
  struct stat info {};
  const bool sized = ::fstat(fd, &info) == 0;
  const int stat_error = errno;
  if (sized && info.st_size > 0) {
    size_ = static_cast<size_t>(info.st_size);
    // MAP_POPULATE reads the whole file in one go (one fault-in of the page cache pages instead
    // of one fault per 4 KiB page as the tensors are decoded).
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    const int map_error = errno;
    ::close(fd);
    check(mapped != MAP_FAILED, "safetensors: cannot map '", path, "': ", std::strerror(map_error));
    data_ = static_cast<const std::byte*>(mapped);
  } else {
    ::close(fd);
    check(sized, "safetensors: cannot determine the size of '", path, "': ", std::strerror(stat_error));
  }
  try {
    format::Index index = format::read_index({data_, size_});
    metadata_ = std::move(index.metadata);
    tensors_ = std::move(index.tensors);
  } catch (const Error& e) {
    unmap();
    throw Error(std::string(e.what()) + " (in '" + path + "')");
  }
}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      metadata_(std::move(other.metadata_)),
      tensors_(std::move(other.tensors_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
  }
  return *this;
}

void MappedFile::unmap() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

const TensorRef& MappedFile::require(const std::string& name, const std::string& what) const {
  return require_in(tensors_, name, what);
}

File load(const std::string& path) {
  const MappedFile mapped(path);
  return owning_copy(mapped.metadata(), mapped.tensors());
}

const TensorData& require(const File& file, const std::string& name, const std::string& what) {
  return require_in(file.tensors, name, what);
}

}  // namespace mha::safetensors
