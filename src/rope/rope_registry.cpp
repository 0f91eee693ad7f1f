// The `--rope` spec parser and the method registry, generated from rope/rope_list.h.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "rope/rope_method.h"
#include "rope/rope_scaling.h"

namespace lc {
namespace {

using rope_detail::KeyDef;
using rope_detail::KeyKind;
using rope_detail::RopeArgs;
using rope_detail::RopeMethodDef;

// The position methods.
const std::vector<const RopeMethodDef*>& registry() {
  static const std::vector<const RopeMethodDef*> r = {
#define LC_ROPE_METHOD(ident) &rope_detail::method_##ident(),
#include "rope/rope_list.h"
  };
  return r;
}

// Every definition: the position methods, then the '+' components (logn).
const std::vector<const RopeMethodDef*>& all_definitions() {
  static const std::vector<const RopeMethodDef*> r = {
#define LC_ROPE_METHOD(ident) &rope_detail::method_##ident(),
#define LC_ROPE_COMPONENT(ident) &rope_detail::method_##ident(),
#include "rope/rope_list.h"
  };
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(sep, start);
    out.push_back(trim(s.substr(start, p == std::string_view::npos ? p : p - start)));
    if (p == std::string_view::npos) return out;
    start = p + 1;
  }
}

std::string method_list() {
  std::string s;
  for (const RopeMethodDef* d : registry()) s += std::string(s.empty() ? "" : ", ") + d->name;
  return s + "; and logn, composed with '+'";
}

std::string key_list(const RopeMethodDef& def) {
  if (def.keys.empty()) return "none";
  std::string s;
  for (const KeyDef& k : def.keys) {
    if (!s.empty()) s += ", ";
    s += k.name;
    if (k.default_value == nullptr) s += " (required)";
  }
  return s;
}

std::string format_real(double v) { return fmt::format("{:.9g}", v); }

// Parses and validates one value; on success returns the value and its canonical text.
Expected<std::pair<double, std::string>> parse_value(const char* method, const KeyDef& k,
                                                     std::string_view text) {
  if (k.kind == KeyKind::kChoice) {
    for (std::string_view c : split(k.choices, '|'))
      if (c == text) return std::pair<double, std::string>{0.0, std::string(text)};
    return make_error(fmt::format("rope {}: {} must be one of {}, got '{}'", method, k.name,
                                  k.choices, text));
  }
  double v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || !std::isfinite(v))
    return make_error(fmt::format("rope {}: {} must be a number, got '{}'", method, k.name,
                                  text));
  switch (k.kind) {
    case KeyKind::kFactor:
      if (!(v >= 1.0))
        return make_error(fmt::format(
            "rope {}: {} must be >= 1 (the extension ratio L'/L0), got {}", method, k.name,
            format_real(v)));
      break;
    case KeyKind::kPositive:
      if (!(v > 0.0))
        return make_error(fmt::format("rope {}: {} must be > 0, got {}", method, k.name,
                                      format_real(v)));
      break;
    case KeyKind::kPositiveInt:
      if (!(v >= 1.0) || v != std::floor(v) || v > 1e15)
        return make_error(fmt::format("rope {}: {} must be a positive integer, got '{}'",
                                      method, k.name, text));
      return std::pair<double, std::string>{v, fmt::format("{}", static_cast<int64_t>(v))};
    case KeyKind::kChoice:
      break;
  }
  return std::pair<double, std::string>{v, format_real(v)};
}

