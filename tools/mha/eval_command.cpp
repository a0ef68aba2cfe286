#include "eval_command.h"

#include <cstdio>
#include <memory>
#include <string>

#include "number_flags.h"
#include "mha/core/blas_threads.h"
#include "mha/core/escape.h"
#include "mha/data/fashion_mnist.h"
#include "mha/train/trainer.h"
#include "mha/viz/charts.h"
#include "output_path.h"

namespace mha::tools {
namespace {

struct EvalArgs {
  std::string checkpoint;
  std::string data_dir = data::kDefaultFashionMnistDir;
  std::string split = "test";
  std::string confusion_png;
  int64_t batch_size = 1000;
};

void run(const EvalArgs& args) {
  if (!args.confusion_png.empty()) check_output_directory(args.confusion_png, "--confusion-png");
  const train::Checkpoint c = train::read_checkpoint(args.checkpoint);
  keep_blas_single_threaded();  // the fused path threads with OpenMP (mha/core/blas_threads.h)
  models::AttentionClassifier<float> model(c.config.model, c.config.seed);
  model.load_state_dict(c.model);
  const data::Split split = args.split == "train" ? data::Split::train : data::Split::test;
  const data::LabelledImages images = data::load_fashion_mnist(args.data_dir, split);
  const train::Evaluation e = train::evaluate(model, images, args.batch_size);
  const auto& names = data::fashion_mnist_class_names();
  std::printf("%s: epoch %lld of %lld, step %lld\n", escape(args.checkpoint).c_str(),
              static_cast<long long>(c.epoch), static_cast<long long>(c.config.epochs),
              static_cast<long long>(c.step));
  std::printf("Fashion-MNIST %s set, %lld images: loss %.4f, accuracy %.2f%%\n", args.split.c_str(),
              static_cast<long long>(e.count), e.loss, 100.0 * e.accuracy);
  for (int64_t k = 0; k < e.num_classes; ++k) {
    int64_t total = 0;
    for (int64_t p = 0; p < e.num_classes; ++p) total += e.confusion[static_cast<size_t>(k * e.num_classes + p)];
    const int64_t right = e.confusion[static_cast<size_t>(k * e.num_classes + k)];
    std::printf("  %-12s %6.2f%% (%lld of %lld)\n", k < 10 ? names[static_cast<size_t>(k)].c_str() : "?",
                total > 0 ? 100.0 * static_cast<double>(right) / static_cast<double>(total) : 0.0,
                static_cast<long long>(right), static_cast<long long>(total));
  }
  if (!args.confusion_png.empty()) {
    viz::write_confusion_matrix(args.confusion_png, e.confusion, e.num_classes,
                                std::vector<std::string>(names.begin(), names.end()),
                                "Fashion-MNIST " + args.split + " set, epoch " + std::to_string(c.epoch));
    std::printf("confusion matrix: %s\n", escape(args.confusion_png).c_str());
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Evaluate a checkpoint of `mha train` on Fashion-MNIST.");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint.safetensors written by mha train")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--data-dir", args->data_dir, "directory of the Fashion-MNIST IDX files")->capture_default_str();
  cmd->add_option("--split", args->split, "which set")->check(CLI::IsMember({"test", "train"}))->capture_default_str();
  cmd->add_option("--confusion-png", args->confusion_png, "also draw the confusion matrix into this PNG");
  cmd->add_option("--batch-size", args->batch_size, "images per forward pass")
      ->check(integer_bounds(1, int64_t{1} << 20))
      ->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace mha::tools
