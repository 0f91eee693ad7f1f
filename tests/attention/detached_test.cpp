// Context parallelism's identity (src/dist): a query's attention over a sequence whose cache is
// split into shards held by different caches is the log-sum-exp merge of its attention over each
// shard, where the shards that do not hold the query attend it detached. The oracle is the
// double-precision attention over the whole sequence (oracle.h), never a backend's output.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "run_util.h"

namespace lc::test {
namespace {

struct ShardRun {
  std::vector<float> out;  // [n, H, dv]
  std::vector<float> lse;  // [n, H]
};

// Shard [a, b) of s in its own cache; queries [q0, q1). The shard that holds the queries
// appends them as the model does (earlier tokens first, then the queries' chunk) and attends
// causally; any other shard attends detached.
ShardRun run_shard(const Seq& s, const std::string& spec, const RopeTable& rt, int64_t a, int64_t b, int64_t q0,
                   int64_t q1) {
  const int64_t n = q1 - q0;
  const bool holds = q0 >= a && q1 <= b;
  auto kv = KvCache::create(kv_config(s, 16, rt));
  EXPECT_TRUE(kv.has_value());
  auto be = make_attention_backend(spec, shape_of(s));
  EXPECT_TRUE(be.has_value()) << (be ? "" : be.error().message);
  EXPECT_TRUE((*be)->attach(**kv).is_ok());
  const int64_t upto = holds ? q0 : b;
  if (upto > a) EXPECT_TRUE((*kv)->append(0, upto - a, s.kt(a, 0), s.vt(a, 0), s.pos.data() + a).is_ok());
  if (holds) {
    EXPECT_TRUE((*kv)->append(0, n, s.kt(q0, 0), s.vt(q0, 0), s.pos.data() + q0).is_ok());
    if (b > q1) ADD_FAILURE() << "the queries must end the shard that holds them";
  }
  (*be)->keep_partial_lse(true);
  (*be)->set_detached(!holds);
  ShardRun r;
  r.out.assign(static_cast<size_t>(n * s.H * s.dv), 0.0f);
  const Status st = (*be)->forward(0, n, s.qt(q0, 0), s.pos.data() + q0, **kv, r.out.data(), test_pool());
  EXPECT_TRUE(st.is_ok()) << st.message();
  const float* lse = (*be)->partial_lse();
  EXPECT_NE(lse, nullptr);
  if (lse) r.lse.assign(lse, lse + n * s.H);
  return r;
}

// The merge written out in double: o = sum_i e^{lse_i - m} o_i / sum_i e^{lse_i - m}.
std::vector<float> merge(const std::vector<ShardRun>& parts, int64_t n, int64_t H, int64_t dv) {
  std::vector<float> out(static_cast<size_t>(n * H * dv));
  for (int64_t r = 0; r < n * H; ++r) {
    double m = -INFINITY;
    for (const auto& p : parts) m = std::max(m, static_cast<double>(p.lse[static_cast<size_t>(r)]));
    double den = 0;
    std::vector<double> o(static_cast<size_t>(dv), 0.0);
    for (const auto& p : parts) {
      const double l = p.lse[static_cast<size_t>(r)];
      if (l == -INFINITY) continue;
      const double w = std::exp(l - m);
      den += w;
      for (int64_t c = 0; c < dv; ++c) o[static_cast<size_t>(c)] += w * p.out[static_cast<size_t>(r * dv + c)];
    }
    for (int64_t c = 0; c < dv; ++c) out[static_cast<size_t>(r * dv + c)] = static_cast<float>(o[static_cast<size_t>(c)] / den);
  }
  return out;
}

TEST(AttentionDetached, ShardsMergeToAttentionOverTheWholeSequence) {
  uint32_t seed = 900;
  const int64_t W = 40;
  // budget=512 reads every far page of these shards: the budgeted path, exactly.
  for (const std::string spec : {"dense", "dense:split=32", "fixed:distance=40", "fixed:distance=40,budget=512,page=16"})
    for (const auto& q : {std::pair<int64_t, int64_t>{260, 300}, {299, 300}}) {  // a prompt's chunk, one token
      Seq s(300, 8, 2, 64, 64, seed++);
      const RopeTable rt = test_rope(64, seed % 2 == 0);
      const int64_t cuts[] = {0, 110, 200, 300};  // the last shard holds the queries
      std::vector<ShardRun> parts;
      for (int i = 0; i < 3; ++i) parts.push_back(run_shard(s, spec, rt, cuts[i], cuts[i + 1], q.first, q.second));
      const int64_t n = q.second - q.first;
      const auto got = merge(parts, n, s.H, s.dv);
      const bool fixed = spec.starts_with("fixed");
      const auto want_all = fixed ? fixed_oracle(s, rt, W) : full_oracle(s, rt);
      const std::vector<float> want(want_all.begin() + q.first * s.H * s.dv, want_all.end());
      EXPECT_LT(max_abs_diff(got, want), 2e-4) << spec << " queries " << q.first;
      // A shard alone is not the whole: the merge is what makes the result right.
      EXPECT_GT(max_abs_diff(parts.back().out, want), 1e-3) << spec;
    }
}

TEST(AttentionDetached, EmptyShardGivesNothingAndOtherBackendsRefuse) {
  Seq s(40, 4, 2, 64, 64, 7);
  const RopeTable rt = test_rope(64, true);
  auto kv = KvCache::create(kv_config(s, 16, rt));
  ASSERT_TRUE(kv.has_value());
  auto be = make_attention_backend("dense", shape_of(s));
  ASSERT_TRUE(be.has_value());
  ASSERT_TRUE((*be)->attach(**kv).is_ok());
  (*be)->keep_partial_lse(true);
  (*be)->set_detached(true);
  std::vector<float> out(static_cast<size_t>(s.H * s.dv), 1.0f);
  ASSERT_TRUE((*be)->forward(0, 1, s.qt(0, 0), s.pos.data(), **kv, out.data(), test_pool()).is_ok());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (int64_t h = 0; h < s.H; ++h) EXPECT_EQ((*be)->partial_lse()[h], -std::numeric_limits<float>::infinity());

  auto quest = make_attention_backend("quest:budget=64,page=16", shape_of(s));
  ASSERT_TRUE(quest.has_value());
  ASSERT_TRUE((*quest)->attach(**kv).is_ok());
  (*quest)->set_detached(true);
  const Status st = (*quest)->forward(0, 1, s.qt(0, 0), s.pos.data(), **kv, out.data(), test_pool());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("does not hold its queries"), std::string::npos) << st.message();
  EXPECT_EQ((*quest)->partial_lse(), nullptr);
}

}  // namespace
}  // namespace lc::test
