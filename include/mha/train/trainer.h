#pragma once
// Training the attention classifier (mha/models/attention_classifier.h) on labelled images
// (Fashion-MNIST): cross-entropy loss, AdamW, linear warm-up + cosine learning-rate schedule,
// reshuffled mini-batches every epoch, evaluation, and checkpoints from which a run resumes
// bitwise as if it had never stopped. `mha train` and `mha eval` are thin layers over this.
//
// Reproducibility: everything random is a pure function of config.seed:
//   - the initial weights (AttentionClassifier(config.model, seed));
//   - the order of epoch e: a Fisher–Yates shuffle driven by Generator(shuffle_seed(seed, e));
//   - the dropout masks: counter-based from the seed and a counter that the checkpoint saves.
// So a checkpoint needs no generator state beyond the dropout counter, and a resumed run
// continues with exactly the batches, masks, learning rates and optimizer state it would have
// had. (Bitwise on the same machine and thread count: BLAS results may differ between CPUs.)
//
// Checkpoint: one safetensors file, written atomically after every epoch:
//   model.<parameter>                      the model's state dict (PyTorch names)
//   optimizer.<parameter>.{exp_avg,exp_avg_sq,step}   AdamW's state
//   metadata: format, config (JSON), epoch, step, dropout_counter, history (JSON)
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mha/data/fashion_mnist.h"
#include "mha/models/attention_classifier.h"
#include "mha/optim/adamw.h"
#include "mha/optim/schedule.h"

namespace mha::train {

inline constexpr const char* kCheckpointFormat = "mha-attention-classifier-checkpoint/1";

struct TrainingConfig {
  models::AttentionClassifierConfig model;
  int64_t epochs = 10;
  int64_t batch_size = 128;
  double lr = 1e-3;            // peak learning rate (after warm-up)
  double min_lr = 0.0;         // the cosine's floor
  int64_t warmup_steps = 0;    // linear warm-up, in optimizer steps
  double weight_decay = 0.01;  // AdamW's decoupled weight decay (PyTorch's default)
  uint64_t seed = 0;
  int64_t train_limit = 0;     // use only the first n training images (0 = all)
  int64_t test_limit = 0;      // use only the first n test images (0 = all)

  // Throws mha::Error naming the field.
  void check_valid() const;
  // A JSON object with every field (the model's under "model"), and back. from_json refuses
  // missing or unknown fields and wrong types, naming them.
  std::string to_json() const;
  static TrainingConfig from_json(const std::string& json);
};

// Equal iff every field is equal (compares the JSON forms).
bool operator==(const TrainingConfig& a, const TrainingConfig& b);

struct EpochStats {
  int64_t epoch = 0;  // 1-based
  int64_t steps = 0;  // optimizer steps taken so far, in total
  double train_loss = 0, train_accuracy = 0;  // over the epoch's batches, as trained
  double test_loss = 0, test_accuracy = 0;
  double seconds = 0;             // wall time of the training loop (evaluation excluded)
  double samples_per_second = 0;  // training samples / seconds
  double lr = 0;                  // the last update's learning rate
};

struct Evaluation {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
  int64_t num_classes = 0;
  std::vector<int64_t> confusion;  // (true class, predicted class), num_classes²
};

struct BatchProgress {
  int64_t epoch = 0;      // 1-based
  int64_t batch = 0;      // batches done in this epoch
  int64_t batches = 0;    // in this epoch
  int64_t samples = 0;    // done in this epoch
  int64_t epoch_samples = 0;
  double loss = 0, accuracy = 0;  // running means over this epoch
  double seconds = 0;     // since the epoch started
  double lr = 0;          // the rate the last step used
  int64_t step = 0;       // optimizer steps taken in all
  float batch_loss = 0;   // the last batch's mean loss
};

// The order of the training images in epoch `epoch` (0-based): a permutation of [0, n).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

// Mean cross-entropy, accuracy and confusion matrix of `model` (in eval mode) on `data`.
Evaluation evaluate(models::AttentionClassifier<float>& model, const data::LabelledImages& data,
                    int64_t batch_size = 1000);

struct Checkpoint {
  TrainingConfig config;
  int64_t epoch = 0, step = 0;
  uint64_t dropout_counter = 0;
  std::vector<EpochStats> history;
  nn::StateDict<float> model, optimizer;
};
// Reads and checks a checkpoint written by Trainer::save_checkpoint (mha::Error naming the file
// and what is wrong).
Checkpoint read_checkpoint(const std::string& path);

// Data parallelism (`mha train` under mpirun): this process is rank `rank` of `ranks`. Every batch
// is split by rows across the ranks (rank r takes rows [r·n/P, (r+1)·n/P)); each rank's gradient
// of its rows' share of the batch's mean loss is summed across the ranks by all_reduce_sum, in one
// buffer, before the optimizer steps, so every rank holds the same weights after every step and
// the steps are those of the whole batch up to float rounding (bitwise reproducible for a given
// P). Dropout masks are drawn per rank for its own rows (reproducible for a given P, not equal
// across P). The train layer knows no MPI: the caller supplies the sum (mha::distributed).
struct DataParallel {
  int rank = 0, ranks = 1;
  std::function<void(std::span<double>)> all_reduce_sum;  // in place, across the ranks
};

class Trainer {
 public:
  // The data sets are copied (after applying train_limit / test_limit); the model is
  // initialised from config.seed.
  Trainer(const TrainingConfig& config, const data::LabelledImages& train, const data::LabelledImages& test);

