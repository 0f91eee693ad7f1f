// duo_attention against an oracle written here in double straight from kvpress's
// DuoAttentionPress (NVIDIA/kvpress, kvpress/presses/duo_attention_press.py), on the test's own
// pre-RoPE data, with the prompt as on-the-fly scoring's one text:
//   duo_attention_on_the_fly: q = mean over the tokens of q_proj (per query head), k = the same
//     of k_proj (per KV head), both repeated at positions 0..q_len-1 and rotated, k repeat_kv'd;
//     w = softmax(q[-1] · kᵀ / sqrt(d)); s = cumsum(w).mean(); s.view(-1, groups).mean(1)
//   post_init_from_model: n_pruned = round(scores.size * head_compression_ratio);
//     streaming = np.argsort(scores, axis=None)[:n_pruned]  (over every layer at once)
//   compress: streaming heads lose [sink_size : -recent_size]; compression_ratio_ =
//     mean(streaming) * (1 - (sink + recent) / k_len)
// and load_attention_pattern's file (np.loadtxt, np.clip(0, 1)) for patterns=FILE.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/log.h"
#include "kv/kv_cache.h"
#include "kv/press.h"

namespace lc {
namespace {

// n_layer layers of L tokens. Each (layer, head) has a bias vector added to every token's query
// (key), so the means the on-the-fly scores use differ from head to head.
struct DuoFixture {
  int64_t n_layer, H, Hkv, d, L;
  std::vector<float> k, v, q;  // [il][t][head][d] pre-RoPE
  std::vector<int32_t> pos;
  std::unique_ptr<KvCache> kv;
  PressShape shape;

