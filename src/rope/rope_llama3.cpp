// `llama3`: the Llama 3.1 frequency rule.
// Meta 2024, "The Llama 3 Herd of Models" / Llama 3.1 reference code (apply_scaling) and HF
// transformers' "llama3" rope_type. With λ_i = 2π/θ_i:
//   λ_i < L0/high:  θ'_i = θ_i                       (high frequencies kept)
//   λ_i > L0/low:   θ'_i = θ_i / s                   (low frequencies interpolated)
//   otherwise:      smooth = (L0/λ_i − low)/(high − low),
//                   θ'_i = (1 − smooth) · θ_i / s + smooth · θ_i
// Defaults are Llama 3.1's: s = 8, low = 1, high = 4, L0 = 8192. No attention factor. In GGUF
// this arrives as the rope_freqs tensor of per-pair divisors θ_i/θ'_i, which `gguf` applies.
#include <fmt/format.h>

#include <cmath>

#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  const double s = args.real("factor");
  const double l0 = static_cast<double>(args.integer("orig"));
  const double low = args.real("low"), high = args.real("high");
  if (!(high > low))
    return make_error(fmt::format("rope llama3: high ({:g}) must be greater than low ({:g})", high, low));
  auto theta = plain_theta(info.gguf.n_rot, args.real("base"));
  const double high_wavelen = l0 / high, low_wavelen = l0 / low;
  for (double& t : theta) {
    const double wavelen = 2.0 * M_PI / t;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      t /= s;
    } else {
      const double smooth = (l0 / wavelen - low) / (high - low);
      t = (1.0 - smooth) * t / s + smooth * t;
    }
  }
  return std::unique_ptr<RopeScaling>(
      new StaticRopeScaling(make_table(theta, 1.0, info), args.canonical("llama3")));
}

}  // namespace

const RopeMethodDef& method_llama3() {
  static const RopeMethodDef def{
      "llama3", "Llama 3.1 rule: keep wavelengths < L0/high, divide > L0/low by s, blend between",
      "Llama Team, \"The Llama 3 Herd of Models\", arXiv 2407.21783, 2024 (rope_scaling type llama3)",
      {{"factor", KeyKind::kFactor, "8", "scale s"},
       {"orig", KeyKind::kPositiveInt, "8192", "original context L0 (Llama 3: 8192)"},
       {"low", KeyKind::kPositive, "1", "low_freq_factor"},
       {"high", KeyKind::kPositive, "4", "high_freq_factor"},
       {"base", KeyKind::kPositive, kDefaultBase, "rope base b"}},
      &make};
  return def;
}

}  // namespace lc::rope_detail
