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

TEST(InfLlmSelection, EveryQueryReadsTheOraclesKeys) {
  struct Case {
    int64_t H, Hkv, sinks, local, block, reps, topk, chunk, T;
    std::vector<int64_t> chunks;
    bool qsum;
  };
  const Case cases[] = {
      {4, 2, 16, 64, 32, 4, 3, 50, 700, {100, 1}, false},
      {8, 2, 8, 96, 16, 2, 4, 32, 600, {64, 7}, false},
      {2, 2, 0, 48, 24, 3, 2, 1000, 500, {200, 1, 1}, false},
      {4, 2, 16, 64, 32, 4, 3, 50, 700, {100, 1}, true},
  };
  uint32_t seed = 300;
  int64_t checked = 0, near = 0, chose = 0;
  for (const auto& cs : cases) {
    Seq s(cs.T, cs.H, cs.Hkv, 64, 64, seed++, 1.0f);
    const RopeTable rt = test_rope(64, seed % 2 == 0);
    const std::string spec = "infllm:sinks=" + std::to_string(cs.sinks) + ",local=" + std::to_string(cs.local) +
                             ",block=" + std::to_string(cs.block) + ",reps=" + std::to_string(cs.reps) +
                             ",topk=" + std::to_string(cs.topk) + ",chunk=" + std::to_string(cs.chunk) +
                             (cs.qsum ? ",repr=qsum" : "");
    const auto r = run_seq(s, spec, kv_config(s, 16, rt), cs.chunks, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << spec;
    const int64_t g = s.H / s.Hkv, d = s.d, T = s.T;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    auto dot = [&](const std::vector<double>& a, const std::vector<double>& b) {
      double v = 0;
      for (int64_t x = 0; x < d; ++x) v += a[static_cast<size_t>(x)] * b[static_cast<size_t>(x)];
      return v;
    };
    // Keys at their positions and at 0, queries at theirs and at the fixed distance.
    std::vector<std::vector<double>> kr(static_cast<size_t>(T * s.Hkv)), k0(kr.size());
    std::vector<std::vector<double>> qr(static_cast<size_t>(T * s.H)), ql(qr.size());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t hk = 0; hk < s.Hkv; ++hk) {
        kr[static_cast<size_t>(t * s.Hkv + hk)] = rotate(s.kt(t, hk), d, rt, static_cast<int32_t>(t));
        k0[static_cast<size_t>(t * s.Hkv + hk)] = rotate(s.kt(t, hk), d, rt, 0);
      }
      for (int64_t h = 0; h < s.H; ++h) {
        qr[static_cast<size_t>(t * s.H + h)] = rotate(s.qt(t, h), d, rt, static_cast<int32_t>(t));
        ql[static_cast<size_t>(t * s.H + h)] = rotate(s.qt(t, h), d, rt, static_cast<int32_t>(cs.local));
      }
    }
    // score[h][j]: the attention token j received from head h's queries (repr=attention).
    std::vector<std::vector<double>> score(static_cast<size_t>(s.H), std::vector<double>(static_cast<size_t>(T), 0.0));
    std::vector<std::vector<std::vector<double>>> rep;  // [block][query head] -> key sum
    auto form = [&](int64_t m) {
      const int64_t first = cs.sinks + m * cs.block;
      std::vector<std::vector<double>> per_head(static_cast<size_t>(s.H));
      for (int64_t h = 0; h < s.H; ++h) {
        const int64_t hk = h / g;
        std::vector<std::pair<double, int64_t>> sc;
        for (int64_t j = first; j < first + cs.block; ++j) {
          double v = 0;
          if (cs.qsum) {
            for (int64_t t = first; t < first + cs.block; ++t)
              for (int64_t hh = hk * g; hh < (hk + 1) * g; ++hh)
                for (int64_t x = 0; x < d; ++x) v += static_cast<double>(s.qt(t, hh)[x]) * s.kt(j, hk)[x];
          } else {
            v = score[static_cast<size_t>(h)][static_cast<size_t>(j)];
          }
          sc.push_back({v, j});
        }
        std::stable_sort(sc.begin(), sc.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        std::vector<double> rp(static_cast<size_t>(d), 0.0);
        for (int64_t i = 0; i < std::min(cs.reps, cs.block); ++i)
          for (int64_t x = 0; x < d; ++x)
            rp[static_cast<size_t>(x)] += k0[static_cast<size_t>(sc[static_cast<size_t>(i)].second * s.Hkv + hk)][static_cast<size_t>(x)];
        per_head[static_cast<size_t>(h)] = rp;
      }
      rep.push_back(per_head);
    };
    for (size_t c = 0; c < r.sel.size(); ++c) {
      const int64_t t0 = r.chunk_t0[c], n = r.sel[c].n;
      for (int64_t s0 = 0; s0 < n; s0 += cs.chunk) {
        const int64_t s1 = std::min(n, s0 + cs.chunk), P = t0 + s0;
        const int64_t n_mem = P - cs.local - cs.sinks > 0 ? (P - cs.local - cs.sinks) / cs.block : 0;
        while (static_cast<int64_t>(rep.size()) < n_mem) form(static_cast<int64_t>(rep.size()));
        std::vector<int32_t> chosen(static_cast<size_t>(n_mem));
        std::iota(chosen.begin(), chosen.end(), 0);
        std::vector<double> rel(static_cast<size_t>(n_mem), 0.0);
        double thr = -INFINITY;
        if (n_mem > cs.topk) {
          for (int64_t h = 0; h < s.H; ++h) {
            std::vector<float> qs(static_cast<size_t>(d), 0.0f);
            std::vector<double> qd(static_cast<size_t>(d), 0.0);
            for (int64_t t = t0 + s0; t < t0 + s1; ++t)
              for (int64_t x = 0; x < d; ++x) qd[static_cast<size_t>(x)] += s.qt(t, h)[x];
            for (int64_t x = 0; x < d; ++x) qs[static_cast<size_t>(x)] = static_cast<float>(qd[static_cast<size_t>(x)]);
            const auto qrot = rotate(qs.data(), d, rt, static_cast<int32_t>(cs.local));
            for (int64_t m = 0; m < n_mem; ++m)
              rel[static_cast<size_t>(m)] += dot(qrot, rep[static_cast<size_t>(m)][static_cast<size_t>(h)]);
          }
          std::stable_sort(chosen.begin(), chosen.end(), [&](int32_t a, int32_t b) {
            return rel[static_cast<size_t>(a)] > rel[static_cast<size_t>(b)];
          });
          chosen.resize(static_cast<size_t>(cs.topk));
          thr = INFINITY;
          for (int32_t m : chosen) thr = std::min(thr, rel[static_cast<size_t>(m)]);
          std::sort(chosen.begin(), chosen.end());
          ++chose;
        }
        const int64_t mem_end = cs.sinks + n_mem * cs.block;
        for (int64_t tt = s0; tt < s1; ++tt) {
          const int64_t t = t0 + tt, vis = t + 1, U = vis - cs.local;
          std::set<Key> want;
          for (int64_t j = std::max<int64_t>(0, U); j < vis; ++j)
            want.insert({static_cast<int32_t>(j), static_cast<int32_t>(t), static_cast<int32_t>(j)});
          auto global = [&](int64_t a, int64_t b) {
            for (int64_t j = a; j < std::min(b, U); ++j)
              want.insert({static_cast<int32_t>(j), static_cast<int32_t>(cs.local), 0});
          };
          global(0, cs.sinks);
          for (int32_t m : chosen) global(cs.sinks + m * cs.block, cs.sinks + (m + 1) * cs.block);
          global(mem_end, U);
          for (int64_t h = 0; h < s.H; ++h) {
            const int64_t hk = h / g;
            if (!cs.qsum) {
              // This query's softmax over what it reads; its local keys' probabilities score them.
              std::vector<double> lg;
              double mx = -INFINITY;
              for (const Key& k : want) {
                const int64_t j = std::get<0>(k);
                const bool local = std::get<1>(k) == t;
                const auto& qv = local ? qr[static_cast<size_t>(t * s.H + h)] : ql[static_cast<size_t>(t * s.H + h)];
                const auto& kv = local ? kr[static_cast<size_t>(j * s.Hkv + hk)] : k0[static_cast<size_t>(j * s.Hkv + hk)];
                lg.push_back(scale * dot(qv, kv));
                mx = std::max(mx, lg.back());
              }
              double sum = 0;
              for (double x : lg) sum += std::exp(x - mx);
              size_t i = 0;
              for (const Key& k : want) {
                const int64_t j = std::get<0>(k);
                if (std::get<1>(k) == t && j >= cs.sinks)
                  score[static_cast<size_t>(h)][static_cast<size_t>(j)] += std::exp(lg[i] - mx) / sum;
                ++i;
              }
            }
            std::set<Key> got;
            for (const auto& k : r.sel[c].keys[static_cast<size_t>(tt * s.H + h)]) got.insert({k.seq_index, k.q_pos, k.k_pos});
            ++checked;
            if (got == want) continue;
            ++near;
            std::vector<Key> diff;
            std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
            EXPECT_EQ(got.size(), want.size()) << spec << " token " << t << " head " << h;
            for (const Key& k : diff) {
              const int64_t j = std::get<0>(k), m = (j - cs.sinks) / cs.block;
              ASSERT_TRUE(j >= cs.sinks && j < mem_end && std::get<1>(k) == cs.local)
                  << spec << " token " << t << " head " << h << ": key " << j << " q_pos " << std::get<1>(k);
              EXPECT_LE(std::fabs(rel[static_cast<size_t>(m)] - thr), 1e-4 * std::fabs(thr))
                  << spec << " token " << t << " head " << h << ": block " << m;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 5000);
  EXPECT_GT(chose, 20);
  EXPECT_LE(near * 100, checked) << near << " near-ties of " << checked;
}

}  // namespace
}  // namespace lc::test
