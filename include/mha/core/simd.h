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
//
// The environment variable MHA_CPU_TARGET=<target> (any case: AVX2, avx3, SSE4, ...; as PyTorch's
// ATEN_CPU_CAPABILITY) makes the whole process run the code of a CPU whose best target is at most
// <target>: applied before the first kernel runs, it is a ceiling every listing and pin below
// keeps (simd_targets() lists only the targets under it). Below AVX3 the bfloat16 products run on
// float32 (bf16_gemm::path(): no AVX512_BF16 or AMX on such a CPU), and OpenBLAS runs its kernels
// for that instruction set unless OPENBLAS_CORETYPE says otherwise. A name no target compiled in
// has aborts the process with a message naming the targets it could be.
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

// MHA_CPU_TARGET's target (in Highway's spelling), or "" when it is not set.
std::string simd_target_ceiling();

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

namespace detail {

// Reads MHA_CPU_TARGET once and sets the ceiling; true when it is set. Every file that dispatches
// to Highway targets calls it while the program starts (a static initialiser), so the ceiling
// holds before any kernel runs, whichever of the library's objects a program links.
bool apply_cpu_target_from_environment();

// Whether the target in use now is AVX3 or better (or nothing is pinned or capped): where the
// bfloat16 products may use the CPU's AVX512_BF16 and AMX (bf16_gemm::path()).
bool pin_allows_avx512();

}  // namespace detail
}  // namespace mha
