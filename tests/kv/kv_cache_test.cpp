// The paged KV cache against the test's own data: storage round trips, block accounting,
// compaction, budget, spill and re-rotation.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace lc {
namespace {

RopeTable rope(int64_t d, bool neox = true) {
  LlamaCppRopeParams p;
  p.n_rot = d;
  p.neox = neox;
  return make_llama_cpp_rope(p);
}

KvCacheConfig config(int64_t Hkv, int64_t d, int64_t block, int64_t n_layer = 1) {
  KvCacheConfig c;
  c.n_layer = n_layer;
  c.n_head_kv = Hkv;
  c.head_dim = d;
  c.head_dim_v = d;
  c.block_tokens = block;
  c.rope = rope(d);
  return c;
}

struct Data {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  Data(int64_t T, int64_t Hkv, int64_t d, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(T * Hkv * d));
    v.resize(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (int64_t t = 0; t < T; ++t) pos.push_back(static_cast<int32_t>(t));
  }
};

std::unique_ptr<KvCache> make(const KvCacheConfig& c) {
  auto kv = KvCache::create(c);
  EXPECT_TRUE(kv.has_value()) << (kv ? "" : kv.error().message);
  return std::move(kv.value());
}

void expect_conserved(const KvCache& kv) {
  const BlockPool& p = kv.pool();
  EXPECT_EQ(p.n_used() + p.n_free_ids(), p.n_ids());
  EXPECT_EQ(p.n_used() - p.n_spilled() + p.ram_slots_free(), p.ram_slots());
  int64_t blocks = 0;
  for (int64_t il = 0; il < kv.n_layer(); ++il)
    for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
      blocks += kv.n_blocks(il, h);
      EXPECT_EQ(kv.n_blocks(il, h), (kv.n_tokens(il, h) + kv.block_tokens() - 1) / kv.block_tokens());
    }
  EXPECT_EQ(blocks, p.n_used());
}

TEST(KvCache, ParseByteSize) {
  EXPECT_EQ(*parse_byte_size("4096"), 4096);
  EXPECT_EQ(*parse_byte_size("64k"), 64 * 1024);
  EXPECT_EQ(*parse_byte_size("512M"), 512LL << 20);
  EXPECT_EQ(*parse_byte_size("2G"), 2LL << 30);
  EXPECT_EQ(*parse_byte_size("1.5GiB"), 3LL << 29);
  EXPECT_EQ(*parse_byte_size("100B"), 100);
  for (const char* bad : {"", "M", "12X", "-5", "1.2.3G", "5Gb x"}) {
    auto r = parse_byte_size(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_NE(r.error().message.find("512M"), std::string::npos);
  }
  EXPECT_EQ(*parse_kv_type("q8_0"), DType::Q8_0);
  auto bad = parse_kv_type("q4_0");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("f32, f16, bf16, q8_0"), std::string::npos);
}

TEST(KvCache, RejectsBadConfig) {
  auto c = config(2, 48, 16);
  c.type_k = DType::Q8_0;  // 48 is not a multiple of 32
  auto kv = KvCache::create(c);
  ASSERT_FALSE(kv.has_value());
  EXPECT_NE(kv.error().message.find("--kv-type-k"), std::string::npos);
  auto c2 = config(2, 64, 0);
  EXPECT_FALSE(KvCache::create(c2).has_value());
}

