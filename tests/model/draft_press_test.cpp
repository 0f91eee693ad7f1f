// Draft-guided presses and the H2O observer inside the model's Context, on the small golden
// models (all of which share one 512-token vocabulary, so stories260K drafts for
// llama_gqa_f32). Oracles: the kept sets recomputed here in double from the unpressed model's
// keys and queries (naive softmax, the papers' formulas), and prefill of exactly the selected
// tokens for SpecPC.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kv/press_spec.h"
#include "model/context.h"
#include "model/press_runner.h"
#include "model/query_window.h"
#include "model/draft.h"
#include "model/model.h"
#include "model/random_model.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

std::vector<int32_t> prompt_ids(const char* which) {
  std::ifstream in(kGolden + "cases/llama_gqa_f32/case.json");
  const auto cj = nlohmann::json::parse(in);
  return cj["prompts"][which]["ids"].get<std::vector<int32_t>>();
}

struct Models {
  std::unique_ptr<Model> target, draft;
  Models() {
    auto t = Model::load(kGolden + "models/llama_gqa_f32.gguf");
    auto d = Model::load(kGolden + "models/stories260K.gguf");
    EXPECT_TRUE(t.has_value() && d.has_value());
    target = std::move(*t);
    draft = std::move(*d);
  }
};

std::unique_ptr<Context> make_ctx(const Model& m, const std::string& press, const Model* draft = nullptr,
                                  int64_t n_batch = 64) {
  ContextParams cp{512, n_batch, 1};
  cp.kv_press = press;
  cp.draft = draft;
  auto c = Context::create(m, cp);
  EXPECT_TRUE(c.has_value()) << press << ": " << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

std::vector<int32_t> seq_of(const KvCache& kv, int64_t il, int64_t h) {
  const int32_t* s = kv.seq_index(il, h);
  return std::vector<int32_t>(s, s + kv.n_tokens(il, h));
}

// Causal softmax (double) of query row t of `q` (pre-RoPE [n, n_head * d], position qp) for
// query head hq over keys [0, n_keys) of the unpressed cache, key j visible when j <= qs.
std::vector<double> probs(const KvCache& kv, int64_t il, const float* q, int32_t qp, int32_t qs, int64_t hq,
                          int64_t n_head, int64_t n_keys) {
  const int64_t d = kv.head_dim(), g = n_head / kv.n_head_kv();
  std::vector<float> qr(q, q + n_head * d), K(static_cast<size_t>(n_keys * d));
  kv.rope(il).apply(qr.data(), 1, n_head, d, &qp);
  kv.read_keys(il, hq / g, 0, n_keys, K.data());
  std::vector<double> p(static_cast<size_t>(n_keys), 0.0);
  double mx = -1e300, sum = 0;
  const int64_t vis = std::min<int64_t>(n_keys, static_cast<int64_t>(qs) + 1);
  for (int64_t j = 0; j < vis; ++j) {
    double a = 0;
    for (int64_t e = 0; e < d; ++e) a += static_cast<double>(qr[static_cast<size_t>(hq * d + e)]) * K[static_cast<size_t>(j * d + e)];
    p[static_cast<size_t>(j)] = a / std::sqrt(static_cast<double>(d));
    mx = std::max(mx, p[static_cast<size_t>(j)]);
  }
  for (int64_t j = 0; j < vis; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
  for (int64_t j = 0; j < vis; ++j) p[static_cast<size_t>(j)] /= sum;
  return p;
}

// Kept set: the top `take` of cand by score (ties: lower index), plus `extra`, ascending.
std::vector<int32_t> top(const std::vector<double>& sc, int64_t n_cand, int64_t take, int64_t first_extra, int64_t n) {
  std::vector<int32_t> c;
  for (int32_t j = 0; j < n_cand; ++j) c.push_back(j);
  std::stable_sort(c.begin(), c.end(), [&](int32_t a, int32_t b) { return sc[static_cast<size_t>(a)] > sc[static_cast<size_t>(b)]; });
  std::vector<int32_t> k(c.begin(), c.begin() + take);
  for (int32_t j = static_cast<int32_t>(first_extra); j < n; ++j) k.push_back(j);
  std::sort(k.begin(), k.end());
  return k;
}

// stop_at_eog: the answer ends after its first end-of-generation token (SpecKV's lookahead).
std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int64_t n, bool stop_at_eog = false) {
  auto c = make_ctx(m, "");
  EXPECT_TRUE(c->decode(prompt, Logits::kLast).is_ok());
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const float* lg = c->logits(0);
    out.push_back(static_cast<int32_t>(std::max_element(lg, lg + m.hparams().n_vocab) - lg));
    if (stop_at_eog && m.tokenizer().is_eog(out.back())) break;
    if (i + 1 < n) {
      EXPECT_TRUE(c->decode(std::span<const int32_t>(&out.back(), 1), Logits::kLast).is_ok());
    }
  }
  return out;
}

