// KV presses against oracles computed here in double from the test's own data: the kept
// counts, the protected tokens, every score formula on hand-built cases, deterministic ties,
// pool accounting after compaction, and decode attention over the compressed cache against
// naive attention restricted to the kept tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "kv/press.h"
#include "kv/press_impl.h"
#include "kv/press_observer.h"
#include "kv/press_spec.h"

#include "attention/backend.h"

namespace lc {
namespace {

const std::vector<std::string> kAll = {"streaming_llm", "snapkv", "pyramidkv", "h2o", "tova", "knorm", "keydiff",
                                       "expected_attention", "random", "adakv", "speckv", "lagkv"};
// Presses with a KvPress class of their own (LC_PRESS_CUSTOM, listed after specpc) and keys of
// their own: tested in their own files (tests/kv/press_<name>_test.cpp), not by the generic tests.
const std::vector<std::string> kCustom = {"kvzip", "simlayerkv", "duo_attention", "criticalkv", "critical_adakv",
                                          "chunkkv", "block", "decoding", "think"};

// A cache of n_layer layers holding L tokens, with the pre-RoPE data kept for the oracles.
struct Fixture {
  int64_t n_layer, H, Hkv, d, L, block;
  std::vector<float> k, v, q;  // k, v: [n_layer][L, Hkv, d]; q: [n_layer][L, H, d] (all prompt queries)
  std::vector<int32_t> pos;
  std::unique_ptr<KvCache> kv;
  PressShape shape;

  // n_rot: rotated dims (< 0: all of d; an odd d needs an even n_rot < d; 0: no RoPE).
  Fixture(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t L_, int64_t block_ = 16,
          uint32_t seed = 1, int64_t n_rot = -1)
      : n_layer(n_layer_), H(H_), Hkv(Hkv_), d(d_), L(L_), block(block_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(n_layer * L * Hkv * d));
    v.resize(k.size());
    q.resize(static_cast<size_t>(n_layer * L * H * d));
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    for (int64_t t = 0; t < L; ++t) pos.push_back(static_cast<int32_t>(t));
    KvCacheConfig c;
    c.n_layer = n_layer;
    c.n_head_kv = Hkv;
    c.head_dim = d;
    c.head_dim_v = d;
    c.block_tokens = block;
    LlamaCppRopeParams rp;
    rp.n_rot = n_rot < 0 ? d : n_rot;
    rp.neox = true;
    c.rope = make_llama_cpp_rope(rp);
    auto r = KvCache::create(c);
    EXPECT_TRUE(r.has_value());
    kv = std::move(r.value());
    append(0, L);
    shape = PressShape{n_layer, H, Hkv, d, d, 0.0f};
  }
  void append(int64_t first, int64_t n) {
    for (int64_t il = 0; il < n_layer; ++il)
      EXPECT_TRUE(kv->append(il, n, kptr(il, first), vptr(il, first), pos.data() + first).is_ok());
  }
  const float* kptr(int64_t il, int64_t t) const { return k.data() + (il * L + t) * Hkv * d; }
  const float* vptr(int64_t il, int64_t t) const { return v.data() + (il * L + t) * Hkv * d; }
  const float* qptr(int64_t il, int64_t t) const { return q.data() + (il * L + t) * H * d; }
  // The context for layer il with the last n_obs queries of the first `upto` tokens.
  PressContext ctx(int64_t il, int64_t n_obs, int64_t upto = -1, PressPhase ph = PressPhase::kPrefill) const {
    if (upto < 0) upto = L;
    n_obs = std::min(n_obs, upto);
    PressContext c;
    c.kv = kv.get();
    c.phase = ph;
    c.queries = qptr(il, upto - n_obs);
    c.query_pos = pos.data() + (upto - n_obs);
    c.n_obs = n_obs;
    return c;
  }
  Status compress_all(KvPress& p, int64_t upto = -1, PressPhase ph = PressPhase::kPrefill) {
    for (int64_t il = 0; il < n_layer; ++il) LC_TRY(p.compress(ctx(il, p.n_obs(), upto, ph), il));
    return ok_status();
  }
};

std::unique_ptr<KvPress> make(const std::string& spec, const PressShape& s) {
  auto r = make_kv_press(spec, s);
  EXPECT_TRUE(r.has_value()) << spec << ": " << (r ? "" : r.error().message);
  return r ? std::move(r.value()) : nullptr;
}

void expect_conserved(const KvCache& kv) {
  const BlockPool& p = kv.pool();
  EXPECT_EQ(p.n_used() + p.n_free_ids(), p.n_ids());
  EXPECT_EQ(p.n_used() - p.n_spilled() + p.ram_slots_free(), p.ram_slots());
  int64_t blocks = 0;
  for (int64_t il = 0; il < kv.n_layer(); ++il)
    for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
      blocks += kv.n_blocks(il, h);
      EXPECT_EQ(kv.n_blocks(il, h), (kv.n_tokens(il, h) + kv.block_tokens() - 1) / kv.block_tokens());
    }
  EXPECT_EQ(blocks, p.n_used());
}

// RoPE (neox, mscale 1) in double: the oracle's rotation of a pre-RoPE vector.
void rope_d(const float* x, int64_t d, const RopeTable& rt, int32_t p, double* out) {
  for (int64_t e = 0; e < d; ++e) out[e] = x[e];
  const int64_t half = rt.n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(p) * rt.inv_freq[static_cast<size_t>(i)];
    const double c = std::cos(a), s = std::sin(a);
    out[i] = x[i] * c - x[i + half] * s;
    out[i + half] = x[i] * s + x[i + half] * c;
  }
}

std::vector<int32_t> seq_of(const KvCache& kv, int64_t il, int64_t h) {
  const int32_t* s = kv.seq_index(il, h);
  return std::vector<int32_t>(s, s + kv.n_tokens(il, h));
}

TEST(KvPress, SpecErrorsNameThePressAndKey) {
  PressShape s{2, 4, 2, 8, 8, 0};
  auto r = make_kv_press("snapkv:ratio=0.5,foo=1", s);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("snapkv"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("foo"), std::string::npos);
  EXPECT_NE(r.error().message.find("kernel"), std::string::npos);  // lists accepted keys
  r = make_kv_press("nosuch:ratio=0.5", s);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("expected_attention"), std::string::npos) << r.error().message;
  for (const char* bad : {"snapkv:ratio=1.5", "snapkv:ratio=x", "knorm:ratio=0.5,budget=4", "snapkv:budget=10",
                          "knorm:interval=4", "snapkv:interval=4,target=10", "adakv:inner=nosuch", "snapkv:kernel=4", "knorm:ratio",
                          "knorm:ratio=0.5,ratio=0.2", "", "knorm+", "snapkv:reduce=median"}) {
    auto e = make_kv_press(bad, s);
    EXPECT_FALSE(e.has_value()) << bad;
  }
  // spec() prints every parameter and parses back to itself.
  for (const auto& n : kAll) {
    auto p = make(n + ":ratio=0.25", s);
    ASSERT_TRUE(p);
    auto p2 = make(p->spec(), s);
    ASSERT_TRUE(p2);
    EXPECT_EQ(p->spec(), p2->spec());
  }
  auto ch = make("knorm:ratio=0.5+snapkv:budget=100,obs=16", s);
  EXPECT_EQ(ch->n_obs(), 16);
  EXPECT_NE(ch->spec().find('+'), std::string::npos);
  EXPECT_EQ(kv_press_methods().size(), kAll.size() + 1 + kCustom.size());  // + specpc (a prompt compressor)
}

