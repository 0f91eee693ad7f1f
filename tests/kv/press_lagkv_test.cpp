// LagKV (Liang et al., arXiv 2504.04704): the kept sets against a double-precision oracle written
// from kvpress's LagKVPress (kvpress/presses/lagkv_press.py: score, _get_states_score) and
// ScorerPress.compress (topk of floor((1 - ratio) n) per KV head; ties to the lower index, the
// project's rule). The oracle rotates the test's pre-RoPE keys itself (neox, base 10000) and
// reads the values as given: it never calls the press code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/method_info.h"
#include "kv/kv_cache.h"
#include "kv/press.h"

namespace lc {
namespace {

// n_layer layers of L tokens (f32, neox RoPE over all dims); keys rotated again in double here.
struct LagPrompt {
  int64_t n_layer, H, Hkv, d, dv, L;
  std::vector<float> k, v;
  std::vector<double> kr;
  std::vector<int32_t> pos;
  std::unique_ptr<KvCache> kv;
  PressShape shape;

  LagPrompt(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t dv_, int64_t L_, uint32_t seed)
      : n_layer(n_layer_), H(H_), Hkv(Hkv_), d(d_), dv(dv_), L(L_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(n_layer * L * Hkv * d));
    v.resize(static_cast<size_t>(n_layer * L * Hkv * dv));
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (int64_t t = 0; t < L; ++t) pos.push_back(static_cast<int32_t>(t));
    shape = PressShape{n_layer, H, Hkv, d, dv, 0.0f};
    kr.resize(k.size());
    for (int64_t il = 0; il < n_layer; ++il)
      for (int64_t t = 0; t < L; ++t)
        for (int64_t h = 0; h < Hkv; ++h) {
          const float* x = kpre(il, t, h);
          double* o = K(il, t, h);
          for (int64_t i = 0; i < d / 2; ++i) {
            const double a = static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
            o[i] = x[i] * std::cos(a) - x[i + d / 2] * std::sin(a);
            o[i + d / 2] = x[i] * std::sin(a) + x[i + d / 2] * std::cos(a);
          }
        }
    reset();
  }
  void reset() {
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
    ASSERT_TRUE(r.has_value());
    kv = std::move(r.value());
    for (int64_t il = 0; il < n_layer; ++il)
      ASSERT_TRUE(kv->append(il, L, kpre(il, 0, 0), v.data() + il * L * Hkv * dv, pos.data()).is_ok());
  }
  const float* kpre(int64_t il, int64_t t, int64_t h) const { return k.data() + ((il * L + t) * Hkv + h) * d; }
  const float* V(int64_t il, int64_t t, int64_t h) const { return v.data() + ((il * L + t) * Hkv + h) * dv; }
  double* K(int64_t il, int64_t t, int64_t h) { return kr.data() + ((il * L + t) * Hkv + h) * d; }
  std::vector<int32_t> held(int64_t il, int64_t h) const {
    const int32_t* s = kv->seq_index(il, h);
    return std::vector<int32_t>(s, s + kv->n_tokens(il, h));
  }
  void compress(KvPress& p) {
    for (int64_t il = 0; il < n_layer; ++il) {
      PressContext c;
      c.kv = kv.get();
      ASSERT_TRUE(p.compress(c, il).is_ok());
    }
  }
};

enum class Ref { kNext, kOwn };  // kOwn: the naive variant, normalised by the partition itself

// _get_states_score of one partition: rows [lag][dim] (x[i][e]), reference rows ref[lag][dim].
std::vector<double> states_score(const std::vector<std::vector<double>>& x, const std::vector<std::vector<double>>& ref) {
  const size_t lag = x.size(), dim = x[0].size();
  std::vector<double> sd(lag);
  for (size_t i = 0; i < lag; ++i) {
    std::vector<double> y(dim);
    double mean = 0;
    for (size_t e = 0; e < dim; ++e) {
      double mn = ref[0][e], mx = ref[0][e];
      for (const auto& r : ref) mn = std::min(mn, r[e]), mx = std::max(mx, r[e]);
      y[e] = (x[i][e] - mn) / (mx - mn);
      mean += y[e] / static_cast<double>(dim);
    }
    double var = 0;
    for (double a : y) var += (a - mean) * (a - mean);
    sd[i] = std::sqrt(var / static_cast<double>(dim - 1));  // torch.std (correction 1)
  }
  double z = 0, mx = *std::max_element(sd.begin(), sd.end());
  for (double& a : sd) z += (a = std::exp(a - mx));
  for (double& a : sd) a /= z;
  return sd;
}

// LagKVPress.score for the held tokens `seq` of (il, h). ok: false if two scores of a partition
// are too close to order the same way in float and double (a near-tie: pick another seed).
std::vector<double> lagkv_oracle(LagPrompt& f, int64_t il, int64_t h, const std::vector<int32_t>& seq, int64_t n_sink,
                                 int64_t lag, bool cross, Ref ref, bool& ok) {
  const int64_t q = static_cast<int64_t>(seq.size());
  std::vector<double> s(static_cast<size_t>(q), 1.0);
  if (q < n_sink + 2 * lag) {
    for (int64_t i = 0; n_sink + i < q; ++i) s[static_cast<size_t>(n_sink + i)] = static_cast<double>(i) / static_cast<double>(q - n_sink);
    return s;
  }
  const int64_t end = n_sink + ((q - n_sink) / lag) * lag, parts = (end - n_sink) / lag;
  auto rows = [&](int64_t p, bool keys) {
    std::vector<std::vector<double>> r;
    for (int64_t i = 0; i < lag; ++i) {
      const int32_t t = seq[static_cast<size_t>(n_sink + p * lag + i)];
      if (keys) r.emplace_back(f.K(il, t, h), f.K(il, t, h) + f.d);
      else r.emplace_back(f.V(il, t, h), f.V(il, t, h) + f.dv);
    }
    return r;
  };
  for (int64_t p = 0; p + 1 < parts; ++p) {
    const int64_t pr = ref == Ref::kNext ? p + 1 : p;
    const auto sk = states_score(rows(p, true), rows(pr, true));
    const auto sv = states_score(rows(p, false), rows(pr, false));
    std::vector<double> sc(static_cast<size_t>(lag));
    for (int64_t i = 0; i < lag; ++i) sc[static_cast<size_t>(i)] = (sk[static_cast<size_t>(i)] + sv[static_cast<size_t>(i)]) / 2;
    std::vector<int> order(static_cast<size_t>(lag));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return sc[static_cast<size_t>(a)] < sc[static_cast<size_t>(b)]; });
    for (int64_t i = 0; i + 1 < lag; ++i) {
      const double a = sc[static_cast<size_t>(order[static_cast<size_t>(i)])], b = sc[static_cast<size_t>(order[static_cast<size_t>(i + 1)])];
      if (b - a < 1e-6 * b) ok = false;
    }
    for (int64_t i = 0; i < lag; ++i)
      s[static_cast<size_t>(n_sink + p * lag + order[static_cast<size_t>(i)])] =
          cross ? sc[static_cast<size_t>(order[static_cast<size_t>(i)])] : static_cast<double>(i) / static_cast<double>(lag);
  }
  return s;
}

