#include "train_command.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "number_flags.h"
#include "mha/core/atomic_file.h"
#include "mha/core/escape.h"
#include "mha/core/safetensors.h"
#include "mha/data/fashion_mnist.h"
#include "mha/nn/serialization.h"
#include "mha/train/trainer.h"
#include "mha/viz/charts.h"
#include "output_path.h"
#if MHA_WITH_MPI
#include "mha/distributed/communicator.h"
#include "rank_agreement.h"
#endif

namespace mha::tools {
namespace {

namespace fs = std::filesystem;

struct TrainArgs {
  train::TrainingConfig config;
  std::string data_dir = data::kDefaultFashionMnistDir;
  std::string checkpoint_dir = "runs/fashion-mnist";
  bool resume = false, force = false;
  std::string save_initial, dump_batch_order, step_log;
  int64_t max_steps = 0;
  int64_t stop_after = 0;
  int threads = 0;
  // Options that set a field of the training configuration: on --resume, any of them given on
  // the command line must agree with the checkpoint.
  std::vector<std::pair<CLI::Option*, std::function<void(train::TrainingConfig&, const train::TrainingConfig&)>>>
      config_options;
};

std::string clock_time(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<long long>(std::llround(seconds));
  char buffer[32];
  if (s >= 3600)
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld", s / 60, s % 60);
  return buffer;
}

// One epoch's progress on stderr: a bar redrawn in place on a terminal, else a plain line
// every tenth of the epoch.
class ProgressBar {
 public:
  explicit ProgressBar(int64_t epochs) : epochs_(epochs), tty_(::isatty(STDERR_FILENO) == 1) {}

  void update(const train::BatchProgress& p) {
    const double rate = p.seconds > 0 ? static_cast<double>(p.samples) / p.seconds : 0.0;
    const double eta = rate > 0 ? static_cast<double>(p.epoch_samples - p.samples) / rate : -1.0;
    const bool last = p.batch == p.batches;
    char stats[160];
    std::snprintf(stats, sizeof stats, " %lld/%lld loss %.4f acc %5.2f%% %6.0f samples/s %s %s",
                  static_cast<long long>(p.batch), static_cast<long long>(p.batches), p.loss, 100.0 * p.accuracy, rate,
                  last ? "in" : "ETA", clock_time(last ? p.seconds : eta).c_str());
    const std::string head = "epoch " + std::to_string(p.epoch) + "/" + std::to_string(epochs_) + " ";
    if (tty_) {
      const double now = p.seconds;
      if (!last && now - last_draw_ < 0.1 && p.batch > 1) return;
      last_draw_ = now;
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * p.batch / std::max<int64_t>(p.batches, 1));
      std::string bar = "[" + std::string(static_cast<size_t>(filled), '=') +
                        (filled < kWidth ? ">" + std::string(static_cast<size_t>(kWidth - filled - 1), ' ') : "") + "]";
      std::fprintf(stderr, "\r%s%s%s\033[K", head.c_str(), bar.c_str(), stats);
      if (last) std::fprintf(stderr, "\n");
    } else {
      const int64_t tenth = std::max<int64_t>(1, p.batches / 10);
      if (p.batch % tenth == 0 || last) std::fprintf(stderr, "%s%s\n", head.c_str(), stats);
    }
    std::fflush(stderr);
  }

 private:
  int64_t epochs_;
  bool tty_;
  double last_draw_ = -1;
};

std::vector<std::string> class_names() {
  const auto& names = data::fashion_mnist_class_names();
  return {names.begin(), names.end()};
}

void write_pictures(const train::Trainer& trainer, const fs::path& dir) {
  viz::TrainingCurves curves;
  for (const auto& s : trainer.history()) {
    curves.train_loss.push_back(s.train_loss);
    curves.test_loss.push_back(s.test_loss);
    curves.train_accuracy.push_back(s.train_accuracy);
    curves.test_accuracy.push_back(s.test_accuracy);
  }
  const auto& m = trainer.config().model;
  curves.title = "Fashion-MNIST: width " + std::to_string(m.embed_dim) + ", " + std::to_string(m.num_heads) +
                 " heads, " + std::to_string(m.num_blocks) + (m.num_blocks == 1 ? " block" : " blocks");
  viz::write_training_curves((dir / "training_curves.png").string(), curves);
  const train::Evaluation& e = trainer.last_evaluation();
  if (e.count > 0) {
    char title[96];
    std::snprintf(title, sizeof title, "Test confusion matrix after epoch %lld",
                  static_cast<long long>(trainer.epoch()));
    viz::write_confusion_matrix((dir / "confusion_matrix.png").string(), e.confusion, e.num_classes, class_names(),
                                title);
  }
}

void write_batch_orders(const train::Trainer& trainer, const std::string& path) {
  safetensors::File file;
  const auto& c = trainer.config();
  for (int64_t e = 0; e < c.epochs; ++e) {
    const std::vector<int64_t> order = train::epoch_order(trainer.train_data().count, c.seed, e);
    file.tensors["epoch_" + std::to_string(e)] =
        safetensors::from_tensor(Tensor<int64_t>({static_cast<int64_t>(order.size())}, order));
  }
  file.metadata["config"] = c.to_json();
  file.metadata["producer"] = "mha train --dump-batch-order";
  file.metadata["about"] = "epoch_<e>[i]: index (into the first train_limit training images) of sample i of epoch e";
  safetensors::save(file, path);
}

struct StepRecord {
  int64_t step;
  double lr;
  float loss;
};

void write_step_log(const std::vector<StepRecord>& records, const std::string& path) {
  write_file_atomically(path, "mha train: --step-log", [&](std::FILE* f) {
    std::fprintf(f, "step\tlr\tloss\n");
    for (const auto& r : records) std::fprintf(f, "%lld\t%.9g\t%.9g\n", static_cast<long long>(r.step), r.lr, r.loss);
  });
}

// Started by mpirun (Open MPI's or MPICH's launcher sets these): then data-parallel training.
bool under_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr; }

