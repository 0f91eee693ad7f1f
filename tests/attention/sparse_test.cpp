// Sparse and streaming backends: each against the double-precision oracle restricted to
// exactly the tokens (and positions) the backend reports it attended; with a budget that
// covers everything, against full attention.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "attention/exec.h"
#include "attention/page_bounds.h"
#include "core/fp16.h"
#include "run_util.h"

namespace lc::test {
namespace {

struct Shape {
  int64_t ratio, d, block;
};
const Shape kShapes[] = {{1, 64, 16}, {2, 128, 64}, {4, 64, 32}, {8, 64, 16}};

TEST(AttentionSparse, QuestAgainstNaiveOnItsSelection) {
  // quest_fast: at most the budget per row, prefill included. quest (the paper's) is checked
  // page by page against its own oracle in quest_paper_test.cpp; here its output on whatever it
  // reports (dense prefill chunks of 64 and 7, sparse decoding).
  uint32_t seed = 100;
  for (const auto& sh : kShapes) {
    Seq s(700, 2 * sh.ratio, 2, sh.d, sh.d, seed++);
    const RopeTable rt = test_rope(sh.d, true);
    const auto r = run_seq(s, "quest_fast:budget=128,page=16,dense_layers=0", kv_config(s, sh.block, rt), {64, 1, 7},
                           true);
    EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4) << "ratio " << sh.ratio;
    for (const auto& sel : r.sel)
      for (const auto& keys : sel.keys) EXPECT_LE(keys.size(), 128u);
    const auto p = run_seq(s, "quest:budget=128,page=16,dense_layers=0", kv_config(s, sh.block, rt), {64, 1, 7}, true);
    EXPECT_LT(max_err_vs_selection(s, rt, p), 2e-4) << "ratio " << sh.ratio;
  }
}

TEST(AttentionSparse, QuestBoxBoundIsAnUpperBound) {
  // Random query boxes and key pages in a PageBounds store (tiles of 16 pages, 8-bit codes with
  // per-channel scales, rounded outward): each page's bound is >= q . k for every query of the box and every key
  // of the page, and equals the exact maximum over the stored bounds (computed in double) to
  // float rounding; a point query's bound equals Quest's sum_i max(q_i m_i, q_i M_i) in double
  // and its point box. Every query of a call of 1..9 mixed point and box queries, over any page
  // range, gets the value it gets alone, and the shared form is the largest of them.
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t d : {8, 13, 64}) {
    for (int trial = 0; trial < 6; ++trial) {
      const float scale = trial % 2 ? 1.0f : 37.0f;
      const int64_t n_pages = 1 + trial * 9;  // 1 .. 46: partial tiles, several tiles
      constexpr int kQ = 5, kK = 7;           // queries per box, keys per page
      std::vector<float> qs(static_cast<size_t>(kQ * d)), ks(static_cast<size_t>(n_pages * kK * d));
      for (auto& x : qs) x = nd(rng);
      for (auto& x : ks) x = nd(rng) * scale;
      std::vector<float> lo(d, INFINITY), hi(d, -INFINITY);
      for (int64_t c = 0; c < d; ++c)
        for (int j = 0; j < kQ; ++j) lo[c] = std::min(lo[c], qs[j * d + c]), hi[c] = std::max(hi[c], qs[j * d + c]);
      attn::PageBounds pb;
      pb.reset(d);
      pb.resize(n_pages);
      std::vector<float> mn(static_cast<size_t>(n_pages * d)), mx(mn.size());
      for (int64_t p = 0; p < n_pages; ++p) {
        ASSERT_TRUE(pb.set_rows(p, ks.data() + p * kK * d, kK));
        ASSERT_FALSE(pb.wide(p));
        for (int64_t c = 0; c < d; ++c) {
          float a = INFINITY, b = -INFINITY;
          for (int j = 0; j < kK; ++j) a = std::min(a, ks[(p * kK + j) * d + c]), b = std::max(b, ks[(p * kK + j) * d + c]);
          mn[static_cast<size_t>(p * d + c)] = a;
          mx[static_cast<size_t>(p * d + c)] = b;
        }
      }
      // Stored bounds are outward and within one code step of the exact ones: a step is 1/127
      // of the largest |bound| of the channel over the tile's 16 pages.
      for (int64_t p = 0; p < n_pages; ++p)
        for (int64_t c = 0; c < d; ++c) {
          double amax = 0;
          for (int64_t r = p / 16 * 16; r < std::min(n_pages, p / 16 * 16 + 16); ++r)
            amax = std::max({amax, std::fabs(double(mn[static_cast<size_t>(r * d + c)])),
                             std::fabs(double(mx[static_cast<size_t>(r * d + c)]))});
          const double step = amax / 127 * (1 + 1e-6);
          const double a = mn[static_cast<size_t>(p * d + c)], b = mx[static_cast<size_t>(p * d + c)];
          EXPECT_LE(pb.min(p, c), a);
          EXPECT_GE(pb.max(p, c), b);
          EXPECT_GT(pb.min(p, c), a - step) << p << " " << c;
          EXPECT_LT(pb.max(p, c), b + step) << p << " " << c;
        }
      const float* lop = lo.data();
      const float* hip = hi.data();
      std::vector<float> box(static_cast<size_t>(n_pages));
      pb.bounds(&lop, &hip, 1, 0, n_pages, box.data(), false);
      const double tol = 1e-5 * d * scale * 4;
      for (int64_t p = 0; p < n_pages; ++p) {
        double best = 0;  // the exact maximum over the two boxes, channel by channel, in double
        for (int64_t c = 0; c < d; ++c) {
          const double m = pb.min(p, c), M = pb.max(p, c);
          best += std::max({lo[c] * m, lo[c] * M, hi[c] * m, hi[c] * M});
        }
        EXPECT_NEAR(box[p], best, tol);
        for (int a = 0; a < kQ; ++a) {
          double quest = 0;  // Quest's bound of query a alone
          for (int64_t c = 0; c < d; ++c)
            quest += std::max(double(qs[a * d + c]) * pb.min(p, c), double(qs[a * d + c]) * pb.max(p, c));
          const float* qa = qs.data() + a * d;
          const float* none = nullptr;
          float point = 0, point_box = 0;
          pb.bounds(&qa, &none, 1, p, p + 1, &point, false);
          pb.bounds(&qa, &qa, 1, p, p + 1, &point_box, false);
          EXPECT_NEAR(point, quest, tol);
          EXPECT_NEAR(point_box, quest, tol);
          EXPECT_LE(point, box[p] + tol);
          for (int b = 0; b < kK; ++b) {
            double dotv = 0;
            for (int64_t c = 0; c < d; ++c) dotv += double(qa[c]) * ks[(p * kK + b) * d + c];
            EXPECT_GE(point + tol, dotv);
            EXPECT_GE(box[p] + tol, dotv);
          }
        }
      }
      // Groups of 1..9 queries (vector runs of four, a short last run), point and box mixed,
      // over page ranges that start and end inside tiles.
      for (int64_t nq = 1; nq <= 9; ++nq) {
        std::vector<const float*> l(static_cast<size_t>(nq)), h(static_cast<size_t>(nq));
        for (int64_t s = 0; s < nq; ++s) {
          l[static_cast<size_t>(s)] = s % 3 == 2 ? lo.data() : qs.data() + (s % 5) * d;
          h[static_cast<size_t>(s)] = s % 3 == 2 ? hi.data() : nullptr;
        }
        const int64_t p0 = (nq * 3) % n_pages, p1 = n_pages;
        std::vector<float> out(static_cast<size_t>((p1 - p0) * nq)), top(static_cast<size_t>(p1 - p0));
        pb.bounds(l.data(), h.data(), nq, p0, p1, out.data(), false);
        pb.bounds(l.data(), h.data(), nq, p0, p1, top.data(), true);
        for (int64_t p = p0; p < p1; ++p) {
          float m = -INFINITY;
          for (int64_t s = 0; s < nq; ++s) {
            float alone = 0;
            pb.bounds(&l[static_cast<size_t>(s)], &h[static_cast<size_t>(s)], 1, p, p + 1, &alone, false);
            EXPECT_EQ(out[static_cast<size_t>((p - p0) * nq + s)], alone) << nq << " " << s << " " << p;
            m = std::max(m, alone);
          }
          EXPECT_EQ(top[static_cast<size_t>(p - p0)], m);
        }
      }
    }
  }
  // A non-finite key makes its page wide, with bound +inf for every query; a NaN query's bound
  // is NaN. A key far beyond the others (1e6) is stored finite, and its tile-mates' bounds in
  // that channel grow by at most one code step (1e6 / 127).
  attn::PageBounds pb;
  pb.reset(8);
  pb.resize(4);
  std::vector<float> rows(16, 0.5f);
  ASSERT_TRUE(pb.set_rows(0, rows.data(), 2));
  rows[3] = INFINITY;
  EXPECT_FALSE(pb.set_rows(1, rows.data(), 2));
  EXPECT_TRUE(pb.wide(1));
  rows[3] = -2.0f;
  ASSERT_TRUE(pb.set_rows(2, rows.data(), 2));
  std::vector<float> q(8, 1.0f);
  const float* qp = q.data();
  const float* none = nullptr;
  float u[4];
  pb.bounds(&qp, &none, 1, 0, 3, u, false);
  const float step3 = 2.0f / 127 * (1 + 1e-6f);  // channel 3's code step: |-2| is its largest bound
  EXPECT_GE(u[0], 4.0f);
  EXPECT_LE(u[0], 4.0f + step3);
  EXPECT_EQ(u[1], INFINITY);
  EXPECT_GE(u[2], 4.0f);  // max over the page: 0.5 in channel 3 too
  EXPECT_LE(u[2], 4.0f + step3);
  q[5] = NAN;
  pb.bounds(&qp, &none, 1, 0, 1, u, false);
  EXPECT_TRUE(std::isnan(u[0]));
  q[5] = 1.0f;
  rows[3] = 1e6f;
  ASSERT_TRUE(pb.set_rows(3, rows.data(), 2));
  EXPECT_GE(pb.max(3, 3), 1e6f);
  EXPECT_LE(pb.max(3, 3), 1e6f * (1 + 1e-6f));
  pb.bounds(&qp, &none, 1, 0, 4, u, false);
  EXPECT_GE(u[0], 4.0f);
  EXPECT_LE(u[0], 4.0f + 1e6f / 127 * (1 + 1e-6f));
  EXPECT_GE(u[3], 1e6f);
  // Restarting inside the open tile re-sets from that page on; the pages below keep bounds.
  EXPECT_EQ(pb.restart(1), 1);
  pb.resize(2);
  ASSERT_TRUE(pb.set_rows(1, rows.data() + 8, 1));  // row 1: all 0.5
  pb.bounds(&qp, &none, 1, 0, 2, u, false);
  EXPECT_GE(u[0], 4.0f);
  EXPECT_GE(u[1], 4.0f);
  EXPECT_FALSE(pb.wide(1));
}

