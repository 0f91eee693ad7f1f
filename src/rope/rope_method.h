// Internal to src/rope: how a method declares its keys and builds its scaling, and the
// formulas several methods share. A method is one file defining one RopeMethodDef plus one
// line in the registry list (rope_list.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "rope/rope_scaling.h"

namespace lc::rope_detail {

enum class KeyKind {
  kFactor,       // real >= 1: a context extension ratio s = L'/L0
  kPositive,     // real > 0
  kPositiveInt,  // integer >= 1
  kChoice,       // one of the '|'-separated words in KeyDef::choices
};

// Defaults that come from the model rather than a literal.
inline constexpr const char* kDefaultCtxTrain = "@n_ctx_train";
inline constexpr const char* kDefaultBase = "@base";

struct KeyDef {
  const char* name;
  KeyKind kind;
  const char* default_value;  // nullptr: required; kDefault*: from the model; else a literal
  const char* help;
  const char* choices = nullptr;  // kChoice only, e.g. "code|paper"
};

// The resolved (parsed, validated, defaulted) values of one component's keys.
class RopeArgs {
 public:
  void set(std::string key, std::string text, double value);
  double real(std::string_view key) const;
  int64_t integer(std::string_view key) const;
  const std::string& text(std::string_view key) const;
  // "name:k1=v1,k2=v2" in KeyDef order (the order set() was called).
  std::string canonical(std::string_view method) const;

 private:
  std::vector<std::pair<std::string, std::string>> order_;
  std::map<std::string, double, std::less<>> num_;
};

using RopeFactory = Expected<std::unique_ptr<RopeScaling>> (*)(const RopeArgs& args,
                                                                const RopeModelInfo& info);

struct RopeMethodDef {
  const char* name;
  const char* summary;  // one line: what it does
  const char* paper;    // where it comes from
  std::vector<KeyDef> keys;
  RopeFactory make;
};

// The method definitions (one file each), declared from the registry list.
#define LC_ROPE_METHOD(ident) const RopeMethodDef& method_##ident();
#define LC_ROPE_COMPONENT(ident) const RopeMethodDef& method_##ident();
#include "rope/rope_list.h"

// A scaling whose table does not depend on the current length: computed once.
class StaticRopeScaling final : public RopeScaling {
 public:
  StaticRopeScaling(RopeTable t, std::string desc) : t_(std::move(t)), desc_(std::move(desc)) {}
  RopeTable table(int64_t) const override { return t_; }
  std::string describe() const override { return desc_; }

 private:
  RopeTable t_;
  std::string desc_;
};

// Shared formulas, in double (tables are tiny; float rounding happens once at the end).
// θ_i = base^(-2i/n_rot), i = 0 .. n_rot/2 - 1.
std::vector<double> plain_theta(int64_t n_rot, double base);
// A table from per-pair frequencies and a cos/sin factor.
RopeTable make_table(const std::vector<double>& theta, double mscale, const RopeModelInfo& info);
// YaRN's correction range as the YaRN reference code and llama.cpp compute it: the pair index
// where a pair's wavelength fits `beta_fast` (low) and `beta_slow` (high) times into l0,
// floored/ceiled and clamped to [0, n_rot - 1].
std::pair<double, double> yarn_corr_range(int64_t n_rot, int64_t l0, double base,
                                          double beta_fast, double beta_slow);
// YaRN's attention factor on cos and sin (so on q and k each): 0.1 ln s + 1 for s > 1.
double yarn_mscale(double s);

// MrRoPE (rope_mrrope.cpp): θ'_i = θ_i / s^E(i) with E = 0 up to YaRN's low, 1 from high, and
// band_exponent(q = i - low, n = high - low) in between; the keys both variants accept.
Expected<std::unique_ptr<RopeScaling>> make_mrrope(const RopeArgs& args,
                                                   const RopeModelInfo& info, const char* name,
                                                   double (*band_exponent)(double q, double n));
std::vector<KeyDef> mrrope_keys();

}  // namespace lc::rope_detail
