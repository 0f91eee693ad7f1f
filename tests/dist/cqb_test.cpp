// Contextual queueing bandits: the learner against the true parameter it samples from, the
// greedy matching against a hand-worked case, and the simulation's policies against the oracle
// that knows the rates.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "dist/cqb.h"

namespace lc::dist {
namespace {

TEST(Cqb, LearnerConvergesToTheParameterItSamplesFrom) {
  const std::vector<double> truth{-0.5, 2.0, -1.5};
  ServiceModel m(3);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < 40000; ++i) {
    const std::vector<double> x{1.0, u(rng), u(rng)};
    const double p = logistic(truth[0] + truth[1] * x[1] + truth[2] * x[2]);
    m.observe(x, u(rng) < p);
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(m.theta()[static_cast<size_t>(i)], truth[static_cast<size_t>(i)], 0.15) << i;
}

TEST(Cqb, GreedyPairsTakeTheHighestRateFirst) {
  Choice c;
  c.n_jobs = 3, c.n_servers = 2, c.d = 1;
  c.features.assign(6, 1.0);
  c.free_servers = {0, 1};
  // rate[j][k]: the best pair is (2, 0) at 0.9; then server 1's best among jobs 0, 1 is job 1.
  const std::vector<double> rate{0.5, 0.2, 0.1, 0.6, 0.9, 0.8};
  const auto pairs = greedy_pairs(c, rate);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0], (Pair{2, 0}));
  EXPECT_EQ(pairs[1], (Pair{1, 1}));
  c.free_servers = {1};
  EXPECT_EQ(greedy_pairs(c, rate), (std::vector<Pair>{{2, 1}}));
}

TEST(Cqb, RoundRobinAndLeastLoadedServeInArrivalOrder) {
  Choice c;
  c.n_jobs = 2, c.n_servers = 3, c.d = 1;
  c.features.assign(6, 1.0);
  c.free_servers = {0, 1, 2};
  c.load = {2, 0, 1};
  std::mt19937_64 rng(1);
  auto rr = make_scheduler("rr", 3, 1);
  ASSERT_TRUE(rr.has_value());
  EXPECT_EQ((*rr)->assign(c, rng), (std::vector<Pair>{{0, 0}, {1, 1}}));
  EXPECT_EQ((*rr)->assign(c, rng), (std::vector<Pair>{{0, 2}, {1, 0}}));  // the turn goes on
  auto least = make_scheduler("least", 3, 1);
  ASSERT_TRUE(least.has_value());
  EXPECT_EQ((*least)->assign(c, rng), (std::vector<Pair>{{0, 1}, {1, 2}}));
  EXPECT_FALSE(make_scheduler("fifo", 3, 1).has_value());
}

// Two servers good at opposite kinds of job: a policy that learns which is which keeps the queue
// shorter than one that ignores the features, and its regret to the oracle shrinks with time.
TEST(Cqb, SimulationLearnsTowardsTheOracle) {
  SimParams p;
  p.theta = {{-2.0, 4.0}, {2.0, -4.0}};  // server 0 fast for x ~ 1, server 1 for x ~ 0
  p.arrival = 0.9;
  p.slots = 6000;
  p.runs = 6;
  p.seed = 3;
  auto r = simulate(p, {"oracle", "cqb", "rr"});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  auto tail_mean = [](const SimResult& s, int64_t from, int64_t to) {
    return std::accumulate(s.mean_queue.begin() + from, s.mean_queue.begin() + to, 0.0) / static_cast<double>(to - from);
  };
  const SimResult &oracle = (*r)[0], &cqb = (*r)[1], &rr = (*r)[2];
  const double q_or = tail_mean(oracle, 5000, 6000), q_cqb = tail_mean(cqb, 5000, 6000), q_rr = tail_mean(rr, 5000, 6000);
  EXPECT_LE(q_or, q_cqb + 0.5);
  EXPECT_LT(q_cqb, q_rr);
  // Regret early against late.
  const double early = tail_mean(cqb, 500, 1500) - tail_mean(oracle, 500, 1500);
  const double late = q_cqb - q_or;
  EXPECT_LT(late, early) << "early " << early << " late " << late;
  EXPECT_GT(oracle.mean_sojourn, 0);
}

}  // namespace
}  // namespace lc::dist
