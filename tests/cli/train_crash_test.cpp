// Crash safety of `mha train`: SIGKILL at any moment, checkpoint writing included, leaves either no
// checkpoint (killed before the first one) or a complete, loadable one, and no debris; the run
// then finished (with --resume when there is a checkpoint, afresh when not) ends with model and
// optimizer tensors bitwise equal to those of an uninterrupted run.
//
// The kill moments: a few right at process start; 20 drawn (fixed seed) uniformly over the
// uninterrupted run's measured duration; and a few aimed at checkpoint writes, a short time
// after the run announces an epoch (it prints "epoch k/E: ..." and flushes just before saving
// that epoch's checkpoint). Every delay but those at the start is a fraction of the measured
// duration of a run, so the test means the same under the sanitizers, where everything is
// slower. The duration is the fastest complete run seen so far: the uninterrupted ones, and any
// later run that went from start to end (a fresh start after a kill, a run that ended before its
// kill), so that a machine busy at the beginning does not push the kills past the end of later
// runs. Whether a kill landed inside a checkpoint write shows afterwards: the epoch announced
// last is ahead of the checkpoint's.
//
// Built as its own test program (test_train_crash, ctest label "crash"); it needs the
// Fashion-MNIST files and skips without them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "../support/cli.h"
#include "mha/core/safetensors.h"
#include "mha/train/trainer.h"
#include "mha/viz/heatmap.h"

namespace mha {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kEpochs = 16;
// Small enough that the whole run takes about a second, with a checkpoint (and two pictures)
// written after each of its 16 epochs of 8 steps. Dropout, so the resumed run must also restore
// the dropout stream. One thread: the same arithmetic in every run, and room for ctest's other job.
const std::string kConfig =
    "--train-limit 256 --test-limit 64 --batch-size 32 --epochs 16 --width 16 --heads 2 --hidden 16 --blocks 1 "
    "--input-projection --positions --dropout 0.1 --lr 3e-3 --warmup-steps 4 --seed 21 --threads 1";

std::string train_command(const std::string& dir) { return "train " + kConfig + " --checkpoint-dir " + dir; }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// When to kill: `seconds` plus the fraction `of_run` of a run's duration after the start, or,
// with `after_epoch` > 0, after the run has announced that epoch (if it never does, it is not
// killed).
struct KillPoint {
  double seconds = 0;
  double of_run = 0;
  int64_t after_epoch = 0;
  double delay(double run) const { return seconds + of_run * run; }
};

struct Killed {
  std::string output;  // everything the run printed before it died
  int exit_code = -1;  // 128 + SIGKILL, or 0 when the run ended before the kill
  double seconds = 0;  // from the start until its output ended
};

// The last epoch the run announced as done ("epoch k/E: train loss ..."), or 0.
int64_t announced_epoch(const std::string& output) {
  static const std::regex line(R"(epoch (\d+)/\d+: train loss)");
  int64_t last = 0;
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
    last = std::max<int64_t>(last, std::stoll((*it)[1]));
  return last;
}

// Starts `arguments` and SIGKILLs it `delay` seconds after the start, or after it announces epoch
// `after_epoch` when that is not 0, reading what it prints all along.
Killed run_and_kill(const std::string& arguments, double delay, int64_t after_epoch) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  const Clock::time_point start = Clock::now();
  const pid_t pid = testing::start_program(MHA_CLI_PATH, arguments, pipe_fds[1]);
  ::close(pipe_fds[1]);
  EXPECT_GT(pid, 0);
  Killed result;
  const auto wait_delay = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay));
  bool armed = after_epoch == 0, killed = false;
  Clock::time_point deadline = start + wait_delay;
  std::array<char, 4096> buffer{};
  for (;;) {
    if (!killed && armed && Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    pollfd readable{pipe_fds[0], POLLIN, 0};
    timespec wait{};
    const timespec* timeout = nullptr;  // after the kill, or before the trigger: wait for output
    if (!killed && armed) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count();
      wait.tv_sec = std::max<long long>(left, 0) / 1000000000;
      wait.tv_nsec = std::max<long long>(left, 0) % 1000000000;
      timeout = &wait;
    }
    if (::ppoll(&readable, 1, timeout, nullptr) <= 0) continue;  // time to kill (or EINTR)
    const ssize_t n = ::read(pipe_fds[0], buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the run is over: killed, or done
    result.output.append(buffer.data(), static_cast<size_t>(n));
    if (!armed && announced_epoch(result.output) >= after_epoch) {
      armed = true;
      deadline = Clock::now() + wait_delay;
    }
  }
  result.seconds = seconds_since(start);
  ::close(pipe_fds[0]);
  result.exit_code = testing::wait_for(pid);
  return result;
}

