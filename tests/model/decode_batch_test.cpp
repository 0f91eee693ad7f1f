// Continuous batching (Context::decode_batch) and the chunk-at-a-time decode (begin_decode /
// decode_step). Oracles: llama.cpp's logits for the golden models (every sequence of a batch,
// teacher-forced on llama.cpp's greedy tokens), and for per-sequence methods the one-token
// decode() path of a context with the same settings (itself checked against the goldens).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/context.h"
#include "model/model.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  in.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    m = std::max(m, std::isnan(d) ? INFINITY : d);
  }
  return m;
}

std::unique_ptr<Context> make(const Model& m, const std::string& attn = "", const std::string& press = "",
                              int64_t n_batch = 64) {
  ContextParams p;
  p.n_ctx = 512;
  p.n_batch = n_batch;
  p.n_threads = 2;
  p.kv_block = 16;
  p.attn = attn;
  p.kv_press = press;
  auto c = Context::create(m, p);
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
  return std::move(*c);
}

// Four sequences of one golden model in one batch: two copies of the greedy prompt p1 (one of
// them teacher-forced on llama.cpp's greedy tokens, compared with llama.cpp's logits at every
// step) beside the prompts p2 and p3, which must not disturb it.
class BatchGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(BatchGolden, EverySequenceMatchesLlamaCpp) {
  const std::string name = GetParam();
  auto model = Model::load(kGolden + "models/" + name + ".gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  std::ifstream in(kGolden + "cases/" + name + "/case.json");
  const auto cj = nlohmann::json::parse(in);
  const auto p1 = cj["prompts"]["p1"]["ids"].get<std::vector<int32_t>>();
  const auto p2 = cj["prompts"]["p2"]["ids"].get<std::vector<int32_t>>();
  const auto p3 = cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();
  const auto gold = cj["greedy"]["ids"].get<std::vector<int32_t>>();
  const auto gen_logits = read_f32(kGolden + "cases/" + name + "/gen_logits.f32");
  const int64_t nv = (*model)->hparams().n_vocab;
  ASSERT_EQ(gen_logits.size(), gold.size() * static_cast<size_t>(nv));
  std::vector<std::unique_ptr<Context>> cs;
  for (const auto* p : {&p2, &p1, &p3, &p1}) {
    cs.push_back(make(**model));
    ASSERT_TRUE(cs.back()->decode(*p, Logits::kLast).is_ok());
  }
  std::vector<Context*> ptrs;
  for (auto& c : cs) ptrs.push_back(c.get());
  double worst = 0;
  for (size_t k = 0; k < gold.size(); ++k) {
    for (int i : {1, 3}) worst = std::max(worst, max_abs_diff(cs[i]->logits(0), gen_logits.data() + k * nv, nv));
    // Sequences 0 and 2 follow their own argmax; 1 and 3 llama.cpp's greedy tokens.
    std::vector<int32_t> next(4);
    for (int i : {0, 2}) {
      const float* lg = cs[i]->logits(0);
      next[i] = static_cast<int32_t>(std::max_element(lg, lg + nv) - lg);
    }
    next[1] = next[3] = gold[k];
    for (const Status& s : Context::decode_batch(ptrs, next)) ASSERT_TRUE(s.is_ok()) << s.message();
  }
  EXPECT_LE(worst, 1e-3) << name;  // the golden README's f32 tolerance
  EXPECT_EQ(cs[1]->n_past(), static_cast<int64_t>(p1.size() + gold.size()));
}

INSTANTIATE_TEST_SUITE_P(Golden, BatchGolden,
                         ::testing::Values("stories260K", "llama_gqa_f32", "qwen2_bias_f32", "qwen3_qknorm_f32",
                                           "qwen2_yarn_f32"));

const Model& stories() {
  static std::unique_ptr<Model> m = [] {
    auto r = Model::load(kGolden + "models/stories260K.gguf");
    EXPECT_TRUE(r.has_value());
    return std::move(*r);
  }();
  return *m;
}

std::vector<int32_t> prompt(int64_t n, int64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(1 + (i * 37 + salt * 11) % 500);
  return t;
}

// Each sequence keeps its own attention backend and press: a batch of four differently
// configured sequences gives each the logits its own one-token decode() gives.
TEST(DecodeBatch, EachSequenceKeepsItsMethods) {
  struct Cfg {
    std::string attn, press;
    int64_t n_prompt;
  };
  const std::vector<Cfg> cfgs = {{"dense", "", 37},
                                 {"quest:page=16,budget=64", "", 200},
                                 {"streaming:sinks=4,window=48", "", 120},
                                 {"dense", "snapkv:ratio=0.5,window=8", 150}};
  std::vector<std::unique_ptr<Context>> batched, alone;
  for (size_t i = 0; i < cfgs.size(); ++i) {
    for (auto* set : {&batched, &alone}) {
      set->push_back(make(stories(), cfgs[i].attn, cfgs[i].press));
      ASSERT_TRUE(set->back()->decode(prompt(cfgs[i].n_prompt, static_cast<int64_t>(i)), Logits::kLast).is_ok());
    }
  }
  std::vector<Context*> ptrs;
  for (auto& c : batched) ptrs.push_back(c.get());
  const int64_t nv = stories().hparams().n_vocab;
  for (int step = 0; step < 24; ++step) {
    std::vector<int32_t> next;
    for (size_t i = 0; i < cfgs.size(); ++i) {
      const double d = max_abs_diff(batched[i]->logits(0), alone[i]->logits(0), nv);
      ASSERT_LE(d, 1e-4) << cfgs[i].attn << " " << cfgs[i].press << " step " << step;
      const float* lg = alone[i]->logits(0);
      next.push_back(static_cast<int32_t>(std::max_element(lg, lg + nv) - lg));
      ASSERT_TRUE(alone[i]->decode(std::span<const int32_t>(&next.back(), 1)).is_ok());
    }
    for (const Status& s : Context::decode_batch(ptrs, next)) ASSERT_TRUE(s.is_ok()) << s.message();
  }
  for (size_t i = 0; i < cfgs.size(); ++i) {
    EXPECT_EQ(batched[i]->tokens(), alone[i]->tokens()) << i;
    for (int64_t il = 0; il < batched[i]->kv().n_layer(); ++il)
      EXPECT_EQ(batched[i]->kv().n_tokens(il, 0), alone[i]->kv().n_tokens(il, 0)) << i;
  }
}

// A sequence that cannot take its token fails alone; the others go on with correct logits.
TEST(DecodeBatch, FailuresStayWithTheirSequence) {
  ContextParams small;
  small.n_ctx = 20;
  small.n_threads = 1;
  auto full = Context::create(stories(), small);
  ASSERT_TRUE(full.has_value());
  ASSERT_TRUE((*full)->decode(prompt(20, 9), Logits::kLast).is_ok());
  auto a = make(stories()), ref = make(stories());
  ASSERT_TRUE(a->decode(prompt(30, 1)).is_ok());
  ASSERT_TRUE(ref->decode(prompt(30, 1)).is_ok());
  auto other_model = Model::load(kGolden + "models/llama_gqa_f32.gguf");
  ASSERT_TRUE(other_model.has_value());
  auto foreign = make(**other_model);
  ASSERT_TRUE(foreign->decode(prompt(5, 2)).is_ok());
  std::vector<Context*> ptrs = {a.get(), full->get(), foreign.get(), a.get()};
  const std::vector<int32_t> next = {7, 7, 7, 9};
  const std::vector<Status> st = Context::decode_batch(ptrs, next);
  ASSERT_EQ(st.size(), 4u);
  EXPECT_TRUE(st[0].is_ok()) << st[0].message();
  EXPECT_EQ(st[1].code(), ErrorCode::kContextFull) << st[1].message();
  EXPECT_NE(st[2].message().find("same model"), std::string::npos) << st[2].message();
  EXPECT_NE(st[3].message().find("twice"), std::string::npos) << st[3].message();
  EXPECT_EQ((*full)->n_past(), 20);
  EXPECT_EQ(foreign->n_past(), 5);
  const int32_t t7 = 7;
  ASSERT_TRUE(ref->decode(std::span<const int32_t>(&t7, 1)).is_ok());
  EXPECT_LE(max_abs_diff(a->logits(0), ref->logits(0), stories().hparams().n_vocab), 1e-4);
  const std::vector<int32_t> bad = {100000};
  std::vector<Context*> one = {a.get()};
  EXPECT_FALSE(Context::decode_batch(one, bad)[0].is_ok());
  EXPECT_EQ(a->n_past(), 31);
}

// A prompt decoded a chunk at a time gives decode()'s logits, and other work may run between
// the chunks (here another context's decode steps).
TEST(DecodeBatch, ChunkAtATimeEqualsDecode) {
  for (const std::string press : {"", "snapkv:ratio=0.5,window=8"}) {
    auto whole = make(stories(), "dense", press, 16), stepped = make(stories(), "dense", press, 16),
         other = make(stories());
    const auto p = prompt(150, 3);
    ASSERT_TRUE(whole->decode(p, Logits::kAll).is_ok());
    ASSERT_TRUE(stepped->begin_decode(p, Logits::kAll).is_ok());
    ASSERT_TRUE(other->decode(prompt(10, 4)).is_ok());
    int steps = 0;
    for (;;) {
      auto done = stepped->decode_step();
      ASSERT_TRUE(done.has_value()) << done.error().message;
      ++steps;
      const int32_t t = 5;
      ASSERT_TRUE(other->decode(std::span<const int32_t>(&t, 1)).is_ok());
      if (*done) break;
      EXPECT_TRUE(stepped->decode_pending());
    }
    EXPECT_EQ(steps, 10);  // ceil(150 / 16)
    EXPECT_FALSE(stepped->decode_pending());
    const int64_t nv = stories().hparams().n_vocab;
    EXPECT_EQ(stepped->n_outputs(), 150);
    EXPECT_LE(max_abs_diff(stepped->logits(0), whole->logits(0), 150 * nv), 0.0) << press;
    EXPECT_EQ(stepped->tokens(), whole->tokens()) << press;
    EXPECT_FALSE(stepped->decode_step().has_value());  // nothing pending
  }
}

// A prompt's prefill chunks merged into the decode batch's forward pass (decode_mixed): each
// decode row gets the logits of decode_batch() without the chunk, and the prompt's context ends
// where begin_decode() + decode_step(cap) alone leave it (logits, tokens, cache), with or
// without a press whose hooks run after each chunk.
TEST(DecodeBatch, PrefillChunkMergedIntoTheBatchPass) {
  const int64_t nv = stories().hparams().n_vocab;
  for (const std::string press : {"", "snapkv:ratio=0.5,window=8,chunk=1"}) {
    std::vector<std::unique_ptr<Context>> rows, rows_ref;
    const std::vector<std::string> attns = {"dense", "quest:page=16,budget=64", "streaming:sinks=4,window=48"};
    for (size_t i = 0; i < attns.size(); ++i)
      for (auto* set : {&rows, &rows_ref}) {
        set->push_back(make(stories(), attns[i]));
        ASSERT_TRUE(set->back()->decode(prompt(40 + 30 * static_cast<int64_t>(i), static_cast<int64_t>(i)),
                                        Logits::kLast).is_ok());
      }
    auto pf = make(stories(), "dense", press), pf_ref = make(stories(), "dense", press);
    const auto p = prompt(150, 7);
    ASSERT_TRUE(pf->begin_decode(p, Logits::kLast).is_ok());
    ASSERT_TRUE(pf_ref->begin_decode(p, Logits::kLast).is_ok());
    std::vector<Context*> ptrs, ptrs_ref;
    for (size_t i = 0; i < rows.size(); ++i) ptrs.push_back(rows[i].get()), ptrs_ref.push_back(rows_ref[i].get());
    int steps = 0;
    for (bool done = false; !done; ++steps) {
      std::vector<int32_t> next;
      for (auto& r : rows_ref) {
        const float* lg = r->logits(0);
        next.push_back(static_cast<int32_t>(std::max_element(lg, lg + nv) - lg));
      }
      Context::MixedResult mr = Context::decode_mixed(ptrs, next, *pf, 16);
      EXPECT_TRUE(mr.merged);
      ASSERT_TRUE(mr.prefill.has_value()) << mr.prefill.error().message;
      auto ref = pf_ref->decode_step(16);
      ASSERT_TRUE(ref.has_value()) << ref.error().message;
      ASSERT_EQ(*mr.prefill, *ref);
      done = *ref;
      for (const Status& s : Context::decode_batch(ptrs_ref, next)) ASSERT_TRUE(s.is_ok()) << s.message();
      ASSERT_EQ(mr.rows.size(), rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        ASSERT_TRUE(mr.rows[i].is_ok()) << mr.rows[i].message();
        ASSERT_LE(max_abs_diff(rows[i]->logits(0), rows_ref[i]->logits(0), nv), 1e-4) << attns[i] << " step " << steps;
      }
      EXPECT_EQ(pf->n_past(), pf_ref->n_past()) << press;
    }
    EXPECT_EQ(steps, 10) << press;  // ceil(150 / 16)
    EXPECT_FALSE(pf->decode_pending());
    EXPECT_LE(max_abs_diff(pf->logits(0), pf_ref->logits(0), nv), 1e-4) << press;
    EXPECT_EQ(pf->tokens(), pf_ref->tokens());
    const KvCache& kv = pf->kv();
    for (int64_t il = 0; il < kv.n_layer(); ++il)
      for (int64_t h = 0; h < kv.n_head_kv(); ++h) {
        const int64_t n = kv.n_tokens(il, h);
        ASSERT_EQ(n, pf_ref->kv().n_tokens(il, h)) << press << " layer " << il;
        if (!press.empty()) {
          EXPECT_LT(n, 150);  // the press ran on the merged chunks
        }
        std::vector<float> a(static_cast<size_t>(n * kv.head_dim())), b(a.size());
        kv.read_keys(il, h, 0, n, a.data());
        pf_ref->kv().read_keys(il, h, 0, n, b.data());
        EXPECT_LE(max_abs_diff(a.data(), b.data(), static_cast<int64_t>(a.size())), 1e-4) << press;
      }
  }
}

// A chunk larger than the layer's sub-chunks (512 rows: the norms, projections and MLP go over
// them, so that only x, q, k, v and the attention output grow with a chunk; a ring shard is one
// chunk): every logit of a 1,300-token chunk, and a 1,200-row prefill merged with three decode
// rows, equal the same tokens evaluated in 64-token chunks (whose path the golden tests check).
TEST(DecodeBatch, ChunksLargerThanTheLayerSubChunksEqualSmallChunks) {
  const int64_t nv = stories().hparams().n_vocab;
  auto make_big = [](int64_t n_batch) {
    ContextParams p;
    p.n_ctx = 2048;
    p.n_batch = n_batch;
    p.n_threads = 2;
    p.kv_block = 16;
    auto c = Context::create(stories(), p);
    EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
    return std::move(*c);
  };
  const auto p = prompt(1300, 3);
  auto big = make_big(1300), small = make_big(64);
  ASSERT_TRUE(big->decode(p, Logits::kAll).is_ok());
  ASSERT_TRUE(small->decode(p, Logits::kAll).is_ok());
  for (int64_t t = 0; t < 1300; t += 1)
    ASSERT_LE(max_abs_diff(big->logits(t), small->logits(t), nv), 1e-4) << "token " << t;

  std::vector<std::unique_ptr<Context>> rows, rows_ref;
  for (int64_t i = 0; i < 3; ++i) {
    rows.push_back(make_big(1300));
    rows_ref.push_back(make_big(64));
    ASSERT_TRUE(rows.back()->decode(prompt(20 + i, i), Logits::kLast).is_ok());
    ASSERT_TRUE(rows_ref.back()->decode(prompt(20 + i, i), Logits::kLast).is_ok());
  }
  auto pf = make_big(1300), pf_ref = make_big(64);
  const auto q = prompt(1200, 5);
  ASSERT_TRUE(pf->begin_decode(q, Logits::kLast).is_ok());
  std::vector<Context*> ptrs, ptrs_ref;
  for (size_t i = 0; i < rows.size(); ++i) ptrs.push_back(rows[i].get()), ptrs_ref.push_back(rows_ref[i].get());
  const std::vector<int32_t> next = {7, 8, 9};
  Context::MixedResult mr = Context::decode_mixed(ptrs, next, *pf, 0);
  EXPECT_TRUE(mr.merged);
  ASSERT_TRUE(mr.prefill.has_value()) << mr.prefill.error().message;
  EXPECT_TRUE(*mr.prefill);  // the whole prompt in one pass
  ASSERT_TRUE(pf_ref->decode(q, Logits::kLast).is_ok());
  EXPECT_LE(max_abs_diff(pf->logits(0), pf_ref->logits(0), nv), 1e-4);
  for (const Status& st : Context::decode_batch(ptrs_ref, next)) ASSERT_TRUE(st.is_ok()) << st.message();
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_TRUE(mr.rows[i].is_ok()) << mr.rows[i].message();
    EXPECT_LE(max_abs_diff(rows[i]->logits(0), rows_ref[i]->logits(0), nv), 1e-4) << i;
  }
}

