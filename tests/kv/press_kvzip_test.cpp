// KVzip's scores and selection against an independent double-precision oracle written from the
// reference (NVIDIA/kvpress, kvpress/presses/kvzip_press.py: prepare, score_kvzip,
// compress_post; Kim et al., arXiv 2505.23416), on random pre-RoPE data. The test plays the
// runtime's part (kv/press_kvzip.h): per chunk it appends the reconstruction tokens' keys a few
// at a time, layer by layer, hands the press their queries after each layer, and cuts the cache
// back to the context before the next chunk. The oracle, per chunk [s, e) and KV head h:
//   p_{t,j} = softmax over {first min(n_sink, s) context keys} + {keys s..e-1} + {reconstruction
//             keys 0..t} of q_t . k / sqrt(d)       (t: every reconstruction token, causal)
//   score_j = max over the group's query heads and every t of p_{t,j}, j in [s, e)
// then drops the floor(ratio x N) lowest of all N (layer, head, token) scores (layerwise: of
// each layer's), ties: a higher score, then an earlier (layer, head, token) entry, stays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "kv/press.h"
#include "kv/press_kvzip.h"

namespace lc {
namespace {

constexpr int64_t kL = 2, kH = 4, kHkv = 2, kD = 8;

// neox rotation in double over all dims, base 10000 (the cache's table below).
void rot(const float* x, int64_t p, double* out) {
  for (int64_t i = 0; i < kD / 2; ++i) {
    const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / kD);
    const double c = std::cos(a), s = std::sin(a);
    out[i] = x[i] * c - x[i + kD / 2] * s;
    out[i + kD / 2] = x[i] * s + x[i + kD / 2] * c;
  }
}

std::unique_ptr<KvCache> make_cache() {
  KvCacheConfig c;
  c.n_layer = kL;
  c.n_head_kv = kHkv;
  c.head_dim = kD;
  c.head_dim_v = kD;
  c.block_tokens = 16;
  LlamaCppRopeParams rp;
  rp.n_rot = static_cast<int32_t>(kD);
  rp.neox = true;
  c.rope = make_llama_cpp_rope(rp);
  auto r = KvCache::create(c);
  EXPECT_TRUE(r.has_value());
  return std::move(r.value());
}

// One context and the reconstruction tokens of each of its chunks (pre-RoPE, random).
struct Case {
  int64_t n;                            // context tokens
  std::vector<float> kc, vc;            // [L][n][Hkv][d]
  std::vector<int64_t> q_len;           // reconstruction tokens per chunk
  std::vector<std::vector<float>> kr;   // per chunk [L][q][Hkv][d]
  std::vector<std::vector<float>> qr;   // per chunk [L][q][H][d]
  std::vector<KvzipChunk> chunks;

  Case(int64_t n_, const std::vector<KvzipChunk>& ch, int64_t postfix, uint32_t seed) : n(n_), chunks(ch) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    kc.resize(static_cast<size_t>(kL * n * kHkv * kD));
    vc.resize(kc.size());
    for (auto& x : kc) x = nd(rng);
    for (auto& x : vc) x = nd(rng);
    // The first tokens' keys are long, so that some queries pay them most of their attention
    // (attention sinks): whether they are in every later chunk's softmax then matters.
    for (int64_t il = 0; il < kL; ++il)
      for (int64_t i = 0; i < 4 * kHkv * kD; ++i) kc[static_cast<size_t>(il * n * kHkv * kD + i)] *= 3.0f;
    for (size_t c = 0; c < ch.size(); ++c) {
      // prompt (5 tokens for the first chunk, 9 after) + postfix + suffix (2) + the chunk
      const int64_t len = ch[c].end - ch[c].first;
      const int64_t pf = c == 0 ? 0 : std::min(postfix, ch[c - 1].end - ch[c - 1].first);
      const int64_t q = (c == 0 ? 5 : 9) + pf + 2 + len;
      q_len.push_back(q);
      kr.emplace_back(static_cast<size_t>(kL * q * kHkv * kD));
      qr.emplace_back(static_cast<size_t>(kL * q * kH * kD));
      for (auto& x : kr.back()) x = nd(rng);
      for (auto& x : qr.back()) x = nd(rng);
    }
  }
  const float* kctx(int64_t il, int64_t t, int64_t h) const { return kc.data() + ((il * n + t) * kHkv + h) * kD; }
  const float* krep(size_t c, int64_t il, int64_t r, int64_t h) const {
    return kr[c].data() + ((il * q_len[c] + r) * kHkv + h) * kD;
  }
  const float* qrep(size_t c, int64_t il, int64_t r, int64_t hq) const {
    return qr[c].data() + ((il * q_len[c] + r) * kH + hq) * kD;
  }
};

