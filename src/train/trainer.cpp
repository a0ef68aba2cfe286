// The training loop: the data's order per epoch, evaluation, and a step of AdamW on a batch
// (its configuration's JSON in config.cpp, its checkpoints in checkpoint.cpp).
#include "mha/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "mha/core/blas_threads.h"
#include "mha/core/random.h"
#include "mha/nn/cross_entropy.h"

namespace mha::train {
namespace {

// A 64-bit seed for epoch `epoch`'s shuffle, from Philox keyed by the run's seed.
uint64_t shuffle_seed(uint64_t seed, int64_t epoch) {
  const auto e = static_cast<uint64_t>(epoch);
  const PhiloxCounter r = philox4x32(
      {static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32), 0x73687566u /* "shuf" */, 0u}, seed);
  return (uint64_t{r[0]} << 32) | r[1];
}

int64_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

}  // namespace

// ---- Data order and evaluation -----------------------------------------------------------

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  check(n >= 0, "epoch_order: n: expected >= 0, got ", n);
  check(epoch >= 0, "epoch_order: epoch: expected >= 0, got ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  Generator gen(shuffle_seed(seed, epoch));
  // Fisher–Yates from the back: position i swaps with a uniform j in [0, i]. j from 64 random
  // bits modulo i + 1 (the bias, below 2^-32 for any n that fits in memory, is immaterial).
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bits = gen.next_u64();
    const auto j = static_cast<int64_t>(bits % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

Evaluation evaluate(models::AttentionClassifier<float>& model, const data::LabelledImages& data, int64_t batch_size) {
  check(batch_size >= 1, "evaluate: batch_size: expected >= 1, got ", batch_size);
  check(data.count >= 1, "evaluate: data: expected at least one image, got none");
  const int64_t classes = model.config().num_classes;
  const bool was_training = model.is_training();
  model.eval();
  Evaluation e;
  e.count = data.count;
  e.num_classes = classes;
  e.confusion.assign(static_cast<size_t>(classes * classes), 0);
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < data.count; begin += batch_size) {
    const int64_t n = std::min(batch_size, data.count - begin);
    const Tensor<float> logits = model.forward(data::image_batch(data, {}, begin, n));
    const Tensor<int64_t> labels = data::label_batch(data, {}, begin, n);
    loss_sum += static_cast<double>(nn::cross_entropy(logits, labels)) * static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t predicted = argmax(logits.data() + i * classes, classes);
      correct += predicted == labels[i];
      ++e.confusion[static_cast<size_t>(labels[i] * classes + predicted)];
    }
  }
  model.train(was_training);
  e.loss = loss_sum / static_cast<double>(data.count);
  e.accuracy = static_cast<double>(correct) / static_cast<double>(data.count);
  return e;
}

// ---- Trainer -----------------------------------------------------------------------------

Trainer::Trainer(const TrainingConfig& config, const data::LabelledImages& train, const data::LabelledImages& test)
    : config_(config) {
  config_.check_valid();
  const auto& m = config_.model;
  for (const auto* d : {&train, &test}) {
    const char* which = d == &train ? "training data" : "test data";
    check(d->rows == m.sequence_length && d->columns == m.input_dim, "Trainer: ", which, ": expected images of ",
          m.sequence_length, " x ", m.input_dim, " (sequence_length x input_dim), got ", d->rows, " x ", d->columns);
    for (uint8_t label : d->labels)
      check(label < m.num_classes, "Trainer: ", which, ": label ", int{label}, " is not below num_classes = ",
            m.num_classes);
  }
  check(config_.train_limit <= train.count, "Trainer: train_limit: expected at most the ", train.count,
        " training images, got ", config_.train_limit);
  check(config_.test_limit <= test.count, "Trainer: test_limit: expected at most the ", test.count,
        " test images, got ", config_.test_limit);
  train_ = config_.train_limit > 0 ? train.first(config_.train_limit) : train;
  test_ = config_.test_limit > 0 ? test.first(config_.test_limit) : test;
  check(train_.count >= 1 && test_.count >= 1, "Trainer: expected at least one training and one test image, got ",
        train_.count, " and ", test_.count);

  keep_blas_single_threaded();  // the fused path threads with OpenMP (mha/core/blas_threads.h)
  model_ = std::make_unique<models::AttentionClassifier<float>>(config_.model, config_.seed);
  optim::AdamWOptions options;
  options.lr = config_.lr;
  options.weight_decay = config_.weight_decay;
  optimizer_ = std::make_unique<optim::AdamW<float>>(model_->parameters(), options);
  schedule_.base_lr = config_.lr;
  schedule_.min_lr = config_.min_lr;
  schedule_.total_steps = config_.epochs * steps_per_epoch();
  schedule_.warmup_steps = config_.warmup_steps;
  check(config_.warmup_steps < schedule_.total_steps, "training: warmup_steps: expected fewer than the ",
        schedule_.total_steps, " steps of the whole run (", config_.epochs, " epochs of ", steps_per_epoch(),
        "), got ", config_.warmup_steps);
  schedule_.check_valid();
}

int64_t Trainer::steps_per_epoch() const { return (train_.count + config_.batch_size - 1) / config_.batch_size; }

void Trainer::set_data_parallel(DataParallel parallel) {
  check(parallel.ranks >= 1 && parallel.rank >= 0 && parallel.rank < parallel.ranks,
        "Trainer::set_data_parallel: expected rank in [0, ranks) and ranks >= 1, got rank ", parallel.rank, " of ",
        parallel.ranks);
  check(parallel.ranks == 1 || static_cast<bool>(parallel.all_reduce_sum),
        "Trainer::set_data_parallel: all_reduce_sum: expected a function for ", parallel.ranks, " ranks, got none");
  parallel_ = std::move(parallel);
}