TEST(AttentionSparse, QuestPageBoundsBuiltIncrementally) {
  // Decoding re-sets the last, growing page after every token, and truncation restarts in the
  // middle of a tile or below it. Whatever the history, every stored bound must bound its
  // page's keys; and pages that only grew (the decoding pattern) must end exactly as a store
  // built once from the final keys.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t d = 24, page = 4, N = 40 * page + 3;
  std::vector<float> keys(static_cast<size_t>(N * d));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < d; ++c) keys[static_cast<size_t>(t * d + c)] = nd(rng) * (1.0f + 0.05f * t);  // grows
  auto n_pages = [&](int64_t n) { return (n + page - 1) / page; };
  auto rebuild = [&](attn::PageBounds& pb, int64_t n_full, int64_t n) {  // as Quest's update_bounds
    const int64_t from = pb.restart(n_full);
    pb.resize(n_pages(n));
    for (int64_t p = from; p < n_pages(n); ++p)
      pb.set_rows(p, keys.data() + p * page * d, std::min(page, n - p * page));
    return n / page;
  };
  auto check_bounds = [&](const attn::PageBounds& pb, int64_t n) {
    for (int64_t p = 0; p < n_pages(n); ++p)
      for (int64_t t = p * page; t < std::min(n, (p + 1) * page); ++t)
        for (int64_t c = 0; c < d; ++c) {
          ASSERT_LE(pb.min(p, c), keys[static_cast<size_t>(t * d + c)]) << n << " " << p;
          ASSERT_GE(pb.max(p, c), keys[static_cast<size_t>(t * d + c)]) << n << " " << p;
        }
  };
  attn::PageBounds inc, once;
  inc.reset(d);
  once.reset(d);
  int64_t n_full = 0;
  for (int64_t n = 1; n <= N; ++n) {
    n_full = rebuild(inc, n_full, n);
    check_bounds(inc, n);
  }
  rebuild(once, 0, N);
  for (int64_t p = 0; p < n_pages(N); ++p)
    for (int64_t c = 0; c < d; ++c) {
      EXPECT_EQ(inc.min(p, c), once.min(p, c)) << p << " " << c;
      EXPECT_EQ(inc.max(p, c), once.max(p, c)) << p << " " << c;
    }
  // Truncations (into the open tile, below it, to 0) and regrowth with other keys.
  for (int64_t cut : {N - 2, int64_t{37} * page + 1, int64_t{9} * page, int64_t{5}, int64_t{0}}) {
    for (int64_t t = cut; t < N; ++t)
      for (int64_t c = 0; c < d; ++c) keys[static_cast<size_t>(t * d + c)] = nd(rng) * 3.0f;
    n_full = std::min(n_full, cut / page);
    for (int64_t n = cut + 1; n <= N; n += 5) {
      n_full = rebuild(inc, n_full, n);
      check_bounds(inc, n);
    }
    n_full = rebuild(inc, n_full, N);
    check_bounds(inc, N);
  }
  // A page holding a non-finite key is wide, and a later finite page of its tile still gets
  // bounds of its own.
  attn::PageBounds pb;
  pb.reset(d);
  pb.resize(2);
  std::vector<float> rows(static_cast<size_t>(2 * d), 0.25f);
  rows[3] = NAN;
  EXPECT_FALSE(pb.set_rows(0, rows.data(), 2));
  rows[3] = 0.5f;
  EXPECT_TRUE(pb.set_rows(1, rows.data(), 2));
  EXPECT_TRUE(pb.wide(0));
  EXPECT_GE(pb.max(1, 3), 0.5f);
  EXPECT_LE(pb.min(1, 0), 0.25f);
  // The shared form (largest over the queries) over whole tiles: +inf on a wide page, the
  // largest point bound elsewhere.
  pb.reset(d);
  pb.resize(32);
  for (int64_t p = 0; p < 32; ++p) {
    for (auto& x : rows) x = nd(rng);
    if (p == 5 || p == 30) rows[7] = -INFINITY;
    EXPECT_EQ(pb.set_rows(p, rows.data(), 2), p != 5 && p != 30);
  }
  std::vector<float> qs(static_cast<size_t>(3 * d));
  for (auto& x : qs) x = nd(rng);
  const float* lo[3] = {qs.data(), qs.data() + d, qs.data() + 2 * d};
  const float* hi[3] = {nullptr, nullptr, nullptr};
  std::vector<float> each(32 * 3), top(32);
  pb.bounds(lo, hi, 3, 0, 32, each.data(), false);
  pb.bounds(lo, hi, 3, 0, 32, top.data(), true);
  for (int64_t p = 0; p < 32; ++p) {
    const float m = std::max({each[static_cast<size_t>(p * 3)], each[static_cast<size_t>(p * 3 + 1)],
                              each[static_cast<size_t>(p * 3 + 2)]});
    EXPECT_EQ(top[static_cast<size_t>(p)], m) << p;
    if (p == 5 || p == 30) {
      EXPECT_EQ(top[static_cast<size_t>(p)], INFINITY);
    }
  }
}

