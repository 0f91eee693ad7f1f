// `infllm`: what every query reads, checked token by token against an independent oracle in
// double precision, written from InfLLM's reference code (thunlp/InfLLM,
// inf_llm/attention/context_manager.py) with the project's representative tokens:
//   - a call's queries are cut into sub-chunks of `chunk` (exc_block_size); before sub-chunk s,
//     whose first query sees P + 1 tokens, memory block m = [sinks + m * block, sinks +
//     (m + 1) * block) exists when sinks + (m + 1) * block <= P - local (append_global);
//   - local part: each query's last `local` tokens at their real positions (a sliding window);
//   - global part, scored at the fixed distance (query at position `local`, key at 0): the
//     initial `sinks` tokens, the chosen blocks and the remainder (tokens from the end of the
//     last block), each only where older than the query's window (complement_sliding_window);
//   - the choice, once per layer and sub-chunk (calc_block_topk over every head): relevance(m)
//     = sum over KV heads of rope(sum of the sub-chunk's queries of the group, local) . rep(m),
//     the `topk` largest (ties: the lower block), or every block when there are no more;
//   - rep(m, h) of query head h (repr=attention, the reference's get_block_k): the sum of the
//     `reps` keys of the block, un-rotated, that received the most attention from head h's
//     queries while they waited in the remainder: per token, the sum over every query whose
//     local window held it of that query's final softmax probability on it, the softmax taken
//     over everything the query read (local and global; torch_impl.py's finalize). The
//     oracle's softmax is its own, in double, over the keys it says each query reads.
//   - with repr=qsum (the project's cheaper rule), rep(m, h) for every h of a KV head: the sum
//     of the `reps` keys with the largest dot product with the sum of the block's own tokens'
//     queries of the group;
//   ties: the lower token, the lower block.
// After a cut of the cache to `low` tokens (the project's rule; the reference never cuts): the
// blocks a run of `low` tokens would have formed keep their representatives, later blocks go
// back to the remainder, the scores of the tokens cut off go, and the tokens that stay keep the
// attention the cut queries gave them.
// The backend computes in float: a block may differ only when its relevance is within 1e-4
// (relative) of the last chosen one, and such near-ties must stay rare.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "run_util.h"

namespace lc::test {
namespace {

using Key = std::tuple<int32_t, int32_t, int32_t>;  // seq_index, q_pos, k_pos

struct Config {
  int64_t sinks, local, block, reps, topk, chunk;
  bool qsum;
  std::string spec() const {
    return "infllm:sinks=" + std::to_string(sinks) + ",local=" + std::to_string(local) + ",block=" +
           std::to_string(block) + ",reps=" + std::to_string(reps) + ",topk=" + std::to_string(topk) +
           ",chunk=" + std::to_string(chunk) + (qsum ? ",repr=qsum" : "");
  }
};

// The definition above in double, fed the calls in order; each call's recorded selection is
// compared with what the oracle says every query reads.
class Oracle {
 public:
  Oracle(const Config& c, const RopeTable& rt, int64_t H, int64_t Hkv, int64_t d, int64_t T)
      : c_(c), rt_(rt), H_(H), Hkv_(Hkv), g_(H / Hkv), d_(d),
        score_(static_cast<size_t>(H), std::vector<double>(static_cast<size_t>(T), 0.0)) {}

  // Queries [t0, t0 + n) of s (the keys before t0 are s's too: a continuation shares them).
  void call(const Seq& s, int64_t t0, int64_t n, const Selection& sel) {
    for (int64_t s0 = 0; s0 < n; s0 += c_.chunk) sub_chunk(s, t0, s0, std::min(n, s0 + c_.chunk), sel);
  }

