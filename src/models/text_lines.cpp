#include "mha/models/text_lines.h"

#include <utf8proc.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <system_error>

#include "mha/core/error.h"

namespace mha::models {

std::vector<std::string> read_lines(const std::string& path) {
  std::string text;
  if (path == "-") {
    std::stringstream buffer;
    buffer << std::cin.rdbuf();
    check(!std::cin.bad(), "standard input: cannot read");
    text = buffer.str();
  } else {
    // A stream opened on a directory reads as empty rather than failing.
    std::error_code error;
    check(!std::filesystem::is_directory(path, error), path, ": cannot read the file: it is a directory");
    std::ifstream in(path, std::ios::binary);
    check(in.good(), path, ": cannot open the file");
    std::stringstream buffer;
    buffer << in.rdbuf();
    check(!in.bad(), path, ": cannot read the file");
    text = buffer.str();
  }
  const std::string name = path == "-" ? "standard input" : path;
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    const bool newline = end != std::string::npos;
    if (!newline) end = text.size();
    size_t stop = end;
    if (newline && stop > begin && text[stop - 1] == '\r') --stop;
    std::string line = text.substr(begin, stop - begin);
    // Well-formed UTF-8, code point by code point.
    for (size_t i = 0; i < line.size();) {
      utf8proc_int32_t cp = 0;
      const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(line.data() + i),
                                      static_cast<utf8proc_ssize_t>(line.size() - i), &cp);
      check(n > 0, name, ": line ", lines.size() + 1, ": invalid UTF-8 at byte ", i, " of the line");
      i += static_cast<size_t>(n);
    }
    lines.push_back(std::move(line));
    begin = end + 1;
  }
  return lines;
}

}  // namespace mha::models