// The registry (kv/press_list.h) feeds --help, the scorer table, adakv's inner= list and the
// richer info, all in one order; every generic test here runs over kAll.
TEST(KvPress, RegistryListsEveryPressOnce) {
  const auto methods = kv_press_methods();
  const auto info = kv_press_method_info();
  ASSERT_EQ(info.size(), methods.size());
  std::vector<std::string> names, scorers;
  for (size_t i = 0; i < info.size(); ++i) {
    EXPECT_EQ(info[i].name, methods[i].first);
    EXPECT_EQ(info[i].help, methods[i].second);
    EXPECT_FALSE(info[i].paper.empty()) << info[i].name;
    EXPECT_FALSE(info[i].keys.empty()) << info[i].name;
    EXPECT_EQ(info[i].scorer, press::find_scorer(info[i].name) != nullptr) << info[i].name;
    names.push_back(info[i].name);
    if (info[i].scorer) scorers.push_back(info[i].name);
  }
  std::vector<std::string> want = kAll;
  want.push_back("specpc");
  want.insert(want.end(), kCustom.begin(), kCustom.end());
  std::sort(want.begin(), want.end());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, want);
  // Help strings and order as before the list file, keydiff after knorm.
  EXPECT_EQ(methods[0].first, "streaming_llm");
  EXPECT_EQ(methods[2].first, "pyramidkv");
  EXPECT_EQ(methods[5], (std::pair<std::string, std::string>{"knorm", "-||k||: keeps keys of small norm"}));
  EXPECT_EQ(methods[6].first, "keydiff");
  EXPECT_EQ(methods[kAll.size()].first, "specpc");  // the custom presses come after it
  auto find = [&](const std::string& n) {
    return *std::find_if(info.begin(), info.end(), [&](const PressMethodInfo& m) { return m.name == n; });
  };
  EXPECT_NE(find("keydiff").paper.find("2504.15364"), std::string::npos);
  EXPECT_EQ(find("keydiff").keys, find("knorm").keys);  // no keys of its own
  const auto& sk = find("snapkv").keys;
  for (const char* k : {"ratio", "budget", "window", "kernel", "obs"})
    EXPECT_TRUE(std::count(sk.begin(), sk.end(), k)) << k;
  const auto& ak = find("adakv").keys;
  EXPECT_TRUE(std::count(ak.begin(), ak.end(), "inner") && std::count(ak.begin(), ak.end(), "alpha"));
  EXPECT_FALSE(find("adakv").scorer);
  // adakv's inner= error lists exactly the scorers, in the list's order.
  auto e = make_kv_press("adakv:inner=nosuch", PressShape{2, 4, 2, 8, 8, 0});
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().message,
            "kv press adakv: inner=nosuch: expected a scorer (streaming_llm, snapkv, h2o, tova, knorm, keydiff, "
            "expected_attention, random, speckv, lagkv)");
  EXPECT_EQ(scorers.size(), 10u);
  for (const char* frame : {"adakv:inner=pyramidkv", "adakv:inner=adakv", "adakv:inner=specpc"})
    EXPECT_FALSE(make_kv_press(frame, PressShape{2, 4, 2, 8, 8, 0}).has_value()) << frame;
  EXPECT_TRUE(make_kv_press("adakv:inner=keydiff,ratio=0.5", PressShape{2, 4, 2, 8, 8, 0}).has_value());
}

// Ratio 0 is the identity: storage, positions and block use unchanged, for every press.
TEST(KvPress, RatioZeroIsIdentity) {
  for (const auto& n : kAll) {
    Fixture f(2, 4, 2, 8, 70, 16, 3);
    std::vector<float> before(static_cast<size_t>(70 * 8)), after(before.size());
    const int64_t used = f.kv->pool().n_used();
    auto p = make(n + ":ratio=0", f.shape);
    ASSERT_TRUE(f.compress_all(*p).is_ok()) << n;
    EXPECT_EQ(f.kv->pool().n_used(), used) << n;
    for (int64_t il = 0; il < 2; ++il)
      for (int64_t h = 0; h < 2; ++h) {
        ASSERT_EQ(f.kv->n_tokens(il, h), 70) << n;
        f.kv->read_keys(il, h, 0, 70, after.data());
        Fixture g(2, 4, 2, 8, 70, 16, 3);
        g.kv->read_keys(il, h, 0, 70, before.data());
        EXPECT_EQ(before, after) << n;
        for (int64_t j = 0; j < 70; ++j) EXPECT_EQ(f.kv->positions(il, h)[j], j);
      }
  }
}

// The kept count per head is exactly as requested; sinks and window always stay.
TEST(KvPress, KeptCountsAndProtectedTokens) {
  for (const auto& n : kAll) {
    struct Case {
      std::string params;
      int64_t want, n_sink, window;
    };
    // floor(101 * 0.25) = 25; floor(101 * 0.1) = 10 is below the 24 protected tokens.
    for (const Case& cs : {Case{"ratio=0.75,n_sink=3,window=5", 25, 3, 5}, Case{"budget=30,n_sink=2,window=7", 30, 2, 7},
                           Case{"ratio=0.9,n_sink=4,window=20", 24, 4, 20}}) {
      const std::string& params = cs.params;
      const int64_t want = cs.want, n_sink = cs.n_sink, window = cs.window;
      Fixture f(3, 8, 2, 16, 101, 8, 7);
      // pyramidkv: beta=2, so that 101 tokens make a pyramid (kvpress's schedule falls back to
      // uniform budgets when K / beta < n_sink + window; press_oracle_test.cpp checks it exactly).
      auto p = make(n + ":" + params + (n == "pyramidkv" ? ",beta=2" : ""), f.shape);
      ASSERT_TRUE(p);
      ASSERT_TRUE(f.compress_all(*p).is_ok()) << n << " " << params;
      int64_t layer_total = 0;
      std::vector<int64_t> per_layer;
      for (int64_t il = 0; il < 3; ++il) {
        int64_t lt = 0;
        for (int64_t h = 0; h < 2; ++h) {
          const auto s = seq_of(*f.kv, il, h);
          if (n != "adakv" && n != "pyramidkv") {
            EXPECT_EQ(static_cast<int64_t>(s.size()), want) << n << " " << params;
          }
          for (int32_t j = 0; j < n_sink; ++j) EXPECT_TRUE(std::count(s.begin(), s.end(), j)) << n << " sink " << j;
          for (int32_t j = 101 - static_cast<int32_t>(window); j < 101; ++j)
            EXPECT_TRUE(std::count(s.begin(), s.end(), j)) << n << " window " << j;
          EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
          lt += static_cast<int64_t>(s.size());
        }
        per_layer.push_back(lt);
        layer_total += lt;
      }
      if (n == "adakv") {
        for (int64_t t : per_layer) EXPECT_EQ(t, 2 * want) << params;  // head-wise, layer total fixed
      }
      if (n == "pyramidkv" && want > n_sink + window) {
        EXPECT_GT(per_layer[0], per_layer[2]) << params;  // budgets fall with depth
        EXPECT_NEAR(static_cast<double>(layer_total), 3.0 * 2 * want, 3.0 * 2) << params;
      }
      expect_conserved(*f.kv);
    }
  }
}

// A context no longer than n_sink + window is never compressed.
TEST(KvPress, ShortContextFallsBack) {
  Fixture f(1, 2, 1, 8, 20);
  auto p = make("snapkv:budget=20,n_sink=4,window=16", f.shape);
  ASSERT_TRUE(f.compress_all(*p).is_ok());
  EXPECT_EQ(f.kv->n_tokens(0, 0), 20);
  auto p2 = make("knorm:ratio=0.5,n_sink=4,window=17", f.shape);
  ASSERT_TRUE(f.compress_all(*p2).is_ok());
  EXPECT_EQ(f.kv->n_tokens(0, 0), 20);
}

// Compaction frees blocks back to the pool, and the pool's accounting is conserved.
TEST(KvPress, CompactionFreesBlocks) {
  Fixture f(2, 4, 4, 8, 128, 16);
  const int64_t used = f.kv->pool().n_used();
  EXPECT_EQ(used, 2 * 4 * 8);
  auto p = make("knorm:ratio=0.75", f.shape);
  ASSERT_TRUE(f.compress_all(*p).is_ok());
  EXPECT_EQ(f.kv->pool().n_used(), 2 * 4 * 2);
  EXPECT_EQ(f.kv->pool().n_free_ids(), used - 2 * 4 * 2);
  expect_conserved(*f.kv);
  EXPECT_EQ(f.kv->memory().blocks_in_use, 16);
}

