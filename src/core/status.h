// Errors a user, a file or the environment can cause travel as values: Status for operations
// without a result, Expected<T> for those with one. Invariants that cannot fail use LC_CHECK.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace lc {

// What kind of failure an error is, for callers that react to it (a benchmark skips a task
// that does not fit a length, a server maps codes to HTTP statuses); the message is for people.
// Code that branches on an error tests its code, never its text.
enum class ErrorCode {
  kGeneric,          // anything a caller only reports
  kInvalidArgument,  // a flag, spec or request field out of range or malformed
  kTooShort,         // a task or span does not fit the length asked for
  kContextFull,      // the tokens do not fit the context or the KV budget
  kUnsupported,      // a combination of methods that cannot work together
  kCancelled,        // the caller asked the work to stop
  kIo,               // a file could not be read or written
  kBadFile,          // a file's content is malformed or truncated
};
const char* error_code_name(ErrorCode c);

struct Error {
  std::string message;
  ErrorCode code = ErrorCode::kGeneric;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : ok_(false), message_(std::move(e.message)), code_(e.code) {}  // NOLINT: implicit by design
  // No ok() member: Status::ok() was once a static factory, and s.ok() on a value compiled as a
  // call to it, always true (a check that could not fail). Test with is_ok() or bool.
  bool is_ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const std::string& message() const { return message_; }
  ErrorCode code() const { return code_; }
  Error error() const { return Error{message_, code_}; }

 private:
  bool ok_ = true;
  std::string message_;
  ErrorCode code_ = ErrorCode::kGeneric;
};

// The success value: `return ok_status();`.
inline Status ok_status() { return Status(); }

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T v) : v_(std::move(v)) {}       // NOLINT: implicit by design
  Expected(Error e) : v_(std::move(e)) {}   // NOLINT: implicit by design
  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }
  Status status() const { return has_value() ? ok_status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

inline Error make_error(std::string msg) { return Error{std::move(msg), ErrorCode::kGeneric}; }
inline Error make_error(ErrorCode code, std::string msg) { return Error{std::move(msg), code}; }

[[noreturn]] void check_failed(const char* file, int line, const char* expr);

}  // namespace lc

#define LC_CHECK(cond)                                        \
  do {                                                        \
    if (!(cond)) ::lc::check_failed(__FILE__, __LINE__, #cond); \
  } while (0)

#define LC_CONCAT_INNER(a, b) a##b
#define LC_CONCAT(a, b) LC_CONCAT_INNER(a, b)

// Propagate a failed Status.
#define LC_TRY(expr)                               \
  do {                                             \
    ::lc::Status lc_try_status_ = (expr);          \
    if (!lc_try_status_.is_ok()) return lc_try_status_.error(); \
  } while (0)

// Declare `lhs` from an Expected<T>, returning its error on failure.
#define LC_ASSIGN_OR_RETURN(lhs, expr) \
  LC_ASSIGN_OR_RETURN_IMPL(LC_CONCAT(lc_expected_, __LINE__), lhs, expr)
#define LC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.has_value()) return tmp.error();      \
  lhs = std::move(tmp).value()
