// CriticalKV and CriticalAdaKV — Feng et al., "Identify Critical KV Cache in LLM Inference from an
// Output Perturbation Perspective", arXiv 2502.03805, 2025; as kvpress's CriticalKVPress and
// CriticalAdaKVPress (NVIDIA/kvpress, kvpress/presses/criticalkv_press.py). A token's attention
// score alone ignores what its value adds to the layer's output; the value projected through the
// output projection bounds that:
//   n_j = mean over the query heads hq of KV head h's group of || W_o[:, hq] v_j ||_1
// (W_o[:, hq]: the head_dim_v columns of query head hq; kvpress's vwl1norm, an L1 norm over the
// n_embd outputs). Over an inner scorer's scores s_j (any scorer press: inner=, default snapkv,
// kvpress's critical_snapkv; reduced over the GQA group as the frame does):
//
// criticalkv, per KV head, n_kept = floor((1 - ratio) n) (or budget=):
//   stage 1: the best floor((1 - ratio) n first_stage_ratio) by s stay (kvpress computes it
//            unfloored, (1 - ratio) * k_len * first_stage_ratio, then int());
//   stage 2: the rest of n_kept by (s_j + epsilon) n_j among the others.
// critical_adakv, per layer (AdaKV's head-wise budgets, then the two stages per head):
//   n_safe = floor(alpha n_kept) best by s per head are safe; the layer's n_head_kv x n_kept
//   entries go to the safe ones and then to the best s over every head: head h gets B_h;
//   stage 1: the best floor(B_h first_stage_ratio) by s (safe ones included) stay;
//   stage 2: the rest of B_h by (s_j + epsilon) n_j.
//
// The frame's protected tokens (n_sink, window: kvpress's SnapKV gives its window the top score)
// are the best of every order here and always stay: kvpress keeps them through stage 1 whenever
// the stage-one budget covers them (the defaults do from a few hundred tokens on); below that it
// scores the rest of them by (max + 1 + epsilon) n_j in stage 2, which keeps them unless a value
// norm is many times another's. The kept counts are exact (floor with a 1e-9 guard), as the frame.
// Prefill only (kvpress's CriticalKV is a prefill press). The inner scorer's ||v|| weighting, if
// it has one (expected_attention: vnorm=1), should be off: kvpress warns about it too.
// W_o comes from the model runtime (PressContext::out_proj), dequantised to f32 once per layer.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kv/press_impl.h"

namespace lc::press {
namespace {

struct CriticalOptions {
  BudgetKeys budget;
  int64_t n_sink = 0, window = 0;
  bool reduce_max = false;
  double epsilon = 1e-4, first_stage_ratio = 0.5, alpha = 0.2;
  bool ada = false;
};

// Higher score first, then lower index (the frame's deterministic order).
template <class T>
struct Higher {
  const T* s;
  bool operator()(int32_t a, int32_t b) const { return s[a] > s[b] || (s[a] == s[b] && a < b); }
};

class CriticalPress final : public KvPress {
 public:
  CriticalPress(CriticalOptions o, std::unique_ptr<PressScorer> sc, const PressShape& s)
      : o_(o), scorer_(std::move(sc)), shape_(s) {
    sched_.after_prefill = true;
    sched_.query_aware = o.budget.query_aware;
  }
  std::string spec() const override {
    std::string s = fmt::format("{}:{},inner={},n_sink={},window={},reduce={},eps={},first_stage_ratio={}", name(),
                                o_.budget.spec(), scorer_->name(), o_.n_sink, o_.window,
                                o_.reduce_max ? "max" : "mean", o_.epsilon, o_.first_stage_ratio);
    if (o_.ada) s += fmt::format(",alpha={}", o_.alpha);
    const std::string p = scorer_->params();
    return p.empty() ? s : s + "," + p;
  }
  const PressSchedule& schedule() const override { return sched_; }
  int64_t n_obs() const override { return scorer_->n_obs(); }
  AttentionObserver* observer() override { return scorer_->observer(); }
  int64_t lookahead() const override { return scorer_->lookahead(); }
  Status check_backend(const AttentionCaps& attn) const override {
    if (scorer_->observer() && !attn.exact)
      return make_error(fmt::format("kv press {}: inner={} accumulates the attention of the forward pass as dense "
                                    "softmax, but --attn {} attends a subset of the tokens or re-assigns their "
                                    "positions",
                                    name(), scorer_->name(), attn.spec));
    return ok_status();
  }
  Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) override;

