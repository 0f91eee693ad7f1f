// -c 0: the context grows past the trained window as the input needs, with the numbers of a
// context sized for the input, and it is bounded by the KV budget with a typed error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
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

namespace lc {
namespace {

float max_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(DynamicNtk, AppendRotatesAPromptWithItsWholeLength) {
  // cache=append (transformers' cache): a prompt evaluated in one call is rotated with the table
  // of its whole length, however the engine chunks it; then each decoded token's key keeps its
  // own length's table.
  auto model = Model::load(kStories);
  ASSERT_TRUE(model.has_value());
  const int64_t nv = (*model)->hparams().n_vocab;
  ContextParams p;
  p.n_threads = 1;
  p.n_ctx = 1000;
  p.rope = "dynamic-ntk:factor=2";  // orig: the trained 128
  p.kv_type_k = DType::F16;         // append never rotates a stored key again
  ContextParams one = p, chunked = p;
  one.n_batch = 512;
  chunked.n_batch = 64;
  auto a = Context::create(**model, one);
  auto b = Context::create(**model, chunked);
  ASSERT_TRUE(a.has_value() && b.has_value()) << (a ? "" : a.error().message);
  const auto t = tokens(300);
  ASSERT_TRUE((*a)->decode(t, Logits::kLast).is_ok());
  ASSERT_TRUE((*b)->decode(t, Logits::kLast).is_ok());
  EXPECT_LT(max_diff((*a)->logits(0), (*b)->logits(0), nv), 1e-3);
  EXPECT_FALSE((*a)->kv().mixed_rope());
  const int32_t next = 7;
  ASSERT_TRUE((*a)->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
  EXPECT_TRUE((*a)->kv().mixed_rope());
}

// x rotated by +p (or back by -p) with table t, in double; mscale applied (or divided out).
std::vector<double> rot(const std::vector<double>& x, const RopeTable& t, int32_t p, bool back) {
  std::vector<double> y = x;
  const int64_t half = t.n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(static_cast<float>(p) * t.inv_freq[static_cast<size_t>(i)]) * (back ? -1 : 1);
    const double m = back ? 1.0 / t.mscale : t.mscale, c = std::cos(a) * m, s = std::sin(a) * m;
    const int64_t i0 = t.neox ? i : 2 * i, i1 = t.neox ? i + half : 2 * i + 1;
    y[static_cast<size_t>(i0)] = x[static_cast<size_t>(i0)] * c - x[static_cast<size_t>(i1)] * s;
    y[static_cast<size_t>(i1)] = x[static_cast<size_t>(i0)] * s + x[static_cast<size_t>(i1)] * c;
  }
  return y;
}

TEST(DynamicNtk, RerotateMovesCachedKeysToTheCurrentTableAppendKeepsThem) {
  // After a 300-token prompt and one decoded token: with cache=append a prompt key is still
  // the one rotated with the 300-token table, bit for bit; with cache=rerotate it is that key
  // rotated back with the 300-token table and on with the 301-token one.
  auto model = Model::load(kStories);
  ASSERT_TRUE(model.has_value());
  const int64_t d = (*model)->hparams().head_dim;
  ContextParams p;
  p.n_threads = 1;
  p.n_ctx = 1000;
  p.n_batch = 512;
  p.rope = "dynamic-ntk:factor=2";
  auto c = Context::create(**model, p);
  p.rope = "dynamic-ntk:factor=2,cache=rerotate";
  auto a = Context::create(**model, p);
  ASSERT_TRUE(a.has_value() && c.has_value());
  const auto t = tokens(300);
  const int32_t next = 11;
  ASSERT_TRUE((*c)->decode(t, Logits::kLast).is_ok());
  const RopeTable t300 = (*c)->kv().rope(1);
  std::vector<float> before(static_cast<size_t>(d)), after(static_cast<size_t>(d)), moved(static_cast<size_t>(d));
  (*c)->kv().read_keys(1, 0, 5, 1, before.data());
  ASSERT_TRUE((*c)->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
  const RopeTable t301 = (*c)->kv().rope(1);
  ASSERT_NE(t300.inv_freq, t301.inv_freq);
  (*c)->kv().read_keys(1, 0, 5, 1, after.data());
  EXPECT_EQ(before, after);
  ASSERT_TRUE((*a)->decode(t, Logits::kLast).is_ok());
  ASSERT_TRUE((*a)->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
  (*a)->kv().read_keys(1, 0, 5, 1, moved.data());
  const auto want = rot(rot(std::vector<double>(before.begin(), before.end()), t300, 5, true), t301, 5, false);
  double worst = 0, change = 0;
  for (int64_t i = 0; i < d; ++i) {
    worst = std::max(worst, std::abs(moved[static_cast<size_t>(i)] - want[static_cast<size_t>(i)]));
    change = std::max(change, std::abs(static_cast<double>(moved[static_cast<size_t>(i)]) - before[static_cast<size_t>(i)]));
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_GT(change, 1e-4);  // the tables differ enough at position 5 for the check to mean something
}

TEST(DynamicNtk, RefusesWhatCannotHoldItsKeys) {
  auto model = Model::load(kStories);
  ASSERT_TRUE(model.has_value());
  ContextParams p;
  p.n_threads = 1;
  p.n_ctx = 1000;
  p.rope = "dynamic-ntk:factor=2,cache=rerotate";
  p.kv_type_k = DType::F16;
  auto e = Context::create(**model, p);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("needs f32 keys"), std::string::npos) << e.error().message;
  p.rope = "dynamic-ntk:factor=2";
  p.attn = "fixed:distance=32";
  e = Context::create(**model, p);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("cache=append"), std::string::npos) << e.error().message;
  p.attn = "dense";
  auto c = Context::create(**model, p);
  ASSERT_TRUE(c.has_value());
  Status st = (*c)->set_attention("infllm");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("cache=rerotate"), std::string::npos) << st.message();
  EXPECT_TRUE((*c)->set_attention("quest").is_ok());
}

}  // namespace
}  // namespace lc
