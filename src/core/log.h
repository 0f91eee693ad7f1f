// Minimal leveled logging to stderr.
#pragma once

namespace lc {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace lc

#define LC_LOG_ERROR(...) ::lc::log_message(::lc::LogLevel::kError, __VA_ARGS__)
#define LC_LOG_WARN(...) ::lc::log_message(::lc::LogLevel::kWarn, __VA_ARGS__)
#define LC_LOG_INFO(...) ::lc::log_message(::lc::LogLevel::kInfo, __VA_ARGS__)
#define LC_LOG_DEBUG(...) ::lc::log_message(::lc::LogLevel::kDebug, __VA_ARGS__)
