// Typed capabilities: what each registry backend declares about its use of the cache, which
// presses (H2O's observer) and qTTT rely on instead of parsing specs.
#include <gtest/gtest.h>

#include "attention/backend.h"

namespace lc {
namespace {

AttentionCaps caps_of(const std::string& spec, int64_t fixed_distance = 0) {
  AttnShape s{2, 4, 2, 16, 16, 0.0f, fixed_distance};
  auto b = make_attention_backend(spec, s);
  EXPECT_TRUE(b.has_value()) << spec << ": " << b.error().message;
  return b ? (*b)->caps() : AttentionCaps{};
}

TEST(AttentionCaps, EachBackendDeclaresWhatItReads) {
  for (const char* exact : {"dense", "dense:split=256", "naive"}) {
    const AttentionCaps c = caps_of(exact);
    EXPECT_TRUE(c.exact) << exact;
    EXPECT_TRUE(c.reads_all_keys) << exact;
    EXPECT_EQ(c.fixed_distance, 0) << exact;
    EXPECT_FALSE(c.evicts) << exact;
  }
  const AttentionCaps f = caps_of("fixed:distance=48");
  EXPECT_FALSE(f.exact);
  EXPECT_TRUE(f.reads_all_keys);
  EXPECT_EQ(f.fixed_distance, 48);
  EXPECT_EQ(f.spec, "fixed:distance=48");
  // The model's trained ceiling is the default distance.
  EXPECT_EQ(caps_of("fixed", 64).fixed_distance, 64);
  const AttentionCaps fb = caps_of("fixed:distance=48,budget=256");
  EXPECT_FALSE(fb.reads_all_keys);
  EXPECT_EQ(fb.fixed_distance, 48);
  const AttentionCaps st = caps_of("streaming:sinks=4,window=64");
  EXPECT_TRUE(st.evicts);
  EXPECT_TRUE(st.relabels_positions);
  EXPECT_FALSE(st.exact);
  for (const char* sparse : {"quest", "quest_fast", "infllm", "dssa", "lychee:retrieval=1"}) {
    const AttentionCaps c = caps_of(sparse);
    EXPECT_FALSE(c.exact) << sparse;
    EXPECT_FALSE(c.reads_all_keys) << sparse;
    EXPECT_EQ(c.fixed_distance, 0) << sparse;
  }
}

}  // namespace
}  // namespace lc
