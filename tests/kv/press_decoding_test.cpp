// Decoding press (kvpress's DecodingPress): generation simulated token by token as the runtime does
// it (append, then compress(kDecode) with the last n_obs() queries when decode_due), against a
// double-precision oracle that replays kvpress/presses/decoding_press.py's forward_hook: a per-layer
// buffer of the decode steps' states (appended, the step counted, compression at
// compression_interval steps with the buffer, emptied, then trimmed to hidden_states_buffer_size),
// and ScorerPress.compress to target_size tokens over the oracle's own KnormPress / SnapKVPress
// scores. The oracle rotates the test's pre-RoPE data itself; it never calls the press code.
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

// T = L0 + N tokens of data: the first L0 are the prompt, the rest are generated one at a time.
struct Generation {
  int64_t n_layer, H, Hkv, d, L0, T;
  std::vector<float> k, v, q;
  std::vector<double> kr, qr;
  std::vector<int32_t> pos;
  std::unique_ptr<KvCache> kv;
  PressShape shape;

  Generation(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t L0_, int64_t N, uint32_t seed)
      : n_layer(n_layer_), H(H_), Hkv(Hkv_), d(d_), L0(L0_), T(L0_ + N) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(n_layer * T * Hkv * d));
    v.resize(k.size());
    q.resize(static_cast<size_t>(n_layer * T * H * d));
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    for (int64_t t = 0; t < T; ++t) pos.push_back(static_cast<int32_t>(t));
    shape = PressShape{n_layer, H, Hkv, d, d, 0.0f};
    kr.resize(k.size());
    qr.resize(q.size());
    auto rot = [&](const float* x, int64_t p, double* o) {
      for (int64_t i = 0; i < d / 2; ++i) {
        const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        o[i] = x[i] * std::cos(a) - x[i + d / 2] * std::sin(a);
        o[i + d / 2] = x[i] * std::sin(a) + x[i + d / 2] * std::cos(a);
      }
    };
    for (int64_t il = 0; il < n_layer; ++il)
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < Hkv; ++h) rot(kraw(il, t, h), t, K(il, t, h));
        for (int64_t h = 0; h < H; ++h) rot(q.data() + ((il * T + t) * H + h) * d, t, Q(il, t, h));
      }
  }
  const float* kraw(int64_t il, int64_t t, int64_t h) const { return k.data() + ((il * T + t) * Hkv + h) * d; }
  double* K(int64_t il, int64_t t, int64_t h) { return kr.data() + ((il * T + t) * Hkv + h) * d; }
  double* Q(int64_t il, int64_t t, int64_t h) { return qr.data() + ((il * T + t) * H + h) * d; }
  std::vector<int32_t> held(int64_t il, int64_t h) const {
    const int32_t* s = kv->seq_index(il, h);
    return std::vector<int32_t>(s, s + kv->n_tokens(il, h));
  }
  void append(int64_t t0, int64_t n) {
    for (int64_t il = 0; il < n_layer; ++il)
      ASSERT_TRUE(kv->append(il, n, kraw(il, t0, 0), v.data() + ((il * T + t0) * Hkv) * d, pos.data() + t0).is_ok());
  }
  void compress(KvPress& p, PressPhase phase, int64_t t_last) {
    const int64_t m = std::min(p.n_obs(), t_last + 1);
    for (int64_t il = 0; il < n_layer; ++il) {
      PressContext c;
      c.kv = kv.get();
      c.phase = phase;
      c.queries = m > 0 ? q.data() + ((il * T + t_last + 1 - m) * H) * d : nullptr;
      c.query_pos = m > 0 ? pos.data() + (t_last + 1 - m) : nullptr;
      c.query_seq = c.query_pos;
      c.n_obs = m;
      ASSERT_TRUE(p.compress(c, il).is_ok());
    }
  }
  // The runtime's path: the prompt (after_prompt: kChunk, kPrefill), then one token at a time
  // (after_token: kDecode when decode_due). before_gen: runs on the cache after the prompt.
  void run(KvPress& p, const std::function<void()>& before_gen = {}) {
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
    append(0, L0);
    compress(p, PressPhase::kChunk, L0 - 1);
    compress(p, PressPhase::kPrefill, L0 - 1);
    if (before_gen) before_gen();
    for (int64_t s = 1; L0 + s - 1 < T; ++s) {
      append(L0 + s - 1, 1);
      if (p.schedule().decode_due(s)) compress(p, PressPhase::kDecode, L0 + s - 1);
    }
  }
};

