// Sparse and streaming backends: each against the double-precision oracle restricted to
// exactly the tokens (and positions) the backend reports it attended; with a budget that
// covers everything, against full attention.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "run_util.h"

namespace lc::test {
namespace {

struct Shape {
  int64_t ratio, d, block;
};
const Shape kShapes[] = {{1, 64, 16}, {2, 128, 64}, {4, 64, 32}, {8, 64, 16}};

TEST(AttentionSparse, QuestAgainstNaiveOnItsSelection) {
  uint32_t seed = 100;
  for (const auto& sh : kShapes) {
    Seq s(700, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
    const RopeTable rt = test_rope(sh.d, true);
    const auto r = run_seq(s, "quest:budget=128,page=16,dense_layers=0", kv_config(s, sh.block, rt), {64, 1, 7}, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << "ratio " << sh.ratio;
    for (const auto& sel : r.sel)
      for (const auto& keys : sel.keys) EXPECT_LE(keys.size(), 128u);
  }
}

TEST(AttentionSparse, QuestFirstLayersDenseAndFullBudgetEqualsDense) {
  Seq s(300, 8, 2, 64, 64, 7);
  const RopeTable rt = test_rope(64, false);
  const auto oracle = full_oracle(s, rt);
  const auto full = run_seq(s, "quest:budget=512,page=16,dense_layers=0", kv_config(s, 32, rt), {50});
  EXPECT_LT(max_abs_diff(full.out, oracle), 2e-4);
  // Two layers, both dense (dense_layers=2): exact.
  const auto dl = run_seq(s, "quest:budget=32,page=16,dense_layers=2", kv_config(s, 32, rt, 2), {50});
  EXPECT_LT(max_abs_diff(dl.out, oracle), 2e-4);
}

TEST(AttentionSparse, QuestFindsTheNeedle) {
  // One key aligned with every query; with a tiny budget Quest must still attend it.
  Seq s(1000, 4, 1, 64, 64, 9, 0.3f);
  for (int64_t c = 0; c < s.d; ++c) s.k[static_cast<size_t>(333 * s.d + c)] = 0.0f;
  s.k[static_cast<size_t>(333 * s.d + 0)] = 30.0f;  // pair 0 rotates slowly: rotation-robust
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) s.q[static_cast<size_t>((t * s.H + h) * s.d)] = 3.0f;
  RopeTable rt = test_rope(64, true);
  for (auto& f : rt.inv_freq) f *= 0.0f;  // no rotation: the needle's score is position-free
  const auto r = run_seq(s, "quest:budget=64,page=16,dense_layers=0", kv_config(s, 16, rt), {1000}, true);
  const auto& keys = r.sel.back().keys[static_cast<size_t>(999 * s.H)];
  bool found = false;
  for (const auto& k : keys) found = found || k.seq_index == 333;
  EXPECT_TRUE(found);
}

TEST(AttentionSparse, StreamingEqualsNaiveAtReassignedPositions) {
  uint32_t seed = 200;
  const int64_t n_sink = 4, window = 50;
  for (const auto& sh : kShapes) {
    for (const auto& chunks : {std::vector<int64_t>{1}, {7}, {64}}) {
      Seq s(400, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
      const RopeTable rt = test_rope(sh.d, sh.ratio % 2 == 0);
      const auto r = run_seq(s, "streaming:sinks=4,window=50", kv_config(s, sh.block, rt), chunks);
      // The oracle: sinks at 0..S-1, window at S.., query last; the test's own vectors.
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
      double worst = 0;
      for (int64_t i = 0; i < s.T; ++i) {
        const int64_t S = std::min(n_sink, i + 1), ws = std::max(S, i + 1 - window);
        for (int64_t h = 0; h < s.H; ++h) {
          std::vector<SelectedKey> keys;
          const int32_t qpos = static_cast<int32_t>(ws <= i ? S + (i - ws) : i);
          for (int64_t j = 0; j < S; ++j) keys.push_back({static_cast<int32_t>(j), qpos, static_cast<int32_t>(j)});
          for (int64_t j = ws; j <= i; ++j)
            keys.push_back({static_cast<int32_t>(j), qpos, static_cast<int32_t>(S + (j - ws))});
          const auto o = oracle_row(s, rt, scale, i, h, keys);
          for (int64_t c = 0; c < s.dv; ++c)
            worst = std::max(worst, std::abs(o[static_cast<size_t>(c)] - r.out[static_cast<size_t>((i * s.H + h) * s.dv + c)]));
        }
      }
      EXPECT_LT(worst, 2e-4) << "ratio " << sh.ratio << " chunk " << chunks[0];
      // Evicted for real: sinks + window - 1 plus less than one block of slack.
      for (int64_t h = 0; h < s.Hkv; ++h) EXPECT_LT(r.kv->n_tokens(0, h), n_sink + window - 1 + sh.block);
    }
  }
}

TEST(AttentionSparse, StreamingWithLargeWindowIsDense) {
  Seq s(200, 4, 2, 64, 64, 3);
  const RopeTable rt = test_rope(64, true);
  const auto r = run_seq(s, "streaming:sinks=4,window=1000", kv_config(s, 16, rt), {13});
  EXPECT_LT(max_abs_diff(r.out, full_oracle(s, rt)), 2e-4);
}

TEST(AttentionSparse, StreamingEvictsUnderBudgetPolicy) {
  Seq s(500, 4, 2, 64, 64, 4);
  const RopeTable rt = test_rope(64, true);
  auto cfg = kv_config(s, 16, rt);
  cfg.budget_bytes = 40 * 16 * 64 * 4 * 2;  // 40 blocks of f32 K+V
  cfg.policy = KvBudgetPolicy::kEvict;
  const auto r = run_seq(s, "streaming:sinks=4,window=200", cfg, {50});
  EXPECT_LE(r.kv->memory().resident_bytes, static_cast<size_t>(cfg.budget_bytes));
}

TEST(AttentionSparse, InfLlmAgainstNaiveOnItsSelection) {
  uint32_t seed = 300;
  for (const auto& sh : kShapes) {
    for (const auto& chunks : {std::vector<int64_t>{64}, {7, 1}}) {
      Seq s(600, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
      const RopeTable rt = test_rope(sh.d, true);
      const auto r = run_seq(s, "infllm:sinks=8,local=64,block=32,reps=4,topk=3,chunk=32", kv_config(s, sh.block, rt),
                             chunks, true);
      EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << "ratio " << sh.ratio;
      // Sinks + 3 blocks + local window (+ the incomplete block and the chunk) at most, and
      // far tokens at the fixed distance.
      size_t most = 0;
      bool fixed_seen = false;
      for (const auto& sel : r.sel)
        for (const auto& keys : sel.keys) {
          most = std::max(most, keys.size());
          for (const auto& k : keys) fixed_seen = fixed_seen || (k.q_pos == 64 && k.k_pos == 0);
        }
      EXPECT_LE(most, 8u + 3 * 32 + 64 + 32 + 32);
      EXPECT_TRUE(fixed_seen);
    }
  }
}

TEST(AttentionSparse, InfLlmWithLargeLocalWindowIsDense) {
  Seq s(300, 4, 2, 64, 64, 13);
  const RopeTable rt = test_rope(64, false);
  const auto r = run_seq(s, "infllm:sinks=8,local=4096,block=32,topk=2,chunk=64", kv_config(s, 16, rt), {40});
  EXPECT_LT(max_abs_diff(r.out, full_oracle(s, rt)), 2e-4);
}

}  // namespace
}  // namespace lc::test