// Ties go to the lower token index, the same on every run; random is a function of its seed.
TEST(KvPress, DeterministicTies) {
  Fixture f(1, 2, 2, 8, 64);
  // Every key zero: knorm ties everywhere (exactly; rotated unit keys differ in the last bit).
  for (auto& x : f.k) x = 0.0f;
  Fixture g = std::move(f);
  g.kv->clear();
  auto fresh = [&] {
    auto r = KvCache::create(g.kv->config());
    g.kv = std::move(r.value());
    g.append(0, 64);
  };
  fresh();
  auto p = make("knorm:ratio=0.5", g.shape);
  ASSERT_TRUE(g.compress_all(*p).is_ok());
  std::vector<int32_t> want(32);
  for (int i = 0; i < 32; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(seq_of(*g.kv, 0, 0), want);
  for (const auto& n : kAll) {
    fresh();
    auto a = make(n + ":ratio=0.6", g.shape);
    ASSERT_TRUE(g.compress_all(*a).is_ok());
    const auto first = seq_of(*g.kv, 0, 1);
    for (int rep = 0; rep < 3; ++rep) {
      fresh();
      ASSERT_TRUE(g.compress_all(*a).is_ok());
      EXPECT_EQ(seq_of(*g.kv, 0, 1), first) << n;
    }
  }
  Fixture r1(1, 2, 2, 8, 64);
  auto s1 = make("random:ratio=0.5,seed=1", r1.shape), s2 = make("random:ratio=0.5,seed=2", r1.shape);
  ASSERT_TRUE(r1.compress_all(*s1).is_ok());
  Fixture r2(1, 2, 2, 8, 64);
  ASSERT_TRUE(r2.compress_all(*s2).is_ok());
  EXPECT_NE(seq_of(*r1.kv, 0, 0), seq_of(*r2.kv, 0, 0));
}

// Scoring on a thread pool selects exactly what the serial path selects.
TEST(KvPress, ThreadPoolSameSelection) {
  ThreadPool tp(3);
  for (const auto& n : kAll) {
    Fixture a(2, 8, 4, 16, 80, 8, 21), b(2, 8, 4, 16, 80, 8, 21);
    auto p = make(n + ":ratio=0.7", a.shape);
    for (int64_t il = 0; il < 2; ++il) {
      PressContext ca = a.ctx(il, p->n_obs()), cb = b.ctx(il, p->n_obs());
      cb.pool = &tp;
      ASSERT_TRUE(p->compress(ca, il).is_ok());
      ASSERT_TRUE(p->compress(cb, il).is_ok());
      for (int64_t h = 0; h < 4; ++h) EXPECT_EQ(seq_of(*a.kv, il, h), seq_of(*b.kv, il, h)) << n;
    }
  }
}

// ---- score formulas on hand-built cases, against the test's own double computation ----

std::vector<std::vector<float>> scores_of(const std::string& scorer, const std::string& params, Fixture& f,
                                          int64_t il, int64_t n_obs, bool per_query_head) {
  auto args = press::Args::parse(scorer, params);
  EXPECT_TRUE(args.has_value());
  auto sc = (*press::find_scorer(scorer))(*args, f.shape);
  EXPECT_TRUE(sc.has_value());
  PressScores s;
  EXPECT_TRUE((*sc)->score(f.ctx(il, n_obs), il, f.shape, s).is_ok());
  return per_query_head ? s.by_query_head : s.by_kv_head;
}

// [n_obs][L] causal softmax of observation queries of query head hq, in double.
std::vector<std::vector<double>> probs_d(const Fixture& f, int64_t il, int64_t hq, int64_t n_obs) {
  const RopeTable& rt = f.kv->rope(il);
  const int64_t d = f.d, g = f.H / f.Hkv, L = f.L;
  std::vector<std::vector<double>> P;
  std::vector<double> qr(static_cast<size_t>(d)), kr(static_cast<size_t>(d));
  for (int64_t t = L - n_obs; t < L; ++t) {
    rope_d(f.qptr(il, t) + hq * d, d, rt, f.pos[static_cast<size_t>(t)], qr.data());
    std::vector<double> row(static_cast<size_t>(L), 0.0);
    double mx = -1e300;
    for (int64_t j = 0; j <= t; ++j) {
      rope_d(f.kptr(il, j) + (hq / g) * d, d, rt, f.pos[static_cast<size_t>(j)], kr.data());
      double a = 0;
      for (int64_t e = 0; e < d; ++e) a += qr[static_cast<size_t>(e)] * kr[static_cast<size_t>(e)];
      row[static_cast<size_t>(j)] = a / std::sqrt(static_cast<double>(d));
      mx = std::max(mx, row[static_cast<size_t>(j)]);
    }
    double sum = 0;
    for (int64_t j = 0; j <= t; ++j) sum += (row[static_cast<size_t>(j)] = std::exp(row[static_cast<size_t>(j)] - mx));
    for (int64_t j = 0; j <= t; ++j) row[static_cast<size_t>(j)] /= sum;
    P.push_back(row);
  }
  return P;
}

TEST(KvPressScores, Knorm) {
  Fixture f(1, 2, 2, 8, 40);
  auto s = scores_of("knorm", "", f, 0, 0, false);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < 40; ++j) {
      double a = 0;
      for (int64_t e = 0; e < 8; ++e) a += std::pow(f.kptr(0, j)[h * 8 + e], 2);
      EXPECT_NEAR(s[static_cast<size_t>(h)][static_cast<size_t>(j)], -std::sqrt(a), 1e-4);
    }
}

// KeyDiff's oracle, in double from the keys the cache holds (post-RoPE), written the way torch
// evaluates kvpress's definition: anchor = mean_i F.normalize(k_i) (eps 1e-12), score =
// -F.cosine_similarity(k, anchor) = -<k / max(||k||, 1e-8), a / max(||a||, 1e-8)>.
std::vector<double> keydiff_oracle(const KvCache& kv, int64_t il, int64_t h) {
  const int64_t n = kv.n_tokens(il, h), d = kv.head_dim();
  std::vector<float> K(static_cast<size_t>(n * d));
  if (n > 0) kv.read_keys(il, h, 0, n, K.data());
  auto unit = [&](const double* x, double eps) {
    double q = 0;
    for (int64_t e = 0; e < d; ++e) q += x[e] * x[e];
    std::vector<double> u(x, x + d);
    for (double& v : u) v /= std::max(std::sqrt(q), eps);
    return u;
  };
  std::vector<std::vector<double>> k(static_cast<size_t>(n));
  std::vector<double> a(static_cast<size_t>(d), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    k[static_cast<size_t>(j)].assign(K.begin() + j * d, K.begin() + (j + 1) * d);
    const auto u = unit(k[static_cast<size_t>(j)].data(), 1e-12);
    for (int64_t e = 0; e < d; ++e) a[static_cast<size_t>(e)] += u[static_cast<size_t>(e)] / static_cast<double>(n);
  }
  const auto au = unit(a.data(), 1e-8);
  std::vector<double> s;
  for (int64_t j = 0; j < n; ++j) {
    const auto ku = unit(k[static_cast<size_t>(j)].data(), 1e-8);
    double c = 0;
    for (int64_t e = 0; e < d; ++e) c += ku[static_cast<size_t>(e)] * au[static_cast<size_t>(e)];
    s.push_back(-c);
  }
  return s;
}

// The kept indices of a head under `keep` slots: the oracle's best, ties to the lower index.
std::vector<int32_t> top_by(const std::vector<double>& s, int64_t keep) {
  std::vector<int32_t> idx(s.size());
  for (size_t j = 0; j < s.size(); ++j) idx[j] = static_cast<int32_t>(j);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; });
  idx.resize(static_cast<size_t>(keep));
  std::sort(idx.begin(), idx.end());
  return idx;
}

void rebuild_cache(Fixture& f) {
  auto r = KvCache::create(f.kv->config());
  ASSERT_TRUE(r.has_value());
  f.kv = std::move(r.value());
  f.append(0, f.L);
}

// GQA (6 query heads over 3 KV heads), odd head_dim 9 with 8 rotated dims, two layers, a head
// already compressed (the anchor is over the tokens held), zero and tiny keys.
TEST(KvPressScores, KeyDiff) {
  Fixture f(2, 6, 3, 9, 45, 8, 13, 8);
  // Token 4 of head 1 and token 10 of head 2 (layer 0) are zero, token 7 of head 0 tiny
  // (norm < 1e-8, where torch's clamp shows): no NaN, a zero key scores exactly 0.
  for (int64_t e = 0; e < 9; ++e) {
    f.k[static_cast<size_t>((4 * 3 + 1) * 9 + e)] = 0.0f;
    f.k[static_cast<size_t>((10 * 3 + 2) * 9 + e)] = 0.0f;
    f.k[static_cast<size_t>((7 * 3 + 0) * 9 + e)] *= 1e-10f;
  }
  rebuild_cache(f);
  // The cache holds post-RoPE keys: the ones KeyDiff scores, as kvpress scores the cached ones.
  std::vector<float> got(9);
  std::vector<double> want(9);
  for (int64_t j : {0, 20, 44}) {
    f.kv->read_keys(1, 2, j, 1, got.data());
    rope_d(f.kptr(1, j) + 2 * 9, 9, f.kv->rope(1), f.pos[static_cast<size_t>(j)], want.data());
    for (int64_t e = 0; e < 9; ++e) EXPECT_NEAR(got[static_cast<size_t>(e)], want[static_cast<size_t>(e)], 1e-5) << j;
  }
  std::vector<int32_t> keep;
  for (int32_t j = 0; j < 45; j += 3) keep.push_back(j);
  ASSERT_TRUE(f.kv->retain(1, 0, keep).is_ok());
  for (int64_t il = 0; il < 2; ++il) {
    const auto s = scores_of("keydiff", "", f, il, 0, false);
    ASSERT_EQ(static_cast<int64_t>(s.size()), 3);
    for (int64_t h = 0; h < 3; ++h) {
      const auto o = keydiff_oracle(*f.kv, il, h);
      ASSERT_EQ(s[static_cast<size_t>(h)].size(), o.size()) << il << " " << h;
      for (size_t j = 0; j < o.size(); ++j) {
        EXPECT_FALSE(std::isnan(s[static_cast<size_t>(h)][j]));
        EXPECT_NEAR(s[static_cast<size_t>(h)][j], o[j], 1e-6) << il << " " << h << " " << j;
      }
    }
    if (il == 0) {
      EXPECT_EQ(s[1][4], 0.0f);
      EXPECT_EQ(s[2][10], 0.0f);
      EXPECT_NE(s[0][7], 0.0f);  // tiny, not zero: its direction still counts
    }
  }
  // Every key zero: the anchor is zero, every score 0.
  for (auto& x : f.k) x = 0.0f;
  rebuild_cache(f);
  for (const auto& row : scores_of("keydiff", "", f, 0, 0, false))
    for (float v : row) EXPECT_EQ(v, 0.0f);
}

