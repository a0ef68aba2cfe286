#include "blas_setup.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace mha::detail {
namespace {

// The best OpenBLAS core type the CPU's features allow, or nullptr.
const char* core_type_for_this_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
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
  if (!current || std::strcmp(current, "Prescott") != 0) return;  // a real detection: keep it
  const char* better = core_type_for_this_cpu();
  if (!better) return;
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
