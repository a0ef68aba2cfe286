#pragma once
// Running the built `mha` binary from a test, capturing what it prints and its exit code.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace mha::testing {

struct CliResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

inline CliResult run_cli(const std::string& arguments) {
  const std::string command = std::string(MHA_CLI_PATH) + " " + arguments + " 2>&1";
  CliResult r{0, {}};
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) r.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace mha::testing
