// -c 0: the context grows past the trained window as the input needs, with the numbers of a
// context sized for the input, and it is bounded by the KV budget with a typed error.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/context.h"
#include "model/model.h"

namespace lc {
namespace {

const std::string kStories = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

std::vector<int32_t> tokens(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(1 + (i * 37) % 500);
  return t;
}

TEST(GrowingContext, PromptBeyondTheTrainedWindowMatchesASizedContext) {
  auto model = Model::load(kStories);
  ASSERT_TRUE(model.has_value());
  ASSERT_EQ((*model)->hparams().n_ctx_train, 128);
  ContextParams grow;
  grow.n_batch = 64;
  grow.n_threads = 1;
  ContextParams sized = grow;
  sized.n_ctx = 1000;
  auto a = Context::create(**model, grow);
  auto b = Context::create(**model, sized);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ((*a)->n_ctx(), kGrowingContext);
  const auto t = tokens(900);  // 7x the trained window
  ASSERT_TRUE((*a)->decode(t, Logits::kLast).is_ok());
  ASSERT_TRUE((*b)->decode(t, Logits::kLast).is_ok());
  const int64_t nv = (*model)->hparams().n_vocab;
  EXPECT_EQ(0, std::memcmp((*a)->logits(0), (*b)->logits(0), static_cast<size_t>(nv) * sizeof(float)));
  // An explicit size still caps it, with the error it always gave.
  Status st = (*b)->decode(tokens(200), Logits::kLast);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kContextFull);
  EXPECT_NE(st.message().find("raise --ctx-size"), std::string::npos) << st.message();
}

TEST(GrowingContext, BoundedByTheKvBudget) {
  auto model = Model::load(kStories);
  ASSERT_TRUE(model.has_value());
  ContextParams p;
  p.n_batch = 64;
  p.n_threads = 1;
  p.kv_block = 16;
  p.kv_budget = 256 * 1024;  // 5 layers x 4 KV heads x 2 x 8 x 4 bytes = 1280 bytes a token: ~200 tokens
  auto c = Context::create(**model, p);
  ASSERT_TRUE(c.has_value());
  Status st = (*c)->decode(tokens(600), Logits::kLast);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kContextFull);
  EXPECT_NE(st.message().find("--kv-budget"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace lc