// A kvpress score over the held tokens `held` of (il, h) with the buffered tokens `buf`.
using Scorer = std::function<std::vector<std::vector<double>>(Generation&, int64_t il,
                                                              const std::vector<std::vector<int32_t>>& held,
                                                              const std::vector<int32_t>& buf)>;

// KnormPress.score.
std::vector<std::vector<double>> knorm(Generation& g, int64_t il, const std::vector<std::vector<int32_t>>& held,
                                       const std::vector<int32_t>&) {
  std::vector<std::vector<double>> s(held.size());
  for (size_t h = 0; h < held.size(); ++h)
    for (int32_t t : held[h]) {
      double a = 0;
      for (int64_t e = 0; e < g.d; ++e) a += g.K(il, t, static_cast<int64_t>(h))[e] * g.K(il, t, static_cast<int64_t>(h))[e];
      s[h].push_back(-std::sqrt(a));
    }
  return s;
}

// SnapKVPress(window_size=w).score with hidden_states = the buffer: the last w buffered tokens'
// queries, causal softmax over the held keys, mean over those queries, the first n - w held
// tokens avg-pooled (kernel 5, zero padding), mean over the group; the last w padded with
// max + 1 (max over the layer).
Scorer snapkv(int64_t w) {
  return [w](Generation& g, int64_t il, const std::vector<std::vector<int32_t>>& held, const std::vector<int32_t>& buf) {
    const std::vector<int32_t> qs(buf.end() - std::min<int64_t>(w, static_cast<int64_t>(buf.size())), buf.end());
    const int64_t gr = g.H / g.Hkv, kernel = 5;
    std::vector<std::vector<double>> s(held.size());
    double mx = -1e300;
    for (size_t h = 0; h < held.size(); ++h) {
      const int64_t n = static_cast<int64_t>(held[h].size()), n_pre = n - w;
      s[h].assign(static_cast<size_t>(n), 0.0);
      for (int64_t hq = static_cast<int64_t>(h) * gr; hq < static_cast<int64_t>(h + 1) * gr; ++hq) {
        std::vector<double> a(static_cast<size_t>(n_pre), 0.0);
        for (int32_t u : qs) {
          std::vector<double> p;
          double m = -1e300, z = 0;
          for (int32_t t : held[h]) {
            if (t > u) break;
            double x = 0;
            for (int64_t e = 0; e < g.d; ++e) x += g.Q(il, u, hq)[e] * g.K(il, t, static_cast<int64_t>(h))[e];
            p.push_back(x / std::sqrt(static_cast<double>(g.d)));
            m = std::max(m, p.back());
          }
          for (double& x : p) z += (x = std::exp(x - m));
          for (int64_t j = 0; j < n_pre; ++j) a[static_cast<size_t>(j)] += p[static_cast<size_t>(j)] / z / static_cast<double>(qs.size());
        }
        for (int64_t j = 0; j < n_pre; ++j) {
          double acc = 0;
          for (int64_t i = j - kernel / 2; i <= j + kernel / 2; ++i)
            if (i >= 0 && i < n_pre) acc += a[static_cast<size_t>(i)];
          s[h][static_cast<size_t>(j)] += acc / static_cast<double>(kernel) / static_cast<double>(gr);
        }
      }
      for (int64_t j = 0; j < n_pre; ++j) mx = std::max(mx, s[h][static_cast<size_t>(j)]);
    }
    for (auto& r : s)
      for (size_t j = r.size() - static_cast<size_t>(w); j < r.size(); ++j) r[j] = mx + 1;
    return s;
  };
}

