// RoPE's defining property and log-n scaling.
#include <cmath>
#include <random>
#include <vector>

#include "rope_test_util.h"

namespace lc {
namespace {

using rope_test::model;

float dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return float(s);
}
double norm(const std::vector<float>& a) { return std::sqrt(double(dot(a, a))); }

std::vector<float> rotated(const RopeTable& t, std::vector<float> v, int32_t pos) {
  t.apply(v.data(), 1, 1, static_cast<int64_t>(v.size()), &pos);
  return v;
}

// Exact q·k of q rotated to m and k to n, in double, from the table's frequencies: depends on
// m − n only (each pair contributes a rotation by (m − n)θ_i between q's and k's pair).
double analytic(const RopeTable& t, const std::vector<float>& q, const std::vector<float>& k,
                int64_t delta) {
  const int64_t half = t.n_rot / 2;
  double s = 0;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = t.neox ? i : 2 * i, b = t.neox ? i + half : 2 * i + 1;
    const double ang = double(delta) * double(t.inv_freq[i]);
    s += (double(q[a]) * k[a] + double(q[b]) * k[b]) * std::cos(ang) +
         (double(q[b]) * k[a] - double(q[a]) * k[b]) * std::sin(ang);
  }
  for (size_t j = size_t(t.n_rot); j < q.size(); ++j) s += double(q[j]) * k[j];
  return s * double(t.mscale) * t.mscale;
}

// For unscaled RoPE (and any fixed table) q·k depends only on the relative position m − n.
void check_relative(const std::string& spec, int64_t head_dim, int64_t n_rot, bool neox) {
  const auto info = model(n_rot, 10000.0, 4096, neox);
  auto s = make_rope_scaling(spec, info);
  ASSERT_TRUE(s.has_value()) << s.error().message;
  const RopeTable t = (*s)->table(4096);
  std::mt19937 rng(1234);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> pos(0, 512), shift(1, 1024);
  int checks = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> q(static_cast<size_t>(head_dim)), k(static_cast<size_t>(head_dim));
    for (auto& x : q) x = g(rng);
    for (auto& x : k) x = g(rng);
    const double scale = norm(q) * norm(k) * t.mscale * t.mscale;
    for (int pair = 0; pair < 5; ++pair) {
      const int32_t m = pos(rng), n = pos(rng);
      const float base_dot = dot(rotated(t, q, m), rotated(t, k, n));
      EXPECT_NEAR(base_dot, analytic(t, q, k, int64_t(n) - m), 1e-4 * scale)
          << spec << " m=" << m << " n=" << n;
      for (int rep = 0; rep < 10; ++rep) {
        const int32_t d = shift(rng);
        const float shifted = dot(rotated(t, q, m + d), rotated(t, k, n + d));
        EXPECT_NEAR(shifted, base_dot, 1e-4 * scale)
            << spec << " neox=" << neox << " m=" << m << " n=" << n << " delta=" << d;
        ++checks;
      }
    }
  }
  EXPECT_EQ(checks, 1000);
}

TEST(RopeProperty, UnscaledDotDependsOnlyOnRelativePosition) {
  check_relative("none", 64, 64, false);
  check_relative("none", 64, 64, true);
  check_relative("none", 128, 128, false);
  check_relative("none", 96, 32, true);  // partial rotary: unrotated dims add a constant
}

// Scaling changes the frequencies, not the form: every static table keeps the property.
TEST(RopeProperty, ScaledTablesStayRelative) {
  for (const char* spec : {"linear:factor=4", "ntk:factor=4", "yarn:factor=8", "yarn:factor=8,ramp=paper",
                           "llama3", "mrrope-uni:factor=8", "mrrope-pro:factor=8"})
    check_relative(spec, 64, 64, true);
}

// The absolute-position dependence that the property rules out is real: distinct relative
// positions give distinct scores (guards against a test that passes because nothing rotates).
TEST(RopeProperty, DifferentOffsetsDiffer) {
  const auto info = model(64, 10000.0, 4096);
  const RopeTable t = (*make_rope_scaling("none", info))->table(0);
  std::vector<float> q(64), k(64);
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  for (auto& x : q) x = g(rng);
  for (auto& x : k) x = g(rng);
  const float a = dot(rotated(t, q, 10), rotated(t, k, 3));
  const float b = dot(rotated(t, q, 10), rotated(t, k, 4));
  EXPECT_GT(std::abs(a - b), 1e-3 * norm(q) * norm(k));
}

TEST(RopeLogn, ScaleFormula) {
  for (int64_t l0 : {2, 512, 4096, 32768}) {
    for (int64_t pos : {int64_t{0}, int64_t{1}, l0 / 2, l0 - 2, l0 - 1, l0, l0 + 1, 2 * l0, 8 * l0,
                        l0 * l0 - 1, 100 * l0 * l0}) {
      const double n = double(pos) + 1.0;
      const double want = std::max(1.0, std::log(n) / std::log(double(l0)));
      EXPECT_NEAR(logn_scale(pos, l0), want, 1e-6 * want) << "pos=" << pos << " L0=" << l0;
    }
    EXPECT_EQ(logn_scale(l0 - 1, l0), 1.0f);  // n = L0: ln L0 / ln L0
    EXPECT_GT(logn_scale(l0, l0), 1.0f);      // n = L0 + 1
    EXPECT_NEAR(logn_scale(l0 * l0 - 1, l0), 2.0f, 1e-6);
  }
}

TEST(RopeLogn, PlanScalesQueries) {
  const auto info = model(8, 10000.0, 16);
  auto p = make_rope_plan("none+logn", info);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  const int64_t n_head = 2, head_dim = 8;
  const std::vector<int32_t> pos = {0, 15, 16, 255};
  std::vector<float> q(pos.size() * n_head * head_dim, 1.0f);
  p->scale_q(q.data(), int64_t(pos.size()), n_head, head_dim, pos.data());
  for (size_t t = 0; t < pos.size(); ++t) {
    const double want = std::max(1.0, std::log(double(pos[t]) + 1) / std::log(16.0));
    EXPECT_NEAR(p->q_scale(pos[t]), want, 1e-6) << pos[t];
    for (int64_t j = 0; j < n_head * head_dim; ++j)
      EXPECT_NEAR(q[t * n_head * head_dim + j], want, 1e-6) << "t=" << t << " j=" << j;
  }
  EXPECT_NEAR(p->q_scale(255), 2.0, 1e-6);

  // Without logn, scale_q is the identity.
  auto plain = make_rope_plan("none", info);
  ASSERT_TRUE(plain.has_value());
  std::vector<float> q2(n_head * head_dim, 3.0f);
  int32_t far = 1 << 20;
  plain->scale_q(q2.data(), 1, n_head, head_dim, &far);
  for (float x : q2) EXPECT_EQ(x, 3.0f);
}

}  // namespace
}  // namespace lc