TEST(AttentionSparse, KthLargestEqualsNthElement) {
  // Quest's selection threshold against std::nth_element on the same values: spread values,
  // many ties, infinities, one value, a range near the float limits, subnormals; every k.
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> cases;
  for (int64_t n : {1, 2, 7, 300, 4096}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(rng) * 40.0f;
    cases.push_back(v);
    for (auto& x : v) x = static_cast<float>(rng() % 3);  // ties
    cases.push_back(v);
    for (size_t i = 0; i < v.size(); i += 5) v[i] = i % 2 ? INFINITY : -INFINITY;
    cases.push_back(v);
    for (auto& x : v) x = (rng() % 2 ? 3e38f : -3e38f) * (0.5f + static_cast<float>(rng() % 100) / 200.0f);
    cases.push_back(v);
    for (auto& x : v) x = static_cast<float>(rng() % 1000) * 1e-42f;  // subnormal
    cases.push_back(v);
  }
  cases.push_back(std::vector<float>(64, INFINITY));
  cases.push_back(std::vector<float>(64, -INFINITY));
  for (const auto& v : cases) {
    const int64_t n = static_cast<int64_t>(v.size());
    for (int64_t k = 1; k <= n; k += std::max<int64_t>(1, n / 37)) {
      std::vector<float> w = v;
      std::nth_element(w.begin(), w.begin() + (k - 1), w.end(), std::greater<float>());
      EXPECT_EQ(attn::kth_largest(v.data(), n, k), w[static_cast<size_t>(k - 1)]) << n << " " << k;
    }
    std::vector<float> w = v;
    std::sort(w.begin(), w.end());
    EXPECT_EQ(attn::kth_largest(v.data(), n, n), w.front());
  }
}

