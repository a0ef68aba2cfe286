#include "mha/core/atomic_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "mha/core/error.h"

namespace mha {
namespace {

namespace fs = std::filesystem;

// Where the bytes go: a regular file to replace (or create), or a file to write in place.
struct Target {
  std::string path;  // symbolic links resolved, for a regular file
  bool in_place = false;
};

std::string directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// /proc and /sys hold kernel objects, not files to replace; /dev/stdout and /dev/fd/N lead there.
bool on_kernel_file_system(const std::string& directory) {
  struct statfs info {};
  if (::statfs(directory.c_str(), &info) != 0) return false;
  return info.f_type == PROC_SUPER_MAGIC || info.f_type == SYSFS_MAGIC;
}

// Follows symbolic links one at a time (a link's target may lead into /proc, as /dev/stdout
// does, which the final file's own type would hide) until a regular file, a missing name, or
// something to write in place.
Target resolve(const std::string& path, const std::string& prefix) {
  std::string at = path;
  for (int links = 0; links <= 40; ++links) {
    const std::string directory = directory_of(at);
    if (on_kernel_file_system(directory)) return {at, true};
    struct stat info {};
    if (::lstat(at.c_str(), &info) != 0) return {at, false};  // new (or unreachable: creating says why)
    if (S_ISREG(info.st_mode)) return {at, false};
    if (!S_ISLNK(info.st_mode)) return {at, true};
    std::error_code error;
    const fs::path link = fs::read_symlink(at, error);
    check(!error, prefix, ": reading the symbolic link '", at, "': ", error.message());
    at = link.is_absolute() ? link.string() : (fs::path(directory) / link).string();
  }
  throw Error(prefix + ": " + std::strerror(ELOOP));
}

[[noreturn]] void fail(const std::string& prefix, int error) {
  throw Error(prefix + ": " + std::strerror(error != 0 ? error : EIO));
}

// Unique per process and call, so concurrent writers of the same path never share a name.
std::string temporary_name(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  return target + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

// Runs write(file), then checks the FILE's error flag and flushes (and fsyncs, if asked): the
// first error's errno, or 0. The FILE stays open; an exception from write passes through.
int write_and_flush(std::FILE* file, const std::function<void(std::FILE*)>& write, bool sync) {
  write(file);
  const int after_write = errno;  // a failed write leaves its reason here
  if (std::ferror(file)) return after_write;
  if (std::fflush(file) != 0) return errno;
  if (sync && ::fsync(::fileno(file)) != 0) return errno;
  return 0;
}

std::FILE* open_stream(int fd, const std::string& prefix) {
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    const int error = errno;
    ::close(fd);
    fail(prefix, error);
  }
  return file;
}

void write_in_place(const std::string& path, const std::string& prefix,
                    const std::function<void(std::FILE*)>& write) {
  // No O_CREAT, no O_TRUNC: nothing is made or cut short; a device or FIFO is just written to.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) fail(prefix, errno);
  std::FILE* file = open_stream(fd, prefix);
  int error = 0;
  try {
    error = write_and_flush(file, write, /*sync=*/false);  // devices and pipes have nothing to sync
  } catch (...) {
    std::fclose(file);
    throw;
  }
  if (std::fclose(file) != 0 && error == 0) error = errno;
  if (error != 0) fail(prefix, error);
}

// The temporary, named from the start (O_EXCL: never an existing file, never through a link).
int create_named(const std::string& target, const std::string& prefix, std::string& name) {
  for (int attempt = 0;; ++attempt) {
    name = temporary_name(target);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    if (errno != EEXIST || attempt == 100) {
      const int error = errno;
      name.clear();
      fail(prefix, error);
    }
  }
}

// Names the unnamed (O_TMPFILE) file open as `fd`: linkat through /proc/self/fd/N with
// AT_SYMLINK_FOLLOW needs no privilege (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH).
int link_unnamed(int fd, const std::string& target, std::string& name) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  for (int attempt = 0;; ++attempt) {
    name = temporary_name(target);
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) return 0;
    if (errno != EEXIST || attempt == 100) {
      name.clear();
      return errno;
    }
  }
}

bool can_link_unnamed_files() {
  static const bool proc_mounted = ::access("/proc/self/fd", X_OK) == 0;
  return proc_mounted;
}

void write_replacing(const std::string& target, const std::string& prefix,
                     const std::function<void(std::FILE*)>& write, detail::Temporary how) {
  const std::string directory = directory_of(target);
  int fd = -1;
  if (how == detail::Temporary::unnamed && can_link_unnamed_files()) {
    fd = ::open(directory.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
    // The file system cannot make unnamed files (or the kernel predates them): name it instead.
    if (fd < 0 && errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) fail(prefix, errno);
  }
  const bool unnamed = fd >= 0;
  std::string temporary;  // a name that must go if anything fails
  if (!unnamed) fd = create_named(target, prefix, temporary);
  auto remove_temporary = [&] {
    if (!temporary.empty()) ::unlink(temporary.c_str());
  };

  std::FILE* file = nullptr;
  try {
    file = open_stream(fd, prefix);
  } catch (...) {
    remove_temporary();
    throw;
  }
  int error = 0;
  try {
    // fsync before the rename, or a crash could leave the new name on an empty file.
    error = write_and_flush(file, write, /*sync=*/true);
  } catch (...) {
    std::fclose(file);
    remove_temporary();
    throw;
  }
  if (error == 0 && unnamed) error = link_unnamed(::fileno(file), target, temporary);
  if (std::fclose(file) != 0 && error == 0) error = errno;
  if (error == 0 && ::rename(temporary.c_str(), target.c_str()) != 0) error = errno;
  if (error != 0) {
    remove_temporary();
    fail(prefix, error);
  }

  // The rename is durable only once the directory is: without this, a crash could bring back
  // the old file (or none) after the call returned.
  const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  error = dir < 0 ? errno : ::fsync(dir) != 0 ? errno : 0;
  if (dir >= 0) ::close(dir);
  if (error != 0 && error != EINVAL)  // EINVAL: a file system that does not sync directories
    throw Error(prefix + ": the new file is in place, but syncing the directory '" + directory +
                "' failed: " + std::strerror(error));
}

}  // namespace

namespace detail {

void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::FILE*)>& write, Temporary temporary) {
  const std::string prefix = what + ": cannot write '" + path + "'";
  const Target target = resolve(path, prefix);
  if (target.in_place)
    write_in_place(path, prefix, write);
  else
    write_replacing(target.path, prefix, write, temporary);
}

}  // namespace detail

void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::FILE*)>& write) {
  detail::write_file_atomically(path, what, write, detail::Temporary::unnamed);
}

}  // namespace mha
