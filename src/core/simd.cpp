// One process-wide SIMD target for every Highway-dispatched kernel (mha/core/simd.h). Highway
// keeps the choice itself: SetSupportedTargetsForTest(mask) makes every HWY_DYNAMIC_DISPATCH call
// in the process use the best target of `mask` (0: of the CPU's own), so one pin covers all the
// kernels. Highway cannot be asked what is pinned, so it is remembered here, with the ceiling
// MHA_CPU_TARGET sets.
#include "mha/core/simd.h"

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "hwy/targets.h"
#include "mha/core/error.h"

namespace mha {
namespace {

std::mutex pin_mutex;
int64_t pinned_target = 0;  // 0: none
int64_t ceiling = 0;        // MHA_CPU_TARGET's target, 0: none (Highway: a larger bit is a lesser target)
std::atomic<bool> avx512_allowed{true};  // whether the target in use is AVX3 or better (pin_allows_avx512)

// What dispatch may choose now: the pin, else the best target at most the ceiling (0: the CPU's
// own best); pin_mutex held.
void apply_locked();

// The targets compiled in (HWY_TARGETS) that this CPU supports, best first, at most the ceiling;
// pin_mutex held.
std::vector<int64_t> available_targets() {
  hwy::SetSupportedTargetsForTest(0);  // lift the pin, which hides every other target
  std::vector<int64_t> targets;
  for (int64_t t : hwy::SupportedAndGeneratedTargets())
    if (t >= ceiling) targets.push_back(t);
  apply_locked();
  return targets;
}

void apply_locked() {
  int64_t mask = pinned_target;
  if (mask == 0 && ceiling != 0) {
    hwy::SetSupportedTargetsForTest(0);
    for (int64_t t : hwy::SupportedAndGeneratedTargets())
      if (t >= ceiling) mask |= t;
  }
  hwy::SetSupportedTargetsForTest(mask);
  const int64_t in_use = mask == 0 ? 0 : (mask & -mask);  // the best of the mask: its lowest bit
  avx512_allowed.store(in_use == 0 || in_use <= HWY_AVX3, std::memory_order_relaxed);
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
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
  apply_locked();
}

std::string pinned_simd_target() {
  const std::lock_guard<std::mutex> lock(pin_mutex);
  return pinned_target == 0 ? std::string() : std::string(hwy::TargetName(pinned_target));
}

std::string simd_target_ceiling() {
  const std::lock_guard<std::mutex> lock(pin_mutex);
  return ceiling == 0 ? std::string() : std::string(hwy::TargetName(ceiling));
}

ScopedSimdTarget::ScopedSimdTarget(const std::string& name) : previous_(pinned_simd_target()) {
  pin_simd_target(name);
}

ScopedSimdTarget::~ScopedSimdTarget() { pin_simd_target(previous_); }

namespace detail {

bool apply_cpu_target_from_environment() {
  static const bool applied = [] {
    const char* value = std::getenv("MHA_CPU_TARGET");
    if (value == nullptr || *value == '\0') return false;
    std::string names;
    int64_t named = 0;
    for (int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) {  // every target compiled in
      const int64_t t = bits & -bits;
      if (upper(value) == hwy::TargetName(t)) named = t;
      names += std::string(names.empty() ? "" : ", ") + hwy::TargetName(t);
    }
    if (named == 0) {  // before main, or at a module's import: no caller to throw to
      std::fprintf(stderr, "mha: MHA_CPU_TARGET: expected one of the targets compiled in (%s), got \"%s\"\n",
                   names.c_str(), value);
      std::abort();
    }
    const std::lock_guard<std::mutex> lock(pin_mutex);
    ceiling = named;
    apply_locked();
    return true;
  }();
  return applied;
}

bool pin_allows_avx512() { return avx512_allowed.load(std::memory_order_relaxed); }

}  // namespace detail
}  // namespace mha
