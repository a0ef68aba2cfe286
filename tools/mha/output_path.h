#pragma once
// Checks for output paths that a command writes only after its work is done (`mha train
// --step-log`, `mha eval --confusion-png`): a path in a directory that does not exist is refused
// before the work starts, not after an epoch of training. (The write itself is atomic and reports
// any other failure.)
#include <filesystem>
#include <string>
#include <system_error>

#include "mha/core/error.h"

namespace mha::tools {

inline void check_output_directory(const std::string& path, const char* flag) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  check(parent.empty() || std::filesystem::is_directory(parent, error), flag, ": cannot write '", path,
        "': '", parent.string(), "' is not a directory");
}

}  // namespace mha::tools
