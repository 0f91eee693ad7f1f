// SpecPC: parameters, the draft-attention scores and the selection (see press_spec.h).
#include "kv/press_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kv/press_impl.h"

namespace lc {

int64_t PromptCompression::kept(int64_t n) const {
  if (budget >= 0) return std::min(budget, n);
  if (ratio >= 0) return std::min<int64_t>(n, static_cast<int64_t>(std::floor((1.0 - ratio) * static_cast<double>(n) + 1e-9)));
  return n;
}

std::vector<float> specpc_scores(const KvCache& kv, const PressShape& s, const std::vector<const float*>& queries,
                                 const int32_t* q_pos, const int32_t* q_seq, int64_t n_q, int64_t n_win,
                                 int64_t n_prompt, const PromptCompression& p) {
  const int64_t H = s.n_head, d = s.head_dim, g = s.n_head / s.n_head_kv;
  const double scale = press::attn_scale(s);
  std::vector<double> best(static_cast<size_t>(n_prompt), 0.0);
  std::vector<float> qr, K;
  std::vector<double> z;
  for (int64_t il = specpc_first_layer(p, kv.n_layer()); il < kv.n_layer(); ++il) {
    if (static_cast<size_t>(il) >= queries.size() || !queries[static_cast<size_t>(il)]) continue;
    qr.assign(queries[static_cast<size_t>(il)], queries[static_cast<size_t>(il)] + n_q * H * d);
    const RopeTable& rt = kv.rope(il);
    if (rt.n_rot > 0) rt.apply(qr.data(), n_q, H, d, q_pos);
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      press::read_head_keys(kv, il, h, K);
      const int64_t nk = kv.n_tokens(il, h);
      const int32_t* idx = kv.seq_index(il, h);
      z.resize(static_cast<size_t>(nk));
      for (int64_t t = 0; t < n_q; ++t) {
        const int64_t vis = std::upper_bound(idx, idx + nk, q_seq[t]) - idx;
        if (vis == 0) continue;
        const double w = t < n_win ? (p.weighted && n_win > 1 ? static_cast<double>(t) / static_cast<double>(n_win - 1) : 1.0) : 1.0;
        for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
          const float* q = qr.data() + (t * H + hq) * d;
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < vis; ++j) {
            double a = 0;
            for (int64_t e = 0; e < d; ++e) a += static_cast<double>(q[e]) * K[static_cast<size_t>(j * d + e)];
            z[static_cast<size_t>(j)] = a * scale;
            mx = std::max(mx, z[static_cast<size_t>(j)]);
          }
          double tot = 0;
          for (int64_t j = 0; j < vis; ++j) tot += (z[static_cast<size_t>(j)] = std::exp(z[static_cast<size_t>(j)] - mx));
          for (int64_t j = 0; j < vis && idx[j] < n_prompt; ++j) {
            const double v = w * z[static_cast<size_t>(j)] / tot;
            double& b = best[static_cast<size_t>(idx[j])];
            b = p.reduce_max ? std::max(b, v) : b + v;
          }
        }
      }
    }
  }
  return std::vector<float>(best.begin(), best.end());
}

