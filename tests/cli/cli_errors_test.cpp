// Every subcommand of `mha` on bad input: an unknown or malformed flag, a missing file, a path that
// cannot be read (a directory, a FIFO, no permission) or written (no such directory, a directory,
// under a regular file, a read-only file system). Each must print exactly one line, exit
// non-zero, return promptly (a FIFO must not block the reader) and leave no file behind, partial
// or temporary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "../support/cli.h"
#include "mha/core/safetensors.h"

namespace mha {
namespace {

class CliErrors : public mha::testing::CliTest {
 protected:
  void SetUp() override {
    st::File inputs;
    inputs.tensors["query"] = st::from_tensor(Tensor<float>({3, 2, 4}, 0.5f));
    st::save(inputs, path("inputs.safetensors"));
    st::File weights;
    weights.tensors["attn_weights"] = st::from_tensor(Tensor<float>({2, 3, 3}, 0.25f));
    st::save(weights, path("weights.safetensors"));
    std::ofstream(path("corrupt.safetensors"), std::ios::binary) << "not a safetensors file";
    fs::create_directories(path("a_directory"));
    ASSERT_EQ(::mkfifo(path("a_fifo").c_str(), 0600), 0);
  }

  std::set<std::string> files() const {
    std::set<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) out.insert(entry.path().string());
    return out;
  }

