#include "core/method_spec.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace lc {

Expected<MethodSpec> MethodSpec::parse(std::string_view text, std::string_view kind) {
  MethodSpec s;
  s.kind_ = std::string(kind);
  const size_t colon = text.find(':');
  s.name_ = std::string(text.substr(0, colon));
  if (s.name_.empty())
    return make_error(fmt::format("{} spec '{}' has no method name (expected name:key=value,...)",
                                  kind, text));
  if (colon == std::string_view::npos) return s;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return make_error(fmt::format("{} '{}': '{}' is not key=value", s.kind_, s.name_,
                                    item));
    std::string key(item.substr(0, eq));
    if (s.kv_.count(key))
      return make_error(fmt::format("{} '{}': key '{}' given twice", s.kind_, s.name_, key));
    s.kv_[key] = std::string(item.substr(eq + 1));
  }
  return s;
}

Status MethodSpec::get_int(const char* key, int64_t* out, int64_t min, int64_t max, const char* help) {
  accepted_.emplace_back(key);
  add_method_key(keys_, {key, "int", method_integer(*out), "[" + method_integer(min) + ", " + method_integer(max) + "]",
                         help});
  auto it = kv_.find(key);
  if (it == kv_.end()) return ok_status();
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno != 0 || v < min || v > max)
    return make_error(fmt::format("{} '{}': key '{}' expects an integer in [{}, {}], got '{}'",
                                  kind_, name_, key, min, max, it->second));
  *out = v;
  return ok_status();
}

Status MethodSpec::get_float(const char* key, double* out, double min, double max, const char* help) {
  accepted_.emplace_back(key);
  add_method_key(keys_, {key, "real", method_number(*out), "[" + method_number(min) + ", " + method_number(max) + "]", help});
  auto it = kv_.find(key);
  if (it == kv_.end()) return ok_status();
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || !std::isfinite(v) || v < min || v > max)
    return make_error(fmt::format("{} '{}': key '{}' expects a number in [{:g}, {:g}], got '{}'",
                                  kind_, name_, key, min, max, it->second));
  *out = v;
  return ok_status();
}

Status MethodSpec::get_bool(const char* key, bool* out, const char* help) {
  accepted_.emplace_back(key);
  add_method_key(keys_, {key, "bool", *out ? "1" : "0", "", help});
  auto it = kv_.find(key);
  if (it == kv_.end()) return ok_status();
  const std::string& v = it->second;
  if (v == "1" || v == "true" || v == "on") *out = true;
  else if (v == "0" || v == "false" || v == "off") *out = false;
  else
    return make_error(fmt::format("{} '{}': key '{}' expects 0/1/true/false, got '{}'",
                                  kind_, name_, key, v));
  return ok_status();
}

Status MethodSpec::get_string(const char* key, std::string* out, const char* help) {
  accepted_.emplace_back(key);
  add_method_key(keys_, {key, "text", *out, "", help});
  auto it = kv_.find(key);
  if (it != kv_.end()) *out = it->second;
  return ok_status();
}

Status MethodSpec::finish() const {
  for (const auto& [k, v] : kv_) {
    bool ok = false;
    for (const auto& a : accepted_) ok = ok || a == k;
    if (ok) continue;
    std::string list;
    for (const auto& a : accepted_) list += (list.empty() ? "" : ", ") + a;
    return make_error(fmt::format("{} '{}': unknown key '{}' (accepted: {})", kind_, name_,
                                  k, list.empty() ? "none" : list));
  }
  return ok_status();
}

}  // namespace lc
