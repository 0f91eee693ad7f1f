// Every op's backward pass against central finite differences in double, and the float ops
// (which call the inference kernels) against the double ones. The whole trainable model's
// gradient is checked in tests/train/model_grad_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "grad/adam.h"
#include "grad/ops.h"
#include "rope/rope_table.h"

namespace lc::grad {
namespace {

// n normal draws times sd: xorshift64* and Box-Muller in float, as the trainer's Rng draws them
// (train/rng.h), so these are the inputs the tests had when they lived in tests/train.
std::vector<double> randn(size_t n, uint64_t seed, double sd = 1.0) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  auto uniform = [&] {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return (static_cast<double>((s * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  std::vector<double> v(n);
  for (size_t i = 0; i < n; i += 2) {
    const double u = uniform(), w = uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    v[i] = static_cast<float>(r * std::cos(2 * M_PI * w)) * sd;
    if (i + 1 < n) v[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * w)) * sd;
  }
  return v;
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// Central differences of loss() with respect to every element of x, against `analytic`.
void expect_grad(std::vector<double>& x, const std::vector<double>& analytic, const std::function<double()>& loss,
                 const char* what, double eps = 1e-6, double rtol = 1e-6, size_t stride = 1) {
  ASSERT_EQ(x.size(), analytic.size());
  double max_abs = 0;
  for (double a : analytic) max_abs = std::max(max_abs, std::fabs(a));
  for (size_t i = 0; i < x.size(); i += stride) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss();
    x[i] = x0 - eps;
    const double lm = loss();
    x[i] = x0;
    const double num = (lp - lm) / (2 * eps);
    EXPECT_NEAR(analytic[i], num, rtol * max_abs + 1e-9) << what << " element " << i;
  }
}

double weighted_sum(const std::vector<double>& w, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
  return s;
}

class OpsGrad : public ::testing::Test {
 protected:
  ThreadPool pool{2};

  // attention_backward's dq, dk, dv against finite differences of sum(dout * attention(q, k, v))
  // (strides: every stride-th element of q, and of k and v). Leaves the forward's out filled.
  void expect_attention_grads(const AttnDims& d, std::vector<double>& q, std::vector<double>& k, std::vector<double>& v,
                              const std::vector<double>& dout, std::vector<double>& out, const char* what,
                              size_t q_stride = 1, size_t kv_stride = 1) {
    std::vector<double> probs(d.n_head * d.n_tokens * d.n_tokens), scratch(probs.size());
    auto loss = [&] {
      attention_forward<double>(d, q.data(), k.data(), v.data(), out.data(), probs.data(), pool);
      return weighted_sum(dout, out);
    };
    loss();
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
    attention_backward<double>(d, q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(),
                               dv.data(), scratch.data(), pool);
    expect_grad(q, dq, loss, (std::string(what) + " dq").c_str(), 1e-6, 1e-6, q_stride);
    expect_grad(k, dk, loss, (std::string(what) + " dk").c_str(), 1e-6, 1e-6, kv_stride);
    expect_grad(v, dv, loss, (std::string(what) + " dv").c_str(), 1e-6, 1e-6, kv_stride);
    loss();
  }
};

TEST_F(OpsGrad, Linear) {
  const int64_t n = 3, in = 5, out = 4;
  auto x = randn(n * in, 1), w = randn(out * in, 2), dy = randn(n * out, 3);
  std::vector<double> y(n * out);
  auto loss = [&] {
    linear_forward<double>(x.data(), w.data(), y.data(), n, in, out, pool);
    return weighted_sum(dy, y);
  };
  std::vector<double> dx(n * in, 0.0), dw(out * in, 0.0);
  linear_backward<double>(dy.data(), x.data(), w.data(), dx.data(), dw.data(), n, in, out, false, pool);
  expect_grad(x, dx, loss, "linear dx");
  expect_grad(w, dw, loss, "linear dw");
  // accumulate_dx adds; dw always accumulates.
  std::vector<double> dx2(dx), dw2(dw);
  linear_backward<double>(dy.data(), x.data(), w.data(), dx2.data(), dw2.data(), n, in, out, true, pool);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], 2 * dx[i], 1e-12);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-12);
}

TEST_F(OpsGrad, RmsNorm) {
  const int64_t n = 3, dim = 7;
  auto x = randn(n * dim, 4), w = randn(dim, 5), dy = randn(n * dim, 6);
  std::vector<double> y(n * dim), rstd(n);
  auto loss = [&] {
    rmsnorm_forward<double>(x.data(), w.data(), y.data(), rstd.data(), n, dim, 1e-5f, pool);
    return weighted_sum(dy, y);
  };
  loss();
  std::vector<double> dx(n * dim, 0.0), dw(dim, 0.0);
  rmsnorm_backward<double>(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), n, dim, pool);
  expect_grad(x, dx, loss, "rmsnorm dx");
  expect_grad(w, dw, loss, "rmsnorm dw");
}