// The checkpoint's tensors, byte for byte, and its metadata, with the entries that record time
// (each epoch's "seconds" and "samples_per_second" in the history) left out of the comparison.
void expect_same_checkpoint(const std::string& path, const std::string& reference) {
  const st::File got = st::load(path), want = st::load(reference);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [name, data] : want.tensors) {
    ASSERT_TRUE(got.tensors.count(name)) << name;
    const st::TensorData& other = got.tensors.at(name);
    EXPECT_EQ(other.dtype, data.dtype) << name;
    EXPECT_EQ(other.shape, data.shape) << name;
    EXPECT_TRUE(other.bytes == data.bytes) << name << ": not bitwise equal to the uninterrupted run's";
  }
  ASSERT_EQ(got.metadata.size(), want.metadata.size());
  for (const auto& [key, value] : want.metadata)
    if (key != "history") EXPECT_EQ(got.metadata.at(key), value) << key;
  const train::Checkpoint a = train::read_checkpoint(path), b = train::read_checkpoint(reference);
  ASSERT_EQ(a.history.size(), b.history.size());
  for (size_t e = 0; e < a.history.size(); ++e) {
    const train::EpochStats &x = a.history[e], &y = b.history[e];
    EXPECT_EQ(x.epoch, y.epoch);
    EXPECT_EQ(x.steps, y.steps);
    EXPECT_EQ(x.train_loss, y.train_loss) << "epoch " << e + 1;
    EXPECT_EQ(x.train_accuracy, y.train_accuracy) << "epoch " << e + 1;
    EXPECT_EQ(x.test_loss, y.test_loss) << "epoch " << e + 1;
    EXPECT_EQ(x.test_accuracy, y.test_accuracy) << "epoch " << e + 1;
    EXPECT_EQ(x.lr, y.lr) << "epoch " << e + 1;
  }
}

using TrainCrash = testing::CliTest;

