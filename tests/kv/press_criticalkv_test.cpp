// criticalkv and critical_adakv against oracles written here in double straight from kvpress's
// CriticalKVPress and CriticalAdaKVPress (NVIDIA/kvpress, kvpress/presses/criticalkv_press.py),
// operation by operation on the test's own data, with kvpress's inner scores (KnormPress.score:
// -||k||; SnapKVPress.score: window attention mean, avg_pool1d(5), group mean, the window padded
// with max + 1) and its vwl1norm:
//   Wo = o_proj.weight.T.view(n_heads, head_dim, hidden); ||repeat_kv(V)[h] @ Wo[h]||_1; group mean
//   criticalkv: top int((1-r) k_len fsr) of the scores -> max; the others (s + eps) * norm;
//               ScorerPress keeps the top int(k_len (1 - r))
//   critical_adakv: n_safe = int(n_kept alpha) per head -> max; head budgets = the per-head counts
//               of the layer's top n_kept * n_heads; top int(B_h fsr) -> max; (s + eps) * norm; top
//               B_h -> max; the n_heads (k_len - n_kept) lowest are pruned.
// torch.topk's ties are unspecified; the oracle takes the lower (head, index), the project's rule,
// and asks for another seed when a cut is a near-tie. The exact kept index sets per (layer, KV
// head) must match.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/press.h"

namespace lc {
namespace {

constexpr double kMax = 1e300;  // torch.finfo(dtype).max, as a sentinel that (x + eps) * norm keeps on top

// The test's W_o: [n_layer][n_embd][n_head * head_dim_v] as PressContext::out_proj hands it over.
struct TestWo final : OutputProjection {
  int64_t E = 0;
  std::vector<std::vector<float>> w;
  int64_t calls = 0;
  int64_t n_embd() const override { return E; }
  const float* layer(int64_t il) override {
    ++calls;
    return w[static_cast<size_t>(il)].data();
  }
};

struct CritFixture {
  int64_t n_layer, H, Hkv, d, dv, L, E;
  std::vector<float> k, v, q;  // [il][t][head][d | dv] pre-RoPE
  std::vector<int32_t> pos;
  std::unique_ptr<KvCache> kv;
  TestWo wo;
  PressShape shape;

  CritFixture(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t dv_, int64_t L_, int64_t E_, uint32_t seed)
      : n_layer(n_layer_), H(H_), Hkv(Hkv_), d(d_), dv(dv_), L(L_), E(E_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(n_layer * L * Hkv * d));
    v.resize(static_cast<size_t>(n_layer * L * Hkv * dv));
    q.resize(static_cast<size_t>(n_layer * L * H * d));
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    // Value scales that differ between tokens, so ||W_o v|| matters.
    std::uniform_real_distribution<float> ud(0.2f, 2.0f);
    for (int64_t i = 0; i < n_layer * L * Hkv; ++i) {
      const float s = ud(rng);
      for (int64_t e = 0; e < dv; ++e) v[static_cast<size_t>(i * dv + e)] *= s;
    }
    wo.E = E;
    for (int64_t il = 0; il < n_layer; ++il) {
      std::vector<float> w(static_cast<size_t>(E * H * dv));
      for (auto& x : w) x = nd(rng);
      wo.w.push_back(std::move(w));
    }
    for (int64_t t = 0; t < L; ++t) pos.push_back(static_cast<int32_t>(t));
    shape = PressShape{n_layer, H, Hkv, d, dv, 0.0f};
    KvCacheConfig c;
    c.n_layer = n_layer;
    c.n_head_kv = Hkv;
    c.head_dim = d;
    c.head_dim_v = dv;
    c.block_tokens = 16;
    LlamaCppRopeParams rp;
    rp.n_rot = d;
    rp.neox = true;
    c.rope = make_llama_cpp_rope(rp);
    auto r = KvCache::create(c);
    EXPECT_TRUE(r.has_value());
    kv = std::move(r.value());
    for (int64_t il = 0; il < n_layer; ++il)
      EXPECT_TRUE(kv->append(il, L, &k[static_cast<size_t>(il * L * Hkv * d)], &v[static_cast<size_t>(il * L * Hkv * dv)],
                             pos.data())
                      .is_ok());
  }
  const float* K(int64_t il, int64_t t, int64_t h) const { return &k[static_cast<size_t>(((il * L + t) * Hkv + h) * d)]; }
  const float* V(int64_t il, int64_t t, int64_t h) const { return &v[static_cast<size_t>(((il * L + t) * Hkv + h) * dv)]; }
  const float* Q(int64_t il, int64_t t, int64_t h) const { return &q[static_cast<size_t>(((il * L + t) * H + h) * d)]; }

