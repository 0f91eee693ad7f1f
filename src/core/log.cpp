#include "core/log.h"

#include <atomic>
#include <cstdio>

namespace lc {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_write(LogLevel level, std::string_view message) {
  static const char* kTags[] = {"error", "warning", "info", "debug"};
  fmt::print(stderr, "longctx: {}: {}\n", kTags[static_cast<int>(level)], message);
}

}  // namespace lc