// DecodingPress.forward_hook + compress, per layer (every layer sees the same steps). held0: the
// tokens each (layer, head) holds when generation starts.
std::vector<std::vector<std::vector<int32_t>>> decoding_oracle(Generation& g, std::vector<std::vector<std::vector<int32_t>>> held,
                                                               int64_t interval, int64_t target, int64_t buffer_size,
                                                               const Scorer& score, bool& near) {
  std::vector<int32_t> buf;
  int64_t steps = 0;
  for (int32_t t = static_cast<int32_t>(g.L0); t < g.T; ++t) {
    for (auto& layer : held)
      for (auto& h : layer) h.push_back(t);
    buf.push_back(t);
    if (++steps >= interval) {
      for (int64_t il = 0; il < g.n_layer; ++il) {
        auto& layer = held[static_cast<size_t>(il)];
        const auto s = score(g, il, layer, buf);
        for (size_t h = 0; h < layer.size(); ++h) {
          if (static_cast<int64_t>(layer[h].size()) <= target) continue;  // ratio 0: no compression
          std::vector<size_t> o(layer[h].size());
          std::iota(o.begin(), o.end(), 0);
          std::stable_sort(o.begin(), o.end(), [&](size_t a, size_t b) { return s[h][a] > s[h][b]; });
          const double a = s[h][o[static_cast<size_t>(target - 1)]], b = s[h][o[static_cast<size_t>(target)]];
          if (a - b < 1e-6 * std::max(std::fabs(a), std::fabs(b))) near = true;
          std::vector<int32_t> kept;
          for (int64_t i = 0; i < target; ++i) kept.push_back(layer[h][o[static_cast<size_t>(i)]]);
          std::sort(kept.begin(), kept.end());
          layer[h] = kept;
        }
      }
      steps = 0;
      buf.clear();
    }
    if (buffer_size > 0) {
      if (static_cast<int64_t>(buf.size()) > buffer_size) buf.erase(buf.begin(), buf.end() - buffer_size);
    } else {
      buf.clear();
    }
  }
  return held;
}

std::vector<std::vector<std::vector<int32_t>>> all_held(const Generation& g) {
  std::vector<std::vector<std::vector<int32_t>>> r(static_cast<size_t>(g.n_layer));
  for (int64_t il = 0; il < g.n_layer; ++il)
    for (int64_t h = 0; h < g.Hkv; ++h) r[static_cast<size_t>(il)].push_back(g.held(il, h));
  return r;
}

// Runs spec through generation and compares with the oracle (held0: the prompt's tokens, or what
// before_gen left).
void expect_reference(Generation& g, const std::string& spec, int64_t interval, int64_t target, int64_t buffer,
                      const Scorer& score, const std::function<void()>& before_gen = {}) {
  auto p = make_kv_press(spec, g.shape);
  ASSERT_TRUE(p.has_value()) << spec << ": " << p.error().message;
  std::vector<std::vector<std::vector<int32_t>>> held0;
  g.run(**p, [&] {
    if (before_gen) before_gen();
    held0 = all_held(g);
  });
  bool near = false;
  const auto want = decoding_oracle(g, held0, interval, target, buffer, score, near);
  ASSERT_FALSE(near) << spec << ": near-tie at a cut, pick another seed";
  EXPECT_EQ(all_held(g), want) << spec;
}

// kvpress's decoding_knorm, and snapkv with its window of 8 queries out of the buffer of 256,
// GQA (3 query heads per KV head), four compressions; the prompt (40 tokens, above target 32)
// is never compressed.
TEST(DecodingOracle, KeptSetsEqualTheReference) {
  Generation g(2, 6, 2, 16, 40, 70, 51);
  auto p = make_kv_press("decoding:interval=16,target=32", g.shape);
  ASSERT_TRUE(p.has_value());
  g.run(**p, [&] { EXPECT_EQ(g.kv->n_tokens(0, 0), 40); });  // nothing at prefill
  expect_reference(g, "decoding:interval=16,target=32", 16, 32, 256, knorm);
  expect_reference(g, "decoding:inner=snapkv,obs=8,interval=16,target=40", 16, 40, 256, snapkv(8));
  expect_reference(g, "decoding:inner=snapkv,obs=8,interval=12,target=30,buffer=300", 12, 30, 300, snapkv(8));
}

