// TrainingConfig: its checks and its JSON (json_fields.h).
#include <cmath>
#include <string>

#include "json_fields.h"
#include "mha/train/trainer.h"

namespace mha::train {

using detail::json;

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
  json j = detail::to_json_object(*this);
  j["model"] = detail::to_json_object(model);
  return j.dump();
}

TrainingConfig TrainingConfig::from_json(const std::string& text) {
  const json j = detail::parse_json(text, "training config");
  TrainingConfig c;
  detail::FieldReader r(j, "training config");
  check(j.contains("model"), "training config: missing field 'model'");
  detail::read_fields(j.at("model"), "training config: model", c.model);
  r.mark("model");
  visit_fields(c, r);
  r.finish();
  c.check_valid();
  return c;
}

bool operator==(const TrainingConfig& a, const TrainingConfig& b) { return a.to_json() == b.to_json(); }

}  // namespace mha::train