// keydiff:ratio=0.5 keeps exactly the oracle's top half of every head; where scores tie exactly
// (keys parallel up to a power of two, no RoPE), the lower token index wins.
TEST(KvPressScores, KeyDiffKeepsTheOraclesTopHalf) {
  Fixture f(2, 6, 3, 9, 45, 8, 17, 8);
  std::vector<std::vector<double>> want(6);
  for (int64_t il = 0; il < 2; ++il)
    for (int64_t h = 0; h < 3; ++h) {
      auto o = keydiff_oracle(*f.kv, il, h);
      // The selection is only decided by the scores if the cut is not a near-tie.
      auto sorted = o;
      std::sort(sorted.begin(), sorted.end(), std::greater<double>());
      ASSERT_GT(sorted[21] - sorted[22], 1e-6) << il << " " << h;
      want[static_cast<size_t>(il * 3 + h)] = o;
    }
  auto p = make("keydiff:ratio=0.5", f.shape);
  ASSERT_TRUE(p);
  ASSERT_TRUE(f.compress_all(*p).is_ok());
  for (int64_t il = 0; il < 2; ++il)
    for (int64_t h = 0; h < 3; ++h) {
      const auto kept = seq_of(*f.kv, il, h);
      EXPECT_EQ(kept.size(), 22u);  // floor(45 * 0.5)
      EXPECT_EQ(kept, top_by(want[static_cast<size_t>(il * 3 + h)], 22)) << il << " " << h;
    }
  expect_conserved(*f.kv);

  // Ties: 4 directions, token j on direction j % 4 scaled by 2^((j / 4) % 3 - 1), so 6 tokens
  // share each score exactly; budget 9 takes one whole group and the 3 lowest of the next.
  Fixture t(1, 4, 2, 9, 24, 8, 19, 0);
  for (int64_t j = 0; j < 24; ++j)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t e = 0; e < 9; ++e)
        t.k[static_cast<size_t>((j * 2 + h) * 9 + e)] =
            t.k[static_cast<size_t>(((j % 4) * 2 + h) * 9 + e)] * std::ldexp(1.0f, static_cast<int>((j / 4) % 3) - 1);
  rebuild_cache(t);
  std::vector<std::vector<int32_t>> tie_want;
  for (int64_t h = 0; h < 2; ++h) {
    const auto o = keydiff_oracle(*t.kv, 0, h);
    std::set<double> distinct(o.begin(), o.end());
    EXPECT_EQ(distinct.size(), 4u) << h;
    tie_want.push_back(top_by(o, 9));
  }
  auto b = make("keydiff:budget=9", t.shape);
  ASSERT_TRUE(t.compress_all(*b).is_ok());
  for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(seq_of(*t.kv, 0, h), tie_want[static_cast<size_t>(h)]) << h;
}

TEST(KvPressScores, SnapKv) {
  Fixture f(1, 4, 2, 8, 50);
  const int64_t w = 6, kernel = 3;
  auto s = scores_of("snapkv", "obs=6,kernel=3", f, 0, w, true);
  for (int64_t hq = 0; hq < 4; ++hq) {
    const auto P = probs_d(f, 0, hq, w);
    std::vector<double> a(static_cast<size_t>(50 - w), 0.0);
    for (const auto& row : P)
      for (int64_t j = 0; j < 50 - w; ++j) a[static_cast<size_t>(j)] += row[static_cast<size_t>(j)] / w;
    for (int64_t j = 0; j < 50 - w; ++j) {
      double pooled = 0;
      for (int64_t i = j - 1; i <= j + 1; ++i)
        if (i >= 0 && i < 50 - w) pooled += a[static_cast<size_t>(i)];
      EXPECT_NEAR(s[static_cast<size_t>(hq)][static_cast<size_t>(j)], pooled / kernel, 1e-5) << hq << " " << j;
    }
    for (int64_t j = 50 - w; j < 50; ++j) EXPECT_EQ(s[static_cast<size_t>(hq)][static_cast<size_t>(j)], FLT_MAX);
  }
}

TEST(KvPressScores, H2oCausalNormalisation) {
  Fixture f(1, 2, 1, 8, 30);
  const int64_t w = 5;
  auto s = scores_of("h2o", "obs=5,source=window", f, 0, w, true);
  for (int64_t hq = 0; hq < 2; ++hq) {
    const auto P = probs_d(f, 0, hq, w);
    for (int64_t j = 0; j < 30; ++j) {
      double sum = 0;
      int cnt = 0;
      for (int64_t t = 0; t < w; ++t)
        if (j <= 30 - w + t) sum += P[static_cast<size_t>(t)][static_cast<size_t>(j)], ++cnt;
      EXPECT_NEAR(s[static_cast<size_t>(hq)][static_cast<size_t>(j)], sum / cnt, 1e-5) << j;
    }
  }
}

TEST(KvPressScores, TovaAveragesOverAllHeads) {
  Fixture f(1, 4, 2, 8, 30);
  auto s = scores_of("tova", "", f, 0, 1, false);
  std::vector<double> want(30, 0.0);
  for (int64_t hq = 0; hq < 4; ++hq) {
    const auto P = probs_d(f, 0, hq, 1);
    for (int64_t j = 0; j < 30; ++j) want[static_cast<size_t>(j)] += P[0][static_cast<size_t>(j)] / 4;
  }
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < 30; ++j) EXPECT_NEAR(s[static_cast<size_t>(h)][static_cast<size_t>(j)], want[static_cast<size_t>(j)], 1e-5);
}

TEST(KvPressScores, StreamingLlmIsRecency) {
  Fixture f(1, 2, 1, 8, 30);
  auto p = make("streaming_llm:ratio=0.5,n_sink=4,reposition=0", f.shape);
  ASSERT_TRUE(f.compress_all(*p).is_ok());
  std::vector<int32_t> want = {0, 1, 2, 3};
  for (int32_t j = 19; j < 30; ++j) want.push_back(j);
  EXPECT_EQ(seq_of(*f.kv, 0, 0), want);
}