// SpecKV's kept sets, recomputed in double from the unpressed model as the authors' code
// (furiosa-ai/draft-based-approx-llm, speckv/) defines them: the target runs the prompt and
// then the draft's greedy answer (at most la tokens, ending after an end-of-generation token);
// the queries of the last obs prompt tokens and of the answer score the prompt's tokens before
// the window with a causal softmax over EVERY key before them, the answer's included; max over
// the group's query heads x queries jointly, then max-pooled (kernel 7); the window and the
// best (kept - obs) stay. [layer][KV head] -> kept sequence indices. *n_la: the answer's length.
// one_pass_attn (the sparse prefill's oracle): the prompt and the answer run as one call with this
// attention, whose obs= is the window's size (the spec ends with "obs=").
std::vector<std::vector<std::vector<int32_t>>> speckv_kept(const Models& m, const std::vector<int32_t>& ids,
                                                           int64_t obs, int64_t la, int64_t kept, int64_t* n_la,
                                                           const std::string& one_pass_attn = "") {
  const int64_t P = static_cast<int64_t>(ids.size()), H = 8, row = H * 16;
  const auto drafted = la > 0 ? greedy(*m.draft, ids, la, true) : std::vector<int32_t>();
  const int64_t A = static_cast<int64_t>(drafted.size());
  *n_la = A;
  std::unique_ptr<Context> ref;
  if (one_pass_attn.empty()) {
    ref = make_ctx(*m.target, "");
  } else {
    ContextParams cp{512, 512, 1};
    cp.attn = one_pass_attn + std::to_string(obs + A);
    auto c = Context::create(*m.target, cp);
    EXPECT_TRUE(c.has_value()) << cp.attn;
    ref = std::move(*c);
  }
  QueryRecorder rec(4, row, obs + A);
  ref->attach_hooks(&rec);
  if (one_pass_attn.empty()) {
    EXPECT_TRUE(ref->decode(ids, Logits::kNone).is_ok());
    if (A > 0) {
      EXPECT_TRUE(ref->decode(drafted, Logits::kNone).is_ok());
    }
  } else {
    std::vector<int32_t> all = ids;
    all.insert(all.end(), drafted.begin(), drafted.end());
    EXPECT_TRUE(ref->decode(all, Logits::kNone).is_ok());
  }
  EXPECT_EQ(rec.window().size(), obs + A);
  std::vector<std::vector<std::vector<int32_t>>> out(4);
  for (int64_t il = 0; il < 4; ++il)
    for (int64_t h = 0; h < 2; ++h) {
      std::vector<double> a(static_cast<size_t>(P - obs), 0.0), pooled(static_cast<size_t>(P - obs), 0.0);
      for (int64_t hq = h * 4; hq < h * 4 + 4; ++hq)
        for (int64_t t = 0; t < obs + A; ++t) {
          const int32_t qp = rec.window().positions(obs + A)[t];
          const auto p = probs(ref->kv(), il, rec.window().queries(il, obs + A) + t * row, qp, qp, hq, H, P + A);
          for (int64_t j = 0; j < P - obs; ++j) a[static_cast<size_t>(j)] = std::max(a[static_cast<size_t>(j)], p[static_cast<size_t>(j)]);
        }
      for (int64_t j = 0; j < P - obs; ++j)
        for (int64_t i = std::max<int64_t>(0, j - 3); i <= std::min<int64_t>(P - obs - 1, j + 3); ++i)
          pooled[static_cast<size_t>(j)] = std::max(pooled[static_cast<size_t>(j)], a[static_cast<size_t>(i)]);
      out[static_cast<size_t>(il)].push_back(top(pooled, P - obs, kept - obs, P - obs, P));
    }
  return out;
}

