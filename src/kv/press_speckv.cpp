// SpecKV — Galim et al., "Draft-based Approximate Inference for LLMs", arXiv 2506.08373, 2025
// (official code: furiosa-ai/draft-based-approx-llm, draft_approx_llm/speckv/). A small draft
// model answers the prompt first; the target runs the draft's answer (the lookahead) after the
// prompt, and the queries of the last `obs` prompt tokens and of the lookahead tokens score the
// prompt's keys, per KV head h:
//   p_{t,j} = softmax over every key the query sees, the lookahead's own keys included, of
//             q_t . k_j * scale          (one row per query head of h's group and query t)
//   a_j     = max over (group x queries) of p_{t,j}     (reduce=mean: the mean over the same)
//   s_j     = maxpool_kernel(a)_j  (kernel 7; pool=avg: zero-padded mean over the kernel)
// for the prompt tokens j before the observation window; the window's own tokens are kept
// (they score +max), and the lookahead tokens leave the cache again. The reduction runs over
// group x queries jointly BEFORE the pooling, as the authors' compress_kv (speckv/util.py), so
// this scorer returns one row per KV head itself.
//
// Defaults are those of the authors' paper configs (cfg/paper/speckv/**: window_size 32,
// kernel_size 7, pool_type max, reduction_type max, lookahead_tokens null = the answer's
// max_new_tokens). Their code scores with and keeps window_size + 1 prompt tokens (the window
// covers the last prompt token, which is cropped and recomputed when decoding starts), so
// obs=33 here is their window_size=32, and budget=C+1 is their max_capacity_prompt=C.
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/kernels.h"
#include "kv/press_impl.h"

