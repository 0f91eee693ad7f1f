// Sampler properties against the formulas (softmax, nucleus, min-p, penalty), not against
// earlier outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "runtime/sampler.h"

namespace lc {
namespace {

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  SamplerParams p;
  p.temp = 0;
  Sampler s(p);
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(l.data(), 4, {}), 1);
  EXPECT_EQ(argmax(l.data(), 4), 1);
}

TEST(Sampler, RepeatPenaltyFollowsFormula) {
  // Penalty 2: positive logits halve, negative double. Token 1 (3.0 -> 1.5) falls below token 0.
  SamplerParams p;
  p.temp = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {2.0f, 3.0f, -0.5f};
  std::vector<int32_t> hist = {1, 1, 2};
  EXPECT_EQ(s.sample(l.data(), 3, hist), 0);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesFollowFormula) {
  // logit - count * frequency - presence, for tokens seen in the window only.
  SamplerParams p;
  p.temp = 0;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = 0.3f;
  p.repeat_last_n = 3;
  std::vector<int32_t> hist = {0, 1, 1, 2};  // the window sees 1 twice and 2 once; 0 is outside it
  // Token 1: 3.0 - 2 * 0.4 - 0.3 = 1.9; token 2: 2.5 - 0.4 - 0.3 = 1.8; token 3 (unseen): 1.85.
  std::vector<float> l = {1.0f, 3.0f, 2.5f, 1.85f};
  EXPECT_EQ(Sampler(p).sample(l.data(), 4, hist), 1);
  l[3] = 1.95f;  // above 1.9
  EXPECT_EQ(Sampler(p).sample(l.data(), 4, hist), 3);
  l = {2.0f, 1.0f, 1.0f, 1.0f};  // token 0 is outside the window: not penalised
  EXPECT_EQ(Sampler(p).sample(l.data(), 4, hist), 0);
  p.presence_penalty = 2.5f;
  EXPECT_FALSE(validate(p).is_ok());
}

TEST(Sampler, FrequenciesFollowSoftmaxAtTemperature) {
  SamplerParams p;
  p.temp = 0.7f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 7;
  Sampler s(p);
  std::vector<float> l = {1.0f, 0.0f, -1.0f, 0.5f};
  std::vector<double> expect(4);
  double z = 0;
  for (int i = 0; i < 4; ++i) z += (expect[i] = std::exp(l[i] / 0.7));
  const int n = 200000;
  std::vector<int> count(4);
  for (int i = 0; i < n; ++i) count[s.sample(l.data(), 4, {})]++;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(count[i] / double(n), expect[i] / z, 0.006) << i;
}

TEST(Sampler, TopKTopPMinPNeverPickOutsideTheirSets) {
  std::vector<float> l = {3.0f, 2.9f, 1.0f, 0.0f, -2.0f};  // probs ~ .47 .42 .06 .02 .003
  {
    SamplerParams p;
    p.temp = 1;
    p.top_k = 2;
    p.top_p = 1;
    p.min_p = 0;
    Sampler s(p);
    for (int i = 0; i < 2000; ++i) EXPECT_LT(s.sample(l.data(), 5, {}), 2);
  }
  {
    SamplerParams p;
    p.temp = 1;
    p.top_k = 0;
    p.top_p = 0.85f;  // .47 + .42 >= .85: the nucleus is {0, 1}
    p.min_p = 0;
    Sampler s(p);
    for (int i = 0; i < 2000; ++i) EXPECT_LT(s.sample(l.data(), 5, {}), 2);
  }
  {
    SamplerParams p;
    p.temp = 1;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0.1f;  // keeps tokens with p >= 0.047: {0, 1, 2}
    Sampler s(p);
    std::map<int, int> seen;
    for (int i = 0; i < 5000; ++i) seen[s.sample(l.data(), 5, {})]++;
    EXPECT_EQ(seen.count(3), 0u);
    EXPECT_EQ(seen.count(4), 0u);
    EXPECT_GT(seen[2], 0);
  }
}

TEST(Sampler, SameSeedSameSequence) {
  SamplerParams p;
  p.seed = 99;
  Sampler a(p), b(p);
  std::vector<float> l = {0.1f, 0.2f, 0.3f, 0.05f, 0.4f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(l.data(), 5, {}), b.sample(l.data(), 5, {}));
}

TEST(Sampler, InvalidParamsAreErrors) {
  SamplerParams p;
  p.top_p = 0;
  EXPECT_FALSE(validate(p).is_ok());
  p = {};
  p.temp = -1;
  EXPECT_FALSE(validate(p).is_ok());
  p = {};
  p.repeat_penalty = 0;
  EXPECT_FALSE(validate(p).is_ok());
}

}  // namespace
}  // namespace lc
