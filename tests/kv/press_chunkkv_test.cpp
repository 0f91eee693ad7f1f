// ChunkKV (Liu et al., arXiv 2502.00299): the kept sets against a double-precision oracle written
// from kvpress's ChunkKVPress.compress (kvpress/presses/chunkkv_press.py) over the oracle's own
// SnapKVPress.score and KnormPress.score (snapkv_press.py, knorm_press.py): inner scores summed
// over the KV heads, mean per chunk (the partial last chunk over its own tokens), the best
// max(1, floor((1 - ratio) n_chunks)) chunks for every head; fewer than chunk_length tokens: the
// inner press's own top-k. The oracle rotates the test's pre-RoPE data itself; it never calls the
// press code. Ties go to the lower chunk / token (the project's rule; torch's topk leaves them open).
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
#include "press_prompt.h"

namespace lc {
namespace {

// The shared prompt (press_prompt.h, blocks of 16 tokens) with every key and query rotated in
// double up front; reset() gives a fresh cache.
struct ChunkPrompt : test::PressPrompt {
  ChunkPrompt(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t L_, uint32_t seed)
      : PressPrompt(n_layer_, H_, Hkv_, d_, L_, seed, DType::F32, 16) {
    rotate_all();
  }
  void reset() { fill_cache(); }
};

using LayerScores = std::vector<std::vector<double>>;  // [KV head][token]

// SnapKVPress.score on a full prompt: mean over the last w queries of the causal softmax,
// first L - w tokens, avg_pool1d(kernel, padding kernel / 2), mean over the group; the window
// padded with scores.max() + 1 (max over the layer).
LayerScores snapkv_scores(ChunkPrompt& f, int64_t il, int64_t w, int64_t kernel) {
  const int64_t g = f.H / f.Hkv, n_pre = f.L - w, d = f.d;
  LayerScores s(static_cast<size_t>(f.Hkv), std::vector<double>(static_cast<size_t>(f.L), 0.0));
  double mx = -1e300;
  for (int64_t h = 0; h < f.Hkv; ++h) {
    for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
      std::vector<double> a(static_cast<size_t>(n_pre), 0.0);
      for (int64_t t = f.L - w; t < f.L; ++t) {
        std::vector<double> p(static_cast<size_t>(t + 1));
        double m = -1e300, z = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double x = 0;
          for (int64_t e = 0; e < d; ++e) x += f.Q(il, t, hq)[e] * f.K(il, j, h)[e];
          p[static_cast<size_t>(j)] = x / std::sqrt(static_cast<double>(d));
          m = std::max(m, p[static_cast<size_t>(j)]);
        }
        for (double& x : p) z += (x = std::exp(x - m));
        for (int64_t j = 0; j < n_pre; ++j) a[static_cast<size_t>(j)] += p[static_cast<size_t>(j)] / z / static_cast<double>(w);
      }
      for (int64_t j = 0; j < n_pre; ++j) {
        double acc = 0;
        for (int64_t i = j - kernel / 2; i <= j + kernel / 2; ++i)
          if (i >= 0 && i < n_pre) acc += a[static_cast<size_t>(i)];
        s[static_cast<size_t>(h)][static_cast<size_t>(j)] += acc / static_cast<double>(kernel) / static_cast<double>(g);
      }
    }
    for (int64_t j = 0; j < n_pre; ++j) mx = std::max(mx, s[static_cast<size_t>(h)][static_cast<size_t>(j)]);
  }
  for (auto& r : s)
    for (int64_t j = n_pre; j < f.L; ++j) r[static_cast<size_t>(j)] = mx + 1;
  return s;
}

// KnormPress.score: -||k|| of the held tokens seq[h].
LayerScores knorm_scores(ChunkPrompt& f, int64_t il, const std::vector<std::vector<int32_t>>& seq) {
  LayerScores s(static_cast<size_t>(f.Hkv));
  for (int64_t h = 0; h < f.Hkv; ++h)
    for (int32_t t : seq[static_cast<size_t>(h)]) {
      double a = 0;
      for (int64_t e = 0; e < f.d; ++e) a += f.K(il, t, h)[e] * f.K(il, t, h)[e];
      s[static_cast<size_t>(h)].push_back(-std::sqrt(a));
    }
  return s;
}

