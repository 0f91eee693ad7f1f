// Element-wise kernels and RoPE against the scalar references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "test_util.h"

namespace lc::kernels {
namespace {

using test::random_floats;

const int64_t kSizes[] = {1, 3, 8, 15, 16, 17, 31, 64, 100, 576, 1537};

TEST(Ops, Rmsnorm) {
  std::mt19937 rng(1);
  for (int64_t n : kSizes) {
    auto x = random_floats(rng, n, -3, 3), w = random_floats(rng, n, 0.5, 1.5);
    std::vector<float> y(static_cast<size_t>(n)), r(static_cast<size_t>(n));
    rmsnorm(x.data(), w.data(), y.data(), n, 1e-5f);
    ref::rmsnorm(x.data(), w.data(), r.data(), n, 1e-5f);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], r[i], 2e-6f * std::fabs(r[i]) + 1e-7f) << n;
  }
  std::vector<float> z(64, 0.0f), w(64, 1.0f), y(64);  // all zero: eps keeps it finite
  rmsnorm(z.data(), w.data(), y.data(), 64, 1e-6f);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// The attention's span kernels: value accumulation against the double reference, and the f16
// forms against the f32 forms on the widened copies (widening is exact: the same bits).
TEST(Ops, AttentionRowKernels) {
  std::mt19937 rng(11);
  for (int64_t d : {1, 5, 8, 24, 32, 40, 64, 72, 128, 136}) {
    for (int64_t nk : {1, 2, 3, 4, 5, 9, 64}) {
      auto q = random_floats(rng, d, -1, 1), kf = random_floats(rng, nk * d, -2, 2);
      auto p = random_floats(rng, nk, 0, 1), vf = random_floats(rng, nk * d, -3, 3);
      std::vector<uint16_t> kh(kf.size()), vh(vf.size());
      for (size_t i = 0; i < kf.size(); ++i) kh[i] = fp32_to_fp16(kf[i]), kf[i] = fp16_to_fp32(kh[i]);
      for (size_t i = 0; i < vf.size(); ++i) vh[i] = fp32_to_fp16(vf[i]), vf[i] = fp16_to_fp32(vh[i]);
      std::vector<float> s32(static_cast<size_t>(nk)), s16(static_cast<size_t>(nk));
      dot_rows_f32(q.data(), kf.data(), nk, d, s32.data());
      dot_rows_f16(q.data(), kh.data(), nk, d, s16.data());
      EXPECT_EQ(s32, s16) << "d " << d << " nk " << nk;
      auto o0 = random_floats(rng, d, -1, 1);
      auto o32 = o0, o16 = o0, oref = o0;
      accumulate_rows_f32(o32.data(), p.data(), vf.data(), nk, d);
      accumulate_rows_f16(o16.data(), p.data(), vh.data(), nk, d);
      ref::accumulate_rows(oref.data(), p.data(), vf.data(), nk, d);
      EXPECT_EQ(o32, o16) << "d " << d << " nk " << nk;
      for (int64_t c = 0; c < d; ++c) {
        double mag = std::fabs(o0[c]);
        for (int64_t j = 0; j < nk; ++j) mag += std::fabs(p[j] * vf[j * d + c]);
        ASSERT_NEAR(o32[c], oref[c], 2e-6 * mag + 1e-30) << "d " << d << " nk " << nk << " c " << c;
      }
    }
  }
}

// Quest's tile bounds: the vector forms against the scalar references, bit for bit (the same
// operations in the same order), for every query count around the groups of four, odd channel
// counts, NaN query channels, and the max over queries with wide pages.
TEST(Ops, PageBoundTiles) {
  std::mt19937 rng(12);
  constexpr int64_t T = kBoundTile;
  for (int64_t d : {1, 3, 8, 17, 64}) {
    std::vector<int8_t> mn(static_cast<size_t>(d * T)), mx(mn.size());
    std::uniform_int_distribution<int> code(-127, 127);
    for (size_t i = 0; i < mn.size(); ++i) {
      const int a = code(rng), b = code(rng);
      mn[i] = static_cast<int8_t>(std::min(a, b)), mx[i] = static_cast<int8_t>(std::max(a, b));
    }
    auto scale = random_floats(rng, d, 0.001f, 0.1f);
    for (int64_t nq : {1, 2, 3, 4, 5, 8, 9}) {
      std::vector<std::vector<float>> a(static_cast<size_t>(nq)), b(a.size());
      std::vector<const float*> pa, pb;
      for (int64_t s = 0; s < nq; ++s) {
        a[s] = random_floats(rng, d, -2, 2);
        b[s] = random_floats(rng, d, -2, 2);
        if (s == 2 && d > 2) a[s][1] = NAN;
        pa.push_back(a[s].data());
        pb.push_back(b[s].data());
      }
      std::vector<float> fast(static_cast<size_t>(nq * T)), slow(fast.size());
      bound_tile_points(scale.data(), mn.data(), mx.data(), d, pa.data(), pb.data(), nq, fast.data());
      ref::bound_tile_points(scale.data(), mn.data(), mx.data(), d, pa.data(), pb.data(), nq, slow.data());
      EXPECT_EQ(0, std::memcmp(fast.data(), slow.data(), fast.size() * sizeof(float))) << "points d " << d << " nq " << nq;
      bound_tile_boxes(scale.data(), mn.data(), mx.data(), d, pa.data(), pb.data(), nq, fast.data());
      ref::bound_tile_boxes(scale.data(), mn.data(), mx.data(), d, pa.data(), pb.data(), nq, slow.data());
      EXPECT_EQ(0, std::memcmp(fast.data(), slow.data(), fast.size() * sizeof(float))) << "boxes d " << d << " nq " << nq;
      std::vector<uint8_t> wide(T, 0);
      wide[3] = wide[11] = 1;
      std::vector<float> mf(T), ms(T);
      max_bound_rows(fast.data(), nq, wide.data(), mf.data());
      ref::max_bound_rows(fast.data(), nq, wide.data(), ms.data());
      EXPECT_EQ(0, std::memcmp(mf.data(), ms.data(), mf.size() * sizeof(float))) << "max d " << d << " nq " << nq;
      EXPECT_EQ(mf[3], INFINITY);
    }
  }
  // The point form is the bound it claims: for a key inside the tile's boxes, q.k <= bound.
  const int64_t d = 8;
  std::vector<int8_t> mn(d * T, -10), mx(d * T, 20);
  std::vector<float> scale(d, 0.05f), q = random_floats(rng, d, -1, 1), pos(d), neg(d);
  for (int64_t c = 0; c < d; ++c) pos[c] = std::max(q[c], 0.0f), neg[c] = std::min(q[c], 0.0f);
  const float* pp = pos.data();
  const float* pn = neg.data();
  std::vector<float> out(T);
  bound_tile_points(scale.data(), mn.data(), mx.data(), d, &pp, &pn, 1, out.data());
  for (int trial = 0; trial < 100; ++trial) {
    auto k = random_floats(rng, d, -0.5f, 1.0f);  // inside [-10, 20] * 0.05
    double qk = 0;
    for (int64_t c = 0; c < d; ++c) qk += static_cast<double>(q[c]) * k[c];
    EXPECT_LE(qk, out[0] + 1e-6);
  }
}

TEST(Ops, Softmax) {
  std::mt19937 rng(2);
  for (int64_t n : kSizes) {
    auto x = random_floats(rng, n, -30, 30);
    if (n > 4) x[1] = -INFINITY, x[3] = -INFINITY;  // masked entries
    auto r = x;
    softmax_inplace(x.data(), n);
    ref::softmax_inplace(r.data(), n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(x[i], r[i], 2e-6f * r[i] + 1e-9f) << n << " " << i;
      sum += x[i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  std::vector<float> big = {1000.f, 999.f, -1000.f};
  softmax_inplace(big.data(), 3);
  EXPECT_NEAR(big[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_EQ(big[2], 0.0f);
}

// exp(x - m) and its sum against std::exp in double.
TEST(Ops, ExpSubSum) {
  std::mt19937 rng(12);
  for (int64_t n : kSizes) {
    auto x = random_floats(rng, n, -40, 5);
    if (n > 4) x[2] = -INFINITY;  // a masked score
    const float m = 5.0f;
    auto y = x;
    const float sum = exp_sub_sum(y.data(), n, m);
    double ref_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::exp(static_cast<double>(x[i]) - m);
      ref_sum += e;
      ASSERT_NEAR(y[i], e, 2e-6 * e + 1e-30) << n << " " << i;
    }
    EXPECT_NEAR(sum, ref_sum, 1e-5 * ref_sum + 1e-30) << n;
  }
}

TEST(Ops, Swiglu) {
  std::mt19937 rng(3);
  for (int64_t n : kSizes) {
    auto g = random_floats(rng, n, -20, 20), u = random_floats(rng, n, -2, 2);
    if (n > 3) g[0] = -100, g[1] = 100, g[2] = 0;
    std::vector<float> y(static_cast<size_t>(n)), r(static_cast<size_t>(n));
    swiglu(g.data(), u.data(), y.data(), n);
    ref::swiglu(g.data(), u.data(), r.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], r[i], 2e-6f * std::fabs(r[i]) + 1e-30f) << g[i];
  }
}

TEST(Ops, DotAxpyAddScale) {
  std::mt19937 rng(4);
  for (int64_t n : kSizes) {
    auto a = random_floats(rng, n), b = random_floats(rng, n);
    double mag = 0;
    for (int64_t i = 0; i < n; ++i) mag += std::fabs(a[i] * b[i]);
    EXPECT_NEAR(dot_f32(a.data(), b.data(), n), ref::dot_f32(a.data(), b.data(), n), 1e-6 * mag + 1e-30);
    // One query against rows: every row count (the 4-row body and the tail), d with and without
    // a multiple of 8.
    for (int64_t d : {n, int64_t{64}}) {
      if (d > n) continue;
      for (int64_t nk : {1, 3, 4, 7, 13}) {
        if (nk * d > n) continue;
        std::vector<float> out(static_cast<size_t>(nk), -1.0f);
        dot_rows_f32(a.data(), b.data(), nk, d, out.data());
        for (int64_t j = 0; j < nk; ++j) {
          double mj = 0;
          for (int64_t i = 0; i < d; ++i) mj += std::fabs(a[i] * b[j * d + i]);
          EXPECT_NEAR(out[static_cast<size_t>(j)], ref::dot_f32(a.data(), b.data() + j * d, d), 1e-6 * mj + 1e-30)
              << "d " << d << " nk " << nk << " j " << j;
        }
      }
    }
    auto y1 = b, y2 = b;
    axpy(0.37f, a.data(), y1.data(), n);
    ref::axpy(0.37f, a.data(), y2.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y1[i], y2[i], 1e-6f);
    y1 = b, y2 = b;
    add_inplace(y1.data(), a.data(), n);
    ref::add_inplace(y2.data(), a.data(), n);
    EXPECT_EQ(y1, y2);
    y1 = b, y2 = b;
    scale_inplace(y1.data(), -1.7f, n);
    ref::scale_inplace(y2.data(), -1.7f, n);
    EXPECT_EQ(y1, y2);
  }
}

TEST(Ops, Rope) {
  std::mt19937 rng(5);
  struct C {
    int64_t n_tokens, n_head, head_dim, n_rot;
    bool neox;
    float mscale;
  };
  for (const C& c : {C{1, 1, 8, 8, false, 1.f}, C{3, 4, 64, 64, true, 1.f}, C{5, 9, 64, 32, false, 1.f},
                     C{2, 3, 128, 64, true, 1.2f}, C{7, 2, 16, 16, true, 0.9f}}) {
    auto x = random_floats(rng, c.n_tokens * c.n_head * c.head_dim);
    auto r = x;
    std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
    for (int64_t t = 0; t < c.n_tokens; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t * 977 + 3);
    std::vector<float> inv(static_cast<size_t>(c.n_rot / 2));
    for (int64_t i = 0; i < c.n_rot / 2; ++i)
      inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.n_rot));
    rope_apply(x.data(), c.n_tokens, c.n_head, c.head_dim, c.n_rot, pos.data(), inv.data(), c.mscale, c.neox);
    ref::rope_apply(r.data(), c.n_tokens, c.n_head, c.head_dim, c.n_rot, pos.data(), inv.data(), c.mscale, c.neox);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], r[i], 2e-6f) << i;
  }
  // Position 0 is the identity (mscale 1); dims past n_rot are untouched.
  auto x = random_floats(rng, 32);
  auto x0 = x;
  const int32_t p0 = 0;
  std::vector<float> inv(8, 0.5f);
  rope_apply(x.data(), 1, 1, 32, 16, &p0, inv.data(), 1.0f, false);
  EXPECT_EQ(x, x0);
  const int32_t p1 = 1;
  rope_apply(x.data(), 1, 1, 32, 16, &p1, inv.data(), 1.0f, true);
  for (int i = 16; i < 32; ++i) EXPECT_EQ(x[i], x0[i]);
  EXPECT_NEAR(x[0], x0[0] * std::cos(0.5f) - x0[8] * std::sin(0.5f), 1e-6f);
}

}  // namespace
}  // namespace lc::kernels