void run(TrainArgs& args, train::DataParallel parallel) {
  const auto start = std::chrono::steady_clock::now();
  // Under mpirun every rank trains on its rows of each batch; rank 0 alone prints and writes.
  const bool writer = parallel.rank == 0;
  if (!writer && std::freopen("/dev/null", "w", stdout) == nullptr) throw Error("mha train: cannot silence rank's stdout");
  if (args.threads > 0) omp_set_num_threads(args.threads);
  const fs::path dir = args.checkpoint_dir;
  const fs::path checkpoint = dir / "checkpoint.safetensors";
  std::error_code error;
  if (!args.step_log.empty()) check_output_directory(args.step_log, "--step-log");

  train::TrainingConfig config = args.config;
  if (args.resume) {
    check(fs::exists(checkpoint, error), "--resume: no checkpoint at ", checkpoint.string(),
          " (start a run without --resume, or pass its --checkpoint-dir)");
    check(args.save_initial.empty(), "--save-initial: the initial weights of a resumed run are not available");
    const train::TrainingConfig stored = train::read_checkpoint(checkpoint.string()).config;
    config = stored;
    for (auto& [option, apply] : args.config_options)
      if (option->count() > 0) apply(config, args.config);
    check(config == stored, "--resume: the flags change the training configuration stored in ", checkpoint.string(),
          "; a resumed run keeps it (leave those flags out): checkpoint ", stored.to_json(), ", with flags ",
          config.to_json());
  } else {
    check(args.force || args.max_steps > 0 || !fs::exists(checkpoint, error), checkpoint.string(),
          " exists: pass --resume to continue that run, --force to start over, or another --checkpoint-dir");
  }
  config.check_valid();

  const data::LabelledImages train_data = data::load_fashion_mnist(args.data_dir, data::Split::train);
  const data::LabelledImages test_data = data::load_fashion_mnist(args.data_dir, data::Split::test);
  train::Trainer trainer(config, train_data, test_data);
  if (args.resume) trainer.load_checkpoint(checkpoint.string());
  trainer.set_data_parallel(parallel);
  if (args.max_steps == 0 && writer) {
    fs::create_directories(dir, error);
    check(!error, "--checkpoint-dir: cannot create '", dir.string(), "': ", error.message());
  }
  if (!args.save_initial.empty() && writer) nn::save_state_dict_file(trainer.model().state_dict(), args.save_initial);
  if (!args.dump_batch_order.empty() && writer) write_batch_orders(trainer, args.dump_batch_order);

  const auto& m = config.model;
  int64_t parameters = 0;
  for (const auto& p : trainer.model().parameters()) parameters += p.value->numel();
  std::printf("mha train: %lld training / %lld test images; width %lld, %lld heads, hidden %lld, %lld block%s%s%s%s, "
              "dropout %g; %lld parameters\n",
              static_cast<long long>(trainer.train_data().count), static_cast<long long>(trainer.test_data().count),
              static_cast<long long>(m.embed_dim), static_cast<long long>(m.num_heads),
              static_cast<long long>(m.hidden_dim), static_cast<long long>(m.num_blocks), m.num_blocks == 1 ? "" : "s",
              m.input_projection ? ", input projection" : "", m.learned_positions ? ", learned positions" : "",
              m.pre_norm ? ", pre-norm" : "", m.dropout, static_cast<long long>(parameters));
  std::printf("  %lld epochs of %lld steps (batch %lld); AdamW lr %g (warm-up %lld steps, cosine to %g), weight decay "
              "%g; seed %llu; %d threads\n",
              static_cast<long long>(config.epochs), static_cast<long long>(trainer.steps_per_epoch()),
              static_cast<long long>(config.batch_size), config.lr, static_cast<long long>(config.warmup_steps),
              config.min_lr, config.weight_decay, static_cast<unsigned long long>(config.seed), omp_get_max_threads());
  if (parallel.ranks > 1)
    std::printf("  data-parallel over %d ranks: each batch of %lld split by rows, gradients summed across them\n",
                parallel.ranks, static_cast<long long>(config.batch_size));
  if (args.resume)
    std::printf("  resuming %s after epoch %lld (step %lld)\n", escape(checkpoint.string()).c_str(),
                static_cast<long long>(trainer.epoch()), static_cast<long long>(trainer.step()));
  std::fflush(stdout);
  if (trainer.finished()) {
    std::printf("all %lld epochs are done; nothing to train (mha eval --checkpoint %s evaluates it)\n",
                static_cast<long long>(config.epochs), escape(checkpoint.string()).c_str());
    return;
  }

  std::vector<StepRecord> steps;
  double train_seconds = 0;
  int64_t trained_samples = 0;
  const int64_t first_epoch = trainer.epoch();
  while (!trainer.finished()) {
    if (args.stop_after > 0 && trainer.epoch() - first_epoch >= args.stop_after) {
      std::printf("stopped after %lld epoch%s (--stop-after); continue with --resume --checkpoint-dir %s\n",
                  static_cast<long long>(args.stop_after), args.stop_after == 1 ? "" : "s",
                  escape(dir.string()).c_str());
      return;
    }
    ProgressBar bar(config.epochs);
    const train::EpochStats s = trainer.run_epoch(
        [&](const train::BatchProgress& p) {
          if (writer) bar.update(p);
          if (!args.step_log.empty()) steps.push_back({p.step, p.lr, p.batch_loss});
        },
        args.max_steps);
    if (!args.step_log.empty() && writer) write_step_log(steps, args.step_log);
    train_seconds += s.seconds;
    trained_samples += static_cast<int64_t>(std::llround(s.samples_per_second * s.seconds));
    if (trainer.epoch() != s.epoch) {  // stopped by --max-steps inside the epoch
      std::printf("stopped after %lld steps (--max-steps): %lld samples in %.2f s of training, %.0f samples/s\n",
                  static_cast<long long>(trainer.step()), static_cast<long long>(trained_samples), train_seconds,
                  train_seconds > 0 ? static_cast<double>(trained_samples) / train_seconds : 0.0);
      return;
    }
    std::printf("epoch %lld/%lld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.1f s, %.0f samples/s, "
                "lr %.3g\n",
                static_cast<long long>(s.epoch), static_cast<long long>(config.epochs), s.train_loss,
                100.0 * s.train_accuracy, s.test_loss, 100.0 * s.test_accuracy, s.seconds, s.samples_per_second, s.lr);
    std::fflush(stdout);
    if (args.max_steps == 0 && writer) {
      trainer.save_checkpoint(checkpoint.string());
      write_pictures(trainer, dir);
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto& last = trainer.history().back();
  std::printf("done: test accuracy %.2f%% after %lld epochs; %s in all (%.0f samples/s while training)\n",
              100.0 * last.test_accuracy, static_cast<long long>(last.epoch), clock_time(total).c_str(),
              train_seconds > 0 ? static_cast<double>(trained_samples) / train_seconds : 0.0);
  if (args.max_steps == 0)
    std::printf("  %s, %s, %s\n", escape(checkpoint.string()).c_str(),
                escape((dir / "training_curves.png").string()).c_str(),
                escape((dir / "confusion_matrix.png").string()).c_str());
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train the attention classifier (tutorial 002) on Fashion-MNIST; see docs/training.md.");
  train::TrainingConfig& c = args->config;
  auto& m = c.model;
  // Configuration flags; each also registers how to copy its field for the --resume check.
  auto config_option = [&](CLI::Option* option, auto field) {
    args->config_options.emplace_back(option, [field](train::TrainingConfig& to, const train::TrainingConfig& from) {
      to.*field = from.*field;
    });
    return option;
  };
  auto model_option = [&](CLI::Option* option, auto field) {
    args->config_options.emplace_back(option, [field](train::TrainingConfig& to, const train::TrainingConfig& from) {
      to.model.*field = from.model.*field;
    });
    return option;
  };
  using Model = models::AttentionClassifierConfig;
  using Config = train::TrainingConfig;
  const auto positive = integer_bounds(1, int64_t{1} << 20);
  model_option(cmd->add_option("--width", m.embed_dim, "embedding width E (needs --input-projection unless 28)")
                   ->check(positive)->capture_default_str(), &Model::embed_dim);
  model_option(cmd->add_option("--heads", m.num_heads, "attention heads (must divide the width)")
                   ->check(positive)->capture_default_str(), &Model::num_heads);
  model_option(cmd->add_option("--hidden", m.hidden_dim, "fc1 width")->check(positive)->capture_default_str(),
               &Model::hidden_dim);
  model_option(cmd->add_option("--blocks", m.num_blocks, "self-attention blocks")->check(positive)->capture_default_str(),
               &Model::num_blocks);
  model_option(cmd->add_flag("--input-projection,!--no-input-projection", m.input_projection,
                             "project the 28 pixels of each row to the width (Linear)"),
               &Model::input_projection);
  model_option(cmd->add_flag("--positions,!--no-positions", m.learned_positions, "add learned position vectors"),
               &Model::learned_positions);
  model_option(cmd->add_flag("--pre-norm,!--no-pre-norm", m.pre_norm,
                             "LayerNorm before each attention and before the pooling"),
               &Model::pre_norm);
  model_option(cmd->add_option("--dropout", m.dropout, "dropout after the ReLU")->check(CLI::Range(0.0, 0.99))
                   ->capture_default_str(), &Model::dropout);
  config_option(cmd->add_option("--epochs", c.epochs, "epochs")->check(positive)->capture_default_str(), &Config::epochs);
  config_option(cmd->add_option("--batch-size", c.batch_size, "batch size")->check(positive)->capture_default_str(),
                &Config::batch_size);
  config_option(cmd->add_option("--lr", c.lr, "peak learning rate (AdamW)")->check(non_negative_number())
                    ->capture_default_str(), &Config::lr);
  config_option(cmd->add_option("--min-lr", c.min_lr, "learning rate at the end of the cosine")
                    ->check(non_negative_number())->capture_default_str(), &Config::min_lr);
  config_option(cmd->add_option("--warmup-steps", c.warmup_steps, "linear warm-up steps")
                    ->check(integer_bounds(0))->capture_default_str(),
                &Config::warmup_steps);
  config_option(cmd->add_option("--weight-decay", c.weight_decay, "AdamW's decoupled weight decay")
                    ->check(non_negative_number())->capture_default_str(), &Config::weight_decay);
  config_option(cmd->add_option("--seed", c.seed, "seed: initial weights, shuffling, dropout")
                    ->check(unsigned_64())->capture_default_str(),
                &Config::seed);
  config_option(cmd->add_option("--train-limit", c.train_limit, "use the first N training images (0 = all 60000)")
                    ->check(integer_bounds(0))->capture_default_str(),
                &Config::train_limit);
  config_option(cmd->add_option("--test-limit", c.test_limit, "use the first N test images (0 = all 10000)")
                    ->check(integer_bounds(0))->capture_default_str(),
                &Config::test_limit);
  cmd->add_option("--data-dir", args->data_dir, "directory of the Fashion-MNIST IDX files")->capture_default_str();
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir,
                  "where checkpoint.safetensors, training_curves.png and confusion_matrix.png go")
      ->capture_default_str();
  cmd->add_flag("--resume", args->resume, "continue the run in --checkpoint-dir (its configuration is kept)");
  cmd->add_flag("--force", args->force, "start over even if --checkpoint-dir holds a checkpoint");
  cmd->add_option("--save-initial", args->save_initial, "also write the initial weights (.safetensors, PyTorch names)");
  cmd->add_option("--dump-batch-order", args->dump_batch_order,
                  "also write every epoch's sample order (.safetensors, I64 tensors epoch_<e>)");
  cmd->add_option("--step-log", args->step_log, "also write step, learning rate and loss of every step (TSV)");
  cmd->add_option("--max-steps", args->max_steps, "stop after N steps without evaluating or saving (benchmarks)")
      ->check(integer_bounds(1));
  cmd->add_option("--stop-after", args->stop_after,
                  "train at most N epochs in this run, then stop (continue later with --resume)")
      ->check(integer_bounds(1));
  cmd->add_option("--threads", args->threads, "OpenMP threads (default: all cores)")->check(integer_bounds(1, 4096));
  cmd->callback([args, cmd] {
#if MHA_WITH_MPI
    if (under_mpirun()) {
      auto& comm = distributed::Communicator::world();
      const train::DataParallel parallel{comm.rank(), comm.size(),
                                         [&comm](std::span<double> values) { comm.all_reduce_sum(values); }};
      // An error on any rank ends every rank (none is left waiting in the gradients' sum).
      distributed::run_or_abort(comm, [&] {
        check_ranks_agree(comm, *cmd, {});
        run(*args, parallel);
        return 0;
      });
      return;
    }
#endif
    run(*args, {});
  });
}

}  // namespace mha::tools
