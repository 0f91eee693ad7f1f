// The whole trainable model's gradient with respect to every parameter of a tiny model, against
// central finite differences in double (the ops one by one are checked in tests/grad).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "train/rng.h"
#include "train/transformer.h"

namespace lc::train {
namespace {

// The whole model: d(mean loss)/d(every parameter) against central differences, in double.
void check_model(bool tied, int64_t n_head_kv, int64_t fixed_distance = 0, int64_t logn_orig = 0, double eps = 1e-6) {
  ThreadPool pool(1);  // ~1600 forward passes of a toy model: threads would only add overhead
  ModelConfig c;
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = 2;
  c.n_head_kv = n_head_kv;
  c.n_ff = 12;
  c.n_vocab = 11;
  c.n_ctx = 6;
  c.rope_base = 100.0f;
  c.tied = tied;
  c.fixed_distance = fixed_distance;
  c.logn_orig = logn_orig;
  auto m = Transformer<double>::create(c, 6);
  ASSERT_TRUE(m) << m.error().message;
  Transformer<double>& M = **m;
  M.init(3);
  // Larger than GPT-2 init so that every path carries signal, and norms away from 1.
  Rng r(4);
  for (size_t i = 0; i < M.n_params(); ++i) M.params()[i] = M.params()[i] * 15 + (M.params()[i] == 1.0 ? 0.3 * r.normal() : 0.0);
  const std::vector<int32_t> tok = {1, 4, 4, 9, 0, 10}, tgt = {4, 4, 9, 0, 10, 2};
  auto loss = [&] { return M.forward(tok.data(), tgt.data(), 6, pool); };
  M.zero_grads();
  loss();
  M.backward(1.0 / 6, pool);
  std::vector<double> analytic(M.grads(), M.grads() + M.n_params());
  std::vector<double> p(M.params(), M.params() + M.n_params());
  // expect_grad perturbs a copy; mirror it into the model.
  double max_abs = 0;
  for (double a : analytic) max_abs = std::max(max_abs, std::fabs(a));
  ASSERT_GT(max_abs, 1e-3);
  int bad = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    double* x = M.params() + i;
    const double x0 = *x;
    *x = x0 + eps;
    const double lp = loss();
    *x = x0 - eps;
    const double lm = loss();
    *x = x0;
    const double num = (lp - lm) / (2 * eps);
    if (std::fabs(num - analytic[i]) > 1e-6 * max_abs + 1e-9) {
      if (++bad < 10) ADD_FAILURE() << "parameter " << i << ": analytic " << analytic[i] << " numeric " << num;
    }
  }
  EXPECT_EQ(bad, 0);

  // The float model (inference kernels, sgemm) gives the same loss and gradients.
  ThreadPool pool2(2);
  auto mf = Transformer<float>::create(c, 6);
  ASSERT_TRUE(mf);
  for (size_t i = 0; i < M.n_params(); ++i) (*mf)->params()[i] = static_cast<float>(M.params()[i]);
  (*mf)->zero_grads();
  const double lf = (*mf)->forward(tok.data(), tgt.data(), 6, pool2);
  const double ld = loss();
  EXPECT_NEAR(lf, ld, 1e-4 * std::fabs(ld));
  (*mf)->backward(1.0f / 6, pool2);
  for (size_t i = 0; i < M.n_params(); ++i)
    EXPECT_NEAR((*mf)->grads()[i], analytic[i], 1e-3 * max_abs) << "float gradient " << i;
}

TEST(ModelGrad, TiedGqa) { check_model(true, 1); }
TEST(ModelGrad, SeparateOutputMha) { check_model(false, 2); }
// Keys beyond 2 positions at the fixed distance, and q scaled by ln n / ln 2 from position 2 on.
// The far-key path makes this toy (weights x15) curved enough that central differences at
// eps 1e-6 carry truncation error above the tolerance: the count of mismatching parameters
// falls as eps^2 (48, 21, 9, 1, 0 for eps 1e-5, 3e-6, 1e-6, 3e-7, 1e-7), so the step is 1e-7.
TEST(ModelGrad, FixedDistanceAndLognScaling) { check_model(true, 1, 2, 2, 1e-7); }
TEST(ModelGrad, LognScaling) { check_model(false, 2, 0, 2); }

TEST(ModelGrad, ParameterLayoutMatchesGguf) {
  ModelConfig c;
  c.n_layer = 1;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_vocab = 20;
  c.n_ctx = 8;
  c.tied = false;
  auto m = Transformer<float>::create(c, 8);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)->config().n_ff, 64);  // 8/3 * 16 rounded up to 32
  const ParamTensor* k = (*m)->find("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne, (std::vector<int64_t>{16, 8}));
  ASSERT_NE((*m)->find("output.weight"), nullptr);
  size_t total = 0;
  for (const auto& t : (*m)->tensors()) total += t.size;
  EXPECT_EQ(total, (*m)->n_params());
}

}  // namespace
}  // namespace lc::train