// SpecKV in the Context: the draft's answer runs through the target and leaves the cache
// again; the prompt's logits and sequence are untouched; the kept sets are the authors'.
TEST(DraftPress, SpecKvKeepsWhatTheLookaheadQueriesAttend) {
  Models m;
  const auto ids = prompt_ids("p3");  // 256 tokens
  const int64_t P = 256, obs = 16, la = 4;
  auto c = make_ctx(*m.target, "speckv:ratio=0.5,obs=16,lookahead=4", m.draft.get());
  auto base = make_ctx(*m.target, "");
  ASSERT_TRUE(c && base);
  ASSERT_TRUE(c->decode(ids, Logits::kLast).is_ok());
  ASSERT_TRUE(base->decode(ids, Logits::kLast).is_ok());
  EXPECT_EQ(c->n_past(), P);
  EXPECT_EQ(c->tokens(), ids);
  for (int64_t il = 0; il < 4; ++il) {
    EXPECT_EQ(c->kv().n_appended(il), P);
    for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(c->kv().n_tokens(il, h), 128);
  }
  for (int64_t v = 0; v < 512; ++v) ASSERT_EQ(c->logits(0)[v], base->logits(0)[v]);  // the prompt's logits survive
  int64_t A = 0;
  const auto want = speckv_kept(m, ids, obs, la, 128, &A);
  EXPECT_EQ(c->press_runner()->lookahead_run(), A);
  EXPECT_GT(A, 0);
  for (int64_t il = 0; il < 4; ++il)
    for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(seq_of(c->kv(), il, h), want[static_cast<size_t>(il)][static_cast<size_t>(h)]) << il << " " << h;
}

// prefill=sparse, the authors' flow: the draft answers first; the prompt and the answer run as one
// pass with the vertical-slash attention (sparse above vertical + slash tokens); the same window
// scores; the answer and the last prompt token are cropped and that token evaluated again. The
// oracle runs the unpressed model over prompt + answer in one call with the same attention (vslash
// has its own oracle test) and recomputes the kept sets in double. With the defaults (2048 + 2048)
// the 260-token pass is dense, so the kept sets are the dense ones; with vertical=64,slash=64 it
// is sparse from layer 1 on, and some layer keeps another set.
TEST(DraftPress, SpecKvSparsePrefillIsTheAuthorsOnePass) {
  Models m;
  const auto ids = prompt_ids("p3");  // 256 tokens
  const int64_t P = 256, obs = 16, la = 4;
  std::vector<std::vector<std::vector<int32_t>>> got_dense;
  for (const bool sparse : {false, true}) {
    const std::string knobs = sparse ? ",vertical=64,slash=64" : "";
    auto c = make_ctx(*m.target, "speckv:ratio=0.5,obs=16,lookahead=4,prefill=sparse" + knobs, m.draft.get(), 512);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->decode(ids, Logits::kLast).is_ok());
    EXPECT_EQ(c->n_past(), P);
    EXPECT_EQ(c->tokens(), ids);
    EXPECT_EQ(c->attention().spec().rfind("dense", 0), 0u) << c->attention().spec();  // the context's own, back
    int64_t A = 0;
    const auto want = speckv_kept(m, ids, obs, la, 128, &A,
                                  std::string("vslash:vertical=") + (sparse ? "64,slash=64" : "2048,slash=2048") +
                                      ",kernel=7,pool=max,reduce=max,obs=");
    EXPECT_EQ(c->press_runner()->lookahead_run(), A);
    EXPECT_GT(A, 0);
    std::vector<std::vector<std::vector<int32_t>>> got(4);
    for (int64_t il = 0; il < 4; ++il)
      for (int64_t h = 0; h < 2; ++h) {
        got[static_cast<size_t>(il)].push_back(seq_of(c->kv(), il, h));
        EXPECT_EQ(got[static_cast<size_t>(il)].back(), want[static_cast<size_t>(il)][static_cast<size_t>(h)])
            << sparse << " " << il << " " << h;
      }
    if (!sparse) {
      // Dense pass: the authors' kept sets are the dense flow's (prefill=dense).
      int64_t A2 = 0;
      EXPECT_EQ(got, speckv_kept(m, ids, obs, la, 128, &A2));
      got_dense = got;
    } else {
      EXPECT_NE(got, got_dense);
    }
    // Decoding goes on from the last prompt token evaluated over the compressed cache.
    const float* lg = c->logits(0);
    const int32_t next = static_cast<int32_t>(std::max_element(lg, lg + 512) - lg);
    ASSERT_TRUE(c->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
    EXPECT_EQ(c->n_past(), P + 1);
  }
  // The pass must be one forward chunk.
  auto small = make_ctx(*m.target, "speckv:ratio=0.5,obs=16,lookahead=4,prefill=sparse", m.draft.get(), 64);
  ASSERT_TRUE(small);
  const Status st = small->decode(ids, Logits::kLast);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("-b 260"), std::string::npos) << st.message();
}