 private:
  const char* name() const { return o_.ada ? "critical_adakv" : "criticalkv"; }
  // n[j] of KV head h: the group's mean of ||W_o[:, hq] v_j||_1 (double).
  void value_norms(const KvCache& kv, int64_t il, int64_t h, const float* W, int64_t E, std::vector<double>& n) const;

  CriticalOptions o_;
  std::unique_ptr<PressScorer> scorer_;
  PressShape shape_;
  PressSchedule sched_;
};

void CriticalPress::value_norms(const KvCache& kv, int64_t il, int64_t h, const float* W, int64_t E,
                                std::vector<double>& n) const {
  const int64_t nt = kv.n_tokens(il, h), dv = shape_.head_dim_v, g = shape_.n_head / shape_.n_head_kv;
  const int64_t cols = shape_.n_head * dv;
  std::vector<float> V(static_cast<size_t>(nt * dv));
  if (nt > 0) kv.read_values(il, h, 0, nt, V.data());
  n.assign(static_cast<size_t>(nt), 0.0);
  for (int64_t hq = h * g; hq < (h + 1) * g; ++hq)
    for (int64_t r = 0; r < E; ++r) {
      const float* w = W + r * cols + hq * dv;  // row r of W_o, the columns of query head hq
      for (int64_t j = 0; j < nt; ++j) {
        const float* v = V.data() + j * dv;
        float y = 0;
        for (int64_t e = 0; e < dv; ++e) y += w[e] * v[e];
        n[static_cast<size_t>(j)] += std::fabs(static_cast<double>(y));
      }
    }
  for (double& x : n) x /= static_cast<double>(g);
}

Status CriticalPress::select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) {
  keep.clear();
  if (!sched_.covers(c.phase)) return ok_status();
  const KvCache& kv = *c.kv;
  if (il < 0 || il >= kv.n_layer()) return make_error(fmt::format("kv press {}: layer {} out of range", name(), il));
  if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim || kv.head_dim_v() != shape_.head_dim_v)
    return make_error(fmt::format("kv press {}: the cache has {} KV heads of dims {}/{}, the press was made for {} of "
                                  "{}/{}",
                                  name(), kv.n_head_kv(), kv.head_dim(), kv.head_dim_v(), shape_.n_head_kv,
                                  shape_.head_dim, shape_.head_dim_v));
  if (scorer_->n_obs() > 0 && c.n_obs > 0 && (!c.queries || !c.query_pos))
    return make_error(fmt::format("kv press {}: n_obs={} but no queries given", name(), c.n_obs));
  const int64_t Hkv = kv.n_head_kv(), seen = kv.n_appended(il);
  const int64_t target = o_.budget.kept(seen);
  // kvpress's stage-one budget, int((1 - ratio) * k_len * first_stage_ratio) (criticalkv).
  const double kept_real = o_.budget.budget >= 0 ? static_cast<double>(target)
                                                 : (1.0 - o_.budget.ratio) * static_cast<double>(seen);
  const auto stage1 = static_cast<int64_t>(std::floor(kept_real * o_.first_stage_ratio + 1e-9));

  // Protected tokens, and the heads with something to evict (the frame's rule).
  std::vector<std::vector<uint8_t>> prot(static_cast<size_t>(Hkv));
  std::vector<int64_t> n_prot(static_cast<size_t>(Hkv), 0);
  std::vector<uint8_t> active(static_cast<size_t>(Hkv), 0);
  bool any = false;
  for (int64_t h = 0; h < Hkv; ++h) {
    const int64_t n = kv.n_tokens(il, h);
    const int32_t* idx = kv.seq_index(il, h);
    auto& p = prot[static_cast<size_t>(h)];
    p.assign(static_cast<size_t>(n), 0);
    for (int64_t j = 0; j < n && idx[j] < o_.n_sink; ++j) p[static_cast<size_t>(j)] = 1;
    for (int64_t j = std::max<int64_t>(0, n - o_.window); j < n; ++j) p[static_cast<size_t>(j)] = 1;
    const int64_t np = std::accumulate(p.begin(), p.end(), int64_t{0});
    n_prot[static_cast<size_t>(h)] = np;
    if (n > o_.n_sink + o_.window && n > std::max(target, np)) active[static_cast<size_t>(h)] = 1, any = true;
  }
  if (!any) return ok_status();
  if (!c.out_proj)
    return make_error(fmt::format("kv press {}: needs the model's output projection W_o (PressContext::out_proj; the "
                                  "model runtime gives it)",
                                  name()));
  const float* W = c.out_proj->layer(il);
  const int64_t E = c.out_proj->n_embd();
  if (!W || E <= 0) return make_error(fmt::format("kv press {}: no W_o for layer {}", name(), il));

  // The inner scores, one row per KV head (the frame's group reduction).
  PressScores sc;
  LC_TRY(scorer_->score(c, il, shape_, sc));
  const int64_t g = shape_.n_head / shape_.n_head_kv;
  if (sc.by_kv_head.empty()) {
    if (static_cast<int64_t>(sc.by_query_head.size()) != shape_.n_head)
      return make_error(fmt::format("kv press {}: inner={} returned no scores", name(), scorer_->name()));
    sc.by_kv_head.resize(static_cast<size_t>(Hkv));
    for (int64_t h = 0; h < Hkv; ++h) {
      auto& r = sc.by_kv_head[static_cast<size_t>(h)];
      r = sc.by_query_head[static_cast<size_t>(h * g)];
      for (int64_t q = 1; q < g; ++q) {
        const auto& x = sc.by_query_head[static_cast<size_t>(h * g + q)];
        for (size_t j = 0; j < r.size(); ++j) r[j] = o_.reduce_max ? std::max(r[j], x[j]) : r[j] + x[j];
      }
      if (!o_.reduce_max && g > 1)
        for (float& v : r) v /= static_cast<float>(g);
    }
  }
  for (int64_t h = 0; h < Hkv; ++h) {
    auto& r = sc.by_kv_head[static_cast<size_t>(h)];
    LC_CHECK(static_cast<int64_t>(r.size()) == kv.n_tokens(il, h));
    for (float& v : r)
      if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  }

  // Per head: the unprotected candidates in the inner order (best first), and ||W_o v||_1.
  std::vector<std::vector<int32_t>> order(static_cast<size_t>(Hkv));
  std::vector<std::vector<double>> norm(static_cast<size_t>(Hkv));
  for_each_head(c, Hkv, [&](int64_t h) {
    if (!active[static_cast<size_t>(h)]) return;
    auto& od = order[static_cast<size_t>(h)];
    const auto& p = prot[static_cast<size_t>(h)];
    for (size_t j = 0; j < p.size(); ++j)
      if (!p[j]) od.push_back(static_cast<int32_t>(j));
    std::sort(od.begin(), od.end(), Higher<float>{sc.by_kv_head[static_cast<size_t>(h)].data()});
    value_norms(kv, il, h, W, E, norm[static_cast<size_t>(h)]);
  });

  // Head budgets (candidates kept per head) and stage-one counts.
  std::vector<int64_t> budget(static_cast<size_t>(Hkv), 0), first(static_cast<size_t>(Hkv), 0);
  auto n_cand = [&](int64_t h) { return static_cast<int64_t>(order[static_cast<size_t>(h)].size()); };
  if (!o_.ada) {
    for (int64_t h = 0; h < Hkv; ++h) {
      if (!active[static_cast<size_t>(h)]) continue;
      const int64_t np = n_prot[static_cast<size_t>(h)];
      budget[static_cast<size_t>(h)] = std::clamp<int64_t>(target - np, 0, n_cand(h));
      first[static_cast<size_t>(h)] = std::clamp<int64_t>(stage1 - np, 0, budget[static_cast<size_t>(h)]);
    }
  } else {
    // AdaKV's allocation: the safe ones, then the layer's best inner scores across heads.
    const auto n_safe = static_cast<int64_t>(std::floor(static_cast<double>(target) * o_.alpha + 1e-9));
    std::vector<int64_t> safe(static_cast<size_t>(Hkv), 0);
    int64_t pool = 0;
    struct Entry {
      float s;
      int32_t h, j;
    };
    std::vector<Entry> rest;
    for (int64_t h = 0; h < Hkv; ++h) {
      if (!active[static_cast<size_t>(h)]) continue;
      const int64_t np = n_prot[static_cast<size_t>(h)];
      const int64_t sf = std::clamp<int64_t>(n_safe - np, 0, n_cand(h));
      safe[static_cast<size_t>(h)] = sf;
      pool += target - np - sf;
      const auto& od = order[static_cast<size_t>(h)];
      for (size_t i = static_cast<size_t>(sf); i < od.size(); ++i)
        rest.push_back({sc.by_kv_head[static_cast<size_t>(h)][static_cast<size_t>(od[i])], static_cast<int32_t>(h), od[i]});
    }
    const auto m = static_cast<size_t>(std::clamp<int64_t>(pool, 0, static_cast<int64_t>(rest.size())));
    std::nth_element(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(m), rest.end(),
                     [](const Entry& a, const Entry& b) {
                       if (a.s != b.s) return a.s > b.s;
                       if (a.h != b.h) return a.h < b.h;
                       return a.j < b.j;
                     });
    for (int64_t h = 0; h < Hkv; ++h) budget[static_cast<size_t>(h)] = safe[static_cast<size_t>(h)];
    for (size_t i = 0; i < m; ++i) ++budget[static_cast<size_t>(rest[i].h)];
    for (int64_t h = 0; h < Hkv; ++h) {
      if (!active[static_cast<size_t>(h)]) continue;
      const int64_t np = n_prot[static_cast<size_t>(h)];
      const int64_t B = np + budget[static_cast<size_t>(h)];  // kvpress's head_budgets[h]
      const auto b1 = static_cast<int64_t>(std::floor(static_cast<double>(B) * o_.first_stage_ratio + 1e-9));
      first[static_cast<size_t>(h)] =
          std::clamp<int64_t>(std::max(b1 - np, safe[static_cast<size_t>(h)]), 0, budget[static_cast<size_t>(h)]);
    }
  }

  // Stage 1 by the inner order, stage 2 by (s + epsilon) ||W_o v||_1 among the others.
  keep.assign(static_cast<size_t>(Hkv), {});
  for_each_head(c, Hkv, [&](int64_t h) {
    auto& k = keep[static_cast<size_t>(h)];
    const auto& p = prot[static_cast<size_t>(h)];
    if (!active[static_cast<size_t>(h)]) {
      k.resize(p.size());
      std::iota(k.begin(), k.end(), 0);
      return;
    }
    const auto& od = order[static_cast<size_t>(h)];
    const int64_t f = first[static_cast<size_t>(h)], b = budget[static_cast<size_t>(h)];
    k.assign(od.begin(), od.begin() + f);
    const auto& s = sc.by_kv_head[static_cast<size_t>(h)];
    const auto& nv = norm[static_cast<size_t>(h)];
    std::vector<double> crit(p.size(), -std::numeric_limits<double>::infinity());
    std::vector<int32_t> cand(od.begin() + f, od.end());
    for (int32_t j : cand) {
      const double x = (static_cast<double>(s[static_cast<size_t>(j)]) + o_.epsilon) * nv[static_cast<size_t>(j)];
      crit[static_cast<size_t>(j)] = std::isnan(x) ? -std::numeric_limits<double>::infinity() : x;
    }
    const auto t = static_cast<std::ptrdiff_t>(b - f);
    if (t < static_cast<std::ptrdiff_t>(cand.size()))
      std::nth_element(cand.begin(), cand.begin() + t, cand.end(), Higher<double>{crit.data()});
    k.insert(k.end(), cand.begin(), cand.begin() + t);
    for (size_t j = 0; j < p.size(); ++j)
      if (p[j]) k.push_back(static_cast<int32_t>(j));
    std::sort(k.begin(), k.end());
  });
  return ok_status();
}

