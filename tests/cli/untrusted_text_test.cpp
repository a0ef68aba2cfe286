// Text from outside mha reaches the terminal escaped, whatever it holds: tensor names and
// metadata from a file, the JSON parser's messages on a header that is not UTF-8, tensor names and
// tokens given to `mha heatmap`, paths, flag values and command names. Each case holds terminal
// escape sequences (ESC [2J clears the screen, ESC ]0;...BEL retitles the window), C1 or bidi
// characters, or bytes that are not UTF-8; what mha prints must be valid UTF-8 with no control
// character but the line break (tests/support/printable.h) and show them as escapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <string>

#include "../support/cli.h"
#include "../support/printable.h"
#include "mha/core/safetensors.h"

namespace mha {
namespace {

using namespace mha::testing;  // the CLI runner and the printable checks

// A hostile piece of a name, and how mha shows it.
const std::string kHostile = "\x1b]0;x\x07\xff\x1b[2J";
const std::string kHostileShown = "\\x1b]0;x\\x07\\xff\\x1b[2J";

class UntrustedTextCli : public mha::testing::CliTest {
 protected:
  void SetUp() override {
    save_one_tensor("weights.safetensors", "attn_weights", Tensor<float>({2, 3, 3}, 0.25f));
    save_one_tensor("inputs.safetensors", "query", Tensor<float>({3, 2, 4}, 0.5f));
  }

  void save_one_tensor(const std::string& file_name, const std::string& name,
                       const Tensor<float>& tensor) const {
    st::File file;
    file.tensors[name] = st::from_tensor(tensor);
    st::save(file, path(file_name));
  }

