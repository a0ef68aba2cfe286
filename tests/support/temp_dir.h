#pragma once
// TempDir: a fresh directory for the files a test writes, named after its prefix and the process
// (ctest runs two tests at a time) in the system's temporary folder, and removed with everything
// in it when it goes out of scope. (The CLI tests' fixture, TempDirTest in cli.h, makes one per
// test by itself.)
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace mha::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;  // a destructor must not throw; what cannot be removed stays
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of the file `name` in the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

  // Writes `bytes` as the file `name`; returns its path.
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::ofstream(path_ / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace mha::testing
