// One process-wide SIMD target for every Highway-dispatched kernel (mha/core/simd.h). Highway
// keeps the choice itself: SetSupportedTargetsForTest(mask) makes every HWY_DYNAMIC_DISPATCH call
// in the process use the best target of `mask` (0: of the CPU's own), so one pin covers all the
// kernels. Highway cannot be asked what is pinned, so it is remembered here.
#include "mha/core/simd.h"

#include <cstdint>
#include <mutex>

#include "hwy/targets.h"
#include "mha/core/error.h"

namespace mha {
namespace {

std::mutex pin_mutex;
int64_t pinned_target = 0;  // 0: none

// The targets compiled in (HWY_TARGETS) that this CPU supports, best first; pin_mutex held.
std::vector<int64_t> available_targets() {
  hwy::SetSupportedTargetsForTest(0);  // lift the pin, which hides every other target
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  hwy::SetSupportedTargetsForTest(pinned_target);
  return targets;
}

}  // namespace

std::vector<std::string> simd_targets() {
  const std::lock_guard<std::mutex> lock(pin_mutex);
  std::vector<std::string> names;
  for (int64_t target : available_targets()) names.push_back(hwy::TargetName(target));
  return names;
}

void pin_simd_target(const std::string& name) {
  const std::lock_guard<std::mutex> lock(pin_mutex);
  int64_t target = 0;
  std::string listed;
  for (int64_t t : available_targets()) {
    if (name == hwy::TargetName(t)) target = t;
    listed += std::string(listed.empty() ? "" : ", ") + hwy::TargetName(t);
  }
  check(name.empty() || target != 0, "pin_simd_target: name: expected \"\" (no pin) or a target this CPU runs (",
        listed, "), got \"", name, "\"");
  pinned_target = target;
  hwy::SetSupportedTargetsForTest(target);
}

std::string pinned_simd_target() {
  const std::lock_guard<std::mutex> lock(pin_mutex);
  return pinned_target == 0 ? std::string() : std::string(hwy::TargetName(pinned_target));
}

ScopedSimdTarget::ScopedSimdTarget(const std::string& name) : previous_(pinned_simd_target()) {
  pin_simd_target(name);
}

ScopedSimdTarget::~ScopedSimdTarget() { pin_simd_target(previous_); }

}  // namespace mha
