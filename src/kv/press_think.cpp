// ThinK — Xu et al., "ThinK: Thinner Key Cache by Query-Driven Pruning", arXiv 2407.21018, 2024;
// as kvpress's ThinKPress (NVIDIA/kvpress, kvpress/presses/think_press.py). ThinK prunes key
// CHANNELS, not tokens: per layer, after prefill, for KV head h and channel e,
//   qn[h][e] = mean over the g query heads of h and the last `window` prompt queries of q_e^2
//              (post-RoPE queries, rotated as the stored keys)
//   kn[h][e] = mean over the tokens head h holds of k_e^2 (post-RoPE keys, as stored)
//   score    = qn * kn
// and the floor(head_dim * channel_ratio) channels of lowest score are set to zero in every held
// key of the head (ties: the lower channel first). Values, positions and token counts are left
// alone, and keys appended later (while generating) are not pruned.
// kvpress ZEROES the channels in place, so its cache keeps its size (it reports compression_ratio =
// channel_ratio / 2, the share of K+V that a storage without those channels would save). Here the
// channels are DROPPED from storage by default (store=drop, KvCache::drop_key_channels): each
// head's keys are stored again without them, in blocks that hold more tokens, and the old blocks
// go back to the pool, as ThinK's own code stores the pruned keys. What attention reads is the same
// as with zeroed channels (bit for bit for f32/f16/bf16 keys; q8_0 keys are quantised again over
// the kept channels). store=zero keeps kvpress's in-place zeroing. It composes with token presses by chaining,
// kvpress's ComposedPress: "snapkv:ratio=0.5+think:channel_ratio=0.5" scores the channels over
// the tokens SnapKV kept.
// Differences from kvpress: the default channel_ratio is 0.5 (kvpress's 0.0 does nothing), and a
// prompt shorter than `window` uses every prompt query (kvpress fails on it).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kv/press_impl.h"

namespace lc::press {
namespace {

struct ThinkOptions {
  double channel_ratio = 0.5;
  int64_t window = 32;
  bool query_aware = true;
  bool drop = true;  // store=drop: the channels leave storage; store=zero: zeroed in place (kvpress)
};

class ThinkPress final : public KvPress {
 public:
  ThinkPress(ThinkOptions o, const PressShape& s) : o_(o), shape_(s) {
    sched_.after_prefill = true;
    sched_.query_aware = o.query_aware;
  }
  std::string spec() const override {
    return fmt::format("think:channel_ratio={},window={},query={},store={}", o_.channel_ratio, o_.window,
                       o_.query_aware ? "aware" : "agnostic", o_.drop ? "drop" : "zero");
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override { return o_.window; }

  // No token leaves the cache: the work is in compress().
  Status select(const PressContext&, int64_t, std::vector<std::vector<int32_t>>& keep) override {
    keep.clear();
    return ok_status();
  }

  Status compress(const PressContext& c, int64_t il) override {
    if (!sched_.covers(c.phase)) return ok_status();
    KvCache& kv = *c.kv;
    if (il < 0 || il >= kv.n_layer()) return make_error(fmt::format("kv press think: layer {} out of range", il));
    if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
      return make_error(fmt::format("kv press think: the cache has {} KV heads of dim {}, the press was made for {} "
                                    "of dim {}",
                                    kv.n_head_kv(), kv.head_dim(), shape_.n_head_kv, shape_.head_dim));
    const int64_t d = shape_.head_dim, g = shape_.n_head / shape_.n_head_kv;
    const auto n_pruned = static_cast<int64_t>(static_cast<double>(d) * o_.channel_ratio);  // Python's int()
    if (n_pruned == 0 || c.n_obs <= 0) return ok_status();
    if (!c.queries || !c.query_pos)
      return make_error(fmt::format("kv press think: n_obs={} but no queries given", c.n_obs));
    const int64_t m = std::min(c.n_obs, o_.window);  // the last m queries given
    std::vector<float> qr;
    rotate_queries(c, il, shape_, qr);
    std::vector<std::vector<int32_t>> drop(static_cast<size_t>(shape_.n_head_kv));
    for_each_head(c, shape_.n_head_kv, [&](int64_t h) {
      const int64_t n = kv.n_tokens(il, h);
      if (n == 0) return;
      std::vector<double> qn(static_cast<size_t>(d), 0.0), kn(static_cast<size_t>(d), 0.0);
      for (int64_t t = c.n_obs - m; t < c.n_obs; ++t)
        for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
          const float* q = qr.data() + (t * shape_.n_head + hq) * d;
          for (int64_t e = 0; e < d; ++e) qn[static_cast<size_t>(e)] += static_cast<double>(q[e]) * q[e];
        }
      std::vector<float> K;
      read_head_keys(kv, il, h, K);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t e = 0; e < d; ++e) {
          const double x = K[static_cast<size_t>(j * d + e)];
          kn[static_cast<size_t>(e)] += x * x;
        }
      std::vector<double> score(static_cast<size_t>(d));
      for (int64_t e = 0; e < d; ++e)
        score[static_cast<size_t>(e)] = qn[static_cast<size_t>(e)] / static_cast<double>(m * g) *
                                        (kn[static_cast<size_t>(e)] / static_cast<double>(n));
      std::vector<int32_t> ch(static_cast<size_t>(d));
      std::iota(ch.begin(), ch.end(), 0);
      std::stable_sort(ch.begin(), ch.end(),
                       [&](int32_t a, int32_t b) { return score[static_cast<size_t>(a)] < score[static_cast<size_t>(b)]; });
      ch.resize(static_cast<size_t>(n_pruned));
      std::sort(ch.begin(), ch.end());
      drop[static_cast<size_t>(h)] = std::move(ch);
    });
    for (int64_t h = 0; h < shape_.n_head_kv; ++h) {
      const auto& ch = drop[static_cast<size_t>(h)];
      if (o_.drop)
        LC_TRY(kv.drop_key_channels(il, h, ch).status());
      else
        LC_TRY(kv.zero_key_channels(il, h, ch));
    }
    return ok_status();
  }

 private:
  ThinkOptions o_;
  PressShape shape_;
  PressSchedule sched_;
};

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_think(Args& a, const PressShape& s) {
  ThinkOptions o;
  LC_ASSIGN_OR_RETURN(o.channel_ratio,
                      a.number("channel_ratio", 0.5, 0, 1,
                               "fraction of each KV head's key channels pruned, floor(head_dim x ratio) of "
                               "them (kvpress's key_channel_compression_ratio; its default 0 does nothing)"));
  LC_ASSIGN_OR_RETURN(o.window, a.integer("window", 32, 1, INT32_MAX,
                                          "last prompt queries whose squared channels weigh the keys', tokens"));
  LC_ASSIGN_OR_RETURN(std::string q, a.choice("query", "aware", {"aware", "agnostic"},
                                              "aware: compress with the whole prompt in; agnostic: after the "
                                              "context, before the question is read (run --question, bench run)"));
  o.query_aware = q == "aware";
  LC_ASSIGN_OR_RETURN(std::string st, a.choice("store", "drop", {"drop", "zero"},
                                               "drop: the channels leave the cache's storage (its blocks hold more "
                                               "tokens, memory goes back to the pool); zero: set to zero in place, "
                                               "as kvpress (no memory saved)"));
  o.drop = st == "drop";
  return std::unique_ptr<KvPress>(std::make_unique<ThinkPress>(o, s));
}

}  // namespace lc::press
