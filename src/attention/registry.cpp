// The registry of attention methods, generated from attention/attention_list.h (one line per method).
#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

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

Expected<std::string> equal_budget_spec(std::string_view text, int64_t n) {
  LC_ASSIGN_OR_RETURN(MethodSpec spec, MethodSpec::parse(text));
  const std::string& name = spec.name();
  if (n < 512 || n % 256 != 0)
    return make_error(fmt::format("--budget {}: expected a multiple of 256 of at least 512 tokens", n));
  // Key positions a decoded token reads per query head, split the way each method splits them.
  std::vector<std::pair<std::string, int64_t>> set;
  if (name == "dense" || name == "naive") {
    return std::string(text);
  } else if (name == "quest" || name == "quest_fast") {
    set = {{"budget", n}, {"dense_layers", 0}};  // every layer reads n (no dense first layers)
  } else if (name == "streaming") {
    set = {{"sinks", 4}, {"window", n - 4}};
  } else if (name == "infllm") {
    // InfLLM's 128 initial tokens and blocks of 128; a block's worth left for the remainder
    // past the last memory block (1 to 128 tokens older than the window); of the rest half
    // local, half retrieved.
    const int64_t local = n / 2 - 128;
    set = {{"sinks", 128}, {"local", local}, {"block", 128}, {"topk", n / 2 / 128 - 1}};
  } else if (name == "dssa") {
    // Blocks of 64 with one initial block among topk; a quarter in the local window; dense
    // below n tokens (a query that sees fewer reads fewer).
    const int64_t local = n / 4;
    set = {{"switch", n}, {"block", 64}, {"sinks", 64}, {"local", local}, {"topk", (n - local) / 64}};
  } else if (name == "lychee") {
    // Sparse heads: 64 sink tokens, 256 local (extended down to a block boundary: up to 63
    // more), the rest in blocks of 64 (retrieval heads read every key, as the method defines).
    set = {{"block", 64}, {"sinks", 64}, {"local", 256}, {"budget", n - 384}};
  } else {
    return make_error(fmt::format("--budget: {} has no read budget to set (dense, naive, streaming, quest, "
                                  "quest_fast, infllm, dssa and lychee do)",
                                  name));
  }
  std::string out = name;
  char sep = ':';
  for (const auto& [k, v] : set) {
    if (spec.given().count(k))
      return make_error(fmt::format("--budget {}: {} sets {}= itself; leave it out of '{}'", n, name, k, text));
    out += fmt::format("{}{}={}", sep, k, v);
    sep = ',';
  }
  for (const auto& [k, v] : spec.given()) {
    out += fmt::format("{}{}={}", sep, k, v);
    sep = ',';
  }
  return out;
}

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
