// write_file_atomically (mha/core/atomic_file.h): the new file appears whole or not at all, a
// failed or throwing write leaves nothing behind, errors name the path and the system's reason,
// and what is not a regular file (a device, a FIFO, a file reached through /proc) is written in
// place, never replaced.
#include "mha/core/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "../support/cli.h"
#include "mha/core/error.h"

namespace mha {
namespace detail {
void PrintTo(Temporary how, std::ostream* out) { *out << (how == Temporary::unnamed ? "unnamed" : "named"); }
}  // namespace detail
namespace {

namespace fs = std::filesystem;
using detail::Temporary;
using testing::is_character_device;
using testing::is_symlink;
using testing::list_directory;
using testing::read_file;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::function<void(std::FILE*)> writes(const std::string& text) {
  return [text](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); };
}

// The message write_file_atomically throws for `path`, or "" when it does not throw.
std::string error_of(const std::string& path, const std::function<void(std::FILE*)>& write,
                     Temporary how = Temporary::unnamed) {
  try {
    detail::write_file_atomically(path, "test", write, how);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

mode_t current_umask() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

ino_t inode_of(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_ino;
}

class AtomicFile : public testing::TempDirTest<::testing::TestWithParam<Temporary>> {};

INSTANTIATE_TEST_SUITE_P(Temporaries, AtomicFile, ::testing::Values(Temporary::unnamed, Temporary::named),
                         [](const auto& info) { return info.param == Temporary::unnamed ? "unnamed" : "named"; });

TEST_P(AtomicFile, WritesANewFileWithTheModeOfAnyNewFile) {
  EXPECT_EQ(error_of(path("a"), writes("hello"), GetParam()), "");
  EXPECT_EQ(read_file(path("a")), "hello");
  EXPECT_EQ(list_directory(dir_), std::set<std::string>{"a"});
  struct stat info {};
  ASSERT_EQ(::stat(path("a").c_str(), &info), 0);
  EXPECT_TRUE(S_ISREG(info.st_mode));
  EXPECT_EQ(info.st_mode & 07777, 0666 & ~current_umask());
}

TEST_P(AtomicFile, ReplacesTheWholeFileAndTheOldStaysUntilTheEnd) {
  write_text(path("a"), "the old contents, longer than the new");
  EXPECT_EQ(error_of(path("a"), [&](std::FILE* f) {
              std::fputs("new", f);
              std::fflush(f);
              EXPECT_EQ(read_file(path("a")), "the old contents, longer than the new");  // readers see the old
              const std::set<std::string> during = list_directory(dir_);
              if (GetParam() == Temporary::unnamed) {
                EXPECT_EQ(during, std::set<std::string>{"a"}) << "the unnamed temporary has no name while written";
              } else {
                ASSERT_EQ(during.size(), 2u);
                EXPECT_EQ(during.rbegin()->rfind("a.tmp." + std::to_string(::getpid()) + ".", 0), 0u) << *during.rbegin();
              }
            }, GetParam()),
            "");
  EXPECT_EQ(read_file(path("a")), "new");
  EXPECT_EQ(list_directory(dir_), std::set<std::string>{"a"});
}

TEST_P(AtomicFile, AThrowingWriterLeavesNothing) {
  const auto throws = [](std::FILE* f) {
    std::fputs("some of the new contents", f);
    std::fflush(f);
    throw std::runtime_error("the writer failed");
  };
  EXPECT_THROW(detail::write_file_atomically(path("new"), "test", throws, GetParam()), std::runtime_error);
  EXPECT_TRUE(list_directory(dir_).empty());

  write_text(path("old"), "old");
  try {
    detail::write_file_atomically(path("old"), "test", throws, GetParam());
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the writer failed");  // the writer's own exception passes through
  }
  EXPECT_EQ(read_file(path("old")), "old");
  EXPECT_EQ(list_directory(dir_), std::set<std::string>{"old"});
}

TEST_P(AtomicFile, ErrorsNameThePathAndTheReason) {
  EXPECT_EQ(error_of(path("missing/a"), writes("x"), GetParam()),
            "test: cannot write '" + path("missing/a") + "': No such file or directory");
  fs::create_directory(path("directory"));
  EXPECT_EQ(error_of(path("directory"), writes("x"), GetParam()),
            "test: cannot write '" + path("directory") + "': Is a directory");
  EXPECT_EQ(list_directory(dir_), std::set<std::string>{"directory"});
  EXPECT_TRUE(list_directory(path("directory")).empty());
}

// A write past RLIMIT_FSIZE, in a forked child (the limit and the ignored SIGXFSZ are the
// process's; gtest's "fast" death tests fork without exec, so the child shares this test's
// directory): "File too large", and neither the new file nor a temporary is left; a file being
// replaced keeps its contents. The child exits 0 only if all of that holds.
// The child's part: exits 0 only if both writes failed and left the directory as it was.
[[noreturn]] void write_past_a_limit(const fs::path& dir, Temporary how) {
  ::signal(SIGXFSZ, SIG_IGN);
  const rlimit limit{1000, 1000};
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(3);
  const std::string big(20000, 'x');  // past the limit, and past stdio's buffer
  const std::string fresh = error_of((dir / "new").string(), writes(big), how);
  const std::string replaced = error_of((dir / "old").string(), writes(big), how);
  std::fprintf(stderr, "%s\n%s\n", fresh.c_str(), replaced.c_str());
  const bool clean = list_directory(dir) == std::set<std::string>{"old"} && read_file((dir / "old").string()) == "old";
  std::_Exit(clean ? 0 : 1);
}

TEST_P(AtomicFile, AFileSizeLimitGivesFileTooLargeAndLeavesNothing) {
  write_text(path("old"), "old");
  EXPECT_EXIT(write_past_a_limit(dir_, GetParam()), ::testing::ExitedWithCode(0),
              "test: cannot write '[^']*/new': File too large\ntest: cannot write '[^']*/old': File too large");
}

TEST(AtomicFileInPlace, FullDeviceIsWrittenInPlaceAndReportsNoSpace) {
  for (const size_t size : {size_t{10}, size_t{100000}}) {  // failing at the flush, and inside fwrite
    EXPECT_EQ(error_of("/dev/full", writes(std::string(size, 'x'))), "test: cannot write '/dev/full': No space left on device")
        << size;
    EXPECT_TRUE(is_character_device("/dev/full"));
  }
  // A writer that checks nothing is caught by the FILE's error flag.
  EXPECT_EQ(error_of("/dev/full", [](std::FILE* f) { for (int i = 0; i < 10000; ++i) std::fprintf(f, "line %d\n", i); }),
            "test: cannot write '/dev/full': No space left on device");
  for (const auto& name : list_directory("/dev")) EXPECT_EQ(name.find(".tmp."), std::string::npos) << "/dev/" << name;
}

TEST(AtomicFileInPlace, NullDeviceIsWrittenInPlace) {
  EXPECT_EQ(error_of("/dev/null", writes(std::string(100000, 'x'))), "");
  EXPECT_TRUE(is_character_device("/dev/null"));
}

using AtomicFileTargets = testing::TempDirTest<>;

TEST_F(AtomicFileTargets, AFifoIsWrittenInPlace) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] { received = read_file(path("fifo")); });
  const std::string error = error_of(path("fifo"), writes("through the pipe"));
  reader.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(received, "through the pipe");
  struct stat info {};
  ASSERT_EQ(::lstat(path("fifo").c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  EXPECT_EQ(list_directory(dir_), std::set<std::string>{"fifo"});
}

TEST_F(AtomicFileTargets, SymbolicLinksAreFollowedAndKept) {
  write_text(path("real"), "old");
  fs::create_symlink("real", path("link"));
  EXPECT_EQ(error_of(path("link"), writes("new")), "");
  EXPECT_TRUE(is_symlink(path("link")));
  EXPECT_EQ(read_file(path("real")), "new");
  EXPECT_EQ(list_directory(dir_), (std::set<std::string>{"link", "real"}));

  // A link to a device: the device is written, the link stays.
  fs::create_symlink("/dev/full", path("full"));
  EXPECT_EQ(error_of(path("full"), writes("x")), "test: cannot write '" + path("full") + "': No space left on device");
  EXPECT_TRUE(is_symlink(path("full")));
  EXPECT_TRUE(is_character_device("/dev/full"));
  EXPECT_EQ(list_directory(dir_), (std::set<std::string>{"full", "link", "real"}));
}

// /dev/stdout and /dev/fd/N name an open file through /proc. When that is a regular file (stdout
// redirected to one), it is someone's open file: written in place (the same inode), never
// replaced by a new one, and nothing is made beside the link (which, for /dev/stdout, is in /dev).
TEST_F(AtomicFileTargets, AFileNamedThroughProcIsWrittenInPlace) {
  write_text(path("out"), "");
  const ino_t inode = inode_of(path("out"));
  const int fd = ::open(path("out").c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::string through_proc = "/proc/self/fd/" + std::to_string(fd);
  EXPECT_EQ(error_of(through_proc, writes("direct")), "");
  fs::create_symlink(through_proc, path("stdout_like"));  // as /dev/stdout -> /proc/self/fd/1
  EXPECT_EQ(error_of(path("stdout_like"), writes("DIRECT")), "");
  ::close(fd);
  EXPECT_EQ(inode_of(path("out")), inode);
  EXPECT_EQ(read_file(path("out")), "DIRECT");  // each open of /proc/self/fd/N starts at offset 0
  EXPECT_TRUE(is_symlink(path("stdout_like")));
  EXPECT_EQ(list_directory(dir_), (std::set<std::string>{"out", "stdout_like"}));
}

}  // namespace
}  // namespace mha
