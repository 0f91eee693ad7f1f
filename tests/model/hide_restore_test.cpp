// Context::hide / restore (Sculptor's active context management) with a real model, against
// oracles that never hid anything: a context that decoded only the prefix (= the cache after
// hiding the fragment that followed it) and one that decoded prefix + fragment (= the cache
// after restoring it, and the logits of the next token).
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "model/context.h"
#include "model/model.h"

namespace lc {
namespace {

const std::string kStories = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

std::vector<int32_t> tokens(int64_t n, int64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(1 + (i * 37 + salt * 11) % 500);
  return t;
}

const Model& model() {
  static std::unique_ptr<Model> m = [] {
    auto r = Model::load(kStories);
    EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
    return std::move(*r);
  }();
  return *m;
}

std::unique_ptr<Context> make(const std::string& attn, const std::string& press = "") {
  ContextParams p;
  p.n_threads = 1;
  p.n_batch = 64;
  p.kv_block = 16;
  p.attn = attn;
  p.kv_press = press;
  auto c = Context::create(model(), p);
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
  return std::move(*c);
}

struct HeadDump {
  std::vector<int32_t> pos, idx;
  std::vector<float> k, v;
};

HeadDump dump(const KvCache& kv, int64_t il, int64_t h) {
  HeadDump d;
  const int64_t n = kv.n_tokens(il, h);
  d.pos.assign(kv.positions(il, h), kv.positions(il, h) + n);
  d.idx.assign(kv.seq_index(il, h), kv.seq_index(il, h) + n);
  d.k.resize(static_cast<size_t>(n * kv.head_dim()));
  d.v.resize(static_cast<size_t>(n * kv.head_dim_v()));
  kv.read_keys(il, h, 0, n, d.k.data());
  kv.read_values(il, h, 0, n, d.v.data());
  return d;
}

// Every layer and head: rows (bit for bit), positions, sequence indices.
void expect_same_cache(const KvCache& a, const KvCache& b, const std::string& what) {
  ASSERT_EQ(a.n_layer(), b.n_layer());
  for (int64_t il = 0; il < a.n_layer(); ++il)
    for (int64_t h = 0; h < a.n_head_kv(); ++h) {
      SCOPED_TRACE(testing::Message() << what << ": layer " << il << " head " << h);
      ASSERT_EQ(a.n_tokens(il, h), b.n_tokens(il, h));
      const HeadDump x = dump(a, il, h), y = dump(b, il, h);
      EXPECT_EQ(x.pos, y.pos);
      EXPECT_EQ(x.idx, y.idx);
      ASSERT_EQ(x.k.size(), y.k.size());
      EXPECT_EQ(0, std::memcmp(x.k.data(), y.k.data(), x.k.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(x.v.data(), y.v.data(), x.v.size() * sizeof(float)));
    }
}

bool same_logits(const Context& a, const Context& b) {
  const size_t nv = static_cast<size_t>(model().hparams().n_vocab);
  return std::memcmp(a.logits(0), b.logits(0), nv * sizeof(float)) == 0;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class HideRestore : public ::testing::TestWithParam<std::string> {};

// A decodes P then F; hiding F = B (only P); restoring = C (P then F), logits included.
TEST_P(HideRestore, HideEqualsThePrefixAndRestoreEqualsTheWhole) {
  const std::string attn = GetParam();
  const auto P = tokens(70, 1), F = tokens(45, 2);
  const std::vector<int32_t> next = {123};
  auto a = make(attn), b = make(attn), c = make(attn);
  ASSERT_TRUE(a->decode(P).is_ok() && a->decode(F).is_ok());
  ASSERT_TRUE(b->decode(P).is_ok());
  ASSERT_TRUE(c->decode(P).is_ok() && c->decode(F).is_ok());

  auto frag = a->hide(70, 45);
  ASSERT_TRUE(frag.has_value()) << frag.error().message;
  EXPECT_EQ(frag->tokens, F);
  EXPECT_EQ(a->tokens(), P);
  EXPECT_EQ(a->n_past(), 115);  // positions are not reused
  expect_same_cache(a->kv(), b->kv(), "hidden vs prefix only");

  ASSERT_TRUE(a->restore(std::move(*frag)).is_ok());
  EXPECT_EQ(a->tokens(), cat(P, F));
  EXPECT_TRUE(a->hidden().empty());
  expect_same_cache(a->kv(), c->kv(), "restored vs prefix + fragment");
  ASSERT_TRUE(a->decode(next).is_ok());
  ASSERT_TRUE(c->decode(next).is_ok());
  EXPECT_TRUE(same_logits(*a, *c)) << attn << ": the next token's logits after restore differ";
  expect_same_cache(a->kv(), c->kv(), "after the next token");
}

// A fragment in the middle: hiding it, decoding more, restoring: every token is back in order.
TEST_P(HideRestore, HideDecodeMoreRestoreKeepsSequenceOrder) {
  const std::string attn = GetParam();
  const auto P = tokens(50, 3), F = tokens(30, 4), S = tokens(20, 5), M = tokens(25, 6);
  auto a = make(attn), c = make(attn);
  ASSERT_TRUE(a->decode(P).is_ok() && a->decode(F).is_ok() && a->decode(S).is_ok());
  ASSERT_TRUE(c->decode(P).is_ok() && c->decode(F).is_ok() && c->decode(S).is_ok());
  auto frag = a->hide(50, 30);
  ASSERT_TRUE(frag.has_value()) << frag.error().message;
  EXPECT_EQ(a->tokens(), cat(P, S));
  // More tokens while F is hidden: a prompt, then single tokens; they go at n_past() on.
  ASSERT_TRUE(a->decode(M).is_ok());
  for (int32_t t : {7, 8, 9}) ASSERT_TRUE(a->decode(std::vector<int32_t>{t}).is_ok());
  EXPECT_EQ(a->n_past(), 50 + 30 + 20 + 25 + 3);
  EXPECT_EQ(a->tokens(), cat(cat(P, S), cat(M, {7, 8, 9})));
  ASSERT_TRUE(a->restore(std::move(*frag)).is_ok());
  EXPECT_EQ(a->tokens(), cat(cat(cat(P, F), S), cat(M, {7, 8, 9})));
  const KvCache& kv = a->kv();
  for (int64_t il = 0; il < kv.n_layer(); ++il)
    for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
      ASSERT_EQ(kv.n_tokens(il, h), a->n_past());
      for (int64_t i = 0; i < kv.n_tokens(il, h); ++i) {
        EXPECT_EQ(kv.seq_index(il, h)[i], i);
        EXPECT_EQ(kv.positions(il, h)[i], i);
      }
    }
  // The rows of P, F and S are those of a context that never hid anything (they were written
  // before the hide); M's were computed without F and are not compared.
  for (int64_t il = 0; il < kv.n_layer(); ++il)
    for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
      const HeadDump x = dump(kv, il, h), y = dump(c->kv(), il, h);
      const size_t n = static_cast<size_t>(100 * kv.head_dim());
      EXPECT_EQ(0, std::memcmp(x.k.data(), y.k.data(), n * sizeof(float))) << il << "/" << h;
      EXPECT_EQ(0, std::memcmp(x.v.data(), y.v.data(), n * sizeof(float))) << il << "/" << h;
    }
  // And it keeps decoding with summaries rebuilt over the restored cache: the same as a backend
  // made anew over it (d replays a's steps, then gets a fresh backend).
  auto d = make(attn);
  ASSERT_TRUE(d->decode(P).is_ok() && d->decode(F).is_ok() && d->decode(S).is_ok());
  auto fd = d->hide(50, 30);
  ASSERT_TRUE(fd.has_value());
  ASSERT_TRUE(d->decode(M).is_ok());
  for (int32_t t : {7, 8, 9}) ASSERT_TRUE(d->decode(std::vector<int32_t>{t}).is_ok());
  ASSERT_TRUE(d->restore(std::move(*fd)).is_ok());
  ASSERT_TRUE(d->set_attention(d->attention().spec()).is_ok());
  ASSERT_TRUE(a->decode(std::vector<int32_t>{11}).is_ok());
  ASSERT_TRUE(d->decode(std::vector<int32_t>{11}).is_ok());
  EXPECT_TRUE(same_logits(*a, *d)) << attn << ": stale summaries after restore";
}

INSTANTIATE_TEST_SUITE_P(Backends, HideRestore,
                         ::testing::Values(std::string(""), std::string("quest:budget=24,page=8,dense_layers=0")),
                         [](const auto& info) { return info.param.empty() ? std::string("dense") : std::string("quest"); });

// InfLLM keeps query sums per memory block that cannot be rebuilt from the cache: after the
// epoch moves on it starts them afresh, as a backend made anew over the same cache does. So
// the oracle is C with its backend made anew (set_attention) before the next token.
TEST(HideRestoreInfllm, RestoreEqualsAFreshBackendOverTheWholeCache) {
  const std::string attn = "infllm:sinks=4,local=16,block=8,reps=2,topk=2,chunk=8";
  const auto P = tokens(60, 7), F = tokens(40, 8);
  const std::vector<int32_t> next = {77};
  auto a = make(attn), c = make(attn);
  ASSERT_TRUE(a->decode(P).is_ok() && a->decode(F).is_ok());
  ASSERT_TRUE(c->decode(P).is_ok() && c->decode(F).is_ok());
  auto frag = a->hide(10, 30);
  ASSERT_TRUE(frag.has_value()) << frag.error().message;
  ASSERT_TRUE(a->restore(std::move(*frag)).is_ok());
  expect_same_cache(a->kv(), c->kv(), "restored");
  ASSERT_TRUE(c->set_attention(c->attention().spec()).is_ok());
  ASSERT_TRUE(a->decode(next).is_ok() && c->decode(next).is_ok());
  EXPECT_TRUE(same_logits(*a, *c));
}

// A press without per-token statistics (SnapKV) evicts per head; hiding and restoring a range
// gives back exactly the cache it left (the heads just held fewer of the range's tokens).
TEST(HideRestorePress, CompressedCacheRoundTrips) {
  auto a = make("", "snapkv:ratio=0.5,window=8,n_sink=4");
  auto c = make("", "snapkv:ratio=0.5,window=8,n_sink=4");
  const auto P = tokens(120, 9);
  ASSERT_TRUE(a->decode(P).is_ok() && c->decode(P).is_ok());
  ASSERT_LT(a->kv().n_tokens(0, 0), 120);  // the press did evict
  auto frag = a->hide(20, 50);
  ASSERT_TRUE(frag.has_value()) << frag.error().message;
  EXPECT_LT(frag->kv.n_tokens(), 50 * a->kv().n_layer() * a->kv().n_head_kv());
  ASSERT_TRUE(a->restore(std::move(*frag)).is_ok());
  expect_same_cache(a->kv(), c->kv(), "press-compressed cache");
  EXPECT_EQ(a->tokens(), c->tokens());
  ASSERT_TRUE(a->decode(std::vector<int32_t>{5}).is_ok() && c->decode(std::vector<int32_t>{5}).is_ok());
  EXPECT_TRUE(same_logits(*a, *c));
}

TEST(HideRestoreErrors, BadRangesDoubleRestoreSaveAndObserver) {
  auto a = make("");
  ASSERT_TRUE(a->decode(tokens(40, 1)).is_ok());
  for (auto [f, n] : {std::pair<int64_t, int64_t>{5, 0}, {-2, 4}, {35, 6}, {40, 1}}) {
    auto r = a->hide(f, n);
    ASSERT_FALSE(r.has_value()) << f << "+" << n;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  }
  auto f1 = a->hide(10, 10);
  ASSERT_TRUE(f1.has_value());
  for (auto [f, n] : {std::pair<int64_t, int64_t>{15, 3}, {5, 6}, {19, 10}, {0, 40}}) {
    auto r = a->hide(f, n);
    ASSERT_FALSE(r.has_value()) << f << "+" << n;
    EXPECT_NE(r.error().message.find("overlaps"), std::string::npos) << r.error().message;
  }
  auto f2 = a->hide(25, 5);  // a second, disjoint range is fine
  ASSERT_TRUE(f2.has_value());
  EXPECT_EQ(a->tokens().size(), 25u);
  std::stringstream ss;
  Status st = a->save_state(ss);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  // The later range first, while the earlier one is still hidden.
  HiddenFragment copy = *f2;
  ASSERT_TRUE(a->restore(std::move(*f2)).is_ok());
  std::vector<int32_t> want = tokens(40, 1);
  want.erase(want.begin() + 10, want.begin() + 20);
  EXPECT_EQ(a->tokens(), want);
  st = a->restore(std::move(copy));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not hidden"), std::string::npos) << st.message();
  EXPECT_EQ(a->tokens(), want);
  ASSERT_TRUE(a->restore(std::move(*f1)).is_ok());
  EXPECT_EQ(a->tokens(), tokens(40, 1));
  for (int64_t il = 0; il < a->kv().n_layer(); ++il)
    for (int64_t h = 0; h < a->kv().n_head_kv(); ++h) EXPECT_EQ(a->kv().n_tokens(il, h), 40);
  EXPECT_TRUE(a->save_state(ss).is_ok());

  // A fragment hidden by another context (same range) is refused.
  auto other = make("");
  ASSERT_TRUE(other->decode(tokens(40, 1)).is_ok());
  auto fo = other->hide(10, 10);
  auto fa = a->hide(10, 10);
  ASSERT_TRUE(fo.has_value() && fa.has_value());
  st = a->restore(std::move(*fo));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not hidden"), std::string::npos) << st.message();
  ASSERT_TRUE(a->restore(std::move(*fa)).is_ok());

  // H2O accumulates attention per token over the forward passes: refused.
  auto h = make("", "h2o:ratio=0.5");
  ASSERT_TRUE(h->decode(tokens(40, 1)).is_ok());
  auto r = h->hide(5, 5);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
}

// Truncating into a hidden range: its head before the cut can come back; a range cut off
// entirely is forgotten.
TEST(HideRestoreErrors, TruncateIntoAHiddenRange) {
  auto a = make(""), c = make("");
  const auto P = tokens(60, 2);
  ASSERT_TRUE(a->decode(P).is_ok());
  ASSERT_TRUE(c->decode(P).is_ok());
  c->truncate(25);  // the oracle: never hid anything, cut at the same place
  auto f1 = a->hide(20, 15);
  auto f2 = a->hide(45, 10);
  ASSERT_TRUE(f1.has_value() && f2.has_value());
  a->truncate(25);
  EXPECT_EQ(a->n_past(), 25);
  EXPECT_EQ(a->tokens(), std::vector<int32_t>(P.begin(), P.begin() + 20));
  ASSERT_EQ(a->hidden().size(), 1u);
  EXPECT_EQ(a->hidden()[0].count, 5);
  EXPECT_FALSE(a->restore(std::move(*f2)).is_ok());
  ASSERT_TRUE(a->restore(std::move(*f1)).is_ok());
  EXPECT_EQ(a->tokens(), std::vector<int32_t>(P.begin(), P.begin() + 25));
  expect_same_cache(a->kv(), c->kv(), "restored head of a truncated range");
}

}  // namespace
}  // namespace lc
