// `dssa` is InfLLM-v2's block selection as the authors' inference code runs it
// (OpenBMB/infllmv2_cuda_impl: infllmv2_attn_stage1, max_pooling_1d; MiniCPM4's
// compressed_attention): checked here token by token against an independent oracle written from
// that definition in double precision.
//
// The oracle, for query token t (it sees L = t + 1 tokens of its KV head) and a GQA group:
//   - kernels i = 0, 1, ... with i * stride + kernel <= L: the mean of the stored (post-RoPE)
//     keys [i * stride, i * stride + kernel);
//   - per query head h of the group, q_h rotated at t's position (oracle.h's rotate) and
//     p_h(i) = softmax_i(q_h . c_i / sqrt(d)) over those kernels; G(i) = sum_h p_h(i);
//   - block b's score: the largest G(i) over the kernels whose tokens overlap the block's;
//   - the initial blocks ceil(sinks / block) and the window, the blocks from
//     (t / block) - ceil(local / block) + 1 to t's own, are attended; of the blocks between them,
//     the topk - (initial blocks) of highest score (all of them when there are no more);
//   - tie rule: of blocks with equal score, the lower block is taken first;
//   - a token that sees at most `switch` tokens attends all of them.
// The backend computes G in float: a block may differ between the two only when its score is
// within 1e-5 (relative) of the oracle's last chosen score; such near-ties must stay rare. The
// tie test uses no rotation and repeated keys, where the scores tie exactly in both.
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

struct DssaParams {
  int64_t sw, block, kernel, stride, topk, sinks, local;
  std::string spec() const {
    return "dssa:switch=" + std::to_string(sw) + ",block=" + std::to_string(block) + ",kernel=" +
           std::to_string(kernel) + ",stride=" + std::to_string(stride) + ",topk=" + std::to_string(topk) +
           ",sinks=" + std::to_string(sinks) + ",local=" + std::to_string(local);
  }
};

struct DssaChoice {
  std::set<int32_t> tokens;    // every attended token
  std::vector<double> score;   // [blocks] (candidates only; others NaN)
  std::vector<int32_t> chosen; // chosen candidate blocks, ascending
  double thr = INFINITY;       // the lowest chosen score (INFINITY: no choice was made)
};