// What cannot share the pass runs as two (same results), and misuse is an error.
TEST(DecodeBatch, MixedFallbackAndErrors) {
  const int64_t nv = stories().hparams().n_vocab;
  auto row = make(stories()), row_ref = make(stories());
  ASSERT_TRUE(row->decode(prompt(30, 1)).is_ok());
  ASSERT_TRUE(row_ref->decode(prompt(30, 1)).is_ok());
  auto all = make(stories()), all_ref = make(stories());
  const auto p = prompt(40, 2);
  ASSERT_TRUE(all->begin_decode(p, Logits::kAll).is_ok());  // all-token logits: not merged
  ASSERT_TRUE(all_ref->decode(p, Logits::kAll).is_ok());
  std::vector<Context*> ptrs = {row.get()};
  const std::vector<int32_t> next = {11};
  Context::MixedResult mr = Context::decode_mixed(ptrs, next, *all, 0);
  EXPECT_FALSE(mr.merged);
  ASSERT_TRUE(mr.prefill.has_value() && *mr.prefill);
  ASSERT_TRUE(mr.rows[0].is_ok());
  EXPECT_LE(max_abs_diff(all->logits(0), all_ref->logits(0), 40 * nv), 1e-4);
  ASSERT_TRUE(row_ref->decode(std::span<const int32_t>(next)).is_ok());
  EXPECT_LE(max_abs_diff(row->logits(0), row_ref->logits(0), nv), 1e-4);
  // Nothing pending: the rows still run, the prefill is an error.
  mr = Context::decode_mixed(ptrs, next, *all, 0);
  EXPECT_FALSE(mr.prefill.has_value());
  EXPECT_TRUE(mr.rows[0].is_ok());
  EXPECT_EQ(row->n_past(), 32);
  // The prefill context among the rows.
  auto pf = make(stories());
  ASSERT_TRUE(pf->begin_decode(prompt(20, 3), Logits::kLast).is_ok());
  std::vector<Context*> with_pf = {pf.get()};
  mr = Context::decode_mixed(with_pf, next, *pf, 0);
  EXPECT_FALSE(mr.prefill.has_value());
  EXPECT_FALSE(mr.rows[0].is_ok());
  // A chunk larger than the rows leave free in the batch is cut to fit: n_batch 8, 3 rows.
  std::vector<std::unique_ptr<Context>> small;
  std::vector<Context*> sp;
  for (int i = 0; i < 3; ++i) {
    small.push_back(make(stories(), "dense", "", 8));
    ASSERT_TRUE(small.back()->decode(prompt(12, i)).is_ok());
    sp.push_back(small.back().get());
  }
  auto big = make(stories(), "dense", "", 8);
  ASSERT_TRUE(big->begin_decode(prompt(20, 5), Logits::kLast).is_ok());
  mr = Context::decode_mixed(sp, std::vector<int32_t>{1, 2, 3}, *big, 0);
  EXPECT_TRUE(mr.merged);
  ASSERT_TRUE(mr.prefill.has_value());
  EXPECT_FALSE(*mr.prefill);
  EXPECT_EQ(big->n_past(), 5);  // 8 rows - 3 decode rows
}

}  // namespace
}  // namespace lc