  // The model's after-prefill compression: the last n_obs() queries and W_o, every layer.
  Status compress(KvPress& p, bool give_wo = true) {
    for (int64_t il = 0; il < n_layer; ++il) {
      const int64_t n = std::min(p.n_obs(), L);
      PressContext c;
      c.kv = kv.get();
      c.queries = n > 0 ? Q(il, L - n, 0) : nullptr;
      c.query_pos = n > 0 ? pos.data() + (L - n) : nullptr;
      c.n_obs = n;
      c.out_proj = give_wo ? &wo : nullptr;
      LC_TRY(p.compress(c, il));
    }
    return ok_status();
  }
  std::vector<int32_t> kept(int64_t il, int64_t h) const {
    const int32_t* s = kv->seq_index(il, h);
    return std::vector<int32_t>(s, s + kv->n_tokens(il, h));
  }
};

// ---- the oracle ----

std::vector<double> rot(const float* x, int64_t d, int64_t p) {
  std::vector<double> out(static_cast<size_t>(d));
  for (int64_t i = 0; i < d / 2; ++i) {
    const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    out[static_cast<size_t>(i)] = x[i] * std::cos(a) - x[i + d / 2] * std::sin(a);
    out[static_cast<size_t>(i + d / 2)] = x[i] * std::sin(a) + x[i + d / 2] * std::cos(a);
  }
  return out;
}

using Rows = std::vector<std::vector<double>>;  // [KV head][token]

double g_min_gap = INFINITY;  // the closest cut topk() saw (relative)
double g_pad = NAN;           // SnapKV's window score (max + 1): its ties change no kept set

// KnormPress.score: -keys.norm(dim=-1) (RoPE keeps the norm).
Rows knorm_scores(const CritFixture& f, int64_t il) {
  Rows s(static_cast<size_t>(f.Hkv), std::vector<double>(static_cast<size_t>(f.L)));
  for (int64_t h = 0; h < f.Hkv; ++h)
    for (int64_t t = 0; t < f.L; ++t) {
      double n = 0;
      for (int64_t e = 0; e < f.d; ++e) n += static_cast<double>(f.K(il, t, h)[e]) * f.K(il, t, h)[e];
      s[static_cast<size_t>(h)][static_cast<size_t>(t)] = -std::sqrt(n);
    }
  return s;
}

// SnapKVPress.score(window_size w, kernel_size 5).
Rows snapkv_scores(const CritFixture& f, int64_t il, int64_t w) {
  const int64_t g = f.H / f.Hkv, n_pre = f.L - w;
  Rows s(static_cast<size_t>(f.Hkv), std::vector<double>(static_cast<size_t>(f.L), 0.0));
  double mx_all = -INFINITY;
  for (int64_t hq = 0; hq < f.H; ++hq) {
    std::vector<double> a(static_cast<size_t>(n_pre), 0.0);
    for (int64_t t = f.L - w; t < f.L; ++t) {
      const auto qr = rot(f.Q(il, t, hq), f.d, t);
      std::vector<double> lg(static_cast<size_t>(t + 1));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        const auto kr = rot(f.K(il, j, hq / g), f.d, j);
        double dot = 0;
        for (int64_t e = 0; e < f.d; ++e) dot += qr[static_cast<size_t>(e)] * kr[static_cast<size_t>(e)];
        lg[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(f.d));
        mx = std::max(mx, lg[static_cast<size_t>(j)]);
      }
      for (double& x : lg) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < n_pre; ++j) a[static_cast<size_t>(j)] += lg[static_cast<size_t>(j)] / sum / static_cast<double>(w);
    }
    for (int64_t j = 0; j < n_pre; ++j) {  // avg_pool1d(5, padding 2), zeros counted
      double acc = 0;
      for (int64_t i = j - 2; i <= j + 2; ++i)
        if (i >= 0 && i < n_pre) acc += a[static_cast<size_t>(i)];
      s[static_cast<size_t>(hq / g)][static_cast<size_t>(j)] += acc / 5.0 / static_cast<double>(g);  // group mean
    }
  }
  for (const auto& r : s)
    for (int64_t j = 0; j < n_pre; ++j) mx_all = std::max(mx_all, r[static_cast<size_t>(j)]);
  for (auto& r : s)
    for (int64_t j = n_pre; j < f.L; ++j) r[static_cast<size_t>(j)] = mx_all + 1;  // F.pad(value = max + 1)
  g_pad = mx_all + 1;
  return s;
}