RopeTable test_rope(int64_t n_rot, bool neox) {
  LlamaCppRopeParams p;
  p.n_rot = n_rot;
  p.neox = neox;
  p.base = 100.0f;  // large angles at small positions
  return make_llama_cpp_rope(p);
}

TEST_F(OpsGrad, Rope) {
  const int64_t n = 4, H = 2, hd = 6;
  const std::vector<int32_t> pos = {0, 1, 5, 9};
  for (bool neox : {false, true}) {
    const RopeTable tab = test_rope(hd, neox), inv = inverse_rope(tab);
    auto x = randn(n * H * hd, 7), dy = randn(n * H * hd, 8);
    std::vector<double> y(x.size());
    auto loss = [&] {
      y = x;
      rope_rotate<double>(y.data(), n, H, hd, pos.data(), tab, pool);
      return weighted_sum(dy, y);
    };
    std::vector<double> dx = dy;
    rope_rotate<double>(dx.data(), n, H, hd, pos.data(), inv, pool);
    expect_grad(x, dx, loss, neox ? "rope (neox) dx" : "rope dx");
  }
}

TEST_F(OpsGrad, SwiGlu) {
  const int64_t n = 13;
  auto g = randn(n, 9, 2.0), u = randn(n, 10), dh = randn(n, 11);
  std::vector<double> h(n);
  auto loss = [&] {
    swiglu_forward<double>(g.data(), u.data(), h.data(), n, pool);
    return weighted_sum(dh, h);
  };
  std::vector<double> dg(n), du(n);
  swiglu_backward<double>(dh.data(), g.data(), u.data(), dg.data(), du.data(), n, pool);
  expect_grad(g, dg, loss, "swiglu dgate");
  expect_grad(u, du, loss, "swiglu dup");
}

TEST_F(OpsGrad, CrossEntropy) {
  const int64_t n = 3, V = 6;
  auto logits = randn(n * V, 12, 2.0);
  const std::vector<int32_t> tg = {2, 0, 5};
  std::vector<double> lse(n), losses(n);
  const double scale = 0.5;
  auto loss = [&] { return scale * cross_entropy_forward<double>(logits.data(), tg.data(), lse.data(), losses.data(), n, V, pool); };
  loss();
  std::vector<double> d = logits;
  cross_entropy_backward<double>(d.data(), tg.data(), lse.data(), n, V, scale, pool);
  expect_grad(logits, d, loss, "cross-entropy dlogits");
  // The loss itself: -log softmax, by hand for row 0.
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(logits[i]);
  EXPECT_NEAR(losses[0], std::log(s) - logits[2], 1e-12);
}

TEST_F(OpsGrad, AttentionGqa) {
  AttnDims d{5, 4, 2, 4};  // 5 tokens, 4 query heads sharing 2 KV heads
  const size_t qn = d.n_tokens * d.n_head * d.head_dim, kn = d.n_tokens * d.n_head_kv * d.head_dim;
  auto q = randn(qn, 13), k = randn(kn, 14), v = randn(kn, 15), dout = randn(qn, 16);
  std::vector<double> out(qn);
  expect_attention_grads(d, q, k, v, dout, out, "attention");
  // Causality: the first token attends only to itself, so its output is v[0] of its KV head.
  for (int64_t h = 0; h < d.n_head; ++h)
    for (int64_t i = 0; i < d.head_dim; ++i)
      EXPECT_NEAR(out[h * d.head_dim + i], v[(h / 2) * d.head_dim + i], 1e-12);
}