namespace lc {
namespace {

// A context that takes another's prefix blocks (Context::adopt_prefix) and evaluates only the
// rest gives the logits of a context that evaluated the whole prompt itself; the two then
// decode on without disturbing each other.
TEST(AdoptPrefix, EqualsEvaluatingThePromptItself) {
  auto probe = make(stories());
  auto bp = BlockPool::create(probe->kv().pool().block_bytes(), 0, "");
  ASSERT_TRUE(bp.has_value());
  std::shared_ptr<BlockPool> pool(std::move(*bp));
  auto shared = [&](const std::string& attn) {
    ContextParams p;
    p.n_ctx = 512;
    p.n_batch = 64;
    p.n_threads = 2;
    p.kv_block = 16;
    p.attn = attn;
    p.kv_pool = pool;
    auto c = Context::create(stories(), p);
    EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
    return std::move(*c);
  };
  // Methods whose result does not depend on how the prompt was cut into chunks (quest_fast's
  // sparse prefill does: its pages are chosen per chunk).
  for (const std::string attn : {"dense", "quest:page=16,budget=64", "streaming:sinks=4,window=256"}) {
    auto src = shared(attn), dst = shared(attn), fresh = make(stories(), attn);
    std::vector<int32_t> a = prompt(150, 1), b = a;
    b.resize(120);
    for (int i = 0; i < 40; ++i) b.push_back(static_cast<int32_t>(300 + i));  // shares 120 tokens with a
    ASSERT_TRUE(src->decode(a, Logits::kLast).is_ok());
    auto took = dst->adopt_prefix(*src, 120);
    ASSERT_TRUE(took.has_value()) << took.error().message;
    EXPECT_EQ(*took, 112);  // 7 blocks of 16
    ASSERT_TRUE(dst->decode(std::span<const int32_t>(b).subspan(112), Logits::kAll).is_ok());
    ASSERT_TRUE(fresh->decode(b, Logits::kAll).is_ok());
    const int64_t nv = stories().hparams().n_vocab;
    // The last 48 rows of b: dst's logits against the context that evaluated b itself.
    EXPECT_LE(max_abs_diff(dst->logits(0), fresh->logits(112), 48 * nv), 1e-4) << attn;
    EXPECT_EQ(dst->tokens(), fresh->tokens());
    // src decodes on, dst too: neither disturbs the other.
    auto src_ref = make(stories(), attn);
    ASSERT_TRUE(src_ref->decode(a, Logits::kLast).is_ok());
    for (int step = 0; step < 8; ++step) {
      const int32_t t = 7 + step;
      ASSERT_TRUE(src->decode(std::span<const int32_t>(&t, 1)).is_ok());
      ASSERT_TRUE(src_ref->decode(std::span<const int32_t>(&t, 1)).is_ok());
      ASSERT_TRUE(dst->decode(std::span<const int32_t>(&t, 1)).is_ok());
      ASSERT_TRUE(fresh->decode(std::span<const int32_t>(&t, 1)).is_ok());
      EXPECT_LE(max_abs_diff(src->logits(0), src_ref->logits(0), nv), 1e-4);
      EXPECT_LE(max_abs_diff(dst->logits(0), fresh->logits(0), nv), 1e-4);
    }
    EXPECT_GT(pool->n_shared(), 0);
  }
  // A press keeps state beside the cache: refused.
  ContextParams p;
  p.n_ctx = 512;
  p.kv_block = 16;
  p.kv_pool = pool;
  p.kv_press = "snapkv:ratio=0.5,window=8";
  auto pressed = Context::create(stories(), p);
  ASSERT_TRUE(pressed.has_value());
  auto src = shared("dense");
  ASSERT_TRUE(src->decode(prompt(64, 2)).is_ok());
  auto r = (*pressed)->adopt_prefix(*src, 64);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace lc
