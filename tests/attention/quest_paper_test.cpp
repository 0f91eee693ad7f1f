// `quest` is Quest as its official code runs it (mit-han-lab/Quest,
// evaluation/quest_attention.py): checked here page by page against an independent oracle
// written from the paper's definition in double precision. `quest_fast` (sparse prefill, pages
// shared by a GQA group) is checked to differ where it should.
//
// The oracle, for one query head of a decoded token that sees L tokens of its KV head:
//   - pages of `page` tokens from token 0; the last one holds the L % page remaining tokens
//     (partial) and is scored like the others, the current token's page included;
//   - per page and channel c, the minimum m_c and maximum M_c of the keys as the cache stores
//     them (post-RoPE, read with KvCache::read_keys);
//   - U(page) = sum_c max(q_c m_c, q_c M_c), q rotated at the token's position (oracle.h's
//     rotate, in double);
//   - K = min(max(3, min(L, budget) / page), ceil(L / page)) pages of highest U, each query head
//     on its own; K = every page means dense;
//   - tie rule: of pages with equal U, the lower page index is taken first.
// The backend rotates q in float, so U differs from the oracle's by float rounding: a page may
// only differ between the two when its U is within 4e-6 of the oracle's K-th largest, relative
// to sum_c |q_c| max_p max(|m_c|, |M_c|); such near-ties are counted and must stay rare. The tie
// test uses no rotation (inv_freq = 0), where both compute the same U up to the factor 1/8, and
// requires exact equality.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "quest_oracle.h"
#include "run_util.h"

