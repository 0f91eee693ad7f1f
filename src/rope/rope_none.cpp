// `none`: plain RoPE, no scaling.
// Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding".
//   pair i = 0 .. d/2-1 of a vector at position m rotates by m·θ_i, θ_i = b^(-2i/d).
// Unlike `gguf`, this ignores the metadata's scaling and rope_freqs: the model as trained
// before any extension, and the baseline every method is compared with.
#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  const auto theta = plain_theta(info.gguf.n_rot, args.real("base"));
  return std::unique_ptr<RopeScaling>(
      new StaticRopeScaling(make_table(theta, 1.0, info), args.canonical("none")));
}

}  // namespace

const RopeMethodDef& method_none() {
  static const RopeMethodDef def{
      "none", "plain RoPE, theta_i = base^(-2i/d), no scaling",
      "Su et al., \"RoFormer: Enhanced Transformer with Rotary Position Embedding\", arXiv 2104.09864, 2021",
      {{"base", KeyKind::kPositive, kDefaultBase, "rope base b (rope_theta)"}},
      &make};
  return def;
}

}  // namespace lc::rope_detail