// vwl1norm: per KV head, the group mean of ||v_j @ Wo[hq]||_1, Wo[hq][e][r] = o_proj.weight[r][hq * dv + e].
Rows vwl1norm(const CritFixture& f, int64_t il) {
  const int64_t g = f.H / f.Hkv;
  const std::vector<float>& W = f.wo.w[static_cast<size_t>(il)];
  Rows n(static_cast<size_t>(f.Hkv), std::vector<double>(static_cast<size_t>(f.L), 0.0));
  for (int64_t hq = 0; hq < f.H; ++hq)
    for (int64_t j = 0; j < f.L; ++j) {
      double l1 = 0;
      for (int64_t r = 0; r < f.E; ++r) {
        double y = 0;
        for (int64_t e = 0; e < f.dv; ++e)
          y += static_cast<double>(f.V(il, j, hq / g)[e]) * W[static_cast<size_t>(r * f.H * f.dv + hq * f.dv + e)];
        l1 += std::fabs(y);
      }
      n[static_cast<size_t>(hq / g)][static_cast<size_t>(j)] += l1 / static_cast<double>(g);
    }
  return n;
}

// torch.topk(x, k).indices with ties to the lower index; a cut closer than 1e-4 (relative)
// between two ordinary values is a near-tie float and double could order either way.
std::vector<int64_t> topk(const std::vector<double>& x, int64_t k) {
  std::vector<int64_t> o(x.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]; });
  if (k > 0 && k < static_cast<int64_t>(o.size())) {
    const double a = x[static_cast<size_t>(o[static_cast<size_t>(k - 1)])], b = x[static_cast<size_t>(o[static_cast<size_t>(k)])];
    if (std::fabs(a) < 1e250 && std::fabs(b) < 1e250 && a != b)
      g_min_gap = std::min(g_min_gap, (a - b) / std::max({std::fabs(a), std::fabs(b), 1e-30}));
    if (a == b && std::fabs(a) < 1e250 && a != g_pad) g_min_gap = 0;  // a real tie of ordinary scores
  }
  o.resize(static_cast<size_t>(std::clamp<int64_t>(k, 0, static_cast<int64_t>(o.size()))));
  return o;
}

std::vector<int32_t> as_sorted(std::vector<int64_t> idx) {
  std::sort(idx.begin(), idx.end());
  return std::vector<int32_t>(idx.begin(), idx.end());
}

// CriticalKVPress.score + ScorerPress.compress for one layer: kept indices per KV head. n_kept and
// the stage-one budget as kvpress computes them (or as given, for budget=).
std::vector<std::vector<int32_t>> critical_oracle(Rows scores, const Rows& norm, int64_t n_kept, int64_t selection_budget,
                                                  double eps) {
  std::vector<std::vector<int32_t>> out;
  for (size_t h = 0; h < scores.size(); ++h) {
    auto& s = scores[h];
    const auto top1 = topk(s, selection_budget);                                  // stage 1
    for (size_t j = 0; j < s.size(); ++j) s[j] = (s[j] + eps) * norm[h][j];       // stage 2
    for (int64_t j : top1) s[static_cast<size_t>(j)] = kMax;                      // scatter_(max)
    out.push_back(as_sorted(topk(s, n_kept)));                                    // ScorerPress
  }
  return out;
}