// ScorerPress.compress: topk(n_kept), higher first, ties to the lower index; as sequence indices.
std::vector<int32_t> topk(const std::vector<double>& s, const std::vector<int32_t>& seq, int64_t n_kept) {
  std::vector<int32_t> o(s.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; });
  o.resize(static_cast<size_t>(std::min<int64_t>(n_kept, static_cast<int64_t>(o.size()))));
  std::vector<int32_t> out;
  for (int32_t j : o) out.push_back(seq[static_cast<size_t>(j)]);
  std::sort(out.begin(), out.end());
  return out;
}

int64_t kept_count(int64_t n, int pct) { return (100 - pct) * n / 100; }

struct LagCase {
  int64_t H, Hkv, d, dv, L, n_sink, lag;
  bool cross;
  uint32_t seed;
};

void check_case(const LagCase& lc, const std::vector<int>& pcts) {
  LagPrompt f(2, lc.H, lc.Hkv, lc.d, lc.dv, lc.L, lc.seed);
  for (int pct : pcts) {
    f.reset();
    const std::string spec = "lagkv:n_sink=" + std::to_string(lc.n_sink) + ",lag_size=" + std::to_string(lc.lag) +
                             ",cross_scoring=" + (lc.cross ? "1" : "0") + ",ratio=" + std::to_string(pct / 100.0);
    auto p = make_kv_press(spec, f.shape);
    ASSERT_TRUE(p.has_value()) << spec << ": " << p.error().message;
    std::vector<std::vector<std::vector<int32_t>>> held(2);
    for (int64_t il = 0; il < 2; ++il)
      for (int64_t h = 0; h < f.Hkv; ++h) held[static_cast<size_t>(il)].push_back(f.held(il, h));
    f.compress(**p);
    for (int64_t il = 0; il < 2; ++il)
      for (int64_t h = 0; h < f.Hkv; ++h) {
        const auto& seq = held[static_cast<size_t>(il)][static_cast<size_t>(h)];
        bool ok = true;
        const auto s = lagkv_oracle(f, il, h, seq, lc.n_sink, lc.lag, lc.cross, Ref::kNext, ok);
        ASSERT_TRUE(ok) << spec << ": near-tie in the oracle, pick another seed";
        const auto want = topk(s, seq, kept_count(static_cast<int64_t>(seq.size()), pct));
        EXPECT_EQ(f.held(il, h), want) << spec << " layer " << il << " head " << h;
      }
  }
}

// MHA, GQA (4 query heads on 2 KV heads: the scores are per KV head), head_dim_v != head_dim,
// a remainder after the last full partition, and lag sizes that leave 2 and several partitions.
TEST(LagKvOracle, KeptSetsEqualTheReference) {
  const std::vector<int> pcts = {25, 50, 75};
  check_case({2, 2, 16, 16, 4 + 8 * 5 + 3, 4, 8, false, 11}, pcts);   // 5 partitions + 3 left over
  check_case({4, 2, 16, 8, 4 + 8 * 6, 4, 8, false, 12}, pcts);       // GQA, dv 8, no remainder
  check_case({6, 2, 8, 12, 2 + 16 * 2 + 5, 2, 16, false, 13}, pcts); // 2 partitions: 1 scored
  check_case({4, 2, 16, 16, 0 + 8 * 7 + 6, 0, 8, false, 14}, pcts);  // no sinks
  check_case({4, 2, 16, 16, 4 + 8 * 5 + 3, 4, 8, true, 15}, pcts);   // cross_scoring: raw scores
}

