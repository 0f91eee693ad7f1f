// Runs a backend over a whole sequence the way the model does: per chunk, per layer,
// append then forward.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "attention/backend.h"
#include "oracle.h"

namespace lc::test {

struct RunResult {
  std::vector<float> out;            // [T, H, dv] of the last layer
  std::vector<Selection> sel;        // per chunk, last layer (when recorded)
  std::vector<int64_t> chunk_t0;     // first token of each chunk
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<AttentionBackend> be;
};

inline ThreadPool& test_pool() {
  static ThreadPool pool(2);
  return pool;
}

// chunks: sizes used in turn (cycled) until the sequence is consumed.
inline RunResult run_seq(const Seq& s, const std::string& spec, const KvCacheConfig& cfg,
                         const std::vector<int64_t>& chunks, bool record = false, bool poison = false) {
  RunResult r;
  auto kv = KvCache::create(cfg);
  EXPECT_TRUE(kv.has_value()) << (kv ? "" : kv.error().message);
  r.kv = std::move(kv.value());
  auto be = make_attention_backend(spec, shape_of(s, cfg.n_layer));
  EXPECT_TRUE(be.has_value()) << (be ? "" : be.error().message);
  r.be = std::move(be.value());
  EXPECT_TRUE(r.be->attach(*r.kv).is_ok());
  r.be->record_selection(record);
  r.out.assign(static_cast<size_t>(s.T * s.H * s.dv), 0.0f);
  std::vector<float> tmp;
  size_t ci = 0;
  for (int64_t t0 = 0; t0 < s.T;) {
    const int64_t n = std::min(chunks[ci++ % chunks.size()], s.T - t0);
    tmp.assign(static_cast<size_t>(n * s.H * s.dv), 0.0f);
    for (int64_t il = 0; il < cfg.n_layer; ++il) {
      Status st = r.kv->append(il, n, s.k.data() + t0 * s.Hkv * s.d, s.v.data() + t0 * s.Hkv * s.dv, s.pos.data() + t0);
      EXPECT_TRUE(st.is_ok()) << st.message();
      if (poison) r.kv->poison_unused();
      st = r.be->forward(il, n, s.q.data() + t0 * s.H * s.d, s.pos.data() + t0, *r.kv, tmp.data(), test_pool());
      EXPECT_TRUE(st.is_ok()) << st.message();
    }
    std::copy(tmp.begin(), tmp.end(), r.out.begin() + t0 * s.H * s.dv);
    if (record) {
      r.sel.push_back(r.be->selection());
      r.chunk_t0.push_back(t0);
    }
    t0 += n;
  }
  return r;
}

// Continues r from token t0 of s (after r.kv->truncate(t0), say): the tokens' rows of r.out
// are overwritten.
inline void continue_seq(RunResult& r, const Seq& s, int64_t t0, int64_t chunk) {
  std::vector<float> tmp;
  const int64_t n_layer = r.kv->config().n_layer;
  for (; t0 < s.T;) {
    const int64_t n = std::min(chunk, s.T - t0);
    tmp.assign(static_cast<size_t>(n * s.H * s.dv), 0.0f);
    for (int64_t il = 0; il < n_layer; ++il) {
      Status st = r.kv->append(il, n, s.k.data() + t0 * s.Hkv * s.d, s.v.data() + t0 * s.Hkv * s.dv, s.pos.data() + t0);
      EXPECT_TRUE(st.is_ok()) << st.message();
      st = r.be->forward(il, n, s.q.data() + t0 * s.H * s.d, s.pos.data() + t0, *r.kv, tmp.data(), test_pool());
      EXPECT_TRUE(st.is_ok()) << st.message();
    }
    std::copy(tmp.begin(), tmp.end(), r.out.begin() + t0 * s.H * s.dv);
    t0 += n;
  }
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  if (a.size() != b.size()) return INFINITY;
  return m;
}

// Checks every row of every recorded chunk against the oracle restricted to its selection.
inline double max_err_vs_selection(const Seq& s, const RopeTable& rt, const RunResult& r) {
  double worst = 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  for (size_t c = 0; c < r.sel.size(); ++c) {
    const Selection& sel = r.sel[c];
    for (int64_t t = 0; t < sel.n; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        const auto& keys = sel.keys[static_cast<size_t>(t * s.H + h)];
        const int64_t tg = r.chunk_t0[c] + t;
        const auto o = oracle_row(s, rt, scale, tg, h, keys);
        for (int64_t i = 0; i < s.dv; ++i)
          worst = std::max(worst, std::abs(o[static_cast<size_t>(i)] - r.out[static_cast<size_t>((tg * s.H + h) * s.dv + i)]));
      }
  }
  return worst;
}

// Decoding (chunks of 1) of `base` with ",split=S" against ",split=1048576" (never split): exact
// on its own selection, within float rounding of the unsplit output, and attending the same
// keys for every token and head.
inline void expect_decode_split_matches_unsplit(const Seq& s, const RopeTable& rt, const KvCacheConfig& cfg,
                                                const std::string& base, int64_t split_tokens) {
  const auto split = run_seq(s, base + ",split=" + std::to_string(split_tokens), cfg, {1}, true);
  const auto whole = run_seq(s, base + ",split=1048576", cfg, {1}, true);
  EXPECT_LT(max_err_vs_selection(s, rt, split), 2e-4) << base;
  EXPECT_LT(max_abs_diff(split.out, whole.out), 1e-5) << base;
  for (size_t c = 0; c < split.sel.size(); ++c)
    for (int64_t h = 0; h < s.H; ++h) {
      std::set<int32_t> a, b;
      for (const auto& k : split.sel[c].keys[static_cast<size_t>(h)]) a.insert(k.seq_index);
      for (const auto& k : whole.sel[c].keys[static_cast<size_t>(h)]) b.insert(k.seq_index);
      EXPECT_EQ(a, b) << base << " token " << c << " head " << h;
    }
}

}  // namespace lc::test
