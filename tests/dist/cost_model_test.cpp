// The cost model of context-parallel prefill against its assumptions written out by hand: the
// speed-ups it must give where only one kind of work remains.
#include <gtest/gtest.h>

#include "dist/cost_model.h"

namespace lc::dist {
namespace {

TEST(CostModel, FitRecoversTheConstantsOfExactPoints) {
  const double a = 2e-5, b = 3e-9;
  std::vector<std::pair<double, double>> pts;
  for (double T : {4096.0, 16384.0, 65536.0}) pts.emplace_back(T, a * T + b * T * T / 2);
  auto f = PrefillFit::fit(pts);
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->a / a, 1.0, 1e-9);
  EXPECT_NEAR(f->b / b, 1.0, 1e-9);
  EXPECT_FALSE(PrefillFit::fit({{4096, 1.0}}).has_value());
  EXPECT_FALSE(PrefillFit::fit({{4096, 1.0}, {4096, 1.0}}).has_value());
  EXPECT_FALSE(PrefillFit::fit({{4096, 1.0}, {-1, 1.0}}).has_value());
}

TEST(CostModel, SpeedUpsWhereOneKindOfWorkRemains) {
  const Network free_net{0, 1e30};
  for (int N : {2, 4, 16, 64}) {
    ScaleCase c;
    c.tokens = 1 << 20;
    c.hosts = N;
    c.layers = 24;
    c.wire_bytes_per_token = 1000;
    const PrefillFit linear{1e-5, 0}, pairs{0, 1e-9};
    // Star evaluates the anchor and the block: twice the tokens of a shard, and (2B)^2/2 pairs.
    EXPECT_NEAR(one_host_prefill(linear, c.tokens) / star_prefill(linear, c), N / 2.0, 1e-9);
    EXPECT_NEAR(one_host_prefill(pairs, c.tokens) / star_prefill(pairs, c), N * N / 4.0, 1e-6);
    // With k blocks per host (B = T/(kN)): k anchors and blocks, still twice a shard's tokens,
    // and k (2B)^2/2 pairs, so k N^2/4 on pairs (2 at 2 hosts with k = 2).
    for (int k : {2, 4}) {
      ScaleCase ck = c;
      ck.star_blocks = k;
      EXPECT_NEAR(one_host_prefill(linear, ck.tokens) / star_prefill(linear, ck), N / 2.0, 1e-9);
      EXPECT_NEAR(one_host_prefill(pairs, ck.tokens) / star_prefill(pairs, ck), k * N * N / 4.0, 1e-6);
    }
    // Ring, zigzag: a shard's tokens, and 1/N of the pairs on every rank.
    EXPECT_NEAR(one_host_prefill(linear, c.tokens) / ring_prefill(linear, c, free_net), N, 1e-9);
    EXPECT_NEAR(one_host_prefill(pairs, c.tokens) / ring_prefill(pairs, c, free_net), N, 1e-6);
    // Ring, contiguous: the last rank's queries see B^2/2 + (N-1) B^2 pairs.
    ScaleCase cc = c;
    cc.zigzag = false;
    EXPECT_NEAR(one_host_prefill(linear, cc.tokens) / ring_prefill(linear, cc, free_net), N, 1e-9);
    EXPECT_NEAR(one_host_prefill(pairs, cc.tokens) / ring_prefill(pairs, cc, free_net), N * N / (2.0 * N - 1), 1e-6);
    // The ring's messages: layers x (N - 1) steps of one shard's keys and values.
    const Network net{1e-5, 1e9};
    const double B = c.tokens / N;
    EXPECT_NEAR(ring_prefill(linear, c, net) - ring_prefill(linear, c, free_net), 24 * (N - 1) * (1e-5 + B * 1000 / 1e9),
                1e-9);
  }
}

}  // namespace
}  // namespace lc::dist