std::vector<int32_t> specpc_select(const std::vector<float>& scores, int64_t keep, const PromptCompression& p) {
  const int64_t n = static_cast<int64_t>(scores.size());
  std::vector<int32_t> out;
  if (keep >= n) {
    for (int64_t j = 0; j < n; ++j) out.push_back(static_cast<int32_t>(j));
    return out;
  }
  if (keep <= 0) return out;
  // Centred max-pool with zero padding (scores are >= 0).
  const int64_t k = std::max<int64_t>(1, p.kernel), left = (k - 1) / 2;
  std::vector<float> pooled(static_cast<size_t>(n), 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    float m = 0.0f;
    for (int64_t i = std::max<int64_t>(0, j - left); i <= std::min(n - 1, j - left + k - 1); ++i)
      m = std::max(m, scores[static_cast<size_t>(i)]);
    pooled[static_cast<size_t>(j)] = m;
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) order[static_cast<size_t>(j)] = static_cast<int32_t>(j);
  auto better = [&](int32_t a, int32_t b) {
    return pooled[static_cast<size_t>(a)] > pooled[static_cast<size_t>(b)] ||
           (pooled[static_cast<size_t>(a)] == pooled[static_cast<size_t>(b)] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
  order.resize(static_cast<size_t>(keep));
  // Neighbour offsets, nearest first (the negative one first on equal distance).
  const int64_t nb = std::max<int64_t>(1, p.neighbours);
  std::vector<int64_t> adj;
  for (int64_t o = -((nb - 1) / 2); o <= nb - 1 - (nb - 1) / 2; ++o) adj.push_back(o);
  std::stable_sort(adj.begin(), adj.end(), [](int64_t a, int64_t b) { return std::llabs(a) < std::llabs(b); });
  std::vector<uint8_t> taken(static_cast<size_t>(n), 0);
  auto take = [&](int64_t j) {
    if (static_cast<int64_t>(out.size()) >= keep || taken[static_cast<size_t>(j)]) return;
    taken[static_cast<size_t>(j)] = 1;
    out.push_back(static_cast<int32_t>(j));
  };
  for (int64_t j = std::max<int64_t>(0, n - p.window); j < n; ++j) take(j);
  for (int32_t i : order)
    for (int64_t o : adj) take(std::clamp<int64_t>(i + o, 0, n - 1));
  std::sort(out.begin(), out.end());
  return out;
}

namespace press {

Expected<PromptCompression> parse_specpc(Args& a) {
  PromptCompression p;
  if (a.has("ratio") && a.has("budget"))
    return make_error("kv press specpc: give ratio= or budget=, not both");
  LC_ASSIGN_OR_RETURN(p.budget, a.integer("budget", -1, 1, INT32_MAX,
                                          "prompt tokens kept, at least window (not with ratio=)"));
  LC_ASSIGN_OR_RETURN(p.ratio, a.number("ratio", -1, 0, 1,
                                        "fraction of the prompt removed before prefill (0.5 when neither ratio= "
                                        "nor budget= is given)"));
  if (p.budget < 0 && p.ratio < 0) p.ratio = 0.5;
  LC_ASSIGN_OR_RETURN(p.window, a.integer("window", 64, 1, 1 << 20,
                                          "last prompt tokens, always kept; the draft's queries of them score the "
                                          "prompt, tokens"));
  LC_ASSIGN_OR_RETURN(p.lookahead, a.integer("lookahead", 8, 1, 4096,
                                             "tokens the draft generates after the prompt; the queries of the first "
                                             "lookahead - 1 also score, tokens"));
  LC_ASSIGN_OR_RETURN(p.kernel, a.integer("kernel", 64, 1, 1 << 16,
                                          "max-pool size over the scores along the sequence, tokens"));
  LC_ASSIGN_OR_RETURN(p.neighbours, a.integer("neighbours", p.kernel, 1, 1 << 16,
                                              "tokens kept around each selected token, itself included (default: "
                                              "kernel)"));
  LC_ASSIGN_OR_RETURN(p.start_layer, a.integer("start_layer", 8, 0, 1 << 16,
                                               "first draft layer whose attention scores (clamped to its last "
                                               "layer), layers"));
  LC_ASSIGN_OR_RETURN(int64_t w, a.integer("weighted", 1, 0, 1,
                                           "1: the window's queries weigh linearly 0..1, later ones more; 0: "
                                           "equally"));
  p.weighted = w == 1;
  LC_ASSIGN_OR_RETURN(std::string red, a.choice("reduce", "max", {"max", "sum"},
                                                "how the scores combine over draft layers, heads and queries"));
  p.reduce_max = red == "max";
  if (p.budget >= 0 && p.budget < p.window)
    return make_error(fmt::format("kv press specpc: budget={} is below window = {}", p.budget,
                                  p.window));
  return p;
}

std::string specpc_spec(const PromptCompression& p, bool aware) {
  std::string s = "specpc:";
  if (p.budget >= 0) s += fmt::format("budget={},", p.budget);
  else s += fmt::format("ratio={:g},", p.ratio);
  s += fmt::format("window={},lookahead={},kernel={},neighbours={},start_layer={},weighted={},reduce={},query={}",
                   p.window, p.lookahead, p.kernel, p.neighbours,
                   p.start_layer, p.weighted ? 1 : 0, p.reduce_max ? "max" : "sum", aware ? "aware" : "agnostic");
  return s;
}

}  // namespace press
}  // namespace lc
