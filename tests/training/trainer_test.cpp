// Training: the batch order, the configuration's JSON form, checkpoints (a resumed run is
// bitwise the uninterrupted one), and the PyTorch twin's first 50 losses
// (tests/goldens/training/twin_*.safetensors, written by scripts/twin/train_twin.py golden).
#include "mha/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/golden.h"
#include "../support/printable.h"
#include "../support/temp_dir.h"
#include "mha/core/safetensors.h"

namespace {

namespace fs = std::filesystem;
namespace st = mha::safetensors;
using mha::Tensor;
using mha::testing::throws_error;
using mha::train::Trainer;
using mha::train::TrainingConfig;

// Random 28 × 28 "images" whose label is visible in them (a bright column at 2·label), so a
// few steps of training learn it.
mha::data::LabelledImages synthetic(int64_t count, uint64_t seed) {
  mha::Generator gen(seed);
  mha::data::LabelledImages d;
  d.count = count;
  d.rows = d.columns = 28;
  d.pixels.resize(static_cast<size_t>(count * 28 * 28));
  d.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<uint8_t>(gen.next_u32() % 10);
    d.labels[static_cast<size_t>(i)] = label;
    for (int64_t p = 0; p < 28 * 28; ++p)
      d.pixels[static_cast<size_t>(i * 784 + p)] =
          static_cast<uint8_t>(p % 28 == 2 * label ? 200 + gen.next_u32() % 56 : gen.next_u32() % 64);
  }
  return d;
}

TrainingConfig small_config() {
  TrainingConfig c;
  c.model.embed_dim = 16;
  c.model.num_heads = 2;
  c.model.hidden_dim = 32;
  c.model.num_blocks = 2;
  c.model.input_projection = c.model.learned_positions = c.model.pre_norm = true;
  c.model.dropout = 0.2;
  c.epochs = 3;
  c.batch_size = 50;  // 230 images: 5 batches, the last one partial
  c.lr = 3e-3;
  c.min_lr = 1e-4;
  c.warmup_steps = 4;
  c.seed = 42;
  return c;
}

TEST(EpochOrder, IsASeededPermutationThatChangesEveryEpoch) {
  const auto a = mha::train::epoch_order(1000, 7, 0), b = mha::train::epoch_order(1000, 7, 0);
  EXPECT_EQ(a, b);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
  EXPECT_NE(a, mha::train::epoch_order(1000, 7, 1));
  EXPECT_NE(a, mha::train::epoch_order(1000, 8, 0));
  EXPECT_TRUE(mha::train::epoch_order(0, 1, 0).empty());
  EXPECT_TRUE(throws_error([] { mha::train::epoch_order(5, 1, -1); }, {"epoch", "got -1"}));
}

TEST(TrainingConfig, RoundTripsThroughJsonAndRefusesBadFields) {
  const TrainingConfig c = small_config();
  EXPECT_TRUE(TrainingConfig::from_json(c.to_json()) == c);
  std::string json = c.to_json();
  EXPECT_TRUE(throws_error([&] { TrainingConfig::from_json(json.substr(0, json.size() - 1)); }, {"invalid JSON"}));
  std::string extra = json;
  extra.insert(1, "\"momentum\":0.9,");
  EXPECT_TRUE(throws_error([&] { TrainingConfig::from_json(extra); }, {"unexpected field 'momentum'"}));
  std::string missing = json;
  const auto at = missing.find("\"epochs\":3,");
  ASSERT_NE(at, std::string::npos);
  missing.erase(at, 11);
  EXPECT_TRUE(throws_error([&] { TrainingConfig::from_json(missing); }, {"missing field 'epochs'"}));
  std::string wrong = json;
  wrong.replace(wrong.find("\"epochs\":3"), 10, "\"epochs\":\"3\"");
  EXPECT_TRUE(throws_error([&] { TrainingConfig::from_json(wrong); }, {"'epochs'", "integer"}));
  TrainingConfig bad = c;
  bad.min_lr = 1.0;
  EXPECT_TRUE(throws_error([&] { bad.check_valid(); }, {"min_lr", "[0, lr"}));
  bad = c;
  bad.batch_size = 0;
  EXPECT_TRUE(throws_error([&] { bad.check_valid(); }, {"batch_size", "got 0"}));
}

