// `ntk`: NTK-aware scaling.
// bloc97 2023, "NTK-Aware Scaled RoPE allows LLaMA models to have extended (8k+) context size
// without any fine-tuning" (reddit r/LocalLLaMA): change the base instead of the positions,
//   b' = b · s^(d/(d-2)),   θ'_i = b'^(-2i/d),
// so the lowest-frequency pair (i = d/2-1) is interpolated by exactly s and the highest
// (i = 0) is untouched.
#include <fmt/format.h>

#include <cmath>

#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  const double d = static_cast<double>(info.gguf.n_rot);
  if (info.gguf.n_rot <= 2)
    return make_error(fmt::format("rope ntk: needs n_rot > 2 (d/(d-2)), model has n_rot={}",
                                  info.gguf.n_rot));
  const double base = args.real("base") * std::pow(args.real("factor"), d / (d - 2.0));
  return std::unique_ptr<RopeScaling>(new StaticRopeScaling(
      make_table(plain_theta(info.gguf.n_rot, base), 1.0, info), args.canonical("ntk")));
}

}  // namespace

const RopeMethodDef& method_ntk() {
  static const RopeMethodDef def{
      "ntk", "NTK-aware base change: b' = b * s^(d/(d-2))",
      "bloc97, \"NTK-Aware Scaled RoPE allows LLaMA models to have extended (8k+) context size "
      "without any fine-tuning\", r/LocalLLaMA, 2023",
      {{"factor", KeyKind::kFactor, nullptr, "scale s = L'/L0"},
       {"base", KeyKind::kPositive, kDefaultBase, "rope base b before scaling"}},
      &make};
  return def;
}

}  // namespace lc::rope_detail
