// `linear`: position interpolation (PI).
// Chen et al. 2023, "Extending Context Window of Large Language Models via Positional
// Interpolation": positions are squeezed by s = L'/L0, i.e. θ'_i = θ_i / s.
#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  auto theta = plain_theta(info.gguf.n_rot, args.real("base"));
  const double s = args.real("factor");
  for (double& t : theta) t /= s;
  return std::unique_ptr<RopeScaling>(
      new StaticRopeScaling(make_table(theta, 1.0, info), args.canonical("linear")));
}

}  // namespace

const RopeMethodDef& method_linear() {
  static const RopeMethodDef def{
      "linear", "position interpolation: theta_i / s",
      "Chen et al., \"Extending Context Window of Large Language Models via Positional "
      "Interpolation\", arXiv 2306.15595, 2023",
      {{"factor", KeyKind::kFactor, nullptr, "scale s = L'/L0"},
       {"base", KeyKind::kPositive, kDefaultBase, "rope base b"}},
      &make};
  return def;
}

}  // namespace lc::rope_detail
