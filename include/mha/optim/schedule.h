#pragma once
// Learning-rate schedule: linear warm-up, then cosine decay to a floor.
//
// For update number s = 0, 1, ..., total_steps − 1 (the lr that update uses), with W warm-up
// steps and T = total_steps − W:
//   s <  W:  lr = base_lr · (s + 1) / W
//   s >= W:  lr = min_lr + (base_lr − min_lr) · (1 + cos(π · min(s − W, T) / T)) / 2
// so the first update already has a non-zero rate, the rate peaks at base_lr on update W and
// reaches min_lr after the last update. Steps past total_steps stay at min_lr.
//
// PyTorch: SequentialLR([LinearLR(start_factor=1/W, end_factor=1, total_iters=W−1),
//                        CosineAnnealingLR(T_max=T, eta_min=min_lr)], milestones=[W])
// gives the same rates (tests/goldens/training/schedule.safetensors checks it).
#include <cstdint>

namespace mha::optim {

struct WarmupCosineSchedule {
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr = 0.0;

  // Throws mha::Error naming the field unless base_lr >= min_lr >= 0 (finite),
  // 0 <= warmup_steps < total_steps.
  void check_valid() const;
  // The rate for update `step` (>= 0).
  double lr_at(int64_t step) const;
};

}  // namespace mha::optim
