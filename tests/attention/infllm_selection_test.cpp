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
//   - rep(m) of a KV head (the project's stand-in for InfLLM's attention-score choice): the sum
//     of the `reps` keys of the block, un-rotated, with the largest dot product with the sum of
//     the block's own tokens' queries of the group (ties: the lower token).
// The backend computes relevance in float: a block may differ only when its relevance is
// within 1e-4 (relative) of the last chosen one, and such near-ties must stay rare.
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
  };
  const Case cases[] = {
      {4, 2, 16, 64, 32, 4, 3, 50, 700, {100, 1}},
      {8, 2, 8, 96, 16, 2, 4, 32, 600, {64, 7}},
      {2, 2, 0, 48, 24, 3, 2, 1000, 500, {200, 1, 1}},
  };
  uint32_t seed = 300;
  int64_t checked = 0, near = 0, chose = 0;
  for (const auto& cs : cases) {
    Seq s(cs.T, cs.H, cs.Hkv, 64, 64, seed++, 1.0f);
    const RopeTable rt = test_rope(64, seed % 2 == 0);
    const std::string spec = "infllm:sinks=" + std::to_string(cs.sinks) + ",local=" + std::to_string(cs.local) +
                             ",block=" + std::to_string(cs.block) + ",reps=" + std::to_string(cs.reps) +
                             ",topk=" + std::to_string(cs.topk) + ",chunk=" + std::to_string(cs.chunk);
    const auto r = run_seq(s, spec, kv_config(s, 16, rt), cs.chunks, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << spec;
    const int64_t g = s.H / s.Hkv, d = s.d;
    // rep(m) per KV head, in double, from the test's own (pre-RoPE) data.
    const int64_t n_blocks = cs.sinks < s.T ? (s.T - cs.sinks) / cs.block : 0;
    std::vector<std::vector<std::vector<double>>> rep(static_cast<size_t>(s.Hkv));
    for (int64_t hk = 0; hk < s.Hkv; ++hk)
      for (int64_t m = 0; m < n_blocks; ++m) {
        const int64_t first = cs.sinks + m * cs.block;
        std::vector<double> qsum(static_cast<size_t>(d), 0.0);
        for (int64_t j = first; j < first + cs.block; ++j)
          for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
            for (int64_t x = 0; x < d; ++x) qsum[static_cast<size_t>(x)] += s.qt(j, h)[x];
        std::vector<std::pair<double, int64_t>> sc;
        for (int64_t j = first; j < first + cs.block; ++j) {
          double v = 0;
          for (int64_t x = 0; x < d; ++x) v += s.kt(j, hk)[x] * qsum[static_cast<size_t>(x)];
          sc.push_back({v, j});
        }
        std::stable_sort(sc.begin(), sc.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        std::vector<double> rp(static_cast<size_t>(d), 0.0);
        for (int64_t i = 0; i < std::min(cs.reps, cs.block); ++i)
          for (int64_t x = 0; x < d; ++x) rp[static_cast<size_t>(x)] += s.kt(sc[static_cast<size_t>(i)].second, hk)[x];
        rep[static_cast<size_t>(hk)].push_back(rp);
      }
    for (size_t c = 0; c < r.sel.size(); ++c) {
      const int64_t t0 = r.chunk_t0[c], n = r.sel[c].n;
      for (int64_t s0 = 0; s0 < n; s0 += cs.chunk) {
        const int64_t s1 = std::min(n, s0 + cs.chunk), P = t0 + s0;
        const int64_t n_mem = P - cs.local - cs.sinks > 0 ? (P - cs.local - cs.sinks) / cs.block : 0;
        std::vector<int32_t> chosen(static_cast<size_t>(n_mem));
        std::iota(chosen.begin(), chosen.end(), 0);
        std::vector<double> rel(static_cast<size_t>(n_mem), 0.0);
        double thr = -INFINITY;
        if (n_mem > cs.topk) {
          for (int64_t hk = 0; hk < s.Hkv; ++hk) {
            std::vector<float> qs(static_cast<size_t>(d), 0.0f);
            std::vector<double> qd(static_cast<size_t>(d), 0.0);
            for (int64_t t = t0 + s0; t < t0 + s1; ++t)
              for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
                for (int64_t x = 0; x < d; ++x) qd[static_cast<size_t>(x)] += s.qt(t, h)[x];
            for (int64_t x = 0; x < d; ++x) qs[static_cast<size_t>(x)] = static_cast<float>(qd[static_cast<size_t>(x)]);
            const auto qr = rotate(qs.data(), d, rt, static_cast<int32_t>(cs.local));
            for (int64_t m = 0; m < n_mem; ++m)
              for (int64_t x = 0; x < d; ++x)
                rel[static_cast<size_t>(m)] += qr[static_cast<size_t>(x)] * rep[static_cast<size_t>(hk)][static_cast<size_t>(m)][static_cast<size_t>(x)];
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
