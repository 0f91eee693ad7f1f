// think against an oracle written here in double straight from kvpress's ThinKPress
// (NVIDIA/kvpress, kvpress/presses/think_press.py), on the test's own pre-RoPE data:
//   queries    = rope(q) of the last window_size tokens           (bsz, H, window, d)
//   queries_norm = queries.pow(2).mean(window) .view(Hkv, g, d).mean(g)
//   keys_norm  = keys.pow(2).mean(tokens)                          (keys: the cache's, post-RoPE)
//   indices    = (queries_norm * keys_norm).topk(int(d * ratio), largest=False)
//   keys[..., indices] = 0; values and the token count untouched.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// The shared prompt (press_prompt.h) with keys of type type_k. Channel e of every key is scaled
// by (1 + e % 5) / 3 and of every query by (1 + 3e % 5) / 3, so the channel scores spread.
struct ThinkFixture : test::PressPrompt {
  ThinkFixture(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t L_, DType type_k_, uint32_t seed)
      : PressPrompt(n_layer_, H_, Hkv_, d_, L_, seed, type_k_, 8, false) {
    for (size_t i = 0; i < k.size(); ++i) k[i] *= static_cast<float>(1 + (i % d) % 5) / 3.0f;
    for (size_t i = 0; i < q.size(); ++i) q[i] *= static_cast<float>(1 + ((i % d) * 3) % 5) / 3.0f;
    fill_cache();
  }
  std::vector<float> keys(int64_t il, int64_t h) const {
    std::vector<float> out(static_cast<size_t>(kv->n_tokens(il, h) * d));
    kv->read_keys(il, h, 0, kv->n_tokens(il, h), out.data());
    return out;
  }
  std::vector<float> values(int64_t il, int64_t h) const {
    std::vector<float> out(static_cast<size_t>(kv->n_tokens(il, h) * d));
    kv->read_values(il, h, 0, kv->n_tokens(il, h), out.data());
    return out;
  }
};

// The oracle: channels of KV head h of layer il that ThinKPress zeroes, ascending, scoring the
// tokens the head holds (their sequence indices `held`) with the last `window` queries.
std::vector<int32_t> oracle_pruned(const ThinkFixture& f, int64_t il, int64_t h, const std::vector<int32_t>& held,
                                   double ratio, int64_t window) {
  const int64_t d = f.d, g = f.H / f.Hkv, w = std::min(window, f.L);
  std::vector<double> qn(static_cast<size_t>(d), 0.0), kn(static_cast<size_t>(d), 0.0);
  for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
    std::vector<double> per(static_cast<size_t>(d), 0.0);  // mean over the window, then over the group
    for (int64_t t = f.L - w; t < f.L; ++t) {
      const auto r = f.rot(f.qpre(il, t) + hq * d, f.pos[static_cast<size_t>(t)]);
      for (int64_t e = 0; e < d; ++e) per[static_cast<size_t>(e)] += r[static_cast<size_t>(e)] * r[static_cast<size_t>(e)];
    }
    for (int64_t e = 0; e < d; ++e) qn[static_cast<size_t>(e)] += per[static_cast<size_t>(e)] / static_cast<double>(w) / g;
  }
  for (int32_t j : held) {
    const auto r = f.rot(f.kpre(il, j, h), f.pos[static_cast<size_t>(j)]);
    for (int64_t e = 0; e < d; ++e)
      kn[static_cast<size_t>(e)] += r[static_cast<size_t>(e)] * r[static_cast<size_t>(e)] / static_cast<double>(held.size());
  }
  std::vector<int32_t> ch(static_cast<size_t>(d));
  std::iota(ch.begin(), ch.end(), 0);
  std::sort(ch.begin(), ch.end(), [&](int32_t a, int32_t b) {
    const double sa = qn[static_cast<size_t>(a)] * kn[static_cast<size_t>(a)];
    const double sb = qn[static_cast<size_t>(b)] * kn[static_cast<size_t>(b)];
    return sa != sb ? sa < sb : a < b;
  });
  ch.resize(static_cast<size_t>(static_cast<int64_t>(static_cast<double>(d) * ratio)));
  std::sort(ch.begin(), ch.end());
  return ch;
}

std::unique_ptr<KvPress> make(const std::string& spec, const PressShape& s) {
  auto r = make_kv_press(spec, s);
  EXPECT_TRUE(r.has_value()) << spec << ": " << (r ? "" : r.error().message);
  return r ? std::move(*r) : nullptr;
}

// Channels that are zero in every row, and whether every other entry equals `before`'s.
std::vector<int32_t> zero_channels(const std::vector<float>& keys, int64_t d) {
  std::vector<int32_t> z;
  const int64_t n = static_cast<int64_t>(keys.size()) / d;
  for (int64_t e = 0; e < d; ++e) {
    bool all = n > 0;
    for (int64_t j = 0; j < n; ++j) all = all && keys[static_cast<size_t>(j * d + e)] == 0.0f;
    if (all) z.push_back(static_cast<int32_t>(e));
  }
  return z;
}

