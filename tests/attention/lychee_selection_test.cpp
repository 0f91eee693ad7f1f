// `lychee` with share=layer: the blocks its sparse heads attend, checked token by token against
// an independent oracle of the method's definition (src/attention/lychee.cpp's header) in
// double precision:
//   - w(b) = sum over the layer's retrieval heads r of sum_{j in block b} softmax_j(q_r . k_j /
//     sqrt(d)) over every key the token sees (q and k rotated at their positions, oracle.h);
//   - candidates: the blocks from the initial ones (sinks rounded up to blocks) up to the local
//     window, which starts at max(initial end, floor((L - local) / block) * block) for a token
//     that sees L keys;
//   - the budget / block candidates of largest w (ties: the lower block), or all of them when
//     there are no more, or when L <= budget (dense);
//   - a sparse head attends the initial tokens, the chosen blocks and the window; a retrieval
//     head attends every key.
// The backend sums its masses in float: a block may differ only when its w is within 1e-5
// (relative) of the last chosen one, and such near-ties must stay rare.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "run_util.h"

namespace lc::test {
namespace {

TEST(LycheeSelection, SparseHeadsAttendTheOraclesBlocks) {
  struct Case {
    int64_t H, Hkv, n_ret, budget, block, sinks, local, T;
    std::vector<int64_t> chunks;
  };
  const Case cases[] = {
      {8, 2, 2, 128, 32, 32, 64, 600, {100, 1}},
      {4, 4, 1, 96, 16, 20, 40, 400, {37}},
      {6, 2, 3, 256, 64, 0, 100, 700, {300, 1}},
  };
  uint32_t seed = 70;
  int64_t checked = 0, near = 0, sparse_rows = 0;
  for (const auto& cs : cases) {
    Seq s(cs.T, cs.H, cs.Hkv, 64, 64, seed++, 1.0f);
    const RopeTable rt = test_rope(64, seed % 2 == 0);
    const std::string spec = "lychee:budget=" + std::to_string(cs.budget) + ",block=" + std::to_string(cs.block) +
                             ",sinks=" + std::to_string(cs.sinks) + ",local=" + std::to_string(cs.local) +
                             ",retrieval=" + std::to_string(cs.n_ret);
    const auto r = run_seq(s, spec, kv_config(s, 16, rt), cs.chunks, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << spec;
    const int64_t g = s.H / s.Hkv, init_end = (cs.sinks + cs.block - 1) / cs.block * cs.block;
    const int64_t k_blocks = std::max<int64_t>(1, cs.budget / cs.block);
    const double scale = 1.0 / std::sqrt(64.0);
    // Keys rotated at their positions, per KV head, in double.
    std::vector<std::vector<std::vector<double>>> kr(static_cast<size_t>(s.Hkv));
    for (int64_t hk = 0; hk < s.Hkv; ++hk)
      for (int64_t j = 0; j < s.T; ++j) kr[static_cast<size_t>(hk)].push_back(rotate(s.kt(j, hk), s.d, rt, static_cast<int32_t>(j)));
    for (size_t c = 0; c < r.sel.size(); ++c)
      for (int64_t tt = 0; tt < r.sel[c].n; ++tt) {
        const int64_t t = r.chunk_t0[c] + tt, L = t + 1;
        const int64_t nb = (L + cs.block - 1) / cs.block;
        std::vector<double> w(static_cast<size_t>(nb), 0.0);
        for (int64_t h = 0; h < cs.n_ret; ++h) {
          const auto q = rotate(s.qt(t, h), s.d, rt, static_cast<int32_t>(t));
          std::vector<double> a(static_cast<size_t>(L));
          double mx = -INFINITY, sum = 0;
          for (int64_t j = 0; j < L; ++j) {
            double v = 0;
            for (int64_t x = 0; x < s.d; ++x) v += q[static_cast<size_t>(x)] * kr[static_cast<size_t>(h / g)][static_cast<size_t>(j)][static_cast<size_t>(x)];
            a[static_cast<size_t>(j)] = v * scale;
            mx = std::max(mx, a[static_cast<size_t>(j)]);
          }
          for (auto& v : a) sum += (v = std::exp(v - mx));
          for (int64_t j = 0; j < L; ++j) w[static_cast<size_t>(j / cs.block)] += a[static_cast<size_t>(j)] / sum;
        }
        const int64_t lb = std::max(init_end, (L - cs.local) / cs.block * cs.block);
        const int64_t b0 = init_end / cs.block, b1 = lb / cs.block;
        std::vector<int32_t> cand;
        for (int64_t b = b0; b < b1; ++b) cand.push_back(static_cast<int32_t>(b));
        double thr = -INFINITY;
        const bool dense = L <= cs.budget;
        if (!dense && static_cast<int64_t>(cand.size()) > k_blocks) {
          std::stable_sort(cand.begin(), cand.end(), [&](int32_t x, int32_t y) {
            return w[static_cast<size_t>(x)] > w[static_cast<size_t>(y)];
          });
          cand.resize(static_cast<size_t>(k_blocks));
          thr = INFINITY;
          for (int32_t b : cand) thr = std::min(thr, w[static_cast<size_t>(b)]);
        }
        std::set<int32_t> want;
        if (dense) {
          for (int64_t j = 0; j < L; ++j) want.insert(static_cast<int32_t>(j));
        } else {
          for (int64_t j = 0; j < std::min(init_end, L); ++j) want.insert(static_cast<int32_t>(j));
          for (int32_t b : cand)
            for (int64_t j = b * cs.block; j < (b + 1) * cs.block; ++j) want.insert(static_cast<int32_t>(j));
          for (int64_t j = std::min(lb, L); j < L; ++j) want.insert(static_cast<int32_t>(j));
        }
        for (int64_t h = cs.n_ret; h < s.H; ++h) {
          std::set<int32_t> got;
          for (const auto& k : r.sel[c].keys[static_cast<size_t>(tt * s.H + h)]) got.insert(k.seq_index);
          ++checked;
          sparse_rows += static_cast<int64_t>(got.size()) < L;
          if (got == want) continue;
          ++near;
          std::vector<int32_t> diff;
          std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
          EXPECT_EQ(got.size(), want.size()) << spec << " token " << t << " head " << h;
          for (int32_t j : diff)
            EXPECT_LE(std::fabs(w[static_cast<size_t>(j / cs.block)] - thr), 1e-5 * thr)
                << spec << " token " << t << " head " << h << ": block " << j / cs.block;
        }
        for (int64_t h = 0; h < cs.n_ret; ++h)
          EXPECT_EQ(static_cast<int64_t>(r.sel[c].keys[static_cast<size_t>(tt * s.H + h)].size()), L)
              << spec << ": retrieval head " << h << " reads every key";
      }
  }
  EXPECT_GT(checked, 3000);
  EXPECT_GT(sparse_rows * 2, checked);
  EXPECT_LE(near * 200, checked) << near << " near-ties of " << checked;
}

}  // namespace
}  // namespace lc::test
