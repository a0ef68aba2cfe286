#include "mha/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "mha/core/blas_threads.h"
#include "mha/core/random.h"
#include "mha/core/safetensors.h"
#include "mha/nn/cross_entropy.h"

namespace mha::train {
namespace {

using json = nlohmann::json;
namespace st = mha::safetensors;

// ---- Config as JSON ----------------------------------------------------------------------

json model_json(const models::AttentionClassifierConfig& m) {
  return {{"sequence_length", m.sequence_length}, {"input_dim", m.input_dim},
          {"embed_dim", m.embed_dim},             {"num_heads", m.num_heads},
          {"hidden_dim", m.hidden_dim},           {"num_classes", m.num_classes},
          {"num_blocks", m.num_blocks},           {"input_projection", m.input_projection},
          {"learned_positions", m.learned_positions}, {"pre_norm", m.pre_norm},
          {"dropout", m.dropout}};
}

// Reads object `j`'s fields into the variables named in `fields`, refusing missing, unknown and
// mistyped fields.
class FieldReader {
 public:
  FieldReader(const json& j, std::string what) : j_(j), what_(std::move(what)) {
    check(j_.is_object(), what_, ": expected a JSON object, got ", j_.type_name());
  }
  template <class V>
  void operator()(const char* name, V& value) {
    seen_.insert(name);
    check(j_.contains(name), what_, ": missing field '", name, "'");
    const json& f = j_.at(name);
    if constexpr (std::is_same_v<V, bool>) {
      check(f.is_boolean(), what_, ": field '", name, "': expected true or false, got ", f.dump());
    } else if constexpr (std::is_integral_v<V>) {
      check(f.is_number_integer(), what_, ": field '", name, "': expected an integer, got ", f.dump());
      if constexpr (std::is_unsigned_v<V>)
        check(f.is_number_unsigned(), what_, ": field '", name, "': expected an integer >= 0, got ", f.dump());
    } else {
      check(f.is_number(), what_, ": field '", name, "': expected a number, got ", f.dump());
    }
    value = f.get<V>();
  }
  void mark(const char* name) { seen_.insert(name); }
  void finish() const {
    for (const auto& [key, v] : j_.items())
      check(seen_.count(key) == 1, what_, ": unexpected field '", key, "'");
  }

 private:
  const json& j_;
  std::string what_;
  std::set<std::string> seen_;
};

json parse_json(const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(what + ": invalid JSON: " + e.what());
  }
}

json stats_json(const EpochStats& s) {
  return {{"epoch", s.epoch},
          {"steps", s.steps},
          {"train_loss", s.train_loss},
          {"train_accuracy", s.train_accuracy},
          {"test_loss", s.test_loss},
          {"test_accuracy", s.test_accuracy},
          {"seconds", s.seconds},
          {"samples_per_second", s.samples_per_second},
          {"lr", s.lr}};
}

EpochStats stats_from_json(const json& j, const std::string& what) {
  EpochStats s;
  FieldReader r(j, what);
  r("epoch", s.epoch);
  r("steps", s.steps);
  r("train_loss", s.train_loss);
  r("train_accuracy", s.train_accuracy);
  r("test_loss", s.test_loss);
  r("test_accuracy", s.test_accuracy);
  r("seconds", s.seconds);
  r("samples_per_second", s.samples_per_second);
  r("lr", s.lr);
  r.finish();
  return s;
}

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

std::string metadata_field(const st::File& file, const std::string& name, const std::string& path) {
  auto it = file.metadata.find(name);
  check(it != file.metadata.end(), path, ": not an mha training checkpoint: metadata field '", name, "' is missing");
  return it->second;
}

int64_t parse_count(const std::string& text, const std::string& what) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  check(used == text.size() && v >= 0, what, ": expected a whole number >= 0, got '", text, "'");
  return v;
}

}  // namespace

// ---- TrainingConfig ----------------------------------------------------------------------

void TrainingConfig::check_valid() const {
  model.check_valid();
  check(epochs >= 1, "training: epochs: expected >= 1, got ", epochs);
  check(batch_size >= 1, "training: batch_size: expected >= 1, got ", batch_size);
  optim::AdamWOptions options;
  options.lr = lr;
  options.weight_decay = weight_decay;
  optim::check_options(options);
  check(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, "training: min_lr: expected a value in [0, lr = ", lr,
        "], got ", min_lr);
  check(warmup_steps >= 0, "training: warmup_steps: expected >= 0, got ", warmup_steps);
  check(train_limit >= 0, "training: train_limit: expected >= 0 (0 = all), got ", train_limit);
  check(test_limit >= 0, "training: test_limit: expected >= 0 (0 = all), got ", test_limit);
}

std::string TrainingConfig::to_json() const {
  const json j = {{"model", model_json(model)}, {"epochs", epochs},           {"batch_size", batch_size},
                  {"lr", lr},                   {"min_lr", min_lr},           {"warmup_steps", warmup_steps},
                  {"weight_decay", weight_decay}, {"seed", seed},             {"train_limit", train_limit},
                  {"test_limit", test_limit}};
  return j.dump();
}

