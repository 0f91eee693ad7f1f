// Sharing a prefix's KV blocks between caches of one pool (KvCache::adopt_prefix, the server's
// cross-slot prefix reuse), against oracles the test builds: a cache that was given the same
// tokens itself, and the source's rows read before any change. Copy-on-write: neither cache
// ever sees the other's later changes (eviction, K-shift, hiding, writes after a truncation).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/kv_test_support.h"

namespace lc {
namespace {

constexpr int64_t kLayers = 2, kHeads = 2, kDim = 16, kBlock = 8;

KvCacheConfig config(std::shared_ptr<BlockPool> pool) {
  KvCacheConfig c = kvtest::cache_config(kLayers, kHeads, kDim, kBlock, DType::F16, DType::F16, /*neox=*/false);
  c.pool = std::move(pool);
  return c;
}

std::shared_ptr<BlockPool> pool_for(int64_t budget = 0) {
  auto probe = KvCache::create(config(nullptr));
  EXPECT_TRUE(probe.has_value());
  auto p = BlockPool::create((*probe)->pool().block_bytes(), budget, "");
  EXPECT_TRUE(p.has_value());
  return std::shared_ptr<BlockPool>(std::move(*p));
}

std::unique_ptr<KvCache> make(std::shared_ptr<BlockPool> pool) {
  auto kv = KvCache::create(config(std::move(pool)));
  EXPECT_TRUE(kv.has_value()) << (kv ? "" : kv.error().message);
  return std::move(*kv);
}

// Token t's rows (pre-RoPE), the same in every cache: a function of t only.
void rows(int64_t t, std::vector<float>& k, std::vector<float>& v) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + t));
  std::normal_distribution<float> nd;
  k.resize(kHeads * kDim);
  v.resize(kHeads * kDim);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
}

void append(KvCache& kv, int64_t a, int64_t b) {
  std::vector<float> k, v;
  for (int64_t t = a; t < b; ++t) {
    rows(t, k, v);
    const int32_t pos = static_cast<int32_t>(t);
    for (int64_t il = 0; il < kLayers; ++il) ASSERT_TRUE(kv.append(il, 1, k.data(), v.data(), &pos).is_ok());
  }
}

std::vector<float> keys(const KvCache& kv, int64_t il, int64_t h) {
  std::vector<float> out(static_cast<size_t>(kv.n_tokens(il, h) * kDim));
  kv.read_keys(il, h, 0, kv.n_tokens(il, h), out.data());
  return out;
}
std::vector<float> values(const KvCache& kv, int64_t il, int64_t h) {
  std::vector<float> out(static_cast<size_t>(kv.n_tokens(il, h) * kDim));
  kv.read_values(il, h, 0, kv.n_tokens(il, h), out.data());
  return out;
}

// Same rows and metadata in every head.
void expect_same(const KvCache& a, const KvCache& b) {
  for (int64_t il = 0; il < kLayers; ++il)
    for (int64_t h = 0; h < kHeads; ++h) {
      ASSERT_EQ(a.n_tokens(il, h), b.n_tokens(il, h));
      EXPECT_EQ(keys(a, il, h), keys(b, il, h));
      EXPECT_EQ(values(a, il, h), values(b, il, h));
      const int64_t n = a.n_tokens(il, h);
      EXPECT_EQ(std::vector<int32_t>(a.positions(il, h), a.positions(il, h) + n),
                std::vector<int32_t>(b.positions(il, h), b.positions(il, h) + n));
      EXPECT_EQ(std::vector<int32_t>(a.seq_index(il, h), a.seq_index(il, h) + n),
                std::vector<int32_t>(b.seq_index(il, h), b.seq_index(il, h) + n));
    }
}

TEST(KvShare, AdoptedPrefixEqualsTheTokensAppendedHere) {
  auto pool = pool_for();
  auto src = make(pool), dst = make(pool), oracle = make(pool_for());
  append(*src, 0, 45);
  const int64_t used = pool->n_used();
  auto took = dst->adopt_prefix(*src, 30);
  ASSERT_TRUE(took.has_value()) << took.error().message;
  EXPECT_EQ(*took, 24);  // whole blocks of 8
  EXPECT_EQ(pool->n_used(), used);  // nothing copied
  EXPECT_EQ(pool->n_shared(), kLayers * kHeads * 3);
  EXPECT_EQ(dst->n_appended(0), 24);
  append(*oracle, 0, 24);
  expect_same(*dst, *oracle);
  // Both go on independently.
  append(*dst, 24, 40);
  append(*oracle, 24, 40);
  expect_same(*dst, *oracle);
  // The source goes away: the shared blocks stay with dst.
  src->truncate(0);
  src.reset();
  EXPECT_EQ(pool->n_shared(), 0);
  expect_same(*dst, *oracle);
  dst->truncate(0);
  EXPECT_EQ(pool->n_used(), 0);
  // A cache that goes away gives its blocks back to the shared pool (the server drops and
  // remakes slots' sessions).
  auto gone = make(pool);
  append(*gone, 0, 20);
  EXPECT_GT(pool->n_used(), 0);
  gone.reset();
  EXPECT_EQ(pool->n_used(), 0);
}

