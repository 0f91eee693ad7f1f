// Fixed-distance attention against the double-precision oracle built from the test's own
// vectors: keys within the distance at their real positions, every other key scored as
// rope(q, W) . rope(k, 0).
#include <gtest/gtest.h>

#include <string>

#include "run_util.h"

namespace lc::test {
namespace {

struct Shape {
  int64_t ratio, d, block;
};
const Shape kShapes[] = {{1, 64, 16}, {2, 128, 64}, {4, 64, 32}, {8, 64, 16}};

std::vector<float> fixed_oracle(const Seq& s, const RopeTable& rt, int64_t W) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  std::vector<float> out(static_cast<size_t>(s.T * s.H * s.dv));
  for (int64_t i = 0; i < s.T; ++i)
    for (int64_t h = 0; h < s.H; ++h) {
      std::vector<SelectedKey> keys;
      for (int64_t j = 0; j <= i; ++j) {
        const bool far = i - j > W;
        keys.push_back({static_cast<int32_t>(j), static_cast<int32_t>(far ? W : i), static_cast<int32_t>(far ? 0 : j)});
      }
      const auto o = oracle_row(s, rt, scale, i, h, keys);
      for (int64_t c = 0; c < s.dv; ++c) out[static_cast<size_t>((i * s.H + h) * s.dv + c)] = static_cast<float>(o[static_cast<size_t>(c)]);
    }
  return out;
}

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
}

}  // namespace
}  // namespace lc::test