// Fewer than n_sink + 2 lag_size tokens: the reference's sliding window (sinks + most recent).
TEST(LagKvOracle, ShortPromptKeepsSinksAndTheMostRecent) {
  LagPrompt f(1, 4, 2, 16, 16, 30, 3);
  auto p = make_kv_press("lagkv:ratio=0.5,lag_size=16", f.shape);  // 30 < 4 + 32
  ASSERT_TRUE(p.has_value());
  f.compress(**p);
  std::vector<int32_t> want = {0, 1, 2, 3};
  for (int32_t t = 19; t < 30; ++t) want.push_back(t);  // 15 kept: 4 sinks + the last 11
  for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.held(0, h), want);
}

// Heads holding different tokens (an earlier eviction): each is partitioned over what it holds.
TEST(LagKvOracle, HeadsOfDifferentLengths) {
  LagPrompt f(2, 4, 2, 16, 16, 90, 21);
  for (int64_t il = 0; il < 2; ++il) {
    std::vector<int32_t> keep;
    for (int32_t j = 0; j < 90; ++j)
      if (j % 3 != 1 || j < 4) keep.push_back(j);
    ASSERT_TRUE(f.kv->retain(il, 1, keep).is_ok());  // head 1: 62 tokens, head 0: 90
  }
  std::vector<std::vector<int32_t>> held;
  for (int64_t il = 0; il < 2; ++il)
    for (int64_t h = 0; h < 2; ++h) held.push_back(f.held(il, h));
  auto p = make_kv_press("lagkv:ratio=0.5,lag_size=8", f.shape);
  ASSERT_TRUE(p.has_value());
  f.compress(**p);
  for (int64_t il = 0; il < 2; ++il)
    for (int64_t h = 0; h < 2; ++h) {
      const auto& seq = held[static_cast<size_t>(il * 2 + h)];
      bool ok = true;
      const auto s = lagkv_oracle(f, il, h, seq, 4, 8, false, Ref::kNext, ok);
      ASSERT_TRUE(ok);
      // ratio applies to the tokens the layer has seen (90), as every scored press.
      EXPECT_EQ(f.held(il, h), topk(s, seq, std::min<int64_t>(45, static_cast<int64_t>(seq.size())))) << il << " " << h;
    }
}

// The reference normalises by the NEXT partition: normalising by the partition itself (the
// nearest naive reading) selects differently on this data, so the oracle test tells them apart.
TEST(LagKvOracle, NextPartitionReferenceMatters) {
  LagPrompt f(1, 4, 2, 16, 16, 4 + 8 * 5 + 3, 11);
  std::vector<int32_t> seq(static_cast<size_t>(f.L));
  std::iota(seq.begin(), seq.end(), 0);
  int differ = 0;
  for (int64_t h = 0; h < 2; ++h) {
    bool ok = true;
    const auto a = topk(lagkv_oracle(f, 0, h, seq, 4, 8, false, Ref::kNext, ok), seq, 23);
    const auto b = topk(lagkv_oracle(f, 0, h, seq, 4, 8, false, Ref::kOwn, ok), seq, 23);
    differ += a != b;
  }
  EXPECT_GT(differ, 0);
}

TEST(LagKv, SpecKeysAndErrors) {
  const PressShape s{2, 4, 2, 16, 16, 0};
  auto p = make_kv_press("lagkv", s);
  ASSERT_TRUE(p.has_value());
  const std::string spec = (*p)->spec();
  EXPECT_NE(spec.find("lagkv:ratio=0.5,n_sink=4,window=0"), std::string::npos) << spec;
  EXPECT_NE(spec.find("lag_size=128,cross_scoring=0"), std::string::npos) << spec;
  EXPECT_EQ((*p)->n_obs(), 0);
  // The spec it reports parses back to itself.
  auto q = make_kv_press(spec, s);
  ASSERT_TRUE(q.has_value()) << spec << ": " << q.error().message;
  EXPECT_EQ((*q)->spec(), spec);
  for (const char* bad : {"lagkv:lag_size=0", "lagkv:lag_size=x", "lagkv:n_sink=-1", "lagkv:cross_scoring=2"}) {
    auto e = make_kv_press(bad, s);
    ASSERT_FALSE(e.has_value()) << bad;
    const std::string key = std::string(bad).substr(6, std::string(bad).find('=') - 6);
    EXPECT_NE(e.error().message.find(key), std::string::npos) << e.error().message;
  }
  auto e = make_kv_press("lagkv:lag=8", s);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("lag_size"), std::string::npos) << e.error().message;  // lists accepted keys
}

}  // namespace
}  // namespace lc