TEST(PressThink, ZeroesTheChannelsOfTheReference) {
  for (const double ratio : {0.5, 0.3, 0.75}) {
    for (const int64_t window : {int64_t{8}, int64_t{32}, int64_t{200}}) {  // 200: more than the prompt
      SCOPED_TRACE(testing::Message() << "ratio " << ratio << " window " << window);
      ThinkFixture f(2, 4, 2, 16, 50, DType::F32, 7);
      std::vector<std::vector<float>> kb, vb;
      for (int64_t il = 0; il < f.n_layer; ++il)
        for (int64_t h = 0; h < f.Hkv; ++h) kb.push_back(f.keys(il, h)), vb.push_back(f.values(il, h));
      auto p = make(fmt::format("think:channel_ratio={},window={}", ratio, window), f.shape);
      ASSERT_TRUE(p);
      EXPECT_EQ(p->n_obs(), window);
      f.compress(*p);
      for (int64_t il = 0; il < f.n_layer; ++il)
        for (int64_t h = 0; h < f.Hkv; ++h) {
          const auto want = oracle_pruned(f, il, h, f.held(il, h), ratio, window);
          ASSERT_EQ(static_cast<int64_t>(want.size()), static_cast<int64_t>(16 * ratio));
          const auto K = f.keys(il, h);
          EXPECT_EQ(zero_channels(K, f.d), want) << "layer " << il << " head " << h;
          const auto& K0 = kb[static_cast<size_t>(il * f.Hkv + h)];
          ASSERT_EQ(K.size(), K0.size());
          for (size_t i = 0; i < K.size(); ++i) {
            const bool pruned = std::binary_search(want.begin(), want.end(), static_cast<int32_t>(i % 16));
            if (!pruned) {
              ASSERT_EQ(K[i], K0[i]) << "an unpruned channel changed, entry " << i;
            }
          }
          EXPECT_EQ(f.values(il, h), vb[static_cast<size_t>(il * f.Hkv + h)]);
          EXPECT_EQ(f.kv->n_tokens(il, h), f.L);
        }
    }
  }
}

// ComposedPress([SnapKV, ThinK]): ThinK scores the tokens SnapKV kept.
TEST(PressThink, AfterATokenPressScoresTheKeptTokens) {
  ThinkFixture f(2, 4, 2, 16, 64, DType::F32, 11);
  auto p = make("snapkv:ratio=0.5,window=8,obs=8+think:channel_ratio=0.25,window=16", f.shape);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->n_obs(), 16);
  f.compress(*p);
  for (int64_t il = 0; il < f.n_layer; ++il)
    for (int64_t h = 0; h < f.Hkv; ++h) {
      const auto kept = f.held(il, h);
      ASSERT_EQ(static_cast<int64_t>(kept.size()), 32);
      EXPECT_EQ(zero_channels(f.keys(il, h), f.d), oracle_pruned(f, il, h, kept, 0.25, 16));
    }
}

// Quantised keys: the pruned channels read back as exact zeros; keys appended afterwards (while
// generating) keep every channel.
TEST(PressThink, QuantisedKeysAndLaterTokens) {
  for (const DType t : {DType::F16, DType::Q8_0}) {
    ThinkFixture f(1, 2, 1, 32, 40, t, 5);
    auto p = make("think:channel_ratio=0.5", f.shape);
    ASSERT_TRUE(p);
    f.compress(*p);
    const auto z = zero_channels(f.keys(0, 0), f.d);
    EXPECT_EQ(z.size(), 16u);
    std::vector<float> k1(32, 1.0f), v1(32, 1.0f);
    const int32_t p1 = 40;
    ASSERT_TRUE(f.kv->append(0, 1, k1.data(), v1.data(), &p1).is_ok());
    const auto K = f.keys(0, 0);
    for (int32_t e : z) EXPECT_NE(K[static_cast<size_t>(40 * 32 + e)], 0.0f) << "channel " << e;
  }
}

TEST(PressThink, NothingToPruneAndBadSpecs) {
  ThinkFixture f(1, 2, 1, 8, 20, DType::F32, 3);
  const auto before = f.keys(0, 0);
  auto p = make("think:channel_ratio=0.1", f.shape);  // int(8 * 0.1) = 0 channels
  ASSERT_TRUE(p);
  f.compress(*p);
  EXPECT_EQ(f.keys(0, 0), before);
  EXPECT_NE(p->spec().find("channel_ratio=0.1"), std::string::npos);
  for (const char* bad : {"think:channel_ratio=1.5", "think:ratio=0.5", "think:window=0", "think:query=maybe"}) {
    auto r = make_kv_press(bad, f.shape);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_NE(r.error().message.find("think"), std::string::npos) << r.error().message;
  }
  // A queries-less call is an error, not a crash.
  auto q = make("think", f.shape);
  PressContext c;
  c.kv = f.kv.get();
  c.n_obs = 4;
  EXPECT_FALSE(q->compress(c, 0).is_ok());
  EXPECT_FALSE(q->compress(PressContext{f.kv.get()}, 5).is_ok());
}

}  // namespace
}  // namespace lc