// CriticalAdaKVPress.compress for one layer.
std::vector<std::vector<int32_t>> critical_ada_oracle(Rows scores, const Rows& norm, int64_t n_kept, double alpha, double fsr,
                                                      double eps, std::vector<int64_t>* budgets_out = nullptr) {
  const int64_t Hkv = static_cast<int64_t>(scores.size()), k_len = static_cast<int64_t>(scores[0].size());
  const auto n_safe = static_cast<int64_t>(static_cast<double>(n_kept) * alpha);
  for (auto& s : scores)
    for (int64_t j : topk(s, n_safe)) s[static_cast<size_t>(j)] = kMax;
  std::vector<double> flat;
  for (const auto& s : scores) flat.insert(flat.end(), s.begin(), s.end());
  std::vector<int64_t> budgets(static_cast<size_t>(Hkv), 0);
  for (int64_t i : topk(flat, n_kept * Hkv)) ++budgets[static_cast<size_t>(i / k_len)];
  for (int64_t h = 0; h < Hkv; ++h) {  // stage 1
    const auto b1 = static_cast<int64_t>(static_cast<double>(budgets[static_cast<size_t>(h)]) * fsr);
    for (int64_t j : topk(scores[static_cast<size_t>(h)], b1)) scores[static_cast<size_t>(h)][static_cast<size_t>(j)] = kMax;
  }
  for (int64_t h = 0; h < Hkv; ++h)  // stage 2
    for (int64_t j = 0; j < k_len; ++j) {
      double& x = scores[static_cast<size_t>(h)][static_cast<size_t>(j)];
      x = (x + eps) * norm[static_cast<size_t>(h)][static_cast<size_t>(j)];
    }
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t j : topk(scores[static_cast<size_t>(h)], budgets[static_cast<size_t>(h)]))
      scores[static_cast<size_t>(h)][static_cast<size_t>(j)] = kMax;
  // The bottom n_pruned across heads are pruned: the kept ones are the rest.
  flat.clear();
  for (const auto& s : scores) flat.insert(flat.end(), s.begin(), s.end());
  std::vector<double> neg(flat.size());
  for (size_t i = 0; i < flat.size(); ++i) neg[i] = -flat[i];
  const auto pruned = topk(neg, Hkv * (k_len - n_kept));
  std::vector<uint8_t> gone(flat.size(), 0);
  for (int64_t i : pruned) gone[static_cast<size_t>(i)] = 1;
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(Hkv));
  for (int64_t i = 0; i < static_cast<int64_t>(flat.size()); ++i)
    if (!gone[static_cast<size_t>(i)]) out[static_cast<size_t>(i / k_len)].push_back(static_cast<int32_t>(i % k_len));
  if (budgets_out) *budgets_out = budgets;
  return out;
}

std::unique_ptr<KvPress> make(const std::string& spec, const PressShape& s) {
  auto r = make_kv_press(spec, s);
  EXPECT_TRUE(r.has_value()) << spec << ": " << (r ? "" : r.error().message);
  return r ? std::move(r.value()) : nullptr;
}

const int kPct[] = {25, 50, 75, 90};

// The oracle's inner scores: knorm (no protected tokens) or snapkv with its window of 8.
Rows inner_scores(const CritFixture& f, int64_t il, bool snap) { return snap ? snapkv_scores(f, il, 8) : knorm_scores(f, il); }

// criticalkv: every ratio, first_stage_ratio 0.5 (kvpress's default), 0, 0.25 and 1, inner
// knorm and snapkv (its window protected here, max + 1 there), GQA 8 query heads over 2 KV heads,
// head_dim 16 and head_dim_v 12, n_embd 24.
TEST(KvPressCriticalKv, OracleKeptSets) {
  for (bool snap : {false, true})
    for (double fsr : {0.5, 0.0, 0.25, 1.0})
      for (int pct : kPct) {
        CritFixture f(2, 8, 2, 16, 12, 96, 24, 13);
        const std::string spec = fmt::format("criticalkv:ratio={},inner={},first_stage_ratio={}{}", pct / 100.0,
                                             snap ? "snapkv" : "knorm", fsr, snap ? ",obs=8" : "");
        auto p = make(spec, f.shape);
        ASSERT_TRUE(p);
        const int64_t used = f.kv->pool().n_used();
        ASSERT_TRUE(f.compress(*p).is_ok()) << spec;
        EXPECT_EQ(f.wo.calls, 2) << "W_o is asked for once per layer";
        EXPECT_LT(f.kv->pool().n_used(), used);
        const double r = pct / 100.0;
        const auto n_kept = static_cast<int64_t>(static_cast<double>(f.L) * (1 - r) + 1e-9);
        const auto sel = static_cast<int64_t>((1 - r) * static_cast<double>(f.L) * fsr + 1e-9);
        g_min_gap = INFINITY;
        for (int64_t il = 0; il < 2; ++il) {
          const auto want = critical_oracle(inner_scores(f, il, snap), vwl1norm(f, il), n_kept, sel, 1e-4);
          for (int64_t h = 0; h < 2; ++h) {
            if (snap) {  // the reference keeps the window here too (documented otherwise)
              for (int32_t j = static_cast<int32_t>(f.L - 8); j < f.L; ++j)
                ASSERT_TRUE(std::binary_search(want[static_cast<size_t>(h)].begin(), want[static_cast<size_t>(h)].end(), j));
            }
            EXPECT_EQ(f.kept(il, h), want[static_cast<size_t>(h)]) << spec << " layer " << il << " head " << h;
          }
        }
        EXPECT_GT(g_min_gap, 1e-4) << spec << ": near-tie at a cut, pick another seed";
      }
}

