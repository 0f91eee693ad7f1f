// SnapKV — Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation",
// NeurIPS 2024. The last w prompt queries (the observation window) predict what generation
// will attend:
//   a_j   = (1/w) sum_{t in window} softmax_j(q_t . k_j * scale)    (causal)
//   s_j   = avgpool_kernel(a)_j    (zero padding, kernel 5: keeps the neighbours of a hit)
// per query head; the framework reduces over the GQA group. The window's own tokens are not
// pooled (as the authors' code) and score +max: they are what the window is.
// PyramidKV uses the same scores with per-layer budgets (press.cpp). SpecKV, a relative with a
// draft's lookahead, has its own file (press_speckv.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <string>
#include <utility>

#include "kernels/kernels.h"
#include "kv/press_impl.h"

namespace lc::press {
namespace {

class SnapKv final : public PressScorer {
 public:
  SnapKv(int64_t obs, int64_t kernel, bool max_pool) : obs_(obs), kernel_(kernel), max_pool_(max_pool) {}
  std::string name() const override { return "snapkv"; }
  std::string params() const override {
    return fmt::format("obs={},kernel={},pool={}", obs_, kernel_, max_pool_ ? "max" : "avg");
  }
  int64_t n_obs() const override { return obs_; }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    std::vector<float> qr;
    rotate_queries(c, il, s, qr);
    const int64_t g = s.n_head / s.n_head_kv;
    out.by_query_head.resize(static_cast<size_t>(s.n_head));
    const int64_t first_obs = obs_seq_index(c, il, 0);
    for_each_head(c, s.n_head_kv, [&](int64_t h) {
      std::vector<float> K, P, a;
      read_head_keys(*c.kv, il, h, K);
      const int64_t n = c.kv->n_tokens(il, h);
      const int32_t* idx = c.kv->seq_index(il, h);
      // Tokens before the first observation query are pooled; the window's own score +max.
      const int64_t n_pre = std::lower_bound(idx, idx + n, static_cast<int32_t>(first_obs)) - idx;
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
        window_probs(c, il, s, qr.data(), hq, K.data(), n, P);
        a.assign(static_cast<size_t>(n), 0.0f);
        for (int64_t t = 0; t < c.n_obs; ++t)
          for (int64_t j = 0; j < n_pre; ++j) a[static_cast<size_t>(j)] += P[static_cast<size_t>(t * n + j)];
        const float inv_w = c.n_obs > 0 ? 1.0f / static_cast<float>(c.n_obs) : 0.0f;
        auto& r = out.by_query_head[static_cast<size_t>(hq)];
        r.assign(static_cast<size_t>(n), FLT_MAX);
        kernels::pool_seq(a.data(), n_pre, kernel_, max_pool_, inv_w, r.data());
      }
    });
    return ok_status();
  }

 private:
  int64_t obs_, kernel_;
  bool max_pool_;
};

constexpr const char* kObsHelp =
    "last prompt queries whose attention scores the tokens (observation window; also the default window), tokens";
constexpr const char* kKernelHelp = "pooling size along the sequence (odd): keeps the neighbours of a hit, tokens";
constexpr const char* kPoolHelp = "avg or max pooling of the window's attention";

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_snapkv(Args& a, const PressShape&) {
  LC_ASSIGN_OR_RETURN(int64_t obs, a.integer("obs", 64, 1, 1 << 20, kObsHelp));
  LC_ASSIGN_OR_RETURN(int64_t kernel, a.integer("kernel", 5, 1, 1025, kKernelHelp));
  if (kernel % 2 == 0)
    return make_error(fmt::format("kv press {}: kernel={}: expected an odd size", a.name(), kernel));
  LC_ASSIGN_OR_RETURN(std::string pool, a.choice("pool", "avg", {"avg", "max"}, kPoolHelp));
  return std::unique_ptr<PressScorer>(std::make_unique<SnapKv>(obs, kernel, pool == "max"));
}

}  // namespace lc::press