// lookahead=answer (the default): the draft looks ahead by the request's answer budget
// (Context::set_answer_tokens; the Session gives its n_predict), by 32 tokens where none is
// given, and not at all for a budget of 0.
TEST(DraftPress, SpecKvLooksAheadByTheAnswerBudget) {
  Models m;
  const auto ids = prompt_ids("p3");
  const int64_t obs = 16;
  for (int64_t budget : {6, -1, 0}) {
    auto c = make_ctx(*m.target, "speckv:ratio=0.5,obs=16", m.draft.get());
    ASSERT_TRUE(c);
    if (budget >= 0) c->set_answer_tokens(budget);
    ASSERT_TRUE(c->decode(ids, Logits::kLast).is_ok());
    const int64_t la = budget >= 0 ? budget : PressRunner::kLookaheadNoAnswer;
    int64_t A = 0;
    const auto want = speckv_kept(m, ids, obs, la, 128, &A);
    EXPECT_EQ(c->press_runner()->lookahead_run(), A) << budget;
    if (budget != 0) {
      EXPECT_GT(A, 0);
    }
    for (int64_t il = 0; il < 4; ++il)
      for (int64_t h = 0; h < 2; ++h)
        EXPECT_EQ(seq_of(c->kv(), il, h), want[static_cast<size_t>(il)][static_cast<size_t>(h)]) << budget << " " << il << " " << h;
  }
}

// Ratio 0: the lookahead leaves the cache exactly as it was: generation matches no press.
TEST(DraftPress, RatioZeroIsIdentity) {
  Models m;
  const auto ids = prompt_ids("p2");
  for (const char* spec : {"speckv:ratio=0", "specpc:ratio=0"}) {
    auto c = make_ctx(*m.target, spec, m.draft.get(), 7);
    auto base = make_ctx(*m.target, "", nullptr, 7);
    ASSERT_TRUE(c->decode(ids, Logits::kLast).is_ok());
    ASSERT_TRUE(base->decode(ids, Logits::kLast).is_ok());
    for (int step = 0; step < 5; ++step) {
      for (int64_t v = 0; v < 512; ++v) ASSERT_NEAR(c->logits(0)[v], base->logits(0)[v], 1e-5) << spec << " " << step;
      const int32_t id = static_cast<int32_t>(std::max_element(base->logits(0), base->logits(0) + 512) - base->logits(0));
      ASSERT_TRUE(c->decode(std::span<const int32_t>(&id, 1), Logits::kLast).is_ok());
      ASSERT_TRUE(base->decode(std::span<const int32_t>(&id, 1), Logits::kLast).is_ok());
    }
  }
}