TEST(AttentionSparse, QuestDecodeSplitAndSharedSelection) {
  // Decoding (chunks of 1: fewer tiles than 4 x threads) runs the split path when the context
  // holds more than one unit of `split` tokens. It must attend exactly what it reports (against
  // the double oracle on its selection), choose the same pages as the unsplit path, and with
  // share=1 every head of a GQA group attends the same keys; share=0 lets each head choose.
  Seq s(700, 8, 2, 64, 64, 23);
  const RopeTable rt = test_rope(64, true);
  const auto cfg = kv_config(s, 32, rt);
  for (const char* share : {"1", "0"}) {
    const std::string base = std::string("quest_fast:budget=128,page=16,dense_layers=0,share=") + share;
    const auto split = run_seq(s, base + ",split=64", cfg, {1}, true);
    const auto whole = run_seq(s, base + ",split=1048576", cfg, {1}, true);
    EXPECT_LT(max_err_vs_selection(s, rt, split), 2e-4) << share;
    EXPECT_LT(max_abs_diff(split.out, whole.out), 1e-5) << share;
    int64_t differ = 0;  // heads of one group that attend different keys
    for (size_t c = 0; c < split.sel.size(); ++c) {
      for (int64_t h = 0; h < s.H; ++h) {
        const auto& a = split.sel[c].keys[static_cast<size_t>(h)];
        const auto& b = whole.sel[c].keys[static_cast<size_t>(h)];
        std::set<int32_t> ka, kb;
        for (const auto& k : a) ka.insert(k.seq_index);
        for (const auto& k : b) kb.insert(k.seq_index);
        EXPECT_EQ(ka, kb) << "token " << c << " head " << h;
        EXPECT_LE(a.size(), 128u);
        if (h % 4 != 0) {
          std::set<int32_t> k0;
          for (const auto& k : split.sel[c].keys[static_cast<size_t>(h - h % 4)]) k0.insert(k.seq_index);
          differ += k0 != ka;
        }
      }
    }
    if (std::string(share) == "1")
      EXPECT_EQ(differ, 0);
    else
      EXPECT_GT(differ, 0);  // random queries: heads of a group disagree somewhere
  }
}

