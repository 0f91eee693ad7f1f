#include "core/status.h"

#include <fmt/format.h>

namespace lc {

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