  // The scores of the tokens of the last ceil(local / block) + 1 memory blocks are kept; a cut
  // that puts older blocks back into the remainder finds their tokens' scores gone (0).
  void cut(int64_t low) {
    const int64_t formed = low - c_.local - c_.sinks > 0 ? (low - c_.local - c_.sinks) / c_.block : 0;
    const int64_t had = static_cast<int64_t>(rep_.size());
    const int64_t kept_from = c_.sinks + std::max<int64_t>(0, had - ((c_.local + c_.block - 1) / c_.block + 1)) * c_.block;
    if (had > formed) rep_.resize(static_cast<size_t>(formed));
    const int64_t back = c_.sinks + std::min(formed, had) * c_.block;  // the remainder's first token now
    for (auto& sc : score_) {
      std::fill(sc.begin() + low, sc.end(), 0.0);
      if (back < kept_from) std::fill(sc.begin() + back, sc.begin() + kept_from, 0.0);
    }
  }

  int64_t checked = 0, near = 0, chose = 0;

 private:
  double dot(const std::vector<double>& a, const std::vector<double>& b) const {
    double v = 0;
    for (int64_t x = 0; x < d_; ++x) v += a[static_cast<size_t>(x)] * b[static_cast<size_t>(x)];
    return v;
  }
  std::vector<double> key(const Seq& s, int64_t j, int64_t hk, int32_t p) const { return rotate(s.kt(j, hk), d_, rt_, p); }