// Several query/key blocks (the op works in blocks of 32 rows), against a plain reference.
TEST_F(OpsGrad, AttentionManyBlocks) {
  AttnDims d{70, 3, 1, 6};
  const size_t qn = d.n_tokens * d.n_head * d.head_dim, kn = d.n_tokens * d.n_head_kv * d.head_dim;
  auto q = randn(qn, 20), k = randn(kn, 21), v = randn(kn, 22), dout = randn(qn, 23);
  std::vector<double> out(qn), probs(d.n_head * d.n_tokens * d.n_tokens);
  attention_forward<double>(d, q.data(), k.data(), v.data(), out.data(), probs.data(), pool);
  const int64_t T = d.n_tokens, H = d.n_head, hd = d.head_dim;
  for (int64_t t = 0; t < T; t += 7)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> sc(t + 1);
      double mx = -1e300, sum = 0;
      for (int64_t s = 0; s <= t; ++s) {
        double dd = 0;
        for (int64_t i = 0; i < hd; ++i) dd += q[(t * H + h) * hd + i] * k[s * hd + i];
        sc[s] = dd / std::sqrt(double(hd));
        mx = std::max(mx, sc[s]);
      }
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (int64_t s = 0; s <= t; ++s) o += sc[s] / sum * v[s * hd + i];
        EXPECT_NEAR(out[(t * H + h) * hd + i], o, 1e-12);
      }
    }
  expect_attention_grads(d, q, k, v, dout, out, "attention", 5, 3);
}

// The fixed distance (keys further than W attended as if exactly W away): the forward against
// scores formed from the raw q and k, and the backward against finite differences, over
// several blocks, GQA, and positions with gaps.
TEST_F(OpsGrad, AttentionFixedDistance) {
  for (const auto& [T, H, Hkv, W, step] : {std::tuple{9, 2, 1, 3, 1}, std::tuple{70, 4, 2, 20, 1},
                                          std::tuple{40, 2, 2, 30, 3}}) {
    AttnDims d{T, H, Hkv, 8};
    const int64_t hd = d.head_dim;
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(step * t + 2);
    LlamaCppRopeParams rp;
    rp.n_rot = hd;
    const RopeTable rope = make_llama_cpp_rope(rp), rope_inv = inverse_rope(rope);
    d.fixed_distance = W;
    d.pos = pos.data();
    d.rope = &rope;
    d.rope_inv = &rope_inv;
    const size_t qn = T * H * hd, kn = T * Hkv * hd;
    auto qraw = randn(qn, 30 + T), kraw = randn(kn, 31 + T), v = randn(kn, 32), dout = randn(qn, 33);
    std::vector<double> q = qraw, k = kraw;
    rope_rotate<double>(q.data(), T, H, hd, pos.data(), rope, pool);
    rope_rotate<double>(k.data(), T, Hkv, hd, pos.data(), rope, pool);
    std::vector<double> out(qn), probs(H * T * T);
    attention_forward<double>(d, q.data(), k.data(), v.data(), out.data(), probs.data(), pool);
    // Oracle: near keys score rope(q, pos[t]) . rope(k, pos[s]); far keys rope(q, W) . k.
    std::vector<double> qw = qraw;
    std::vector<int32_t> wpos(static_cast<size_t>(T), static_cast<int32_t>(W));
    rope_rotate<double>(qw.data(), T, H, hd, wpos.data(), rope, pool);
    int64_t n_far = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kh = h / (H / Hkv);
        std::vector<double> sc(static_cast<size_t>(t + 1));
        double mx = -1e300, sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          const bool far = pos[t] - pos[s] > W;
          n_far += far;
          const double* qa = (far ? qw.data() : q.data()) + (t * H + h) * hd;
          const double* ka = (far ? kraw.data() : k.data()) + (s * Hkv + kh) * hd;
          double dd = 0;
          for (int64_t i = 0; i < hd; ++i) dd += qa[i] * ka[i];
          sc[s] = dd / std::sqrt(double(hd));
          mx = std::max(mx, sc[s]);
        }
        for (auto& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < hd; ++i) {
          double o = 0;
          for (int64_t s = 0; s <= t; ++s) o += sc[s] / sum * v[(s * Hkv + kh) * hd + i];
          EXPECT_NEAR(out[(t * H + h) * hd + i], o, 1e-6) << "T " << T << " t " << t << " h " << h;
        }
      }
    EXPECT_GT(n_far, T);  // the case reaches beyond the fixed distance
    const size_t stride = T > 50 ? 5 : 1;
    expect_attention_grads(d, q, k, v, dout, out, "fixed-distance", stride, stride);
  }
}