// SpecPC: the draft's attention picks the prompt tokens; the target evaluates exactly those
// (re-assigned positions 0..k-1): its logits equal a plain prefill of the selected tokens.
TEST(DraftPress, SpecPcPrefillsOnlyTheSelectedTokens) {
  Models m;
  const auto ids = prompt_ids("p3");
  const int64_t P = 256, win = 16, la = 3;
  auto c = make_ctx(*m.target, "specpc:budget=100,window=16,kernel=5,lookahead=3,start_layer=2", m.draft.get());
  ASSERT_TRUE(c->decode(ids, Logits::kLast).is_ok());
  EXPECT_EQ(c->n_past(), 100);
  const auto kept = c->prompt_kept();
  ASSERT_EQ(kept.size(), 100u);
  EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
  for (int32_t j = P - win; j < P; ++j) EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), j)) << j;
  std::vector<int32_t> sel;
  for (int32_t j : kept) sel.push_back(ids[static_cast<size_t>(j)]);
  EXPECT_EQ(c->tokens(), sel);
  auto plain = make_ctx(*m.target, "");
  ASSERT_TRUE(plain->decode(sel, Logits::kLast).is_ok());
  for (int64_t v = 0; v < 512; ++v) ASSERT_NEAR(c->logits(0)[v], plain->logits(0)[v], 1e-5);
  // The selection is specpc_select over the draft's attention of its last 16 prompt queries
  // and its first 2 generated tokens (the scores' formula is tested against naive softmax in
  // test_kv): the wiring of window, lookahead and layers.
  auto d = make_ctx(*m.draft, "");
  const HParams& dh = m.draft->hparams();
  QueryRecorder rec(dh.n_layer, dh.n_head * dh.head_dim, win + la - 1);
  d->attach_hooks(&rec);
  ASSERT_TRUE(d->decode(ids, Logits::kLast).is_ok());
  const auto gen = greedy(*m.draft, ids, la);
  ASSERT_TRUE(d->decode(std::span<const int32_t>(gen.data(), la - 1), Logits::kNone).is_ok());
  PromptCompression pc;
  pc.budget = 100, pc.window = win, pc.kernel = 5, pc.neighbours = 5, pc.lookahead = la, pc.start_layer = 2;
  const QueryWindow& w = rec.window();
  const int64_t n_q = w.size();
  std::vector<const float*> q;
  for (int64_t il = 0; il < dh.n_layer; ++il) q.push_back(w.queries(il, n_q));
  const auto s = specpc_scores(d->kv(), PressShape{dh.n_layer, dh.n_head, dh.n_head_kv, dh.head_dim, dh.head_dim_v, 0.0f}, q,
                               w.positions(n_q), w.positions(n_q), n_q, win, P, pc);
  EXPECT_EQ(specpc_select(s, 100, pc), kept);
  // Perplexity-style all-row logits do not exist for the dropped tokens.
  auto c2 = make_ctx(*m.target, "specpc:budget=100,window=16", m.draft.get());
  EXPECT_FALSE(c2->decode(ids, Logits::kAll).is_ok());
}

// H2O accumulates the attention of every real query (chunked prefill): the kept set is the
// top of sum / (group * queries that saw the token), recomputed from the unpressed model.
TEST(DraftPress, H2oObservesTheRealForward) {
  Models m;
  const auto ids = prompt_ids("p3");
  const int64_t P = 256, w = 16;
  auto c = make_ctx(*m.target, "h2o:budget=80,window=16", nullptr, 48);
  ASSERT_TRUE(c->decode(ids, Logits::kLast).is_ok());
  auto ref = make_ctx(*m.target, "");
  QueryRecorder rec(4, 8 * 16, P);
  ref->attach_hooks(&rec);
  ASSERT_TRUE(ref->decode(ids, Logits::kNone).is_ok());
  const int64_t H = 8, row = H * 16;
  for (int64_t il = 0; il < 4; ++il)
    for (int64_t h = 0; h < 2; ++h) {
      std::vector<double> sc(P, 0.0);
      for (int64_t t = 0; t < P; ++t)
        for (int64_t hq = h * 4; hq < h * 4 + 4; ++hq) {
          const auto p = probs(ref->kv(), il, rec.window().queries(il, P) + t * row, static_cast<int32_t>(t), static_cast<int32_t>(t), hq, H, P);
          for (int64_t j = 0; j <= t; ++j) sc[static_cast<size_t>(j)] += p[static_cast<size_t>(j)];
        }
      for (int64_t j = 0; j < P; ++j) sc[static_cast<size_t>(j)] /= 4.0 * static_cast<double>(P - j);
      EXPECT_EQ(seq_of(c->kv(), il, h), top(sc, P - w, 80 - w, P - w, P)) << il << " " << h;
    }
  // With a backend that attends a subset, the observer would be wrong: refused.
  ContextParams cp{512, 64, 1};
  cp.kv_press = "h2o:ratio=0.5";
  cp.attn = "quest";
  auto bad = Context::create(*m.target, cp);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("quest"), std::string::npos) << bad.error().message;
}