TEST(Trainer, LearnsAndRecordsEachEpoch) {
  const auto train = synthetic(230, 1), test = synthetic(60, 2);
  TrainingConfig c = small_config();
  c.model.dropout = 0;
  c.epochs = 10;
  c.lr = 1e-2;
  Trainer trainer(c, train, test);
  EXPECT_EQ(trainer.steps_per_epoch(), 5);
  std::vector<int64_t> batches;
  for (int e = 0; e < 10; ++e)
    trainer.run_epoch([&](const mha::train::BatchProgress& p) {
      batches.push_back(p.batch);
      EXPECT_EQ(p.batches, 5);
      EXPECT_EQ(p.samples, std::min<int64_t>(p.batch * 50, 230));
    });
  EXPECT_EQ(batches.size(), 50u);
  EXPECT_TRUE(trainer.finished());
  EXPECT_EQ(trainer.step(), 50);
  ASSERT_EQ(trainer.history().size(), 10u);
  for (const auto& h : trainer.history()) std::printf("epoch %lld: train loss %.3f, test accuracy %.2f\n",
                                                       static_cast<long long>(h.epoch), h.train_loss, h.test_accuracy);
  EXPECT_LT(trainer.history().back().train_loss, trainer.history().front().train_loss);
  EXPECT_GT(trainer.history().back().test_accuracy, 0.8);  // the label is a bright column
  const auto& e = trainer.last_evaluation();
  EXPECT_EQ(e.count, 60);
  EXPECT_EQ(std::accumulate(e.confusion.begin(), e.confusion.end(), int64_t{0}), 60);
  EXPECT_TRUE(throws_error([&] { trainer.run_epoch(); }, {"all 10 epochs are done"}));
}

// Two epochs straight, or one, a checkpoint, a fresh process's worth of objects and one more:
// the same weights, optimizer state, dropout counter and history, bit for bit.
TEST(Trainer, ResumedRunIsBitwiseTheUninterruptedOne) {
  const mha::testing::TempDir dir("mha_trainer_test");
  const auto train = synthetic(230, 3), test = synthetic(40, 4);
  const TrainingConfig c = small_config();
  Trainer straight(c, train, test);
  straight.run_epoch();
  straight.run_epoch();

  {
    Trainer first(c, train, test);
    first.run_epoch();
    first.save_checkpoint(dir.file("checkpoint.safetensors"));
  }
  Trainer resumed(c, train, test);
  resumed.load_checkpoint(dir.file("checkpoint.safetensors"));
  EXPECT_EQ(resumed.epoch(), 1);
  EXPECT_EQ(resumed.step(), 5);
  resumed.run_epoch();

  const auto a = straight.model().state_dict(), b = resumed.model().state_dict();
  for (const auto& [name, t] : a)
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t[i], b.at(name)[i]) << name << "[" << i << "]";
  const auto oa = straight.optimizer().state_dict(), ob = resumed.optimizer().state_dict();
  for (const auto& [name, t] : oa)
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t[i], ob.at(name)[i]) << name << "[" << i << "]";
  EXPECT_EQ(straight.model().dropout_counter(), resumed.model().dropout_counter());
  ASSERT_EQ(resumed.history().size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(straight.history()[e].train_loss, resumed.history()[e].train_loss);
    EXPECT_EQ(straight.history()[e].test_accuracy, resumed.history()[e].test_accuracy);
    EXPECT_EQ(straight.history()[e].lr, resumed.history()[e].lr);
  }
  // The checkpoint's metadata says where the run stands.
  const auto checkpoint = mha::train::read_checkpoint(dir.file("checkpoint.safetensors"));
  EXPECT_EQ(checkpoint.epoch, 1);
  EXPECT_EQ(checkpoint.step, 5);
  EXPECT_TRUE(checkpoint.config == c);
}