  // A .safetensors file written byte by byte: the header's size (8 bytes, little-endian), the
  // header as given, the data.
  void write_raw(const std::string& name, const std::string& header, const std::string& data) const {
    std::string size(8, '\0');
    for (size_t i = 0; i < 8; ++i) size[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    std::ofstream(path(name), std::ios::binary) << size << header << data;
  }

  // `arguments` fails with one line that is printable and holds `part`.
  void expect_escaped_failure(const std::string& arguments, const std::string& part) {
    SCOPED_TRACE(shown("mha " + arguments));
    const CliResult r = run_cli(arguments);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << shown(r.output);
    EXPECT_TRUE(printable_and_holds(r.output, part));
  }

  // `arguments` succeeds, and what it prints is printable and holds each of `parts`.
  void expect_escaped_success(const std::string& arguments, std::initializer_list<std::string> parts) {
    SCOPED_TRACE(shown("mha " + arguments));
    const CliResult r = run_cli(arguments);
    EXPECT_EQ(r.exit_code, 0) << shown(r.output);
    for (const std::string& part : parts) EXPECT_TRUE(printable_and_holds(r.output, part));
  }

  const std::string attention_ = "attention --embed-dim 4 --num-heads 2 ";
};

TEST_F(UntrustedTextCli, TensorNamesFromAnInputsFile) {
  // JSON's \u escapes decode to the raw characters: ESC, BEL, RLO (U+202E), CSI (U+009B).
  write_raw("names.safetensors",
            R"({"\u001b[2J":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("\u001b]0;x\u0007":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
            R"("a\u202eb\u009b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\0'));
  expect_escaped_failure(
      attention_ + "--inputs " + path("names.safetensors") + " --output " + path("out.safetensors"),
      "unknown tensor '\\x1b[2J' (--inputs takes query, key, value,");
  EXPECT_FALSE(fs::exists(path("out.safetensors")));
  // A line break in a name is shown as \n, not as the message's own (nor, on one line, as a space).
  write_raw("newline.safetensors", R"({"a\nb":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  expect_escaped_failure(
      attention_ + "--inputs " + path("newline.safetensors") + " --output " + path("out.safetensors"),
      "unknown tensor 'a\\nb' (--inputs takes");
}

TEST_F(UntrustedTextCli, MetadataOfACheckpoint) {
  write_raw("checkpoint.safetensors", R"({"__metadata__":{"format":"\u001b[2J\u009b\u202e"}})", "");
  expect_escaped_failure("eval --checkpoint " + path("checkpoint.safetensors"),
                         "checkpoint format: expected 'mha-attention-classifier-checkpoint/1', got "
                         "'\\x1b[2J\\u009b\\u202e'");
}

// nlohmann's parse error quotes the bytes it read last, raw: here 0xFF.
TEST_F(UntrustedTextCli, JsonParseErrorOfAHeaderThatIsNotUtf8) {
  write_raw("not_utf8.safetensors", "{\"a\xff\":1}", "");
  expect_escaped_failure(
      attention_ + "--inputs " + path("not_utf8.safetensors") + " --output " + path("o.safetensors"),
      "ill-formed UTF-8 byte; last read: '\"a\\xff'");
  expect_escaped_failure("heatmap --input " + path("not_utf8.safetensors") + " --output " + path("o.png"),
                         "ill-formed UTF-8 byte; last read: '\"a\\xff'");
}

// No message quotes the tokens themselves (they are drawn, through the font's clean-up); the
// tensor name --tensor asks for is quoted.
TEST_F(UntrustedTextCli, HeatmapTensorNameAndTokens) {
  const std::string heatmap = "heatmap --input " + path("weights.safetensors") + " --output " + path("w.png");
  expect_escaped_failure(heatmap + " --tensor " + shell_quote("\x1b[2J\xff"),
                         "no tensor named '\\x1b[2J\\xff' (have: attn_weights)");
  const CliResult wrong_count = run_cli(heatmap + " --tokens " + shell_quote("\x1b[2J \xff\x1b]0;x\x07"));
  EXPECT_NE(wrong_count.exit_code, 0);
  EXPECT_TRUE(printable_and_holds(wrong_count.output, "--tokens: expected 3 tokens"));
  const CliResult drawn = run_cli(heatmap + " --tokens " + shell_quote("\x1b[2J \xff\x1b]0;x\x07 \xc2\x9b") +
                                  " --title " + shell_quote(kHostile));
  EXPECT_EQ(drawn.exit_code, 0) << shown(drawn.output);
  EXPECT_TRUE(is_printable(drawn.output));
  EXPECT_TRUE(fs::exists(path("w.png")));
}

// The NaN warning quotes the tensor's name and the file's path.
TEST_F(UntrustedTextCli, HeatmapWarningQuotesNameAndPathEscaped) {
  Tensor<float> weights({2, 2}, 0.5f);
  weights[1] = std::numeric_limits<float>::quiet_NaN();
  save_one_tensor("w" + kHostile + ".safetensors", "\x1b]0;x\x07", weights);
  const std::string input = path("w" + kHostile + ".safetensors");
  expect_escaped_success("heatmap --input " + shell_quote(input) + " --tensor " +
                             shell_quote("\x1b]0;x\x07") + " --output " + path("nan.png"),
                         {"warning: 1 NaN weight in tensor '\\x1b]0;x\\x07' in " + path("w" + kHostileShown) +
                          ".safetensors, drawn in magenta"});
}

TEST_F(UntrustedTextCli, PathsInMessages) {
  const std::string corrupt = path("corrupt" + kHostile + ".safetensors");
  std::ofstream(corrupt, std::ios::binary) << "abc";
  const std::string inputs = " --inputs " + path("inputs.safetensors");
  // A file that does not exist (CLI11's check), one that is no safetensors file, a directory
  // that does not exist for the output.
  expect_escaped_failure(attention_ + "--output " + path("o.safetensors") + " --inputs " +
                             shell_quote(path("missing" + kHostile)),
                         path("missing" + kHostileShown));
  expect_escaped_failure(
      attention_ + "--output " + path("o.safetensors") + " --inputs " + shell_quote(corrupt),
      "(in '" + path("corrupt" + kHostileShown) + ".safetensors')");
  expect_escaped_failure(
      attention_ + inputs + " --weights " + shell_quote(corrupt) + " --output " + path("o.safetensors"),
      path("corrupt" + kHostileShown) + ".safetensors");
  expect_escaped_failure(
      attention_ + inputs + " --output " + shell_quote(path("dir" + kHostile + "/o.safetensors")),
      path("dir" + kHostileShown) + "/o.safetensors");
  expect_escaped_failure("heatmap --input " + path("weights.safetensors") + " --output " +
                             shell_quote(path("dir" + kHostile + "/o.png")),
                         path("dir" + kHostileShown) + "/o.png");
  expect_escaped_failure("eval --checkpoint " + shell_quote(corrupt),
                         path("corrupt" + kHostileShown) + ".safetensors");
}

TEST_F(UntrustedTextCli, FlagValuesOptionNamesAndCommands) {
  const std::string run =
      attention_ + "--inputs " + path("inputs.safetensors") + " --output " + path("o.safetensors");
  expect_escaped_failure(run + " --dtype " + shell_quote("\x1b[2J"), "--dtype: \\x1b[2J not in");
  expect_escaped_failure(run + " --backend " +
                             shell_quote("\xc2\x9b"
                                         "1m\xe2\x80\xae"),
                         "\\u009b1m\\u202e");
  expect_escaped_failure(attention_ + " --kdim " + shell_quote("\xff\x1b]0;x\x07"), "\\xff\\x1b]0;x\\x07");
  expect_escaped_failure(run + " " + shell_quote("--x\x1b]0;x\x07"), "--x\\x1b]0;x\\x07");
  expect_escaped_failure(run + " " + shell_quote("stray\xff"), "stray\\xff");
  // A line break in a value: still one line.
  expect_escaped_failure(run + " --dtype " + shell_quote("a\nb\x1b[2J"), "b\\x1b[2J");
  expect_escaped_failure(shell_quote(kHostile), "unknown command '" + kHostileShown + "' (commands: ");
}

// What `mha train` and `mha eval` print besides errors: the paths they wrote or read.
TEST_F(UntrustedTextCli, TrainAndEvalPrintPathsEscaped) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  const std::string tiny =
      "train --train-limit 64 --test-limit 16 --batch-size 32 --epochs 1 --width 8 --heads 1 "
      "--hidden 8 --blocks 1 --input-projection --checkpoint-dir " +
      shell_quote(path("run" + kHostile));
  const std::string checkpoint_shown = path("run" + kHostileShown) + "/checkpoint.safetensors";
  expect_escaped_success(tiny,
                         {checkpoint_shown + ", " + path("run" + kHostileShown) + "/training_curves.png"});
  expect_escaped_success(tiny + " --resume", {"resuming " + checkpoint_shown + " after epoch 1",
                                              "nothing to train (mha eval --checkpoint " + checkpoint_shown});
  expect_escaped_success(
      "eval --checkpoint " + shell_quote(path("run" + kHostile + "/checkpoint.safetensors")) +
          " --confusion-png " + shell_quote(path("c" + kHostile + ".png")),
      {checkpoint_shown + ": epoch 1 of 1", "confusion matrix: " + path("c" + kHostileShown) + ".png"});
}

}  // namespace
}  // namespace mha
