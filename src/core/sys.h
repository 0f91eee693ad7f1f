// Process facts the benchmarks and summaries report.
#pragma once

#include <cstdint>

namespace lc {

int64_t peak_rss_bytes();     // VmHWM of this process
int64_t current_rss_bytes();  // VmRSS
double now_seconds();         // monotonic clock
bool stderr_is_terminal();
// MemAvailable of /proc/meminfo: memory the system can give without swapping (-1: unknown).
int64_t available_memory_bytes();

}  // namespace lc