  // mscale: the table's cos/sin factor (YaRN's attention factor), as HF's attention_scaling.
  DuoFixture(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t L_, uint32_t seed, float mscale = 1.0f)
      : n_layer(n_layer_), H(H_), Hkv(Hkv_), d(d_), L(L_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> qb(static_cast<size_t>(n_layer * H * d)), kb(static_cast<size_t>(n_layer * Hkv * d));
    for (auto& x : qb) x = 1.5f * nd(rng);
    for (auto& x : kb) x = 1.5f * nd(rng);
    k.resize(static_cast<size_t>(n_layer * L * Hkv * d));
    v.resize(k.size());
    q.resize(static_cast<size_t>(n_layer * L * H * d));
    for (int64_t il = 0; il < n_layer; ++il)
      for (int64_t t = 0; t < L; ++t) {
        for (int64_t x = 0; x < Hkv * d; ++x)
          k[static_cast<size_t>((il * L + t) * Hkv * d + x)] = kb[static_cast<size_t>(il * Hkv * d + x)] + nd(rng);
        for (int64_t x = 0; x < H * d; ++x)
          q[static_cast<size_t>((il * L + t) * H * d + x)] = qb[static_cast<size_t>(il * H * d + x)] + nd(rng);
      }
    for (auto& x : v) x = nd(rng);
    for (int64_t t = 0; t < L; ++t) pos.push_back(static_cast<int32_t>(t));
    shape = PressShape{n_layer, H, Hkv, d, d, 0.0f};
    KvCacheConfig c;
    c.n_layer = n_layer;
    c.n_head_kv = Hkv;
    c.head_dim = d;
    c.head_dim_v = d;
    c.block_tokens = 8;
    LlamaCppRopeParams rp;
    rp.n_rot = d;
    rp.neox = true;
    c.rope = make_llama_cpp_rope(rp);
    c.rope.mscale = mscale;
    auto r = KvCache::create(c);
    EXPECT_TRUE(r.has_value());
    kv = std::move(r.value());
    for (int64_t il = 0; il < n_layer; ++il)
      EXPECT_TRUE(kv->append(il, L, &k[static_cast<size_t>(il * L * Hkv * d)], &v[static_cast<size_t>(il * L * Hkv * d)],
                             pos.data())
                      .is_ok());
  }
  // The model's forward passes as the observer sees them (in chunks of `chunk` tokens), then the
  // after-prefill compression of every layer.
  void run(KvPress& p, int64_t chunk = 0) {
    if (chunk <= 0) chunk = L;
    if (AttentionObserver* o = p.observer())
      for (int64_t t0 = 0; t0 < L; t0 += chunk)
        for (int64_t il = 0; il < n_layer; ++il)
          o->observe(*kv, il, &q[static_cast<size_t>((il * L + t0) * H * d)], pos.data() + t0, pos.data() + t0,
                     std::min(chunk, L - t0), nullptr, nullptr);
    for (int64_t il = 0; il < n_layer; ++il) {
      PressContext c;
      c.kv = kv.get();
      ASSERT_TRUE(p.compress(c, il).is_ok());
    }
  }
  std::vector<int32_t> kept(int64_t il, int64_t h) const {
    const int32_t* s = kv->seq_index(il, h);
    return std::vector<int32_t>(s, s + kv->n_tokens(il, h));
  }
};

// RoPE (neox, base 10000, mscale 1) of a double vector.
std::vector<double> rot(const std::vector<double>& x, int64_t p) {
  const int64_t d = static_cast<int64_t>(x.size());
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < d / 2; ++i) {
    const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    out[static_cast<size_t>(i)] = x[static_cast<size_t>(i)] * std::cos(a) - x[static_cast<size_t>(i + d / 2)] * std::sin(a);
    out[static_cast<size_t>(i + d / 2)] = x[static_cast<size_t>(i)] * std::sin(a) + x[static_cast<size_t>(i + d / 2)] * std::cos(a);
  }
  return out;
}

// duo_attention_on_the_fly over the fixture's one text: scores [n_layer][n_head_kv]. mscale: HF's
// apply_rotary_pos_emb with cos, sin scaled by attention_scaling scales q.k by its square.
std::vector<double> oracle_scores(const DuoFixture& f, int64_t q_len, double mscale = 1.0) {
  const int64_t g = f.H / f.Hkv, d = f.d;
  std::vector<double> scores(static_cast<size_t>(f.n_layer * f.Hkv), 0.0);
  for (int64_t il = 0; il < f.n_layer; ++il) {
    std::vector<std::vector<double>> kr(static_cast<size_t>(f.Hkv));  // [h][p * d]: repeated and rotated
    for (int64_t h = 0; h < f.Hkv; ++h) {
      std::vector<double> km(static_cast<size_t>(d), 0.0);
      for (int64_t t = 0; t < f.L; ++t)
        for (int64_t e = 0; e < d; ++e)
          km[static_cast<size_t>(e)] += f.k[static_cast<size_t>(((il * f.L + t) * f.Hkv + h) * d + e)] / static_cast<double>(f.L);
      for (int64_t p = 0; p < q_len; ++p) {
        const auto r = rot(km, p);
        kr[static_cast<size_t>(h)].insert(kr[static_cast<size_t>(h)].end(), r.begin(), r.end());
      }
    }
    for (int64_t hq = 0; hq < f.H; ++hq) {
      std::vector<double> qm(static_cast<size_t>(d), 0.0);
      for (int64_t t = 0; t < f.L; ++t)
        for (int64_t e = 0; e < d; ++e)
          qm[static_cast<size_t>(e)] += f.q[static_cast<size_t>(((il * f.L + t) * f.H + hq) * d + e)] / static_cast<double>(f.L);
      const auto ql = rot(qm, q_len - 1);  // q[:, :, -1:, :]
      std::vector<double> w(static_cast<size_t>(q_len));
      double mx = -INFINITY, sum = 0;
      for (int64_t p = 0; p < q_len; ++p) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += ql[static_cast<size_t>(e)] * kr[static_cast<size_t>(hq / g)][static_cast<size_t>(p * d + e)];
        w[static_cast<size_t>(p)] = dot * mscale * mscale / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, w[static_cast<size_t>(p)]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      double cum = 0, s = 0;
      for (int64_t p = 0; p < q_len; ++p) s += (cum += w[static_cast<size_t>(p)] / sum);  // cumsum
      s /= static_cast<double>(q_len);                                                      // .mean
      scores[static_cast<size_t>(il * f.Hkv + hq / g)] += s / static_cast<double>(g);         // group mean
    }
  }
  return scores;
}

// argsort(scores)[:n_pruned], ties to the lower flat index (the project's rule).
std::vector<uint8_t> oracle_streaming(const std::vector<double>& scores, int64_t n_pruned) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return scores[static_cast<size_t>(a)] < scores[static_cast<size_t>(b)];
  });
  std::vector<uint8_t> m(scores.size(), 0);
  for (int64_t i = 0; i < n_pruned; ++i) m[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  return m;
}

std::vector<int32_t> oracle_kept(int64_t k_len, bool streaming, int64_t sink, int64_t recent) {
  std::vector<int32_t> out;
  for (int64_t j = 0; j < k_len; ++j)
    if (!streaming || k_len <= sink + recent || j < sink || j >= k_len - recent) out.push_back(static_cast<int32_t>(j));
  return out;
}

std::unique_ptr<KvPress> make(const std::string& spec, const PressShape& s) {
  auto r = make_kv_press(spec, s);
  EXPECT_TRUE(r.has_value()) << spec << ": " << (r ? "" : r.error().message);
  return r ? std::move(r.value()) : nullptr;
}

