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
    out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
    for_each_head(c, s.n_head_kv, [&](int64_t h) {
      std::vector<float> K;
      read_head_keys(*c.kv, il, h, K);
      auto& r = out.by_kv_head[static_cast<size_t>(h)];
      const int64_t n = c.kv->n_tokens(il, h), d = s.head_dim;
      r.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        double a = 0;
        for (int64_t e = 0; e < d; ++e) a += static_cast<double>(K[static_cast<size_t>(j * d + e)]) * K[static_cast<size_t>(j * d + e)];
        r[static_cast<size_t>(j)] = -static_cast<float>(std::sqrt(a));
      }
    });
    return Status::ok();
  }
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_knorm(Args&, const PressShape&) {
  return std::unique_ptr<PressScorer>(std::make_unique<Knorm>());
}

}  // namespace lc::press