constexpr const char* kInnerHelp =
    "the scorer whose scores the two stages use (any scorer press; its keys are accepted here); kvpress's "
    "critical_snapkv by default";

Expected<std::unique_ptr<KvPress>> make_critical(Args& a, const PressShape& s, bool ada) {
  CriticalOptions o;
  o.ada = ada;
  LC_ASSIGN_OR_RETURN(o.budget, parse_budget_keys(a, 0.5));
  LC_ASSIGN_OR_RETURN(std::string inner, a.text("inner", "snapkv", kInnerHelp));
  const ScorerFactory* f = find_scorer(inner);
  if (!f) {
    std::string names;
#define LC_PRESS_SCORER(name, help, paper) \
  if (!names.empty()) names += ", ";       \
  names += #name;
#include "kv/press_list.h"
    return make_error(fmt::format("kv press {}: inner={}: expected a scorer ({})", a.name(), inner, names));
  }
  LC_ASSIGN_OR_RETURN(std::unique_ptr<PressScorer> scorer, (*f)(a, s));
  if (scorer->lookahead() != 0)
    return make_error(fmt::format("kv press {}: inner={} needs a draft's lookahead, which this press does not run",
                                  a.name(), inner));
  LC_ASSIGN_OR_RETURN(o.n_sink, a.integer("n_sink", scorer->default_sinks(), 0, INT32_MAX,
                                          "first tokens of the sequence, never evicted (attention sinks), tokens"));
  LC_ASSIGN_OR_RETURN(o.window, a.integer("window", scorer->default_window(), 0, INT32_MAX,
                                          "most recent tokens, never evicted, tokens"));
  LC_ASSIGN_OR_RETURN(std::string red, a.choice("reduce", scorer->default_reduce_max() ? "max" : "mean",
                                                {"mean", "max"},
                                                "how the inner per-query-head scores of a GQA group become one per "
                                                "KV head"));
  o.reduce_max = red == "max";
  LC_ASSIGN_OR_RETURN(o.epsilon, a.number("eps", 1e-4, 0, 1e6,
                                          "added to the inner score before it is multiplied by ||W_o v||_1 "
                                          "(kvpress's epsilon; epsilon= is expected_attention's)"));
  LC_ASSIGN_OR_RETURN(o.first_stage_ratio,
                      a.number("first_stage_ratio", 0.5, 0, 1,
                               ada ? "fraction of each head's budget kept by the inner scores alone (stage 1); the "
                                     "rest by (score + eps) x ||W_o v||_1"
                                   : "fraction of the kept tokens chosen by the inner scores alone (stage 1); the "
                                     "rest by (score + eps) x ||W_o v||_1"));
  if (ada) {
    LC_ASSIGN_OR_RETURN(o.alpha, a.number("alpha", 0.2, 0, 1,
                                          "fraction of each head's budget it keeps by its own scores (AdaKV's "
                                          "alpha_safeguard); the rest of the layer's budget goes to the best scores "
                                          "across heads"));
  }
  if (o.budget.budget >= 0 && o.budget.budget < o.n_sink + o.window)
    return make_error(fmt::format("kv press {}: budget={} is below n_sink + window = {}", a.name(), o.budget.budget,
                                  o.n_sink + o.window));
  return std::unique_ptr<KvPress>(std::make_unique<CriticalPress>(o, std::move(scorer), s));
}

}  // namespace

Expected<std::unique_ptr<KvPress>> make_press_criticalkv(Args& a, const PressShape& s) { return make_critical(a, s, false); }
Expected<std::unique_ptr<KvPress>> make_press_critical_adakv(Args& a, const PressShape& s) {
  return make_critical(a, s, true);
}

}  // namespace lc::press