// The buffer caps the queries: buffer=3 gives the scorer the last 4 generated tokens' queries
// (kvpress: 3 buffered + the current), not its 8; the runtime keeps 4 per layer.
TEST(DecodingOracle, BufferCapsTheQueries) {
  Generation g(2, 6, 2, 16, 40, 70, 52);
  const std::string spec = "decoding:inner=snapkv,obs=8,window=4,buffer=3,interval=16,target=40";
  auto p = make_kv_press(spec, g.shape);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ((*p)->n_obs(), 4);
  expect_reference(g, spec, 16, 40, 3, snapkv(4));
  const auto ours = all_held(g);
  // The frame's decoding schedule with the same scorer reads its 8 queries: another selection.
  auto naive = make_kv_press("snapkv:obs=8,window=4,interval=16,target=40", g.shape);
  ASSERT_TRUE(naive.has_value());
  g.run(**naive);
  EXPECT_NE(all_held(g), ours);
  // Without the cap (buffer >= 7) the two agree: the same machinery underneath.
  auto wide = make_kv_press("decoding:inner=snapkv,obs=8,window=4,buffer=7,interval=16,target=40", g.shape);
  ASSERT_TRUE(wide.has_value());
  g.run(**wide);
  const auto w = all_held(g);
  g.run(**naive);
  EXPECT_EQ(all_held(g), w);
}

// Heads of different lengths (an earlier per-head eviction): each head goes back to target on
// its own; a head at or below target is left alone.
TEST(DecodingOracle, HeadsOfDifferentLengths) {
  Generation g(2, 4, 2, 16, 40, 40, 53);
  expect_reference(g, "decoding:interval=10,target=40", 10, 40, 256, knorm, [&] {
    for (int64_t il = 0; il < 2; ++il) {
      std::vector<int32_t> keep;
      for (int32_t j = 0; j < 40; j += 2) keep.push_back(j);
      ASSERT_TRUE(g.kv->retain(il, 1, keep).is_ok());  // head 1: 20 tokens, reaches 40 only at the end
    }
  });
  EXPECT_EQ(g.kv->n_tokens(0, 0), 40);
}

TEST(Decoding, DefaultsSpecAndErrors) {
  const PressShape s{2, 4, 2, 16, 16, 0};
  auto p = make_kv_press("decoding", s);
  ASSERT_TRUE(p.has_value());
  const std::string spec = (*p)->spec();
  EXPECT_EQ(spec, "decoding:inner=knorm,interval=512,target=2048,buffer=256,n_sink=0,window=0,reduce=mean");
  EXPECT_EQ((*p)->n_obs(), 0);  // knorm reads no queries: nothing buffered
  EXPECT_FALSE((*p)->schedule().after_prefill);
  EXPECT_EQ((*p)->schedule().decode_interval, 512);
  EXPECT_EQ((*p)->schedule().decode_target, 2048);
  auto q = make_kv_press(spec, s);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ((*q)->spec(), spec);
  EXPECT_EQ((*make_kv_press("decoding:inner=snapkv", s))->n_obs(), 64);
  EXPECT_EQ((*make_kv_press("decoding:inner=snapkv,buffer=0", s))->n_obs(), 1);
  EXPECT_EQ((*make_kv_press("decoding:inner=snapkv,interval=10,target=100", s))->n_obs(), 10);
  EXPECT_EQ((*make_kv_press("decoding:inner=tova", s))->n_obs(), 1);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"decoding:interval=0", "interval"},          {"decoding:target=0", "target"},
      {"decoding:buffer=-1", "buffer"},             {"decoding:inner=snapkv,target=32", "target=32"},
      {"decoding:inner=speckv", "speckv"},          {"decoding:inner=nosuch", "expected a scorer"},
      {"decoding:ratio=0.5", "ratio"},              {"decoding:interval=x", "interval"}};
  for (const auto& [b, key] : bad) {
    auto e = make_kv_press(b, s);
    ASSERT_FALSE(e.has_value()) << b;
    EXPECT_NE(e.error().message.find(key), std::string::npos) << b << ": " << e.error().message;
  }
}

}  // namespace
}  // namespace lc