float Trainer::train_step(const Tensor<float>& images, const Tensor<int64_t>& labels, int64_t* correct) {
  const double lr = schedule_.lr_at(step_);
  optimizer_->set_lr(lr);
  optimizer_->zero_grad();
  // This rank's rows of the batch (all of them in one process).
  const int64_t n = images.size(0), P = parallel_.ranks, r = parallel_.rank;
  const int64_t begin = n * r / P, rows = n * (r + 1) / P - begin;
  float loss = 0;                         // the mean over this rank's rows
  double loss_sum = 0, correct_sum = 0;  // sums over this rank's rows
  if (rows > 0) {
    Tensor<float> mine = images;
    Tensor<int64_t> my_labels = labels;
    if (P > 1) {
      Shape shape = images.shape();
      shape[0] = rows;
      const int64_t per_row = images.numel() / std::max<int64_t>(n, 1);
      mine = Tensor<float>(shape);
      std::copy_n(images.data() + begin * per_row, rows * per_row, mine.data());
      my_labels = Tensor<int64_t>({rows});
      std::copy_n(labels.data() + begin, rows, my_labels.data());
    }
    nn::CrossEntropyCache<float> loss_cache;
    const Tensor<float> logits = model_->forward(mine, &cache_);
    loss = nn::cross_entropy(logits, my_labels, &loss_cache);
    loss_sum = static_cast<double>(loss) * static_cast<double>(rows);
    const int64_t classes = logits.size(1);
    for (int64_t i = 0; i < rows; ++i) correct_sum += argmax(logits.data() + i * classes, classes) == my_labels[i];
    // The gradient of this rank's rows' share of the whole batch's mean: (rows / n) · d(mean of mine).
    Tensor<float> grad = nn::cross_entropy_backward(loss_cache);
    if (P > 1)
      for (auto& g : grad.values()) g *= static_cast<float>(rows) / static_cast<float>(n);
    model_->backward(grad, cache_, /*want_input_grad=*/false);
  }
  if (P > 1) {
    // One buffer: every parameter's gradient, then the loss and the correct count; summed in
    // double (exact for the counts; the gradients' sum rounded once to float).
    std::vector<nn::Parameter<float>> params = model_->parameters();
    std::vector<double> bucket;
    for (const auto& p : params) bucket.insert(bucket.end(), p.grad->values().begin(), p.grad->values().end());
    bucket.push_back(loss_sum);
    bucket.push_back(correct_sum);
    parallel_.all_reduce_sum(bucket);
    size_t at = 0;
    for (auto& p : params)
      for (auto& g : p.grad->values()) g = static_cast<float>(bucket[at++]);
    loss_sum = bucket[at];
    correct_sum = bucket[at + 1];
  }
  optimizer_->step();
  ++step_;
  if (correct) *correct = static_cast<int64_t>(correct_sum);
  return P > 1 ? static_cast<float>(loss_sum / static_cast<double>(n)) : loss;
}

EpochStats Trainer::run_epoch(const std::function<void(const BatchProgress&)>& progress, int64_t max_steps) {
  check(!finished(), "Trainer::run_epoch: all ", config_.epochs, " epochs are done");
  check(max_steps >= 0, "Trainer::run_epoch: max_steps: expected >= 0 (0 = no limit), got ", max_steps);
  const std::vector<int64_t> order = epoch_order(train_.count, config_.seed, epoch_);
  const int64_t batches = steps_per_epoch(), bs = config_.batch_size;
  model_->train();
  BatchProgress p;
  p.epoch = epoch_ + 1;
  p.batches = batches;
  p.epoch_samples = train_.count;
  double loss_sum = 0;
  int64_t correct_sum = 0;
  const auto start = std::chrono::steady_clock::now();
  bool stopped = false;
  for (int64_t b = 0; b < batches; ++b) {
    if (max_steps > 0 && step_ >= max_steps) {
      stopped = true;
      break;
    }
    const int64_t begin = b * bs, n = std::min(bs, train_.count - begin);
    const Tensor<float> images = data::image_batch(train_, order, begin, n);
    const Tensor<int64_t> labels = data::label_batch(train_, order, begin, n);
    int64_t correct = 0;
    const float loss = train_step(images, labels, &correct);
    p.lr = optimizer_->lr();
    p.step = step_;
    p.batch_loss = loss;
    loss_sum += static_cast<double>(loss) * static_cast<double>(n);
    correct_sum += correct;
    p.batch = b + 1;
    p.samples += n;
    p.loss = loss_sum / static_cast<double>(p.samples);
    p.accuracy = static_cast<double>(correct_sum) / static_cast<double>(p.samples);
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress(p);
  }
  EpochStats s;
  s.epoch = epoch_ + 1;
  s.steps = step_;
  s.train_loss = p.loss;
  s.train_accuracy = p.accuracy;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.samples_per_second = s.seconds > 0 ? static_cast<double>(p.samples) / s.seconds : 0.0;
  s.lr = p.lr;
  if (stopped || (max_steps > 0 && step_ >= max_steps && p.batch < batches)) return s;
  last_evaluation_ = evaluate(*model_, test_);
  s.test_loss = last_evaluation_.loss;
  s.test_accuracy = last_evaluation_.accuracy;
  ++epoch_;
  history_.push_back(s);
  return s;
}

}  // namespace mha::train
