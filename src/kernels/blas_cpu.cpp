#include "kernels/blas_cpu.h"

#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <initializer_list>

extern "C" char* openblas_get_corename(void);

namespace lc::kernels {

const char* blas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

const char* better_blas_core_for(const char* chosen, bool avx512, bool avx2_fma) {
  if (chosen == nullptr) return nullptr;
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (strcasecmp(chosen, n) == 0) return nullptr;  // already AVX-512 kernels
  if (avx512) return "SkylakeX";
  if (avx2_fma && strcasecmp(chosen, "prescott") == 0) return "Haswell";
  return nullptr;
}

const char* better_blas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return better_blas_core_for(openblas_get_corename(), avx512, avx2_fma);
}

void reexec_for_faster_blas(char** argv) {
  const char* core = better_blas_core();
  if (core == nullptr || argv == nullptr || argv[0] == nullptr) return;
  if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // execv failed: carry on as loaded
}

}  // namespace lc::kernels
