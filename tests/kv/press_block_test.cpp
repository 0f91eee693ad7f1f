// Block press (kvpress's BlockPress, after Park et al., arXiv 2504.15364): the kept sets against a
// double-precision oracle written from kvpress/presses/block_press.py (BlockPress.compress) over
// the oracle's own KeyDiffPress.score / KnormPress.score (keydiff_press.py, knorm_press.py):
// kept = the first n_kept tokens, then for every block of block_size after them the n_kept best
// of kept + block, scored on kept + block alone. The oracle rotates the test's pre-RoPE keys itself
// and never calls the press code. Ties go to the lower index (the project's rule).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/press.h"

namespace lc {
namespace {

struct BlockPrompt {
  int64_t n_layer, Hkv, d, L;
  std::vector<float> k, v;
  std::vector<double> kr;
  std::vector<int32_t> pos;
  std::unique_ptr<KvCache> kv;
  PressShape shape;

  BlockPrompt(int64_t n_layer_, int64_t H, int64_t Hkv_, int64_t d_, int64_t L_, uint32_t seed)
      : n_layer(n_layer_), Hkv(Hkv_), d(d_), L(L_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(n_layer * L * Hkv * d));
    v.resize(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    // Some keys share a direction, so that KeyDiff's anchor depends on which tokens it sees.
    for (size_t i = 0; i < k.size(); i += static_cast<size_t>(3 * d)) k[i] += 3.0f;
    for (int64_t t = 0; t < L; ++t) pos.push_back(static_cast<int32_t>(t));
    shape = PressShape{n_layer, H, Hkv, d, d, 0.0f};
    kr.resize(k.size());
    for (int64_t il = 0; il < n_layer; ++il)
      for (int64_t t = 0; t < L; ++t)
        for (int64_t h = 0; h < Hkv; ++h) {
          const float* x = k.data() + ((il * L + t) * Hkv + h) * d;
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
    c.head_dim_v = d;
    c.block_tokens = 16;
    LlamaCppRopeParams rp;
    rp.n_rot = d;
    rp.neox = true;
    c.rope = make_llama_cpp_rope(rp);
    auto r = KvCache::create(c);
    ASSERT_TRUE(r.has_value());
    kv = std::move(r.value());
    for (int64_t il = 0; il < n_layer; ++il)
      ASSERT_TRUE(kv->append(il, L, k.data() + il * L * Hkv * d, v.data() + il * L * Hkv * d, pos.data()).is_ok());
  }
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

// A scorer on the tokens `cur` (sequence indices) of (il, h), alone.
using Scorer = std::function<std::vector<double>(BlockPrompt&, int64_t il, int64_t h, const std::vector<int32_t>& cur)>;

// KeyDiffPress.score: anchor = mean of F.normalize(k) over cur; -F.cosine_similarity(k, anchor).
std::vector<double> keydiff(BlockPrompt& f, int64_t il, int64_t h, const std::vector<int32_t>& cur) {
  auto norm = [&](const double* x) {
    double a = 0;
    for (int64_t e = 0; e < f.d; ++e) a += x[e] * x[e];
    return std::sqrt(a);
  };
  std::vector<double> anchor(static_cast<size_t>(f.d), 0.0), s;
  for (int32_t t : cur)
    for (int64_t e = 0; e < f.d; ++e)
      anchor[static_cast<size_t>(e)] += f.K(il, t, h)[e] / std::max(norm(f.K(il, t, h)), 1e-12) / static_cast<double>(cur.size());
  const double an = std::max(norm(anchor.data()), 1e-8);
  for (int32_t t : cur) {
    double c = 0;
    for (int64_t e = 0; e < f.d; ++e) c += f.K(il, t, h)[e] * anchor[static_cast<size_t>(e)];
    s.push_back(-c / an / std::max(norm(f.K(il, t, h)), 1e-8));
  }
  return s;
}

// KnormPress.score: -||k|| (a score of the token alone).
std::vector<double> knorm(BlockPrompt& f, int64_t il, int64_t h, const std::vector<int32_t>& cur) {
  std::vector<double> s;
  for (int32_t t : cur) {
    double a = 0;
    for (int64_t e = 0; e < f.d; ++e) a += f.K(il, t, h)[e] * f.K(il, t, h)[e];
    s.push_back(-std::sqrt(a));
  }
  return s;
}

// The n best of cur by s (ties to the lower index); near: the cut is closer than float can call.
std::vector<int32_t> best(const std::vector<double>& s, const std::vector<int32_t>& cur, int64_t n, bool& near) {
  std::vector<size_t> o(cur.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](size_t a, size_t b) { return s[a] > s[b]; });
  if (n < static_cast<int64_t>(o.size()) && s[o[static_cast<size_t>(n - 1)]] - s[o[static_cast<size_t>(n)]] < 1e-6)
    near = true;
  std::vector<int32_t> r;
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(o.size()); ++i) r.push_back(cur[o[static_cast<size_t>(i)]]);
  std::sort(r.begin(), r.end());
  return r;
}

// BlockPress.compress for the held tokens `seq` of (il, h); block_size <= 0: one top-k over
// everything (the naive press without blocks).
std::vector<int32_t> block_oracle(BlockPrompt& f, int64_t il, int64_t h, const std::vector<int32_t>& seq, int64_t n_kept,
                                  int64_t block_size, const Scorer& score, bool& near) {
  const int64_t n = static_cast<int64_t>(seq.size());
  if (block_size <= 0) return best(score(f, il, h, seq), seq, n_kept, near);
  const int64_t bs = std::min(block_size, n);
  std::vector<int32_t> kept(seq.begin(), seq.begin() + n_kept);
  for (int64_t i = n_kept; i < n; i += bs) {
    std::vector<int32_t> cur = kept;
    for (int64_t j = i; j < std::min(i + bs, n); ++j) cur.push_back(seq[static_cast<size_t>(j)]);
    kept = best(score(f, il, h, cur), cur, n_kept, near);
  }
  return kept;
}

void expect_reference(BlockPrompt& f, const std::string& spec, int64_t block_size, const Scorer& score,
                      const std::function<int64_t(int64_t n)>& kept) {
  auto p = make_kv_press(spec, f.shape);
  ASSERT_TRUE(p.has_value()) << spec << ": " << p.error().message;
  std::vector<std::vector<int32_t>> before;
  for (int64_t il = 0; il < f.n_layer; ++il)
    for (int64_t h = 0; h < f.Hkv; ++h) before.push_back(f.held(il, h));
  f.compress(**p);
  for (int64_t il = 0; il < f.n_layer; ++il)
    for (int64_t h = 0; h < f.Hkv; ++h) {
      const auto& seq = before[static_cast<size_t>(il * f.Hkv + h)];
      bool near = false;
      const auto want = block_oracle(f, il, h, seq, kept(static_cast<int64_t>(seq.size())), block_size, score, near);
      ASSERT_FALSE(near) << spec << ": near-tie, pick another seed";
      EXPECT_EQ(f.held(il, h), want) << spec << " layer " << il << " head " << h;
    }
}

// kvpress's block_keydiff with GQA (3 query heads per KV head), blocks of 8, 32, 128 and one
// larger than the prompt, at three ratios and a budget; the last block is partial.
TEST(BlockOracle, KeptSetsEqualTheReference) {
  BlockPrompt f(2, 6, 2, 16, 157, 41);
  for (int pct : {25, 50, 75})
    for (int64_t bs : {8, 32, 128, 500}) {
      f.reset();
      const std::string spec = "block:ratio=" + std::to_string(pct / 100.0) + ",block_size=" + std::to_string(bs);
      expect_reference(f, spec, bs, keydiff, [&](int64_t n) { return (100 - pct) * n / 100; });
    }
  f.reset();
  expect_reference(f, "block:budget=30,block_size=16", 16, keydiff, [](int64_t n) { return std::min<int64_t>(30, n); });
  f.reset();
  expect_reference(f, "block:inner=knorm,ratio=0.5,block_size=16", 16, knorm, [](int64_t n) { return n / 2; });
}

// Blocks change KeyDiff's choice (its anchor is the mean of the tokens it sees), not a score of
// the token alone: with knorm the press is the plain top-k at every block size (kvpress's
// test_block_press_is_streaming_top_k), with keydiff it differs from the plain top-k.
TEST(BlockOracle, BlocksMatterOnlyForContextDependentScores) {
  BlockPrompt f(1, 4, 2, 16, 157, 41);
  int differ = 0;
  for (int64_t h = 0; h < 2; ++h) {
    const auto seq = f.held(0, h);
    bool near = false;
    differ += block_oracle(f, 0, h, seq, 78, 16, keydiff, near) != block_oracle(f, 0, h, seq, 78, 0, keydiff, near);
  }
  EXPECT_GT(differ, 0);
  std::vector<std::vector<int32_t>> plain;
  {
    auto p = make_kv_press("knorm:ratio=0.5", f.shape);
    ASSERT_TRUE(p.has_value());
    f.compress(**p);
    for (int64_t h = 0; h < 2; ++h) plain.push_back(f.held(0, h));
  }
  for (int64_t bs : {1, 2, 7, 64, 157}) {
    f.reset();
    auto p = make_kv_press("block:inner=knorm,ratio=0.5,block_size=" + std::to_string(bs), f.shape);
    ASSERT_TRUE(p.has_value());
    f.compress(**p);
    for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.held(0, h), plain[static_cast<size_t>(h)]) << bs;
  }
}

// Short prompts, budgets above the token count, heads of different lengths, and protection by
// sequence index (streaming_llm's sinks stay through every block).
TEST(BlockOracle, EdgeCases) {
  BlockPrompt f(1, 4, 2, 16, 40, 7);
  expect_reference(f, "block:ratio=0.5", 128, keydiff, [](int64_t n) { return n / 2; });  // one block of 40
  f.reset();
  auto p = make_kv_press("block:budget=100", f.shape);
  ASSERT_TRUE(p.has_value());
  f.compress(**p);
  EXPECT_EQ(f.kv->n_tokens(0, 0), 40);

  f.reset();
  std::vector<int32_t> keep;
  for (int32_t j = 0; j < 40; ++j)
    if (j % 3) keep.push_back(j);
  ASSERT_TRUE(f.kv->retain(0, 1, keep).is_ok());  // head 1: 26 tokens
  expect_reference(f, "block:ratio=0.5,block_size=4", 4, keydiff, [](int64_t n) { return n / 2; });
  EXPECT_EQ(f.kv->n_tokens(0, 1), 13);

  f.reset();
  auto s = make_kv_press("block:inner=streaming_llm,ratio=0.5,block_size=8", f.shape);
  ASSERT_TRUE(s.has_value());
  f.compress(**s);
  std::vector<int32_t> want = {0, 1, 2, 3};
  for (int32_t t = 24; t < 40; ++t) want.push_back(t);
  EXPECT_EQ(f.held(0, 0), want);
}

TEST(Block, SpecAndErrors) {
  const PressShape s{2, 4, 2, 16, 16, 0};
  auto p = make_kv_press("block", s);
  ASSERT_TRUE(p.has_value());
  const std::string spec = (*p)->spec();
  EXPECT_EQ(spec, "block:ratio=0.5,query=aware,inner=keydiff,block_size=128,n_sink=0,window=0,reduce=mean");
  EXPECT_EQ((*p)->n_obs(), 0);
  auto q = make_kv_press(spec, s);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ((*q)->spec(), spec);
  auto l = make_kv_press("block:inner=lagkv,lag_size=16", s);
  ASSERT_TRUE(l.has_value());
  EXPECT_NE((*l)->spec().find("inner=lagkv,block_size=128,n_sink=4,window=0,reduce=mean,lag_size=16"),
            std::string::npos)
      << (*l)->spec();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"block:inner=snapkv", "chunk=1"},   {"block:inner=h2o", "inner=h2o"},
      {"block:inner=speckv", "speckv"},    {"block:block_size=0", "block_size"},
      {"block:block_size=-4", "block_size"}, {"block:inner=nosuch", "expected a scorer"},
      {"block:blocksize=8", "block_size"}, {"block:budget=0", "budget"}};
  for (const auto& [b, key] : bad) {
    auto e = make_kv_press(b, s);
    ASSERT_FALSE(e.has_value()) << b;
    EXPECT_NE(e.error().message.find(key), std::string::npos) << b << ": " << e.error().message;
  }
}

}  // namespace
}  // namespace lc