TEST(Trainer, RefusesAMismatchedOrDamagedCheckpoint) {
  const mha::testing::TempDir dir("mha_trainer_test");
  const auto train = synthetic(100, 5), test = synthetic(20, 6);
  TrainingConfig c = small_config();
  Trainer trainer(c, train, test);
  trainer.run_epoch();
  const std::string path = dir.file("c.safetensors");
  trainer.save_checkpoint(path);
  TrainingConfig other = c;
  other.lr = 1e-3;
  Trainer different(other, train, test);
  EXPECT_TRUE(throws_error([&] { different.load_checkpoint(path); },
                           {path, "another training configuration", "\"lr\":0.001"}));
  st::File file = st::load(path);
  file.metadata["format"] = "something-else";
  st::save(file, dir.file("format.safetensors"));
  EXPECT_TRUE(throws_error([&] { mha::train::read_checkpoint(dir.file("format.safetensors")); },
                           {"checkpoint format", "something-else"}));
  file = st::load(path);
  file.metadata.erase("dropout_counter");
  st::save(file, dir.file("meta.safetensors"));
  EXPECT_TRUE(throws_error([&] { mha::train::read_checkpoint(dir.file("meta.safetensors")); },
                           {"metadata field 'dropout_counter' is missing"}));
  file = st::load(path);
  file.tensors.erase("model.fc1.bias");
  st::save(file, dir.file("tensor.safetensors"));
  EXPECT_TRUE(throws_error([&] { trainer.load_checkpoint(dir.file("tensor.safetensors")); },
                           {"missing tensor 'fc1.bias'"}));
  EXPECT_TRUE(throws_error([&] { mha::train::read_checkpoint(dir.file("absent.safetensors")); }, {"absent"}));
}