// Checks every head's kept set and the logged compression against the oracle's mask.
void expect_pattern(DuoFixture& f, KvPress& p, const std::vector<uint8_t>& streaming, int64_t sink, int64_t recent,
                    const std::string& what, int64_t chunk = 0) {
  set_log_level(LogLevel::kInfo);
  testing::internal::CaptureStderr();
  f.run(p, chunk);
  const std::string log = testing::internal::GetCapturedStderr();
  set_log_level(LogLevel::kWarn);
  int64_t n_stream = 0;
  for (int64_t il = 0; il < f.n_layer; ++il)
    for (int64_t h = 0; h < f.Hkv; ++h) {
      const bool s = streaming[static_cast<size_t>(il * f.Hkv + h)];
      n_stream += s;
      EXPECT_EQ(f.kept(il, h), oracle_kept(f.L, s, sink, recent)) << what << " layer " << il << " head " << h;
    }
  // kvpress's compression_ratio_ (every head holds k_len = L > sink + recent here).
  const double ratio = static_cast<double>(n_stream) / static_cast<double>(streaming.size()) *
                       (1.0 - static_cast<double>(sink + recent) / static_cast<double>(f.L));
  EXPECT_NE(log.find(fmt::format("duo_attention: {} of {} KV heads streaming, compression {:.4f}", n_stream,
                                 streaming.size(), ratio)),
            std::string::npos)
      << what << ": " << log;
}

// On-the-fly patterns at every head_compression_ratio k / (n_layer x n_head_kv): the streaming
// (layer, KV head) pairs are the oracle's lowest scores over the whole model, with GQA (8 query
// heads over 2 KV heads), sink 4 / recent 8 and q_len 64 with a rope mscale of 2 (the stored
// keys carry it: the mean key is taken without it), and kvpress's q_len 500 once; the observed
// queries arriving in chunks change nothing.
TEST(KvPressDuoAttention, OracleOnTheFlyStreamingHeads) {
  const int64_t n_layer = 4, Hkv = 2, L = 48, sink = 4, recent = 8;
  for (int64_t q_len : {64, 500}) {
    const float mscale = q_len == 64 ? 2.0f : 1.0f;
    DuoFixture f0(n_layer, 8, Hkv, 16, L, 5, mscale);
    const std::vector<double> sc = oracle_scores(f0, q_len, mscale);
    std::vector<double> sorted = sc;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i + 1 < sorted.size(); ++i)
      ASSERT_GT(sorted[i + 1] - sorted[i], 1e-5) << "near-equal head scores: pick another seed";
    EXPECT_GT(sorted.back() - sorted.front(), 0.05) << "the fixture should spread the heads";
    for (int64_t n_pruned = 0; n_pruned <= n_layer * Hkv; ++n_pruned) {
      DuoFixture f(n_layer, 8, Hkv, 16, L, 5, mscale);
      const double ratio = static_cast<double>(n_pruned) / static_cast<double>(n_layer * Hkv);
      const std::string spec = fmt::format("duo_attention:head_ratio={},sink={},recent={},n_pos={}", ratio, sink,
                                           recent, q_len);
      auto p = make(spec, f.shape);
      ASSERT_TRUE(p);
      EXPECT_EQ(p->n_obs(), 0);
      ASSERT_NE(p->observer(), nullptr);
      const int64_t used = f.kv->pool().n_used();
      expect_pattern(f, *p, oracle_streaming(sc, n_pruned), sink, recent, spec, q_len == 64 ? 0 : 20);
      if (n_pruned > 0) {
        EXPECT_LT(f.kv->pool().n_used(), used) << spec << ": blocks back to the pool";
      }
    }
  }
}

// round() is Python's (half to even): 8 heads x 0.3125 = 2.5 -> 2, x 0.4375 = 3.5 -> 4.
TEST(KvPressDuoAttention, StreamingCountRoundsHalfToEven) {
  DuoFixture f0(4, 8, 2, 16, 48, 5);
  const std::vector<double> sc = oracle_scores(f0, 64);
  for (const auto& [ratio, n] : std::vector<std::pair<double, int64_t>>{{0.3125, 2}, {0.4375, 4}}) {
    DuoFixture f(4, 8, 2, 16, 48, 5);
    auto p = make(fmt::format("duo_attention:head_ratio={},sink=4,recent=8,n_pos=64", ratio), f.shape);
    expect_pattern(f, *p, oracle_streaming(sc, n), 4, 8, std::to_string(ratio));
  }
}

