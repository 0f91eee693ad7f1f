#include "core/status.h"

#include <fmt/format.h>

#include <cstdarg>

namespace lc {

std::string strprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s;
  if (n > 0) {
    s.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(s.data(), s.size(), fmt, ap2);
    s.resize(static_cast<size_t>(n));
  }
  va_end(ap2);
  return s;
}

const char* error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::kGeneric: return "error";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kTooShort: return "too_short";
    case ErrorCode::kContextFull: return "context_full";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kBadFile: return "bad_file";
  }
  return "error";
}

void check_failed(const char* file, int line, const char* expr) {
  fmt::print(stderr, "longctx: internal check failed at {}:{}: {}\n", file, line, expr);
  std::abort();
}

}  // namespace lc