namespace lc::test {
namespace {

// Runs `spec` (a quest spec of n_layer layers) over s: prefill in chunks of `chunk` up to
// `prefill` tokens, then one token at a time, recording the last layer. Prefill rows must attend
// every visible key; each decoded token's heads must match the oracle.
Tally check_run(const Seq& s, const RopeTable& rt, int64_t block, const std::string& spec, int64_t budget,
                int64_t page, int64_t prefill, int64_t chunk, int64_t n_layer = 1, bool strict = false) {
  std::vector<int64_t> chunks;
  for (int64_t t = 0; t < prefill; t += chunk) chunks.push_back(std::min(chunk, prefill - t));
  for (int64_t t = prefill; t < s.T; ++t) chunks.push_back(1);
  const auto r = run_seq(s, spec, kv_config(s, block, rt, n_layer), chunks, true);
  EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << spec;
  const int64_t il = n_layer - 1, g = s.H / s.Hkv;
  std::vector<std::vector<float>> keys(static_cast<size_t>(s.Hkv), std::vector<float>(static_cast<size_t>(s.T * s.d)));
  for (int64_t hk = 0; hk < s.Hkv; ++hk) r.kv->read_keys(il, hk, 0, s.T, keys[static_cast<size_t>(hk)].data());
  Tally tally;
  for (size_t c = 0; c < r.sel.size(); ++c) {
    const Selection& sel = r.sel[c];
    const int64_t t0 = r.chunk_t0[c];
    if (sel.n > 1) {  // prefill: dense
      for (int64_t t = 0; t < sel.n; ++t)
        for (int64_t h = 0; h < s.H; ++h) {
          const auto& k = sel.keys[static_cast<size_t>(t * s.H + h)];
          bool dense = static_cast<int64_t>(k.size()) == t0 + t + 1;
          for (size_t j = 0; dense && j < k.size(); ++j) dense = k[j].seq_index == static_cast<int32_t>(j);
          EXPECT_TRUE(dense) << spec << " prefill row " << t0 + t << " head " << h << " not dense";
        }
      continue;
    }
    const int64_t L = t0 + 1;
    std::vector<int32_t> first_pages;
    for (int64_t h = 0; h < s.H; ++h) {
      const auto q = rotate(s.qt(t0, h), s.d, rt, s.pos[static_cast<size_t>(t0)]);
      const QuestChoice oc = quest_oracle(keys[static_cast<size_t>(h / g)].data(), L, s.d, q, budget, page);
      expect_choice(sel.keys[static_cast<size_t>(h)], oc, L, page, strict, tally,
                    spec + " token " + std::to_string(t0) + " head " + std::to_string(h));
      if (h % g == 0) first_pages = oc.pages;
      else tally.heads_differ += oc.pages != first_pages;
    }
  }
  return tally;
}

TEST(QuestPaper, DecodeSelectionEqualsOracle) {
  struct Case {
    int64_t ratio, d, block, page, budget, T, prefill, chunk;
  };
  // GQA 1..8, head_dim 64/128, pages 7..32 (partial last pages at most steps), budgets below
  // 3 pages (the minimum of 3), not a multiple of the page, and above L (then K = L / page of
  // ceil(L / page) pages, as the official code's token_budget = min(kv_seq_len, budget) gives).
  const Case cases[] = {
      {1, 64, 16, 16, 64, 300, 200, 64},  {4, 64, 32, 8, 40, 333, 150, 37},   {2, 128, 64, 32, 100, 400, 129, 64},
      {8, 64, 16, 16, 16, 260, 100, 50},  {4, 64, 16, 16, 512, 240, 120, 64}, {2, 64, 16, 7, 50, 200, 64, 64},
  };
  uint32_t seed = 500;
  int64_t checked = 0, near = 0;
  for (const auto& cs : cases) {
    Seq s(cs.T, 2 * cs.ratio, 2, cs.d, cs.d, seed, 1.0f);
    const RopeTable rt = test_rope(cs.d, seed % 2 == 0);
    ++seed;
    const std::string spec = "quest:budget=" + std::to_string(cs.budget) + ",page=" + std::to_string(cs.page) +
                             ",dense_layers=0";
    const Tally t = check_run(s, rt, cs.block, spec, cs.budget, cs.page, cs.prefill, cs.chunk);
    checked += t.checked;
    near += t.near_ties;
    if (cs.ratio > 1) {
      EXPECT_GT(t.heads_differ, 0) << spec << ": the heads of a group must choose on their own";
    }
  }
  EXPECT_GT(checked, 5000);
  EXPECT_LE(near * 200, checked) << near << " near-ties of " << checked;
}

TEST(QuestPaper, SplitDecodingChoosesTheSamePages) {
  // split=32: the chosen pages of a KV head run as several split-K units on the threads.
  Seq s(300, 8, 2, 64, 64, 77, 1.0f);
  const RopeTable rt = test_rope(64, true);
  const Tally t = check_run(s, rt, 16, "quest:budget=64,page=8,dense_layers=0,split=32", 64, 8, 200, 64);
  EXPECT_EQ(t.checked, 100 * 8);
  expect_decode_split_matches_unsplit(s, rt, kv_config(s, 16, rt), "quest:budget=64,page=8,dense_layers=0", 32);
}

TEST(QuestPaper, TiesGoToTheLowerPage) {
  // No rotation, 12 full pages of 8 in 4 patterns (page p is a copy of pattern p % 4), so
  // pages of one pattern tie exactly; the decoded token (page 12, keys 0) scores 0. K = 5: the
  // best pattern's 3 pages and the 2 lowest of the second's 3.
  Seq s(100, 4, 1, 64, 64, 91, 1.0f);
  for (int64_t t = 32; t < 96; ++t)
    std::copy(s.k.begin() + (t % 32) * s.d, s.k.begin() + (t % 32 + 1) * s.d, s.k.begin() + t * s.d);
  for (int64_t t = 96; t < 100; ++t) std::fill(s.k.begin() + t * s.d, s.k.begin() + (t + 1) * s.d, 0.0f);
  RopeTable rt = test_rope(64, true);
  for (auto& f : rt.inv_freq) f *= 0.0f;
  const Tally t = check_run(s, rt, 16, "quest:budget=40,page=8,dense_layers=0", 40, 8, 96, 32, 1, /*strict=*/true);
  EXPECT_EQ(t.checked, 4 * 4);
  // The tie straddles the threshold for every head: the check above exercised the rule.
  std::vector<float> keys(static_cast<size_t>(97 * s.d));
  std::copy(s.k.begin(), s.k.begin() + 97 * s.d, keys.begin());
  for (int64_t h = 0; h < s.H; ++h) {
    const auto q = rotate(s.qt(96, h), s.d, rt, 96);
    const QuestChoice oc = quest_oracle(keys.data(), 97, s.d, q, 40, 8);
    double thr = INFINITY;
    for (int32_t p : oc.pages) thr = std::min(thr, oc.score[static_cast<size_t>(p)]);
    int64_t tied = 0;
    for (double u : oc.score) tied += u == thr;
    EXPECT_EQ(tied, 3) << h;  // 3 pages tie at the K-th score, not all taken
  }
}

TEST(QuestPaper, FirstLayersDenseThenSparse) {
  Seq s(200, 4, 2, 64, 64, 33, 1.0f);
  const RopeTable rt = test_rope(64, false);
  // The default dense_layers=2: the second of two layers attends every key when decoding.
  const auto dense = run_seq(s, "quest:budget=32,page=8", kv_config(s, 16, rt, 2), {150, 1}, true);
  for (size_t c = 0; c < dense.sel.size(); ++c)
    for (int64_t t = 0; t < dense.sel[c].n; ++t)
      for (int64_t h = 0; h < s.H; ++h)
        EXPECT_EQ(static_cast<int64_t>(dense.sel[c].keys[static_cast<size_t>(t * s.H + h)].size()),
                  dense.chunk_t0[c] + t + 1);
  // dense_layers=1: the second layer is Quest's.
  const Tally t = check_run(s, rt, 16, "quest:budget=32,page=8,dense_layers=1", 32, 8, 150, 50, 2);
  EXPECT_EQ(t.checked, 50 * 4);
}

TEST(QuestPaper, FastVariantIsSparseInPrefillAndSharesPages) {
  // quest_fast keeps the project's faster choices: prefill rows past the budget attend fewer
  // keys than they see, and (share=1) the heads of a GQA group attend the same keys.
  Seq s(400, 8, 2, 64, 64, 12, 1.0f);
  const RopeTable rt = test_rope(64, true);
  const auto r = run_seq(s, "quest_fast:budget=64,page=16,dense_layers=0", kv_config(s, 16, rt), {64}, true);
  int64_t sparse_rows = 0;
  for (size_t c = 0; c < r.sel.size(); ++c)
    for (int64_t t = 0; t < r.sel[c].n; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        const auto& k = r.sel[c].keys[static_cast<size_t>(t * s.H + h)];
        sparse_rows += static_cast<int64_t>(k.size()) < r.chunk_t0[c] + t + 1;
        if (h % 4) {
          const auto& k0 = r.sel[c].keys[static_cast<size_t>(t * s.H + h - h % 4)];
          std::set<int32_t> a, b;
          for (const auto& x : k) a.insert(x.seq_index);
          for (const auto& x : k0) b.insert(x.seq_index);
          EXPECT_EQ(a, b);
        }
      }
  EXPECT_GT(sparse_rows, 0);
}

TEST(QuestPaper, TruncateRebuildsBoundsAbove) {
  // Decode A, truncate to 93 tokens (inside page 11 of 8), continue with B (A with other
  // tokens from 93 on): the bits of a fresh run of B.
  Seq a(240, 4, 2, 64, 64, 41, 1.0f), b = a;
  Seq other(240, 4, 2, 64, 64, 42, 1.0f);
  const int64_t cut = 93;
  std::copy(other.q.begin() + cut * a.H * a.d, other.q.end(), b.q.begin() + cut * a.H * a.d);
  std::copy(other.k.begin() + cut * a.Hkv * a.d, other.k.end(), b.k.begin() + cut * a.Hkv * a.d);
  std::copy(other.v.begin() + cut * a.Hkv * a.dv, other.v.end(), b.v.begin() + cut * a.Hkv * a.dv);
  const RopeTable rt = test_rope(64, true);
  const std::string spec = "quest:budget=32,page=8,dense_layers=0";
  std::vector<int64_t> chunks = {50};
  for (int i = 0; i < 190; ++i) chunks.push_back(1);
  auto r = run_seq(a, spec, kv_config(a, 16, rt), chunks);
  r.kv->truncate(cut);
  continue_seq(r, b, cut, 1);
  const auto fresh = run_seq(b, spec, kv_config(b, 16, rt), chunks);
  const size_t from = static_cast<size_t>(cut * a.H * a.dv);
  EXPECT_EQ(max_abs_diff(std::vector<float>(r.out.begin() + from, r.out.end()),
                         std::vector<float>(fresh.out.begin() + from, fresh.out.end())), 0.0);
}

TEST(QuestPaper, SpecHasNoFastKeys) {
  AttnShape sh{1, 4, 2, 64, 64, 0.0f};
  auto q = make_attention_backend("quest", sh);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ((*q)->spec(), "quest:budget=2048,page=16,dense_layers=2");
  EXPECT_FALSE(make_attention_backend("quest:share=1", sh).has_value());
  auto f = make_attention_backend("quest_fast", sh);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ((*f)->spec(), "quest_fast:budget=2048,page=16,dense_layers=2,share=1");
}

}  // namespace
}  // namespace lc::test