TEST(KvCache, StoresRotatedKeysAndValues) {
  const int64_t T = 100, H = 3, d = 64;
  Data x(T, H, d, 1);
  auto c = config(H, d, 16);
  auto kv = make(c);
  ASSERT_TRUE(kv->append(0, 37, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  ASSERT_TRUE(kv->append(0, T - 37, x.k.data() + 37 * H * d, x.v.data() + 37 * H * d, x.pos.data() + 37).is_ok());
  std::vector<float> kr = x.k;
  c.rope.apply(kr.data(), T, H, d, x.pos.data());
  std::vector<float> kk(static_cast<size_t>(T * d)), vv(kk.size());
  for (int64_t h = 0; h < H; ++h) {
    ASSERT_EQ(kv->n_tokens(0, h), T);
    kv->read_keys(0, h, 0, T, kk.data());
    kv->read_values(0, h, 0, T, vv.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d; ++i) {
        EXPECT_EQ(kk[static_cast<size_t>(t * d + i)], kr[static_cast<size_t>((t * H + h) * d + i)]);
        EXPECT_EQ(vv[static_cast<size_t>(t * d + i)], x.v[static_cast<size_t>((t * H + h) * d + i)]);
      }
    EXPECT_EQ(kv->positions(0, h)[T - 1], T - 1);
    EXPECT_EQ(kv->seq_index(0, h)[T - 1], T - 1);
  }
  expect_conserved(*kv);
}

TEST(KvCache, MemoryGrowsWithTheContextUsed) {
  const int64_t H = 2, d = 64;
  Data x(4000, H, d, 2);
  auto kv = make(config(H, d, 16));
  EXPECT_EQ(kv->memory().resident_bytes, 0u);
  ASSERT_TRUE(kv->append(0, 10, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  const size_t small = kv->memory().resident_bytes;
  ASSERT_TRUE(kv->append(0, 3990, x.k.data() + 10 * H * d, x.v.data() + 10 * H * d, x.pos.data() + 10).is_ok());
  const size_t large = kv->memory().resident_bytes;
  EXPECT_GT(small, 0u);
  EXPECT_LT(small * 4, large);
  EXPECT_EQ(kv->memory().bytes_per_token, static_cast<size_t>(H * d * 4 * 2));
  EXPECT_GE(kv->memory().in_use_bytes, static_cast<size_t>(4000 * H * d * 8));
}

TEST(KvCache, RetainCompactsPerHeadAndFreesBlocks) {
  const int64_t T = 200, H = 2, d = 32;
  Data x(T, H, d, 3);
  auto c = config(H, d, 16);
  auto kv = make(c);
  ASSERT_TRUE(kv->append(0, T, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  const int64_t used_before = kv->pool().n_used();
  std::vector<int32_t> keep;
  for (int32_t j = 0; j < T; j += 5) keep.push_back(j);  // 40 tokens
  ASSERT_TRUE(kv->retain(0, 1, keep).is_ok());
  EXPECT_EQ(kv->n_tokens(0, 0), T);
  EXPECT_EQ(kv->n_tokens(0, 1), 40);  // heads hold different numbers of tokens
  EXPECT_EQ(kv->pool().n_used(), used_before - (13 - 3));
  expect_conserved(*kv);
  std::vector<float> kr = x.k;
  c.rope.apply(kr.data(), T, H, d, x.pos.data());
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t i = 0; i < 40; ++i) {
    kv->read_keys(0, 1, i, 1, row.data());
    EXPECT_EQ(row[3], kr[static_cast<size_t>((keep[static_cast<size_t>(i)] * H + 1) * d + 3)]);
    EXPECT_EQ(kv->seq_index(0, 1)[i], keep[static_cast<size_t>(i)]);
  }
  // Bad keep lists are errors naming the head.
  std::vector<int32_t> bad = {3, 2};
  auto st = kv->retain(0, 0, bad);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("head 0"), std::string::npos);
  // Freed blocks are reused.
  ASSERT_TRUE(kv->append(0, 100, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  expect_conserved(*kv);
  kv->truncate(150);
  EXPECT_EQ(kv->n_tokens(0, 0), 150);
  EXPECT_EQ(kv->n_appended(0), 150);
  expect_conserved(*kv);
  kv->clear();
  EXPECT_EQ(kv->pool().n_used(), 0);
  expect_conserved(*kv);
}

TEST(KvCache, BudgetErrorSaysHowManyTokensFit) {
  const int64_t H = 2, d = 64, B = 16;
  Data x(1000, H, d, 4);
  auto c = config(H, d, B, 2);
  const int64_t block_bytes = B * d * 4 * 2;
  c.budget_bytes = 20 * block_bytes;  // 20 blocks / (2 layers x 2 heads) = 5 blocks = 80 tokens
  auto kv = make(c);
  ASSERT_TRUE(kv->append(0, 80, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  ASSERT_TRUE(kv->append(1, 80, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  EXPECT_EQ(kv->tokens_that_fit(), 80);
  auto st = kv->append(0, 1, x.k.data(), x.v.data(), x.pos.data() + 80);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("80 tokens fit"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--kv-budget"), std::string::npos);
  EXPECT_EQ(kv->n_tokens(0, 0), 80);  // unchanged
  expect_conserved(*kv);
  EXPECT_LE(kv->memory().resident_bytes, static_cast<size_t>(c.budget_bytes));
}

TEST(KvCache, DefaultBudgetErrorNamesTheGrowingContext) {
  const int64_t H = 2, d = 64, B = 16;
  Data x(1000, H, d, 4);
  auto c = config(H, d, B, 2);
  c.budget_bytes = 20 * B * d * 4 * 2;
  c.budget_is_default = true;  // what -c 0 without --kv-budget sets
  auto kv = make(c);
  ASSERT_TRUE(kv->append(0, 80, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  ASSERT_TRUE(kv->append(1, 80, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  auto st = kv->append(0, 1, x.k.data(), x.v.data(), x.pos.data() + 80);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kContextFull);
  EXPECT_NE(st.message().find("-c 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("80 tokens are cached"), std::string::npos) << st.message();
  EXPECT_EQ(kv->n_tokens(0, 0), 80);
}

TEST(KvCache, EvictPolicyAsksTheEvictor) {
  const int64_t H = 1, d = 32, B = 8;
  Data x(400, H, d, 5);
  auto c = config(H, d, B);
  c.budget_bytes = 4 * B * d * 4 * 2;
  c.policy = KvBudgetPolicy::kEvict;
  auto kv = make(c);
  int calls = 0;
  kv->set_evictor([&](KvCache& k, int64_t il, int64_t) -> Status {
    ++calls;
    std::vector<int32_t> keep;  // keep the newest 8 tokens
    for (int64_t j = std::max<int64_t>(0, k.n_tokens(il, 0) - 8); j < k.n_tokens(il, 0); ++j)
      keep.push_back(static_cast<int32_t>(j));
    return k.retain(il, 0, keep);
  });
  for (int64_t t = 0; t < 400; t += 4)
    ASSERT_TRUE(kv->append(0, 4, x.k.data() + t * d, x.v.data() + t * d, x.pos.data() + t).is_ok());
  EXPECT_GT(calls, 10);
  EXPECT_LE(kv->n_tokens(0, 0), 32);
  EXPECT_EQ(kv->seq_index(0, 0)[kv->n_tokens(0, 0) - 1], 399);
  expect_conserved(*kv);
}

TEST(KvCache, SpillKeepsDataAndRemovesTheFile) {
  const int64_t H = 2, d = 64, T = 3000;
  Data x(T, H, d, 6);
  char tmpl[] = "/tmp/lc_kv_spillXXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  auto count_files = [&]() {
    int n = 0;
    if (DIR* dp = opendir(tmpl)) {
      while (dirent* e = readdir(dp)) n += e->d_name[0] != '.';
      closedir(dp);
    }
    return n;
  };
  {
    auto c = config(H, d, 32);
    c.type_k = DType::F16;
    c.budget_bytes = 256 * 1024;
    c.spill_dir = tmpl;
    auto kv = make(c);
    auto plain_cfg = config(H, d, 32);
    plain_cfg.type_k = DType::F16;
    auto plain = make(plain_cfg);
    for (int64_t t = 0; t < T; t += 250) {
      ASSERT_TRUE(kv->append(0, 250, x.k.data() + t * H * d, x.v.data() + t * H * d, x.pos.data() + t).is_ok());
      ASSERT_TRUE(plain->append(0, 250, x.k.data() + t * H * d, x.v.data() + t * H * d, x.pos.data() + t).is_ok());
    }
    const KvMemory m = kv->memory();
    EXPECT_GT(m.spilled_bytes, 0u);
    EXPECT_LE(m.resident_bytes, 256u * 1024);
    EXPECT_EQ(count_files(), 0);  // unlinked at creation: no exit path can leave it behind
    std::vector<float> a(static_cast<size_t>(T * d)), b(a.size());
    for (int64_t h = 0; h < H; ++h) {
      kv->read_keys(0, h, 0, T, a.data());
      plain->read_keys(0, h, 0, T, b.data());
      EXPECT_EQ(a, b);
      kv->read_values(0, h, 0, T, a.data());
      plain->read_values(0, h, 0, T, b.data());
      EXPECT_EQ(a, b);
    }
    // Compaction across tiers keeps the data too.
    std::vector<int32_t> keep;
    for (int32_t j = 0; j < T; j += 3) keep.push_back(j);
    ASSERT_TRUE(kv->retain(0, 0, keep).is_ok());
    ASSERT_TRUE(plain->retain(0, 0, keep).is_ok());
    kv->read_keys(0, 0, 0, kv->n_tokens(0, 0), a.data());
    plain->read_keys(0, 0, 0, plain->n_tokens(0, 0), b.data());
    EXPECT_EQ(a, b);
    expect_conserved(*kv);
  }
  EXPECT_EQ(count_files(), 0);
  rmdir(tmpl);
}

TEST(KvCache, ShiftPositionsReRotatesKeys) {
  const int64_t H = 1, d = 64, T = 50;
  Data x(T, H, d, 7);
  auto c = config(H, d, 16);
  auto kv = make(c);
  ASSERT_TRUE(kv->append(0, T, x.k.data(), x.v.data(), x.pos.data()).is_ok());
  ASSERT_TRUE(kv->shift_positions(0, 0, 10, 40, -6).is_ok());
  std::vector<int32_t> want(x.pos);
  for (int64_t t = 10; t < T; ++t) want[static_cast<size_t>(t)] -= 6;
  std::vector<float> kr = x.k;
  c.rope.apply(kr.data(), T, H, d, want.data());
  std::vector<float> got(static_cast<size_t>(T * d));
  kv->read_keys(0, 0, 0, T, got.data());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], kr[i], 2e-5);
  EXPECT_EQ(kv->positions(0, 0)[49], 43);
  EXPECT_FALSE(kv->shift_positions(0, 0, 40, 20, 1).is_ok());
}

TEST(KvCache, QuantisedTypesRoundTripWithinTolerance) {
  const int64_t H = 2, d = 64, T = 64;
  Data x(T, H, d, 8);
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0}) {
    auto c = config(H, d, 16);
    c.type_k = t;
    c.type_v = t;
    auto kv = make(c);
    ASSERT_TRUE(kv->append(0, T, x.k.data(), x.v.data(), x.pos.data()).is_ok());
    std::vector<float> vv(static_cast<size_t>(T * d));
    kv->read_values(0, 1, 0, T, vv.data());
    const double tol = t == DType::F16 ? 2e-3 : t == DType::BF16 ? 2e-2 : 4e-2;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t c2 = 0; c2 < d; ++c2)
        EXPECT_NEAR(vv[static_cast<size_t>(i * d + c2)], x.v[static_cast<size_t>((i * H + 1) * d + c2)],
                    tol * (1 + std::abs(x.v[static_cast<size_t>((i * H + 1) * d + c2)])));
    EXPECT_LT(kv->memory().bytes_per_token, static_cast<size_t>(H * d * 8));
  }
}

}  // namespace
// Blocks freed in any order are handed out again lowest slot first, i.e. in the order a fresh
// pool first gave them, so a cache refilled after an eviction is laid out like a fresh one.
TEST(BlockPool, FreedBlocksComeBackInAddressOrder) {
  auto pool = BlockPool::create(256, 0, "");
  ASSERT_TRUE(pool);
  BlockPool& p = **pool;
  std::vector<int32_t> ids;
  std::vector<const uint8_t*> first;  // pointer of the i-th block handed out
  for (int i = 0; i < 96; ++i) {
    auto id = p.allocate();
    ASSERT_TRUE(id);
    ids.push_back(*id);
    first.push_back(p.data(*id));
  }
  // Release every third block, in a scrambled order.
  std::vector<int> freed;
  for (int i = 0; i < 96; i += 3) freed.push_back(i);
  std::vector<int> order = freed;
  for (size_t i = 0; i < order.size(); ++i) std::swap(order[i], order[(i * 7 + 5) % order.size()]);
  for (int i : order) p.release(ids[static_cast<size_t>(i)]);
  for (size_t k = 0; k < freed.size(); ++k) {
    auto id = p.allocate();
    ASSERT_TRUE(id);
    EXPECT_EQ(p.data(*id), first[static_cast<size_t>(freed[k])]) << k;
  }
  EXPECT_EQ(p.ram_slots_free(), p.ram_slots() - 96);
}

}  // namespace lc
