// The method descriptions of the three registries (core/method_info.h): every key of every rope
// scaling, attention backend and KV press carries a help line, which `longctx methods` and
// docs/methods.md print next to its type, default and range; and the keys listed are exactly
// those an unknown key's error names.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention/backend.h"
#include "core/method_info.h"
#include "kv/press.h"
#include "rope/rope_scaling.h"

namespace lc {
namespace {

std::vector<MethodInfo> press_info() {
  std::vector<MethodInfo> out;
  for (const auto& p : kv_press_method_info()) out.push_back({p.name, p.help, p.paper, p.key_info});
  return out;
}

std::string key_names(const MethodInfo& m) {
  std::string s;
  for (const auto& k : m.keys) s += (s.empty() ? "" : ", ") + k.name;
  return s;
}

TEST(MethodInfo, EveryKeyHasAHelpLine) {
  const std::vector<std::pair<std::string, std::vector<MethodInfo>>> kinds = {
      {"rope", rope_method_info()}, {"attention", attention_method_info()}, {"press", press_info()}};
  size_t n_keys = 0;
  for (const auto& [kind, methods] : kinds) {
    ASSERT_FALSE(methods.empty()) << kind;
    size_t with_keys = 0;
    for (const auto& m : methods) {
      EXPECT_FALSE(m.help.empty()) << kind << " " << m.name;
      with_keys += !m.keys.empty();
      for (const auto& k : m.keys) {
        ++n_keys;
        EXPECT_FALSE(k.help.empty()) << kind << " " << m.name << ": key " << k.name << " has no help";
        EXPECT_EQ(k.help.find('\n'), std::string::npos) << kind << " " << m.name << ": " << k.name;
        EXPECT_FALSE(k.type.empty()) << kind << " " << m.name << ": " << k.name;
      }
    }
    EXPECT_GT(with_keys, methods.size() / 2) << kind;  // the keys were read off the parsers
  }
  EXPECT_GT(n_keys, 150u);
}

// Every method of every registry names the paper (or the source) it comes from, and the help
// line says what it does without repeating the citation.
TEST(MethodInfo, EveryMethodCitesItsPaper) {
  const std::vector<std::pair<std::string, std::vector<MethodInfo>>> kinds = {
      {"rope", rope_method_info()}, {"attention", attention_method_info()}, {"press", press_info()}};
  for (const auto& [kind, methods] : kinds)
    for (const auto& m : methods) {
      EXPECT_GE(m.paper.size(), 20u) << kind << " " << m.name << ": paper '" << m.paper << "'";
      EXPECT_EQ(m.paper.find('\n'), std::string::npos) << kind << " " << m.name;
    }
}

// An integer bound is written exactly, however large (not 9.22337e+18).
TEST(MethodInfo, IntegerRangesAreExact) {
  EXPECT_EQ(method_integer(INT64_MAX), "9223372036854775807");
  EXPECT_EQ(method_integer(-3), "-3");
  for (const auto& m : press_info())
    if (m.name == "random") {
      ASSERT_FALSE(m.keys.empty());
      EXPECT_EQ(m.keys[0].name, "seed");
      EXPECT_EQ(m.keys[0].range, "[0, 9223372036854775807]");
    }
}

// The keys described are the keys accepted: an unknown key's error lists the same names.
TEST(MethodInfo, UnknownKeyErrorsListTheDescribedKeys) {
  const AttnShape shape{2, 4, 2, 64, 64, 0.0f, 64};
  for (const auto& m : attention_method_info()) {
    if (m.keys.empty()) continue;
    auto b = make_attention_backend(m.name + ":nosuch=1", shape);
    ASSERT_FALSE(b.has_value()) << m.name;
    EXPECT_NE(b.error().message.find("unknown key 'nosuch' (accepted: " + key_names(m) + ")"), std::string::npos)
        << b.error().message;
  }
  const PressShape pshape{1, 1, 1, 8, 8, 0.0f};
  for (const auto& m : press_info()) {
    auto p = make_kv_press(m.name + ":nosuch=1", pshape);
    ASSERT_FALSE(p.has_value()) << m.name;
    EXPECT_NE(p.error().message.find("unknown key \"nosuch\" (accepted: " + key_names(m) + ")"), std::string::npos)
        << p.error().message;
  }
}

}  // namespace
}  // namespace lc
