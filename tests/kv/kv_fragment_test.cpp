// KvCache::extract / insert (hiding a fragment of the sequence and restoring it) against
// oracles built by the test: a second cache that was only ever given the tokens outside the
// fragment (same positions and sequence indices), and the original cache itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/kv_test_support.h"

namespace lc {
namespace {

constexpr int64_t kLayers = 3, kHeads = 2, kDim = 32;

KvCacheConfig config(int64_t block, DType t) { return kvtest::cache_config(kLayers, kHeads, kDim, block, t, t); }

std::unique_ptr<KvCache> make(const KvCacheConfig& c) { return kvtest::make_cache(c); }

// Random pre-RoPE rows for T tokens: per layer k, v [T, kHeads, kDim].
struct Rows {
  std::vector<std::vector<float>> k, v;  // [layer]
  explicit Rows(int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    for (int64_t il = 0; il < kLayers; ++il) {
      k.emplace_back(static_cast<size_t>(T * kHeads * kDim));
      v.emplace_back(k.back().size());
      for (auto& x : k.back()) x = nd(rng);
      for (auto& x : v.back()) x = nd(rng);
    }
  }
};

// Appends tokens [a, b) of rows to every layer, one token per call when `single`, at positions
// a + 7 * t (not the sequence index, so the two are told apart), seq id t % 3.
void append_range(KvCache& kv, const Rows& r, int64_t a, int64_t b) {
  for (int64_t il = 0; il < kLayers; ++il)
    for (int64_t t = a; t < b; ++t) {
      const int32_t pos = static_cast<int32_t>(100 + 7 * t);
      ASSERT_TRUE(kv.append(il, 1, r.k[static_cast<size_t>(il)].data() + t * kHeads * kDim,
                            r.v[static_cast<size_t>(il)].data() + t * kHeads * kDim, &pos,
                            static_cast<int32_t>(t % 3))
                      .is_ok());
    }
}

struct HeadDump {
  std::vector<int32_t> pos, idx, seq;
  std::vector<float> k, v;
  bool operator==(const HeadDump& o) const {
    auto bits_eq = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    };
    return pos == o.pos && idx == o.idx && seq == o.seq && bits_eq(k, o.k) && bits_eq(v, o.v);
  }
};

HeadDump dump(const KvCache& kv, int64_t il, int64_t h) {
  HeadDump d;
  const int64_t n = kv.n_tokens(il, h);
  d.pos.assign(kv.positions(il, h), kv.positions(il, h) + n);
  d.idx.assign(kv.seq_index(il, h), kv.seq_index(il, h) + n);
  d.seq.assign(kv.seq_ids(il, h), kv.seq_ids(il, h) + n);
  d.k.resize(static_cast<size_t>(n * kDim));
  d.v.resize(static_cast<size_t>(n * kDim));
  kv.read_keys(il, h, 0, n, d.k.data());
  kv.read_values(il, h, 0, n, d.v.data());
  return d;
}

// Every head's tokens keep only those whose sequence index passes keep().
template <class Keep>
HeadDump filter(const HeadDump& d, Keep keep) {
  HeadDump o;
  for (size_t i = 0; i < d.idx.size(); ++i) {
    if (!keep(d.idx[i])) continue;
    o.pos.push_back(d.pos[i]);
    o.idx.push_back(d.idx[i]);
    o.seq.push_back(d.seq[i]);
    o.k.insert(o.k.end(), d.k.begin() + static_cast<long>(i * kDim), d.k.begin() + static_cast<long>((i + 1) * kDim));
    o.v.insert(o.v.end(), d.v.begin() + static_cast<long>(i * kDim), d.v.begin() + static_cast<long>((i + 1) * kDim));
  }
  return o;
}

void expect_same(const KvCache& a, const KvCache& b, const std::string& what) {
  for (int64_t il = 0; il < kLayers; ++il)
    for (int64_t h = 0; h < kHeads; ++h) {
      EXPECT_EQ(a.n_tokens(il, h), b.n_tokens(il, h)) << what << " layer " << il << " head " << h;
      EXPECT_TRUE(dump(a, il, h) == dump(b, il, h)) << what << " layer " << il << " head " << h;
    }
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

struct Case {
  int64_t block;
  DType type;
};
void PrintTo(const Case& c, std::ostream* os) { *os << dtype_name(c.type) << " block " << c.block; }

class KvFragmentTest : public ::testing::TestWithParam<Case> {};

// Extract [a, b) = a cache given only the tokens outside it; insert = the original, bit for bit.
TEST_P(KvFragmentTest, ExtractMatchesACacheWithoutTheFragmentAndInsertRestoresIt) {
  const auto [block, type] = GetParam();
  constexpr int64_t T = 53;
  const Rows rows(T, 7);
  for (auto [a, b] : {std::pair<int64_t, int64_t>{5, 23}, {0, 9}, {40, 53}, {17, 18}}) {
    SCOPED_TRACE(testing::Message() << "fragment [" << a << ", " << b << ") block " << block);
    auto orig = make(config(block, type));
    append_range(*orig, rows, 0, T);
    // Head (1, 1) evicted some tokens inside and outside the fragment first: it holds fewer.
    std::vector<int32_t> keep;
    for (int32_t i = 0; i < T; ++i)
      if (i % 4 != 1) keep.push_back(i);
    ASSERT_TRUE(orig->retain(1, 1, keep).is_ok());
    auto kv = make(config(block, type));
    append_range(*kv, rows, 0, T);
    ASSERT_TRUE(kv->retain(1, 1, keep).is_ok());
    std::vector<uint64_t> epochs;
    for (int64_t il = 0; il < kLayers; ++il)
      for (int64_t h = 0; h < kHeads; ++h) epochs.push_back(kv->epoch(il, h));
    const int64_t used_before = kv->pool().n_used();

    auto frag = kv->extract(a, b - a);
    ASSERT_TRUE(frag.has_value()) << frag.error().message;
    // The oracle: the original cache's rows and metadata, filtered in the test by sequence index.
    for (int64_t il = 0; il < kLayers; ++il)
      for (int64_t h = 0; h < kHeads; ++h) {
        const HeadDump want = filter(dump(*orig, il, h), [&](int32_t s) { return s < a || s >= b; });
        EXPECT_TRUE(dump(*kv, il, h) == want) << "layer " << il << " head " << h;
        EXPECT_EQ(kv->n_appended(il), T);
        const bool lost = dump(*orig, il, h).idx.size() != want.idx.size();
        if (lost) {
          EXPECT_NE(kv->epoch(il, h), epochs[static_cast<size_t>(il * kHeads + h)]) << "summaries must rebuild";
        } else {
          EXPECT_EQ(kv->epoch(il, h), epochs[static_cast<size_t>(il * kHeads + h)]) << "nothing changed";
        }
      }
    expect_conserved(*kv);
    EXPECT_LE(kv->pool().n_used(), used_before);
    int64_t in_range = 0;
    for (int64_t il = 0; il < kLayers; ++il)
      for (int64_t h = 0; h < kHeads; ++h)
        in_range += static_cast<int64_t>(
            filter(dump(*orig, il, h), [&](int32_t s) { return s >= a && s < b; }).idx.size());
    EXPECT_EQ(frag->n_tokens(), in_range);
    for (int64_t i = 0; i < frag->head(1, 1).n(); ++i) EXPECT_NE(frag->head(1, 1).idx[static_cast<size_t>(i)] % 4, 1);

    std::vector<uint64_t> mid;
    for (int64_t il = 0; il < kLayers; ++il)
      for (int64_t h = 0; h < kHeads; ++h) mid.push_back(kv->epoch(il, h));
    ASSERT_TRUE(kv->insert(*frag).is_ok());
    expect_same(*kv, *orig, "after insert");
    for (int64_t il = 0; il < kLayers; ++il)
      for (int64_t h = 0; h < kHeads; ++h)
        if (frag->head(il, h).n() > 0) {
          EXPECT_NE(kv->epoch(il, h), mid[static_cast<size_t>(il * kHeads + h)]) << "summaries must rebuild";
        }
    // Raw storage too (f16 halves, not just their f32 values).
    if (type == DType::F16) {
      for (int64_t il = 0; il < kLayers; ++il)
        for (int64_t h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < kv->n_tokens(il, h); ++i) {
            EXPECT_EQ(0, std::memcmp(kv->keys_f16(il, h, i), orig->keys_f16(il, h, i), kDim * 2));
            EXPECT_EQ(0, std::memcmp(kv->values_f16(il, h, i), orig->values_f16(il, h, i), kDim * 2));
          }
    }
    expect_conserved(*kv);
    EXPECT_EQ(kv->pool().n_used(), orig->pool().n_used());
  }
}

// The same against a second cache built another way: given the same tokens, it keeps only
// those outside [a, b) with retain() on every head (append order is the only way to give a
// token its sequence index, so the oracle cannot skip them while appending).
TEST_P(KvFragmentTest, ExtractEqualsRetainOfTheOutsideTokens) {
  const auto [block, type] = GetParam();
  constexpr int64_t T = 41;
  const Rows rows(T, 11);
  const int64_t a = 3, b = 30;
  auto kv = make(config(block, type));
  auto oracle = make(config(block, type));
  append_range(*kv, rows, 0, T);
  append_range(*oracle, rows, 0, T);
  std::vector<int32_t> outside;
  for (int32_t i = 0; i < T; ++i)
    if (i < a || i >= b) outside.push_back(i);
  for (int64_t il = 0; il < kLayers; ++il)
    for (int64_t h = 0; h < kHeads; ++h) ASSERT_TRUE(oracle->retain(il, h, outside).is_ok());
  auto frag = kv->extract(a, b - a);
  ASSERT_TRUE(frag.has_value());
  expect_same(*kv, *oracle, "after extract");
  EXPECT_EQ(kv->pool().n_used(), oracle->pool().n_used());
  EXPECT_GT(frag->bytes(), 0u);
}

// Tokens appended after the extraction: the fragment goes back between, in sequence order.
TEST_P(KvFragmentTest, InsertAfterAppendingMoreGoesInSequenceOrder) {
  const auto [block, type] = GetParam();
  constexpr int64_t T = 37, More = 14;
  const Rows rows(T + More, 3);
  auto full = make(config(block, type));
  append_range(*full, rows, 0, T + More);
  auto kv = make(config(block, type));
  append_range(*kv, rows, 0, T);
  auto frag = kv->extract(10, 19);
  ASSERT_TRUE(frag.has_value());
  append_range(*kv, rows, T, T + More);
  ASSERT_TRUE(kv->insert(*frag).is_ok());
  expect_same(*kv, *full, "fragment inserted after more appends");
  expect_conserved(*kv);
  for (int64_t il = 0; il < kLayers; ++il) EXPECT_EQ(kv->n_appended(il), T + More);
  // Two fragments out, put back in the other order.
  auto f1 = kv->extract(2, 5);
  auto f2 = kv->extract(30, 12);
  ASSERT_TRUE(f1.has_value() && f2.has_value());
  ASSERT_TRUE(kv->insert(*f2).is_ok());
  ASSERT_TRUE(kv->insert(*f1).is_ok());
  expect_same(*kv, *full, "two fragments reinserted in reverse order");
  expect_conserved(*kv);
}

INSTANTIATE_TEST_SUITE_P(Storage, KvFragmentTest,
                         ::testing::Values(Case{4, DType::F32}, Case{16, DType::F32}, Case{4, DType::F16},
                                           Case{16, DType::F16}, Case{4, DType::Q8_0}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.type)) + "_block" +
                                  std::to_string(info.param.block);
                         });