TEST(AttentionSparse, QuestPrefillTilesFindTheNeedle) {
  // Prefill in chunks of 64: every query row past the budget attends the needle's page.
  Seq s(1000, 4, 1, 64, 64, 9, 0.3f);
  for (int64_t c = 0; c < s.d; ++c) s.k[static_cast<size_t>(333 * s.d + c)] = 0.0f;
  s.k[static_cast<size_t>(333 * s.d + 0)] = 30.0f;
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) s.q[static_cast<size_t>((t * s.H + h) * s.d)] = 3.0f;
  RopeTable rt = test_rope(64, true);
  for (auto& f : rt.inv_freq) f *= 0.0f;
  const auto r = run_seq(s, "quest_fast:budget=64,page=16,dense_layers=0", kv_config(s, 16, rt), {64}, true);
  EXPECT_LT(max_err_vs_selection(s, rt, r), 2e-4);
  int64_t rows = 0, found = 0;
  for (size_t c = 0; c < r.sel.size(); ++c)
    for (int64_t t = 0; t < r.sel[c].n; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        if (r.chunk_t0[c] + t <= 400) continue;
        const auto& keys = r.sel[c].keys[static_cast<size_t>(t * s.H + h)];
        EXPECT_LE(keys.size(), 64u);
        ++rows;
        for (const auto& k : keys) found += k.seq_index == 333;
      }
  EXPECT_GT(rows, 0);
  EXPECT_EQ(found, rows);
}