TEST(KvPressScores, ExpectedAttention) {
  Fixture f(1, 2, 1, 8, 40);
  const int64_t w = 10, nf = 7;
  auto s = scores_of("expected_attention", "obs=10,n_future=7", f, 0, w, true);
  const RopeTable& rt = f.kv->rope(0);
  const int64_t d = 8;
  for (int64_t hq = 0; hq < 2; ++hq) {
    // Oracle: average the exact MGF-style score over sampled rotations instead of the closed
    // form: z_j = mean_p [scale k.R(p)mu] + scale^2/2 k^T (mean_p R(p)) Sigma (mean_p R(p))^T k.
    std::vector<double> mu(d, 0.0), sig(d * d, 0.0);
    for (int64_t t = 40 - w; t < 40; ++t)
      for (int64_t e = 0; e < d; ++e) mu[static_cast<size_t>(e)] += f.qptr(0, t)[hq * d + e] / double(w);
    for (int64_t t = 40 - w; t < 40; ++t)
      for (int64_t a = 0; a < d; ++a)
        for (int64_t b = 0; b < d; ++b)
          sig[static_cast<size_t>(a * d + b)] += (f.qptr(0, t)[hq * d + a] - mu[static_cast<size_t>(a)]) *
                                                 (f.qptr(0, t)[hq * d + b] - mu[static_cast<size_t>(b)]) / double(w);  // biased (1/N), as kvpress
    // Mean rotation matrix, built by rotating basis vectors.
    std::vector<double> R(d * d, 0.0), col(d);
    for (int64_t p = 40; p < 40 + nf; ++p)
      for (int64_t b = 0; b < d; ++b) {
        std::vector<float> eb(d, 0.0f);
        eb[static_cast<size_t>(b)] = 1.0f;
        rope_d(eb.data(), d, rt, static_cast<int32_t>(p), col.data());
        for (int64_t a = 0; a < d; ++a) R[static_cast<size_t>(a * d + b)] += col[static_cast<size_t>(a)] / double(nf);
      }
    std::vector<double> mu2(d, 0.0), S2(d * d, 0.0), tmp(d * d, 0.0);
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b) mu2[static_cast<size_t>(a)] += R[static_cast<size_t>(a * d + b)] * mu[static_cast<size_t>(b)];
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b)
        for (int64_t c = 0; c < d; ++c) tmp[static_cast<size_t>(a * d + b)] += R[static_cast<size_t>(a * d + c)] * sig[static_cast<size_t>(c * d + b)];
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b)
        for (int64_t c = 0; c < d; ++c) S2[static_cast<size_t>(a * d + b)] += tmp[static_cast<size_t>(a * d + c)] * R[static_cast<size_t>(b * d + c)];
    std::vector<double> z(40);
    double mx = -1e300;
    const double scale = 1 / std::sqrt(double(d));
    std::vector<double> kr(d);
    for (int64_t j = 0; j < 40; ++j) {
      rope_d(f.kptr(0, j), d, rt, static_cast<int32_t>(j), kr.data());
      double lin = 0, quad = 0;
      for (int64_t a = 0; a < d; ++a) {
        lin += kr[static_cast<size_t>(a)] * mu2[static_cast<size_t>(a)];
        for (int64_t b = 0; b < d; ++b) quad += kr[static_cast<size_t>(a)] * S2[static_cast<size_t>(a * d + b)] * kr[static_cast<size_t>(b)];
      }
      z[static_cast<size_t>(j)] = scale * lin + 0.5 * scale * scale * quad;
      mx = std::max(mx, z[static_cast<size_t>(j)]);
    }
    double sum = 0;
    for (auto& x : z) sum += (x = std::exp(x - mx));
    for (int64_t j = 0; j < 40; ++j) {
      double vn = 0;
      for (int64_t e = 0; e < d; ++e) vn += std::pow(f.vptr(0, j)[e], 2);
      const double want = z[static_cast<size_t>(j)] / sum * std::sqrt(vn);
      EXPECT_NEAR(s[static_cast<size_t>(hq)][static_cast<size_t>(j)], want, 1e-5 + 1e-4 * want) << hq << " " << j;
    }
  }
}

// Group reduction: mean or max over the query heads of a KV head.
TEST(KvPress, GroupReduceMeanAndMax) {
  Fixture f(1, 4, 1, 8, 40);
  for (const std::string red : {"mean", "max"}) {
    Fixture g(1, 4, 1, 8, 40);
    auto per_q = scores_of("h2o", "obs=8,source=window", g, 0, 8, true);
    std::vector<int32_t> order(40);
    std::vector<float> r(40);
    for (int j = 0; j < 40; ++j) {
      float m = red == "max" ? -1e30f : 0.0f;
      for (int q = 0; q < 4; ++q) m = red == "max" ? std::max(m, per_q[static_cast<size_t>(q)][static_cast<size_t>(j)]) : m + per_q[static_cast<size_t>(q)][static_cast<size_t>(j)];
      r[static_cast<size_t>(j)] = red == "max" ? m : m / 4;
    }
    // Expected keep: protected last 8, top 12 of the rest by r, ties lower index.
    std::vector<int32_t> cand;
    for (int j = 0; j < 32; ++j) cand.push_back(j);
    std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return r[static_cast<size_t>(a)] > r[static_cast<size_t>(b)]; });
    std::vector<int32_t> want(cand.begin(), cand.begin() + 12);
    for (int j = 32; j < 40; ++j) want.push_back(j);
    std::sort(want.begin(), want.end());
    auto p = make("h2o:budget=20,obs=8,source=window,reduce=" + red, g.shape);
    ASSERT_TRUE(g.compress_all(*p).is_ok());
    EXPECT_EQ(seq_of(*g.kv, 0, 0), want) << red;
  }
}

// ---- compressed cache + decode == naive attention restricted to the kept tokens ----

TEST(KvPress, DecodeEqualsNaiveOverKeptTokens) {
  for (const auto& n : kAll) {
    const int64_t L = 90, H = 4, Hkv = 2, d = 16;
    Fixture f(2, H, Hkv, d, L, 8, 11);
    f.L = L;  // the last token is the decode token: prefill L - 1
    f.kv->clear();
    auto r = KvCache::create(f.kv->config());
    f.kv = std::move(r.value());
    f.append(0, L - 1);
    auto p = make(n + ":ratio=0.6,window=4,n_sink=2", f.shape);
    for (int64_t il = 0; il < 2; ++il) ASSERT_TRUE(p->compress(f.ctx(il, p->n_obs(), L - 1), il).is_ok()) << n;
    f.append(L - 1, 1);
    AttnShape as{2, H, Hkv, d, d, 0.0f};
    auto be = make_attention_backend("naive", as);
    ASSERT_TRUE(be.has_value());
    ThreadPool tp(1);
    for (int64_t il = 0; il < 2; ++il) {
      std::vector<float> got(static_cast<size_t>(H * d));
      ASSERT_TRUE((*be)->forward(il, 1, f.qptr(il, L - 1), &f.pos[L - 1], *f.kv, got.data(), tp).is_ok());
      for (int64_t hq = 0; hq < H; ++hq) {
        const int64_t h = hq / (H / Hkv);
        // Oracle: the original data of the kept sequence indices, keys rotated at the position
        // the cache now records for them (streaming_llm re-assigns positions).
        const auto kept = seq_of(*f.kv, il, h);
        const int32_t* kpos = f.kv->positions(il, h);
        if (n != "streaming_llm") {
          for (size_t j = 0; j < kept.size(); ++j) EXPECT_EQ(kpos[j], kept[j]);
        }
        EXPECT_LT(kept.size(), static_cast<size_t>(L - 1));
        std::vector<double> qr(d), kr(d), sc;
        rope_d(f.qptr(il, L - 1) + hq * d, d, f.kv->rope(il), f.pos[L - 1], qr.data());
        double mx = -1e300;
        for (size_t j = 0; j < kept.size(); ++j) {
          rope_d(f.kptr(il, kept[j]) + h * d, d, f.kv->rope(il), kpos[j], kr.data());
          double a = 0;
          for (int64_t e = 0; e < d; ++e) a += qr[static_cast<size_t>(e)] * kr[static_cast<size_t>(e)];
          sc.push_back(a / std::sqrt(double(d)));
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (auto& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < d; ++e) {
          double a = 0;
          for (size_t j = 0; j < kept.size(); ++j) a += sc[j] * f.vptr(il, kept[j])[h * d + e];
          EXPECT_NEAR(got[static_cast<size_t>(hq * d + e)], a / sum, 2e-5) << n << " il " << il << " hq " << hq;
        }
      }
    }
  }
}

// StreamingLLM re-assigns positions: kept tokens contiguous, ending at the last position.
TEST(KvPress, StreamingLlmRepositions) {
  Fixture f(1, 2, 1, 8, 40);
  auto p = make("streaming_llm:budget=12", f.shape);
  ASSERT_TRUE(f.compress_all(*p).is_ok());
  ASSERT_EQ(f.kv->n_tokens(0, 0), 12);
  for (int j = 0; j < 12; ++j) EXPECT_EQ(f.kv->positions(0, 0)[j], 28 + j);
  EXPECT_EQ(seq_of(*f.kv, 0, 0)[3], 3);
  EXPECT_EQ(seq_of(*f.kv, 0, 0)[4], 32);
}

// Per-chunk compression bounds the cache as the prompt streams in; decoding compression
// brings it back to target every interval tokens.
TEST(KvPress, ScheduleChunkAndDecode) {
  Fixture f(2, 4, 2, 8, 200, 8);
  f.kv->clear();
  f.kv = std::move(KvCache::create(f.kv->config()).value());
  auto p = make("snapkv:budget=40,window=8,obs=8,chunk=1,interval=10,target=30", f.shape);
  const PressSchedule& s = p->schedule();
  EXPECT_TRUE(s.per_chunk && s.after_prefill);
  int64_t peak_blocks = 0;
  for (int64_t first = 0; first < 150; first += 30) {
    f.append(first, 30);
    peak_blocks = std::max(peak_blocks, f.kv->pool().n_used());
    ASSERT_TRUE(f.compress_all(*p, first + 30, PressPhase::kChunk).is_ok());
    for (int64_t il = 0; il < 2; ++il) {
      for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(f.kv->n_tokens(il, h), std::min<int64_t>(first + 30, 40));
    }
  }
  EXPECT_LE(peak_blocks, 2 * 2 * ((40 + 30 + 7) / 8 + 1));
  EXPECT_FALSE(s.decode_due(5));
  for (int64_t t = 150; t < 200; ++t) {
    f.append(t, 1);
    if (s.decode_due(t + 1 - 150)) {
      ASSERT_TRUE(f.compress_all(*p, t + 1, PressPhase::kDecode).is_ok());
    }
    EXPECT_LE(f.kv->n_tokens(0, 0), 40 + 10);  // at most interval tokens above the last target
  }
  EXPECT_EQ(f.kv->n_tokens(1, 1), 30);  // 50 decoded: compressed at 50
  // Prefill phase for a chunk-only press is still once at the end; a decode-only press
  // ignores prefill.
  auto d = make("knorm:interval=4,target=8", f.shape);
  EXPECT_FALSE(d->schedule().after_prefill);
  const int64_t before = f.kv->n_tokens(0, 0);
  ASSERT_TRUE(f.compress_all(*d, 200, PressPhase::kPrefill).is_ok());
  EXPECT_EQ(f.kv->n_tokens(0, 0), before);
  EXPECT_FALSE(make("knorm:query=agnostic", f.shape)->schedule().query_aware);
  expect_conserved(*f.kv);
}

TEST(KvPress, ChainAppliesInOrder) {
  Fixture f(1, 2, 2, 8, 100);
  auto p = make("knorm:ratio=0.5+snapkv:budget=20,obs=8", f.shape);
  ASSERT_TRUE(f.compress_all(*p).is_ok());
  EXPECT_EQ(f.kv->n_tokens(0, 0), 20);
  Fixture g(1, 2, 2, 8, 100);
  auto k = make("knorm:ratio=0.5", g.shape);
  ASSERT_TRUE(g.compress_all(*k).is_ok());
  const auto after_knorm = seq_of(*g.kv, 0, 0);
  for (int32_t s : seq_of(*f.kv, 0, 0)) EXPECT_TRUE(std::count(after_knorm.begin(), after_knorm.end(), s));
  std::vector<std::vector<int32_t>> keep;
  EXPECT_FALSE(p->select(f.ctx(0, 8), 0, keep).is_ok());
}

TEST(KvPress, AdaKvHeadBudgetsDiffer) {
  Fixture f(1, 8, 4, 16, 120, 8, 5);
  // Make head 0's keys sharply attended and others flat: adaptive budgets should differ.
  for (int64_t t = 0; t < 120; ++t)
    for (int64_t e = 0; e < 16; ++e) f.k[static_cast<size_t>((t * 4 + 0) * 16 + e)] *= 4.0f;
  f.kv = std::move(KvCache::create(f.kv->config()).value());
  f.append(0, 120);
  auto p = make("adakv:inner=snapkv,obs=16,ratio=0.75,alpha=0.2", f.shape);
  ASSERT_TRUE(f.compress_all(*p).is_ok());
  std::set<int64_t> sizes;
  int64_t total = 0;
  for (int64_t h = 0; h < 4; ++h) {
    sizes.insert(f.kv->n_tokens(0, h));
    total += f.kv->n_tokens(0, h);
    EXPECT_GE(f.kv->n_tokens(0, h), 16 + (30 - 16) / 5);  // window + safeguard
  }
  EXPECT_EQ(total, 4 * 30);
  EXPECT_GT(sizes.size(), 1u);
  expect_conserved(*f.kv);
}

}  // namespace
}  // namespace lc