TEST(KvFragment, Errors) {
  const Rows rows(30, 5);
  auto kv = make(config(4, DType::F32));
  append_range(*kv, rows, 0, 30);
  // Bad ranges.
  for (auto [a, n] : {std::pair<int64_t, int64_t>{3, 0}, {-1, 4}, {28, 5}}) {
    auto f = kv->extract(a, n);
    ASSERT_FALSE(f.has_value()) << a << "+" << n;
    EXPECT_EQ(f.error().code, ErrorCode::kInvalidArgument);
  }
  auto frag = kv->extract(8, 6);
  ASSERT_TRUE(frag.has_value());
  // Shape and types.
  for (auto cfg : {config(4, DType::F16), config(16, DType::F32)}) {
    auto other = make(cfg);
    append_range(*other, rows, 0, 30);
    Status st = other->insert(*frag);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("--kv-block"), std::string::npos) << st.message();
  }
  {
    KvCacheConfig c = config(4, DType::F32);
    c.n_head_kv = 1;
    auto other = make(c);
    Status st = other->insert(*frag);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("KV heads"), std::string::npos) << st.message();
  }
  // Double insert: the second is refused and changes nothing.
  ASSERT_TRUE(kv->insert(*frag).is_ok());
  const HeadDump whole = dump(*kv, 2, 1);
  Status st = kv->insert(*frag);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("already held"), std::string::npos) << st.message();
  EXPECT_TRUE(dump(*kv, 2, 1) == whole);
  expect_conserved(*kv);
  // Truncated into the fragment since: refused.
  auto f2 = kv->extract(20, 5);
  ASSERT_TRUE(f2.has_value());
  kv->truncate(22);
  st = kv->insert(*f2);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  // Its head before the cut still goes back.
  f2->drop_from(22);
  EXPECT_EQ(f2->count, 2);
  ASSERT_TRUE(kv->insert(*f2).is_ok());
  for (int64_t il = 0; il < kLayers; ++il)
    for (int64_t h = 0; h < kHeads; ++h) EXPECT_EQ(kv->n_tokens(il, h), 22);
}