TrainingConfig TrainingConfig::from_json(const std::string& text) {
  const json j = parse_json(text, "training config");
  TrainingConfig c;
  FieldReader r(j, "training config");
  check(j.contains("model"), "training config: missing field 'model'");
  {
    FieldReader m(j.at("model"), "training config: model");
    auto& mc = c.model;
    m("sequence_length", mc.sequence_length);
    m("input_dim", mc.input_dim);
    m("embed_dim", mc.embed_dim);
    m("num_heads", mc.num_heads);
    m("hidden_dim", mc.hidden_dim);
    m("num_classes", mc.num_classes);
    m("num_blocks", mc.num_blocks);
    m("input_projection", mc.input_projection);
    m("learned_positions", mc.learned_positions);
    m("pre_norm", mc.pre_norm);
    m("dropout", mc.dropout);
    m.finish();
  }
  r.mark("model");
  r("epochs", c.epochs);
  r("batch_size", c.batch_size);
  r("lr", c.lr);
  r("min_lr", c.min_lr);
  r("warmup_steps", c.warmup_steps);
  r("weight_decay", c.weight_decay);
  r("seed", c.seed);
  r("train_limit", c.train_limit);
  r("test_limit", c.test_limit);
  r.finish();
  c.check_valid();
  return c;
}

bool operator==(const TrainingConfig& a, const TrainingConfig& b) { return a.to_json() == b.to_json(); }

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

// ---- Checkpoints -------------------------------------------------------------------------

Checkpoint read_checkpoint(const std::string& path) {
  const st::File file = st::load(path);
  auto format = metadata_field(file, "format", path);
  check(format == kCheckpointFormat, path, ": checkpoint format: expected '", kCheckpointFormat, "', got '", format,
        "'");
  Checkpoint c;
  c.config = TrainingConfig::from_json(metadata_field(file, "config", path));
  c.epoch = parse_count(metadata_field(file, "epoch", path), path + ": metadata 'epoch'");
  c.step = parse_count(metadata_field(file, "step", path), path + ": metadata 'step'");
  c.dropout_counter =
      static_cast<uint64_t>(parse_count(metadata_field(file, "dropout_counter", path), path + ": metadata 'dropout_counter'"));
  const json history = parse_json(metadata_field(file, "history", path), path + ": metadata 'history'");
  check(history.is_array(), path, ": metadata 'history': expected a JSON array, got ", history.type_name());
  for (const auto& h : history) c.history.push_back(stats_from_json(h, path + ": metadata 'history'"));
  check(c.epoch <= c.config.epochs && static_cast<int64_t>(c.history.size()) == c.epoch, path,
        ": inconsistent checkpoint: epoch ", c.epoch, " of ", c.config.epochs, " with ", c.history.size(),
        " history entries");
  for (const auto& [name, data] : file.tensors) {
    const bool is_model = name.rfind("model.", 0) == 0, is_optimizer = name.rfind("optimizer.", 0) == 0;
    check(is_model || is_optimizer, path, ": unexpected tensor '", name, "' (expected model.* and optimizer.*)");
    check(data.dtype == st::DType::F32, path, ": tensor '", name, "': expected dtype F32, got ",
          st::to_string(data.dtype));
    auto& target = is_model ? c.model : c.optimizer;
    target.emplace(name.substr(is_model ? 6 : 10), st::to_tensor<float>(data, path + ": " + name));
  }
  return c;
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

void Trainer::save_checkpoint(const std::string& path) {
  st::File file;
  for (const auto& [name, tensor] : model_->state_dict()) file.tensors.emplace("model." + name, st::from_tensor(tensor));
  for (const auto& [name, tensor] : optimizer_->state_dict())
    file.tensors.emplace("optimizer." + name, st::from_tensor(tensor));
  json history = json::array();
  for (const auto& s : history_) history.push_back(stats_json(s));
  file.metadata = {{"format", kCheckpointFormat},
                   {"config", config_.to_json()},
                   {"epoch", std::to_string(epoch_)},
                   {"step", std::to_string(step_)},
                   {"dropout_counter", std::to_string(model_->dropout_counter())},
                   {"history", history.dump()}};
  st::save(file, path);
}

void Trainer::load_checkpoint(const std::string& path) {
  Checkpoint c = read_checkpoint(path);
  check(c.config == config_, path, ": the checkpoint was written with another training configuration:\n  checkpoint ",
        c.config.to_json(), "\n  this run   ", config_.to_json());
  check(c.step == c.epoch * steps_per_epoch(), path, ": inconsistent checkpoint: step ", c.step, " after ", c.epoch,
        " epochs of ", steps_per_epoch(), " steps");
  model_->load_state_dict(c.model);
  optimizer_->load_state_dict(c.optimizer);
  check(optimizer_->steps() == c.step, path, ": inconsistent checkpoint: the optimizer has taken ",
        optimizer_->steps(), " steps, the metadata says ", c.step);
  model_->set_dropout_counter(c.dropout_counter);
  epoch_ = c.epoch;
  step_ = c.step;
  history_ = std::move(c.history);
}

}  // namespace mha::train