namespace lc {
namespace {

// ---- draft-guided presses and the attention observer, against naive recomputation ----

// Naive causal softmax of one pre-RoPE query (head hq, position qp, sequence index qs) over the
// keys of KV head hq / g that `held` lists (sequence indices), in double; 0 for the others.
std::vector<double> naive_probs(const Fixture& f, int64_t il, const float* q, int64_t hq, int32_t qp, int32_t qs,
                                const std::vector<int32_t>& held, int64_t n_seq) {
  const RopeTable& rt = f.kv->rope(il);
  const int64_t d = f.d, g = f.H / f.Hkv;
  std::vector<double> qr(static_cast<size_t>(d)), kr(static_cast<size_t>(d)), p(static_cast<size_t>(n_seq), 0.0);
  rope_d(q + hq * d, d, rt, qp, qr.data());
  double mx = -1e300;
  std::vector<int32_t> vis;
  for (int32_t j : held)
    if (j <= qs) vis.push_back(j);
  for (int32_t j : vis) {
    rope_d(f.kptr(il, j) + (hq / g) * d, d, rt, f.pos[static_cast<size_t>(j)], kr.data());
    double a = 0;
    for (int64_t e = 0; e < d; ++e) a += qr[static_cast<size_t>(e)] * kr[static_cast<size_t>(e)];
    p[static_cast<size_t>(j)] = a / std::sqrt(static_cast<double>(d));
    mx = std::max(mx, p[static_cast<size_t>(j)]);
  }
  double sum = 0;
  for (int32_t j : vis) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
  for (int32_t j : vis) p[static_cast<size_t>(j)] /= sum;
  return p;
}

// log(sum_j exp(s_j)) of query head hq at sequence index qs over the held tokens it sees, in
// double (what a dense backend hands the observer as row_lse).
double naive_lse(const Fixture& f, int64_t il, const float* q, int64_t hq, int32_t qp, int32_t qs,
                 const std::vector<int32_t>& held) {
  const RopeTable& rt = f.kv->rope(il);
  const int64_t d = f.d, g = f.H / f.Hkv;
  std::vector<double> qr(static_cast<size_t>(d)), kr(static_cast<size_t>(d));
  rope_d(q + hq * d, d, rt, qp, qr.data());
  std::vector<double> s;
  for (int32_t j : held) {
    if (j > qs) continue;
    rope_d(f.kptr(il, j) + (hq / g) * d, d, rt, f.pos[static_cast<size_t>(j)], kr.data());
    double a = 0;
    for (int64_t e = 0; e < d; ++e) a += qr[static_cast<size_t>(e)] * kr[static_cast<size_t>(e)];
    s.push_back(a / std::sqrt(static_cast<double>(d)));
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double x : s) sum += std::exp(x - mx);
  return mx + std::log(sum);
}

// SpecKV's kept sets are checked against the authors' definition in press_oracle_test.cpp.
// Here: its defaults are the authors' paper configs, its spec round-trips, bad keys are refused.
TEST(KvPressSpecKv, DefaultsAreTheAuthorsConfigs) {
  const PressShape sh{2, 4, 2, 8, 8, 0.0f};
  auto p = make("speckv:ratio=0.5", sh);
  ASSERT_TRUE(p);
  // window_size 32 + the last prompt token, kernel 7, max pooling, max over group x queries,
  // lookahead = the answer's max new tokens (lookahead_tokens: null).
  for (const char* want : {"window=33", "reduce=max", "obs=33", "lookahead=answer", "kernel=7", "pool=max"})
    EXPECT_NE(p->spec().find(want), std::string::npos) << want << " in " << p->spec();
  EXPECT_EQ(p->n_obs(), 33);
  EXPECT_EQ(p->lookahead(), kLookaheadAnswer);
  EXPECT_TRUE(p->needs_draft());
  auto again = make(p->spec(), sh);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->spec(), p->spec());
  auto q = make("speckv:budget=257,lookahead=12,reduce=mean,pool=avg", sh);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->lookahead(), 12);
  EXPECT_NE(q->spec().find("lookahead=12"), std::string::npos) << q->spec();
  EXPECT_NE(q->spec().find("reduce=mean"), std::string::npos) << q->spec();
  for (const char* bad : {"speckv:chunk=1,ratio=0.5", "speckv:interval=8,target=64", "speckv:lookahead=0",
                          "speckv:lookahead=-2", "speckv:lookahead=8x", "speckv:lookahead=answers", "speckv:kernel=4",
                          "speckv:reduce=sum", "speckv:pool=min", "speckv:budget=20"}) {
    auto e = make_kv_press(bad, sh);
    ASSERT_FALSE(e.has_value()) << bad;
    EXPECT_NE(e.error().message.find("speckv"), std::string::npos) << e.error().message;
  }
  auto e = make_kv_press("speckv:lookahead=0", sh);
  EXPECT_NE(e.error().message.find("lookahead"), std::string::npos) << e.error().message;
}

