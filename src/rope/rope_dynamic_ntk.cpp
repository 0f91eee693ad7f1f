// `dynamic-ntk`: dynamic NTK scaling.
// emozilla 2023, "Dynamically Scaled RoPE further increases performance of long context LLaMA
// with zero fine-tuning" (reddit r/LocalLLaMA; HF transformers' "dynamic" rope_type). At
// current length n:
//   n <= L0:  plain RoPE (θ_i = b^(-2i/d));
//   n >  L0:  b' = b · ((s·n/L0) − (s−1))^(d/(d−2)).
// The table changes as the sequence grows, so keys cached under an older base drift: the
// caller either keeps pre-RoPE keys and re-rotates, or accepts the drift (as HF does).
#include <fmt/format.h>

#include <cmath>

#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

class DynamicNtk final : public RopeScaling {
 public:
  DynamicNtk(double s, int64_t l0, double base, RopeModelInfo info, std::string desc)
      : s_(s), l0_(l0), base_(base), info_(std::move(info)), desc_(std::move(desc)) {}

  RopeTable table(int64_t n_ctx) const override {
    double base = base_;
    if (n_ctx > l0_) {
      const double d = static_cast<double>(info_.gguf.n_rot);
      const double ratio = s_ * static_cast<double>(n_ctx) / static_cast<double>(l0_) - (s_ - 1.0);
      base *= std::pow(ratio, d / (d - 2.0));
    }
    return make_table(plain_theta(info_.gguf.n_rot, base), 1.0, info_);
  }
  bool dynamic() const override { return true; }
  std::string describe() const override { return desc_; }

 private:
  double s_;
  int64_t l0_;
  double base_;
  RopeModelInfo info_;
  std::string desc_;
};

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  if (info.gguf.n_rot <= 2)
    return make_error(fmt::format("rope dynamic-ntk: needs n_rot > 2, model has n_rot={}",
                                  info.gguf.n_rot));
  RopeModelInfo copy;  // only the table layout is kept, not the metadata rope_freqs
  copy.gguf.n_rot = info.gguf.n_rot;
  copy.gguf.neox = info.gguf.neox;
  return std::unique_ptr<RopeScaling>(new DynamicNtk(args.real("factor"), args.integer("orig"),
                                                     args.real("base"), std::move(copy),
                                                     args.canonical("dynamic-ntk")));
}

}  // namespace

const RopeMethodDef& method_dynamic_ntk() {
  static const RopeMethodDef def{
      "dynamic-ntk",
      "NTK base recomputed from the current length n > L0: b' = b*((s*n/L0)-(s-1))^(d/(d-2))",
      "emozilla, \"Dynamically Scaled RoPE further increases performance of long context LLaMA "
      "with zero fine-tuning\", r/LocalLLaMA, 2023 (transformers' dynamic NTK)",
      {{"factor", KeyKind::kFactor, nullptr, "scale s"},
       {"orig", KeyKind::kPositiveInt, kDefaultCtxTrain, "original context L0"},
       {"base", KeyKind::kPositive, kDefaultBase, "rope base b"}},
      &make};
  return def;
}

}  // namespace lc::rope_detail
