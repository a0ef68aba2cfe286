// The examples' --output and --heatmap fail cleanly: to /dev/full, "No space left on device";
// under a file-size limit too small for the file, "File too large" (the example ignores SIGXFSZ)
// and nothing left in the directory. One example stands for all: they share
// examples/support/example_files.h, which writes through mha/core/atomic_file.h.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../support/cli.h"

namespace mha {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::list_directory;
using testing::run_program;

const std::string kProgram = std::string(MHA_EXAMPLES_DIR) + "/sentence_self_attention";

class ExampleWriteErrors : public testing::CliTest {
 protected:
  static void expect_error(const CliResult& r, const std::string& message) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(testing::lines_containing(r.output, "error"), std::vector<std::string>{"error: " + message}) << r.output;
  }
};

TEST_F(ExampleWriteErrors, FullDevice) {
  for (const auto& [flag, what] : {std::pair{"--output", "safetensors"}, std::pair{"--heatmap", "write_png"}}) {
    expect_error(run_program(kProgram, std::string(flag) + " /dev/full"),
                 std::string(what) + ": cannot write '/dev/full': No space left on device");
    EXPECT_TRUE(testing::is_character_device("/dev/full"));
  }
}

TEST_F(ExampleWriteErrors, FileSizeLimit) {
  for (const auto& [flag, file, what] : {std::tuple{"--output", "out.safetensors", "safetensors"},
                                         std::tuple{"--heatmap", "heatmap.png", "write_png"}}) {
    SCOPED_TRACE(flag);
    const std::string free = path(std::string("free_") + file), out = path(std::string("out_") + file);
    const CliResult whole = run_program(kProgram, std::string(flag) + " " + free);
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const uintmax_t size = fs::file_size(free);
    const auto before = list_directory(dir_);
    expect_error(run_program(kProgram, std::string(flag) + " " + out, size - 1),
                 std::string(what) + ": cannot write '" + out + "': File too large");
    EXPECT_EQ(list_directory(dir_), before);
    const CliResult fits = run_program(kProgram, std::string(flag) + " " + out, size);
    EXPECT_EQ(fits.exit_code, 0) << fits.output;
    EXPECT_EQ(fs::file_size(out), size);
  }
}

}  // namespace
}  // namespace mha
