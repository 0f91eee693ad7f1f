// `mrrope-uni`: MrRoPE-Uni, uniform radix conversion across the band.
// "MrRoPE: Mixed-radix Rotary Position Embedding", ICLR 2026 (seeds/000).
// Every digit in YaRN's band gets the same radix factor, λ_j = s^(1/n), so the cumulative
// exponent climbs linearly in the pair index:
//   E(q) = q / n,   θ'_i = θ_i / s^((i − low)/(high − low))  for low < i < high,
// a geometric ramp of the divisor where YaRN ramps the frequency linearly. Outside the band as
// YaRN (θ_i below low, θ_i/s from high), cos/sin × (0.1 ln s + 1). Framework: rope_mrrope.cpp.
// Source: the constant λ in the band is the paper's definition ("λ_j = λ_{j+1}" for middle
// digits); the exact indexing (band from YaRN's floor/ceil corr dims, E = (i−low)/(high−low))
// is the authors' public code (github.com/mattian7/mrRoPE, LlamaYaRNRadix.yarn_radix).
#include "rope/rope_method.h"

namespace lc::rope_detail {

namespace {

double uniform(double q, double n) { return q / n; }

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  return make_mrrope(args, info, "mrrope-uni", &uniform);
}

}  // namespace

const RopeMethodDef& method_mrrope_uni() {
  static const RopeMethodDef def{
      "mrrope-uni",
      "MrRoPE-Uni: divisor s^((i-low)/(high-low)) across YaRN's band",
      "\"MrRoPE: Mixed-radix Rotary Position Embedding\", ICLR 2026 (seeds/000)",
      mrrope_keys(), &make};
  return def;
}

}  // namespace lc::rope_detail