TEST_F(TrainCrash, KilledAnywhereThenResumedEndsBitwiseEqual) {
  if (!mha::testing::have_fashion_mnist()) GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  const Clock::time_point test_start = Clock::now();

  // The uninterrupted run, twice: the reference checkpoint (the same both times), and how long a
  // run takes here (the faster of the two: the first also warms the caches).
  double duration = 0;
  for (const char* name : {"reference", "again"}) {
    const Clock::time_point start = Clock::now();
    const testing::CliResult straight = testing::run_program(MHA_CLI_PATH, train_command(path(name)));
    const double seconds = seconds_since(start);
    ASSERT_EQ(straight.exit_code, 0) << straight.output;
    ASSERT_EQ(announced_epoch(straight.output), kEpochs) << straight.output;
    duration = duration == 0 ? seconds : std::min(duration, seconds);
  }
  const std::string reference_checkpoint = path("reference/checkpoint.safetensors");
  expect_same_checkpoint(path("again/checkpoint.safetensors"), reference_checkpoint);
  ASSERT_FALSE(::testing::Test::HasFailure()) << "two uninterrupted runs differ: nothing to compare with";

  std::vector<KillPoint> points = {{0.0, 0, 0}, {0.001, 0, 0}, {0.01, 0, 0}};  // at process start
  std::mt19937_64 random(20240613);
  std::uniform_real_distribution<double> anywhere(0.0, 1.0);
  for (int i = 0; i < 20; ++i) points.push_back({0, anywhere(random), 0});
  // Into the checkpoint write: fractions of an epoch's time (an upper bound of it: a run's
  // duration includes loading the data).
  for (const auto& [epoch, fraction] : std::vector<std::pair<int64_t, double>>{
           {1, 0.0}, {2, 0.002}, {4, 0.005}, {7, 0.01}, {11, 0.02}, {16, 0.05}})
    points.push_back({0, fraction / kEpochs, epoch});

  int no_checkpoint = 0, during_write = 0, finished = 0, leftovers = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    const KillPoint& point = points[i];
    const double delay = point.delay(duration);
    SCOPED_TRACE("kill point " + std::to_string(i) + ": " + std::to_string(delay) + " s" +
                 (point.after_epoch > 0 ? " after epoch " + std::to_string(point.after_epoch) : ""));
    const std::string dir = path("run" + std::to_string(i));
    const std::string checkpoint = dir + "/checkpoint.safetensors";
    const Killed killed = run_and_kill(train_command(dir), delay, point.after_epoch);
    ASSERT_TRUE(killed.exit_code == 128 + SIGKILL || killed.exit_code == 0) << killed.exit_code << "\n" << killed.output;
    finished += killed.exit_code == 0;
    if (killed.exit_code == 0) duration = std::min(duration, killed.seconds);

    // What the kill left: a complete checkpoint or none, and nothing but the run's own files.
    // A file under the temporary's name (write_file_atomically's "<path>.tmp.<pid>.<n>") can only
    // be left by a kill between naming the finished file and renaming it, microseconds: then it
    // must be complete, and it is counted.
    std::error_code error;
    const bool has_checkpoint = fs::exists(checkpoint, error);
    const std::set<std::string> left = fs::exists(dir, error) ? testing::list_directory(dir) : std::set<std::string>{};
    for (const std::string& name : left) {
      if (name == "checkpoint.safetensors" || name == "training_curves.png" || name == "confusion_matrix.png") continue;
      const bool temporary = name.rfind("checkpoint.safetensors.tmp.", 0) == 0 ||
                             name.rfind("training_curves.png.tmp.", 0) == 0 ||
                             name.rfind("confusion_matrix.png.tmp.", 0) == 0;
      EXPECT_TRUE(temporary) << "unexpected file " << name;
      if (!temporary) continue;
      ++leftovers;
      if (name.rfind("checkpoint", 0) == 0)
        EXPECT_NO_THROW(train::read_checkpoint(dir + "/" + name)) << name << " is not complete";
      else
        EXPECT_NO_THROW(viz::read_png(dir + "/" + name)) << name << " is not complete";
      fs::remove(dir + "/" + name);
    }
    int64_t saved = 0;
    if (has_checkpoint) {
      train::Checkpoint c;
      ASSERT_NO_THROW(c = train::read_checkpoint(checkpoint)) << "a partial checkpoint";
      saved = c.epoch;
      EXPECT_GE(saved, 1);
    } else {
      ++no_checkpoint;
      EXPECT_EQ(left.count("training_curves.png") + left.count("confusion_matrix.png"), 0u)
          << "pictures are drawn after the checkpoint";
    }
    for (const char* picture : {"training_curves.png", "confusion_matrix.png"})
      if (left.count(picture)) EXPECT_NO_THROW(viz::read_png(dir + "/" + picture)) << picture << " is not complete";
    // The checkpoint is the last announced epoch's, or, killed while that one was being saved,
    // the one before.
    const int64_t announced = announced_epoch(killed.output);
    EXPECT_TRUE(saved == announced || saved == announced - 1) << "announced " << announced << ", saved " << saved;
    during_write += saved == announced - 1;
    std::cout << "[crash] kill " << i << " at " << delay << " s"
              << (point.after_epoch > 0 ? " after epoch " + std::to_string(point.after_epoch) + " was announced" : "")
              << ": " << (killed.exit_code == 0 ? "the run had ended" : "killed") << ", epoch " << announced
              << " announced, checkpoint " << (has_checkpoint ? "of epoch " + std::to_string(saved) : "none") << "\n";

    // Finish the run, and compare.
    const Clock::time_point rest_start = Clock::now();
    const testing::CliResult rest = testing::run_program(
        MHA_CLI_PATH, has_checkpoint ? "train --resume --threads 1 --checkpoint-dir " + dir : train_command(dir));
    ASSERT_EQ(rest.exit_code, 0) << rest.output;
    if (!has_checkpoint) duration = std::min(duration, seconds_since(rest_start));  // a whole run
    expect_same_checkpoint(checkpoint, reference_checkpoint);
    EXPECT_EQ(testing::list_directory(dir),
              (std::set<std::string>{"checkpoint.safetensors", "confusion_matrix.png", "training_curves.png"}));
    if (::testing::Test::HasFailure()) break;  // one failing kill point says it; the rest would repeat it
  }
  std::cout << "[crash] " << points.size() << " kills (the fastest whole run " << duration << " s): " << no_checkpoint
            << " before the first checkpoint, " << during_write << " while a checkpoint was being written, "
            << finished << " after the run had ended, " << leftovers << " left a complete temporary; "
            << seconds_since(test_start) << " s in all\n";
}

}  // namespace
}  // namespace mha
