// `yarn`: YaRN (NTK-by-parts interpolation plus attention temperature).
// Peng, Quesnelle, Fan, Shippole 2023, "YaRN: Efficient Context Window Extension of Large
// Language Models", §3.2-3.4. With λ_i = 2π/θ_i the wavelength of pair i and r_i = L0/λ_i the
// number of turns it makes over the original context:
//   γ(r) = 0 if r < α, 1 if r > β, else (r − α)/(β − α)       (α = 1, β = 32 for Llama)
//   θ'_i = (1 − γ(r_i)) · θ_i / s + γ(r_i) · θ_i
//   cos and sin scaled by sqrt(1/t) = 0.1 ln s + 1 (so q and k each, the logits by 1/t).
// Pairs that turn many times keep their frequency, pairs that never complete a turn are
// interpolated as in PI, and those in between blend.
//
// Two ramps (key `ramp`):
//   code  (default) the authors' reference code and llama.cpp: the ramp is linear in the pair
//         index i between low = floor(i at r = β) and high = ceil(i at r = α), clamped to
//         [0, d-1]: γ_i = 1 − clamp((i − low)/max(0.001, high − low), 0, 1). Every YaRN model
//         was tuned with this one, and `gguf` reproduces it through make_llama_cpp_rope.
//   paper the formula above, γ linear in r_i (so exponential in i, no rounding of the band).
// Both agree outside the band; inside it they differ (the band is also up to one pair wider
// with `code` because of floor/ceil).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  const double s = args.real("factor");
  const double base = args.real("base");
  const int64_t l0 = args.integer("orig");
  const double alpha = args.real("alpha"), beta = args.real("beta");
  if (!(beta > alpha))
    return make_error(fmt::format("rope yarn: beta ({:g}) must be greater than alpha ({:g})", beta, alpha));
  auto theta = plain_theta(info.gguf.n_rot, base);
  if (args.text("ramp") == "code") {
    const auto [low, high] = yarn_corr_range(info.gguf.n_rot, l0, base, beta, alpha);
    for (size_t i = 0; i < theta.size(); ++i) {
      const double y = (static_cast<double>(i) - low) / std::max(0.001, high - low);
      const double gamma = 1.0 - std::clamp(y, 0.0, 1.0);
      theta[i] = (1.0 - gamma) * theta[i] / s + gamma * theta[i];
    }
  } else {
    for (double& t : theta) {
      const double r = static_cast<double>(l0) * t / (2.0 * M_PI);
      const double gamma = std::clamp((r - alpha) / (beta - alpha), 0.0, 1.0);
      t = (1.0 - gamma) * t / s + gamma * t;
    }
  }
  const double mscale = args.real("attn_factor") * yarn_mscale(s);
  return std::unique_ptr<RopeScaling>(
      new StaticRopeScaling(make_table(theta, mscale, info), args.canonical("yarn")));
}

}  // namespace

const RopeMethodDef& method_yarn() {
  static const RopeMethodDef def{
      "yarn",
      "NTK-by-parts ramp between alpha and beta turns over L0, cos/sin * (0.1 ln s + 1)",
      "Peng et al., \"YaRN: Efficient Context Window Extension of Large Language Models\", ICLR 2024",
      {{"factor", KeyKind::kFactor, nullptr, "scale s = L'/L0"},
       {"orig", KeyKind::kPositiveInt, kDefaultCtxTrain, "original context L0"},
       {"base", KeyKind::kPositive, kDefaultBase, "rope base b"},
       {"alpha", KeyKind::kPositive, "1", "turns below which a pair is interpolated (beta_slow)"},
       {"beta", KeyKind::kPositive, "32", "turns above which a pair is kept (beta_fast)"},
       {"ramp", KeyKind::kChoice, "code", "code: pair-index band as llama.cpp; paper: gamma(r)",
        "code|paper"},
       {"attn_factor", KeyKind::kPositive, "1", "extra factor on cos/sin (llama.cpp attn_factor)"}},
      &make};
  return def;
}

}  // namespace lc::rope_detail