  // `arguments` fails: non-zero exit, one line naming `needle`, and the directory as it was.
  void expect_failure(const std::string& arguments, const std::string& needle) {
    SCOPED_TRACE("mha " + arguments);
    const std::set<std::string> before = files();
    const CliResult r = run_cli(arguments);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_EQ(r.output.rfind("mha: error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    EXPECT_EQ(files(), before) << "files were left behind";
  }
};

TEST_F(CliErrors, BadFlagsAndSubcommands) {
  expect_failure("", "A subcommand is required");
  expect_failure("no-such-command",
                 "unknown command 'no-such-command' (commands: attention, heatmap, tokenize, embed, bench, train, eval)");
  const std::string attention = "attention --embed-dim 4 --num-heads 2 --inputs " +
                                path("inputs.safetensors") + " --output " + path("out.safetensors");
  expect_failure(attention + " --no-such-flag", "--no-such-flag");
  expect_failure("attention --embed-dim four --num-heads 2 --inputs " + path("inputs.safetensors") +
                     " --output " + path("out.safetensors"),
                 "--embed-dim");
  expect_failure(attention + " --dtype int8", "--dtype");  // (float16 and bfloat16 are dtypes it runs)
  expect_failure(attention + " --backend fast", "--backend");
  expect_failure(attention + " --dtype float64 --backend cpu_flash", "cpu_flash supports float32, bfloat16 and float16");
  expect_failure(attention + " --kdim 0", "--kdim");
  expect_failure(attention + " --layout zigzag", "--layout: expected only with --context-parallel, got --layout zigzag");
  expect_failure("attention --embed-dim 4 --num-heads 2 --output " + path("out.safetensors"),
                 "--inputs is required");
  expect_failure("attention --embed-dim 4 --num-heads 2 --inputs " + path("inputs.safetensors"),
                 "--output is required");
  const std::string heatmap =
      "heatmap --input " + path("weights.safetensors") + " --output " + path("out.png");
  expect_failure(heatmap + " --cell-size 999", "--cell-size");
  expect_failure(heatmap + " --batch x", "--batch");
  expect_failure("train --epochs 0 --checkpoint-dir " + path("run"), "--epochs");
  expect_failure("train --lr fast --checkpoint-dir " + path("run"), "--lr");
  expect_failure("train --threads 0 --checkpoint-dir " + path("run"), "--threads");
  expect_failure("eval --checkpoint " + path("inputs.safetensors") + " --split validation", "--split");
  expect_failure("bench --repeats 0", "--repeats");
  expect_failure("bench --backend fast", "--backend");
  expect_failure("bench --gemm --decode", "--gemm");
  expect_failure("bench --gemm --context-parallel ring", "--gemm");
}

// Number flags name the flag and the bound, not CLI11's range of doubles (PositiveNumber's upper
// end is 309 digits long), and are read whole and exactly (tools/mha/number_flags.h).
TEST_F(CliErrors, IntegerFlagsSayWhatTheyExpect) {
  const std::string in = " --model " + path("nowhere") + " --input " + path("in.txt") + " --output " +
                         path("out.safetensors");
  expect_failure("embed" + in + " --batch-size 0", "--batch-size: expected an integer >= 1, got 0 (see --help)");
  expect_failure("embed" + in + " --batch-size -3", "--batch-size: expected an integer >= 1, got -3 (see --help)");
  expect_failure("embed" + in + " --batch-size 2.5", "--batch-size: expected an integer >= 1, got 2.5 (see --help)");
  expect_failure("tokenize" + in + " --max-length 1",
                 "--max-length: expected an integer in [2, 1099511627776], got 1 (see --help)");
  expect_failure("tokenize" + in + " --max-length many",
                 "--max-length: expected an integer in [2, 1099511627776], got many (see --help)");
  // Past 64 bits: refused as written (CLI11's conversion saturated, so 2^64 + ... passed as INT64_MAX).
  expect_failure("embed" + in + " --batch-size 99999999999999999999",
                 "--batch-size: expected an integer >= 1, got 99999999999999999999 (see --help)");
  expect_failure("heatmap --input " + path("weights.safetensors") + " --output " + path("out.png") +
                     " --batch 99999999999999999999",
                 "--batch: expected an integer >= 0, got 99999999999999999999 (see --help)");
  // The other commands' number flags likewise: a seed is in [0, 2^64) (no wrap of -1), a count
  // that is not an integer is named as such, and --max-steps 0 (which had meant no limit) refused.
  const std::string run = " --checkpoint-dir " + path("run");
  expect_failure("train --seed -1" + run, "--seed: expected an integer in [0, 2^64), got -1 (see --help)");
  expect_failure("train --seed 18446744073709551616" + run,
                 "--seed: expected an integer in [0, 2^64), got 18446744073709551616 (see --help)");
  expect_failure("train --epochs 1.5" + run, "--epochs: expected an integer in [1, 1048576], got 1.5 (see --help)");
  expect_failure("train --max-steps 0" + run, "--max-steps: expected an integer >= 1, got 0 (see --help)");
  expect_failure("train --lr -1" + run, "--lr: expected a finite number >= 0, got -1 (see --help)");
  expect_failure("train --weight-decay inf" + run, "--weight-decay: expected a finite number >= 0, got inf (see --help)");
  expect_failure("attention --embed-dim 4 --num-heads 2 --seed -5 --inputs " + path("inputs.safetensors") +
                     " --output " + path("out.safetensors"),
                 "--seed: expected an integer in [0, 2^64), got -5 (see --help)");
}

// A directory opens as a stream that reads as empty: without the check, tokenize and embed wrote
// empty outputs and exited 0. The input is checked before the model is read.
TEST_F(CliErrors, TextInputThatIsADirectory) {
  for (const char* command : {"tokenize", "embed"}) {
    expect_failure(std::string(command) + " --model " + path("nowhere") + " --input " + path("a_directory") +
                       " --output " + path("out.safetensors"),
                   "--input: expected a text file, got a directory: '" + path("a_directory") + "'");
  }
}

TEST_F(CliErrors, HelpStillPrintsUsageAndSucceeds) {
  const CliResult r = run_cli("attention --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--embed-dim"), std::string::npos) << r.output;
}

TEST_F(CliErrors, MissingAndUnreadableInputs) {
  const std::string attention = "attention --embed-dim 4 --num-heads 2 --output " + path("out.safetensors");
  expect_failure(attention + " --inputs " + path("missing.safetensors"), path("missing.safetensors"));
  expect_failure(attention + " --inputs " + path("a_directory"), path("a_directory"));
  expect_failure(attention + " --inputs " + path("a_fifo"), "not a regular file");
  expect_failure(attention + " --inputs " + path("inputs.safetensors/x"), "inputs.safetensors/x");
  expect_failure(attention + " --inputs " + path("corrupt.safetensors"), path("corrupt.safetensors"));
  expect_failure(
      attention + " --inputs " + path("inputs.safetensors") + " --weights " + path("missing.safetensors"),
      path("missing.safetensors"));
  expect_failure(attention + " --inputs " + path("inputs.safetensors") + " --weights " + path("a_fifo"),
                 "not a regular file");
  expect_failure(
      attention + " --inputs " + path("inputs.safetensors") + " --weights " + path("corrupt.safetensors"),
      path("corrupt.safetensors"));

  const std::string heatmap = "heatmap --output " + path("out.png") + " --input ";
  expect_failure(heatmap + path("missing.safetensors"), path("missing.safetensors"));
  expect_failure(heatmap + path("a_directory"), path("a_directory"));
  expect_failure(heatmap + path("a_fifo"), "not a regular file");
  expect_failure(heatmap + path("corrupt.safetensors"), path("corrupt.safetensors"));

  expect_failure("eval --checkpoint " + path("missing.safetensors"), path("missing.safetensors"));
  expect_failure("eval --checkpoint " + path("a_directory"), path("a_directory"));
  expect_failure("eval --checkpoint " + path("a_fifo"), "not a regular file");
  expect_failure("eval --checkpoint " + path("corrupt.safetensors"), path("corrupt.safetensors"));
  expect_failure("train --data-dir " + path("missing") + " --checkpoint-dir " + path("run"), path("missing"));
  expect_failure("train --data-dir " + path("a_directory") + " --checkpoint-dir " + path("run"),
                 path("a_directory"));
  expect_failure("train --resume --checkpoint-dir " + path("a_directory"), "--resume: no checkpoint");
}

// Root reads any file whatever its mode, so this runs only for other users.
TEST_F(CliErrors, PermissionDeniedInput) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: file permissions do not stop reads";
  fs::permissions(path("inputs.safetensors"), fs::perms::none);
  expect_failure("attention --embed-dim 4 --num-heads 2 --output " + path("out.safetensors") + " --inputs " +
                     path("inputs.safetensors"),
                 "Permission denied");
  fs::permissions(path("inputs.safetensors"), fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(CliErrors, UnwritableOutputsLeaveNothing) {
  const std::string attention =
      "attention --embed-dim 4 --num-heads 2 --inputs " + path("inputs.safetensors");
  expect_failure(attention + " --output " + path("no_such_dir/out.safetensors"), "no_such_dir");
  expect_failure(attention + " --output " + path("a_directory"), path("a_directory"));
  expect_failure(attention + " --output " + path("inputs.safetensors/out.safetensors"),
                 "inputs.safetensors/out");
  expect_failure(attention + " --output /proc/mha_cli_test.safetensors", "/proc/mha_cli_test.safetensors");

  const std::string heatmap = "heatmap --input " + path("weights.safetensors") + " --output ";
  expect_failure(heatmap + path("no_such_dir/out.png"), "no_such_dir");
  expect_failure(heatmap + path("a_directory"), path("a_directory"));
  expect_failure(heatmap + path("weights.safetensors/out.png"), "weights.safetensors/out.png");
}

// The outputs of `mha train` and `mha eval`, with the real data (the runs are a few steps).
TEST_F(CliErrors, TrainAndEvalOutputsThatCannotBeWritten) {
  if (!mha::testing::have_fashion_mnist()) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  const std::string tiny =
      "train --train-limit 64 --test-limit 16 --batch-size 32 --epochs 1 --width 8 --heads 1 "
      "--hidden 8 --blocks 1 --input-projection ";
  expect_failure(tiny + "--checkpoint-dir " + path("inputs.safetensors/run"),
                 "--checkpoint-dir: cannot create");
  // (An existing --checkpoint-dir: train creates it before writing --save-initial.)
  expect_failure(tiny + "--checkpoint-dir " + path("a_directory") + " --save-initial " +
                     path("no_such_dir/w.safetensors"),
                 "no_such_dir");
  // Written after every epoch, so checked before the first.
  expect_failure(tiny + "--checkpoint-dir " + path("run") + " --step-log " + path("no_such_dir/s.tsv"),
                 "--step-log: cannot write");
  expect_failure(
      tiny + "--max-steps 1 --checkpoint-dir " + path("run") + " --dump-batch-order " + path("a_directory"),
      path("a_directory"));
  // A checkpoint to evaluate, then a confusion matrix that cannot be written.
  const CliResult trained = run_cli(tiny + "--checkpoint-dir " + path("run"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  expect_failure("eval --checkpoint " + path("run/checkpoint.safetensors") + " --confusion-png " +
                     path("no_such_dir/c.png"),
                 "--confusion-png: cannot write");
}

}  // namespace
}  // namespace mha