// The stage-one budget is kvpress's int((1 - ratio) * k_len * first_stage_ratio), unfloored inside:
// 103 tokens at ratio 0.5 and first_stage_ratio 0.9 give 46 (51.5 x 0.9), not 45 (51 x 0.9).
TEST(KvPressCriticalKv, StageOneBudgetAsKvpress) {
  CritFixture f(2, 8, 2, 16, 12, 103, 24, 13);
  auto p = make("criticalkv:ratio=0.5,inner=knorm,first_stage_ratio=0.9", f.shape);
  ASSERT_TRUE(f.compress(*p).is_ok());
  g_min_gap = INFINITY;
  for (int64_t il = 0; il < 2; ++il) {
    const auto want = critical_oracle(knorm_scores(f, il), vwl1norm(f, il), 51, 46, 1e-4);
    for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.kept(il, h), want[static_cast<size_t>(h)]) << il << " " << h;
  }
  EXPECT_GT(g_min_gap, 1e-4) << "near-tie at a cut, pick another seed";
}

// budget=B (not in kvpress): n_kept = B, the stage-one budget floor(B x first_stage_ratio).
TEST(KvPressCriticalKv, OracleBudget) {
  for (int64_t B : {10, 33, 60}) {
    CritFixture f(2, 8, 2, 16, 12, 96, 24, 13);
    auto p = make(fmt::format("criticalkv:budget={},inner=knorm", B), f.shape);
    ASSERT_TRUE(f.compress(*p).is_ok());
    for (int64_t il = 0; il < 2; ++il) {
      const auto want = critical_oracle(knorm_scores(f, il), vwl1norm(f, il), B, B / 2, 1e-4);
      for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.kept(il, h), want[static_cast<size_t>(h)]) << B;
    }
  }
}

// critical_adakv: every ratio, alpha 0.2 (kvpress's default) and 0.5, first_stage_ratio 0.5 and
// 0.25, inner knorm and snapkv, GQA; the heads' budgets differ.
TEST(KvPressCriticalAdaKv, OracleKeptSets) {
  bool budgets_differ = false;
  for (bool snap : {false, true})
    for (double alpha : {0.2, 0.5})
      for (double fsr : {0.5, 0.25})
        for (int pct : kPct) {
          CritFixture f(2, 8, 2, 16, 12, 96, 24, 13);
          const std::string spec = fmt::format("critical_adakv:ratio={},inner={},alpha={},first_stage_ratio={}{}",
                                               pct / 100.0, snap ? "snapkv" : "knorm", alpha, fsr, snap ? ",obs=8" : "");
          auto p = make(spec, f.shape);
          ASSERT_TRUE(p);
          ASSERT_TRUE(f.compress(*p).is_ok()) << spec;
          const auto n_kept = static_cast<int64_t>(static_cast<double>(f.L) * (1 - pct / 100.0) + 1e-9);
          g_min_gap = INFINITY;
          for (int64_t il = 0; il < 2; ++il) {
            std::vector<int64_t> budgets;
            const auto want = critical_ada_oracle(inner_scores(f, il, snap), vwl1norm(f, il), n_kept, alpha, fsr, 1e-4,
                                                  &budgets);
            budgets_differ |= budgets[0] != budgets[1];
            for (int64_t h = 0; h < 2; ++h) {
              if (snap) {
                for (int32_t j = static_cast<int32_t>(f.L - 8); j < f.L; ++j)
                  ASSERT_TRUE(std::binary_search(want[static_cast<size_t>(h)].begin(), want[static_cast<size_t>(h)].end(), j));
              }
              EXPECT_EQ(f.kept(il, h), want[static_cast<size_t>(h)]) << spec << " layer " << il << " head " << h;
            }
          }
          EXPECT_GT(g_min_gap, 1e-4) << spec << ": near-tie at a cut, pick another seed";
        }
  EXPECT_TRUE(budgets_differ);
}

