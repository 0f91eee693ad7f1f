// `bench speed --budget N` (equal_budget_spec): each sparse method, set to a budget of N, reads N
// key positions per query head when decoding deep in a sequence, counted from the keys each
// backend records as attended (its selection), not from its spec.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "run_util.h"

namespace lc::test {
namespace {

struct Reads {
  size_t lo = SIZE_MAX, hi = 0;
};

// Keys attended per decoded token and query head (skipping the first `skip_heads` heads of each
// layer, lychee's retrieval heads, which read every key).
Reads decode_reads(const std::string& spec, int64_t skip_heads) {
  Seq s(1500, 4, 2, 64, 64, 31, 1.0f);
  const RopeTable rt = test_rope(64, true);
  std::vector<int64_t> chunks(12, 100);  // prefill 1,200 tokens, then decode 300
  chunks.resize(12 + 300, 1);
  const auto r = run_seq(s, spec, kv_config(s, 16, rt), chunks, true);
  Reads out;
  for (size_t c = 12; c < r.sel.size(); ++c)
    for (int64_t h = skip_heads; h < s.H; ++h) {
      const size_t k = r.sel[c].keys[static_cast<size_t>(h)].size();
      out.lo = std::min(out.lo, k);
      out.hi = std::max(out.hi, k);
    }
  return out;
}

TEST(EqualBudget, EveryMethodReadsTheBudget) {
  const int64_t n = 512;
  for (const char* name : {"quest", "quest_fast", "streaming", "infllm", "dssa", "lychee:retrieval=1"}) {
    auto spec = equal_budget_spec(name, n);
    ASSERT_TRUE(spec.has_value()) << spec.error().message;
    const Reads r = decode_reads(*spec, std::string(name).rfind("lychee", 0) == 0 ? 1 : 0);
    // At most the budget; at least the budget less one unit of selection (a partial page or
    // block at the end of the sequence, or what the local window's alignment takes).
    EXPECT_LE(r.hi, static_cast<size_t>(n)) << *spec;
    EXPECT_GE(r.lo, static_cast<size_t>(n - 128)) << *spec;
    std::printf("  %-70s reads %zu..%zu\n", spec->c_str(), r.lo, r.hi);
  }
}

TEST(EqualBudget, KeepsOtherKeysAndRefusesConflicts) {
  auto s = equal_budget_spec("quest:split=64", 1024);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, "quest:budget=1024,dense_layers=0,split=64");
  EXPECT_EQ(*equal_budget_spec("dense", 2048), "dense");
  EXPECT_EQ(*equal_budget_spec("dssa", 2048), "dssa:switch=2048,block=64,sinks=64,local=512,topk=24");
  auto bad = equal_budget_spec("quest:budget=64", 1024);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("sets budget= itself"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(equal_budget_spec("fixed:distance=64", 1024).has_value());
  EXPECT_FALSE(equal_budget_spec("quest", 300).has_value());
  EXPECT_FALSE(equal_budget_spec("quest", 1000).has_value());
}

}  // namespace
}  // namespace lc::test
