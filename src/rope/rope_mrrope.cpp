// The framework both MrRoPE methods share (rope_mrrope_uni.cpp, rope_mrrope_pro.cpp).
// "MrRoPE: Mixed-radix Rotary Position Embedding", ICLR 2026 (seeds/000): RoPE
// read as writing position m in radix β = b^(2/d); extending the context multiplies the radix
// of digit j by λ_j, so pair i's frequency is divided by the product of the λ of the digits
// below it:
//   θ'_i = θ_i / Π_{j<i} λ_j = θ_i / s^E(i),   λ_j = s^ε_j,   E(i) = Σ_{j<i} ε_j ∈ [0, 1].
// PI is E ≡ 1, NTK is ε uniform over all digits. Both MrRoPE methods leave pairs up to YaRN's
// `low` unchanged (E = 0), divide pairs from `high` on by s (E = 1), and differ only in how E
// climbs across the band q = i − low ∈ [0, n], n = high − low. low/high are YaRN's correction
// range as the authors' code computes it (floor/ceil of the pair index, beta_fast = 32,
// beta_slow = 1), and the attention factor is YaRN's 0.1 ln s + 1 on cos/sin.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "rope/rope_method.h"

namespace lc::rope_detail {

Expected<std::unique_ptr<RopeScaling>> make_mrrope(const RopeArgs& args,
                                                   const RopeModelInfo& info, const char* name,
                                                   double (*band_exponent)(double q, double n)) {
  const double s = args.real("factor");
  const double base = args.real("base");
  const double alpha = args.real("alpha"), beta = args.real("beta");
  if (!(beta > alpha))
    return make_error(
        fmt::format("rope {}: beta ({:g}) must be greater than alpha ({:g})", name, beta, alpha));
  const auto [low, high] = yarn_corr_range(info.gguf.n_rot, args.integer("orig"), base, beta, alpha);
  const double n = high - low;
  auto theta = plain_theta(info.gguf.n_rot, base);
  for (size_t i = 0; i < theta.size(); ++i) {
    const double q = static_cast<double>(i) - low;
    double e;
    if (q <= 0.0) {
      e = 0.0;
    } else if (q >= n) {
      e = 1.0;
    } else {
      e = band_exponent(q, n);
    }
    theta[i] /= std::pow(s, e);
  }
  const double mscale = args.real("attn_factor") * yarn_mscale(s);
  return std::unique_ptr<RopeScaling>(
      new StaticRopeScaling(make_table(theta, mscale, info), args.canonical(name)));
}

std::vector<KeyDef> mrrope_keys() {
  return {{"factor", KeyKind::kFactor, nullptr, "scale s = L'/L0"},
          {"orig", KeyKind::kPositiveInt, kDefaultCtxTrain, "original context L0"},
          {"base", KeyKind::kPositive, kDefaultBase, "rope base b"},
          {"alpha", KeyKind::kPositive, "1", "band end: turns over L0 (YaRN beta_slow)"},
          {"beta", KeyKind::kPositive, "32", "band start: turns over L0 (YaRN beta_fast)"},
          {"attn_factor", KeyKind::kPositive, "1", "extra factor on cos/sin"}};
}

}  // namespace lc::rope_detail