// Short prompts, ratio 0 and budgets above the tokens held change nothing (and need no W_o);
// a press that has something to evict without W_o says so; spec() round-trips.
TEST(KvPressCriticalKv, EdgesAndSpec) {
  for (const char* spec : {"criticalkv:ratio=0", "critical_adakv:ratio=0", "criticalkv:budget=200,inner=knorm",
                           "critical_adakv:budget=96,inner=knorm"}) {
    CritFixture f(2, 8, 2, 16, 12, 96, 24, 13);
    auto p = make(spec, f.shape);
    ASSERT_TRUE(f.compress(*p, false).is_ok()) << spec;
    for (int64_t il = 0; il < 2; ++il) EXPECT_EQ(f.kv->n_tokens(il, 1), 96) << spec;
  }
  {
    CritFixture f(2, 8, 2, 16, 12, 60, 24, 7);  // no more than window = obs = 64 tokens
    auto p = make("criticalkv", f.shape);
    ASSERT_TRUE(f.compress(*p, false).is_ok());
    EXPECT_EQ(f.kv->n_tokens(0, 0), 60);
  }
  CritFixture f(2, 8, 2, 16, 12, 96, 24, 13);
  auto p = make("critical_adakv:inner=knorm", f.shape);
  auto st = f.compress(*p, false);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("critical_adakv: needs the model's output projection W_o"), std::string::npos) << st.message();
  EXPECT_EQ(make("criticalkv", f.shape)->spec(),
            "criticalkv:ratio=0.5,query=aware,inner=snapkv,n_sink=0,window=64,reduce=mean,eps=0.0001,"
            "first_stage_ratio=0.5,obs=64,kernel=5,pool=avg");
  for (const char* spec : {"criticalkv:inner=expected_attention,vnorm=0,ratio=0.3,eps=0.01,epsilon=0.5",
                           "critical_adakv:budget=40,inner=snapkv,obs=16,alpha=0.3,first_stage_ratio=0.75,query=agnostic"}) {
    auto a = make(spec, f.shape);
    auto b = make(a->spec(), f.shape);
    EXPECT_EQ(a->spec(), b->spec()) << spec;
    EXPECT_NE(a->spec().find("inner="), std::string::npos);
  }
}

TEST(KvPressCriticalKv, ErrorsNameTheKey) {
  const PressShape s{2, 4, 2, 8, 8, 0};
  const std::pair<const char*, const char*> bad[] = {
      {"criticalkv:eps=-1", "eps"},
      {"criticalkv:epsilon=0.1", "epsilon"},  // expected_attention's key, not this press's
      {"criticalkv:first_stage_ratio=1.5", "first_stage_ratio"},
      {"criticalkv:alpha=0.2", "alpha"},
      {"criticalkv:inner=nosuch", "inner=nosuch: expected a scorer (streaming_llm, snapkv, h2o"},
      {"critical_adakv:inner=adakv", "inner=adakv"},
      {"criticalkv:inner=speckv", "inner=speckv"},
      {"criticalkv:budget=10,window=16", "budget=10"},
      {"criticalkv:ratio=0.5,budget=10", "not both"},
      {"critical_adakv:alpha=2", "alpha"},
      {"critical_adakv:inner=knorm,kernel=5", "kernel"},
  };
  for (const auto& [spec, what] : bad) {
    auto r = make_kv_press(spec, s);
    ASSERT_FALSE(r.has_value()) << spec;
    EXPECT_NE(r.error().message.find(std::string(spec).substr(0, std::string(spec).find(':'))), std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace lc
