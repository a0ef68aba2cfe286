#pragma once
// Under mpirun every rank runs the same command (docs/distributed.md): its flags and the files it
// reads must be rank 0's. A rank that differs would wait in a collective another never makes (a
// --backward on one rank only), sum gradients of other shapes (another --hidden), or mix results
// computed from other weights or inputs. Compared up front, a difference is an mha::Error on every
// rank, naming the flag and both values.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mha/core/error.h"
#include "mha/distributed/communicator.h"

namespace mha::tools {

// 64-bit FNV-1a over the file's 8-byte words (then its last bytes): not cryptographic, it tells
// the ranks' copies of a file apart. "unreadable" when it cannot be read (the loader says why).
inline std::string file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "unreadable";
  uint64_t h = 14695981039346656037ull;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word;
      std::memcpy(&word, buffer.data() + i, 8);
      h = (h ^ word) * 1099511628211ull;
    }
    for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(buffer[i])) * 1099511628211ull;
  }
  return "contents " + std::to_string(h);
}

// Throws on every rank unless every rank runs `command` with rank 0's flags (as given; an
// option left out is "(default)") and, for each (flag, path) of `files` given, a file of the
// same contents.
inline void check_ranks_agree(distributed::Communicator& comm, const CLI::App& command,
                              const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::pair<std::string, std::string>> settings{{"command", command.get_name()}};
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_name() == "--help") continue;
    std::string value = option->count() ? "" : "(default)";
    for (const std::string& result : option->results()) value += (value.empty() ? "" : " ") + result;
    settings.emplace_back(option->get_name(), value);
  }
  for (const auto& [flag, path] : files)
    if (!path.empty()) settings.emplace_back(flag + " file", file_digest(path));
  std::string mine;
  for (const auto& [name, value] : settings) mine += name + '\0' + value + '\0';
  const std::vector<std::vector<std::byte>> all =
      comm.all_gather_bytes(std::as_bytes(std::span<const char>(mine.data(), mine.size())));
  const auto parse = [](const std::vector<std::byte>& bytes) {
    std::vector<std::string> fields;
    std::string field;
    for (std::byte b : bytes) {
      if (b == std::byte{0}) {
        fields.push_back(std::move(field));
        field.clear();
      } else {
        field += static_cast<char>(b);
      }
    }
    return fields;
  };
  const std::vector<std::string> first = parse(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<std::string> other = parse(all[r]);
    size_t f = 0;
    while (f + 1 < std::min(first.size(), other.size()) && first[f] == other[f] && first[f + 1] == other[f + 1])
      f += 2;
    check(f + 1 < std::min(first.size(), other.size()), command.get_name(), ": every rank must run the same mha, but rank ",
          r, "'s flags differ from rank 0's");
    check(false, command.get_name(), ": every rank must run the same command, but rank ", r, "'s ", other[f], " (",
          other[f + 1], ") differs from rank 0's (", first[f + 1], ")");
  }
}

}  // namespace mha::tools
