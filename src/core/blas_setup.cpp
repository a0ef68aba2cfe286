#include "blas_setup.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "mha/core/simd.h"

namespace mha::detail {
namespace {

// The OpenBLAS core type of the CPU's instruction set, at most MHA_CPU_TARGET's (mha/core/simd.h),
// or nullptr; and whether that ceiling lowered it.
struct CoreType {
  const char* name;
  bool lowered;
};

CoreType core_type_for_this_cpu() {
#if !defined(__x86_64__)
  return {nullptr, false};  // the core types below are x86's: elsewhere OpenBLAS's own choice stands
#else
  int level = 0;  // 0: none known, 1: SSE4, 2: AVX2 + FMA, 3: AVX-512
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    level = 3;
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    level = 2;
  else if (__builtin_cpu_supports("sse4.2"))
    level = 1;
  const std::string ceiling = simd_target_ceiling();
  static const char* const names[] = {nullptr, "Nehalem", "Haswell", "SkylakeX"};
  int capped = level;
  if (ceiling == "AVX2") capped = std::min(level, 2);
  if (ceiling == "SSE4") capped = std::min(level, 1);
  if (ceiling == "SSSE3" || ceiling == "SCALAR" || ceiling == "EMU128") return {"Core2", true};
  return {names[capped], capped < level};
#endif
}

void choose_once() {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user decided
  // Looked up at run time so that linking against another BLAS still works.
  using CoreName = char* (*)();
  using DynamicInit = void (*)();
  auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  auto dynamic_init = reinterpret_cast<DynamicInit>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  auto table = static_cast<void**>(dlsym(RTLD_DEFAULT, "gotoblas"));
  if (!corename || !dynamic_init || !table) return;
  const char* current = corename();
  const CoreType wanted = core_type_for_this_cpu();
  if (!current || !wanted.name || std::strcmp(current, wanted.name) == 0) return;
  // A real detection is kept unless MHA_CPU_TARGET lowers the instruction set.
  if (std::strcmp(current, "Prescott") != 0 && !wanted.lowered) return;
  const char* better = wanted.name;
  // gotoblas_dynamic_init() returns at once while a kernel table is set; clearing it makes it
  // run the dispatch again, now honouring OPENBLAS_CORETYPE.
  void* previous = *table;
  setenv("OPENBLAS_CORETYPE", better, 0);
  *table = nullptr;
  dynamic_init();
  if (!*table) *table = previous;  // the core type was not accepted: keep what worked
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace

void choose_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, choose_once);
}

}  // namespace mha::detail
