// K-norm — Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression", EMNLP 2024. Keys of small norm draw high attention:
//   score(j) = -||k_j||_2
// RoPE is a rotation (times mscale, equal for all keys), so the norm of the stored post-RoPE
// key ranks tokens exactly as the pre-RoPE norm does.
#include "kv/press_impl.h"

namespace lc::press {
namespace {

class Knorm final : public PressScorer {
 public:
  std::string name() const override { return "knorm"; }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    score_heads_by_keys(c, il, s, out, [](const float* K, int64_t n, int64_t d, float* r) {
      for (int64_t j = 0; j < n; ++j) {
        double a = 0;
        for (int64_t e = 0; e < d; ++e) a += static_cast<double>(K[j * d + e]) * K[j * d + e];
        r[j] = -static_cast<float>(std::sqrt(a));
      }
    });
    return ok_status();
  }
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_knorm(Args&, const PressShape&) {
  return std::unique_ptr<PressScorer>(std::make_unique<Knorm>());
}

}  // namespace lc::press
