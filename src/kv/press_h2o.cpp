// H2O / observed attention — Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient
// Generative Inference of Large Language Models", NeurIPS 2023 (kvpress ObservedAttention).
// A token's score is the attention it has received, normalised by how many queries could see
// it (otherwise old tokens win just by being old):
//   s_j = sum_t softmax_j(q_t . k_j * scale) / #{t : t sees j}
// source=forward (default): the sum runs over EVERY query the model has evaluated (each
// prefill chunk and each decode step), fed by the model through this scorer's observer
// (AttentionAccumulator, press_observer.cpp), summed over the query heads of the GQA group
// and divided by the group size: the group reduction is the mean (reduce=max is refused).
// source=window: the sum runs over the observation window queries only (the last obs=64
// prompt tokens), per query head; the framework reduces over the group.
#include "kv/press_impl.h"

#include <fmt/format.h>
#include "kv/press_observer.h"

namespace lc::press {
namespace {

class H2o final : public PressScorer {
 public:
  H2o(int64_t obs, bool forward, const PressShape& shape)
      : obs_(obs), forward_(forward), acc_(shape) {}
  std::string name() const override { return "h2o"; }
  std::string params() const override {
    return fmt::format("obs={},source={}", obs_, forward_ ? "forward" : "window");
  }
  int64_t n_obs() const override { return forward_ ? 0 : obs_; }
  int64_t default_window() const override { return obs_; }
  AttentionObserver* observer() override { return forward_ ? &acc_ : nullptr; }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    if (forward_) {
      const int64_t g = s.n_head / s.n_head_kv;
      out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
      for (int64_t h = 0; h < s.n_head_kv; ++h) {
        const int64_t n = c.kv->n_tokens(il, h);
        const int32_t* idx = c.kv->seq_index(il, h);
        auto& r = out.by_kv_head[static_cast<size_t>(h)];
        r.resize(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) {
          const float cnt = acc_.count(il, idx[j]);
          r[static_cast<size_t>(j)] = cnt > 0 ? acc_.sum(il, h, idx[j]) / (static_cast<float>(g) * cnt) : 0.0f;
        }
      }
      return ok_status();
    }
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
    return ok_status();
  }

 private:
  int64_t obs_;
  bool forward_;
  AttentionAccumulator acc_;
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_h2o(Args& a, const PressShape& s) {
  LC_ASSIGN_OR_RETURN(int64_t obs, a.integer("obs", 64, 1, 1 << 20,
                                             "source=window: the last prompt queries whose attention is summed; "
                                             "either source: the default window, tokens"));
  LC_ASSIGN_OR_RETURN(std::string src, a.choice("source", "forward", {"forward", "window"},
                                                "forward: attention paid by every query the model evaluated "
                                                "(needs an exact --attn); window: by the last obs prompt queries"));
  if (src == "forward" && a.has("reduce")) {
    LC_ASSIGN_OR_RETURN(std::string red, a.choice("reduce", "mean", {"mean", "max"},
                                                  "how the per-query-head scores of a GQA group become one per KV "
                                                  "head (source=forward: mean only)"));
    if (red == "max")
      return make_error("kv press h2o: reduce=max needs per-head scores; source=forward accumulates per KV head "
                        "(use source=window for reduce=max)");
  }
  return std::unique_ptr<PressScorer>(std::make_unique<H2o>(obs, src == "forward", s));
}

}  // namespace lc::press
