// DSSA and LycheeDecode against the oracle restricted to their selection, their dense
// limits, and the retrieval-head calibration round trip.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <string>

#include "attention/lychee.h"
#include "run_util.h"

namespace lc::test {
namespace {

struct Shape {
  int64_t ratio, d, block;
};
const Shape kShapes[] = {{1, 64, 16}, {2, 128, 64}, {4, 64, 32}, {8, 64, 16}};

TEST(AttentionDssa, AgainstNaiveOnItsSelection) {
  uint32_t seed = 400;
  for (const auto& sh : kShapes) {
    Seq s(800, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
    const RopeTable rt = test_rope(sh.d, false);
    const auto r = run_seq(s, "dssa:switch=300,block=32,kernel=16,stride=8,topk=4,sinks=32,local=64",
                           kv_config(s, sh.block, rt), {64, 7, 1}, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << "ratio " << sh.ratio;
    size_t most = 0;  // above the switch: sinks + top-k + local (+ alignment)
    for (size_t c = 0; c < r.sel.size(); ++c)
      for (int64_t t = 0; t < r.sel[c].n; ++t)
        if (r.chunk_t0[c] + t + 1 > 300)
          for (int64_t h = 0; h < s.H; ++h) most = std::max(most, r.sel[c].keys[static_cast<size_t>(t * s.H + h)].size());
    EXPECT_LE(most, 32u + 4 * 32 + 64 + 32);
    EXPECT_GT(most, 0u);
    // Selection is shared by the GQA group: heads of a group attend the same tokens.
    const auto& last = r.sel.back();
    for (int64_t t = 0; t < last.n; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        const auto& a = last.keys[static_cast<size_t>(t * s.H + h)];
        const auto& b = last.keys[static_cast<size_t>(t * s.H + (h / sh.ratio) * sh.ratio)];
        ASSERT_EQ(a.size(), b.size());
        for (size_t j = 0; j < a.size(); ++j) EXPECT_EQ(a[j].seq_index, b[j].seq_index);
      }
  }
}

TEST(AttentionDssa, DenseBelowSwitchAndWithFullBudget) {
  Seq s(400, 8, 2, 64, 64, 41);
  const RopeTable rt = test_rope(64, true);
  const auto oracle = full_oracle(s, rt);
  const auto below = run_seq(s, "dssa:switch=1000", kv_config(s, 16, rt), {50});
  EXPECT_LT(max_abs_diff(below.out, oracle), 2e-4);
  const auto full = run_seq(s, "dssa:switch=10,block=32,topk=100,local=32,sinks=32", kv_config(s, 16, rt), {50});
  EXPECT_LT(max_abs_diff(full.out, oracle), 2e-4);
}

TEST(AttentionLychee, AgainstNaiveOnItsSelection) {
  uint32_t seed = 500;
  for (const auto& sh : kShapes) {
    Seq s(700, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
    const RopeTable rt = test_rope(sh.d, true);
    const auto r = run_seq(s, "lychee:budget=128,block=32,sinks=32,local=64,retrieval=2",
                           kv_config(s, sh.block, rt), {64, 7}, true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << "ratio " << sh.ratio;
    const auto& last = r.sel.back();
    const int64_t t = last.n - 1, tg = r.chunk_t0.back() + t;
    // Retrieval heads (0, 1) attend everything; the others a subset, the same one.
    EXPECT_EQ(static_cast<int64_t>(last.keys[static_cast<size_t>(t * s.H)].size()), tg + 1);
    if (s.H > 2) {
      EXPECT_LE(last.keys[static_cast<size_t>(t * s.H + 2)].size(), 32u + 128 + 64 + 32);
      EXPECT_EQ(last.keys[static_cast<size_t>(t * s.H + 2)].size(), last.keys[static_cast<size_t>(t * s.H + s.H - 1)].size());
    }
  }
}

// share=head: every query head keeps its own choice of blocks from layer to layer. Two layers
// with the same q/k/v: in layer 0 no head has chosen yet, so all attend fully and choose from
// their own mass; in layer 1 head 0 (the retrieval head) chooses again, and every other head
// attends the blocks it chose itself in layer 0: the top 4 blocks by its own attention mass,
// computed here in double precision.
TEST(AttentionLychee, HeadSharingCarriesEachHeadsChoiceAcrossLayers) {
  Seq s(600, 8, 2, 64, 64, 58);
  const RopeTable rt = test_rope(64, true);
  const int64_t block = 32, init_end = 32, local = 64, budget = 128, k_blocks = budget / block;
  const auto r = run_seq(s, "lychee:budget=128,block=32,sinks=32,local=64,retrieval=1,share=head",
                         kv_config(s, 16, rt, 2), {64, 7}, true);
  EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  int64_t checked = 0, differs_from_head0 = 0;
  for (size_t c = 0; c < r.sel.size(); ++c)
    for (int64_t t = 0; t < r.sel[c].n; ++t) {
      const int64_t tg = r.chunk_t0[c] + t, vis = tg + 1;
      const int64_t lb = std::max(init_end, (vis - local) / block * block), b0 = init_end / block, b1 = lb / block;
      if (vis <= budget || b1 - b0 <= k_blocks) continue;
      std::vector<std::vector<int64_t>> own(static_cast<size_t>(s.H));
      for (int64_t h = 0; h < s.H; ++h) {
        const int64_t hk = h / (s.H / s.Hkv);
        const auto qr = rotate(s.qt(tg, h), s.d, rt, static_cast<int32_t>(tg));
        std::vector<double> sc(static_cast<size_t>(vis));
        double mx = -INFINITY;
        for (int64_t j = 0; j < vis; ++j) {
          const auto kr = rotate(s.kt(j, hk), s.d, rt, static_cast<int32_t>(j));
          double a = 0;
          for (int64_t i = 0; i < s.d; ++i) a += qr[static_cast<size_t>(i)] * kr[static_cast<size_t>(i)];
          sc[static_cast<size_t>(j)] = a * scale;
          mx = std::max(mx, a * scale);
        }
        std::vector<std::pair<double, int64_t>> mass;
        for (int64_t bb = b0; bb < b1; ++bb) {
          double m = 0;
          for (int64_t j = bb * block; j < (bb + 1) * block; ++j) m += std::exp(sc[static_cast<size_t>(j)] - mx);
          mass.push_back({-m, bb});
        }
        std::sort(mass.begin(), mass.end());
        for (int64_t i = 0; i < k_blocks; ++i) own[static_cast<size_t>(h)].push_back(mass[static_cast<size_t>(i)].second);
        std::sort(own[static_cast<size_t>(h)].begin(), own[static_cast<size_t>(h)].end());
      }
      const auto& keys0 = r.sel[c].keys[static_cast<size_t>(t * s.H)];
      EXPECT_EQ(static_cast<int64_t>(keys0.size()), vis) << "the retrieval head attends every token";
      for (int64_t h = 1; h < s.H; ++h) {
        std::set<int64_t> want;
        for (int64_t j = 0; j < init_end; ++j) want.insert(j);
        for (int64_t bb : own[static_cast<size_t>(h)])
          for (int64_t j = bb * block; j < (bb + 1) * block; ++j) want.insert(j);
        for (int64_t j = std::min(lb, vis); j < vis; ++j) want.insert(j);
        std::set<int64_t> got;
        for (const auto& k : r.sel[c].keys[static_cast<size_t>(t * s.H + h)]) got.insert(k.seq_index);
        EXPECT_EQ(got, want) << "token " << tg << " head " << h;
        ++checked;
        differs_from_head0 += own[static_cast<size_t>(h)] != own[0];
      }
    }
  EXPECT_GT(checked, 100);
  EXPECT_GT(differs_from_head0, checked / 2) << "the heads' own choices must differ for the test to tell them apart";
}

TEST(AttentionLychee, DecodeSplitMatchesUnsplit) {
  // Decoding (chunks of 1) with split=64 runs the retrieval heads split-K over 64-token
  // segments: the same blocks are chosen as unsplit, the output is within float rounding of
  // it, and it is exact on its selection. One retrieval head: a block's mass is then computed
  // from the same spans both ways and only the common normaliser differs in rounding, so the
  // block order (the choice) cannot differ.
  Seq s(500, 8, 2, 64, 64, 57);
  const RopeTable rt = test_rope(64, true);
  const auto cfg = kv_config(s, 16, rt);
  expect_decode_split_matches_unsplit(s, rt, cfg, "lychee:budget=128,block=32,sinks=32,local=64,retrieval=1", 64);
}

TEST(AttentionLychee, FullBudgetEqualsDense) {
  Seq s(300, 8, 2, 64, 64, 51);
  const RopeTable rt = test_rope(64, false);
  const auto r = run_seq(s, "lychee:budget=4096,block=32,retrieval=1", kv_config(s, 16, rt), {40});
  EXPECT_LT(max_abs_diff(r.out, full_oracle(s, rt)), 2e-4);
}

TEST(AttentionLychee, CalibrationPicksFarLookingHeadsAndRoundTrips) {
  // Head 3's queries align with one early key: it puts its mass far away.
  Seq s(300, 4, 1, 64, 64, 52, 0.2f);
  RopeTable rt = test_rope(64, true);
  for (auto& f : rt.inv_freq) f = 0.0f;  // position-free scores make the construction exact
  for (int64_t c = 0; c < s.d; ++c) s.k[static_cast<size_t>(5 * s.d + c)] = c == 0 ? 20.0f : 0.0f;
  for (int64_t t = 0; t < s.T; ++t) s.q[static_cast<size_t>((t * s.H + 3) * s.d)] = 20.0f;
  auto kv = KvCache::create(kv_config(s, 16, rt));
  ASSERT_TRUE(kv.has_value());
  auto cal = make_lychee_calibrator(shape_of(s), 100);
  ASSERT_TRUE(cal.has_value());
  std::vector<float> out(static_cast<size_t>(s.T * s.H * s.dv));
  ASSERT_TRUE((*kv)->append(0, s.T, s.k.data(), s.v.data(), s.pos.data()).is_ok());
  ASSERT_TRUE((*cal)->forward(0, s.T, s.q.data(), s.pos.data(), **kv, out.data(), test_pool()).is_ok());
  // The calibrator's attention is exact.
  EXPECT_LT(max_abs_diff(out, full_oracle(s, rt)), 2e-4);
  const auto& st = (*cal)->stats();
  EXPECT_EQ(st.n_rows[3], s.T - 100);
  EXPECT_GT(st.mean(0, 3), 0.9);
  const RetrievalHeads rh = pick_retrieval_heads(st, 1);
  ASSERT_EQ(rh.heads[0], std::vector<int32_t>{3});
  EXPECT_EQ(pick_retrieval_heads_total(st, 1).heads[0], std::vector<int32_t>{3});
  EXPECT_EQ(pick_retrieval_heads_total(st, 4).heads[0], (std::vector<int32_t>{0, 1, 2, 3}));
  const std::string path = "/tmp/lc_heads_" + std::to_string(getpid()) + ".txt";
  ASSERT_TRUE(save_retrieval_heads(path, rh).is_ok());
  auto back = load_retrieval_heads(path);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->heads, rh.heads);
  auto be = make_attention_backend("lychee:heads=" + path, shape_of(s));
  ASSERT_TRUE(be.has_value()) << be.error().message;
  EXPECT_NE((*be)->spec().find("heads=" + path), std::string::npos);
  EXPECT_EQ((*be)->spec().find("retrieval="), std::string::npos);  // the spec says which roles ran
  EXPECT_EQ((*be)->spec().find("share=head"), std::string::npos);  // every layer has a head: share=layer
  // A file that leaves a layer without retrieval heads (calibrate --total) defaults to
  // head-level sharing; share=layer still overrides it.
  const AttnShape two = shape_of(s, 2);
  RetrievalHeads sparse_file{2, s.H, {{3}, {}}};
  ASSERT_TRUE(save_retrieval_heads(path, sparse_file).is_ok());
  auto by_head = make_attention_backend("lychee:heads=" + path, two);
  ASSERT_TRUE(by_head.has_value()) << by_head.error().message;
  EXPECT_NE((*by_head)->spec().find("share=head"), std::string::npos) << (*by_head)->spec();
  auto by_layer = make_attention_backend("lychee:share=layer,heads=" + path, two);
  ASSERT_TRUE(by_layer.has_value());
  EXPECT_EQ((*by_layer)->spec().find("share=head"), std::string::npos);
  ASSERT_TRUE(save_retrieval_heads(path, rh).is_ok());
  // A file for another model is rejected by name.
  AttnShape other = shape_of(s, 2);
  auto mismatch = make_attention_backend("lychee:heads=" + path, other);
  ASSERT_FALSE(mismatch.has_value());
  EXPECT_NE(mismatch.error().message.find(path), std::string::npos);
  std::ofstream(path) << "longctx-retrieval-heads 1\nn_layer 1 n_head 4\nlayer 0: 9\n";
  auto bad = load_retrieval_heads(path);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("out of range"), std::string::npos);
  unlink(path.c_str());
}

TEST(AttentionLychee, NeedsItsHeadRolesNamed) {
  // Without a calibration file the heads' roles must be asked for (retrieval=N), and the spec
  // says which ran.
  AttnShape sh{1, 4, 2, 64, 64, 0.0f};
  auto bare = make_attention_backend("lychee", sh);
  ASSERT_FALSE(bare.has_value());
  EXPECT_NE(bare.error().message.find("needs heads=FILE"), std::string::npos) << bare.error().message;
  EXPECT_NE(bare.error().message.find("retrieval=N"), std::string::npos) << bare.error().message;
  auto named = make_attention_backend("lychee:retrieval=2", sh);
  ASSERT_TRUE(named.has_value()) << named.error().message;
  EXPECT_EQ((*named)->spec(), "lychee:budget=2048,block=64,sinks=64,local=256,retrieval=2");
}

}  // namespace
}  // namespace lc::test
