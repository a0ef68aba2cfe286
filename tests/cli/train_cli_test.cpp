// `mha train` and `mha eval` as black boxes: bad flags give a one-line message; a small run writes
// its checkpoint and pictures; a run stopped and resumed ends with the same checkpoint tensors as
// an uninterrupted one; eval reads the checkpoint. The runs need the real Fashion-MNIST files.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../support/cli.h"
#include "mha/core/safetensors.h"
#include "mha/viz/heatmap.h"

namespace mha {
namespace {

using TrainCli = testing::CliTest;

// A small, fast configuration: 640 training images, 2 epochs of 10 steps.
const std::string kSmall =
    "--train-limit 640 --test-limit 200 --batch-size 64 --epochs 2 --width 16 --heads 2 --blocks 2 "
    "--input-projection --positions --pre-norm --dropout 0.1 --lr 3e-3 --warmup-steps 3 --seed 5";

TEST_F(TrainCli, BadFlagsGiveOneLineErrors) {
  auto r = run_cli("train --data-dir " + path("nowhere") + " --checkpoint-dir " + path("run"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("mha: error: Fashion-MNIST: data directory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;
  r = run_cli("train --width 30 --checkpoint-dir " + path("run"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("embed_dim must be divisible by num_heads"), std::string::npos) << r.output;
  r = run_cli("train --width 32 --checkpoint-dir " + path("run"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("without an input projection"), std::string::npos) << r.output;
  r = run_cli("train --resume --checkpoint-dir " + path("run"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--resume: no checkpoint at"), std::string::npos) << r.output;
  r = run_cli("train --epochs 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--epochs"), std::string::npos) << r.output;
  r = run_cli("eval --checkpoint " + path("missing.safetensors"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(fs::exists(path("run")));
}

TEST_F(TrainCli, TrainsResumesAndEvaluates) {
  if (!mha::testing::have_fashion_mnist()) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  // Uninterrupted.
  auto r = run_cli("train " + kSmall + " --checkpoint-dir " + path("straight") + " --step-log " + path("steps.tsv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("epoch 2/2: train loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("samples/s"), std::string::npos) << r.output;
  for (const char* f : {"checkpoint.safetensors", "training_curves.png", "confusion_matrix.png"})
    EXPECT_TRUE(fs::exists(path("straight/") + f)) << f;
  const mha::viz::Image curves = mha::viz::read_png(path("straight/training_curves.png"));
  EXPECT_GT(curves.width, 500);
  const mha::viz::Image confusion = mha::viz::read_png(path("straight/confusion_matrix.png"));
  EXPECT_GT(confusion.height, 300);
  EXPECT_TRUE(fs::exists(path("steps.tsv")));

  // Stopped after one epoch, then resumed.
  r = run_cli("train " + kSmall + " --checkpoint-dir " + path("split") + " --stop-after 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stopped after 1 epoch"), std::string::npos) << r.output;
  r = run_cli("train --resume --checkpoint-dir " + path("split") + " --lr 1e-3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("the flags change the training configuration"), std::string::npos) << r.output;
  r = run_cli("train --resume --checkpoint-dir " + path("split") + " --epochs 2");  // agrees: allowed
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming"), std::string::npos) << r.output;
  const st::File a = st::load(path("straight/checkpoint.safetensors")), b = st::load(path("split/checkpoint.safetensors"));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, data] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(name)) << name;
    EXPECT_EQ(data.bytes, b.tensors.at(name).bytes) << name;
  }
  EXPECT_EQ(a.metadata.at("step"), b.metadata.at("step"));
  EXPECT_EQ(a.metadata.at("dropout_counter"), b.metadata.at("dropout_counter"));
  r = run_cli("train --resume --checkpoint-dir " + path("split"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing to train"), std::string::npos) << r.output;

  // A new run over an existing checkpoint needs --force.
  r = run_cli("train " + kSmall + " --checkpoint-dir " + path("split"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;

  r = run_cli("eval --checkpoint " + path("straight/checkpoint.safetensors") + " --confusion-png " + path("c.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Fashion-MNIST test set, 10000 images: loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Ankle boot"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(path("c.png")));
}

}  // namespace
}  // namespace mha
