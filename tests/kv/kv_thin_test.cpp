// Key channels dropped from storage (KvCache::drop_key_channels, ThinK's pruning with the memory
// given back). The definition: every read gives the dropped channels as zeros and every other
// entry as before, so a cache that drops channels must read exactly like one that zeroes them in
// place (zero_key_channels), through every later operation, while holding fewer blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <vector>

#include "core/fp16.h"
#include "kv/kv_cache.h"
#include "kv/kv_test_support.h"

namespace lc {
namespace {

KvCacheConfig config(DType tk, int64_t d = 64, int64_t block = 16, int64_t Hkv = 2) {
  return kvtest::cache_config(1, Hkv, d, block, tk, DType::F16);
}

std::unique_ptr<KvCache> make(const KvCacheConfig& c) { return kvtest::make_cache(c); }

// Appends n tokens at positions from p0 to both caches, one call each.
void append(std::initializer_list<KvCache*> caches, int64_t n, int32_t p0, std::mt19937& rng) {
  const KvCache& c0 = **caches.begin();
  const int64_t Hkv = c0.n_head_kv(), d = c0.head_dim();
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(n * Hkv * d)), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = p0 + static_cast<int32_t>(t);
  for (KvCache* kv : caches) ASSERT_TRUE(kv->append(0, n, k.data(), v.data(), pos.data()).is_ok());
}

std::vector<float> keys(const KvCache& kv, int64_t h) {
  std::vector<float> out(static_cast<size_t>(kv.n_tokens(0, h) * kv.head_dim()));
  kv.read_keys(0, h, 0, kv.n_tokens(0, h), out.data());
  return out;
}
std::vector<float> values(const KvCache& kv, int64_t h) {
  std::vector<float> out(static_cast<size_t>(kv.n_tokens(0, h) * kv.head_dim_v()));
  kv.read_values(0, h, 0, kv.n_tokens(0, h), out.data());
  return out;
}

// What attention reads: keys_f32/values_f32 (and the f16 in-place pointers where given) chunk by
// chunk of block_tokens, as the backends call them.
std::vector<float> chunked(const KvCache& kv, int64_t h, bool vals) {
  const int64_t n = kv.n_tokens(0, h), B = kv.block_tokens(), d = vals ? kv.head_dim_v() : kv.head_dim();
  std::vector<float> out(static_cast<size_t>(n * d)), scratch(static_cast<size_t>(B * d));
  for (int64_t first = 0; first < n; first += B) {
    const int64_t cnt = std::min(B, n - first);
    const uint16_t* f16 = vals ? kv.values_f16(0, h, first) : kv.keys_f16(0, h, first);
    if (f16) {
      for (int64_t i = 0; i < cnt * d; ++i) out[static_cast<size_t>(first * d + i)] = fp16_to_fp32(f16[i]);
      continue;
    }
    const float* r = vals ? kv.values_f32(0, h, first, cnt, scratch.data()) : kv.keys_f32(0, h, first, cnt, scratch.data());
    std::copy(r, r + cnt * d, out.begin() + first * d);
  }
  return out;
}

// Both caches hold the same tokens, positions and rows, as every reader sees them.
void expect_same(const KvCache& a, const KvCache& b) {
  for (int64_t h = 0; h < a.n_head_kv(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    ASSERT_EQ(a.n_tokens(0, h), b.n_tokens(0, h));
    const int64_t n = a.n_tokens(0, h);
    EXPECT_TRUE(std::equal(a.positions(0, h), a.positions(0, h) + n, b.positions(0, h)));
    EXPECT_TRUE(std::equal(a.seq_index(0, h), a.seq_index(0, h) + n, b.seq_index(0, h)));
    EXPECT_EQ(keys(a, h), keys(b, h));
    EXPECT_EQ(values(a, h), values(b, h));
    EXPECT_EQ(chunked(b, h, false), keys(a, h));
    EXPECT_EQ(chunked(b, h, true), values(a, h));
  }
}

std::vector<int32_t> pick_channels(int64_t d, int64_t n, uint32_t seed) {
  std::vector<int32_t> ch(static_cast<size_t>(d));
  for (int64_t e = 0; e < d; ++e) ch[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  std::mt19937 rng(seed);
  std::shuffle(ch.begin(), ch.end(), rng);
  ch.resize(static_cast<size_t>(n));
  std::sort(ch.begin(), ch.end());
  return ch;
}

TEST(KvThin, DroppedChannelsReadAsZerosKeptOnesUnchangedAndBlocksGoBack) {
  for (const DType t : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    auto kv = make(config(t));
    std::mt19937 rng(1);
    append({kv.get()}, 203, 0, rng);
    const auto K0 = keys(*kv, 0), V0 = values(*kv, 0), K1 = keys(*kv, 1);
    const int64_t blocks0 = kv->pool().n_used();
    const auto ch = pick_channels(64, 32, 2);
    auto given = kv->drop_key_channels(0, 0, ch);
    ASSERT_TRUE(given.has_value()) << given.error().message;
    EXPECT_EQ(kv->n_thin(0, 0), 203);
    EXPECT_EQ(kv->n_thin(0, 1), 0);
    // Half the key channels: a block of 16 tokens (16 x (256 + 128) bytes with f32 keys and f16
    // values, 16 x (128 + 128) with 16-bit keys) holds 6144 / (128 + 128) = 24 tokens, or
    // 4096 / (64 + 128) = 21.
    const int64_t per_block = t == DType::F32 ? 24 : 21;
    EXPECT_GT(*given, 0);
    EXPECT_EQ(kv->pool().n_used(), blocks0 - *given);
    EXPECT_EQ(kv->n_blocks(0, 0), (203 + per_block - 1) / per_block);
    const auto K = keys(*kv, 0);
    for (size_t i = 0; i < K.size(); ++i) {
      const bool dropped = std::binary_search(ch.begin(), ch.end(), static_cast<int32_t>(i % 64));
      ASSERT_EQ(K[i], dropped ? 0.0f : K0[i]) << "entry " << i;
    }
    EXPECT_EQ(values(*kv, 0), V0);
    EXPECT_EQ(keys(*kv, 1), K1);
    EXPECT_EQ(chunked(*kv, 0, false), K);
    EXPECT_EQ(chunked(*kv, 0, true), V0);
    // No read touches a slot that holds no token.
    kv->poison_unused();
    EXPECT_EQ(keys(*kv, 0), K);
    EXPECT_EQ(values(*kv, 0), V0);
  }
}

// Every later operation on a cache that dropped channels reads as on one that zeroed them.
TEST(KvThin, ReadsLikeZeroedChannelsThroughEveryLaterOperation) {
  for (const DType t : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    auto a = make(config(t)), b = make(config(t));
    std::mt19937 rng(3);
    append({a.get(), b.get()}, 150, 0, rng);
    for (int64_t h = 0; h < 2; ++h) {
      const auto ch = pick_channels(64, h == 0 ? 32 : 40, 4 + static_cast<uint32_t>(h));
      ASSERT_TRUE(a->zero_key_channels(0, h, ch).is_ok());
      auto g = b->drop_key_channels(0, h, ch);
      ASSERT_TRUE(g.has_value() && *g > 0);
    }
    expect_same(*a, *b);
    // Generated tokens keep every channel and go after the thin blocks.
    for (int i = 0; i < 37; ++i) append({a.get(), b.get()}, 1, 150 + i, rng);
    EXPECT_EQ(b->n_thin(0, 0), 150);
    expect_same(*a, *b);
    b->poison_unused();
    expect_same(*a, *b);
    // Eviction: keep a random subset (thin and ordinary tokens), then a second one.
    for (int round = 0; round < 2; ++round) {
      for (int64_t h = 0; h < 2; ++h) {
        std::vector<int32_t> keep;
        std::bernoulli_distribution coin(round == 0 ? 0.6 : 0.8);
        for (int32_t i = 0; i < static_cast<int32_t>(a->n_tokens(0, h)); ++i)
          if (coin(rng)) keep.push_back(i);
        ASSERT_TRUE(a->retain(0, h, keep).is_ok());
        ASSERT_TRUE(b->retain(0, h, keep).is_ok());
      }
      expect_same(*a, *b);
      append({a.get(), b.get()}, 5, 300 + 5 * round, rng);
      expect_same(*a, *b);
    }
    EXPECT_GT(b->n_thin(0, 0), 0);
    b->poison_unused();
    expect_same(*a, *b);
    // Saved and restored: the state holds every channel (zeros in the dropped ones).
    std::stringstream sa, sb;
    ASSERT_TRUE(a->write_state(sa).is_ok());
    ASSERT_TRUE(b->write_state(sb).is_ok());
    EXPECT_EQ(sa.str(), sb.str());
    auto c = make(config(t));
    ASSERT_TRUE(c->read_state(sb).is_ok());
    expect_same(*a, *c);
    // A rewind into the thin tokens, then new tokens.
    const int64_t cut = b->seq_index(0, 0)[40];
    a->truncate(cut);
    b->truncate(cut);
    EXPECT_EQ(b->n_thin(0, 0), 40);
    expect_same(*a, *b);
    append({a.get(), b.get()}, 20, 400, rng);
    expect_same(*a, *b);
    // A K-shift and a hidden and restored fragment store the keys with every channel again.
    ASSERT_TRUE(a->shift_positions(0, 1, 3, 10, -2).is_ok());
    ASSERT_TRUE(b->shift_positions(0, 1, 3, 10, -2).is_ok());
    EXPECT_EQ(b->n_thin(0, 1), 0);
    expect_same(*a, *b);
    auto fa = a->extract(5, 12);
    auto fb = b->extract(5, 12);
    ASSERT_TRUE(fa.has_value() && fb.has_value());
    EXPECT_EQ(fa->heads[0].k, fb->heads[0].k);
    expect_same(*a, *b);
    ASSERT_TRUE(a->insert(*fa).is_ok());
    ASSERT_TRUE(b->insert(*fb).is_ok());
    expect_same(*a, *b);
  }
}

// q8_0 keys: the kept channels are quantised again in groups of 32; dropping fewer than 32 of
// 64 saves no block, and the channels are then zeroed in place.
TEST(KvThin, QuantisedKeys) {
  auto kv = make(config(DType::Q8_0));
  std::mt19937 rng(5);
  append({kv.get()}, 100, 0, rng);
  const auto K0 = keys(*kv, 0);
  const auto ch = pick_channels(64, 32, 6);
  auto g = kv->drop_key_channels(0, 0, ch);
  ASSERT_TRUE(g.has_value());
  EXPECT_GT(*g, 0);
  const auto K = keys(*kv, 0);
  for (size_t i = 0; i < K.size(); ++i) {
    if (std::binary_search(ch.begin(), ch.end(), static_cast<int32_t>(i % 64))) {
      ASSERT_EQ(K[i], 0.0f);
    } else {
      // Two q8_0 roundings of a standard normal row: each within half a step of max|x| / 127.
      ASSERT_NEAR(K[i], K0[i], 0.06f) << "entry " << i;
    }
  }
  const auto few = pick_channels(64, 16, 7);
  auto g1 = kv->drop_key_channels(0, 1, few);
  ASSERT_TRUE(g1.has_value());
  EXPECT_EQ(*g1, 0);
  EXPECT_EQ(kv->n_thin(0, 1), 0);
  const auto K1 = keys(*kv, 1);
  for (int32_t e : few)
    for (int64_t j = 0; j < 100; ++j) ASSERT_EQ(K1[static_cast<size_t>(j * 64 + e)], 0.0f);
}

// Where the keys cannot be stored thin, the channels are zeroed in place and no block is given
// back: blocks shared with another cache, a dynamic rope table; and a thin cache shares no prefix.
TEST(KvThin, FallsBackToZeroingAndRefusesToShareThinBlocks) {
  KvCacheConfig c = config(DType::F32);
  auto probe = make(c);
  auto shared = BlockPool::create(probe->pool().block_bytes(), 0, "");
  ASSERT_TRUE(shared.has_value());
  c.pool = std::move(*shared);
  auto src = make(c), dst = make(c);
  std::mt19937 rng(8);
  append({src.get()}, 64, 0, rng);
  auto took = dst->adopt_prefix(*src, 64);
  ASSERT_TRUE(took.has_value());
  EXPECT_EQ(*took, 64);
  const auto ch = pick_channels(64, 32, 9);
  auto g = dst->drop_key_channels(0, 0, ch);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(*g, 0);
  EXPECT_EQ(dst->n_thin(0, 0), 0);
  for (size_t i = 0; i < 64 * 64; ++i)
    if (std::binary_search(ch.begin(), ch.end(), static_cast<int32_t>(i % 64))) {
      ASSERT_EQ(keys(*dst, 0)[i], 0.0f);
    }
  // The source drops for real; nobody may then share its blocks.
  auto gs = src->drop_key_channels(0, 0, ch);
  ASSERT_TRUE(gs.has_value());
  EXPECT_GT(*gs, 0);
  auto third = make(c);
  auto t2 = third->adopt_prefix(*src, 64);
  ASSERT_FALSE(t2.has_value());
  EXPECT_NE(t2.error().message.find("dropped channels"), std::string::npos) << t2.error().message;

  KvCacheConfig dyn = config(DType::F32);
  dyn.rope_provider = [r = dyn.rope](int64_t) { return r; };
  auto d = make(dyn);
  append({d.get()}, 64, 0, rng);
  auto gd = d->drop_key_channels(0, 0, ch);
  ASSERT_TRUE(gd.has_value());
  EXPECT_EQ(*gd, 0);
  EXPECT_EQ(d->n_thin(0, 0), 0);
  // Bad channels are errors.
  EXPECT_FALSE(d->drop_key_channels(0, 0, std::vector<int32_t>{64}).has_value());
  EXPECT_FALSE(d->drop_key_channels(1, 0, ch).has_value());
}

}  // namespace
}  // namespace lc