enum class Variant { kReference, kPerHead, kRemainderOverL };

// ChunkKVPress.compress for heads holding the tokens seq[h] (sequence indices, ascending); the
// union rule of press_chunkkv.cpp when they differ. Returns the kept sequence indices per head.
// kPerHead: each head picks its own chunks (the naive reading); kRemainderOverL: the partial
// chunk's sum divided by chunk_length. near: set when the cut between kept and dropped chunks
// is too close to call in float.
std::vector<std::vector<int32_t>> chunkkv_oracle(const LayerScores& s, const std::vector<std::vector<int32_t>>& seq,
                                                 int64_t Lc, int pct, int64_t budget, Variant var, bool& near) {
  const size_t Hkv = s.size();
  std::vector<int32_t> U;
  for (const auto& x : seq) U.insert(U.end(), x.begin(), x.end());
  std::sort(U.begin(), U.end());
  U.erase(std::unique(U.begin(), U.end()), U.end());
  const int64_t n = static_cast<int64_t>(U.size()), n_full = n / Lc, rem = n % Lc, n_chunks = n_full + (rem > 0);
  std::vector<std::vector<int32_t>> out(Hkv);
  auto pick = [&](const std::vector<double>& cs, int64_t k) {
    std::vector<int64_t> o(cs.size());
    std::iota(o.begin(), o.end(), 0);
    std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return cs[static_cast<size_t>(a)] > cs[static_cast<size_t>(b)]; });
    if (k < static_cast<int64_t>(o.size())) {
      const double a = cs[static_cast<size_t>(o[static_cast<size_t>(k - 1)])], b = cs[static_cast<size_t>(o[static_cast<size_t>(k)])];
      if (a - b < 1e-5 * std::max(std::fabs(a), std::fabs(b))) near = true;
    }
    std::vector<uint8_t> ch(cs.size(), 0);
    for (int64_t i = 0; i < k; ++i) ch[static_cast<size_t>(o[static_cast<size_t>(i)])] = 1;
    return ch;
  };
  if (n_full == 0) {  // self.press.compress: topk(int(k_len (1 - ratio))) per head
    for (size_t h = 0; h < Hkv; ++h) {
      const int64_t nh = static_cast<int64_t>(seq[h].size());
      const int64_t kept = std::max<int64_t>(1, budget > 0 ? std::min(budget, nh) : (100 - pct) * nh / 100);
      const auto ch = pick(s[h], kept);
      for (int64_t j = 0; j < nh; ++j)
        if (ch[static_cast<size_t>(j)]) out[h].push_back(seq[h][static_cast<size_t>(j)]);
    }
    return out;
  }
  const int64_t k = std::max<int64_t>(1, budget > 0 ? std::min(n_chunks, budget * n_chunks / n) : (100 - pct) * n_chunks / 100);
  auto chunk_scores = [&](const std::vector<size_t>& heads) {
    std::vector<double> cs(static_cast<size_t>(n_chunks), 0.0);
    for (size_t h : heads)
      for (size_t j = 0; j < seq[h].size(); ++j) {
        const int64_t u = std::lower_bound(U.begin(), U.end(), seq[h][j]) - U.begin();
        cs[static_cast<size_t>(u / Lc)] += s[h][j];
      }
    for (int64_t c = 0; c < n_chunks; ++c)
      cs[static_cast<size_t>(c)] /= static_cast<double>(c < n_full || var == Variant::kRemainderOverL ? Lc : rem);
    return cs;
  };
  auto emit = [&](size_t h, const std::vector<uint8_t>& ch) {
    for (int32_t t : seq[h]) {
      const int64_t u = std::lower_bound(U.begin(), U.end(), t) - U.begin();
      if (ch[static_cast<size_t>(u / Lc)]) out[h].push_back(t);
    }
  };
  if (var == Variant::kPerHead) {
    for (size_t h = 0; h < Hkv; ++h) emit(h, pick(chunk_scores({h}), k));
  } else {
    std::vector<size_t> all(Hkv);
    std::iota(all.begin(), all.end(), 0);
    const auto ch = pick(chunk_scores(all), k);
    for (size_t h = 0; h < Hkv; ++h) emit(h, ch);
  }
  return out;
}

