// `vslash`: what every query reads, checked against an independent oracle in double precision,
// written from SpecKV's code (speckv/util.py compress_kv, llama_util.py) and MInference's index
// conversion (convert_vertical_slash_indexes):
//   - a call holding the whole sequence of N > vertical + slash tokens is sparse, any other call
//     dense;
//   - per KV head, the vertical tokens: the window is the call's last `obs` queries; each window
//     query's softmax over keys 0..itself (rope at the real positions, 1/sqrt(d)); for the tokens
//     before the window, the max (or mean) of those probabilities over the group's query heads and
//     the window's queries; pooled along the sequence (max, or avg with zeros counted, over
//     kernel tokens centred on each); the `vertical` highest, ties to the lower token;
//   - query t (its 64-token block ends at e = 64 (floor(t / 64) + 1)) reads the keys from
//     max(0, e - 64 - slash) to itself, and the vertical tokens before that.
// The backend scores in float: a vertical token may differ only where its pooled score is
// within 1e-5 (relative) of the last one chosen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "run_util.h"

namespace lc::test {
namespace {

struct VsConfig {
  int64_t vertical, slash, obs, kernel;
  bool max_pool, max_reduce;
  std::string spec() const {
    return "vslash:vertical=" + std::to_string(vertical) + ",slash=" + std::to_string(slash) +
           ",obs=" + std::to_string(obs) + ",kernel=" + std::to_string(kernel) + ",pool=" + (max_pool ? "max" : "avg") +
           ",reduce=" + (max_reduce ? "max" : "mean");
  }
};

// Pooled scores of the tokens before the window of KV head hk, in double.
std::vector<double> pooled_scores(const Seq& s, const RopeTable& rt, const VsConfig& c, int64_t hk) {
  const int64_t n = s.T, W = std::min(c.obs, n), n_pre = n - W, g = s.H / s.Hkv, d = s.d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<std::vector<double>> kr(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) kr[static_cast<size_t>(j)] = rotate(s.kt(j, hk), d, rt, static_cast<int32_t>(j));
  std::vector<double> agg(static_cast<size_t>(n_pre), 0.0);
  for (int64_t t = n_pre; t < n; ++t)
    for (int64_t h = hk * g; h < (hk + 1) * g; ++h) {
      const auto qr = rotate(s.qt(t, h), d, rt, static_cast<int32_t>(t));
      std::vector<double> lg(static_cast<size_t>(t + 1));
      double mx = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        double v = 0;
        for (int64_t x = 0; x < d; ++x) v += qr[static_cast<size_t>(x)] * kr[static_cast<size_t>(j)][static_cast<size_t>(x)];
        lg[static_cast<size_t>(j)] = v * scale;
        mx = std::max(mx, lg[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double x : lg) sum += std::exp(x - mx);
      for (int64_t j = 0; j < n_pre; ++j) {
        const double p = std::exp(lg[static_cast<size_t>(j)] - mx) / sum;
        agg[static_cast<size_t>(j)] = c.max_reduce ? std::max(agg[static_cast<size_t>(j)], p) : agg[static_cast<size_t>(j)] + p;
      }
    }
  if (!c.max_reduce)
    for (double& a : agg) a /= static_cast<double>(g * W);
  std::vector<double> pooled(static_cast<size_t>(n_pre));
  for (int64_t j = 0; j < n_pre; ++j) {
    double acc = c.max_pool ? -INFINITY : 0.0;
    for (int64_t i = j - c.kernel / 2; i <= j + c.kernel / 2; ++i) {
      const double v = i >= 0 && i < n_pre ? agg[static_cast<size_t>(i)] : (c.max_pool ? -INFINITY : 0.0);
      acc = c.max_pool ? std::max(acc, v) : acc + v;
    }
    pooled[static_cast<size_t>(j)] = c.max_pool ? acc : acc / static_cast<double>(c.kernel);
  }
  return pooled;
}

TEST(Vslash, EveryQueryReadsItsBandAndTheOraclesVerticalTokens) {
  const VsConfig configs[] = {
      {48, 128, 16, 7, true, true},
      {80, 64, 24, 5, false, false},
      {32, 192, 8, 3, true, false},
  };
  uint32_t seed = 500;
  int64_t checked = 0, near = 0;
  for (const VsConfig& c : configs) {
    Seq s(700, 4, 2, 64, 64, seed++, 1.0f);
    const RopeTable rt = test_rope(64, seed % 2 == 0);
    const auto r = run_seq(s, c.spec(), kv_config(s, 16, rt), {700}, true);
    ASSERT_EQ(r.sel.size(), 1u);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << c.spec();
    const int64_t g = s.H / s.Hkv, n_pre = s.T - std::min(c.obs, s.T);
    for (int64_t hk = 0; hk < s.Hkv; ++hk) {
      const std::vector<double> sc = pooled_scores(s, rt, c, hk);
      std::vector<int64_t> order(static_cast<size_t>(n_pre));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sc[static_cast<size_t>(a)] > sc[static_cast<size_t>(b)]; });
      const int64_t k = std::min(c.vertical, n_pre);
      const double thr = sc[static_cast<size_t>(order[static_cast<size_t>(k - 1)])];
      const std::set<int64_t> vert(order.begin(), order.begin() + k);
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t e = (t / 64 + 1) * 64, band = std::max<int64_t>(0, e - 64 - c.slash);
        std::set<int64_t> want;
        for (int64_t j = band; j <= t; ++j) want.insert(j);
        for (int64_t v : vert)
          if (v < band) want.insert(v);
        for (int64_t h = hk * g; h < (hk + 1) * g; ++h) {
          std::set<int64_t> got;
          for (const auto& key : r.sel[0].keys[static_cast<size_t>(t * s.H + h)]) {
            got.insert(key.seq_index);
            EXPECT_EQ(key.q_pos, t);
            EXPECT_EQ(key.k_pos, key.seq_index);
          }
          ++checked;
          if (got == want) continue;
          ++near;
          std::vector<int64_t> diff;
          std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
          EXPECT_EQ(got.size(), want.size()) << c.spec() << " token " << t << " head " << h;
          for (int64_t j : diff) {
            ASSERT_LT(j, band) << c.spec() << " token " << t << " head " << h << ": key " << j;
            EXPECT_LE(std::fabs(sc[static_cast<size_t>(j)] - thr), 1e-5 * thr)
                << c.spec() << " token " << t << " head " << h << ": key " << j;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 8000);
  EXPECT_LE(near * 100, checked) << near << " near-ties of " << checked;
}

TEST(Vslash, CallsWithPastTokensAndShortSequencesAreDense) {
  Seq s(600, 4, 2, 64, 64, 9);
  const RopeTable rt = test_rope(64, true);
  const auto full = full_oracle(s, rt);
  // A 300-token first call is sparse (300 > 48 + 128); the later calls have past tokens.
  const auto r = run_seq(s, "vslash:vertical=48,slash=128,obs=16", kv_config(s, 16, rt), {300, 100, 1}, true);
  const size_t from = static_cast<size_t>(300 * s.H * s.dv);
  EXPECT_LT(max_abs_diff(std::vector<float>(r.out.begin() + from, r.out.end()),
                         std::vector<float>(full.begin() + from, full.end())), 2e-4);
  EXPECT_GT(max_abs_diff(std::vector<float>(r.out.begin(), r.out.begin() + from),
                         std::vector<float>(full.begin(), full.begin() + from)), 1e-3);  // the sparse call
  // A whole sequence of at most vertical + slash tokens is dense.
  Seq sh(176, 4, 2, 64, 64, 10);
  const auto dense = run_seq(sh, "vslash:vertical=48,slash=128,obs=16", kv_config(sh, 16, rt), {176});
  EXPECT_LT(max_abs_diff(dense.out, full_oracle(sh, rt)), 2e-4);
}

TEST(Vslash, BadKeysAreErrors) {
  const AttnShape sh = shape_of(Seq(4, 4, 2, 64, 64, 1));
  for (const char* bad : {"vslash:slash=100", "vslash:kernel=4", "vslash:pool=sum", "vslash:reduce=min",
                          "vslash:vertical=0"}) {
    auto be = make_attention_backend(bad, sh);
    ASSERT_FALSE(be.has_value()) << bad;
    EXPECT_FALSE(be.error().message.empty());
  }
}

}  // namespace
}  // namespace lc::test
