// SimLayerKV — Zhang et al., "SimLayerKV: A Simple Framework for Layer-Level KV Cache
// Reduction", arXiv 2410.13846, 2024; as kvpress's SimLayerKVPress (NVIDIA/kvpress,
// kvpress/presses/simlayerkv_press.py, its SKLV-decode criterion with n_last = 1). A layer whose
// last queries look almost only at the first and the most recent tokens is "lazy": it keeps only
// those. Per layer, after prefill, with k_len the tokens the layer holds:
//   a_j   = mean over EVERY query head (all n_head: the GQA groups share their KV head's keys) and
//           the last n_last prompt queries of the causal softmax over all k_len keys, for
//           j < k_len - n_last (the softmax covers the last n_last keys, the sum leaves them out:
//           SnapKVPress.compute_window_attention drops the window's columns)
//   score = sum_{j < n_initial} a_j + sum_{k_len - n_last - n_recent <= j < k_len - n_last} a_j
//   lazy  = score > lazy_threshold   (strict, a float compared once per layer)
// A lazy layer keeps, in every KV head, its first n_initial tokens and its last n_recent - n_last
// (kvpress: keys[:, :, -n_recent + n_last:]); another layer keeps everything. Nothing happens when
// lazy_threshold = 1 (kvpress's default: no layer can be lazy; the recommended values are Llama 3
// 0.9, Llama 2 0.65, Mistral 0.8, Qwen 0.85) or when the layer holds k_len <= n_initial + n_recent
// + n_last tokens. Positions: the first tokens and the last ones by their place in the head's
// held tokens, as kvpress indexes its cache.
// Achieved compression, kvpress's compression_ratio: the mean over the layers of the fraction
// removed (kvpress writes it (k_len - n_initial - n_recent + 1) / k_len, the same for its
// n_last = 1), logged at info level after the last layer with the lazy layers.
// n_recent = n_last is refused: kvpress's keys[-0:] would keep the whole cache after the initial
// tokens, i.e. the initial tokens twice.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/log.h"
#include "kv/press_impl.h"

namespace lc::press {
namespace {

struct SimLayerOptions {
  double lazy_threshold = 1.0;
  int64_t n_last = 1, n_recent = 1024, n_initial = 4;
  bool query_aware = true;
};

class SimLayerKvPress final : public KvPress {
 public:
  SimLayerKvPress(SimLayerOptions o, const PressShape& s) : o_(o), shape_(s) {
    sched_.after_prefill = true;
    sched_.query_aware = o.query_aware;
  }
  std::string spec() const override {
    return fmt::format("simlayerkv:lazy_threshold={},n_last={},n_recent={},n_initial={},query={}", o_.lazy_threshold,
                       o_.n_last, o_.n_recent, o_.n_initial, o_.query_aware ? "aware" : "agnostic");
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override { return o_.n_last; }

  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override {
    keep.clear();
    if (!sched_.covers(c.phase)) return ok_status();
    const KvCache& kv = *c.kv;
    if (il < 0 || il >= kv.n_layer())
      return make_error(fmt::format("kv press simlayerkv: layer {} out of range", il));
    if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim)
      return make_error(fmt::format("kv press simlayerkv: the cache has {} KV heads of dim {}, the press was made "
                                    "for {} of dim {}",
                                    kv.n_head_kv(), kv.head_dim(), shape_.n_head_kv, shape_.head_dim));
    if (il == 0) {  // a new pass over the layers (kvpress re-initialises at layer 0)
      lazy_.assign(static_cast<size_t>(kv.n_layer()), 0);
      ratio_.assign(static_cast<size_t>(kv.n_layer()), 0.0);
    }
    const Status st = decide(c, il, keep);
    if (il == kv.n_layer() - 1 && st) report();
    return st;
  }