// A chain hands the draft's lookahead queries and keys to its look-ahead part only: the other
// parts score with the prompt's queries, as they do alone. The chain equals its parts applied
// in turn, each with the context it gets alone; the old hand-over (every part got the last
// n_obs() queries, the lookahead's among them) keeps other tokens here.
TEST(KvPressSpecKv, AChainHandsTheLookaheadToItsLookaheadPartOnly) {
  const int64_t L = 60, la = 5;
  const std::string first = "snapkv:obs=6,ratio=0.25", second = "speckv:obs=4,lookahead=5,ratio=0.5";
  // The prompt's L tokens in the cache; the la lookahead tokens' queries follow in f.q, and
  // their keys are those the cache stored before they were truncated away.
  auto fresh = [&] {
    auto f = std::make_unique<Fixture>(2, 4, 2, 8, L + la, 16, 5);
    std::vector<float> lk(static_cast<size_t>(2 * 2 * la * 8));
    for (int64_t il = 0; il < 2; ++il)
      for (int64_t h = 0; h < 2; ++h) f->kv->read_keys(il, h, L, la, lk.data() + ((il * 2 + h) * la) * 8);
    f->kv->truncate(L);
    return std::make_pair(std::move(f), lk);
  };
  std::vector<int32_t> seq;
  for (int32_t t = 0; t < L + la; ++t) seq.push_back(t);
  // Rows [row0, row0 + n) of the queries, the last n_la of them the lookahead's.
  auto run = [&](Fixture& f, const std::vector<float>& lk, const std::string& spec, int64_t row0, int64_t n,
                 int64_t n_la) {
    auto p = make(spec, f.shape);
    ASSERT_TRUE(p);
    for (int64_t il = 0; il < 2; ++il) {
      PressContext c;
      c.kv = f.kv.get();
      c.queries = f.qptr(il, row0);
      c.query_pos = f.pos.data() + row0;
      c.query_seq = seq.data() + row0;
      c.n_obs = n;
      c.n_lookahead = n_la;
      c.lookahead_keys = n_la > 0 ? lk.data() + il * 2 * la * 8 : nullptr;
      ASSERT_TRUE(p->compress(c, il).is_ok()) << spec;
    }
  };
  auto [chain, lk1] = fresh();
  auto [parts, lk2] = fresh();
  auto [old, lk3] = fresh();
  run(*chain, lk1, first + "+" + second, L - 6, 6 + la, la);
  run(*parts, lk2, first, L - 6, 6, 0);
  run(*parts, lk2, second, L - 4, 4 + la, la);
  run(*old, lk3, first, L + la - 6, 6, 0);  // what the first part got before: 1 prompt + 5 draft queries
  run(*old, lk3, second, L - 4, 4 + la, la);
  bool old_differs = false;
  for (int64_t il = 0; il < 2; ++il)
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(seq_of(*chain->kv, il, h), seq_of(*parts->kv, il, h)) << il << " " << h;
      EXPECT_EQ(static_cast<int64_t>(seq_of(*chain->kv, il, h).size()), L / 2);
      old_differs |= seq_of(*old->kv, il, h) != seq_of(*parts->kv, il, h);
    }
  EXPECT_TRUE(old_differs);
}

// The tiled observer over many KV blocks, several query tiles and slices per call, on 1 to 3
// threads, and normalised either by its own first pass or by a given row log-sum-exp: every
// variant matches the double-precision softmax sums, and the thread count changes no bit. The
// second shape has a GQA group (64 heads) larger than a tile's rows.
TEST(KvPressObserver, TiledAcrossBlocksThreadsAndGivenRowLse) {
  for (const auto& shp : {std::tuple<int64_t, int64_t, int64_t>{8, 2, 301}, {64, 1, 90}}) {
    const int64_t H = std::get<0>(shp), Hkv = std::get<1>(shp), L = std::get<2>(shp), g = H / Hkv;
    Fixture f(1, H, Hkv, 16, L, 16, 11);
    std::vector<int32_t> all;
    for (int32_t j = 0; j < L; ++j) all.push_back(j);
    std::vector<double> want(static_cast<size_t>(Hkv * L), 0.0);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t hq = 0; hq < H; ++hq) {
        const auto p =
            naive_probs(f, 0, f.qptr(0, t), hq, f.pos[static_cast<size_t>(t)], static_cast<int32_t>(t), all, L);
        for (int64_t j = 0; j <= t; ++j) want[static_cast<size_t>((hq / g) * L + j)] += p[static_cast<size_t>(j)];
      }
    // Prefill chunks, then a decode step.
    const std::vector<std::pair<int64_t, int64_t>> chunks =
        L > 200 ? std::vector<std::pair<int64_t, int64_t>>{{0, 200}, {200, L - 201}, {L - 1, 1}}
                : std::vector<std::pair<int64_t, int64_t>>{{0, L - 1}, {L - 1, 1}};
    auto run = [&](int threads, bool with_lse) {
      Fixture h(1, H, Hkv, 16, L, 16, 11);
      h.kv->clear();
      auto press = make("h2o:ratio=0.5", h.shape);
      auto* acc = dynamic_cast<AttentionAccumulator*>(press->observer());
      EXPECT_NE(acc, nullptr);
      std::unique_ptr<ThreadPool> pool;
      if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
      for (auto [first, n] : chunks) {
        h.append(first, n);
        std::vector<int32_t> seq;
        std::vector<float> lse;
        for (int64_t t = first; t < first + n; ++t) {
          seq.push_back(static_cast<int32_t>(t));
          for (int64_t hq = 0; hq < H; ++hq)
            lse.push_back(static_cast<float>(
                naive_lse(h, 0, h.qptr(0, t), hq, h.pos[static_cast<size_t>(t)], static_cast<int32_t>(t), all)));
        }
        acc->observe(*h.kv, 0, h.qptr(0, first), h.pos.data() + first, seq.data(), n, pool.get(),
                     with_lse ? lse.data() : nullptr);
      }
      std::vector<float> got;
      for (int64_t h2 = 0; h2 < Hkv; ++h2)
        for (int64_t j = 0; j < L; ++j) got.push_back(acc->sum(0, h2, j));
      return got;
    };
    const auto one = run(1, false);
    for (int64_t i = 0; i < Hkv * L; ++i)
      EXPECT_NEAR(one[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 2e-4) << i;
    EXPECT_EQ(run(2, false), one);
    EXPECT_EQ(run(3, false), one);
    for (int threads : {1, 2}) {
      const auto lse = run(threads, true);
      for (int64_t i = 0; i < Hkv * L; ++i)
        EXPECT_NEAR(lse[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 2e-4) << threads << " " << i;
    }
  }
}

// The observer accumulates the exact softmax of every query the "forward"
// evaluated, over the tokens each head held at that moment (an eviction between
// chunks changes what later queries see), and H2O's forward score is sum /
// (group size * queries that saw the token).
TEST(KvPressObserver, AccumulatesNaiveSoftmaxOfTheForward) {
  const int64_t L = 37;
  Fixture f(2, 4, 2, 8, L, 8, 5);
  f.kv->clear();
  auto press = make("h2o:ratio=0.5", f.shape);
  ASSERT_TRUE(press);
  AttentionObserver* obs = press->observer();
  ASSERT_NE(obs, nullptr);
  EXPECT_EQ(press->n_obs(), 0);  // no observation window needed
  // Oracle state: per (il, h) the held sequence indices; sums per (il, h, j); counts per (il, j).
  std::vector<std::vector<int32_t>> held(4);
  std::vector<std::vector<double>> sum(4, std::vector<double>(L, 0.0)), cnt(2, std::vector<double>(L, 0.0));
  auto feed = [&](int64_t first, int64_t n) {
    f.append(first, n);
    std::vector<int32_t> seq;
    for (int64_t t = first; t < first + n; ++t) seq.push_back(static_cast<int32_t>(t));
    for (int64_t il = 0; il < 2; ++il) {
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t t = first; t < first + n; ++t) held[static_cast<size_t>(il * 2 + h)].push_back(static_cast<int32_t>(t));
      obs->observe(*f.kv, il, f.qptr(il, first), f.pos.data() + first, seq.data(), n, nullptr, nullptr);
      for (int64_t t = first; t < first + n; ++t) {
        for (int64_t j = 0; j <= t; ++j) cnt[static_cast<size_t>(il)][static_cast<size_t>(j)] += 1;
        for (int64_t hq = 0; hq < 4; ++hq) {
          const auto p = naive_probs(f, il, f.qptr(il, t), hq, f.pos[static_cast<size_t>(t)], static_cast<int32_t>(t),
                                     held[static_cast<size_t>(il * 2 + hq / 2)], L);
          for (int64_t j = 0; j < L; ++j) sum[static_cast<size_t>(il * 2 + hq / 2)][static_cast<size_t>(j)] += p[static_cast<size_t>(j)];
        }
      }
    }
  };
  feed(0, 16);
  // Head (0, 1) drops its even tokens: later queries must not see them.
  std::vector<int32_t> keep;
  for (int32_t j = 1; j < 16; j += 2) keep.push_back(j);
  ASSERT_TRUE(f.kv->retain(0, 1, keep).is_ok());
  held[1] = keep;
  feed(16, 20);
  feed(36, 1);  // a decode step
  for (int64_t il = 0; il < 2; ++il)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < L; ++j) {
        auto* acc = dynamic_cast<AttentionAccumulator*>(obs);
        ASSERT_NE(acc, nullptr);
        EXPECT_NEAR(acc->sum(il, h, j), sum[static_cast<size_t>(il * 2 + h)][static_cast<size_t>(j)], 1e-4) << il << h << j;
        EXPECT_EQ(acc->count(il, j), cnt[static_cast<size_t>(il)][static_cast<size_t>(j)]);
      }
  // H2O's scores from the observer: kept = the top (sum / (2 * count)) outside the window.
  auto p = make("h2o:budget=20,window=6", f.shape);
  AttentionObserver* o2 = p->observer();
  // Replay the same forward into the new press's observer.
  Fixture g(2, 4, 2, 8, L, 8, 5);
  g.kv->clear();
  for (auto [first, n] : {std::pair<int64_t, int64_t>{0, 16}, {16, 20}, {36, 1}}) {
    g.append(first, n);  // no eviction here: every token stays visible
    std::vector<int32_t> seq;
    for (int64_t t = first; t < first + n; ++t) seq.push_back(static_cast<int32_t>(t));
    for (int64_t il = 0; il < 2; ++il) o2->observe(*g.kv, il, g.qptr(il, first), g.pos.data() + first, seq.data(), n, nullptr, nullptr);
  }
  ASSERT_TRUE(p->compress(g.ctx(0, 0), 0).is_ok());
  // Oracle for layer 0, head 0 (no eviction there): recompute sums with every token held.
  std::vector<double> sc(L, 0.0);
  std::vector<int32_t> all;
  for (int32_t j = 0; j < L; ++j) all.push_back(j);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t hq = 0; hq < 2; ++hq) {
      const auto pr = naive_probs(g, 0, g.qptr(0, t), hq, g.pos[static_cast<size_t>(t)], static_cast<int32_t>(t), all, L);
      for (int64_t j = 0; j < L; ++j) sc[static_cast<size_t>(j)] += pr[static_cast<size_t>(j)];
    }
  for (int64_t j = 0; j < L; ++j) sc[static_cast<size_t>(j)] /= 2.0 * static_cast<double>(L - j);
  std::vector<int32_t> cand;
  for (int32_t j = 0; j < L - 6; ++j) cand.push_back(j);
  std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return sc[static_cast<size_t>(a)] > sc[static_cast<size_t>(b)]; });
  std::vector<int32_t> want(cand.begin(), cand.begin() + 14);
  for (int32_t j = L - 6; j < L; ++j) want.push_back(j);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(seq_of(*g.kv, 0, 0), want);
  // The observer recomputes dense attention: a sparse backend is refused, dense accepted.
  AttentionCaps dense{"dense"};
  dense.exact = dense.reads_all_keys = true;
  EXPECT_FALSE(p->check_backend(AttentionCaps{"quest:budget=64"}).is_ok());
  EXPECT_TRUE(p->check_backend(dense).is_ok());
  EXPECT_TRUE(make("h2o:ratio=0.5,source=window", f.shape)->check_backend(AttentionCaps{"quest"}).is_ok());
  EXPECT_FALSE(make_kv_press("h2o:ratio=0.5,reduce=max", f.shape).has_value());
  // truncate drops the statistics of removed tokens.
  o2->truncate(10);
  auto* a2 = dynamic_cast<AttentionAccumulator*>(o2);
  EXPECT_EQ(a2->sum(0, 0, 12), 0.0f);
  EXPECT_EQ(a2->count(0, 12), 0.0f);
  EXPECT_GT(a2->count(0, 3), 0.0f);
}

