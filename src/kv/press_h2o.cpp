// H2O / observed attention — Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient
// Generative Inference of Large Language Models", NeurIPS 2023 (kvpress ObservedAttention).
// A token's score is the attention it has received, normalised by how many queries could see
// it (otherwise old tokens win just by being old):
//   s_j = sum_t softmax_j(q_t . k_j * scale) / #{t : t sees j}
// per query head; the framework reduces over the group.
// The sum runs over the observation window queries (the last obs=64 prompt tokens), not over
// every query of the prompt: the attention path does not feed an AttentionObserver yet. With
// an observer the same formula runs over all queries; the window is the recent part of it.
#include "kv/press_impl.h"

namespace lc::press {
namespace {

class H2o final : public PressScorer {
 public:
  explicit H2o(int64_t obs) : obs_(obs) {}
  std::string name() const override { return "h2o"; }
  std::string params() const override { return strprintf("obs=%lld", (long long)obs_); }
  int64_t n_obs() const override { return obs_; }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    std::vector<float> qr;
    rotate_queries(c, il, s, qr);
    const int64_t g = s.n_head / s.n_head_kv;
    out.by_query_head.resize(static_cast<size_t>(s.n_head));
    for_each_head(c, s.n_head_kv, [&](int64_t h) {
      std::vector<float> K, P;
      read_head_keys(*c.kv, il, h, K);
      const int64_t n = c.kv->n_tokens(il, h);
      const int32_t* idx = c.kv->seq_index(il, h);
      std::vector<float> seen(static_cast<size_t>(n), 0.0f);
      for (int64_t t = 0; t < c.n_obs; ++t) {
        const int64_t qs = obs_seq_index(c, il, t);
        for (int64_t j = 0; j < n && idx[j] <= qs; ++j) seen[static_cast<size_t>(j)] += 1.0f;
      }
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
        window_probs(c, il, s, qr.data(), hq, K.data(), n, P);
        auto& r = out.by_query_head[static_cast<size_t>(hq)];
        r.assign(static_cast<size_t>(n), 0.0f);
        for (int64_t t = 0; t < c.n_obs; ++t)
          for (int64_t j = 0; j < n; ++j) r[static_cast<size_t>(j)] += P[static_cast<size_t>(t * n + j)];
        for (int64_t j = 0; j < n; ++j)
          if (seen[static_cast<size_t>(j)] > 0) r[static_cast<size_t>(j)] /= seen[static_cast<size_t>(j)];
      }
    });
    return Status::ok();
  }

 private:
  int64_t obs_;
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_h2o(Args& a, const PressShape&) {
  LC_ASSIGN_OR_RETURN(int64_t obs, a.integer("obs", 64, 1, 1 << 20));
  return std::unique_ptr<PressScorer>(std::make_unique<H2o>(obs));
}

}  // namespace lc::press