std::vector<std::vector<int32_t>> held_all(const ChunkPrompt& f, int64_t il) {
  std::vector<std::vector<int32_t>> r;
  for (int64_t h = 0; h < f.Hkv; ++h) r.push_back(f.held(il, h));
  return r;
}

// Runs spec (ratio or budget appended) and compares every layer's kept sets with the oracle.
void expect_reference(ChunkPrompt& f, const std::string& spec, int64_t Lc,
                      const std::function<LayerScores(int64_t il, const std::vector<std::vector<int32_t>>&)>& scores,
                      int pct, int64_t budget = -1) {
  const std::string full = spec + (budget > 0 ? ",budget=" + std::to_string(budget) : ",ratio=" + std::to_string(pct / 100.0));
  auto p = make_kv_press(full, f.shape);
  ASSERT_TRUE(p.has_value()) << full << ": " << p.error().message;
  std::vector<std::vector<std::vector<int32_t>>> before;
  for (int64_t il = 0; il < f.n_layer; ++il) before.push_back(held_all(f, il));
  f.compress(**p);
  for (int64_t il = 0; il < f.n_layer; ++il) {
    bool near = false;
    const auto want = chunkkv_oracle(scores(il, before[static_cast<size_t>(il)]), before[static_cast<size_t>(il)], Lc, pct,
                                     budget, Variant::kReference, near);
    ASSERT_FALSE(near) << full << ": near-tie at the cut, pick another seed";
    for (int64_t h = 0; h < f.Hkv; ++h)
      EXPECT_EQ(f.held(il, h), want[static_cast<size_t>(h)]) << full << " layer " << il << " head " << h;
  }
}

// kvpress's chunkkv (SnapKV inner, chunk_length 20) with GQA (3 query heads per KV head) and a
// remainder chunk of 17 tokens; knorm inner at chunk lengths that leave 1 to 37 over; budget=.
TEST(ChunkKvOracle, KeptSetsEqualTheReference) {
  ChunkPrompt f(2, 6, 2, 16, 157, 31);
  auto snap = [&](int64_t il, const std::vector<std::vector<int32_t>>&) { return snapkv_scores(f, il, 8, 5); };
  auto knorm = [&](int64_t il, const std::vector<std::vector<int32_t>>& seq) { return knorm_scores(f, il, seq); };
  for (int pct : {10, 25, 50, 75, 90}) {
    f.reset();
    expect_reference(f, "chunkkv:obs=8", 20, snap, pct);
    for (int64_t Lc : {12, 16, 24, 30, 40}) {
      f.reset();
      expect_reference(f, "chunkkv:inner=knorm,chunk_length=" + std::to_string(Lc), Lc, knorm, pct);
    }
  }
  f.reset();
  expect_reference(f, "chunkkv:obs=8", 20, snap, 0, 60);  // 8 chunks, floor(60 x 8 / 157) = 3 kept
  f.reset();
  expect_reference(f, "chunkkv:obs=8", 20, snap, 0, 1000);  // above the token count: all kept
  EXPECT_EQ(f.kv->n_tokens(0, 0), 157);
}

// Fewer tokens than one chunk: the inner press alone, per head (here knorm, heads differ).
TEST(ChunkKvOracle, ShortPromptFallsBackToTheInnerPress) {
  ChunkPrompt f(1, 4, 2, 16, 15, 5);
  auto knorm = [&](int64_t il, const std::vector<std::vector<int32_t>>& seq) { return knorm_scores(f, il, seq); };
  expect_reference(f, "chunkkv:inner=knorm", 20, knorm, 50);
  EXPECT_EQ(f.kv->n_tokens(0, 0), 7);
  EXPECT_NE(f.held(0, 0), f.held(0, 1));
}