// Resolves "key=value,..." against a method's keys, filling defaults.
Expected<RopeArgs> resolve_args(const RopeMethodDef& def, std::string_view params, bool has_colon,
                                const RopeModelInfo& info) {
  std::vector<std::pair<std::string_view, std::string_view>> given;
  if (has_colon) {
    for (std::string_view item : split(params, ',')) {
      const size_t eq = item.find('=');
      if (item.empty() || eq == std::string_view::npos)
        return make_error(fmt::format(
            "rope {}: expected key=value, got '{}' (keys: {})", def.name,
            item, key_list(def)));
      const std::string_view key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
      bool known = false;
      for (const KeyDef& k : def.keys) known = known || key == k.name;
      if (!known) {
        std::string hint;
        if (key == "logn") hint = "; for log-n scaling append '+logn'";
        return make_error(fmt::format("rope {}: unknown key '{}' (accepted: {}){}", def.name,
                                      key,
                                      key_list(def), hint));
      }
      for (const auto& g : given)
        if (g.first == key)
          return make_error(fmt::format("rope {}: key '{}' given twice", def.name,
                                        key));
      given.emplace_back(key, value);
    }
  }
  RopeArgs args;
  for (const KeyDef& k : def.keys) {
    std::string text;
    bool found = false;
    for (const auto& g : given) {
      if (g.first == k.name) {
        text = std::string(g.second);
        found = true;
      }
    }
    if (!found) {
      if (k.default_value == nullptr)
        return make_error(fmt::format("rope {}: missing required key '{}' ({}), e.g. {}:{}=8",
                                      def.name, k.name, k.help, def.name, k.name));
      if (std::strcmp(k.default_value, rope_detail::kDefaultCtxTrain) == 0) {
        if (info.n_ctx_train <= 0)
          return make_error(fmt::format(
              "rope {}: {} has no default (the model metadata has no training context); "
              "give {}=N", def.name, k.name, k.name));
        text = fmt::format("{}", info.n_ctx_train);
      } else if (std::strcmp(k.default_value, rope_detail::kDefaultBase) == 0) {
        text = format_real(info.gguf.base);
      } else {
        text = k.default_value;
      }
    }
    LC_ASSIGN_OR_RETURN(auto parsed, parse_value(def.name, k, text));
    args.set(k.name, std::move(parsed.second), parsed.first);
  }
  return args;
}

Status check_info(const RopeModelInfo& info) {
  if (info.gguf.n_rot <= 0 || info.gguf.n_rot % 2 != 0)
    return make_error(fmt::format("rope: n_rot must be positive and even, got {}",
                                  info.gguf.n_rot));
  if (!(info.gguf.base > 0.0f) || !std::isfinite(info.gguf.base))
    return make_error(fmt::format("rope: base must be positive, got {:g}", info.gguf.base));
  return ok_status();
}

struct Component {
  std::string_view name, params;
  bool has_colon = false;
};

Component split_component(std::string_view c) {
  const size_t colon = c.find(':');
  if (colon == std::string_view::npos) return {trim(c), {}, false};
  return {trim(c.substr(0, colon)), trim(c.substr(colon + 1)), true};
}

const RopeMethodDef* find_method(std::string_view name) {
  for (const RopeMethodDef* d : registry())
    if (name == d->name) return d;
  return nullptr;
}

Expected<std::unique_ptr<RopeScaling>> make_component(const Component& c,
                                                      const RopeModelInfo& info) {
  if (c.name == "logn")
    return make_error(
        "rope: logn scales attention logits, it is not a position method; compose it with "
        "one: '<method>+logn' (or 'logn' alone for the GGUF rope)");
  const RopeMethodDef* def = find_method(c.name);
  if (def == nullptr)
    return make_error(fmt::format("rope: unknown method '{}' (accepted: {})",
                                  c.name,
                                  method_list()));
  LC_ASSIGN_OR_RETURN(RopeArgs args, resolve_args(*def, c.params, c.has_colon, info));
  return def->make(args, info);
}

}  // namespace

RopePlan::RopePlan(std::unique_ptr<RopeScaling> scaling, int64_t logn_l0)
    : scaling_(std::move(scaling)), logn_l0_(logn_l0) {
  LC_CHECK(scaling_ != nullptr);
}

std::string RopePlan::describe() const {
  std::string s = scaling_->describe();
  if (logn()) s += fmt::format("+logn:orig={}", logn_l0_);
  return s;
}

