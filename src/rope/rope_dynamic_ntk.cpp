// `dynamic-ntk`: dynamic NTK scaling.
// emozilla 2023, "Dynamically Scaled RoPE further increases performance of long context LLaMA
// with zero fine-tuning" (reddit r/LocalLLaMA; HF transformers' "dynamic" rope_type). At
// current length n:
//   n <= L0:  plain RoPE (θ_i = b^(-2i/d));
//   n >  L0:  b' = b · ((s·n/L0) − (s−1))^(d/(d−2)).
// The table changes as the sequence grows. What happens to keys already cached is the `cache`
// key:
//   append    (default) each key keeps the table of the length reached by the call that
//             appended it, and queries use the current length's table: what transformers does
//             when it generates with a KV cache (`dynamic_rope_update` recomputes inv_freq from
//             max(position_ids) + 1 and rotates only the new tokens' q and k). A prompt
//             evaluated in one call is rotated with its full length's table, as there. Linear
//             cost; a key is rotated once.
//   rerotate  every cached key is re-rotated to the current table whenever it changes: what
//             the model computes without a cache (one forward over the whole sequence at the
//             current length). Quadratic in total; it needs f32 keys, since f16/q8_0 keys
//             would be rounded again at every step.
#include <fmt/format.h>

#include <cmath>

#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

class DynamicNtk final : public RopeScaling {
 public:
  DynamicNtk(double s, int64_t l0, double base, bool rerotate, RopeModelInfo info, std::string desc)
      : s_(s), l0_(l0), base_(base), rerotate_(rerotate), info_(std::move(info)), desc_(std::move(desc)) {}

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
  bool rerotates_cache() const override { return rerotate_; }
  std::string describe() const override { return desc_; }

 private:
  double s_;
  int64_t l0_;
  double base_;
  bool rerotate_;
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
                                                     args.real("base"), args.text("cache") == "rerotate",
                                                     std::move(copy),
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
       {"base", KeyKind::kPositive, kDefaultBase, "rope base b"},
       {"cache", KeyKind::kChoice, "append",
        "append: a cached key keeps the table of the length it was appended at (transformers' cache); "
        "rerotate: every cached key follows the current table (needs f32 keys; quadratic)",
        "append|rerotate"}},
      &make};
  return def;
}

}  // namespace lc::rope_detail