DssaChoice dssa_oracle(const Seq& s, const RopeTable& rt, const std::vector<float>& keys /*[T, d] stored*/,
                       int64_t t, int64_t hk, const DssaParams& p) {
  DssaChoice oc;
  const int64_t L = t + 1, d = s.d, g = s.H / s.Hkv;
  const int64_t n_init = (p.sinks + p.block - 1) / p.block, wb = (p.local + p.block - 1) / p.block;
  const int64_t init_end = std::min(L, n_init * p.block);
  const int64_t win_start = std::max(n_init * p.block, (t / p.block - wb + 1) * p.block);
  if (L <= p.sw) {
    for (int64_t j = 0; j < L; ++j) oc.tokens.insert(static_cast<int32_t>(j));
    return oc;
  }
  for (int64_t j = 0; j < init_end; ++j) oc.tokens.insert(static_cast<int32_t>(j));
  for (int64_t j = win_start; j < L; ++j) oc.tokens.insert(static_cast<int32_t>(j));
  const int64_t c0 = n_init, c1 = win_start / p.block;  // candidate blocks
  if (c1 <= c0) return oc;
  std::vector<std::vector<double>> c;  // kernels
  for (int64_t i = 0; i * p.stride + p.kernel <= L; ++i) {
    std::vector<double> m(static_cast<size_t>(d), 0.0);
    for (int64_t j = i * p.stride; j < i * p.stride + p.kernel; ++j)
      for (int64_t x = 0; x < d; ++x) m[static_cast<size_t>(x)] += keys[static_cast<size_t>(j * d + x)];
    for (auto& x : m) x /= static_cast<double>(p.kernel);
    c.push_back(m);
  }
  std::vector<double> G(c.size(), 0.0);
  for (int64_t h = hk * g; h < (hk + 1) * g; ++h) {
    const auto q = rotate(s.qt(t, h), d, rt, s.pos[static_cast<size_t>(t)]);
    std::vector<double> a(c.size());
    double mx = -INFINITY, sum = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      double v = 0;
      for (int64_t x = 0; x < d; ++x) v += q[static_cast<size_t>(x)] * c[i][static_cast<size_t>(x)];
      a[i] = v / std::sqrt(static_cast<double>(d));
      mx = std::max(mx, a[i]);
    }
    for (auto& v : a) sum += (v = std::exp(v - mx));
    for (size_t i = 0; i < c.size(); ++i) G[i] += a[i] / sum;
  }
  const int64_t n_blocks = (L + p.block - 1) / p.block;
  oc.score.assign(static_cast<size_t>(n_blocks), NAN);
  for (int64_t b = c0; b < c1; ++b) {
    double best = -INFINITY;
    for (size_t i = 0; i < c.size(); ++i) {
      const int64_t k_lo = static_cast<int64_t>(i) * p.stride, k_hi = k_lo + p.kernel;  // [k_lo, k_hi)
      if (k_lo < (b + 1) * p.block && k_hi > b * p.block) best = std::max(best, G[i]);
    }
    oc.score[static_cast<size_t>(b)] = best;
  }
  const int64_t slots = std::max<int64_t>(0, p.topk - n_init);
  std::vector<int32_t> order;
  for (int64_t b = c0; b < c1; ++b) order.push_back(static_cast<int32_t>(b));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return oc.score[static_cast<size_t>(a)] > oc.score[static_cast<size_t>(b)];  // stable: lower block first
  });
  if (static_cast<int64_t>(order.size()) > slots) {
    order.resize(static_cast<size_t>(slots));
    for (int32_t b : order) oc.thr = std::min(oc.thr, oc.score[static_cast<size_t>(b)]);
  }
  std::sort(order.begin(), order.end());
  oc.chosen = order;
  for (int32_t b : order)
    for (int64_t j = b * p.block; j < (b + 1) * p.block; ++j) oc.tokens.insert(static_cast<int32_t>(j));
  return oc;
}

struct Tally {
  int64_t checked = 0, sparse = 0, near_ties = 0;
};

// Runs p over s in the given chunks (recording) and checks every token and head of every chunk.
Tally check_dssa(const Seq& s, const RopeTable& rt, int64_t kv_block, const DssaParams& p,
                 const std::vector<int64_t>& chunks, bool strict = false) {
  const auto r = run_seq(s, p.spec(), kv_config(s, kv_block, rt), chunks, true);
  EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << p.spec();
  std::vector<std::vector<float>> keys(static_cast<size_t>(s.Hkv), std::vector<float>(static_cast<size_t>(s.T * s.d)));
  for (int64_t hk = 0; hk < s.Hkv; ++hk) r.kv->read_keys(0, hk, 0, s.T, keys[static_cast<size_t>(hk)].data());
  Tally tally;
  const int64_t g = s.H / s.Hkv;
  for (size_t c = 0; c < r.sel.size(); ++c)
    for (int64_t tt = 0; tt < r.sel[c].n; ++tt) {
      const int64_t t = r.chunk_t0[c] + tt;
      for (int64_t hk = 0; hk < s.Hkv; ++hk) {
        const DssaChoice oc = dssa_oracle(s, rt, keys[static_cast<size_t>(hk)], t, hk, p);
        tally.sparse += static_cast<int64_t>(oc.tokens.size()) < t + 1;
        for (int64_t h = hk * g; h < (hk + 1) * g; ++h) {
          ++tally.checked;
          std::set<int32_t> got;
          for (const auto& k : r.sel[c].keys[static_cast<size_t>(tt * s.H + h)]) got.insert(k.seq_index);
          const std::string what = p.spec() + " token " + std::to_string(t) + " head " + std::to_string(h);
          if (strict || got == oc.tokens) {
            EXPECT_EQ(got, oc.tokens) << what;
            continue;
          }
          // Only whole candidate blocks within rounding of the last chosen score may differ.
          std::vector<int32_t> diff;
          std::set_symmetric_difference(got.begin(), got.end(), oc.tokens.begin(), oc.tokens.end(),
                                        std::back_inserter(diff));
          EXPECT_EQ(got.size(), oc.tokens.size()) << what;
          for (int32_t j : diff) {
            const double sc = oc.score[static_cast<size_t>(j / p.block)];
            EXPECT_FALSE(std::isnan(sc)) << what << ": token " << j << " is not in a candidate block";
            if (!std::isnan(sc)) {
              EXPECT_LE(std::fabs(sc - oc.thr), 1e-5 * oc.thr) << what << ": block " << j / p.block;
            }
          }
          ++tally.near_ties;
        }
      }
    }
  return tally;
}