// SpecPC's draft-attention aggregation against a naive recomputation: max over layers >=
// start_layer, query heads and queries of w_t * softmax, w_t linear over the window queries.
TEST(KvPressSpecPc, ScoresAreMaxOfWeightedDraftAttention) {
  const int64_t P = 30, la = 4, win = 6;
  Fixture f(3, 4, 2, 8, P + la - 1, 8, 9);  // the draft's cache: prompt + the la-1 generated tokens fed
  PromptCompression pc;
  pc.start_layer = 1;
  pc.window = win;
  pc.lookahead = la;
  const int64_t n_q = win + la - 1, first = P - win;
  std::vector<const float*> q(3, nullptr);
  for (int64_t il = 0; il < 3; ++il) q[static_cast<size_t>(il)] = f.qptr(il, first);
  std::vector<int32_t> seq;
  for (int64_t t = first; t < first + n_q; ++t) seq.push_back(static_cast<int32_t>(t));
  for (int reduce_max = 0; reduce_max < 2; ++reduce_max)
    for (int weighted = 0; weighted < 2; ++weighted) {
      pc.reduce_max = reduce_max == 1;
      pc.weighted = weighted == 1;
      const auto s = specpc_scores(*f.kv, f.shape, q, f.pos.data() + first, seq.data(), n_q, win, P, pc);
      ASSERT_EQ(static_cast<int64_t>(s.size()), P);
      std::vector<double> want(P, 0.0);
      std::vector<int32_t> all;
      for (int32_t j = 0; j < P + la - 1; ++j) all.push_back(j);
      for (int64_t il = 1; il < 3; ++il)
        for (int64_t t = 0; t < n_q; ++t) {
          const double w = t < win && pc.weighted ? static_cast<double>(t) / (win - 1) : 1.0;
          for (int64_t hq = 0; hq < 4; ++hq) {
            const auto p = naive_probs(f, il, f.qptr(il, first + t), hq, f.pos[static_cast<size_t>(first + t)], seq[static_cast<size_t>(t)], all, P + la - 1);
            for (int64_t j = 0; j < P; ++j)
              want[static_cast<size_t>(j)] = pc.reduce_max ? std::max(want[static_cast<size_t>(j)], w * p[static_cast<size_t>(j)])
                                                           : want[static_cast<size_t>(j)] + w * p[static_cast<size_t>(j)];
          }
        }
      for (int64_t j = 0; j < P; ++j) EXPECT_NEAR(s[static_cast<size_t>(j)], want[static_cast<size_t>(j)], 1e-5) << j;
    }
  // A draft shallower than start_layer votes with its last layer.
  EXPECT_EQ(specpc_first_layer(PromptCompression{}, 5), 4);
}

// SpecPC's selection on a hand-worked case: pooled peaks, neighbours nearest first, the window
// first, cut at the budget.
TEST(KvPressSpecPc, SelectionByHand) {
  std::vector<float> s(20, 0.0f);
  s[5] = 1.0f;
  s[12] = 0.5f;
  PromptCompression pc;
  pc.kernel = 3;
  pc.neighbours = 3;
  pc.window = 2;
  // pooled: 4,5,6 -> 1; 11,12,13 -> 0.5; top-8 = 4,5,6,11,12,13,0,1; with neighbours (0,-1,+1):
  // 4,3,5 | 6 | 7 | 11 ...; after the window 18,19 the first 8 are 18,19,4,3,5,6,7,11.
  EXPECT_EQ(specpc_select(s, 8, pc), (std::vector<int32_t>{3, 4, 5, 6, 7, 11, 18, 19}));
  EXPECT_EQ(specpc_select(s, 25, pc).size(), 20u);  // keep >= n: everything
  pc.kernel = 1;
  pc.neighbours = 1;
  EXPECT_EQ(specpc_select(s, 4, pc), (std::vector<int32_t>{5, 12, 18, 19}));
  // The budget and ratio.
  PromptCompression r;
  r.ratio = 0.75;
  EXPECT_EQ(r.kept(101), 25);
  r.ratio = -1, r.budget = 40;
  EXPECT_EQ(r.kept(30), 30);
  // Registry: specpc parses, prints its parameters and needs a draft; errors name the key.
  PressShape sh{2, 4, 2, 8, 8, 0};
  auto p = make_kv_press("specpc:budget=100,window=16", sh);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  EXPECT_TRUE((*p)->needs_draft());
  ASSERT_NE((*p)->prompt_compression(), nullptr);
  EXPECT_EQ((*p)->prompt_compression()->budget, 100);
  auto again = make_kv_press((*p)->spec(), sh);
  ASSERT_TRUE(again.has_value()) << (*p)->spec();
  EXPECT_EQ((*again)->spec(), (*p)->spec());
  for (const char* bad : {"specpc:budget=8,window=16", "specpc:foo=1", "specpc:ratio=2", "specpc:reduce=mean",
                          "specpc:ratio=0.5,budget=10"}) {
    auto e = make_kv_press(bad, sh);
    ASSERT_FALSE(e.has_value()) << bad;
    EXPECT_NE(e.error().message.find("specpc"), std::string::npos) << e.error().message;
  }
}

}  // namespace
}  // namespace lc
