// A write that fails gives a clear one-line error and leaves no file behind, in every command that
// writes: the output is /dev/full ("No space left on device"; the device stays a device), or the
// command runs under a file-size limit (RLIMIT_FSIZE) too small for its file ("File too large";
// the directory holds nothing new, neither the file nor a temporary, and a file being replaced
// keeps its old contents). With the limit at the file's own size, the same command succeeds:
// the limit, not something else, is what made it fail.
//
// `mha bench --json` writes through the same function (mha/core/atomic_file.h) but is not run
// here: it is a benchmark.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../support/cli.h"
#include "mha/core/safetensors.h"
#include "mha/train/trainer.h"

namespace mha {
namespace {

using testing::CliResult;
using testing::is_character_device;
using testing::is_symlink;
using testing::list_directory;
using testing::read_file;
using testing::run_cli;
using testing::run_cli_with_file_size_limit;

class WriteErrors : public testing::CliTest {
 protected:
  // The command failed (exit 1) with one line of error, "mha: error: <message>".
  static void expect_error(const CliResult& r, const std::string& message) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(testing::lines_containing(r.output, "error"), std::vector<std::string>{"mha: error: " + message})
        << r.output;
  }

  static void expect_no_space(const CliResult& r, const std::string& what, const std::string& target = "/dev/full") {
    expect_error(r, what + ": cannot write '" + target + "': No space left on device");
    EXPECT_TRUE(is_character_device("/dev/full"));
  }

  // `arguments` writes `output`; under a file-size limit of `limit` bytes it must fail with "File
  // too large" naming `output` and leave `output`'s directory as it was.
  static void expect_too_large(const std::string& arguments, const std::string& what, const std::string& output,
                               uintmax_t limit) {
    const fs::path directory = fs::path(output).parent_path();
    const auto before = list_directory(directory);
    const CliResult r = run_cli_with_file_size_limit(arguments, limit);
    expect_error(r, what + ": cannot write '" + output + "': File too large");
    EXPECT_EQ(list_directory(directory), before) << arguments;
  }

  // `command` followed by a path writes one file (`what` names it in messages): written freely,
  // it has some size; under a limit one byte short, it fails and leaves nothing new, and a file
  // it would replace keeps its contents; with the limit at its size, it is written, the same.
  void expect_file_size_limit_applies(const std::string& command, const std::string& what) {
    const std::string free = path("unlimited"), out = path("limited/file");
    ASSERT_EQ(run_cli(command + free).exit_code, 0);
    const uintmax_t size = fs::file_size(free);
    fs::create_directory(path("limited"));
    expect_too_large(command + out, what, out, size - 1);
    std::ofstream(out) << "old";
    expect_too_large(command + out, what, out, size - 1);
    EXPECT_EQ(read_file(out), "old");
    const CliResult r = run_cli_with_file_size_limit(command + out, size);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_file(out), read_file(free));
  }
};

// ---- mha attention --output, mha heatmap --output (no data set needed) ----------------------

// The input files: a query for `mha attention`, attention weights for `mha heatmap`.
class WriteErrorsOfOutput : public WriteErrors {
 protected:
  void SetUp() override {
    st::save(st::File{{{"query", st::from_tensor(Tensor<float>({3, 2, 4}, 0.5f))}}, {}}, path("inputs.safetensors"));
    st::save(st::File{{{"attn_weights", st::from_tensor(Tensor<float>({2, 3, 3}, 0.25f))}}, {}},
             path("weights.safetensors"));
  }
  std::string attention() const {
    return "attention --embed-dim 4 --num-heads 2 --inputs " + path("inputs.safetensors") + " --output ";
  }
  std::string heatmap() const { return "heatmap --input " + path("weights.safetensors") + " --output "; }
};

TEST_F(WriteErrorsOfOutput, AttentionToFullDevice) {
  expect_no_space(run_cli(attention() + "/dev/full"), "safetensors");
  const CliResult r = run_cli(attention() + "/dev/null");  // a device that takes everything: fine
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(is_character_device("/dev/null"));
}

TEST_F(WriteErrorsOfOutput, AttentionUnderFileSizeLimit) { expect_file_size_limit_applies(attention(), "safetensors"); }

TEST_F(WriteErrorsOfOutput, HeatmapToFullDevice) { expect_no_space(run_cli(heatmap() + "/dev/full"), "write_png"); }

TEST_F(WriteErrorsOfOutput, HeatmapUnderFileSizeLimit) { expect_file_size_limit_applies(heatmap(), "write_png"); }

// ---- mha train and mha eval (the Fashion-MNIST files needed) ---------------------------------

// A very small model: one epoch of two steps.
const std::string kTiny =
    "train --train-limit 64 --test-limit 32 --batch-size 32 --epochs 1 --width 4 --heads 1 --hidden 4 --blocks 1 "
    "--input-projection --seed 3 --threads 1";

