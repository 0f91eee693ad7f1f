// Every method's table against its formula, at several (d, base, s, L0).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "rope_test_util.h"

namespace lc {
namespace {

using rope_test::expect_table;
using rope_test::model;
using rope_test::table_of;
using rope_test::theta;

struct Case {
  int64_t d;
  double base;
  double s;
  int64_t l0;
};
const Case kCases[] = {
    {64, 10000.0, 2.0, 2048},   {128, 10000.0, 4.0, 4096},  {128, 500000.0, 8.0, 8192},
    {128, 1000000.0, 16.0, 32768}, {96, 10000.0, 3.5, 4096}, {80, 100000.0, 32.0, 2048},
};

std::string name(const Case& c) { return fmt::format("d={} base={:g} s={:g} L0={}", c.d, c.base, c.s, c.l0); }
std::string num(double v) { return fmt::format("{:.17g}", v); }
double yarn_gain(double s) { return s <= 1 ? 1.0 : 0.1 * std::log(s) + 1.0; }

// YaRN's band in pair indices, as the reference code computes it (floor/ceil, clamped).
std::pair<double, double> band(const Case& c, double beta_fast = 32, double beta_slow = 1) {
  auto dim = [&](double turns) {
    return c.d * std::log(c.l0 / (turns * 2 * M_PI)) / (2 * std::log(c.base));
  };
  return {std::max(0.0, std::floor(dim(beta_fast))), std::min(c.d - 1.0, std::ceil(dim(beta_slow)))};
}

TEST(RopeTables, NoneIsPlainRope) {
  for (const Case& c : kCases) {
    const auto info = model(c.d, c.base, c.l0);
    expect_table(table_of("none", info), theta(c.d, c.base), 1.0, name(c));
    // base override
    expect_table(table_of("none:base=20000", info), theta(c.d, 20000.0), 1.0, name(c));
  }
}

TEST(RopeTables, NoneIgnoresMetadataScaling) {
  auto info = model(64, 10000.0, 4096);
  info.gguf.freq_scale = 0.25f;
  info.gguf.freq_factors.assign(32, 2.0f);
  expect_table(table_of("none", info), theta(64, 10000.0), 1.0, "none");
}

TEST(RopeTables, TableLayoutFollowsModel) {
  const auto t = table_of("yarn:factor=4", model(64, 10000.0, 4096, /*neox=*/true));
  EXPECT_EQ(t.n_rot, 64);
  EXPECT_TRUE(t.neox);
  EXPECT_EQ(t.inv_freq.size(), 32u);
}

TEST(RopeTables, LinearDividesByS) {
  for (const Case& c : kCases) {
    auto want = theta(c.d, c.base);
    for (double& w : want) w /= c.s;
    expect_table(table_of("linear:factor=" + num(c.s), model(c.d, c.base, c.l0)), want, 1.0, name(c));
  }
}

TEST(RopeTables, NtkChangesBase) {
  for (const Case& c : kCases) {
    const double b2 = c.base * std::pow(c.s, double(c.d) / (c.d - 2.0));
    const auto t = table_of("ntk:factor=" + num(c.s), model(c.d, c.base, c.l0));
    expect_table(t, theta(c.d, b2), 1.0, name(c));
    // The defining property: the lowest frequency is interpolated by exactly s, the highest kept.
    const auto plain = theta(c.d, c.base);
    EXPECT_NEAR(t.inv_freq.back(), plain.back() / c.s, 1e-6 * plain.back() / c.s) << name(c);
    EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
  }
}

TEST(RopeTables, DynamicNtkIsPlainUpToL0ThenFollowsFormula) {
  for (const Case& c : kCases) {
    const auto info = model(c.d, c.base, c.l0);
    auto s = make_rope_scaling("dynamic-ntk:factor=" + num(c.s), info);
    ASSERT_TRUE(s.has_value()) << s.error().message;
    EXPECT_TRUE((*s)->dynamic());
    for (int64_t n : {int64_t{1}, c.l0 / 2, c.l0}) expect_table((*s)->table(n), theta(c.d, c.base), 1.0, name(c));
    for (int64_t n : {c.l0 + 1, 2 * c.l0, int64_t(c.s * c.l0), 10 * c.l0}) {
      const double b2 = c.base * std::pow(c.s * double(n) / c.l0 - (c.s - 1), double(c.d) / (c.d - 2.0));
      expect_table((*s)->table(n), theta(c.d, b2), 1.0, name(c) + " n=" + std::to_string(n));
    }
  }
  // orig overrides n_ctx_train.
  auto s = make_rope_scaling("dynamic-ntk:factor=2,orig=1000", model(64, 10000.0, 4096));
  ASSERT_TRUE(s.has_value());
  expect_table((*s)->table(1000), theta(64, 10000.0), 1.0, "orig=1000 at 1000");
  const double b2 = 10000.0 * std::pow(2.0 * 2000 / 1000 - 1, 64.0 / 62.0);
  expect_table((*s)->table(2000), theta(64, b2), 1.0, "orig=1000 at 2000");
}

TEST(RopeTables, StaticMethodsIgnoreLength) {
  const auto info = model(64, 10000.0, 4096);
  for (const char* spec : {"none", "linear:factor=4", "ntk:factor=4", "yarn:factor=4", "llama3",
                           "mrrope-uni:factor=4", "mrrope-pro:factor=4", "gguf"}) {
    auto s = make_rope_scaling(spec, info);
    ASSERT_TRUE(s.has_value()) << spec;
    EXPECT_FALSE((*s)->dynamic()) << spec;
    EXPECT_EQ((*s)->table(1).inv_freq, (*s)->table(1 << 20).inv_freq) << spec;
  }
}

// YaRN, default (code) ramp: linear in the pair index across the floor/ceil band.
TEST(RopeTables, YarnCodeRampMatchesFormula) {
  for (const Case& c : kCases) {
    const auto [low, high] = band(c);
    auto want = theta(c.d, c.base);
    for (size_t i = 0; i < want.size(); ++i) {
      const double gamma = 1.0 - std::clamp((double(i) - low) / std::max(0.001, high - low), 0.0, 1.0);
      want[i] = (1 - gamma) * want[i] / c.s + gamma * want[i];
    }
    const std::string spec = "yarn:factor=" + num(c.s) + ",orig=" + std::to_string(c.l0);
    expect_table(table_of(spec, model(c.d, c.base, 1)), want, yarn_gain(c.s), name(c));
  }
}

// The acceptance check: `yarn` with llama.cpp-compatible parameters equals the llama.cpp rope.
TEST(RopeTables, YarnEqualsLlamaCppRope) {
  for (const Case& c : kCases) {
    for (bool neox : {false, true}) {
      LlamaCppRopeParams p;
      p.n_rot = c.d;
      p.neox = neox;
      p.base = static_cast<float>(c.base);
      p.freq_scale = static_cast<float>(1.0 / c.s);
      p.ext_factor = 1.0f;
      p.attn_factor = 1.0f;
      p.beta_fast = 32.0f;
      p.beta_slow = 1.0f;
      p.orig_ctx = c.l0;
      const RopeTable ref = make_llama_cpp_rope(p);
      const auto t = table_of("yarn:factor=" + num(c.s), model(c.d, c.base, c.l0, neox));
      ASSERT_EQ(t.inv_freq.size(), ref.inv_freq.size());
      for (size_t i = 0; i < ref.inv_freq.size(); ++i)
        EXPECT_NEAR(t.inv_freq[i], ref.inv_freq[i], 1e-6 * ref.inv_freq[i]) << name(c) << " " << i;
      EXPECT_NEAR(t.mscale, ref.mscale, 1e-6 * ref.mscale) << name(c);
      EXPECT_EQ(t.neox, ref.neox);
      EXPECT_EQ(t.n_rot, ref.n_rot);
    }
  }
  // Non-default band and attention factor map onto llama.cpp's beta_fast/beta_slow/attn_factor.
  LlamaCppRopeParams p;
  p.n_rot = 128;
  p.base = 10000.0f;
  p.freq_scale = 0.25f;
  p.ext_factor = 1.0f;
  p.attn_factor = 0.9f;
  p.beta_fast = 16.0f;
  p.beta_slow = 2.0f;
  p.orig_ctx = 4096;
  const RopeTable ref = make_llama_cpp_rope(p);
  const auto t = table_of("yarn:factor=4,alpha=2,beta=16,attn_factor=0.9", model(128, 10000.0, 4096));
  for (size_t i = 0; i < ref.inv_freq.size(); ++i)
    EXPECT_NEAR(t.inv_freq[i], ref.inv_freq[i], 1e-6 * ref.inv_freq[i]) << i;
  EXPECT_NEAR(t.mscale, ref.mscale, 1e-6);
}

// YaRN, paper ramp: γ linear in r_i = L0/λ_i.
TEST(RopeTables, YarnPaperRampMatchesFormula) {
  for (const Case& c : kCases) {
    auto want = theta(c.d, c.base);
    const auto plain = want;
    for (double& w : want) {
      const double r = c.l0 / (2 * M_PI / w);
      const double gamma = r < 1 ? 0.0 : r > 32 ? 1.0 : (r - 1) / 31.0;
      w = (1 - gamma) * w / c.s + gamma * w;
    }
    const std::string spec = "yarn:factor=" + num(c.s) + ",ramp=paper";
    const auto t = table_of(spec, model(c.d, c.base, c.l0));
    expect_table(t, want, yarn_gain(c.s), name(c));
    // Outside the code ramp's (wider, rounded) band the two ramps agree: keep below low,
    // divide by s above high.
    const auto code = table_of("yarn:factor=" + num(c.s), model(c.d, c.base, c.l0));
    const auto [low, high] = band(c);
    for (size_t i = 0; i < plain.size(); ++i) {
      if (double(i) < low || double(i) > high) {
        EXPECT_NEAR(t.inv_freq[i], code.inv_freq[i], 1e-6 * code.inv_freq[i]) << name(c) << " " << i;
      }
    }
  }
}

TEST(RopeTables, GgufEqualsLlamaCppRope) {
  auto info = model(64, 10000.0, 4096);
  info.gguf.freq_scale = 0.5f;
  info.gguf.ext_factor = 1.0f;
  info.gguf.freq_factors.resize(32);
  for (size_t i = 0; i < 32; ++i) info.gguf.freq_factors[i] = 1.0f + 0.1f * float(i);
  const RopeTable ref = make_llama_cpp_rope(info.gguf);
  for (const char* spec : {"", "gguf", "  gguf  "}) {
    const auto t = table_of(spec, info);
    EXPECT_EQ(t.inv_freq, ref.inv_freq) << "'" << spec << "'";
    EXPECT_EQ(t.mscale, ref.mscale);
  }
}

double llama3_oracle(double th, double s, double l0, double low, double high) {
  const double wl = 2 * M_PI / th;
  if (wl < l0 / high) return th;
  if (wl > l0 / low) return th / s;
  const double smooth = (l0 / wl - low) / (high - low);
  return (1 - smooth) * th / s + smooth * th;
}

TEST(RopeTables, Llama3MatchesFormula) {
  // Defaults are Llama 3.1's: s=8, low=1, high=4, L0=8192, whatever the model's n_ctx_train.
  {
    auto want = theta(128, 500000.0);
    for (double& w : want) w = llama3_oracle(w, 8, 8192, 1, 4);
    expect_table(table_of("llama3", model(128, 500000.0, 131072)), want, 1.0, "defaults");
  }
  for (const Case& c : kCases) {
    for (auto [low, high] : {std::pair{1.0, 4.0}, std::pair{2.0, 8.0}}) {
      auto want = theta(c.d, c.base);
      for (double& w : want) w = llama3_oracle(w, c.s, c.l0, low, high);
      const std::string spec = "llama3:factor=" + num(c.s) + ",orig=" + std::to_string(c.l0) +
                               ",low=" + num(low) + ",high=" + num(high);
      expect_table(table_of(spec, model(c.d, c.base, 1)), want, 1.0, name(c));
    }
  }
}

// In GGUF, Llama 3.1's scaling is the rope_freqs tensor of per-pair divisors: plain RoPE with
// those divisors (the `gguf` path) must equal the `llama3` method.
TEST(RopeTables, Llama3EqualsGgufRopeFreqs) {
  auto info = model(128, 500000.0, 131072);
  const auto plain = theta(128, 500000.0);
  for (double th : plain)
    info.gguf.freq_factors.push_back(static_cast<float>(th / llama3_oracle(th, 8, 8192, 1, 4)));
  const auto a = table_of("gguf", info);
  const auto b = table_of("llama3", info);  // the override ignores rope_freqs: same result
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(a.inv_freq[i], b.inv_freq[i], 1e-6 * b.inv_freq[i]) << i;
}

TEST(RopeTables, MrRopeUniMatchesFormula) {
  for (const Case& c : kCases) {
    const auto [low, high] = band(c);
    auto want = theta(c.d, c.base);
    for (size_t i = 0; i < want.size(); ++i) {
      const double e = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      want[i] /= std::pow(c.s, e);
    }
    const auto t = table_of("mrrope-uni:factor=" + num(c.s), model(c.d, c.base, c.l0));
    expect_table(t, want, yarn_gain(c.s), name(c));
    // Uniform radix conversion: every digit in the band gets the same factor λ = s^(1/n), i.e.
    // consecutive pairs' frequency ratios are all multiplied by the same λ.
    const auto plain = theta(c.d, c.base);
    const double lambda = std::pow(c.s, 1.0 / (high - low));
    for (int64_t i = int64_t(low); i < int64_t(high) && i + 1 < int64_t(plain.size()); ++i) {
      const double ratio = (t.inv_freq[i] / t.inv_freq[i + 1]) / (plain[i] / plain[i + 1]);
      EXPECT_NEAR(ratio, lambda, 1e-5 * lambda) << name(c) << " digit " << i;
    }
  }
}

TEST(RopeTables, MrRopeProMatchesFormula) {
  for (const Case& c : kCases) {
    const auto [low, high] = band(c);
    const int64_t n = int64_t(high - low);
    // The paper's digit factors: λ_k = s^ε_k, ε_k = 2k/(n(n+1)) for band digits k = 1..n,
    // and pair i is divided by the product of the factors of the digits below it.
    std::vector<double> eps(static_cast<size_t>(n + 1), 0.0);
    for (int64_t k = 1; k <= n; ++k) eps[k] = 2.0 * k / (double(n) * (n + 1));
    auto want = theta(c.d, c.base);
    for (size_t i = 0; i < want.size(); ++i) {
      const int64_t q = std::clamp<int64_t>(int64_t(i) - int64_t(low), 0, n);
      double e = 0;
      for (int64_t k = 1; k <= q; ++k) e += eps[k];
      want[i] /= std::pow(c.s, e);
    }
    const auto t = table_of("mrrope-pro:factor=" + num(c.s), model(c.d, c.base, c.l0));
    expect_table(t, want, yarn_gain(c.s), name(c));
    // Progressive: the per-digit factors grow across the band (λ_j < λ_{j+1}).
    const auto plain = theta(c.d, c.base);
    double prev = 0;
    for (int64_t i = int64_t(low); i < int64_t(high) && i + 1 < int64_t(plain.size()); ++i) {
      const double lam = (t.inv_freq[i] / t.inv_freq[i + 1]) / (plain[i] / plain[i + 1]);
      EXPECT_GT(lam, prev * (1 + 1e-7)) << name(c) << " digit " << i;
      prev = lam;
    }
  }
}

// A point checked against a third party's reconstruction of the authors' table (dim 128,
// base 500000, L0 8192, s 16: band [18, 35], n = 17, gain 1.2772588722239782).
TEST(RopeTables, MrRopeProKnownPoint) {
  const auto t = table_of("mrrope-pro:factor=16,orig=8192", model(128, 500000.0, 131072));
  const auto plain = theta(128, 500000.0);
  EXPECT_NEAR(t.mscale, 1.2772588722239782, 1e-6);
  EXPECT_NEAR(t.inv_freq[18], plain[18], 1e-7 * plain[18]);           // last unchanged pair
  EXPECT_NEAR(t.inv_freq[35], plain[35] / 16, 1e-6 * plain[35] / 16);  // first fully divided
  const double e19 = 2.0 / (17 * 18);                                 // q = 1
  EXPECT_NEAR(t.inv_freq[19], plain[19] / std::pow(16.0, e19), 1e-6 * plain[19]);
  EXPECT_LT(t.inv_freq[34], plain[34] / std::pow(16.0, 0.8));         // q = 16: e = 16*17/(17*18)
}

// Where Uni and Pro agree: the band ends. Pro disturbs high frequencies less.
TEST(RopeTables, MrRopeVariantsShareBandEnds) {
  const auto info = model(128, 10000.0, 4096);
  const auto uni = table_of("mrrope-uni:factor=8", info);
  const auto pro = table_of("mrrope-pro:factor=8", info);
  const auto yarn = table_of("yarn:factor=8", info);
  const auto [low, high] = band({128, 10000.0, 8.0, 4096});
  for (size_t i = 0; i < uni.inv_freq.size(); ++i) {
    if (double(i) <= low || double(i) >= high) {
      EXPECT_FLOAT_EQ(uni.inv_freq[i], pro.inv_freq[i]) << i;
      EXPECT_NEAR(uni.inv_freq[i], yarn.inv_freq[i], 1e-6 * yarn.inv_freq[i]) << i;
    } else {
      EXPECT_GT(pro.inv_freq[i], uni.inv_freq[i]) << i;
    }
  }
  EXPECT_EQ(uni.mscale, yarn.mscale);
}

}  // namespace
}  // namespace lc
