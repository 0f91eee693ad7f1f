// simlayerkv against an oracle written here in double straight from kvpress's SimLayerKVPress
// (NVIDIA/kvpress, kvpress/presses/simlayerkv_press.py, and the window attention it borrows from
// SnapKVPress.compute_window_attention), on the test's own pre-RoPE data:
//   attn = softmax(q_last · repeat_kv(K)ᵀ / sqrt(d) + triu(-inf, k_len - n_last + 1))[..., :-n_last]
//   a    = attn.mean over (batch, every query head, the n_last queries)
//   lazy = a[:n_initial].sum() + a[-n_recent:].sum() > lazy_threshold
//   lazy layer: keys[:n_initial] ++ keys[-n_recent + n_last:]; others untouched;
//   nothing when lazy_threshold == 1 or k_len <= n_initial + n_recent + n_last;
//   compression_ratio = mean over layers of the fraction removed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/log.h"
#include "kv/kv_cache.h"
#include "kv/press.h"
#include "press_prompt.h"

namespace lc {
namespace {

// The shared prompt (press_prompt.h), with layer il's last queries leaning towards the first key
// of their KV head, so some layers really look at their initial tokens (lazy ones).
struct SimFixture : test::PressPrompt {
  SimFixture(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t L_, uint32_t seed)
      : PressPrompt(n_layer_, H_, Hkv_, d_, L_, seed) {
    // Layer il's queries lean towards the first key of their KV head by il * 0.6: a spread of
    // scores over the layers.
    const int64_t g = H / Hkv;
    for (int64_t il = 0; il < n_layer; ++il)
      for (int64_t t = 0; t < L; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t e = 0; e < d; ++e)
            q[static_cast<size_t>(((il * L + t) * H + h) * d + e)] +=
                0.6f * static_cast<float>(il) * k[static_cast<size_t>(((il * L + 0) * Hkv + h / g) * d + e)];
  }
  std::vector<int32_t> kept(int64_t il, int64_t h) const { return held(il, h); }
};

// ---- the oracle, from simlayerkv_press.py ----

// The layer's score: compute_window_attention(n_last) then mean((0, 1, 2)), initial + recent sums.
double oracle_score(const SimFixture& f, int64_t il, int64_t n_last, int64_t n_recent, int64_t n_initial) {
  const int64_t k_len = f.L, g = f.H / f.Hkv;
  std::vector<double> a(static_cast<size_t>(k_len - n_last), 0.0);  // the mean over heads and queries
  for (int64_t hq = 0; hq < f.H; ++hq)  // repeat_kv: query head hq reads KV head hq / g
    for (int64_t i = 0; i < n_last; ++i) {
      const int64_t t = k_len - n_last + i;  // the query's row; triu(k_len - n_last + 1) masks keys > t
      const std::vector<double> qv = f.rot(f.qpre(il, t) + hq * f.d, f.pos[static_cast<size_t>(t)]);
      std::vector<double> w(static_cast<size_t>(k_len), -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        const std::vector<double> kr =
            f.rot(&f.k[static_cast<size_t>(((il * f.L + j) * f.Hkv + hq / g) * f.d)], f.pos[static_cast<size_t>(j)]);
        double dot = 0;
        for (int64_t e = 0; e < f.d; ++e) dot += qv[static_cast<size_t>(e)] * kr[static_cast<size_t>(e)];
        w[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(f.d));
        mx = std::max(mx, w[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= t; ++j) sum += std::exp(w[static_cast<size_t>(j)] - mx);
      for (int64_t j = 0; j < k_len - n_last; ++j)  // [..., :-window_size]
        if (j <= t) a[static_cast<size_t>(j)] += std::exp(w[static_cast<size_t>(j)] - mx) / sum;
    }
  for (double& x : a) x /= static_cast<double>(f.H * n_last);
  double s = 0;
  for (int64_t j = 0; j < n_initial; ++j) s += a[static_cast<size_t>(j)];                           // a[:n_initial]
  for (int64_t j = k_len - n_last - n_recent; j < k_len - n_last; ++j) s += a[static_cast<size_t>(j)];  // a[-n_recent:]
  return s;
}

// The kept sequence indices of a layer (all heads alike), and whether it is lazy.
std::vector<int32_t> oracle_kept(int64_t k_len, bool lazy, int64_t n_last, int64_t n_recent, int64_t n_initial) {
  std::vector<int32_t> out;
  for (int64_t j = 0; j < k_len; ++j)
    if (!lazy || j < n_initial || j >= k_len + (-n_recent + n_last)) out.push_back(static_cast<int32_t>(j));
  return out;
}

std::unique_ptr<KvPress> make(const std::string& spec, const PressShape& s) {
  auto r = make_kv_press(spec, s);
  EXPECT_TRUE(r.has_value()) << spec << ": " << (r ? "" : r.error().message);
  return r ? std::move(r.value()) : nullptr;
}

// Every split of the layers by a threshold between two of the oracle's scores, and one below all
// of them: the lazy layers, the kept sets of every KV head, the freed blocks and the logged
// compression (kvpress's compression_ratio) all as the oracle says. GQA (8 query heads over 2 KV
// heads) and n_last = 1 (kvpress's default) and 3 (the causal mask among the last queries).
TEST(KvPressSimLayerKv, OracleLazyLayersAndKeptSets) {
  const int64_t n_layer = 6, L = 96, n_initial = 4, n_recent = 24;
  for (int64_t n_last : {1, 3}) {
    SimFixture f0(n_layer, 8, 2, 16, L, 11);
    std::vector<double> score(static_cast<size_t>(n_layer));
    for (int64_t il = 0; il < n_layer; ++il) score[static_cast<size_t>(il)] = oracle_score(f0, il, n_last, n_recent, n_initial);
    std::vector<double> sorted = score;
    std::sort(sorted.begin(), sorted.end());
    std::vector<double> thresholds = {sorted.front() * 0.5};
    for (size_t i = 0; i + 1 < sorted.size(); ++i) {
      ASSERT_GT(sorted[i + 1] - sorted[i], 1e-4) << "near-equal layer scores: pick another seed";
      thresholds.push_back(0.5 * (sorted[i] + sorted[i + 1]));
    }
    ASSERT_LT(sorted.back(), 1.0);
    for (double thr : thresholds) {
      SimFixture f(n_layer, 8, 2, 16, L, 11);
      const std::string spec = fmt::format("simlayerkv:lazy_threshold={},n_last={},n_recent={},n_initial={}", thr,
                                           n_last, n_recent, n_initial);
      auto p = make(spec, f.shape);
      ASSERT_TRUE(p);
      EXPECT_EQ(p->n_obs(), n_last);
      const int64_t used = f.kv->pool().n_used();
      set_log_level(LogLevel::kInfo);
      testing::internal::CaptureStderr();
      f.compress(*p);
      const std::string log = testing::internal::GetCapturedStderr();
      set_log_level(LogLevel::kWarn);
      int64_t n_lazy = 0;
      double ratio = 0;
      std::string lazy_list;
      for (int64_t il = 0; il < n_layer; ++il) {
        const bool lazy = score[static_cast<size_t>(il)] > thr;
        if (lazy) {
          ++n_lazy;
          if (!lazy_list.empty()) lazy_list += ',';
          lazy_list += std::to_string(il);
          ratio += static_cast<double>(L - n_initial - (n_recent - n_last)) / static_cast<double>(L);
        }
        for (int64_t h = 0; h < 2; ++h)
          EXPECT_EQ(f.kept(il, h), oracle_kept(L, lazy, n_last, n_recent, n_initial))
              << spec << " layer " << il << " head " << h << " score " << score[static_cast<size_t>(il)];
      }
      ratio /= static_cast<double>(n_layer);
      if (n_last == 1) {  // kvpress's own formula, (k_len - n_initial - n_recent + 1) / k_len per lazy layer
        EXPECT_NEAR(ratio, static_cast<double>(n_lazy) * static_cast<double>(L - n_initial - n_recent + 1) /
                               static_cast<double>(L) / static_cast<double>(n_layer),
                    1e-12);
      }
      EXPECT_NE(log.find(fmt::format("simlayerkv: {} of {} layers lazy ({}), compression {:.4f}", n_lazy, n_layer,
                                     lazy_list.empty() ? "none" : lazy_list, ratio)),
                std::string::npos)
          << log;
      if (n_lazy > 0) {
        EXPECT_LT(f.kv->pool().n_used(), used) << "the lazy layers' blocks go back to the pool";
      }
    }
  }
}

// lazy_threshold = 1 (kvpress's default) and a layer no longer than n_initial + n_recent + n_last
// leave the cache alone; so does a budget-free short prompt of one token.
TEST(KvPressSimLayerKv, DefaultAndShortPromptsKeepEverything) {
  {
    SimFixture f(3, 4, 2, 8, 40, 2);
    auto p = make("simlayerkv", f.shape);
    EXPECT_EQ(p->spec(), "simlayerkv:lazy_threshold=1,n_last=1,n_recent=1024,n_initial=4,query=aware");
    f.compress(*p);
    for (int64_t il = 0; il < 3; ++il) EXPECT_EQ(f.kv->n_tokens(il, 0), 40);
  }
  for (int64_t L : {1, 8, 9}) {  // n_initial 2 + n_recent 5 + n_last 2 = 9
    SimFixture f(2, 4, 2, 8, L, 2);
    auto p = make("simlayerkv:lazy_threshold=0,n_last=2,n_recent=5,n_initial=2", f.shape);
    f.compress(*p);
    for (int64_t il = 0; il < 2; ++il)
      for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.kv->n_tokens(il, h), L) << L;
  }
  SimFixture f(2, 4, 2, 8, 10, 2);  // one token over: every layer is lazy at threshold 0
  auto p = make("simlayerkv:lazy_threshold=0,n_last=2,n_recent=5,n_initial=2", f.shape);
  f.compress(*p);
  for (int64_t il = 0; il < 2; ++il)
    for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.kept(il, h), (std::vector<int32_t>{0, 1, 7, 8, 9}));
  // spec() gives every parameter and parses back to itself.
  auto p2 = make(p->spec(), f.shape);
  EXPECT_EQ(p2->spec(), p->spec());
}

TEST(KvPressSimLayerKv, ErrorsNameTheKey) {
  const PressShape s{2, 4, 2, 8, 8, 0};
  const std::pair<const char*, const char*> bad[] = {
      {"simlayerkv:lazy_threshold=1.5", "lazy_threshold"}, {"simlayerkv:lazy_threshold=x", "lazy_threshold"},
      {"simlayerkv:n_last=0", "n_last"},                   {"simlayerkv:n_recent=0", "n_recent"},
      {"simlayerkv:n_initial=-1", "n_initial"},            {"simlayerkv:n_recent=4,n_last=4", "n_recent"},
      {"simlayerkv:ratio=0.5", "ratio"},                   {"simlayerkv:query=maybe", "query"},
  };
  for (const auto& [spec, key] : bad) {
    auto r = make_kv_press(spec, s);
    ASSERT_FALSE(r.has_value()) << spec;
    EXPECT_NE(r.error().message.find("simlayerkv"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(key), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace lc