class WriteErrorsOfTraining : public WriteErrors {
 protected:
  void SetUp() override {
    if (!mha::testing::have_fashion_mnist()) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
    // A run with nothing in the way: what each file's size is when it is written whole.
    fs::create_directory(path("free"));
    const CliResult r = run_cli(kTiny + " --checkpoint-dir " + path("free") + " --step-log " + path("free/steps.tsv") +
                                " --save-initial " + path("free/initial.safetensors") + " --dump-batch-order " +
                                path("free/order.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* name : {"checkpoint.safetensors", "training_curves.png", "confusion_matrix.png", "steps.tsv",
                             "initial.safetensors", "order.safetensors"})
      size_[name] = fs::file_size(path("free/") + name);
  }

  std::string fresh_directory(const std::string& name) {
    fs::create_directory(path(name));
    return path(name);
  }

  std::map<std::string, uintmax_t> size_;
};

TEST_F(WriteErrorsOfTraining, OptionalOutputsToFullDevice) {
  for (const auto& [flag, what] : std::map<std::string, std::string>{
           {"--save-initial", "safetensors"}, {"--dump-batch-order", "safetensors"}, {"--step-log", "mha train: --step-log"}}) {
    SCOPED_TRACE(flag);
    const std::string dir = fresh_directory("run" + flag);
    expect_no_space(run_cli(kTiny + " --checkpoint-dir " + dir + " " + flag + " /dev/full"), what);
    EXPECT_TRUE(list_directory(dir).empty());
  }
}

// The checkpoint and the pictures have fixed names in --checkpoint-dir; a link to /dev/full in
// their place sends them there. The device is written (and fails), the link stays.
TEST_F(WriteErrorsOfTraining, CheckpointAndPicturesToFullDevice) {
  const std::string order[] = {"checkpoint.safetensors", "training_curves.png", "confusion_matrix.png"};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(order[i]);
    const std::string dir = fresh_directory("run" + std::to_string(i));
    const std::string target = dir + "/" + order[i];
    fs::create_symlink("/dev/full", target);
    const CliResult r = run_cli(kTiny + " --force --checkpoint-dir " + dir);
    expect_no_space(r, i == 0 ? "safetensors" : "write_png", target);
    EXPECT_TRUE(is_symlink(target));
    std::set<std::string> expected(order, order + i + 1);  // those written before it, and the link
    EXPECT_EQ(list_directory(dir), expected);
    if (i > 0) EXPECT_NO_THROW(train::read_checkpoint(dir + "/checkpoint.safetensors"));
  }
}

TEST_F(WriteErrorsOfTraining, FileSizeLimit) {
  // Each optional output alone, with the limit just under its size: it is the first file the run
  // writes that does not fit (the initial weights and the batch order come before training, the
  // step log before the checkpoint of its epoch).
  for (const auto& [flag, file, what] : {std::tuple{"--save-initial", "initial.safetensors", "safetensors"},
                                         std::tuple{"--dump-batch-order", "order.safetensors", "safetensors"},
                                         std::tuple{"--step-log", "steps.tsv", "mha train: --step-log"}}) {
    SCOPED_TRACE(flag);
    const std::string dir = fresh_directory(std::string("run") + flag);
    const std::string output = path(std::string("out") + flag + "/" + file);
    fs::create_directory(fs::path(output).parent_path());
    expect_too_large(kTiny + " --checkpoint-dir " + dir + " " + flag + " " + output, what, output, size_.at(file) - 1);
    EXPECT_TRUE(list_directory(dir).empty());
  }

  // The checkpoint. (The pictures come after it and are smaller, so no file-size limit fails
  // them alone; they go through write_png, which the limit tests of eval --confusion-png and
  // heatmap --output hold to the same rules, and the /dev/full test above covers them here.)
  //
  // Unlike the other files, the checkpoint's size is not the same from run to run: its history
  // holds each epoch's wall-clock seconds and samples per second, written in their shortest
  // decimal form (a CI run wrote 7752 bytes where the free run above wrote 7760). Each of those
  // two numbers takes at most 24 characters, so the limit stays kSlack bytes clear of the size.
  constexpr uintmax_t kSlack = 64;
  const std::string dir = fresh_directory("limited");
  const std::string checkpoint = dir + "/checkpoint.safetensors";
  expect_too_large(kTiny + " --checkpoint-dir " + dir, "safetensors", checkpoint,
                   size_.at("checkpoint.safetensors") - kSlack);
  EXPECT_TRUE(list_directory(dir).empty());
  const uintmax_t largest = std::max({size_.at("checkpoint.safetensors") + kSlack, size_.at("training_curves.png"),
                                      size_.at("confusion_matrix.png")});
  const CliResult r = run_cli_with_file_size_limit(kTiny + " --checkpoint-dir " + dir, largest);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const train::Checkpoint written = train::read_checkpoint(checkpoint);
  EXPECT_EQ(written.epoch, 1);
  EXPECT_EQ(written.history.size(), 1u);
}

TEST_F(WriteErrorsOfTraining, EvalConfusionPng) {
  const std::string command = "eval --checkpoint " + path("free/checkpoint.safetensors") + " --confusion-png ";
  expect_no_space(run_cli(command + "/dev/full"), "write_png");
  expect_file_size_limit_applies(command, "write_png");
}

}  // namespace
}  // namespace mha
