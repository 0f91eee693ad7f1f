// The registry of attention methods, generated from attention/attention_list.h (one line per method).
#include <fmt/format.h>

#include <string>

#include "attention/methods.h"

namespace lc {
namespace {

struct Entry {
  const char* name;
  Expected<BackendPtr> (*make)(MethodSpec&, const AttnShape&);
  const char* help;
  const char* paper;
};

const Entry kMethods[] = {
#define LC_ATTENTION(name, help, paper) {#name, make_##name, help, paper},
#include "attention/attention_list.h"
};

}  // namespace

Expected<std::unique_ptr<AttentionBackend>> make_attention_backend(std::string_view text, const AttnShape& s) {
  if (s.n_layer < 1 || s.n_head < 1 || s.n_head_kv < 1 || s.head_dim < 1 || s.head_dim_v < 1 ||
      s.n_head % s.n_head_kv != 0)
    return make_error(fmt::format("attention: invalid shape (layers {}, heads {}, KV heads {}, head_dim {}/{}); "
                                  "n_head must be a multiple of n_head_kv",
                                  s.n_layer, s.n_head, s.n_head_kv,
                                  s.head_dim, s.head_dim_v));
  // The default: dense, or the distance ceiling a model was trained with.
  const std::string dflt = s.fixed_distance > 0 ? "fixed" : "dense";
  LC_ASSIGN_OR_RETURN(MethodSpec spec, MethodSpec::parse(text.empty() ? std::string_view(dflt) : text));
  for (const auto& e : kMethods)
    if (spec.name() == e.name) return e.make(spec, s);
  std::string list;
  for (const auto& e : kMethods) list += (list.empty() ? "" : ", ") + std::string(e.name);
  return make_error(fmt::format("unknown attention method '{}' (accepted: {})", spec.name(), list));
}

std::vector<MethodInfo> attention_method_info() {
  std::vector<MethodInfo> out;
  const AttnShape shape{2, 4, 2, 64, 64, 0.0f, 64};
  for (const auto& e : kMethods) {
    MethodInfo m{e.name, e.help, e.paper, {}};
    auto spec = MethodSpec::parse(e.name);
    if (spec) {
      (void)e.make(*spec, shape);  // reads every key with its default
      m.keys = spec->keys();
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> attention_methods() {
  std::vector<std::pair<std::string, std::string>> v;
  for (const auto& e : kMethods) v.emplace_back(e.name, e.help);
  return v;
}

}  // namespace lc
