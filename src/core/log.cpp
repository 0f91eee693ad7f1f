#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace lc {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_message(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) > g_level.load()) return;
  static const char* kTags[] = {"error", "warning", "info", "debug"};
  std::fprintf(stderr, "longctx: %s: ", kTags[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

}  // namespace lc
