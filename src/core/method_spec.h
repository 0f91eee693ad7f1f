// Parsing of method specs "name:key=value,key=value" (--attn, --reader). A factory reads its keys with
// get_*(); finish() rejects keys no one read, listing the accepted ones, so a typo is an error
// that names the method and the key instead of a silently ignored setting.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/method_info.h"
#include "core/status.h"

namespace lc {

class MethodSpec {
 public:
  // kind names the registry in errors ("attention method 'x': ...", "reader 'x': ...").
  static Expected<MethodSpec> parse(std::string_view text, std::string_view kind = "attention method");
  const std::string& name() const { return name_; }
  // The keys and values as given.
  const std::map<std::string, std::string>& given() const { return kv_; }

  // Each reads key if present (else keeps *out, the default) and records it as accepted, with
  // help: one line on what the key does, with its unit (tokens, layers, ...), for `longctx
  // methods` and docs/methods.md.
  Status get_int(const char* key, int64_t* out, int64_t min, int64_t max, const char* help);
  Status get_float(const char* key, double* out, double min, double max, const char* help);
  Status get_bool(const char* key, bool* out, const char* help);
  Status get_string(const char* key, std::string* out, const char* help);
  // Errors on keys that no get_*() asked for.
  Status finish() const;
  // Every key a get_*() asked for, with its type, default (the value *out held), range and help.
  const std::vector<MethodKey>& keys() const { return keys_; }

 private:
  std::string kind_;
  std::string name_;
  std::map<std::string, std::string> kv_;
  std::vector<std::string> accepted_;
  std::vector<MethodKey> keys_;
};

}  // namespace lc
