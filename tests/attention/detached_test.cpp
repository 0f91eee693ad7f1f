// Context parallelism's identity (src/dist): a query's attention over a sequence whose cache is
// split into shards held by different caches is the log-sum-exp merge of its attention over each
// shard, where the shards that do not hold the query attend it detached. The oracle is the
// double-precision attention over the whole sequence (oracle.h), never a backend's output.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "quest_oracle.h"
#include "run_util.h"

namespace lc::test {
namespace {

struct ShardRun {
  std::vector<float> out;  // [n, H, dv]
  std::vector<float> lse;  // [n, H]
  Selection sel;           // the keys each row attended (shard indices), with record
  std::vector<std::vector<float>> keys;  // [Hkv][tokens, d] the shard's keys as stored, with record
};

// Shard [a, b) of s in its own cache; queries [q0, q1). The shard that holds the queries
// appends them as the model does (earlier tokens first, then the queries' chunk) and attends
// causally; any other shard attends detached.
ShardRun run_shard(const Seq& s, const std::string& spec, const RopeTable& rt, int64_t a, int64_t b, int64_t q0,
                   int64_t q1, bool record = false) {
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
  (*be)->record_selection(record);
  ShardRun r;
  r.out.assign(static_cast<size_t>(n * s.H * s.dv), 0.0f);
  const Status st = (*be)->forward(0, n, s.qt(q0, 0), s.pos.data() + q0, **kv, r.out.data(), test_pool());
  EXPECT_TRUE(st.is_ok()) << st.message();
  const float* lse = (*be)->partial_lse();
  EXPECT_NE(lse, nullptr);
  if (lse) r.lse.assign(lse, lse + n * s.H);
  if (record) {
    r.sel = (*be)->selection();
    for (int64_t hk = 0; hk < s.Hkv; ++hk) {
      const int64_t L = (*kv)->n_tokens(0, hk);
      r.keys.emplace_back(static_cast<size_t>(L * s.d));
      (*kv)->read_keys(0, hk, 0, L, r.keys.back().data());
    }
  }
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

// Quest under context parallelism: every shard is paged from its own first token and each query
// head of a decoded token chooses its pages among its shard's by the Quest rule, with the budget
// per shard (quest_oracle.h, in double); the merge is then the attention over the union of the
// shards' choices (oracle.h's oracle_row over those keys), which is not the attention over every
// key. A prefill chunk is dense in every shard (Quest's `q_len > 1`).
TEST(AttentionDetached, QuestChoosesItsPagesInEachShard) {
  const int64_t budget = 32, page = 8;
  const std::string spec = "quest:budget=32,page=8,dense_layers=0";
  uint32_t seed = 950;
  Tally tally;
  for (int rep = 0; rep < 6; ++rep) {
    Seq s(300, 8, 2, 64, 64, seed++, 1.0f);
    const RopeTable rt = test_rope(64, seed % 2 == 0);
    const int64_t cuts[] = {0, 110 + 3 * rep, 200 - 5 * rep, 300};  // pages cut the shards differently
    const int64_t t = 299, g = s.H / s.Hkv;
    std::vector<ShardRun> parts;
    for (int i = 0; i < 3; ++i) parts.push_back(run_shard(s, spec, rt, cuts[i], cuts[i + 1], t, t + 1, true));
    const auto got = merge(parts, 1, s.H, s.dv);
    const auto full_all = full_oracle(s, rt);
    const std::vector<float> full(full_all.begin() + t * s.H * s.dv, full_all.end());
    std::vector<float> want(static_cast<size_t>(s.H * s.dv));
    for (int64_t h = 0; h < s.H; ++h) {
      const auto q = rotate(s.qt(t, h), s.d, rt, s.pos[static_cast<size_t>(t)]);
      std::vector<SelectedKey> keys;
      for (int i = 0; i < 3; ++i) {
        const int64_t a = cuts[i], L = cuts[i + 1] - a;
        const QuestChoice oc = quest_oracle(parts[i].keys[static_cast<size_t>(h / g)].data(), L, s.d, q, budget, page);
        ASSERT_FALSE(oc.dense) << "every shard must be sparse here";
        const auto& sel = parts[i].sel.keys[static_cast<size_t>(h)];
        expect_choice(sel, oc, L, page, false, tally,
                      "shard " + std::to_string(i) + " head " + std::to_string(h) + " seed " + std::to_string(seed));
        for (const SelectedKey& k : sel) keys.push_back(SelectedKey{static_cast<int32_t>(a + k.seq_index), k.q_pos, k.k_pos});
      }
      const auto o = oracle_row(s, rt, 1.0f / std::sqrt(static_cast<float>(s.d)), t, h, keys);
      for (int64_t c = 0; c < s.dv; ++c) want[static_cast<size_t>(h * s.dv + c)] = static_cast<float>(o[static_cast<size_t>(c)]);
    }
    EXPECT_LT(max_abs_diff(got, want), 2e-4) << "seed " << seed;
    EXPECT_GT(max_abs_diff(got, full), 1e-3) << "seed " << seed << ": the choice must matter";
    // A prefill chunk: dense in every shard, so the merge is the attention over every key.
    std::vector<ShardRun> pre;
    for (int i = 0; i < 3; ++i) pre.push_back(run_shard(s, spec, rt, cuts[i], cuts[i + 1], 260, 300));
    const std::vector<float> want_pre(full_all.begin() + 260 * s.H * s.dv, full_all.end());
    EXPECT_LT(max_abs_diff(merge(pre, 40, s.H, s.dv), want_pre), 2e-4) << "seed " << seed;
  }
  EXPECT_EQ(tally.checked, 6 * 3 * 8);
  EXPECT_LE(tally.near_ties, 2);
}

// quest_fast in a detached shard: no page is the query's own, so each query head (share=0)
// chooses all budget / page of its pages by bound: a page whose exact bound (quest_oracle.h) is
// clearly above the K-th is taken, one clearly below it is not (the bounds are 8-bit codes, off
// by well under 5% of the bound's scale). The merge is the attention over the union of the choices.
TEST(AttentionDetached, QuestFastChoosesBudgetPagesInEachShard) {
  uint32_t seed = 970;
  int64_t clear_calls = 0;
  for (int rep = 0; rep < 4; ++rep) {
    Seq s(300, 8, 2, 64, 64, seed++, 1.0f);
    const RopeTable rt = test_rope(64, seed % 2 == 0);
    const int64_t cuts[] = {0, 120, 210, 300};
    const int64_t t = 299, page = 8, K = 32 / page;
    std::vector<ShardRun> parts;
    for (int i = 0; i < 3; ++i)
      parts.push_back(run_shard(s, "quest_fast:budget=32,page=8,dense_layers=0,share=0", rt, cuts[i], cuts[i + 1], t, t + 1, true));
    const auto got = merge(parts, 1, s.H, s.dv);
    std::vector<float> want(static_cast<size_t>(s.H * s.dv));
    for (int64_t h = 0; h < s.H; ++h) {
      std::vector<SelectedKey> keys;
      for (int i = 0; i < 3; ++i) {
        const auto& sel = parts[i].sel.keys[static_cast<size_t>(h)];
        std::vector<int64_t> pages;
        for (const SelectedKey& k : sel) {
          if (pages.empty() || pages.back() != k.seq_index / page) pages.push_back(k.seq_index / page);
          keys.push_back(SelectedKey{static_cast<int32_t>(cuts[i] + k.seq_index), k.q_pos, k.k_pos});
        }
        EXPECT_EQ(static_cast<int64_t>(pages.size()), K) << "shard " << i << " head " << h;
        if (i < 2) {  // detached: every page competes on its bound
          const auto q = rotate(s.qt(t, h), s.d, rt, s.pos[static_cast<size_t>(t)]);
          const int64_t L = cuts[i + 1] - cuts[i];
          const QuestChoice oc = quest_oracle(parts[i].keys[static_cast<size_t>(h / (s.H / s.Hkv))].data(), L, s.d,
                                              q, 32, page);
          double kth = INFINITY;
          for (int32_t p : oc.pages) kth = std::min(kth, oc.score[static_cast<size_t>(p)]);
          for (int64_t p = 0; p < oc.n_pages; ++p) {
            const bool taken = std::find(pages.begin(), pages.end(), p) != pages.end();
            const double u = oc.score[static_cast<size_t>(p)];
            if (u > kth + 0.05 * oc.mag) EXPECT_TRUE(taken) << "shard " << i << " head " << h << " page " << p;
            if (u < kth - 0.05 * oc.mag) EXPECT_FALSE(taken) << "shard " << i << " head " << h << " page " << p;
            clear_calls += u > kth + 0.05 * oc.mag || u < kth - 0.05 * oc.mag;
          }
        }
        int64_t whole = 0;  // whole pages (the holder's own last page may be partial)
        for (int64_t p : pages) whole += std::min(page, cuts[i + 1] - cuts[i] - p * page);
        EXPECT_EQ(static_cast<int64_t>(sel.size()), whole) << "shard " << i << " head " << h;
      }
      const auto o = oracle_row(s, rt, 1.0f / std::sqrt(static_cast<float>(s.d)), t, h, keys);
      for (int64_t c = 0; c < s.dv; ++c) want[static_cast<size_t>(h * s.dv + c)] = static_cast<float>(o[static_cast<size_t>(c)]);
    }
    EXPECT_LT(max_abs_diff(got, want), 2e-4) << "seed " << seed;
  }
  EXPECT_GT(clear_calls, 100) << "too few pages far from the K-th bound to check the choice";
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

  for (const char* spec : {"quest:budget=64,page=16,dense_layers=0", "quest_fast:budget=64,page=16,dense_layers=0"}) {
    auto quest = make_attention_backend(spec, shape_of(s));
    ASSERT_TRUE(quest.has_value());
    ASSERT_TRUE((*quest)->attach(**kv).is_ok());
    (*quest)->keep_partial_lse(true);
    (*quest)->set_detached(true);
    std::fill(out.begin(), out.end(), 1.0f);
    ASSERT_TRUE((*quest)->forward(0, 1, s.qt(0, 0), s.pos.data(), **kv, out.data(), test_pool()).is_ok()) << spec;
    for (float x : out) EXPECT_EQ(x, 0.0f) << spec;
    for (int64_t h = 0; h < s.H; ++h) EXPECT_EQ((*quest)->partial_lse()[h], -std::numeric_limits<float>::infinity());
  }
  auto other = make_attention_backend("dssa", shape_of(s));
  ASSERT_TRUE(other.has_value());
  ASSERT_TRUE((*other)->attach(**kv).is_ok());
  (*other)->set_detached(true);
  const Status st = (*other)->forward(0, 1, s.qt(0, 0), s.pos.data(), **kv, out.data(), test_pool());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("does not hold its queries"), std::string::npos) << st.message();
  EXPECT_EQ((*other)->partial_lse(), nullptr);
}

}  // namespace
}  // namespace lc::test