// patterns=FILE: DuoAttention's full_attention_heads.tsv, clipped to [0, 1]; the heads with the
// lowest values stream (a clipped tie goes to the lower (layer, head)).
TEST(KvPressDuoAttention, PatternsFile) {
  const std::string path = (std::filesystem::temp_directory_path() / "lc_duo_patterns_test.tsv").string();
  {
    std::ofstream out(path);
    out << "# layer rows, one value per KV head\n0.9\t0.2\n\n0.7 -3\n0.05\t1.7\n0.6\t-0.5\n";
  }
  // clipped: {0.9, 0.2, 0.7, 0, 0.05, 1, 0.6, 0}: lowest 3 = (1,1), (3,1) [tie at 0: lower first], (2,0)
  std::vector<uint8_t> want = {0, 0, 0, 1, 1, 0, 0, 1};
  DuoFixture f(4, 8, 2, 16, 48, 5);
  auto p = make("duo_attention:head_ratio=0.375,sink=2,recent=5,patterns=" + path, f.shape);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->observer(), nullptr);  // no statistics needed
  expect_pattern(f, *p, want, 2, 5, "file");
  // Two streaming heads: the tie at 0 goes to layer 1 head 1.
  DuoFixture g(4, 8, 2, 16, 48, 5);
  auto p2 = make("duo_attention:head_ratio=0.25,sink=2,recent=5,patterns=" + path, g.shape);
  expect_pattern(g, *p2, {0, 0, 0, 1, 0, 0, 0, 1}, 2, 5, "file, tie");
  EXPECT_EQ(p2->spec(), "duo_attention:head_ratio=0.25,sink=2,recent=5,n_pos=500,patterns=" + path + ",query=aware");
  // Errors name the key and the problem.
  const PressShape s = f.shape;
  for (const auto& [text, what] : std::vector<std::pair<std::string, std::string>>{
           {"0.1 0.2\n0.3\n0.1 0.2\n0.1 0.2\n", "line 2 has 1 values"},
           {"0.1 0.2\n0.1 0.2\n", "2 rows, expected one per layer (4)"},
           {"0.1 x\n0.1 0.2\n0.1 0.2\n0.1 0.2\n", "\"x\" is not a number"}}) {
    {
      std::ofstream out(path);
      out << text;
    }
    auto r = make_kv_press("duo_attention:patterns=" + path, s);
    ASSERT_FALSE(r.has_value()) << text;
    EXPECT_NE(r.error().message.find("patterns=" + path), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  }
  std::filesystem::remove(path);
  auto r = make_kv_press("duo_attention:patterns=" + path, s);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("cannot open"), std::string::npos) << r.error().message;
}

// Heads holding no more than sink + recent tokens stay whole; head_ratio=0 (kvpress's default)
// changes nothing; the scores need the observed queries (a truncation restarts them).
TEST(KvPressDuoAttention, ShortPromptsDefaultsAndMissingQueries) {
  {
    DuoFixture f(2, 4, 2, 8, 12, 3);
    auto p = make("duo_attention:head_ratio=1,sink=4,recent=8,n_pos=16", f.shape);
    f.run(*p);
    for (int64_t il = 0; il < 2; ++il)
      for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.kv->n_tokens(il, h), 12);
  }
  {
    DuoFixture f(2, 4, 2, 8, 40, 3);
    auto p = make("duo_attention", f.shape);
    EXPECT_EQ(p->spec(), "duo_attention:head_ratio=0,sink=128,recent=256,n_pos=500,query=aware");
    f.run(*p);
    for (int64_t il = 0; il < 2; ++il) EXPECT_EQ(f.kv->n_tokens(il, 0), 40);
    auto p2 = make(p->spec(), f.shape);
    EXPECT_EQ(p2->spec(), p->spec());
  }
  DuoFixture f(2, 4, 2, 8, 40, 3);
  auto p = make("duo_attention:head_ratio=0.5,sink=2,recent=4,n_pos=16", f.shape);
  PressContext c;
  c.kv = f.kv.get();
  auto st = p->compress(c, 0);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("no queries of layer 0"), std::string::npos) << st.message();
  f.run(*p);
  EXPECT_EQ(f.kv->n_tokens(0, 0) + f.kv->n_tokens(0, 1) + f.kv->n_tokens(1, 0) + f.kv->n_tokens(1, 1), 40 * 2 + 6 * 2);
  p->observer()->truncate(0);
  st = p->compress(c, 0);
  EXPECT_FALSE(st.is_ok());
}

TEST(KvPressDuoAttention, ErrorsNameTheKey) {
  const PressShape s{2, 4, 2, 8, 8, 0};
  const std::pair<const char*, const char*> bad[] = {
      {"duo_attention:head_ratio=1.5", "head_ratio"}, {"duo_attention:head_ratio=-0.1", "head_ratio"},
      {"duo_attention:sink=-1", "sink"},              {"duo_attention:recent=0", "recent"},
      {"duo_attention:n_pos=0", "n_pos"},             {"duo_attention:ratio=0.5", "ratio"},
      {"duo_attention:query=x", "query"},
  };
  for (const auto& [spec, key] : bad) {
    auto r = make_kv_press(spec, s);
    ASSERT_FALSE(r.has_value()) << spec;
    EXPECT_NE(r.error().message.find("duo_attention"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(key), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace lc