  // Block m's representative key of every query head, from s's keys.
  void form(const Seq& s, int64_t m) {
    const int64_t first = c_.sinks + m * c_.block;
    std::vector<std::vector<double>> per_head(static_cast<size_t>(H_));
    for (int64_t h = 0; h < H_; ++h) {
      const int64_t hk = h / g_;
      std::vector<std::pair<double, int64_t>> sc;
      for (int64_t j = first; j < first + c_.block; ++j) {
        double v = 0;
        if (c_.qsum) {
          for (int64_t t = first; t < first + c_.block; ++t)
            for (int64_t hh = hk * g_; hh < (hk + 1) * g_; ++hh)
              for (int64_t x = 0; x < d_; ++x) v += static_cast<double>(s.qt(t, hh)[x]) * s.kt(j, hk)[x];
        } else {
          v = score_[static_cast<size_t>(h)][static_cast<size_t>(j)];
        }
        sc.push_back({v, j});
      }
      std::stable_sort(sc.begin(), sc.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      std::vector<double> rp(static_cast<size_t>(d_), 0.0);
      for (int64_t i = 0; i < std::min(c_.reps, c_.block); ++i) {
        const auto k0 = key(s, sc[static_cast<size_t>(i)].second, hk, 0);
        for (int64_t x = 0; x < d_; ++x) rp[static_cast<size_t>(x)] += k0[static_cast<size_t>(x)];
      }
      per_head[static_cast<size_t>(h)] = rp;
    }
    rep_.push_back(per_head);
  }

  void sub_chunk(const Seq& s, int64_t t0, int64_t s0, int64_t s1, const Selection& sel) {
    const std::string spec = c_.spec();
    const int64_t P = t0 + s0;
    const int64_t n_mem = P - c_.local - c_.sinks > 0 ? (P - c_.local - c_.sinks) / c_.block : 0;
    while (static_cast<int64_t>(rep_.size()) < n_mem) form(s, static_cast<int64_t>(rep_.size()));
    std::vector<int32_t> chosen(static_cast<size_t>(n_mem));
    std::iota(chosen.begin(), chosen.end(), 0);
    std::vector<double> rel(static_cast<size_t>(n_mem), 0.0);
    double thr = -INFINITY;
    if (n_mem > c_.topk) {
      for (int64_t h = 0; h < H_; ++h) {
        std::vector<float> qs(static_cast<size_t>(d_), 0.0f);
        std::vector<double> qd(static_cast<size_t>(d_), 0.0);
        for (int64_t t = t0 + s0; t < t0 + s1; ++t)
          for (int64_t x = 0; x < d_; ++x) qd[static_cast<size_t>(x)] += s.qt(t, h)[x];
        for (int64_t x = 0; x < d_; ++x) qs[static_cast<size_t>(x)] = static_cast<float>(qd[static_cast<size_t>(x)]);
        const auto qrot = rotate(qs.data(), d_, rt_, static_cast<int32_t>(c_.local));
        for (int64_t m = 0; m < n_mem; ++m)
          rel[static_cast<size_t>(m)] += dot(qrot, rep_[static_cast<size_t>(m)][static_cast<size_t>(h)]);
      }
      std::stable_sort(chosen.begin(), chosen.end(), [&](int32_t a, int32_t b) {
        return rel[static_cast<size_t>(a)] > rel[static_cast<size_t>(b)];
      });
      chosen.resize(static_cast<size_t>(c_.topk));
      thr = INFINITY;
      for (int32_t m : chosen) thr = std::min(thr, rel[static_cast<size_t>(m)]);
      std::sort(chosen.begin(), chosen.end());
      ++chose;
    }
    const int64_t mem_end = c_.sinks + n_mem * c_.block;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_));
    for (int64_t tt = s0; tt < s1; ++tt) {
      const int64_t t = t0 + tt, vis = t + 1, U = vis - c_.local;
      std::set<Key> want;
      for (int64_t j = std::max<int64_t>(0, U); j < vis; ++j)
        want.insert({static_cast<int32_t>(j), static_cast<int32_t>(t), static_cast<int32_t>(j)});
      auto global = [&](int64_t a, int64_t b) {
        for (int64_t j = a; j < std::min(b, U); ++j) want.insert({static_cast<int32_t>(j), static_cast<int32_t>(c_.local), 0});
      };
      global(0, c_.sinks);
      for (int32_t m : chosen) global(c_.sinks + m * c_.block, c_.sinks + (m + 1) * c_.block);
      global(mem_end, U);
      for (int64_t h = 0; h < H_; ++h) {
        const int64_t hk = h / g_;
        if (!c_.qsum) {
          // This query's softmax over what it reads; its local keys' probabilities score them.
          const auto qr = rotate(s.qt(t, h), d_, rt_, static_cast<int32_t>(t));
          const auto ql = rotate(s.qt(t, h), d_, rt_, static_cast<int32_t>(c_.local));
          std::vector<double> lg;
          double mx = -INFINITY;
          for (const Key& k : want) {
            const bool local = std::get<1>(k) == t;
            lg.push_back(scale * dot(local ? qr : ql, key(s, std::get<0>(k), hk, std::get<2>(k))));
            mx = std::max(mx, lg.back());
          }
          double sum = 0;
          for (double x : lg) sum += std::exp(x - mx);
          size_t i = 0;
          for (const Key& k : want) {
            const int64_t j = std::get<0>(k);
            if (std::get<1>(k) == t && j >= c_.sinks)
              score_[static_cast<size_t>(h)][static_cast<size_t>(j)] += std::exp(lg[i] - mx) / sum;
            ++i;
          }
        }
        std::set<Key> got;
        for (const auto& k : sel.keys[static_cast<size_t>(tt * H_ + h)]) got.insert({k.seq_index, k.q_pos, k.k_pos});
        ++checked;
        if (got == want) continue;
        ++near;
        std::vector<Key> diff;
        std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
        EXPECT_EQ(got.size(), want.size()) << spec << " token " << t << " head " << h;
        for (const Key& k : diff) {
          const int64_t j = std::get<0>(k), m = (j - c_.sinks) / c_.block;
          ASSERT_TRUE(j >= c_.sinks && j < mem_end && std::get<1>(k) == c_.local)
              << spec << " token " << t << " head " << h << ": key " << j << " q_pos " << std::get<1>(k);
          EXPECT_LE(std::fabs(rel[static_cast<size_t>(m)] - thr), 1e-4 * std::fabs(thr))
              << spec << " token " << t << " head " << h << ": block " << m;
        }
      }
    }
  }

