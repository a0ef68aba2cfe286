#pragma once
// Running the built `mha` binary (or an example program) from a test, capturing what it prints
// and its exit code; and CliTest, the fixture of every CLI test: a fresh directory for the files
// a test writes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

namespace mha::testing {

struct CliResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

// `text` as one word for the shell that runs the command (/bin/sh): single-quoted, so that every
// byte but the quote itself (written as '\'') passes as it is: spaces, ESC, 0xFF.
inline std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `program` with `arguments` (as the shell splits them).
inline CliResult run_program(const std::string& program, const std::string& arguments) {
  const std::string command = program + " " + arguments + " 2>&1";
  CliResult r{0, {}};
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) r.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

#ifdef MHA_CLI_PATH
// Runs the built `mha` (its path comes from the build: test_cli defines MHA_CLI_PATH).
inline CliResult run_cli(const std::string& arguments) { return run_program(MHA_CLI_PATH, arguments); }
#endif

// An empty directory for each test, made before SetUp and removed with everything in it after
// TearDown. It is named after the test suite and the process, because ctest runs every test in
// a process of its own, two at a time. Base is ::testing::Test, or ::testing::TestWithParam<P>
// for a parameterised suite.
template <class Base = ::testing::Test>
class TempDirTest : public Base {
 protected:
  TempDirTest() : dir_(fresh_directory()) {}
  ~TempDirTest() override {
    std::error_code ignored;  // a destructor must not throw; what cannot be removed stays
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  const std::filesystem::path dir_;

 private:
  static std::filesystem::path fresh_directory() {
    std::string suite = ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name();
    std::replace(suite.begin(), suite.end(), '/', '_');  // a parameterised suite is "Prefix/Suite"
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("mha_" + suite + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);  // left over from a killed run with the same process id
    std::filesystem::create_directories(dir);
    return dir;
  }
};

using CliTest = TempDirTest<>;

}  // namespace mha::testing