TEST(DssaPaper, SelectionEqualsOracle) {
  struct Case {
    int64_t ratio, d, kv_block, T;
    DssaParams p;
    std::vector<int64_t> chunks;
  };
  // GQA 1..8; the authors' kernel geometry (kernel = 2 x stride, blocks of 4 strides) and
  // others (kernel = stride, blocks not a multiple of the stride, local windows that are not
  // whole blocks); prefill in chunks and one token at a time.
  const Case cases[] = {
      {1, 64, 16, 700, {200, 64, 32, 16, 6, 64, 128}, {128, 1}},
      {4, 64, 32, 900, {300, 64, 32, 16, 5, 64, 150}, {64, 7, 1}},
      {2, 128, 64, 600, {100, 32, 16, 8, 4, 32, 64}, {100}},
      {8, 64, 16, 500, {64, 48, 24, 12, 7, 100, 96}, {50, 1}},
      {2, 64, 16, 640, {128, 32, 16, 16, 3, 0, 32}, {37}},
  };
  uint32_t seed = 900;
  int64_t checked = 0, near = 0, sparse = 0;
  for (const auto& cs : cases) {
    Seq s(cs.T, 2 * cs.ratio, 2, cs.d, cs.d, seed, 1.0f);
    const RopeTable rt = test_rope(cs.d, seed % 2 == 0);
    ++seed;
    const Tally t = check_dssa(s, rt, cs.kv_block, cs.p, cs.chunks);
    checked += t.checked;
    near += t.near_ties;
    sparse += t.sparse;
  }
  EXPECT_GT(checked, 10000);
  EXPECT_GT(sparse * 2, checked / 8);  // most tokens past the switch choose
  EXPECT_LE(near * 200, checked) << near << " near-ties of " << checked;
}

TEST(DssaPaper, TiesGoToTheLowerBlock) {
  // No rotation; the keys repeat every 64 tokens, so with kernel 16, stride 16 and blocks of 32
  // every block's kernels equal those of the block 2 later: all even blocks tie, and all odd
  // ones, exactly. With 3 slots (topk 4, one initial block) the lowest 3 of the better class win.
  Seq s(400, 4, 1, 64, 64, 17, 1.0f);
  for (int64_t t = 64; t < s.T; ++t)
    std::copy(s.k.begin() + (t % 64) * s.d, s.k.begin() + (t % 64 + 1) * s.d, s.k.begin() + t * s.d);
  RopeTable rt = test_rope(64, true);
  for (auto& f : rt.inv_freq) f *= 0.0f;
  const DssaParams p{100, 32, 16, 16, 4, 32, 32};
  const Tally t = check_dssa(s, rt, 16, p, {150, 1}, /*strict=*/true);
  EXPECT_GT(t.sparse, 200);
}

TEST(DssaPaper, DefaultsAreTheAuthors) {
  AttnShape sh{1, 4, 2, 64, 64, 0.0f};
  auto b = make_attention_backend("dssa", sh);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)->spec(), "dssa:switch=8192,block=64,kernel=32,stride=16,topk=64,sinks=64,local=2048");
}

}  // namespace
}  // namespace lc::test