// The oracle's scores [L][Hkv][n], in double.
std::vector<double> oracle_scores(const Case& cs, int64_t n_sink) {
  const int64_t n = cs.n, g = kH / kHkv;
  std::vector<double> score(static_cast<size_t>(kL * kHkv * n), 0.0);
  for (size_t c = 0; c < cs.chunks.size(); ++c) {
    const int64_t s = cs.chunks[c].first, e = cs.chunks[c].end, q = cs.q_len[c];
    const int64_t sink = std::min(n_sink, s);
    for (int64_t il = 0; il < kL; ++il)
      for (int64_t h = 0; h < kHkv; ++h) {
        // keys: sinks, the chunk, the reconstruction tokens (at positions n + r), rotated here
        std::vector<std::vector<double>> keys;
        auto add = [&](const float* k, int64_t p) {
          keys.emplace_back(static_cast<size_t>(kD));
          rot(k, p, keys.back().data());
        };
        for (int64_t j = 0; j < sink; ++j) add(cs.kctx(il, j, h), j);
        for (int64_t j = s; j < e; ++j) add(cs.kctx(il, j, h), j);
        for (int64_t r = 0; r < q; ++r) add(cs.krep(c, il, r, h), n + r);
        for (int64_t hq = h * g; hq < (h + 1) * g; ++hq)
          for (int64_t r = 0; r < q; ++r) {
            std::vector<double> qv(static_cast<size_t>(kD));
            rot(cs.qrep(c, il, r, hq), n + r, qv.data());
            const int64_t m = sink + (e - s) + r + 1;  // causal among the reconstruction tokens
            std::vector<double> a(static_cast<size_t>(m));
            double mx = -1e300;
            for (int64_t j = 0; j < m; ++j) {
              double dot = 0;
              for (int64_t x = 0; x < kD; ++x) dot += qv[static_cast<size_t>(x)] * keys[static_cast<size_t>(j)][static_cast<size_t>(x)];
              a[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(kD));
              mx = std::max(mx, a[static_cast<size_t>(j)]);
            }
            double sum = 0;
            for (double& x : a) sum += (x = std::exp(x - mx));
            for (int64_t j = s; j < e; ++j) {
              double& sc = score[static_cast<size_t>((il * kHkv + h) * n + j)];
              sc = std::max(sc, a[static_cast<size_t>(sink + j - s)] / sum);
            }
          }
      }
  }
  return score;
}

// Kept token indices [L][Hkv] after dropping `pruned` (per layer when layerwise) lowest.
std::vector<std::vector<std::vector<int32_t>>> oracle_keep(const std::vector<double>& score, int64_t n, bool layerwise,
                                                           int64_t pruned) {
  std::vector<std::vector<std::vector<int32_t>>> keep(kL, std::vector<std::vector<int32_t>>(kHkv));
  auto pick = [&](int64_t f0, int64_t f1, int64_t p) {  // flat entries [f0, f1) of (layer, head, token)
    std::vector<int64_t> order;
    for (int64_t f = f0; f < f1; ++f) order.push_back(f);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)];
    });
    order.resize(static_cast<size_t>(std::max<int64_t>(0, (f1 - f0) - p)));
    for (int64_t f : order) {
      const int64_t il = f / (kHkv * n), h = (f / n) % kHkv;
      keep[static_cast<size_t>(il)][static_cast<size_t>(h)].push_back(static_cast<int32_t>(f % n));
    }
  };
  if (layerwise) {
    for (int64_t il = 0; il < kL; ++il) pick(il * kHkv * n, (il + 1) * kHkv * n, pruned);
  } else {
    pick(0, kL * kHkv * n, pruned);
  }
  for (auto& l : keep)
    for (auto& h : l) std::sort(h.begin(), h.end());
  return keep;
}

