// Training checkpoints: the model's and the optimizer's tensors in one safetensors file, the
// run's configuration, position and history in its metadata.
#include <string>
#include <utility>

#include "json_fields.h"
#include "mha/core/safetensors.h"
#include "mha/train/trainer.h"

namespace mha::train {
namespace {

using detail::json;
namespace st = mha::safetensors;

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
  const json history = detail::parse_json(metadata_field(file, "history", path), path + ": metadata 'history'");
  check(history.is_array(), path, ": metadata 'history': expected a JSON array, got ", history.type_name());
  for (const auto& h : history) {
    EpochStats& s = c.history.emplace_back();
    detail::read_fields(h, path + ": metadata 'history'", s);
  }
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

void Trainer::save_checkpoint(const std::string& path) {
  st::File file;
  for (const auto& [name, tensor] : model_->state_dict()) file.tensors.emplace("model." + name, st::from_tensor(tensor));
  for (const auto& [name, tensor] : optimizer_->state_dict())
    file.tensors.emplace("optimizer." + name, st::from_tensor(tensor));
  json history = json::array();
  for (const auto& s : history_) history.push_back(detail::to_json_object(s));
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
