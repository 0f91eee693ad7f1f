// Process facts the benchmarks and summaries report.
#pragma once

#include <cstdint>

namespace lc {

int64_t peak_rss_bytes();     // VmHWM of this process
int64_t current_rss_bytes();  // VmRSS
double now_seconds();         // monotonic clock
bool stderr_is_terminal();

}  // namespace lc