// Heads holding different tokens: chunks over the union of the held tokens; every head keeps
// what it holds of the same chunks.
TEST(ChunkKvOracle, HeadsOfDifferentLengths) {
  ChunkPrompt f(1, 4, 2, 16, 120, 9);
  std::vector<int32_t> keep;
  for (int32_t j = 0; j < 120; ++j)
    if (j % 4 != 2) keep.push_back(j);
  ASSERT_TRUE(f.kv->retain(0, 1, keep).is_ok());
  auto knorm = [&](int64_t il, const std::vector<std::vector<int32_t>>& seq) { return knorm_scores(f, il, seq); };
  expect_reference(f, "chunkkv:inner=knorm,chunk_length=10", 10, knorm, 50);
  EXPECT_EQ(f.kv->n_tokens(0, 0), 60);
  const auto h0 = f.held(0, 0);
  for (int32_t t : f.held(0, 1)) EXPECT_TRUE(std::count(h0.begin(), h0.end(), t)) << t;
}

// What the test tells apart: the reference's one choice per layer and its remainder mean select
// differently from a per-head choice and from a remainder divided by chunk_length on this data.
TEST(ChunkKvOracle, SharedChunksAndRemainderMeanMatter) {
  ChunkPrompt f(2, 6, 2, 16, 157, 31);
  int per_head = 0, remainder = 0;
  for (int64_t il = 0; il < 2; ++il) {
    const auto seq = held_all(f, il);
    const auto s = snapkv_scores(f, il, 8, 5);
    for (int pct : {25, 50, 75}) {
      bool near = false;
      const auto ref = chunkkv_oracle(s, seq, 20, pct, -1, Variant::kReference, near);
      per_head += ref != chunkkv_oracle(s, seq, 20, pct, -1, Variant::kPerHead, near);
      const auto k = knorm_scores(f, il, seq);
      for (int64_t Lc : {12, 16, 24, 30, 40})
        remainder += chunkkv_oracle(k, seq, Lc, pct, -1, Variant::kReference, near) !=
                     chunkkv_oracle(k, seq, Lc, pct, -1, Variant::kRemainderOverL, near);
    }
  }
  EXPECT_GT(per_head, 0);
  EXPECT_GT(remainder, 0);
}

TEST(ChunkKv, RatioZeroSpecAndErrors) {
  ChunkPrompt f(1, 4, 2, 16, 50, 2);
  auto p0 = make_kv_press("chunkkv:ratio=0", f.shape);
  ASSERT_TRUE(p0.has_value());
  f.compress(**p0);
  EXPECT_EQ(f.kv->n_tokens(0, 0), 50);

  auto p = make_kv_press("chunkkv", f.shape);
  ASSERT_TRUE(p.has_value());
  const std::string spec = (*p)->spec();
  EXPECT_EQ(spec, "chunkkv:ratio=0.5,query=aware,inner=snapkv,chunk_length=20,n_sink=0,window=64,reduce=mean,"
                  "obs=64,kernel=5,pool=avg");
  EXPECT_EQ((*p)->n_obs(), 64);
  auto q = make_kv_press(spec, f.shape);
  ASSERT_TRUE(q.has_value()) << q.error().message;
  EXPECT_EQ((*q)->spec(), spec);
  EXPECT_EQ((*make_kv_press("chunkkv:inner=knorm,budget=40", f.shape))->n_obs(), 0);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"chunkkv:chunk_length=0", "chunk_length"}, {"chunkkv:chunk_length=2.5", "chunk_length"},
      {"chunkkv:inner=nosuch", "inner=nosuch"},   {"chunkkv:inner=pyramidkv", "inner=pyramidkv"},
      {"chunkkv:chunk=20", "chunk_length"},       {"chunkkv:ratio=1.5", "ratio"},
      {"chunkkv:ratio=0.5,budget=10", "ratio"},   {"chunkkv:inner=knorm,obs=8", "obs"}};
  for (const auto& [s, key] : bad) {
    auto e = make_kv_press(s, f.shape);
    ASSERT_FALSE(e.has_value()) << s;
    EXPECT_NE(e.error().message.find(key), std::string::npos) << s << ": " << e.error().message;
  }
}

}  // namespace
}  // namespace lc
