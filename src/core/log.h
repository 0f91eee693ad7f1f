// Minimal leveled logging to stderr.
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace lc {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Writes "longctx: <level>: <message>\n" to stderr.
void log_write(LogLevel level, std::string_view message);
// {fmt}-style: LC_LOG_WARN("{}: {} tokens", name, n). Formats only when the level is enabled.
template <class... Args>
void log_message(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(level) > static_cast<int>(log_level())) return;
  log_write(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace lc

#define LC_LOG_ERROR(...) ::lc::log_message(::lc::LogLevel::kError, __VA_ARGS__)
#define LC_LOG_WARN(...) ::lc::log_message(::lc::LogLevel::kWarn, __VA_ARGS__)
#define LC_LOG_INFO(...) ::lc::log_message(::lc::LogLevel::kInfo, __VA_ARGS__)
#define LC_LOG_DEBUG(...) ::lc::log_message(::lc::LogLevel::kDebug, __VA_ARGS__)