Expected<std::unique_ptr<RopeScaling>> make_rope_scaling(std::string_view spec,
                                                         const RopeModelInfo& info) {
  LC_TRY(check_info(info));
  spec = trim(spec);
  if (spec.find('+') != std::string_view::npos)
    return make_error(fmt::format(
        "rope: '{}' joins several components with '+'; make_rope_plan parses those",
        spec));
  if (spec.empty()) spec = "gguf";
  return make_component(split_component(spec), info);
}

Expected<RopePlan> make_rope_plan(std::string_view spec, const RopeModelInfo& info) {
  LC_TRY(check_info(info));
  spec = trim(spec);
  std::unique_ptr<RopeScaling> scaling;
  int64_t logn_l0 = 0;
  if (!spec.empty()) {
    for (std::string_view part : split(spec, '+')) {
      if (part.empty())
        return make_error(fmt::format("rope: empty component in '{}' (components are joined "
                                      "by '+', e.g. yarn:factor=8+logn)",
                                      spec));
      const Component c = split_component(part);
      if (c.name == "logn") {
        if (logn_l0 != 0) return make_error("rope: logn given twice");
        LC_ASSIGN_OR_RETURN(RopeArgs args,
                            resolve_args(rope_detail::method_logn(), c.params, c.has_colon, info));
        logn_l0 = args.integer("orig");
        if (logn_l0 < 2)
          return make_error(fmt::format("rope logn: orig must be >= 2 (ln L0 divides), got {}",
                                        logn_l0));
        continue;
      }
      if (scaling)
        return make_error(fmt::format(
            "rope: two position methods ('{}' and '{}'); give one, plus optionally logn",
            scaling->describe(), c.name));
      LC_ASSIGN_OR_RETURN(scaling, make_component(c, info));
    }
  }
  if (!scaling) {
    LC_ASSIGN_OR_RETURN(scaling, make_component(Component{"gguf", {}, false}, info));
  }
  return RopePlan(std::move(scaling), logn_l0);
}

std::vector<std::string> rope_method_names() {
  std::vector<std::string> names;
  for (const RopeMethodDef* d : all_definitions()) names.emplace_back(d->name);
  return names;
}

std::vector<MethodInfo> rope_method_info() {
  std::vector<MethodInfo> out;
  for (const RopeMethodDef* d : all_definitions()) {
    MethodInfo m{d->name, d->summary, d->paper, {}};
    for (const KeyDef& k : d->keys) {
      MethodKey mk;
      mk.name = k.name;
      mk.help = k.help;
      switch (k.kind) {
        case KeyKind::kFactor: mk.type = "real", mk.range = ">= 1"; break;
        case KeyKind::kPositive: mk.type = "real", mk.range = "> 0"; break;
        case KeyKind::kPositiveInt: mk.type = "int", mk.range = ">= 1"; break;
        case KeyKind::kChoice: mk.type = k.choices ? k.choices : "text"; break;
      }
      mk.def = k.default_value == nullptr                                          ? "required"
               : std::strcmp(k.default_value, rope_detail::kDefaultCtxTrain) == 0 ? "the model's training context"
               : std::strcmp(k.default_value, rope_detail::kDefaultBase) == 0     ? "the model's rope base"
                                                                                  : k.default_value;
      m.keys.push_back(std::move(mk));
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::string rope_spec_help() {
  std::string s =
      "--rope SPEC: SPEC = COMPONENT['+'COMPONENT], COMPONENT = NAME[:key=value,...];\n"
      "one position method and/or logn; empty = gguf. Methods:\n";
  for (const RopeMethodDef* d : all_definitions()) {
    s += fmt::format("  {:<12} {}\n", d->name, d->summary);
    for (const KeyDef& k : d->keys) {
      std::string def = k.default_value == nullptr ? "required"
                        : std::strcmp(k.default_value, rope_detail::kDefaultCtxTrain) == 0
                            ? "default: model training context"
                        : std::strcmp(k.default_value, rope_detail::kDefaultBase) == 0
                            ? "default: model rope base"
                            : std::string("default ") + k.default_value;
      s += fmt::format("      {:<12} {} ({})\n", k.name, k.help, def);
    }
  }
  return s;
}

}  // namespace lc
