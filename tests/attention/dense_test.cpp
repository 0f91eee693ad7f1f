// Dense and naive attention over the paged cache against oracles that never use the cache:
// kernels::ref::attention_causal on contiguous data, and the double-precision oracle on the
// test's own pre-RoPE vectors.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <string>

#include "kernels/attention.h"
#include "run_util.h"

namespace lc::test {
namespace {

struct GridCase {
  int64_t ratio, d, T, block;
  bool neox;
};

TEST(AttentionDense, GridAgainstNaiveAndOracle) {
  const GridCase cases[] = {
      {1, 64, 1, 16, false},   {2, 64, 37, 16, true},   {4, 128, 100, 64, false}, {8, 64, 300, 32, true},
      {1, 128, 520, 256, true}, {2, 128, 777, 16, false}, {4, 64, 1500, 128, true}, {8, 128, 130, 7, false},
      {2, 64, 3000, 64, false},
  };
  uint32_t seed = 1;
  for (const auto& c : cases) {
    const int64_t Hkv = c.T > 1000 ? 1 : 2;
    Seq s(c.T, Hkv * c.ratio, Hkv, c.d, c.d, seed++);
    const RopeTable rt = test_rope(c.d, c.neox);
    const auto cfg = kv_config(s, c.block, rt);
    const auto dense = run_seq(s, "dense", cfg, {64, 7, 1});
    const auto oracle = full_oracle(s, rt);
    EXPECT_LT(max_abs_diff(dense.out, oracle), 2e-4) << "ratio " << c.ratio << " d " << c.d << " T " << c.T;
    if (c.T <= 800) {
      const auto naive = run_seq(s, "naive", cfg, {64});
      EXPECT_LT(max_abs_diff(naive.out, oracle), 2e-4) << "naive T " << c.T;
      EXPECT_LT(max_abs_diff(dense.out, naive.out), 2e-4) << "dense vs naive T " << c.T;
    }
  }
}

TEST(AttentionDense, PagedEqualsContiguousReference) {
  for (int64_t block : {16, 48, 256}) {
    Seq s(400, 8, 2, 64, 64, 11);
    const RopeTable rt = test_rope(64, true);
    const auto dense = run_seq(s, "dense", kv_config(s, block, rt), {400});
    // The same data, contiguous, rotated by the test: kernels::ref::attention_causal.
    std::vector<float> q = s.q, k(static_cast<size_t>(s.Hkv * s.T * s.d)), v(static_cast<size_t>(s.Hkv * s.T * s.dv));
    rt.apply(q.data(), s.T, s.H, s.d, s.pos.data());
    std::vector<float> kr = s.k;
    rt.apply(kr.data(), s.T, s.Hkv, s.d, s.pos.data());
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t h = 0; h < s.Hkv; ++h) {
        std::memcpy(&k[static_cast<size_t>((h * s.T + t) * s.d)], &kr[static_cast<size_t>((t * s.Hkv + h) * s.d)], s.d * 4);
        std::memcpy(&v[static_cast<size_t>((h * s.T + t) * s.dv)], s.vt(t, h), s.dv * 4);
      }
    kernels::AttnShape as;
    as.n_tokens = s.T;
    as.n_head = s.H;
    as.n_head_kv = s.Hkv;
    as.head_dim = s.d;
    as.head_dim_v = s.dv;
    as.kv_stride = s.T;
    as.n_past = 0;
    as.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
    std::vector<float> ref(static_cast<size_t>(s.T * s.H * s.dv));
    kernels::ref::attention_causal(as, q.data(), k.data(), v.data(), ref.data());
    EXPECT_LT(max_abs_diff(dense.out, ref), 1e-4) << "block " << block;
  }
}

TEST(AttentionDense, ChunkSizeDoesNotChangeResults) {
  Seq s(333, 8, 2, 64, 64, 5);
  const RopeTable rt = test_rope(64, false);
  const auto cfg = kv_config(s, 32, rt);
  const auto a = run_seq(s, "dense", cfg, {1});
  const auto b = run_seq(s, "dense", cfg, {7});
  const auto c = run_seq(s, "dense", cfg, {64});
  // Rows are computed independently over the same spans: identical, not just close.
  EXPECT_EQ(max_abs_diff(a.out, b.out), 0.0);
  EXPECT_EQ(max_abs_diff(a.out, c.out), 0.0);
}

TEST(AttentionDense, SplitKIsBitIdenticalAndExact) {
  // split=64: one decoded token (2 tiles on 2 threads) runs split-K over 64-token segments;
  // chunks of 64 tokens make enough tiles to run unsplit. Same segments, same merge order:
  // identical bits; and both equal the double-precision oracle.
  Seq s(333, 8, 2, 64, 64, 15);
  const RopeTable rt = test_rope(64, true);
  for (int64_t block : {16, 32}) {
    const auto cfg = kv_config(s, block, rt);
    const auto one = run_seq(s, "dense:split=64", cfg, {1});
    const auto big = run_seq(s, "dense:split=64", cfg, {64});
    const auto odd = run_seq(s, "dense:split=64", cfg, {7, 1});
    EXPECT_EQ(max_abs_diff(one.out, big.out), 0.0) << "block " << block;
    EXPECT_EQ(max_abs_diff(one.out, odd.out), 0.0) << "block " << block;
    EXPECT_LT(max_abs_diff(one.out, full_oracle(s, rt)), 2e-4) << "block " << block;
  }
}

// keep_row_lse: the dense backend hands out each row's log-sum-exp over every token it saw
// (H2O's observer normalises with it), for prefill tiles and for split-K decode steps alike,
// equal to the double-precision value; a sparse backend, which sees a subset, hands out none.
TEST(AttentionDense, RowLseIsTheFullSoftmaxLogSumExp) {
  Seq s(300, 8, 2, 64, 64, 21);
  const RopeTable rt = test_rope(64, true);
  const auto cfg = kv_config(s, 32, rt);
  auto kv = KvCache::create(cfg);
  ASSERT_TRUE(kv.has_value());
  auto be = make_attention_backend("dense:split=64", shape_of(s));
  ASSERT_TRUE(be.has_value());
  ASSERT_TRUE((*be)->attach(**kv).is_ok());
  EXPECT_EQ((*be)->row_lse(), nullptr);
  (*be)->keep_row_lse(true);
  const double scale = 1.0 / std::sqrt(64.0);
  std::vector<float> out;
  double worst = 0;
  for (int64_t t0 = 0; t0 < s.T;) {
    const int64_t n = t0 < 256 ? 64 : 1;  // prefill tiles, then decode steps (split-K)
    out.assign(static_cast<size_t>(n * s.H * s.dv), 0.0f);
    ASSERT_TRUE((*kv)->append(0, n, s.kt(t0, 0), s.vt(t0, 0), s.pos.data() + t0).is_ok());
    ASSERT_TRUE((*be)->forward(0, n, s.qt(t0, 0), s.pos.data() + t0, **kv, out.data(), test_pool()).is_ok());
    const float* lse = (*be)->row_lse();
    ASSERT_NE(lse, nullptr);
    for (int64_t t = t0; t < t0 + n; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        const auto qr = rotate(s.qt(t, h), s.d, rt, s.pos[t]);
        std::vector<double> sc;
        for (int64_t j = 0; j <= t; ++j) {
          const auto kr = rotate(s.kt(j, h / 4), s.d, rt, s.pos[j]);
          double a = 0;
          for (int64_t c = 0; c < s.d; ++c) a += qr[static_cast<size_t>(c)] * kr[static_cast<size_t>(c)];
          sc.push_back(a * scale);
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        worst = std::max(worst, std::abs(static_cast<double>(lse[(t - t0) * s.H + h]) - (mx + std::log(sum))));
      }
    t0 += n;
  }
  EXPECT_LT(worst, 1e-4);
  auto quest = make_attention_backend("quest:budget=64,page=16,dense_layers=0", shape_of(s));
  ASSERT_TRUE(quest.has_value());
  (*quest)->keep_row_lse(true);
  EXPECT_EQ((*quest)->row_lse(), nullptr);
}

TEST(AttentionDense, NanInUnusedSlotsChangesNothing) {
  Seq s(150, 4, 2, 64, 64, 6);
  const RopeTable rt = test_rope(64, true);
  for (const char* spec : {"dense", "naive", "quest:budget=64,page=16,dense_layers=0",
                           "quest_fast:budget=64,page=16,dense_layers=0", "streaming:sinks=4,window=40"}) {
    const auto cfg = kv_config(s, 32, rt);
    const auto a = run_seq(s, spec, cfg, {13, 1, 1, 1, 1, 1});  // quest: decoding is sparse
    const auto b = run_seq(s, spec, cfg, {13, 1, 1, 1, 1, 1}, false, /*poison=*/true);
    EXPECT_EQ(max_abs_diff(a.out, b.out), 0.0) << spec;
  }
}

TEST(AttentionDense, KvTypesWithinRoundingOfF32) {
  Seq s(300, 8, 2, 64, 64, 8);
  const RopeTable rt = test_rope(64, true);
  const auto oracle = full_oracle(s, rt);
  struct T {
    DType k, v;
    double tol;
  } types[] = {{DType::F32, DType::F32, 2e-4}, {DType::F16, DType::F16, 3e-3}, {DType::BF16, DType::BF16, 3e-2},
               {DType::Q8_0, DType::Q8_0, 4e-2}, {DType::F16, DType::Q8_0, 4e-2}, {DType::BF16, DType::F32, 3e-2}};
  for (const auto& t : types) {
    auto cfg = kv_config(s, 16, rt);
    cfg.type_k = t.k;
    cfg.type_v = t.v;
    const auto r = run_seq(s, "dense", cfg, {50});
    const double err = max_abs_diff(r.out, oracle);
    EXPECT_LT(err, t.tol) << dtype_name(t.k) << "/" << dtype_name(t.v);
    const auto nv = run_seq(s, "naive", cfg, {50});  // same rounded data, exact math
    EXPECT_LT(max_abs_diff(r.out, nv.out), 2e-4) << dtype_name(t.k) << "/" << dtype_name(t.v);
    // Token by token (decoding: a tile of one token's GQA group reads f16 blocks in place).
    const auto d1 = run_seq(s, "dense", cfg, {1});
    EXPECT_LT(max_abs_diff(d1.out, nv.out), 2e-4) << "decode " << dtype_name(t.k) << "/" << dtype_name(t.v);
  }
}

TEST(AttentionDense, SpillGivesIdenticalResultsAndLeavesNoFile) {
  Seq s(600, 4, 2, 64, 64, 9);
  const RopeTable rt = test_rope(64, true);
  auto cfg = kv_config(s, 16, rt, 2);
  const auto base = run_seq(s, "dense", cfg, {100});
  char tmpl[] = "/tmp/lc_spill_testXXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto scfg = cfg;
  scfg.spill_dir = dir;
  scfg.budget_bytes = 64 * 1024;  // far below the ~1.2 MB of data
  {
    auto sp = run_seq(s, "dense", scfg, {100});
    EXPECT_EQ(max_abs_diff(base.out, sp.out), 0.0);
    EXPECT_GT(sp.kv->memory().spilled_bytes, 0u);
    EXPECT_LE(sp.kv->memory().resident_bytes, 64u * 1024);
  }
  // The spill file is gone (it was unlinked at creation; the descriptor is closed now).
  int files = 0;
  if (DIR* dp = opendir(dir.c_str())) {
    while (dirent* e = readdir(dp)) files += e->d_name[0] != '.';
    closedir(dp);
  }
  EXPECT_EQ(files, 0);
  rmdir(dir.c_str());
}

TEST(AttentionDense, DynamicRopeReRotatesCachedKeys) {
  // The table changes with the length (dynamic NTK style): the attention of the last chunk
  // must equal attention with every key rotated by the final table.
  Seq s(200, 4, 2, 64, 64, 12);
  const RopeTable small = test_rope(64, true, 10000.0f), large = test_rope(64, true, 40000.0f, 1.1f);
  auto cfg = kv_config(s, 16, small);
  cfg.rope_provider = [&](int64_t n_ctx) { return n_ctx <= 120 ? small : large; };
  const auto r = run_seq(s, "dense", cfg, {60}, /*record=*/true);
  const auto& sel = r.sel.back();  // the chunk after the switch: keys at real positions
  const float scale = 1.0f / std::sqrt(64.0f);
  double worst = 0;
  for (int64_t t = 0; t < sel.n; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t tg = r.chunk_t0.back() + t;
      const auto o = oracle_row(s, large, scale, tg, h, sel.keys[static_cast<size_t>(t * s.H + h)]);
      EXPECT_EQ(static_cast<int64_t>(sel.keys[static_cast<size_t>(t * s.H + h)].size()), tg + 1);
      for (int64_t i = 0; i < s.dv; ++i)
        worst = std::max(worst, std::abs(o[static_cast<size_t>(i)] - r.out[static_cast<size_t>((tg * s.H + h) * s.dv + i)]));
    }
  EXPECT_LT(worst, 2e-4);
}

TEST(AttentionDense, DynamicRopeAppendKeepsEachKeysTable) {
  // rope_rerotate = false (dynamic-ntk:cache=append, transformers' cache): a key keeps the table
  // of the length reached when it was appended; queries use the current one. Chunks of 60: keys
  // 0..119 were appended under `small` (lengths 60 and 120), keys 120.. under `large`.
  Seq s(200, 4, 2, 64, 64, 13);
  const RopeTable small = test_rope(64, true, 10000.0f), large = test_rope(64, true, 40000.0f, 1.1f);
  auto cfg = kv_config(s, 16, small);
  cfg.rope_provider = [&](int64_t n_ctx) { return n_ctx <= 120 ? small : large; };
  cfg.rope_rerotate = false;
  const auto r = run_seq(s, "dense", cfg, {60}, /*record=*/true);
  EXPECT_TRUE(r.kv->mixed_rope());
  const auto& sel = r.sel.back();
  const float scale = 1.0f / std::sqrt(64.0f);
  const int64_t g = s.H / s.Hkv;
  double worst = 0;
  for (int64_t t = 0; t < sel.n; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t tg = r.chunk_t0.back() + t;
      const auto q = rotate(s.qt(tg, h), s.d, large, static_cast<int32_t>(tg));
      std::vector<double> sc(static_cast<size_t>(tg + 1));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= tg; ++j) {
        const auto k = rotate(s.kt(j, h / g), s.d, j < 120 ? small : large, static_cast<int32_t>(j));
        double a = 0;
        for (int64_t c = 0; c < s.d; ++c) a += q[static_cast<size_t>(c)] * k[static_cast<size_t>(c)];
        sc[static_cast<size_t>(j)] = a * scale;
        mx = std::max(mx, sc[static_cast<size_t>(j)]);
      }
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < s.dv; ++i) {
        double o = 0;
        for (int64_t j = 0; j <= tg; ++j) o += sc[static_cast<size_t>(j)] * s.vt(j, h / g)[i];
        worst = std::max(worst, std::abs(o / sum - r.out[static_cast<size_t>((tg * s.H + h) * s.dv + i)]));
      }
    }
  EXPECT_LT(worst, 2e-4);
  // Moving keys with one table would be wrong now: refused.
  EXPECT_FALSE(r.kv->shift_positions(0, 0, 0, 10, 5).is_ok());
  // The length hint: a chunk is rotated with the table of the length its call reaches.
  auto hinted = KvCache::create(cfg);
  ASSERT_TRUE(hinted.has_value());
  (*hinted)->set_rope_length_hint(200);
  ASSERT_TRUE((*hinted)->append(0, 60, s.k.data(), s.v.data(), s.pos.data()).is_ok());
  EXPECT_FALSE((*hinted)->mixed_rope());
  std::vector<float> got(static_cast<size_t>(s.d));
  (*hinted)->read_keys(0, 0, 7, 1, got.data());
  const auto want = rotate(s.kt(7, 0), s.d, large, 7);
  for (int64_t c = 0; c < s.d; ++c) EXPECT_NEAR(got[static_cast<size_t>(c)], want[static_cast<size_t>(c)], 1e-5);
}

