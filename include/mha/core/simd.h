#pragma once
// Which SIMD code mha's kernels run. Every SIMD kernel of the library is compiled once per
// instruction set (Highway's targets: "AVX3_SPR", "AVX3", "AVX2", "SSE4", "SSSE3", "NEON",
// "EMU128", ...), and each call runs the best one this CPU supports. That choice is one
// process-wide setting, shared by every Highway-dispatched kernel: the cpu_flash attention
// backend and the attention classifier's fused-path ("lanes") kernels.
//
// Pinning it to a lower target lets a test check, on one machine, the code another machine
// would run:
//   for (const std::string& target : mha::simd_targets()) {
//     mha::ScopedSimdTarget pin(target);
//     ...  // every kernel runs `target`'s code until `pin` goes out of scope
//   }
// The pin is global, not per thread: set it while no other thread runs mha's kernels.
#include <string>
#include <vector>

namespace mha {

// The targets compiled into the library that this CPU runs, best first (the one used when
// nothing is pinned), whatever is pinned now. Never empty.
std::vector<std::string> simd_targets();

// Pins every SIMD kernel to the target `name`, one of simd_targets(); "" unpins (back to the
// best). Throws mha::Error naming `name`, the targets it could be and what it was.
void pin_simd_target(const std::string& name);

// The target pinned now, or "" when none is.
std::string pinned_simd_target();

// Pins a target for as long as it lives, then restores the pin there was before (none, usually),
// so a test that fails half-way leaves no pin behind.
class ScopedSimdTarget {
 public:
  explicit ScopedSimdTarget(const std::string& name);
  ~ScopedSimdTarget();
  ScopedSimdTarget(const ScopedSimdTarget&) = delete;
  ScopedSimdTarget& operator=(const ScopedSimdTarget&) = delete;

 private:
  std::string previous_;
};

}  // namespace mha