TEST(KvFragment, BudgetRefusesAndLeavesTheCacheUnchanged) {
  KvCacheConfig c = config(4, DType::F32);
  auto probe = make(c);
  const size_t block_bytes = probe->pool().block_bytes();
  // Room for 4 blocks per head (16 tokens) over 3 layers x 2 heads.
  c.budget_bytes = static_cast<int64_t>(block_bytes) * 4 * kLayers * kHeads;
  auto kv = make(c);
  const Rows rows(40, 9);
  append_range(*kv, rows, 0, 16);
  auto frag = kv->extract(0, 8);  // frees 2 blocks per head
  ASSERT_TRUE(frag.has_value());
  append_range(*kv, rows, 16, 24);  // takes them again
  const HeadDump before = dump(*kv, 1, 0);
  const int64_t used = kv->pool().n_used();
  Status st = kv->insert(*frag);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kContextFull);
  EXPECT_NE(st.message().find("budget"), std::string::npos) << st.message();
  EXPECT_TRUE(dump(*kv, 1, 0) == before);
  EXPECT_EQ(kv->pool().n_used(), used);
  expect_conserved(*kv);
  // Room again: it goes in.
  auto gone = kv->extract(16, 8);
  ASSERT_TRUE(gone.has_value());
  ASSERT_TRUE(kv->insert(*frag).is_ok());
  for (int64_t il = 0; il < kLayers; ++il)
    for (int64_t h = 0; h < kHeads; ++h) EXPECT_EQ(kv->n_tokens(il, h), 16);
  expect_conserved(*kv);
}

