#pragma once
// Checks for the text inputs of `mha tokenize` and `mha embed`. A stream opened on a directory
// reads as empty, so without this check a directory given as --input would give empty outputs
// and exit 0. A FIFO or a character device (`--input <(zcat lines.gz)`, /dev/stdin) is read as
// a stream; anything else that is not a regular file (a directory, socket or block device) is
// refused before the model is loaded. A missing file is left to the reader, which says why it
// cannot open it.
#include <filesystem>
#include <string>
#include <system_error>

#include "mha/core/error.h"

namespace mha::tools {

inline void check_text_input(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  if (path == "-") return;  // standard input
  std::error_code error;
  const fs::file_type type = fs::status(path, error).type();
  if (error || type == fs::file_type::not_found) return;
  const char* got = type == fs::file_type::directory ? "a directory"
                    : type == fs::file_type::socket  ? "a socket"
                    : type == fs::file_type::block   ? "a block device"
                                                     : nullptr;
  check(got == nullptr, flag, ": expected a text file, got ", got, ": '", path, "'");
}

}  // namespace mha::tools