// The float instantiation (inference kernels for rmsnorm, rope, swiglu, dot, axpy) computes
// the same functions as the double one.
TEST_F(OpsGrad, FloatMatchesDouble) {
  const int64_t n = 6, dim = 40, H = 4, hd = 10;
  auto x = randn(n * dim, 17), w = randn(dim, 18);
  auto xf = to_float(x), wf = to_float(w);
  std::vector<double> y(n * dim), r(n);
  std::vector<float> yf(n * dim), rf(n);
  rmsnorm_forward<double>(x.data(), w.data(), y.data(), r.data(), n, dim, 1e-5f, pool);
  rmsnorm_forward<float>(xf.data(), wf.data(), yf.data(), rf.data(), n, dim, 1e-5f, pool);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(yf[i], y[i], 1e-5 * (1 + std::fabs(y[i])));

  const RopeTable tab = test_rope(hd, false);
  const std::vector<int32_t> pos = {0, 3, 7, 100, 1000, 4000};
  std::vector<double> rd = x;
  std::vector<float> rfl = xf;
  rope_rotate<double>(rd.data(), n, H, hd, pos.data(), tab, pool);
  rope_rotate<float>(rfl.data(), n, H, hd, pos.data(), tab, pool);
  for (size_t i = 0; i < rd.size(); ++i) EXPECT_NEAR(rfl[i], rd[i], 1e-5 * (1 + std::fabs(rd[i])));
  // Rotating back with the inverse table restores the input.
  rope_rotate<float>(rfl.data(), n, H, hd, pos.data(), inverse_rope(tab), pool);
  for (size_t i = 0; i < rfl.size(); ++i) EXPECT_NEAR(rfl[i], xf[i], 1e-5f * (1 + std::fabs(xf[i])));

  auto u = randn(n * dim, 19);
  auto uf = to_float(u);
  std::vector<double> h(n * dim);
  std::vector<float> hf(n * dim);
  swiglu_forward<double>(x.data(), u.data(), h.data(), n * dim, pool);
  swiglu_forward<float>(xf.data(), uf.data(), hf.data(), n * dim, pool);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_NEAR(hf[i], h[i], 1e-5 * (1 + std::fabs(h[i])));
}

// The halves of linear_backward (qTTT's frozen weights need dx alone, its W_q dw alone) give
// linear_backward's results, and overwrite or accumulate as asked.
TEST_F(OpsGrad, LinearHalves) {
  const int64_t n = 4, in = 6, out = 5;
  auto x = randn(n * in, 40), w = randn(out * in, 41), dy = randn(n * out, 42);
  std::vector<double> dx(n * in, 0.0), dw(out * in, 0.0);
  linear_backward<double>(dy.data(), x.data(), w.data(), dx.data(), dw.data(), n, in, out, false, pool);
  std::vector<double> dx1(n * in, 7.0), dw1(out * in, 7.0);
  linear_backward_dx<double>(dy.data(), w.data(), dx1.data(), n, in, out, false, pool);
  linear_backward_dw<double>(dy.data(), x.data(), dw1.data(), n, in, out, false, pool);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx1[i], dx[i], 1e-12);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw1[i], dw[i], 1e-12);
  linear_backward_dx<double>(dy.data(), w.data(), dx1.data(), n, in, out, true, pool);
  linear_backward_dw<double>(dy.data(), x.data(), dw1.data(), n, in, out, true, pool);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx1[i], 2 * dx[i], 1e-12);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw1[i], 2 * dw[i], 1e-12);
}