TEST(KvShare, ChangesCopyTheSharedBlocksFirst) {
  auto pool = pool_for();
  auto src = make(pool), dst = make(pool), before = make(pool_for());
  append(*src, 0, 32);
  append(*before, 0, 32);
  ASSERT_EQ(*dst->adopt_prefix(*src, 32), 32);
  // dst evicts (a press, streaming) and shifts positions: src is untouched.
  std::vector<int32_t> keep;
  for (int32_t i = 0; i < 32; i += 3) keep.push_back(i);
  ASSERT_TRUE(dst->retain(0, 1, keep).is_ok());
  ASSERT_TRUE(dst->shift_positions(1, 0, 0, 16, 5).is_ok());
  expect_same(*src, *before);
  // dst zeroes key channels (ThinK): src is untouched, dst's channels read back as zero.
  const std::vector<int32_t> channels = {1, 6};
  ASSERT_TRUE(dst->zero_key_channels(1, 1, channels).is_ok());
  expect_same(*src, *before);
  {
    std::vector<float> kz(static_cast<size_t>(dst->n_tokens(1, 1) * kDim));
    dst->read_keys(1, 1, 0, dst->n_tokens(1, 1), kz.data());
    for (int64_t j = 0; j < dst->n_tokens(1, 1); ++j)
      for (int32_t ch : channels) EXPECT_EQ(kz[static_cast<size_t>(j * kDim + ch)], 0.0f);
  }
  // dst hides a fragment and restores it: src is untouched.
  auto frag = dst->extract(8, 8);
  ASSERT_TRUE(frag.has_value()) << frag.error().message;
  expect_same(*src, *before);
  ASSERT_TRUE(dst->insert(*frag).is_ok());
  // src truncates into a shared block, then writes new rows there: dst's rows stay.
  auto dst2 = make(pool), dst2_oracle = make(pool_for());
  ASSERT_EQ(*dst2->adopt_prefix(*src, 32), 32);
  append(*dst2_oracle, 0, 32);
  src->truncate(20);
  std::vector<float> k(kHeads * kDim, 9.0f), v(kHeads * kDim, -9.0f);
  for (int64_t t = 20; t < 28; ++t) {
    const int32_t pos = static_cast<int32_t>(t);
    for (int64_t il = 0; il < kLayers; ++il) ASSERT_TRUE(src->append(il, 1, k.data(), v.data(), &pos).is_ok());
  }
  expect_same(*dst2, *dst2_oracle);
}

TEST(KvShare, RefusesWhatCannotBeShared) {
  auto pool = pool_for();
  auto src = make(pool), dst = make(pool), other = make(pool_for());
  append(*src, 0, 24);
  EXPECT_FALSE(other->adopt_prefix(*src, 16).has_value());  // another pool
  append(*dst, 0, 3);
  EXPECT_FALSE(dst->adopt_prefix(*src, 16).has_value());  // not empty
  dst->truncate(0);
  std::vector<int32_t> keep = {0, 2, 4};
  ASSERT_TRUE(src->retain(1, 0, keep).is_ok());  // src evicted part of the prefix
  EXPECT_FALSE(dst->adopt_prefix(*src, 16).has_value());
  EXPECT_EQ(dst->n_appended(0), 0);
  auto few = dst->adopt_prefix(*src, 5);  // below one block: nothing, and no error
  ASSERT_TRUE(few.has_value());
  EXPECT_EQ(*few, 0);
}

// With a budget, a copy-on-write that finds no room is an error and leaves the cache usable.
TEST(KvShare, CopyOnWriteRespectsTheBudget) {
  auto probe = make(pool_for());
  const int64_t bb = static_cast<int64_t>(probe->pool().block_bytes());
  auto pool = pool_for(bb * kLayers * kHeads * 2);  // room for 2 blocks per head, once
  auto src = make(pool), dst = make(pool);
  append(*src, 0, 16);
  ASSERT_EQ(*dst->adopt_prefix(*src, 16), 16);
  std::vector<int32_t> keep = {0, 1, 2};
  Status s = dst->retain(0, 0, keep);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("shared"), std::string::npos) << s.message();
  EXPECT_EQ(dst->n_tokens(0, 0), 16);
}

}  // namespace
}  // namespace lc
