// The reader registry, generated from readers/reader_list.h (one line per reader).
#include <fmt/format.h>

#include "readers/readers_impl.h"

namespace lc::readers {
namespace {

struct Entry {
  const char* name;
  Expected<std::unique_ptr<Reader>> (*make)(MethodSpec&);
  const char* help;
  const char* paper;
};

const Entry kReaders[] = {
#define LC_READER(name, help, paper) {#name, make_##name, help, paper},
#include "readers/reader_list.h"
};

}  // namespace

Expected<std::unique_ptr<Reader>> make_reader(std::string_view text) {
  if (text.empty()) return make_error(ErrorCode::kInvalidArgument, "reader: empty spec (expected NAME:key=value,...)");
  auto spec = MethodSpec::parse(text, "reader");
  if (!spec) return make_error(ErrorCode::kInvalidArgument, spec.error().message);
  for (const auto& e : kReaders)
    if (spec->name() == e.name) {
      auto r = e.make(*spec);
      if (!r) return make_error(ErrorCode::kInvalidArgument, r.error().message);
      return r;
    }
  std::string list;
  for (const auto& e : kReaders) list += (list.empty() ? "" : ", ") + std::string(e.name);
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("unknown reader '{}' (accepted: {})", spec->name(), list));
}

std::vector<MethodInfo> reader_method_info() {
  std::vector<MethodInfo> out;
  for (const auto& e : kReaders) {
    MethodInfo m{e.name, e.help, e.paper, {}};
    auto spec = MethodSpec::parse(e.name, "reader");
    if (spec) {
      (void)e.make(*spec);  // reads every key with its default
      m.keys = spec->keys();
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> reader_methods() {
  std::vector<std::pair<std::string, std::string>> v;
  for (const auto& e : kReaders) v.emplace_back(e.name, e.help);
  return v;
}

}  // namespace lc::readers