// An empty inner dimension scales C by beta (zero for beta 0), as BLAS defines it.
TEST_F(OpsGrad, GemmEmptyInnerDimension) {
  std::vector<double> c = {1, 2, 3, 4, 5, 6};
  gemm<double>(false, true, 2, 3, 0, 1.0, nullptr, 1, nullptr, 1, 0.5, c.data(), 3);
  EXPECT_EQ(c, (std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3}));
  std::vector<float> cf = {1, 2, 3, 4};
  gemm<float>(true, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f, cf.data(), 2);
  EXPECT_EQ(cf, (std::vector<float>{0, 0, 0, 0}));
}

// rmsnorm_backward overwriting dx, in place (dx = dy) and without dw equals the accumulating
// form; so does swiglu_backward with dgate = dh.
TEST_F(OpsGrad, BackwardInPlace) {
  const int64_t n = 3, dim = 9;
  auto x = randn(n * dim, 43), w = randn(dim, 44), dy = randn(n * dim, 45);
  std::vector<double> y(n * dim), rstd(n);
  rmsnorm_forward<double>(x.data(), w.data(), y.data(), rstd.data(), n, dim, 1e-5f, pool);
  std::vector<double> dx(n * dim, 0.0), dw(dim, 0.0);
  rmsnorm_backward<double>(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), n, dim, pool);
  std::vector<double> inplace = dy;
  rmsnorm_backward<double>(inplace.data(), x.data(), w.data(), rstd.data(), inplace.data(), nullptr, n, dim, pool,
                           false);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(inplace[i], dx[i], 1e-12);
  std::vector<double> over(n * dim, 9.0);
  rmsnorm_backward<double>(dy.data(), x.data(), w.data(), rstd.data(), over.data(), nullptr, n, dim, pool, false);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(over[i], dx[i], 1e-12);

  const int64_t m = 11;
  auto g = randn(m, 46, 2.0), u = randn(m, 47), dh = randn(m, 48);
  std::vector<double> dg(m), du(m);
  swiglu_backward<double>(dh.data(), g.data(), u.data(), dg.data(), du.data(), m, pool);
  std::vector<double> dg2 = dh, du2(m);
  swiglu_backward<double>(dg2.data(), g.data(), u.data(), dg2.data(), du2.data(), m, pool);
  EXPECT_EQ(dg2, dg);
  EXPECT_EQ(du2, du);
}

// Adam against the update written out in double, over three steps, with and without decoupled
// weight decay; the result does not depend on the number of threads.
TEST(Adam, MatchesTheFormula) {
  const int64_t n = 1000;
  for (float wd : {0.0f, 0.1f}) {
    const AdamParams a{0.9f, 0.95f, 1e-8f, wd};
    auto p0 = randn(n, 50);
    std::vector<float> p(p0.begin(), p0.end()), m(n, 0.0f), v(n, 0.0f), p1(p), m1(m), v1(v);
    std::vector<double> pd(p0), md(n, 0.0), vd(n, 0.0);
    ThreadPool pool1(1), pool3(3);
    for (int64_t t = 1; t <= 3; ++t) {
      const auto gd = randn(n, 50 + t);
      const std::vector<float> g(gd.begin(), gd.end());
      const float lr = 1e-2f * static_cast<float>(t);
      adam_update(a, t, lr, p.data(), g.data(), m.data(), v.data(), n, pool3);
      adam_update(a, t, lr, p1.data(), g.data(), m1.data(), v1.data(), n, pool1);
      const double c1 = 1 - std::pow(0.9, double(t)), c2 = 1 - std::pow(0.95, double(t));
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g[i];
        md[i] = 0.9 * md[i] + 0.1 * gi;
        vd[i] = 0.95 * vd[i] + 0.05 * gi * gi;
        pd[i] -= lr * (md[i] / c1 / (std::sqrt(vd[i] / c2) + 1e-8) + wd * pd[i]);
      }
    }
    EXPECT_EQ(p, p1);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 1e-5 * (1 + std::fabs(pd[i]))) << "wd " << wd << " i " << i;
  }
}

}  // namespace
}  // namespace lc::grad
