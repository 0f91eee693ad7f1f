// LagKV — Liang et al., "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
// Important", arXiv 2504.04704, 2025; as kvpress's LagKVPress (NVIDIA/kvpress,
// kvpress/presses/lagkv_press.py, unchanged since 90b5cde; read at 8bb29b9). Attention-free: a
// token matters when its key and value stand out against the NEXT stretch of the sequence.
// Per KV head, over the n tokens it holds (in sequence order):
//   - n < n_sink + 2 lag_size: nothing to lag against; the sinks score 1 and token n_sink + i
//     scores i / (n - n_sink) (the most recent win: a sliding window);
//   - else the tokens after the n_sink sinks are cut into P = floor((n - n_sink) / lag_size)
//     partitions of lag_size; the last partition and the remainder after it have no reference
//     and score 1 (always kept), as the sinks; partition p < P - 1 is scored against p + 1:
//       x_t[e] = (k_t[e] - min_r[e]) / (max_r[e] - min_r[e])     min/max over partition p + 1
//       sk_t   = softmax over the partition's lag_size tokens of std_e(x_t)   (unbiased std)
//       sv_t   = the same with the values;    s_t = (sk_t + sv_t) / 2
//     and, unless cross_scoring=1, s_t becomes its rank within the partition / lag_size (in
//     [0, 1), argsort of argsort: 0 for the smallest), so every partition keeps the same share
//     whatever the scale of its scores. cross_scoring=1 keeps the raw s_t (kvpress: for AdaKV).
// The framework then keeps floor((1 - ratio) n) per head by these scores (ScorerPress.compress's
// topk); n_sink is the same key the framework protects, so the sinks are the first n_sink tokens.
//
// Differences (docs/kv-press.md, "lagkv, chunkkv, block, decoding"): computed in double; the
// sliding-window ramp stays in double where kvpress casts it to the cache's dtype (bf16 ties
// neighbours); ties (equal scores) go to the lower token index, where torch's topk and argsort
// leave them unspecified — rank scores tie across partitions by construction, so at the cut the
// earlier partitions keep their token; a channel whose reference partition is constant
// (max == min) divides by zero in the reference (inf / NaN for the whole partition); here it
// contributes 0 to the std.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kv/press_impl.h"

