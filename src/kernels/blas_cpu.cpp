#include "kernels/blas_cpu.h"

#include <strings.h>
#include <unistd.h>

#include <cstdlib>

extern "C" char* openblas_get_corename(void);

namespace lc::kernels {

const char* blas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

const char* better_blas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  const char* name = openblas_get_corename();
  if (name == nullptr || strcasecmp(name, "prescott") != 0) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

void reexec_for_faster_blas(char** argv) {
  const char* core = better_blas_core();
  if (core == nullptr || argv == nullptr || argv[0] == nullptr) return;
  if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // execv failed: carry on as loaded
}

}  // namespace lc::kernels
