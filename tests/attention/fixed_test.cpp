// Fixed-distance attention against the double-precision oracle built from the test's own
// vectors: keys within the distance at their real positions, every other key scored as
// rope(q, W) . rope(k, 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "run_util.h"

namespace lc::test {
namespace {

struct Shape {
  int64_t ratio, d, block;
};
const Shape kShapes[] = {{1, 64, 16}, {2, 128, 64}, {4, 64, 32}, {8, 64, 16}};

TEST(AttentionFixed, EqualsOracleOverShapesAndChunks) {
  uint32_t seed = 500;
  for (const auto& sh : kShapes)
    for (const auto& chunks : {std::vector<int64_t>{1}, {7}, {200, 1}}) {
      Seq s(260, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
      const RopeTable rt = test_rope(sh.d, sh.ratio % 2 == 0);
      const int64_t W = 37 + sh.block;  // not a multiple of the block
      const auto r = run_seq(s, "fixed:distance=" + std::to_string(W), kv_config(s, sh.block, rt), chunks, true);
      EXPECT_LT(max_abs_diff(r.out, fixed_oracle(s, rt, W)), 2e-4) << "ratio " << sh.ratio << " chunk " << chunks[0];
      // Every visible key attended exactly once, and the far ones at the fixed distance.
      EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4);
      size_t n_far = 0;
      for (const auto& sel : r.sel)
        for (const auto& keys : sel.keys)
          for (const auto& k : keys) n_far += k.q_pos == W && k.k_pos == 0;
      EXPECT_GT(n_far, 0u);
      // And it is not dense attention.
      EXPECT_GT(max_abs_diff(r.out, full_oracle(s, rt)), 1e-3);
    }
}

TEST(AttentionFixed, DistanceBeyondTheInputIsDense) {
  Seq s(300, 4, 2, 64, 64, 21);
  const RopeTable rt = test_rope(64, false);
  const auto r = run_seq(s, "fixed:distance=300", kv_config(s, 16, rt), {40});
  EXPECT_LT(max_abs_diff(r.out, full_oracle(s, rt)), 2e-4);
}

TEST(AttentionFixed, DecodeSplitMatchesUnsplit) {
  Seq s(600, 8, 2, 64, 64, 22);
  const RopeTable rt = test_rope(64, true);
  expect_decode_split_matches_unsplit(s, rt, kv_config(s, 16, rt), "fixed:distance=50", 32);
}

// With a budget: exact on the pages it chose, at most the budget of far pages per query (plus
// the incomplete page and the rows of its own tile), and a budget that covers everything is
// the dense `fixed`.
TEST(AttentionFixed, BudgetExactOnItsSelectionAndFullBudgetIsDense) {
  uint32_t seed = 600;
  for (const auto& sh : kShapes)
    for (const auto& chunks : {std::vector<int64_t>{64}, {7, 1}}) {
      Seq s(360, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
      const RopeTable rt = test_rope(sh.d, true);
      const int64_t W = 40;
      const auto r = run_seq(s, "fixed:distance=40,budget=64,page=16,tail=5", kv_config(s, sh.block, rt), chunks, true);
      EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << "ratio " << sh.ratio;
      size_t most_far = 0;
      for (const auto& sel : r.sel)
        for (const auto& keys : sel.keys) {
          size_t far = 0;
          for (const auto& k : keys) far += k.q_pos == W && k.k_pos == 0;
          most_far = std::max(most_far, far);
        }
      EXPECT_LE(most_far, 64u + 15 + 63);
      EXPECT_GE(most_far, 64u);
      const auto all = run_seq(s, "fixed:distance=40,budget=4096,page=16", kv_config(s, sh.block, rt), chunks);
      EXPECT_LT(max_abs_diff(all.out, fixed_oracle(s, rt, W)), 2e-4);
    }
}

TEST(AttentionFixed, BudgetFindsTheNeedle) {
  // One far key aligned with every query (a rope without rotation makes its score position-
  // free); with a budget of 4 pages every query more than 64 tokens past it attends it.
  Seq s(1000, 4, 1, 64, 64, 9, 0.3f);
  for (int64_t c = 0; c < s.d; ++c) s.k[static_cast<size_t>(333 * s.d + c)] = 0.0f;
  s.k[static_cast<size_t>(333 * s.d + 0)] = 30.0f;
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) s.q[static_cast<size_t>((t * s.H + h) * s.d)] = 3.0f;
  RopeTable rt = test_rope(64, true);
  for (auto& f : rt.inv_freq) f *= 0.0f;
  for (const auto& chunks : {std::vector<int64_t>{64}, {1000}}) {
    const auto r = run_seq(s, "fixed:distance=64,budget=64,page=16,tail=8", kv_config(s, 16, rt), chunks, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4);
    int64_t rows = 0, found = 0;
    for (size_t c = 0; c < r.sel.size(); ++c)
      for (int64_t t = 0; t < r.sel[c].n; ++t)
        for (int64_t h = 0; h < s.H; ++h) {
          if (r.chunk_t0[c] + t <= 333 + 64 + 64) continue;
          ++rows;
          for (const auto& k : r.sel[c].keys[static_cast<size_t>(t * s.H + h)]) found += k.seq_index == 333;
        }
    EXPECT_GT(rows, 0);
    EXPECT_EQ(found, rows) << "chunk " << chunks[0];
  }
}

TEST(AttentionFixed, BudgetDecodeSplitAndTruncation) {
  Seq s(600, 8, 2, 64, 64, 24);
  const RopeTable rt = test_rope(64, true);
  expect_decode_split_matches_unsplit(s, rt, kv_config(s, 16, rt), "fixed:distance=50,budget=96,page=16", 32);
  // Truncated and continued with other tokens: the page bounds above the cut are rebuilt, so
  // the output is the bits of a fresh run.
  Seq b = s, other(600, 8, 2, 64, 64, 25);
  const int64_t cut = 296;
  std::copy(other.q.begin() + cut * s.H * s.d, other.q.end(), b.q.begin() + cut * s.H * s.d);
  std::copy(other.k.begin() + cut * s.Hkv * s.d, other.k.end(), b.k.begin() + cut * s.Hkv * s.d);
  std::copy(other.v.begin() + cut * s.Hkv * s.dv, other.v.end(), b.v.begin() + cut * s.Hkv * s.dv);
  const char* spec = "fixed:distance=50,budget=64,page=8,tail=4";
  const auto cfg = kv_config(s, 16, rt);
  auto r = run_seq(s, spec, cfg, {50});
  r.kv->truncate(cut);
  continue_seq(r, b, cut, 50);
  const auto fresh = run_seq(b, spec, cfg, {50, 50, 50, 50, 50, 46, 50, 50, 50, 50, 50, 50, 4});
  const size_t from = static_cast<size_t>(cut * s.H * s.dv);
  EXPECT_EQ(max_abs_diff(std::vector<float>(r.out.begin() + from, r.out.end()),
                         std::vector<float>(fresh.out.begin() + from, fresh.out.end())), 0.0);
}

TEST(AttentionFixed, DefaultFromTheModelAndClearErrors) {
  Seq s(10, 4, 2, 64, 64, 23);
  AttnShape as = shape_of(s);
  auto plain = make_attention_backend("fixed", as);
  ASSERT_FALSE(plain);
  EXPECT_NE(plain.error().message.find("distance=N"), std::string::npos) << plain.error().message;
  auto dflt = make_attention_backend("", as);
  ASSERT_TRUE(dflt);
  EXPECT_EQ((*dflt)->spec(), "dense");
  as.fixed_distance = 64;
  dflt = make_attention_backend("", as);
  ASSERT_TRUE(dflt);
  EXPECT_EQ((*dflt)->spec(), "fixed:distance=64");
  auto given = make_attention_backend("fixed:distance=8", as);
  ASSERT_TRUE(given);
  EXPECT_EQ((*given)->spec(), "fixed:distance=8");
  EXPECT_FALSE(make_attention_backend("fixed:distance=-1", as));
  EXPECT_FALSE(make_attention_backend("fixed:window=3", as));
  auto small = make_attention_backend("fixed:distance=8,budget=4,page=16", as);
  ASSERT_FALSE(small);
  EXPECT_NE(small.error().message.find("less than one page"), std::string::npos) << small.error().message;
  auto sparse = make_attention_backend("fixed:budget=256", as);
  ASSERT_TRUE(sparse);
  EXPECT_EQ((*sparse)->spec(), "fixed:distance=64,budget=256,page=16,tail=64");
}

}  // namespace
}  // namespace lc::test
