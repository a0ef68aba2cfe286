#include "mha/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "mha/core/error.h"

namespace mha::optim {

void WarmupCosineSchedule::check_valid() const {
  check(std::isfinite(base_lr) && base_lr >= 0, "schedule: base_lr: expected a finite value >= 0, got ", base_lr);
  check(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr,
        "schedule: min_lr: expected a finite value in [0, base_lr = ", base_lr, "], got ", min_lr);
  check(total_steps >= 1, "schedule: total_steps: expected >= 1, got ", total_steps);
  check(warmup_steps >= 0 && warmup_steps < total_steps, "schedule: warmup_steps: expected 0 to total_steps - 1 = ",
        total_steps - 1, ", got ", warmup_steps);
}

double WarmupCosineSchedule::lr_at(int64_t step) const {
  check_valid();
  check(step >= 0, "schedule: step: expected >= 0, got ", step);
  if (step < warmup_steps) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const double decay_steps = static_cast<double>(total_steps - warmup_steps);
  const double progress = std::min(static_cast<double>(step - warmup_steps), decay_steps) / decay_steps;
  return min_lr + (base_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
}

}  // namespace mha::optim