namespace lc::press {
namespace {

class SpecKv final : public PressScorer {
 public:
  SpecKv(int64_t obs, int64_t lookahead, int64_t kernel, bool max_pool, bool reduce_max, bool sparse,
         int64_t vertical, int64_t slash)
      : obs_(obs), lookahead_(lookahead), kernel_(kernel), max_pool_(max_pool), reduce_max_(reduce_max),
        sparse_(sparse), vertical_(vertical), slash_(slash) {}
  std::string prefill_attention(int64_t window) const override {
    if (!sparse_) return "";
    return fmt::format("vslash:vertical={},slash={},obs={},kernel={},pool={},reduce={}", vertical_, slash_, window,
                       kernel_, max_pool_ ? "max" : "avg", reduce_max_ ? "max" : "mean");
  }
  std::string name() const override { return "speckv"; }
  std::string params() const override {
    std::string s = fmt::format("obs={},lookahead={},kernel={},pool={}", obs_,
                                lookahead_ == kLookaheadAnswer ? std::string("answer") : std::to_string(lookahead_),
                                kernel_, max_pool_ ? "max" : "avg");
    if (sparse_) s += fmt::format(",prefill=sparse,vertical={},slash={}", vertical_, slash_);
    return s;
  }
  // The prompt's observation queries; the lookahead queries come on top (PressContext).
  int64_t n_obs() const override { return obs_; }
  int64_t default_window() const override { return obs_; }
  bool default_reduce_max() const override { return true; }
  int64_t lookahead() const override { return lookahead_; }

  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    const int64_t la = c.n_lookahead;
    if (la < 0 || la > c.n_obs)
      return make_error(fmt::format("kv press speckv: {} lookahead queries among {} observation queries", la, c.n_obs));
    if (la > 0 && !c.lookahead_keys)
      return make_error(fmt::format("kv press speckv: {} lookahead queries but no lookahead keys", la));
    std::vector<float> qr;
    rotate_queries(c, il, s, qr);
    const int64_t d = s.head_dim, H = s.n_head, g = s.n_head / s.n_head_kv;
    const float scale = attn_scale(s);
    const int64_t first_obs = c.n_obs > 0 ? obs_seq_index(c, il, 0) : c.kv->n_appended(il);
    // Sequence index of lookahead key u: that of its query, the u-th of the last la (ascending).
    std::vector<int64_t> la_seq(static_cast<size_t>(la));
    for (int64_t u = 0; u < la; ++u) la_seq[static_cast<size_t>(u)] = obs_seq_index(c, il, c.n_obs - la + u);
    out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
    for_each_head(c, s.n_head_kv, [&](int64_t h) {
      std::vector<float> K, logit;
      read_head_keys(*c.kv, il, h, K);
      const int64_t n = c.kv->n_tokens(il, h);
      const int32_t* idx = c.kv->seq_index(il, h);
      const float* LK = la > 0 ? c.lookahead_keys + h * la * d : nullptr;
      // Tokens before the first observation query are scored; the window's own tokens +max.
      const int64_t n_pre = std::lower_bound(idx, idx + n, static_cast<int32_t>(first_obs)) - idx;
      std::vector<float> a(static_cast<size_t>(n_pre), 0.0f);
      logit.resize(static_cast<size_t>(n + la));
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq)
        for (int64_t t = 0; t < c.n_obs; ++t) {
          const float* q = qr.data() + (t * H + hq) * d;
          const int64_t qs = obs_seq_index(c, il, t);
          // Causal: held keys and lookahead keys at or before the query (both ascending).
          const int64_t vis = std::upper_bound(idx, idx + n, static_cast<int32_t>(qs)) - idx;
          const int64_t vis_la = std::upper_bound(la_seq.begin(), la_seq.end(), qs) - la_seq.begin();
          if (vis + vis_la == 0) continue;
          float mx = -std::numeric_limits<float>::infinity();
          auto dot = [&](const float* k) {
            float acc = 0;
            for (int64_t e = 0; e < d; ++e) acc += q[e] * k[e];
            return acc * scale;
          };
          for (int64_t j = 0; j < vis; ++j) mx = std::max(mx, logit[static_cast<size_t>(j)] = dot(K.data() + j * d));
          for (int64_t u = 0; u < vis_la; ++u)
            mx = std::max(mx, logit[static_cast<size_t>(n + u)] = dot(LK + u * d));
          double sum = 0;
          for (int64_t j = 0; j < vis; ++j) sum += (logit[static_cast<size_t>(j)] = std::exp(logit[static_cast<size_t>(j)] - mx));
          for (int64_t u = 0; u < vis_la; ++u) sum += std::exp(logit[static_cast<size_t>(n + u)] - mx);
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j < std::min(vis, n_pre); ++j) {
            const float p = logit[static_cast<size_t>(j)] * inv;
            float& x = a[static_cast<size_t>(j)];
            x = reduce_max_ ? std::max(x, p) : x + p;
          }
        }
      if (!reduce_max_ && c.n_obs > 0)
        for (float& x : a) x /= static_cast<float>(g * c.n_obs);
      auto& r = out.by_kv_head[static_cast<size_t>(h)];
      r.assign(static_cast<size_t>(n), FLT_MAX);
      kernels::pool_seq(a.data(), n_pre, kernel_, max_pool_, 1.0f, r.data());
    });
    return ok_status();
  }

 private:
  int64_t obs_, lookahead_, kernel_;
  bool max_pool_, reduce_max_, sparse_;
  int64_t vertical_, slash_;
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_speckv(Args& a, const PressShape&) {
  LC_ASSIGN_OR_RETURN(int64_t obs, a.integer("obs", 33, 1, 1 << 20,
                                             "last prompt queries that score (with the lookahead's) and the default "
                                             "window; 33 is the authors' window_size 32 (their window also covers the "
                                             "last prompt token), tokens"));
  LC_ASSIGN_OR_RETURN(std::string las, a.text("lookahead", "answer",
                                              "tokens the draft generates greedily after the prompt (stopping after an "
                                              "end-of-generation token); their queries and keys also score. answer: "
                                              "the request's max new tokens (32 where the runtime generates none), "
                                              "tokens"));
  int64_t la = kLookaheadAnswer;
  if (las != "answer") {
    const auto r = std::from_chars(las.data(), las.data() + las.size(), la);
    if (las.empty() || r.ec != std::errc() || r.ptr != las.data() + las.size() || la < 1 || la > (1 << 20))
      return make_error(fmt::format("kv press {}: lookahead={}: expected answer or an integer in [1, {}]", a.name(),
                                    las, 1 << 20));
  }
  LC_ASSIGN_OR_RETURN(int64_t kernel, a.integer("kernel", 7, 1, 1025,
                                                "pooling size along the sequence (odd): keeps the neighbours of a hit, "
                                                "tokens"));
  if (kernel % 2 == 0)
    return make_error(fmt::format("kv press {}: kernel={}: expected an odd size", a.name(), kernel));
  LC_ASSIGN_OR_RETURN(std::string pool, a.choice("pool", "max", {"avg", "max"},
                                                 "max or avg (zero-padded) pooling of the reduced attention"));
  LC_ASSIGN_OR_RETURN(std::string red, a.choice("reduce", "max", {"mean", "max"},
                                                "how the attention of a KV head's query heads and observation queries "
                                                "becomes one row: max or mean over group x queries jointly, before "
                                                "the pooling"));
  LC_ASSIGN_OR_RETURN(std::string prefill, a.choice("prefill", "dense", {"dense", "sparse"},
                                                    "dense: the prompt is prefilled by the context's attention and the "
                                                    "draft's answer runs after it; sparse (the authors' code): the "
                                                    "prompt and the answer in one pass (-b at least their length) with "
                                                    "the vertical-slash attention above vertical + slash tokens, then "
                                                    "the answer and the last prompt token are cropped and that token "
                                                    "evaluated again over the compressed cache"));
  LC_ASSIGN_OR_RETURN(int64_t vertical, a.integer("vertical", 2048, 1, int64_t{1} << 30,
                                                  "prefill=sparse: vertical tokens (prefill_vertical_size), tokens"));
  LC_ASSIGN_OR_RETURN(int64_t slash, a.integer("slash", 2048, 0, int64_t{1} << 30,
                                               "prefill=sparse: the band of recent keys (prefill_window_size, a "
                                               "multiple of 64), tokens"));
  if (slash % 64 != 0)
    return make_error(fmt::format("kv press {}: slash={}: expected a multiple of 64", a.name(), slash));
  return std::unique_ptr<PressScorer>(std::make_unique<SpecKv>(obs, la, kernel, pool == "max", red == "max",
                                                               prefill == "sparse", vertical, slash));
}

}  // namespace lc::press
