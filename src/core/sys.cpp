#include "core/sys.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

namespace lc {
namespace {

int64_t status_kib(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t v = -1;
  const size_t klen = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, klen) == 0) {
      long long kib = 0;
      if (std::sscanf(line + klen, " %lld", &kib) == 1) v = kib;
      break;
    }
  }
  std::fclose(f);
  return v < 0 ? -1 : v * 1024;
}

}  // namespace

int64_t peak_rss_bytes() { return status_kib("VmHWM:"); }
int64_t current_rss_bytes() { return status_kib("VmRSS:"); }

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

int64_t available_memory_bytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  int64_t v = -1;
  while (std::fgets(line, sizeof line, f)) {
    long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %lld", &kib) == 1) {
      v = kib * 1024;
      break;
    }
  }
  std::fclose(f);
  return v;
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) != 0; }

}  // namespace lc
