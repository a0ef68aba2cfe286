#pragma once
// Running the built `mha` binary (or another program) from a test, capturing what it prints and
// its exit code, optionally under a file-size limit or to be killed at a chosen moment; whether
// the Fashion-MNIST files `mha train` reads are installed; and CliTest, the fixture of every CLI
// test: a fresh directory for the files a test writes. Every CLI test file (in namespace mha)
// gets the names it uses below: fs, st, CliResult, run_cli.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "mha/core/safetensors.h"

namespace mha::testing {

struct CliResult {
  int exit_code;       // 128 + the signal's number when a signal ended the program
  std::string output;  // stdout and stderr
};

// `text` as one word for the shell that runs the command (/bin/sh): single-quoted, so that every
// byte but the quote itself (written as '\'') passes as it is: spaces, ESC, 0xFF.
inline std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The exit code a child of start_program exits with when it could not set the file-size limit.
inline constexpr int kLimitNotSet = 125;

// Starts `program arguments` (the arguments as a shell reads them: /bin/sh -c "exec ...", so the
// process id returned is the program's own) with stdout and stderr going to `output_fd`. With
// a `file_size_limit` (bytes), the child sets RLIMIT_FSIZE to it and checks, before exec, that
// the limit is in force (if not, it says so and exits with kLimitNotSet). SIGXFSZ is put back
// to its default, killing, action: a program that should report "File too large" must ignore
// it itself.
inline pid_t start_program(const std::string& program, const std::string& arguments, int output_fd,
                           rlim_t file_size_limit = RLIM_INFINITY) {
  const std::string command = "exec " + program + " " + arguments;  // built before fork: no malloc after
  const pid_t pid = ::fork();
  if (pid != 0) return pid;  // the parent (or -1)
  // The child: only async-signal-safe calls until exec.
  if (::dup2(output_fd, STDOUT_FILENO) < 0 || ::dup2(output_fd, STDERR_FILENO) < 0) ::_exit(126);
  ::signal(SIGXFSZ, SIG_DFL);
  if (file_size_limit != RLIM_INFINITY) {
    const rlimit limit{file_size_limit, file_size_limit};
    rlimit in_force{};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0 || ::getrlimit(RLIMIT_FSIZE, &in_force) != 0 ||
        in_force.rlim_cur != file_size_limit || in_force.rlim_max != file_size_limit) {
      static const char message[] = "start_program: RLIMIT_FSIZE could not be set\n";
      (void)!::write(STDERR_FILENO, message, sizeof message - 1);
      ::_exit(kLimitNotSet);
    }
  }
  ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
  ::_exit(127);
}

// Waits for the child and turns its status into an exit code as CliResult has it.
inline int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

// Runs `program arguments` to the end, under `file_size_limit` if given (start_program).
inline CliResult run_program(const std::string& program, const std::string& arguments,
                             rlim_t file_size_limit = RLIM_INFINITY) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return {-1, "run_program: pipe2 failed"};
  const pid_t pid = start_program(program, arguments, pipe_fds[1], file_size_limit);
  ::close(pipe_fds[1]);
  CliResult r{-1, {}};
  std::array<char, 4096> buffer{};
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], buffer.data(), buffer.size());
    if (n > 0) r.output.append(buffer.data(), static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(pipe_fds[0]);
  if (pid > 0) r.exit_code = wait_for(pid);
  return r;
}

// The names in a directory (not recursive), to see what a command left there.
inline std::set<std::string> list_directory(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// The lines of `text` that contain `needle` (to find a program's error lines among its output).
inline std::vector<std::string> lines_containing(const std::string& text, const std::string& needle) {
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    const std::string line = text.substr(begin, end - begin);
    if (line.find(needle) != std::string::npos) lines.push_back(line);
    begin = end + 1;
  }
  return lines;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline bool is_symlink(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 && S_ISLNK(info.st_mode);
}

inline bool is_character_device(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISCHR(info.st_mode);
}

// Whether Debian's dataset-fashion-mnist is installed (scripts/install_deps.sh installs it): the
// files `mha train` and `mha eval` read; a test that needs them skips without.
inline bool have_fashion_mnist() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

#ifdef MHA_CLI_PATH
// Runs the built `mha` (its path comes from the build: test_cli defines MHA_CLI_PATH).
inline CliResult run_cli(const std::string& arguments) { return run_program(MHA_CLI_PATH, arguments); }

inline CliResult run_cli_with_file_size_limit(const std::string& arguments, rlim_t file_size_limit) {
  return run_program(MHA_CLI_PATH, arguments, file_size_limit);
}
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

namespace mha {

namespace fs = std::filesystem;
namespace st = mha::safetensors;

using testing::CliResult;
#ifdef MHA_CLI_PATH
using testing::run_cli;
#endif

}  // namespace mha