  const TrainingConfig& config() const { return config_; }
  models::AttentionClassifier<float>& model() { return *model_; }
  optim::AdamW<float>& optimizer() { return *optimizer_; }
  const optim::WarmupCosineSchedule& schedule() const { return schedule_; }
  int64_t epoch() const { return epoch_; }  // epochs completed
  int64_t step() const { return step_; }    // optimizer steps taken
  int64_t steps_per_epoch() const;
  bool finished() const { return epoch_ >= config_.epochs; }
  const std::vector<EpochStats>& history() const { return history_; }
  // The test-set evaluation of the last completed run_epoch (count 0 before the first).
  const Evaluation& last_evaluation() const { return last_evaluation_; }
  const data::LabelledImages& train_data() const { return train_; }
  const data::LabelledImages& test_data() const { return test_; }

  // One optimizer step on a batch at the schedule's current rate: forward, cross-entropy,
  // backward, AdamW. Returns the batch's mean loss; `correct` (if given) receives the number
  // of correct predictions.
  float train_step(const Tensor<float>& images, const Tensor<int64_t>& labels, int64_t* correct = nullptr);

  // Splits every later batch across the ranks of `parallel` (DataParallel); train_step then takes
  // the whole batch on every rank and returns the whole batch's loss and correct count.
  void set_data_parallel(DataParallel parallel);
  const DataParallel& data_parallel() const { return parallel_; }

  // Trains the next epoch (the model in training mode), then evaluates on the test set and
  // appends to history(). `progress` is called after every batch. With max_steps > 0 the epoch
  // stops once step() reaches it; it then returns the partial epoch's training numbers without
  // evaluating, recording or advancing epoch().
  EpochStats run_epoch(const std::function<void(const BatchProgress&)>& progress = {}, int64_t max_steps = 0);

  // Writes the checkpoint atomically; load_checkpoint restores model, optimizer, epoch, step,
  // dropout counter and history from one whose config equals this trainer's (else mha::Error).
  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);

 private:
  TrainingConfig config_;
  data::LabelledImages train_, test_;
  std::unique_ptr<models::AttentionClassifier<float>> model_;
  std::unique_ptr<optim::AdamW<float>> optimizer_;
  optim::WarmupCosineSchedule schedule_;
  int64_t epoch_ = 0, step_ = 0;
  std::vector<EpochStats> history_;
  Evaluation last_evaluation_;
  models::AttentionClassifier<float>::Cache cache_;  // reused from step to step
  DataParallel parallel_;
};

}  // namespace mha::train