TEST(AttentionRegistry, SpecErrorsNameMethodAndKey) {
  AttnShape sh{1, 4, 2, 64, 64, 0.0f};
  auto bad = make_attention_backend("qest:budget=10", sh);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("unknown attention method 'qest'"), std::string::npos);
  EXPECT_NE(bad.error().message.find("quest"), std::string::npos);
  auto key = make_attention_backend("quest:bugdet=10", sh);
  ASSERT_FALSE(key.has_value());
  EXPECT_NE(key.error().message.find("'bugdet'"), std::string::npos);
  EXPECT_NE(key.error().message.find("budget"), std::string::npos);
  auto val = make_attention_backend("streaming:window=abc", sh);
  ASSERT_FALSE(val.has_value());
  EXPECT_NE(val.error().message.find("window"), std::string::npos);
  auto ok = make_attention_backend("quest:budget=512,page=16", sh);
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  EXPECT_EQ((*ok)->spec(), "quest:budget=512,page=16,dense_layers=2");
  auto fast = make_attention_backend("quest_fast:budget=512,page=16", sh);
  ASSERT_TRUE(fast.has_value()) << fast.error().message;
  EXPECT_EQ((*fast)->spec(), "quest_fast:budget=512,page=16,dense_layers=2,share=1");
  EXPECT_TRUE(make_attention_backend("", sh).has_value());  // the default: dense
}

}  // namespace
}  // namespace lc::test