namespace lc::press {
namespace {

class LagKv final : public PressScorer {
 public:
  LagKv(int64_t n_sink, int64_t lag, bool cross) : n_sink_(n_sink), lag_(lag), cross_(cross) {}
  std::string name() const override { return "lagkv"; }
  // n_sink is printed by the framework (the same key).
  std::string params() const override { return fmt::format("lag_size={},cross_scoring={}", lag_, cross_ ? 1 : 0); }
  int64_t default_window() const override { return 0; }
  int64_t default_sinks() const override { return n_sink_; }

  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
    const int64_t d = c.kv->head_dim(), dv = c.kv->head_dim_v();
    for_each_head(c, s.n_head_kv, [&](int64_t h) {
      const int64_t n = c.kv->n_tokens(il, h);
      auto& r = out.by_kv_head[static_cast<size_t>(h)];
      r.assign(static_cast<size_t>(n), 1.0f);
      if (n < n_sink_ + 2 * lag_) {
        // No compression in the reference: the sliding part ranks by recency.
        for (int64_t i = 0; n_sink_ + i < n; ++i)
          r[static_cast<size_t>(n_sink_ + i)] = static_cast<float>(static_cast<double>(i) / static_cast<double>(n - n_sink_));
        return;
      }
      std::vector<float> K, V(static_cast<size_t>(n * dv));
      read_head_keys(*c.kv, il, h, K);
      c.kv->read_values(il, h, 0, n, V.data());
      const int64_t parts = (n - n_sink_) / lag_;  // >= 2
      std::vector<double> sk, sv, sum(static_cast<size_t>(lag_));
      std::vector<int32_t> order(static_cast<size_t>(lag_));
      for (int64_t p = 0; p + 1 < parts; ++p) {
        const int64_t t0 = n_sink_ + p * lag_;
        partition_scores(K.data(), d, t0, sk);
        partition_scores(V.data(), dv, t0, sv);
        for (int64_t i = 0; i < lag_; ++i)
          sum[static_cast<size_t>(i)] = (sk[static_cast<size_t>(i)] + sv[static_cast<size_t>(i)]) / 2;
        float* dst = r.data() + t0;
        if (cross_) {
          for (int64_t i = 0; i < lag_; ++i) dst[i] = static_cast<float>(sum[static_cast<size_t>(i)]);
          continue;
        }
        // Rank within the partition (0: smallest), ties to the earlier token.
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
          return sum[static_cast<size_t>(a)] < sum[static_cast<size_t>(b)];
        });
        for (int64_t k = 0; k < lag_; ++k)
          dst[order[static_cast<size_t>(k)]] = static_cast<float>(static_cast<double>(k) / static_cast<double>(lag_));
      }
    });
    return ok_status();
  }

 private:
  // Softmax over partition [t0, t0 + lag) of the channel std of its rows min/max-normalised by
  // the next partition's per-channel range. X: [n, dim].
  void partition_scores(const float* X, int64_t dim, int64_t t0, std::vector<double>& out) const {
    std::vector<double> lo(static_cast<size_t>(dim), INFINITY), hi(static_cast<size_t>(dim), -INFINITY);
    for (int64_t t = t0 + lag_; t < t0 + 2 * lag_; ++t)
      for (int64_t e = 0; e < dim; ++e) {
        const double x = X[t * dim + e];
        lo[static_cast<size_t>(e)] = std::min(lo[static_cast<size_t>(e)], x);
        hi[static_cast<size_t>(e)] = std::max(hi[static_cast<size_t>(e)], x);
      }
    out.assign(static_cast<size_t>(lag_), 0.0);
    std::vector<double> x(static_cast<size_t>(dim));
    double mx = -INFINITY;
    for (int64_t i = 0; i < lag_; ++i) {
      const float* row = X + (t0 + i) * dim;
      double mean = 0;
      for (int64_t e = 0; e < dim; ++e) {
        const double range = hi[static_cast<size_t>(e)] - lo[static_cast<size_t>(e)];
        x[static_cast<size_t>(e)] = range > 0 ? (row[e] - lo[static_cast<size_t>(e)]) / range : 0.0;
        mean += x[static_cast<size_t>(e)];
      }
      mean /= static_cast<double>(dim);
      double var = 0;
      for (double v : x) var += (v - mean) * (v - mean);
      const double sd = dim > 1 ? std::sqrt(var / static_cast<double>(dim - 1)) : 0.0;  // torch.std: unbiased
      out[static_cast<size_t>(i)] = sd;
      mx = std::max(mx, sd);
    }
    double z = 0;
    for (double& v : out) z += (v = std::exp(v - mx));
    for (double& v : out) v /= z;
  }

  int64_t n_sink_, lag_;
  bool cross_;
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_lagkv(Args& a, const PressShape&) {
  // Read before the framework reads n_sink (same key, same default: the first read's help stays).
  LC_ASSIGN_OR_RETURN(int64_t n_sink, a.integer("n_sink", 4, 0, INT32_MAX,
                                                "first tokens of the sequence, never evicted and not partitioned "
                                                "(attention sinks), tokens"));
  LC_ASSIGN_OR_RETURN(int64_t lag, a.integer("lag_size", 128, 1, 1 << 20,
                                             "partition size: each partition is scored against the next one's "
                                             "key and value ranges; the last partition and the remainder are kept, "
                                             "tokens"));
  LC_ASSIGN_OR_RETURN(int64_t cross, a.integer("cross_scoring", 0, 0, 1,
                                               "1: keep the raw lag scores (comparable across partitions, for "
                                               "adakv); 0: rank within each partition (every partition keeps the "
                                               "same share)"));
  return std::unique_ptr<PressScorer>(std::make_unique<LagKv>(n_sink, lag, cross == 1));
}

}  // namespace lc::press
