#include "mha/core/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "mha/core/error.h"

namespace mha {

void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::FILE*)>& write) {
  // Unique per process and call, so concurrent writers of the same path never share a temp file.
  static std::atomic<uint64_t> counter{0};
  const std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const std::string prefix = what + ": cannot write '" + path + "'";
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  check(file != nullptr, prefix, ": cannot create '", temporary, "': ", std::strerror(errno));
  try {
    try {
      write(file);
      // Flush and fsync before the rename, or a crash could leave the new name on an empty file.
      check(std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0, prefix, ": writing '", temporary,
            "' failed: ", std::strerror(errno));
    } catch (...) {
      std::fclose(file);
      throw;
    }
    check(std::fclose(file) == 0, prefix, ": closing '", temporary, "' failed: ", std::strerror(errno));
    std::error_code error;
    std::filesystem::rename(temporary, path, error);
    check(!error, prefix, ": renaming '", temporary, "' failed: ", error.message());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
}

}  // namespace mha