 private:
  Status decide(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) {
    const KvCache& kv = *c.kv;
    const int64_t Hkv = kv.n_head_kv(), g = shape_.n_head / shape_.n_head_kv;
    const int64_t min_length = o_.n_initial + o_.n_recent + o_.n_last;
    // Every head must hold more than min_length tokens (all hold k_len after a plain prefill).
    for (int64_t h = 0; h < Hkv; ++h)
      if (kv.n_tokens(il, h) <= min_length) return ok_status();
    if (o_.lazy_threshold == 1.0) return ok_status();
    const int64_t m = std::min(c.n_obs, o_.n_last);  // queries used: the last m given
    if (m <= 0) return ok_status();
    if (!c.queries || !c.query_pos)
      return make_error(fmt::format("kv press simlayerkv: n_obs={} but no queries given", c.n_obs));
    std::vector<float> qr;
    rotate_queries(c, il, shape_, qr);
    std::vector<double> part(static_cast<size_t>(Hkv), 0.0);
    for_each_head(c, Hkv, [&](int64_t h) {
      std::vector<float> K, P;
      read_head_keys(kv, il, h, K);
      const int64_t n = kv.n_tokens(il, h), cols = n - o_.n_last;
      double acc = 0;
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
        window_probs(c, il, shape_, qr.data(), hq, K.data(), n, P);
        for (int64_t t = c.n_obs - m; t < c.n_obs; ++t) {
          const float* p = P.data() + t * n;
          for (int64_t j = 0; j < o_.n_initial; ++j) acc += p[j];
          for (int64_t j = cols - o_.n_recent; j < cols; ++j) acc += p[j];
        }
      }
      part[static_cast<size_t>(h)] = acc;
    });
    double score = 0;
    for (double x : part) score += x;
    score /= static_cast<double>(shape_.n_head * m);
    if (!(score > o_.lazy_threshold)) return ok_status();
    lazy_[static_cast<size_t>(il)] = 1;
    keep.assign(static_cast<size_t>(Hkv), {});
    int64_t held = 0, kept = 0;
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t n = kv.n_tokens(il, h);
      auto& k = keep[static_cast<size_t>(h)];
      for (int64_t j = 0; j < o_.n_initial; ++j) k.push_back(static_cast<int32_t>(j));
      for (int64_t j = n - (o_.n_recent - o_.n_last); j < n; ++j) k.push_back(static_cast<int32_t>(j));
      held += n;
      kept += static_cast<int64_t>(k.size());
    }
    ratio_[static_cast<size_t>(il)] = static_cast<double>(held - kept) / static_cast<double>(held);
    return ok_status();
  }

  // kvpress's compression_ratio: the mean over the layers of the fraction each removed.
  void report() const {
    std::string which;
    double mean = 0;
    int64_t n_lazy = 0;
    for (size_t il = 0; il < lazy_.size(); ++il) {
      mean += ratio_[il];
      if (!lazy_[il]) continue;
      if (!which.empty()) which += ',';
      which += std::to_string(il);
      ++n_lazy;
    }
    mean /= static_cast<double>(std::max<size_t>(1, lazy_.size()));
    LC_LOG_INFO("kv press simlayerkv: {} of {} layers lazy ({}), compression {:.4f}", n_lazy, lazy_.size(),
                which.empty() ? "none" : which, mean);
  }

  SimLayerOptions o_;
  PressShape shape_;
  PressSchedule sched_;
  std::vector<uint8_t> lazy_;   // [n_layer] of the last pass
  std::vector<double> ratio_;   // [n_layer] fraction removed in the last pass
};

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_simlayerkv(Args& a, const PressShape& s) {
  SimLayerOptions o;
  LC_ASSIGN_OR_RETURN(o.lazy_threshold,
                      a.number("lazy_threshold", 1.0, 0, 1,
                               "a layer is lazy when the mean attention of its last n_last queries on the first "
                               "n_initial + last n_recent tokens exceeds this; 1: never (kvpress's default); the "
                               "paper's: Llama 3 0.9, Llama 2 0.65, Mistral 0.8, Qwen 0.85"));
  LC_ASSIGN_OR_RETURN(o.n_last, a.integer("n_last", 1, 1, 1 << 20,
                                          "last prompt queries whose attention decides (1: SKLV-decode), tokens"));
  LC_ASSIGN_OR_RETURN(o.n_recent, a.integer("n_recent", 1024, 1, INT32_MAX,
                                            "recent tokens counted in the score; a lazy layer keeps the last "
                                            "n_recent - n_last of them, tokens"));
  LC_ASSIGN_OR_RETURN(o.n_initial, a.integer("n_initial", 4, 0, INT32_MAX,
                                             "first tokens counted in the score and kept by a lazy layer, tokens"));
  LC_ASSIGN_OR_RETURN(std::string q, a.choice("query", "aware", {"aware", "agnostic"},
                                              "aware: compress with the whole prompt in; agnostic: after the "
                                              "context, before the question is read (run --question, bench run)"));
  o.query_aware = q == "aware";
  if (o.n_recent <= o.n_last)
    return make_error(fmt::format("kv press simlayerkv: n_recent={} must exceed n_last={} (a lazy layer keeps the "
                                  "last n_recent - n_last tokens)",
                                  o.n_recent, o.n_last));
  return std::unique_ptr<KvPress>(std::make_unique<SimLayerKvPress>(o, s));
}

}  // namespace lc::press