TEST(AttentionSparse, TruncateKeepsSummariesBelowAndRebuildsAbove) {
  // Run A, truncate to 296 tokens, continue with B (= A with different tokens from 296 on):
  // the output must be the bits of a fresh run of B. Stale page bounds, kernel means or block
  // representatives of A's dropped tokens would change the selection.
  Seq a(600, 8, 2, 64, 64, 41), b = a;
  Seq other(600, 8, 2, 64, 64, 42);
  const int64_t cut = 296;  // sinks 8 + 9 infllm blocks of 32; 37 quest pages of 8
  std::copy(other.q.begin() + cut * a.H * a.d, other.q.end(), b.q.begin() + cut * a.H * a.d);
  std::copy(other.k.begin() + cut * a.Hkv * a.d, other.k.end(), b.k.begin() + cut * a.Hkv * a.d);
  std::copy(other.v.begin() + cut * a.Hkv * a.dv, other.v.end(), b.v.begin() + cut * a.Hkv * a.dv);
  const RopeTable rt = test_rope(64, true);
  for (const char* spec : {"quest_fast:budget=64,page=8,dense_layers=0",
                           "infllm:sinks=8,local=64,block=32,reps=4,topk=2,chunk=50,repr=qsum",
                           "dssa:switch=0,block=32,kernel=16,stride=8,topk=2,sinks=8,local=64"}) {
    const auto cfg = kv_config(a, 16, rt);
    auto r = run_seq(a, spec, cfg, {50});
    r.kv->truncate(cut);
    continue_seq(r, b, cut, 50);
    // The same chunk edges from the cut on (Quest chooses pages per prefill tile).
    const auto fresh = run_seq(b, spec, cfg, {50, 50, 50, 50, 50, 46, 50, 50, 50, 50, 50, 50, 4});
    const size_t from = static_cast<size_t>(cut * a.H * a.dv);
    EXPECT_EQ(max_abs_diff(std::vector<float>(r.out.begin() + from, r.out.end()),
                           std::vector<float>(fresh.out.begin() + from, fresh.out.end())), 0.0) << spec;
  }
}

TEST(AttentionSparse, QuestFirstLayersDenseAndFullBudgetEqualsDense) {
  Seq s(300, 8, 2, 64, 64, 7);
  const RopeTable rt = test_rope(64, false);
  const auto oracle = full_oracle(s, rt);
  for (const char* name : {"quest", "quest_fast"}) {
    const std::string n = name;
    // A budget above the length is dense for quest_fast only: quest (the official code's rule)
    // takes min(L, budget) / page = floor(L / page) of the ceil(L / page) pages.
    const auto full = run_seq(s, n + ":budget=512,page=16,dense_layers=0", kv_config(s, 32, rt), {50, 1});
    if (n == "quest_fast") {
      EXPECT_LT(max_abs_diff(full.out, oracle), 2e-4) << n;
    }
    // Two layers, both dense (dense_layers=2): exact.
    const auto dl = run_seq(s, n + ":budget=32,page=16,dense_layers=2", kv_config(s, 32, rt, 2), {50, 1});
    EXPECT_LT(max_abs_diff(dl.out, oracle), 2e-4) << n;
  }
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
  // quest_fast in one prefill chunk (its last row), quest when decoding the last token.
  const auto r = run_seq(s, "quest_fast:budget=64,page=16,dense_layers=0", kv_config(s, 16, rt), {1000}, true);
  const auto& keys = r.sel.back().keys[static_cast<size_t>(999 * s.H)];
  bool found = false;
  for (const auto& k : keys) found = found || k.seq_index == 333;
  EXPECT_TRUE(found);
  const auto p = run_seq(s, "quest:budget=64,page=16,dense_layers=0", kv_config(s, 16, rt), {999, 1}, true);
  for (int64_t h = 0; h < s.H; ++h) {
    const auto& pk = p.sel.back().keys[static_cast<size_t>(h)];
    EXPECT_EQ(pk.size(), 64u);  // 4 pages of 16
    bool pf = false;
    for (const auto& k : pk) pf = pf || k.seq_index == 333;
    EXPECT_TRUE(pf) << h;
  }
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

TEST(AttentionSparse, InfLlmDecodeSplitMatchesUnsplit) {
  // Decoding (chunks of 1: 2 tiles on 2 threads) with split=32 cuts each tile's spans (sinks,
  // retrieved blocks at the fixed distance, the local window) into units merged in order: the
  // same keys are attended as unsplit, the output agrees to float rounding and is exact on its
  // selection.
  Seq s(600, 8, 2, 64, 64, 61);
  const RopeTable rt = test_rope(64, true);
  const auto cfg = kv_config(s, 16, rt);
  expect_decode_split_matches_unsplit(s, rt, cfg, "infllm:sinks=8,local=64,block=32,reps=4,topk=3,chunk=32", 32);
}

TEST(AttentionSparse, InfLlmWithLargeLocalWindowIsDense) {
  Seq s(300, 4, 2, 64, 64, 13);
  const RopeTable rt = test_rope(64, false);
  const auto r = run_seq(s, "infllm:sinks=8,local=4096,block=32,topk=2,chunk=64", kv_config(s, 16, rt), {40});
  EXPECT_LT(max_abs_diff(r.out, full_oracle(s, rt)), 2e-4);
}

}  // namespace
}  // namespace lc::test