// The checkpoint's metadata and tensor names are text from a file: the messages quoting them are
// escaped (printable, with the escape in place of the control characters).
TEST(Trainer, QuotesCheckpointMetadataAndNamesEscaped) {
  const mha::testing::TempDir dir("mha_trainer_test");
  const auto train = synthetic(100, 5), test = synthetic(20, 6);
  Trainer trainer(small_config(), train, test);
  const std::string path = dir.file("c.safetensors");
  trainer.save_checkpoint(path);
  const auto message_of = [&](const std::function<void(st::File&)>& damage) {
    st::File file = st::load(path);
    damage(file);
    st::save(file, dir.file("damaged.safetensors"));
    return mha::testing::error_of(
        [&] { (void)mha::train::read_checkpoint(dir.file("damaged.safetensors")); });
  };
  using mha::testing::printable_and_holds;
  EXPECT_TRUE(printable_and_holds(
      message_of([](st::File& f) { f.metadata["format"] = "\x1b[2J\xc2\x9b\xe2\x80\xae"; }),
      "got '\\x1b[2J\\u009b\\u202e'"));
  EXPECT_TRUE(printable_and_holds(message_of([](st::File& f) { f.metadata["epoch"] = "1\x1b]0;x\x07"; }),
                                  "metadata 'epoch': expected a whole number >= 0, got '1\\x1b]0;x\\x07'"));
  // A configuration field that is not one; JSON's \u escapes decode to the raw characters.
  EXPECT_TRUE(printable_and_holds(message_of([](st::File& f) {
                                    f.metadata["config"] =
                                        R"({"\u001b[2J\u009b":1,)" + f.metadata["config"].substr(1);
                                  }),
                                  "unexpected field '\\x1b[2J\\u009b'"));
  EXPECT_TRUE(printable_and_holds(
      message_of([](st::File& f) { f.tensors["\x1b]0;x\x07"] = st::from_tensor(Tensor<float>({1})); }),
      "unexpected tensor '\\x1b]0;x\\x07'"));
}

TEST(Trainer, RefusesDataThatDoesNotFit) {
  auto train = synthetic(50, 7), test = synthetic(10, 8);
  TrainingConfig c = small_config();
  c.train_limit = 51;
  EXPECT_TRUE(throws_error([&] { Trainer t(c, train, test); }, {"train_limit", "at most the 50", "51"}));
  c.train_limit = 0;
  c.warmup_steps = 3;  // 3 epochs of 1 step
  c.batch_size = 64;
  EXPECT_TRUE(throws_error([&] { Trainer t(c, train, test); }, {"warmup_steps", "fewer than the 3 steps"}));
  c = small_config();
  train.labels[3] = 12;
  EXPECT_TRUE(throws_error([&] { Trainer t(c, train, test); }, {"training data", "label 12"}));
}

// mha and the PyTorch twin from the same initial weights on the same batches (dropout off): the
// first 50 losses agree within 1e-4 relative. Reads the real Fashion-MNIST files.
TEST(TwinGolden, FirstFiftyLossesMatchPyTorch) {
  if (!fs::exists(std::string(mha::data::kDefaultFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed (scripts/install_deps.sh installs it)";
  const auto train = mha::data::load_fashion_mnist(mha::data::kDefaultFashionMnistDir, mha::data::Split::train);
  const auto test = mha::data::load_fashion_mnist(mha::data::kDefaultFashionMnistDir, mha::data::Split::test).first(100);
  int goldens = 0;
  for (const auto& entry : fs::directory_iterator(mha::testing::goldens_dir() + "/training")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("twin_", 0) != 0) continue;
    ++goldens;
    SCOPED_TRACE(name);
    const st::File golden = st::load(entry.path().string());
    TrainingConfig config = TrainingConfig::from_json(golden.metadata.at("config"));
    config.test_limit = 0;
    Trainer trainer(config, train, test);
    mha::nn::StateDict<float> initial;
    for (const auto& [tensor_name, data] : golden.tensors)
      if (tensor_name.rfind("model.", 0) == 0) initial.emplace(tensor_name.substr(6), st::to_tensor<float>(data, tensor_name));
    // mha initialises exactly these weights from the seed; the twin loaded them from mha.
    for (const auto& [param, t] : trainer.model().state_dict())
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t[i], initial.at(param)[i]) << param;
    trainer.model().load_state_dict(initial);

    const Tensor<int64_t> order = st::to_tensor<int64_t>(st::require(golden, "order", name), "order");
    const Tensor<double> losses = st::to_tensor<double>(st::require(golden, "losses", name), "losses");
    const Tensor<double> lrs = st::to_tensor<double>(st::require(golden, "lr", name), "lr");
    const std::vector<int64_t> indices(order.values().begin(), order.values().end());
    // The order the twin used is mha's own shuffle.
    const int64_t per_epoch = trainer.steps_per_epoch();
    std::vector<int64_t> expected_order;
    for (int64_t e = 0; static_cast<int64_t>(expected_order.size()) < order.numel(); ++e) {
      const auto epoch = mha::train::epoch_order(trainer.train_data().count, config.seed, e);
      expected_order.insert(expected_order.end(), epoch.begin(), epoch.end());
    }
    expected_order.resize(indices.size());
    EXPECT_EQ(indices, expected_order);

    double worst = 0;
    int64_t begin = 0;
    for (int64_t step = 0; step < losses.numel(); ++step) {
      const int64_t in_epoch = step % per_epoch;
      const int64_t n = std::min(config.batch_size, trainer.train_data().count - in_epoch * config.batch_size);
      EXPECT_NEAR(trainer.schedule().lr_at(step), lrs[step], 1e-15) << "step " << step;
      const float loss = trainer.train_step(mha::data::image_batch(trainer.train_data(), indices, begin, n),
                                            mha::data::label_batch(trainer.train_data(), indices, begin, n));
      begin += n;
      const double relative = std::abs(loss - losses[step]) / std::abs(losses[step]);
      worst = std::max(worst, relative);
      EXPECT_LE(relative, 1e-4) << "step " << step << ": mha " << loss << ", PyTorch " << losses[step];
    }
    std::printf("%s: %lld steps, largest relative loss difference %.2e (allowed 1e-4)\n", name.c_str(),
                static_cast<long long>(losses.numel()), worst);
  }
  EXPECT_GE(goldens, 2);
}

}  // namespace
