// `mrrope-pro`: MrRoPE-Pro, progressive radix conversion across the band.
// "MrRoPE: Mixed-radix Rotary Position Embedding", ICLR 2026 (seeds/000).
// The radix factors grow across the band (λ_j < λ_{j+1}): higher-frequency digits, which carry
// fine local position, are disturbed little and low-frequency ones, which go out of
// distribution, a lot. With λ_j = s^ε_j, ε an arithmetic sequence over the n = high − low band
// digits with Σε = 1, the paper gives ε_k = 2k/(n(n+1)), k = 1..n, so
//   E(q) = Σ_{k≤q} ε_k = q(q + 1) / (n(n + 1)),   θ'_i = θ_i / s^E(i − low)  for low < i < high.
// Outside the band as YaRN (θ_i below low, θ_i/s from high), cos/sin × (0.1 ln s + 1).
// Framework: rope_mrrope.cpp.
// Source: the ε formula is the paper's (its digit index is 1-based, ε_j = 2(1+j−d_l) /
// ((1+d_h−d_l)(d_h−d_l))); the exact offset (q = i − low with YaRN's 0-based floor/ceil corr
// dims) is the authors' public code (github.com/mattian7/mrRoPE,
// LlamaYaRNRadix.yarn_radix3), which a third-party audit reports bit-identical to the
// conference supplement's LlamaMrRoPE.pro().
#include "rope/rope_method.h"

namespace lc::rope_detail {

namespace {

double progressive(double q, double n) { return q * (q + 1.0) / (n * (n + 1.0)); }

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  return make_mrrope(args, info, "mrrope-pro", &progressive);
}

}  // namespace

const RopeMethodDef& method_mrrope_pro() {
  static const RopeMethodDef def{
      "mrrope-pro",
      "MrRoPE-Pro: divisor s^(q(q+1)/(n(n+1))), q = i-low, n = high-low across YaRN's band",
      "\"MrRoPE: Mixed-radix Rotary Position Embedding\", ICLR 2026 (seeds/000)",
      mrrope_keys(), &make};
  return def;
}

}  // namespace lc::rope_detail