// Query-agnostic: the context is compressed before the question; the question stays whole.
TEST(DraftPress, AgnosticCompressesTheContextOnly) {
  Models m;
  const auto ids = prompt_ids("p3");
  auto c = make_ctx(*m.target, "knorm:ratio=0.5,query=agnostic");
  ASSERT_TRUE(c->decode_context(std::span<const int32_t>(ids.data(), 200)).is_ok());
  for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(c->kv().n_tokens(0, h), 100);
  ASSERT_TRUE(c->decode(std::span<const int32_t>(ids.data() + 200, 56), Logits::kLast).is_ok());
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(c->kv().n_tokens(0, h), 156);  // the 56 question tokens appended uncompressed
    const auto s = seq_of(c->kv(), 0, h);
    for (int32_t j = 200; j < 256; ++j) EXPECT_TRUE(std::count(s.begin(), s.end(), j)) << j;
  }
  // Aware (the same press): the whole prompt is compressed after the question.
  auto a = make_ctx(*m.target, "knorm:ratio=0.5");
  ASSERT_TRUE(a->decode(ids, Logits::kLast).is_ok());
  EXPECT_EQ(a->kv().n_tokens(0, 0), 128);
}

// Errors: a draft press without a draft; a draft with another vocabulary (names both).
TEST(DraftPress, DraftErrors) {
  Models m;
  ContextParams cp{512, 64, 1};
  cp.kv_press = "speckv:ratio=0.5";
  auto e = Context::create(*m.target, cp);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("--draft"), std::string::npos) << e.error().message;
  cp.kv_press = "specpc:ratio=0.5";
  EXPECT_FALSE(Context::create(*m.target, cp).has_value());
  // The same model as its own draft is a valid setup.
  EXPECT_TRUE(check_draft_vocab(*m.target, "a.gguf", *m.target, "a.gguf").is_ok());
  EXPECT_TRUE(check_draft_vocab(*m.target, "t.gguf", *m.draft, "d.gguf").is_ok());
  // A small random model with GPT-2's vocabulary.
  RandomModelSpec rs;
  rs.n_layer = 1, rs.n_embd = 32, rs.n_head = 2, rs.n_head_kv = 1, rs.n_ff = 32, rs.n_ctx_train = 128;
  rs.weight_type = DType::F16;
  rs.vocab_path = std::string(LONGCTX_TEST_DATA) + "/vocab/ggml-vocab-gpt-2.gguf";
  const std::string path = ::testing::TempDir() + "/draft_press_gpt2_vocab.gguf";
  ASSERT_TRUE(write_random_model(rs, path).is_ok());
  auto other = Model::load(path);
  ASSERT_TRUE(other.has_value()) << other.error().message;
  const Status st = check_draft_vocab(*m.target, "target.gguf", **other, "gpt2-draft.gguf");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("target.gguf"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("gpt2-draft.gguf"), std::string::npos) << st.message();
  cp.draft = other->get();
  cp.draft_name = "gpt2-draft.gguf";
  cp.model_name = "target.gguf";
  auto e2 = Context::create(*m.target, cp);
  ASSERT_FALSE(e2.has_value());
  EXPECT_NE(e2.error().message.find("gpt2-draft.gguf"), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace lc
