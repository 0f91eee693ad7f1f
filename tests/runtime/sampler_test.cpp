// Sampler properties against the formulas (softmax, nucleus, min-p, penalty), not against
// earlier outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

// logit_bias (OpenAI's; llama.cpp's --logit-bias): logit + bias before anything else; -inf bans.
TEST(Sampler, LogitBiasIsAddedFirstAndMinusInfinityBans) {
  const float inf = std::numeric_limits<float>::infinity();
  SamplerParams p;
  p.temp = 0;
  std::vector<float> l = {1.0f, 2.0f, 0.5f};
  p.logit_bias = {{0, 1.5f}};  // 2.5 > 2
  EXPECT_EQ(Sampler(p).sample(l.data(), 3, {}), 0);
  p.logit_bias = {{0, 0.9f}};  // 1.9 < 2
  EXPECT_EQ(Sampler(p).sample(l.data(), 3, {}), 1);
  p.logit_bias = {{1, -inf}};
  EXPECT_EQ(Sampler(p).sample(l.data(), 3, {}), 0);
  p.logit_bias = {{0, -inf}, {1, -inf}, {2, -inf}};  // nothing left: the lowest id
  EXPECT_EQ(Sampler(p).sample(l.data(), 3, {}), 0);
  p.logit_bias = {{7, 50.0f}};  // past this vocabulary: no effect here (callers refuse it)
  EXPECT_EQ(Sampler(p).sample(l.data(), 3, {}), 1);
  // Drawn at temperature 0.8 with no filters: the frequencies are the softmax of the biased
  // logits, and the banned token never comes.
  p.temp = 0.8f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 3;
  p.logit_bias = {{1, -inf}, {2, 1.25f}};
  Sampler s(p);
  std::vector<double> want = {std::exp(1.0 / 0.8), 0.0, std::exp(1.75 / 0.8)};
  const double z = want[0] + want[2];
  std::vector<int> count(3);
  const int n = 100000;
  for (int i = 0; i < n; ++i) count[static_cast<size_t>(s.sample(l.data(), 3, {}))]++;
  EXPECT_EQ(count[1], 0);
  EXPECT_NEAR(count[0] / double(n), want[0] / z, 0.006);
  EXPECT_NEAR(count[2] / double(n), want[2] / z, 0.006);
  // Range checks.
  p.logit_bias = {{0, 101.0f}};
  EXPECT_FALSE(validate(p).is_ok());
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(validate(p).is_ok());
  p.logit_bias = {{0, std::nanf("")}};
  EXPECT_FALSE(validate(p).is_ok());
  p.logit_bias = {{0, -inf}, {2, -100.0f}};
  EXPECT_TRUE(validate(p).is_ok());
  EXPECT_TRUE(check_logit_bias_vocab(p, 3).is_ok());
  EXPECT_FALSE(check_logit_bias_vocab(p, 2).is_ok());
}

TEST(Sampler, LogitBiasFlagParsesLlamaCppForm) {
  auto a = parse_logit_bias("15043+1.5");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->first, 15043);
  EXPECT_FLOAT_EQ(a->second, 1.5f);
  auto b = parse_logit_bias("2-inf");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->second, -std::numeric_limits<float>::infinity());
  auto c = parse_logit_bias("7-3");
  ASSERT_TRUE(c.has_value());
  EXPECT_FLOAT_EQ(c->second, -3.0f);
  for (const char* bad : {"2+inf", "x+1", "3", "3+", "+3", "3+-1", "3-150", "3+1e", "-3+1", "3+nan"}) {
    auto r = parse_logit_bias(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_NE(r.error().message.find(bad), std::string::npos) << r.error().message;
  }
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