// The press run as the runtime runs it: the context in the cache, then per chunk the
// reconstruction tokens `batch` at a time through every layer, observed after each layer,
// the cache cut back after the chunk; then compress() on every layer.
std::vector<std::vector<std::vector<int32_t>>> run_press(const std::string& spec, const Case& cs, int64_t batch,
                                                         ThreadPool* pool) {
  const PressShape shape{kL, kH, kHkv, kD, kD, 0.0f};
  auto made = make_kv_press(spec, shape);
  EXPECT_TRUE(made.has_value()) << spec << ": " << (made ? "" : made.error().message);
  if (!made) return {};
  KvPress& press = **made;
  KvzipReconstruction* rec = press.reconstruction();
  EXPECT_NE(rec, nullptr);
  EXPECT_FALSE(press.schedule().query_aware);
  auto kv = make_cache();
  const int64_t n = cs.n;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  for (int64_t il = 0; il < kL; ++il)
    EXPECT_TRUE(kv->append(il, n, cs.kctx(il, 0, 0), cs.vc.data() + il * n * kHkv * kD, pos.data()).is_ok());
  std::vector<std::vector<std::vector<int32_t>>> out(kL, std::vector<std::vector<int32_t>>(kHkv));
  if (!rec->needed(*kv)) {
    for (int64_t il = 0; il < kL; ++il)
      for (int64_t h = 0; h < kHkv; ++h)
        for (int32_t j = 0; j < n; ++j) out[static_cast<size_t>(il)][static_cast<size_t>(h)].push_back(j);
    return out;
  }
  EXPECT_EQ(rec->chunks(n).size(), cs.chunks.size());
  EXPECT_TRUE(rec->begin(*kv, pos).is_ok());
  for (size_t c = 0; c < cs.chunks.size(); ++c) {
    EXPECT_TRUE(rec->begin_chunk(*kv, cs.chunks[c], n).is_ok());
    const int64_t q = cs.q_len[c];
    for (int64_t r0 = 0; r0 < q; r0 += batch) {
      const int64_t m = std::min(batch, q - r0);
      std::vector<int32_t> rp(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) rp[static_cast<size_t>(i)] = static_cast<int32_t>(n + r0 + i);
      std::vector<float> v(static_cast<size_t>(m * kHkv * kD), 0.5f);
      for (int64_t il = 0; il < kL; ++il) {
        EXPECT_TRUE(kv->append(il, m, cs.krep(c, il, r0, 0), v.data(), rp.data()).is_ok());
        const Status st = rec->observe(*kv, il, cs.qrep(c, il, r0, 0), rp.data(), rp.data(), m, pool);
        EXPECT_TRUE(st.is_ok()) << st.message();
      }
    }
    kv->truncate(n);
  }
  EXPECT_TRUE(rec->finish(*kv).is_ok());
  for (int64_t il = 0; il < kL; ++il) {
    PressContext pc;
    pc.kv = kv.get();
    pc.pool = pool;
    const Status st = press.compress(pc, il);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  for (int64_t il = 0; il < kL; ++il)
    for (int64_t h = 0; h < kHkv; ++h) {
      const int32_t* s = kv->seq_index(il, h);
      out[static_cast<size_t>(il)][static_cast<size_t>(h)].assign(s, s + kv->n_tokens(il, h));
    }
  return out;
}

std::vector<KvzipChunk> ref_chunks(int64_t n, int64_t size) {  // kvpress _chunk_fn
  if (size == 0 || n <= size) return {{0, n}};
  std::vector<KvzipChunk> c;
  for (int64_t i = 0; i < (n - 1) / size + 1; ++i) c.push_back({i * size, std::min(n, (i + 1) * size)});
  return c;
}

TEST(KvzipPress, KeptSetsEqualTheReferenceOracle) {
  const int64_t n = 45;
  ThreadPool pool(3);
  int runs = 0;
  for (int64_t chunk : {int64_t{0}, int64_t{16}, int64_t{7}})
    for (int64_t n_sink : {int64_t{4}, int64_t{0}}) {
      const auto ch = ref_chunks(n, chunk);
      const Case cs(n, ch, 8, static_cast<uint32_t>(17 + chunk + n_sink));
      const auto score = oracle_scores(cs, n_sink);
      for (int pct : {10, 25, 50, 75, 90})
        for (int layerwise : {0, 1}) {
          const std::string spec = "kvzip:ratio=" + std::to_string(pct / 100.0) + ",layerwise=" +
                                   std::to_string(layerwise) + ",n_sink=" + std::to_string(n_sink) +
                                   ",chunk_size=" + std::to_string(chunk);
          // floor(ratio x N) in exact arithmetic: kvpress's int(numel x compression_ratio)
          const int64_t N = layerwise ? kHkv * n : kL * kHkv * n;
          const auto want = oracle_keep(score, n, layerwise == 1, pct * N / 100);
          const auto got = run_press(spec, cs, 6, (runs % 2) ? &pool : nullptr);
          int64_t kept = 0;
          for (int64_t il = 0; il < kL; ++il)
            for (int64_t h = 0; h < kHkv; ++h) {
              EXPECT_EQ(got[static_cast<size_t>(il)][static_cast<size_t>(h)], want[static_cast<size_t>(il)][static_cast<size_t>(h)])
                  << spec << " layer " << il << " head " << h;
              kept += static_cast<int64_t>(got[static_cast<size_t>(il)][static_cast<size_t>(h)].size());
            }
          EXPECT_EQ(kept, kL * kHkv * n - (layerwise ? kL : 1) * (pct * N / 100)) << spec;
          ++runs;
        }
    }
}

// budget=B keeps B x n_head_kv x n_layer entries in all (layerwise: B x n_head_kv per layer);
// the heads' shares differ. Threads and the reconstruction tokens' batching change nothing.
TEST(KvzipPress, BudgetThreadsAndBatching) {
  const int64_t n = 40;
  const auto ch = ref_chunks(n, 16);
  const Case cs(n, ch, 8, 5);
  const auto score = oracle_scores(cs, 4);
  ThreadPool pool(4);
  for (int layerwise : {0, 1}) {
    const std::string spec = "kvzip:budget=12,chunk_size=16,layerwise=" + std::to_string(layerwise);
    const int64_t N = layerwise ? kHkv * n : kL * kHkv * n;
    const auto want = oracle_keep(score, n, layerwise == 1, N - 12 * kHkv * (layerwise ? 1 : kL));
    const auto a = run_press(spec, cs, 1, nullptr);
    const auto b = run_press(spec, cs, 64, &pool);
    EXPECT_EQ(a, want) << spec;
    EXPECT_EQ(b, want) << spec;
    bool uneven = false;
    for (const auto& l : a)
      for (const auto& h : l) uneven |= h.size() != 12;
    EXPECT_TRUE(uneven) << spec;  // head-wise budgets
  }
}

TEST(KvzipPress, ChunksAndSpec) {
  const PressShape s{kL, kH, kHkv, kD, kD, 0.0f};
  for (int64_t chunk : {0, 1, 7, 16, 2048})
    for (int64_t n : {1, 7, 8, 45, 2048, 2049, 5000}) {
      auto p = make_kv_press("kvzip:chunk_size=" + std::to_string(chunk), s);
      ASSERT_TRUE(p.has_value());
      const auto got = (*p)->reconstruction()->chunks(n);
      const auto want = ref_chunks(n, chunk);
      ASSERT_EQ(got.size(), want.size()) << chunk << " " << n;
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i].first == want[i].first && got[i].end == want[i].end);
    }
  auto d = make_kv_press("kvzip", s);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)->spec(), "kvzip:ratio=0.5,layerwise=0,n_sink=4,chunk_size=2048,postfix=8");  // kvpress's defaults
  EXPECT_EQ((*d)->reconstruction()->postfix(), 8);
  EXPECT_EQ((*d)->n_obs(), 0);
  for (const char* spec : {"kvzip:ratio=0.25,layerwise=1,n_sink=0,chunk_size=0,postfix=3", "kvzip:budget=100"}) {
    auto p = make_kv_press(spec, s);
    ASSERT_TRUE(p.has_value()) << spec;
    auto p2 = make_kv_press((*p)->spec(), s);
    ASSERT_TRUE(p2.has_value());
    EXPECT_EQ((*p)->spec(), (*p2)->spec());
  }
  for (const char* bad : {"kvzip:ratio=1", "kvzip:ratio=-0.1", "kvzip:ratio=0.5,budget=4", "kvzip:chunk_size=-1",
                          "kvzip:layerwise=2", "kvzip:n_sink=-1", "kvzip:window=4", "kvzip:query=aware"}) {
    auto e = make_kv_press(bad, s);
    EXPECT_FALSE(e.has_value()) << bad;
  }
  auto e = make_kv_press("kvzip:chunk=64", s);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("chunk_size"), std::string::npos) << e.error().message;  // lists the keys
  // ratio 0 and a budget above what is held need no reconstruction.
  auto kv = make_cache();
  std::vector<float> k(static_cast<size_t>(10 * kHkv * kD), 1.0f);
  std::vector<int32_t> pos(10);
  for (int32_t t = 0; t < 10; ++t) pos[static_cast<size_t>(t)] = t;
  for (int64_t il = 0; il < kL; ++il) ASSERT_TRUE(kv->append(il, 10, k.data(), k.data(), pos.data()).is_ok());
  EXPECT_FALSE((*make_kv_press("kvzip:ratio=0", s))->reconstruction()->needed(*kv));
  EXPECT_FALSE((*make_kv_press("kvzip:budget=10", s))->reconstruction()->needed(*kv));
  EXPECT_TRUE((*make_kv_press("kvzip:budget=9", s))->reconstruction()->needed(*kv));
  EXPECT_TRUE((*make_kv_press("kvzip:ratio=0.5", s))->reconstruction()->needed(*kv));
  // compress() with no reconstruction run (a chain, a bare cache) says why.
  PressContext pc;
  pc.kv = kv.get();
  const Status st = (*d)->compress(pc, 0);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("reconstruction"), std::string::npos) << st.message();
  // Backends that evict or relabel the cache's tokens are refused; sparse ones are not.
  AttentionCaps caps;
  caps.spec = "streaming";
  caps.evicts = caps.relabels_positions = true;
  EXPECT_FALSE((*d)->check_backend(caps).is_ok());
  caps.spec = "quest";
  caps.evicts = caps.relabels_positions = false;
  EXPECT_TRUE((*d)->check_backend(caps).is_ok());
}

}  // namespace
}  // namespace lc
