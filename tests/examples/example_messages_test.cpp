// What the examples print about their files (examples/support/example_files.h): the paths of
// --output and --heatmap, CLI11's messages on a bad flag and mha's errors, escaped when a path
// holds terminal escape sequences or bytes that are not UTF-8 (tests/support/printable.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../support/cli.h"
#include "../support/printable.h"

namespace mha {
namespace {

namespace fs = std::filesystem;

using namespace mha::testing;  // the program runner and the printable checks

const std::string kHostile = "\x1b]0;x\x07\xff\x1b[2J";
const std::string kHostileShown = "\\x1b]0;x\\x07\\xff\\x1b[2J";

// The cross-attention example: it reads --inputs, writes --output and draws --heatmap.
CliResult run_example(const std::string& arguments) {
  return run_program(std::string(MHA_EXAMPLES_DIR) + "/cross_attention", arguments);
}

using ExampleMessages = mha::testing::TempDirTest<>;

TEST_F(ExampleMessages, WrittenPathsAreEscaped) {
  const CliResult r = run_example("--output " + shell_quote(path("o" + kHostile + ".safetensors")) +
                                  " --heatmap " + shell_quote(path("h" + kHostile + ".png")));
  EXPECT_EQ(r.exit_code, 0) << shown(r.output);
  EXPECT_TRUE(
      printable_and_holds(r.output, "results written to " + path("o" + kHostileShown) + ".safetensors\n"));
  EXPECT_TRUE(printable_and_holds(r.output, "heatmap written to " + path("h" + kHostileShown) + ".png\n"));
  EXPECT_TRUE(fs::exists(path("o" + kHostile + ".safetensors")));
}

TEST_F(ExampleMessages, FlagAndFileErrorsAreEscaped) {
  const CliResult missing = run_example("--inputs " + shell_quote(path("missing" + kHostile)));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_TRUE(printable_and_holds(missing.output, "File does not exist: " + path("missing" + kHostileShown)));

  const CliResult unknown = run_example(shell_quote("--x" + kHostile));
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_TRUE(printable_and_holds(unknown.output, "--x" + kHostileShown));

  const std::string corrupt = path("corrupt" + kHostile + ".safetensors");
  std::ofstream(corrupt, std::ios::binary) << "abc";
  const CliResult refused = run_example("--inputs " + shell_quote(corrupt));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(printable_and_holds(refused.output, "error: safetensors: "));
  EXPECT_TRUE(printable_and_holds(refused.output, path("corrupt" + kHostileShown) + ".safetensors"));
}

}  // namespace
}  // namespace mha
