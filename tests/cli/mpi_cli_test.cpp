// The command line under mpirun.
//   `mha attention --context-parallel ring|ulysses` against the single-process command on the same
//   files: rank 0 writes the same tensors under the same names, forward and --backward; ulysses
//   bit for bit, the ring within FlashAttention's rule against the float64 command; an error on
//   the ranks ends them all with the message and no output file.
//   `mha train`, data-parallel: the loss of every step of 2 ranks × 64 rows (and 3 ranks × 43 or
//   42) equals 1 process × 128 within float rounding for 20 steps; the same P gives the same
//   weights bit for bit; the checkpoint is written once, by rank 0, and loads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "../support/cli.h"
#include "mha/core/random.h"
#include "mha/core/safetensors.h"
#include "mha/train/trainer.h"

#ifdef MHA_MPIEXEC
namespace mha {
namespace {

using mha::testing::run_program;

// mpiexec with the environment the ctest "distributed.np*" tests have (MHA_MPI_TEST_ENVIRONMENT in
// CMakeLists.txt: root, more ranks than cores, no leak report of Open MPI's under the sanitizers).
CliResult run_mpi(int ranks, const std::string& arguments) {
  return run_program("env", MHA_MPI_ENVIRONMENT " " MHA_MPIEXEC " -n " + std::to_string(ranks) + " " MHA_CLI_PATH " " +
                                arguments);
}

Tensor<float> random_tensor(const Shape& shape, Generator& gen) {
  Tensor<float> t(shape);
  for (auto& x : t.values()) x = static_cast<float>(gen.uniform(-1.0, 1.0));
  return t;
}

double max_diff(const st::TensorData& a, const st::TensorData& b) {
  const Tensor<double> x = st::to_tensor<double>(a, "a"), y = st::to_tensor<double>(b, "b");
  EXPECT_EQ(x.shape(), y.shape());
  double worst = 0;
  for (int64_t i = 0; i < std::min(x.numel(), y.numel()); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

class MpiCli : public mha::testing::CliTest {
 protected:
  // Batch-first (N=2): query (2, 37, 16), key and value (2, 45, 16), a key-padding mask, and
  // grad_output; or self-attention (query only) with a causal attn_mask.
  void write_inputs(bool self_attention) {
    Generator gen(5);
    const int64_t n = 2, L = 37, S = self_attention ? L : 45, e = 16;
    st::File inputs;
    inputs.tensors["query"] = st::from_tensor(random_tensor({n, L, e}, gen));
    inputs.tensors["grad_output"] = st::from_tensor(random_tensor({n, L, e}, gen));
    if (self_attention) {
      Tensor<bool> causal({L, L});
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j) causal[i * L + j] = j > i;  // True: may not attend
      inputs.tensors["attn_mask"] = st::from_tensor(causal);
    } else {
      inputs.tensors["key"] = st::from_tensor(random_tensor({n, S, e}, gen));
      inputs.tensors["value"] = st::from_tensor(random_tensor({n, S, e}, gen));
      Tensor<bool> padding({n, S});
      for (int64_t j = 0; j < n * S; ++j) padding[j] = j % S >= S - 4 * (j / S + 1);  // the last keys
      inputs.tensors["key_padding_mask"] = st::from_tensor(padding);
    }
    st::save(inputs, path("inputs.safetensors"));
  }

  std::string command(const std::string& output, const std::string& extra) {
    return "attention --embed-dim 16 --num-heads 4 --batch-first --no-need-weights --backward --seed 3 --inputs " +
           path("inputs.safetensors") + " --output " + path(output) + " " + extra;
  }
};

const char* kResults[] = {"output", "grad_query", "grad_key", "grad_value", "grad.in_proj_weight",
                          "grad.in_proj_bias", "grad.out_proj.weight", "grad.out_proj.bias"};

TEST_F(MpiCli, UlyssesWritesTheSingleProcessFileBitForBit) {
  write_inputs(/*self_attention=*/true);
  ASSERT_EQ(run_cli(command("one.safetensors", "--is-causal")).exit_code, 0);
  const CliResult r = run_mpi(3, command("three.safetensors", "--is-causal --context-parallel ulysses --layout zigzag"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const st::File one = st::load(path("one.safetensors")), three = st::load(path("three.safetensors"));
  for (const char* name : kResults) {
    ASSERT_TRUE(three.tensors.count(name)) << name;
    EXPECT_EQ(three.tensors.at(name).shape, one.tensors.at(name).shape) << name;
    EXPECT_EQ(three.tensors.at(name).bytes, one.tensors.at(name).bytes) << name << ": " << max_diff(three.tensors.at(name), one.tensors.at(name));
  }
}

TEST_F(MpiCli, RingIsWithinFlashAttentionsRuleOfTheSingleProcessFile) {
  write_inputs(/*self_attention=*/false);
  ASSERT_EQ(run_cli(command("f32.safetensors", "")).exit_code, 0);
  ASSERT_EQ(run_cli(command("f64.safetensors", "--dtype float64")).exit_code, 0);
  for (const char* layout : {"contiguous", "zigzag"}) {
    const CliResult r = run_mpi(3, command("ring.safetensors", std::string("--context-parallel ring --layout ") + layout));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const st::File f32 = st::load(path("f32.safetensors")), f64 = st::load(path("f64.safetensors")),
                   ring = st::load(path("ring.safetensors"));
    for (const char* name : kResults) {
      ASSERT_TRUE(ring.tensors.count(name)) << name;
      const double error = max_diff(ring.tensors.at(name), f64.tensors.at(name));
      const double single = max_diff(f32.tensors.at(name), f64.tensors.at(name));
      EXPECT_LE(error, 2 * single + 1e-6) << layout << " " << name << ": ring " << error << ", single process " << single;
    }
  }
}

TEST_F(MpiCli, AnErrorEndsEveryRankAndLeavesNoFile) {
  write_inputs(/*self_attention=*/false);
  // The weights are asked for by default; context-parallel attention does not return them.
  const CliResult r = run_mpi(3, "attention --embed-dim 16 --num-heads 4 --batch-first --context-parallel ring --inputs " +
                                     path("inputs.safetensors") + " --output " + path("out.safetensors"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("options.need_weights: context-parallel attention does not return the weights"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(path("out.safetensors")));
}

// The loss column of a --step-log file.
std::vector<double> losses(const std::string& tsv) {
  std::vector<double> out;
  std::istringstream in(mha::testing::read_file(tsv));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) out.push_back(std::stod(line.substr(line.rfind('\t') + 1)));
  return out;
}

const std::string kTrain = "train --batch-size 128 --test-limit 100 --seed 4 ";

// mpiexec's MPMD form: rank 0 runs `first` in directory `dir0`, rank 1 `second` in `dir1`.
CliResult run_mpi_two(const std::string& dir0, const std::string& first, const std::string& dir1,
                      const std::string& second) {
  return run_program("env", MHA_MPI_ENVIRONMENT " " MHA_MPIEXEC " -n 1 -wdir " + dir0 + " " MHA_CLI_PATH " " + first +
                                " : -n 1 -wdir " + dir1 + " " MHA_CLI_PATH " " + second);
}

TEST_F(MpiCli, RanksThatRunAnotherCommandAreRefusedNamingTheDifference) {
  write_inputs(/*self_attention=*/false);
  const std::string dir = path(""), flags = command("out.safetensors", "--context-parallel ring");
  // A flag one rank alone has: without the check that rank would wait in the backward's messages.
  CliResult r = run_mpi_two(dir, flags + " --train", dir, flags);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("attention: every rank must run the same command, but rank 1's --train ((default)) differs "
                          "from rank 0's (true)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(path("out.safetensors")));
  // The same flags, a file of other contents (ranks in other directories, as on other hosts):
  // without the check the output would mix projections of both.
  for (const char* sub : {"a", "b"}) std::filesystem::create_directory(path(sub));
  std::filesystem::copy_file(path("inputs.safetensors"), path("a/in.safetensors"));
  write_inputs(/*self_attention=*/true);
  std::filesystem::copy_file(path("inputs.safetensors"), path("b/in.safetensors"));
  const std::string relative = "attention --embed-dim 16 --num-heads 4 --batch-first --no-need-weights --inputs "
                               "in.safetensors --output " + path("out.safetensors") + " --context-parallel ring";
  r = run_mpi_two(path("a"), relative, path("b"), relative);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("but rank 1's --inputs file (contents "), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(path("out.safetensors")));
  // Training: another width would sum gradients of other shapes.
  r = run_mpi_two(dir, kTrain + "--max-steps 1 --train-limit 256 --hidden 64", dir,
                  kTrain + "--max-steps 1 --train-limit 256");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("train: every rank must run the same command, but rank 1's --hidden ((default)) differs from "
                          "rank 0's (64)"),
            std::string::npos)
      << r.output;
}

TEST_F(MpiCli, DataParallelLossCurveIsTheSingleProcessOnesWithinRounding) {
  const CliResult one = run_cli(kTrain + "--train-limit 2560 --max-steps 20 --step-log " + path("one.tsv"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> want = losses(path("one.tsv"));
  ASSERT_EQ(want.size(), 20u);
  for (int ranks : {2, 3}) {
    const std::string log = path("ranks" + std::to_string(ranks) + ".tsv");
    const CliResult r = run_mpi(ranks, kTrain + "--train-limit 2560 --max-steps 20 --step-log " + log);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("data-parallel over " + std::to_string(ranks) + " ranks"), std::string::npos) << r.output;
    const std::vector<double> got = losses(log);
    ASSERT_EQ(got.size(), want.size());
    // The gradients are summed in another order (each rank's rows, then across ranks): the
    // weights differ by float rounding, which 20 AdamW steps carry into the loss by a few ulps
    // (measured: at most 2.4e-7 on losses near 2.2, one float ulp).
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i])) << ranks << " ranks, step " << i + 1;
  }
}

TEST_F(MpiCli, DataParallelRunsAreReproducibleAndRankZeroWritesTheCheckpoint) {
  std::vector<nn::StateDict<float>> models;
  for (const char* run : {"a", "b"}) {
    const CliResult r = run_mpi(2, kTrain + "--epochs 1 --train-limit 512 --checkpoint-dir " + path(run));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(mha::testing::lines_containing(r.output, "epoch 1/1: train loss").size(), 1u) << "rank 0 alone prints: " << r.output;
    models.push_back(train::read_checkpoint(path(run) + "/checkpoint.safetensors").model);
  }
  ASSERT_EQ(models[0].size(), models[1].size());
  for (const auto& [name, tensor] : models[0]) {
    const Tensor<float>& other = models[1].at(name);
    ASSERT_EQ(tensor.shape(), other.shape()) << name;
    EXPECT_EQ(std::memcmp(tensor.data(), other.data(), sizeof(float) * static_cast<size_t>(tensor.numel())), 0) << name;
  }
}

}  // namespace
}  // namespace mha
#endif