  Config c_;
  const RopeTable& rt_;
  int64_t H_, Hkv_, g_, d_;
  std::vector<std::vector<double>> score_;          // [query head][token]
  std::vector<std::vector<std::vector<double>>> rep_;  // [block][query head] -> key sum
};

TEST(InfLlmSelection, EveryQueryReadsTheOraclesKeys) {
  struct Case {
    int64_t H, Hkv, T;
    Config c;
    std::vector<int64_t> chunks;
  };
  const Case cases[] = {
      {4, 2, 700, {16, 64, 32, 4, 3, 50, false}, {100, 1}},
      {8, 2, 600, {8, 96, 16, 2, 4, 32, false}, {64, 7}},
      {2, 2, 500, {0, 48, 24, 3, 2, 1000, false}, {200, 1, 1}},
      {4, 2, 700, {16, 64, 32, 4, 3, 50, true}, {100, 1}},
  };
  uint32_t seed = 300;
  int64_t checked = 0, near = 0, chose = 0;
  for (const auto& cs : cases) {
    Seq s(cs.T, cs.H, cs.Hkv, 64, 64, seed++, 1.0f);
    const RopeTable rt = test_rope(64, seed % 2 == 0);
    const auto r = run_seq(s, cs.c.spec(), kv_config(s, 16, rt), cs.chunks, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << cs.c.spec();
    Oracle o(cs.c, rt, s.H, s.Hkv, s.d, s.T);
    for (size_t c = 0; c < r.sel.size(); ++c) o.call(s, r.chunk_t0[c], r.sel[c].n, r.sel[c]);
    checked += o.checked, near += o.near, chose += o.chose;
  }
  EXPECT_GT(checked, 5000);
  EXPECT_GT(chose, 20);
  EXPECT_LE(near * 100, checked) << near << " near-ties of " << checked;
}

// A run of A (600 tokens in calls of 50 and 1) cut back to `low` and continued with B (A's
// tokens up to `low`, other tokens after, to 760): what the queries read, before and after the
// cut, follows the rule above. Cuts inside the remainder (580), into memory blocks that go back
// to it with their scores (500) and deeper, where older scores are gone (430).
TEST(InfLlmSelection, AfterACutTheQueriesReadTheOraclesKeys) {
  const Config c{8, 64, 32, 4, 2, 50, false};
  int64_t checked = 0, near = 0, chose = 0;
  for (const int64_t low : {int64_t{580}, int64_t{500}, int64_t{430}}) {
    const Seq a(760, 4, 2, 64, 64, 71, 1.0f), other(760, 4, 2, 64, 64, 72, 1.0f);
    Seq b = a;
    std::copy(other.q.begin() + low * a.H * a.d, other.q.end(), b.q.begin() + low * a.H * a.d);
    std::copy(other.k.begin() + low * a.Hkv * a.d, other.k.end(), b.k.begin() + low * a.Hkv * a.d);
    std::copy(other.v.begin() + low * a.Hkv * a.dv, other.v.end(), b.v.begin() + low * a.Hkv * a.dv);
    const RopeTable rt = test_rope(64, true);
    auto kv = KvCache::create(kv_config(a, 16, rt));
    ASSERT_TRUE(kv.has_value());
    auto be = make_attention_backend(c.spec(), shape_of(a));
    ASSERT_TRUE(be.has_value());
    ASSERT_TRUE((*be)->attach(**kv).is_ok());
    (*be)->record_selection(true);
    Oracle o(c, rt, a.H, a.Hkv, a.d, a.T);
    std::vector<float> tmp;
    auto step = [&](const Seq& s, int64_t t0, int64_t n) {
      tmp.assign(static_cast<size_t>(n * s.H * s.dv), 0.0f);
      ASSERT_TRUE((*kv)->append(0, n, s.k.data() + t0 * s.Hkv * s.d, s.v.data() + t0 * s.Hkv * s.dv, s.pos.data() + t0).is_ok());
      ASSERT_TRUE((*be)->forward(0, n, s.q.data() + t0 * s.H * s.d, s.pos.data() + t0, **kv, tmp.data(), test_pool()).is_ok());
      o.call(s, t0, n, (*be)->selection());
    };
    for (int64_t t0 = 0, i = 0; t0 < 600; ++i) {
      const int64_t n = std::min<int64_t>(i % 2 ? 1 : 50, 600 - t0);
      step(a, t0, n);
      t0 += n;
    }
    (*kv)->truncate(low);
    o.cut(low);
    for (int64_t t0 = low; t0 < b.T; t0 += 50) step(b, t0, std::min<int64_t>(50, b.T - t0));
    checked += o.checked, near += o.near, chose += o.chose;
  }
  EXPECT_GT(chose, 30);
  EXPECT_LE(near * 100, checked) << near << " near-ties of " << checked;
}

}  // namespace
}  // namespace lc::test