TEST(KvFragment, SpilledCacheRoundTrips) {
  KvCacheConfig c = config(4, DType::F16);
  auto probe = make(c);
  c.budget_bytes = static_cast<int64_t>(probe->pool().block_bytes()) * 8;
  c.spill_dir = ::testing::TempDir();
  auto kv = make(c);
  auto ref = make(config(4, DType::F16));
  const Rows rows(45, 13);
  append_range(*kv, rows, 0, 45);
  append_range(*ref, rows, 0, 45);
  ASSERT_GT(kv->pool().n_spilled(), 0);
  auto frag = kv->extract(6, 25);
  ASSERT_TRUE(frag.has_value());
  expect_conserved(*kv);
  ASSERT_TRUE(kv->insert(*frag).is_ok());
  expect_same(*kv, *ref, "spilled cache after extract + insert");
  expect_conserved(*kv);
}

// Keys of a fragment come back rotated with the layer's current table when it changed.
TEST(KvFragment, InsertReRotatesWhenTheRopeTableChanged) {
  const Rows rows(20, 17);
  auto kv = make(config(4, DType::F32));
  auto ref = make(config(4, DType::F32));
  append_range(*kv, rows, 0, 20);
  append_range(*ref, rows, 0, 20);
  auto frag = kv->extract(4, 8);
  ASSERT_TRUE(frag.has_value());
  RopeTable t = kv->rope(0);
  for (auto& f : t.inv_freq) f *= 0.5f;
  for (int64_t il = 0; il < kLayers; ++il) {
    kv->set_rope(il, t);
    ref->set_rope(il, t);
  }
  ASSERT_TRUE(kv->insert(*frag).is_ok());
  std::vector<float> a(kDim), b(kDim);
  for (int64_t il = 0; il < kLayers; ++il)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < 20; ++i) {
        kv->read_keys(il, h, i, 1, a.data());
        ref->read_keys(il, h, i, 1, b.data());
        for (int64_t e = 0; e < kDim; ++e) EXPECT_NEAR(a[static_cast<size_t>(e)], b[static_cast<size_t>(e)], 1e-4f);
      }
}

}  // namespace
}  // namespace lc
