// runtime::Session: the request flow against llama.cpp's greedy golden, stop strings against
// the same run without them, cancellation, qTTT's weight restore, multi-turn prefix reuse, and
// save/restore: a restored session gives the logits of the session that was saved (same
// bits), for several cache types, with a press and with a spill file; bad files are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "runtime/session.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";
const std::string kStories = kGolden + "models/stories260K.gguf";

std::unique_ptr<Model> load(const std::string& path = kStories) {
  auto m = Model::load(path);
  EXPECT_TRUE(m.has_value()) << m.error().message;
  return m ? std::move(*m) : nullptr;
}

SessionParams params(int64_t n_ctx = 512) {
  SessionParams p;
  p.ctx.n_ctx = n_ctx;
  p.ctx.n_batch = 64;
  p.ctx.n_threads = 2;
  return p;
}

Sampler greedy() {
  SamplerParams sp;
  sp.temp = 0;
  return Sampler(sp);
}

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("lc_session_" + name)).string();
}

std::vector<int32_t> story_tokens(const Model& m, int copies = 1) {
  std::string text;
  for (int i = 0; i < copies; ++i)
    text += "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. ";
  return m.tokenizer().encode(text, true, false);
}

TEST(Session, GreedyRunMatchesLlamaCpp) {
  auto model = load();
  std::ifstream jf(kGolden + "cases/stories260K/case.json");
  const auto cj = nlohmann::json::parse(jf);
  const auto prompt = cj["prompts"]["p1"]["ids"].get<std::vector<int32_t>>();
  const auto gold = cj["greedy"]["ids"].get<std::vector<int32_t>>();
  auto s = Session::create(*model, params());
  ASSERT_TRUE(s.has_value()) << s.error().message;
  Sampler sampler = greedy();
  GenerateOptions g;
  g.n_predict = static_cast<int64_t>(gold.size());
  std::string streamed;
  auto st = (*s)->run(Prompt{prompt, -1}, sampler, g, [&](int32_t, std::string_view t) {
    streamed += t;
    return true;
  });
  ASSERT_TRUE(st.has_value()) << st.error().message;
  EXPECT_EQ(st->generated, gold);
  EXPECT_EQ(st->text, cj["greedy"]["text"].get<std::string>());
  EXPECT_EQ(streamed, st->text);
  EXPECT_EQ(st->stop, StopReason::kLength);
  EXPECT_EQ(st->n_prompt, static_cast<int64_t>(prompt.size()));
  // The history is the prompt and the answer; the cache holds all but the last token.
  EXPECT_EQ((*s)->history().size(), prompt.size() + gold.size());
  EXPECT_EQ((*s)->context().n_past(), static_cast<int64_t>(prompt.size() + gold.size() - 1));
}

TEST(Session, StopStringsCutTheTextWhereTheyStart) {
  auto model = load();
  const auto prompt = story_tokens(*model);
  Sampler a = greedy();
  auto s = Session::create(*model, params());
  ASSERT_TRUE(s.has_value());
  GenerateOptions g;
  g.n_predict = 48;
  auto full = (*s)->run(Prompt{prompt, -1}, a, g, {});
  ASSERT_TRUE(full.has_value());
  ASSERT_GT(full->text.size(), 20u);
  // A stop string taken from the middle of the free text: the output is the text before its
  // first occurrence, and what was streamed is exactly that.
  const std::string stop = full->text.substr(full->text.size() / 2, 4);
  const size_t at = full->text.find(stop);
  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{stop}, std::vector<std::string>{"\x01never", stop}}) {
    g.stop = stops;
    std::string streamed;
    Sampler b = greedy();
    auto cut = (*s)->run(Prompt{prompt, -1}, b, g, [&](int32_t, std::string_view t) {
      streamed += t;
      return true;
    });
    ASSERT_TRUE(cut.has_value()) << cut.error().message;
    EXPECT_EQ(cut->stop, StopReason::kStopString);
    EXPECT_EQ(cut->text, full->text.substr(0, at));
    EXPECT_EQ(streamed, cut->text);
    EXPECT_LT(cut->n_gen, full->n_gen);
  }
  // A stop string that never occurs changes nothing; an empty one is an error.
  g.stop = {"\x01\x02"};
  Sampler c = greedy();
  auto same = (*s)->run(Prompt{prompt, -1}, c, g, {});
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->text, full->text);
  EXPECT_EQ(same->stop, StopReason::kLength);
  g.stop = {""};
  Sampler d = greedy();
  auto bad = (*s)->run(Prompt{prompt, -1}, d, g, {});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
}

TEST(Session, CancelStopsGenerationAndPrefill) {
  auto model = load();
  const auto prompt = story_tokens(*model, 6);
  auto s = Session::create(*model, params(1024));
  ASSERT_TRUE(s.has_value());
  GenerateOptions g;
  g.n_predict = 40;
  int calls = 0;
  Sampler a = greedy();
  auto st = (*s)->run(Prompt{prompt, -1}, a, g, [&](int32_t, std::string_view) {
    if (++calls == 3) (*s)->cancel();
    return true;
  });
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->stop, StopReason::kCancelled);
  EXPECT_EQ(st->n_gen, 3);
  // A callback returning false stops at once.
  Sampler b = greedy();
  auto st2 = (*s)->run(Prompt{prompt, -1}, b, g, [&](int32_t, std::string_view) { return false; });
  ASSERT_TRUE(st2.has_value());
  EXPECT_EQ(st2->stop, StopReason::kCallback);
  EXPECT_EQ(st2->n_gen, 1);
  // During prefill (chunks of 64): progress is reported, and a cancel ends it with a typed error.
  ASSERT_GT(prompt.size(), 128u);
  std::vector<int64_t> seen;
  (*s)->set_progress([&](int64_t done, int64_t total) {
    seen.push_back(done);
    EXPECT_EQ(total, static_cast<int64_t>(prompt.size()));
    if (done >= 64) (*s)->cancel();
  });
  Sampler c = greedy();
  auto st3 = (*s)->run(Prompt{prompt, -1}, c, g, {});
  ASSERT_FALSE(st3.has_value());
  EXPECT_EQ(st3.error().code, ErrorCode::kCancelled);
  EXPECT_EQ(seen, (std::vector<int64_t>{64}));
  EXPECT_EQ((*s)->context().n_past(), 64);
  // The next request starts afresh.
  (*s)->set_progress({});
  Sampler d = greedy();
  auto st4 = (*s)->run(Prompt{prompt, -1}, d, g, {});
  ASSERT_TRUE(st4.has_value()) << st4.error().message;
  EXPECT_EQ(st4->n_gen, 40);
}

TEST(Session, BadPromptsAreTypedErrors) {
  auto model = load();
  auto s = Session::create(*model, params(64));
  ASSERT_TRUE(s.has_value());
  Sampler a = greedy();
  auto empty = (*s)->run(Prompt{{}, -1}, a, GenerateOptions{}, {});
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().code, ErrorCode::kInvalidArgument);
  auto big = (*s)->run(Prompt{std::vector<int32_t>(65, 5), -1}, a, GenerateOptions{}, {});
  ASSERT_FALSE(big.has_value());
  EXPECT_EQ(big.error().code, ErrorCode::kContextFull);
  // Generation that runs into the end of the context.
  GenerateOptions g;
  g.n_predict = 100;
  auto full = (*s)->run(Prompt{std::vector<int32_t>(60, 5), -1}, a, g, {});
  ASSERT_FALSE(full.has_value());
  EXPECT_EQ(full.error().code, ErrorCode::kContextFull);
}

TEST(Session, MultiTurnReusesTheCachedPrefix) {
  auto model = load();
  auto s = Session::create(*model, params());
  ASSERT_TRUE(s.has_value());
  const auto turn1 = story_tokens(*model);
  Sampler a = greedy();
  GenerateOptions g;
  g.n_predict = 8;
  auto st1 = (*s)->continue_with(turn1, a, g, {});
  ASSERT_TRUE(st1.has_value()) << st1.error().message;
  EXPECT_EQ(st1->n_reused, 0);
  std::vector<int32_t> turn2 = (*s)->history();
  const auto more = model->tokenizer().encode(" The end.", false, false);
  turn2.insert(turn2.end(), more.begin(), more.end());
  auto st2 = (*s)->continue_with(turn2, a, g, {});
  ASSERT_TRUE(st2.has_value());
  // Everything the cache held was reused: the prompt and the answer but its last token.
  EXPECT_EQ(st2->n_reused, static_cast<int64_t>(turn1.size() + 8 - 1));
  EXPECT_EQ(st2->n_prompt, static_cast<int64_t>(turn2.size()) - st2->n_reused);
  // The same conversation from scratch gives the same answer.
  auto fresh = Session::create(*model, params());
  ASSERT_TRUE(fresh.has_value());
  Sampler b = greedy();
  auto st3 = (*fresh)->continue_with(turn2, b, g, {});
  ASSERT_TRUE(st3.has_value());
  EXPECT_EQ(st3->generated, st2->generated);
}

TEST(Session, MethodsThatCannotServeTurnsAreRefused) {
  auto model = load();
  SessionParams p = params();
  p.ctx.kv_press = "snapkv:ratio=0.5,query=agnostic";
  auto s = Session::create(*model, p);
  ASSERT_TRUE(s.has_value());
  Status st = (*s)->check_multi_turn();
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  Sampler a = greedy();
  auto r = (*s)->continue_with(story_tokens(*model), a, GenerateOptions{}, {});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kUnsupported);
  // qTTT with a press is refused when the Session is made.
  SessionParams q = params();
  q.ctx.kv_press = "knorm:ratio=0.5";
  q.qttt.steps = 2;
  auto bad = Session::create(*model, q);
  ASSERT_FALSE(bad.has_value());
}

TEST(Session, QtttWeightsAreRestoredAfterTheRequest) {
  auto model = load();
  SessionParams p = params();
  p.qttt.steps = 2;
  p.qttt.span = 16;
  auto s = Session::create(*model, p);
  ASSERT_TRUE(s.has_value()) << s.error().message;
  const auto doc = story_tokens(*model, 2);
  const auto q = model->tokenizer().encode(" Who?", false, false);
  std::vector<int32_t> tokens = doc;
  tokens.insert(tokens.end(), q.begin(), q.end());
  Sampler a = greedy();
  GenerateOptions g;
  g.n_predict = 4;
  g.qttt_seed = 7;
  auto st = (*s)->run(Prompt{tokens, static_cast<int64_t>(doc.size())}, a, g, {});
  ASSERT_TRUE(st.has_value()) << st.error().message;
  EXPECT_TRUE(st->qttt_ran);
  EXPECT_EQ(st->qttt.steps, 2);
  EXPECT_EQ(st->qttt.n_context, static_cast<int64_t>(doc.size()));
  EXPECT_FALSE((*s)->context().has_query_weights());
  // A failing request restores them too: a span longer than the document.
  SessionParams p2 = params();
  p2.qttt.steps = 1;
  p2.qttt.span = 1000;
  auto s2 = Session::create(*model, p2);
  ASSERT_TRUE(s2.has_value());
  auto bad = (*s2)->run(Prompt{tokens, static_cast<int64_t>(doc.size())}, a, g, {});
  ASSERT_FALSE(bad.has_value());
  EXPECT_FALSE((*s2)->context().has_query_weights());
}

// In steps, qTTT trains one gradient step per prefill_step() call (a server runs the other
// slots between them), and the request ends as run() ends it: the same span losses, the same
// trained logits.
TEST(SessionSteps, QtttTrainsOneStepPerCall) {
  auto model = load();
  SessionParams p = params();
  p.qttt.steps = 3;
  p.qttt.span = 16;
  const auto doc = story_tokens(*model, 2);
  const auto q = model->tokenizer().encode(" Who?", false, false);
  std::vector<int32_t> tokens = doc;
  tokens.insert(tokens.end(), q.begin(), q.end());
  auto whole = Session::create(*model, p);
  ASSERT_TRUE(whole.has_value());
  Sampler a = greedy();
  GenerateOptions g;
  g.n_predict = 1;
  g.qttt_seed = 7;
  auto want = (*whole)->run(Prompt{tokens, static_cast<int64_t>(doc.size())}, a, g, {});
  ASSERT_TRUE(want.has_value()) << want.error().message;
  auto stepped = Session::create(*model, p);
  ASSERT_TRUE(stepped.has_value());
  ASSERT_TRUE((*stepped)->begin_run(Prompt{tokens, static_cast<int64_t>(doc.size())}, 7).is_ok());
  auto other = Session::create(*model, params());
  ASSERT_TRUE(other.has_value());
  ASSERT_TRUE((*other)->context().decode(story_tokens(*model, 1), Logits::kLast).is_ok());
  int calls = 0;
  for (bool done = false; !done; ++calls) {
    auto d = (*stepped)->prefill_step();
    ASSERT_TRUE(d.has_value()) << d.error().message;
    done = *d;
    const int32_t t = 9;  // other work between the steps
    ASSERT_TRUE((*other)->context().decode(std::span<const int32_t>(&t, 1), Logits::kLast).is_ok());
  }
  const int64_t doc_chunks = (static_cast<int64_t>(doc.size()) + 63) / 64;
  const int64_t q_chunks = (static_cast<int64_t>(q.size()) + 63) / 64;
  EXPECT_EQ(calls, doc_chunks + 3 + q_chunks);
  const RequestStats& st = (*stepped)->prefill_stats();
  ASSERT_TRUE(st.qttt_ran);
  EXPECT_EQ(st.qttt.step_loss, want->qttt.step_loss);
  EXPECT_EQ(st.qttt.starts, want->qttt.starts);
  EXPECT_EQ(st.qttt.loss_after, want->qttt.loss_after);
  Sampler b = greedy();
  RequestStats gs;
  Generation gen(**stepped, b, g, nullptr, gs);
  auto n = gen.next();
  ASSERT_TRUE(n.has_value());
  gen.finish();
  ASSERT_EQ(gs.generated.size(), 1u);
  EXPECT_EQ(gs.generated, want->generated);
  EXPECT_EQ(gs.text, want->text);
}

// Decodes `next` on a session's context and returns the logits.
std::vector<float> logits_after(Session& s, const std::vector<int32_t>& next) {
  EXPECT_TRUE(s.context().decode(next, Logits::kLast).is_ok());
  const float* l = s.context().logits(0);
  return std::vector<float>(l, l + s.model().hparams().n_vocab);
}

struct SaveCase {
  const char* name;
  const char* kv_type;
  const char* press;
  const char* attn;
  bool spill;
  const char* model = nullptr;  // default: stories260K
};

class SessionSave : public ::testing::TestWithParam<SaveCase> {};

TEST_P(SessionSave, RestoredSessionContinuesBitForBit) {
  const SaveCase& c = GetParam();
  auto model = c.model ? load(std::string(LONGCTX_TEST_DATA) + "/../../" + c.model) : load();
  SessionParams p = params(1024);
  p.ctx.kv_block = 16;
  p.ctx.kv_type_k = p.ctx.kv_type_v = *dtype_from_name(c.kv_type);
  p.ctx.kv_press = c.press;
  p.ctx.attn = c.attn;
  const std::string spill = tmp_path(std::string("spill_") + c.name);
  if (c.spill) {
    std::filesystem::create_directories(spill);
    p.ctx.kv_spill = spill;
    p.ctx.kv_budget = 64 * 1024;
  }
  auto a = Session::create(*model, p);
  ASSERT_TRUE(a.has_value()) << a.error().message;
  Sampler sa = greedy();
  GenerateOptions g;
  g.n_predict = 6;
  auto st = (*a)->run(Prompt{story_tokens(*model, 5), -1}, sa, g, {});
  ASSERT_TRUE(st.has_value()) << st.error().message;
  const std::string path = tmp_path(std::string("save_") + c.name);
  ASSERT_TRUE((*a)->save(path).is_ok());

  auto b = Session::create(*model, p);
  ASSERT_TRUE(b.has_value());
  Status ls = (*b)->load(path);
  ASSERT_TRUE(ls.is_ok()) << ls.message();
  EXPECT_EQ((*b)->history(), (*a)->history());
  EXPECT_EQ((*b)->context().tokens(), (*a)->context().tokens());
  EXPECT_EQ((*b)->context().n_past(), (*a)->context().n_past());
  // The last logits came back with the cache, and every head holds what it held.
  const int32_t nv = model->hparams().n_vocab;
  EXPECT_EQ(0, std::memcmp((*a)->context().logits(0), (*b)->context().logits(0), sizeof(float) * nv));
  const KvCache& ka = (*a)->context().kv();
  const KvCache& kb = (*b)->context().kv();
  for (int64_t il = 0; il < ka.n_layer(); ++il)
    for (int64_t h = 0; h < ka.n_head_kv(); ++h) {
      ASSERT_EQ(ka.n_tokens(il, h), kb.n_tokens(il, h));
      const int64_t n = ka.n_tokens(il, h);
      std::vector<float> x(static_cast<size_t>(n * ka.head_dim())), y(x.size());
      ka.read_keys(il, h, 0, n, x.data());
      kb.read_keys(il, h, 0, n, y.data());
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(ka.positions(il, h), kb.positions(il, h), static_cast<size_t>(n) * 4));
    }
  // Both continue with the same tokens: same logits, bit for bit, step after step.
  const std::vector<int32_t> next = {(*a)->history().back(), 42, 7};
  for (int32_t t : next) {
    const auto la = logits_after(**a, {t});
    const auto lb = logits_after(**b, {t});
    ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << c.name;
  }
  std::remove(path.c_str());
  if (c.spill) std::filesystem::remove_all(spill);
}

INSTANTIATE_TEST_SUITE_P(Caches, SessionSave,
                         ::testing::Values(SaveCase{"f32", "f32", "", "", false}, SaveCase{"f16", "f16", "", "", false},
                                           SaveCase{"bf16", "bf16", "", "", false},
                                           SaveCase{"q8_0", "q8_0", "", "", false, "models/longctx-2l.gguf"},
                                           SaveCase{"fixed_q8_0", "q8_0", "", "fixed", false, "models/longctx-2l.gguf"},
                                           SaveCase{"snapkv", "f32", "snapkv:ratio=0.5", "", false},
                                           SaveCase{"knorm_decode", "f16", "knorm:interval=4,target=40", "", false},
                                           SaveCase{"quest", "f32", "", "quest:budget=64,page=16", false},
                                           SaveCase{"spill", "f32", "", "", true}),
                         [](const auto& i) { return std::string(i.param.name); });

TEST(SessionSave, BadFilesAreErrors) {
  auto model = load();
  SessionParams p = params();
  auto a = Session::create(*model, p);
  ASSERT_TRUE(a.has_value());
  Sampler sa = greedy();
  GenerateOptions g;
  g.n_predict = 3;
  ASSERT_TRUE((*a)->run(Prompt{story_tokens(*model), -1}, sa, g, {}).has_value());
  const std::string path = tmp_path("bad");
  ASSERT_TRUE((*a)->save(path).is_ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto b = Session::create(*model, p);
  ASSERT_TRUE(b.has_value());
  // Missing file, garbage, and every truncation point of the real file: errors, an empty cache.
  EXPECT_EQ((*b)->load(path + ".none").code(), ErrorCode::kIo);
  auto write = [&](const std::string& s) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << s;
  };
  write("not a session at all");
  EXPECT_EQ((*b)->load(path).code(), ErrorCode::kBadFile);
  for (size_t cut : {size_t{4}, size_t{12}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    write(bytes);
    ASSERT_TRUE((*b)->load(path).is_ok());
    ASSERT_GT((*b)->context().n_past(), 0);
    write(bytes.substr(0, cut));
    Status s = (*b)->load(path);
    EXPECT_FALSE(s.is_ok()) << "cut at " << cut;
    EXPECT_EQ((*b)->context().n_past(), 0);
    EXPECT_EQ((*b)->context().kv().n_tokens(0, 0), 0);
  }
  write(bytes);
  EXPECT_TRUE((*b)->load(path).is_ok());
  // Other settings: refused with what differs.
  SessionParams q = params();
  q.ctx.kv_type_k = DType::F16;
  auto c = Session::create(*model, q);
  ASSERT_TRUE(c.has_value());
  Status s = (*c)->load(path);
  EXPECT_FALSE(s.is_ok());
  SessionParams r = params();
  r.ctx.attn = "streaming:sinks=4,window=64";
  auto d = Session::create(*model, r);
  ASSERT_TRUE(d.has_value());
  s = (*d)->load(path);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("streaming"), std::string::npos) << s.message();
  // A press whose statistics live outside the cache cannot be saved.
  SessionParams h = params();
  h.ctx.kv_press = "h2o:ratio=0.5";
  auto e = Session::create(*model, h);
  ASSERT_TRUE(e.has_value()) << e.error().message;
  Sampler se = greedy();
  ASSERT_TRUE((*e)->run(Prompt{story_tokens(*model), -1}, se, g, {}).has_value());
  EXPECT_EQ((*e)->save(path).code(), ErrorCode::kUnsupported);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace lc

namespace lc {
namespace {

// The server's flow: requests begun on several Sessions, their prompts prefilled a chunk at a
// time in turns, their answers sampled by Generations whose tokens are evaluated together
// (Context::decode_batch). Each answer equals what run() / continue_with() gives alone, also
// with stop strings, a press and logprobs.
TEST(SessionSteps, InterleavedPrefillAndBatchedGenerationEqualRun) {
  auto model = load();
  struct Req {
    int copies;
    std::string press;
    std::vector<std::string> stop;
    int64_t n_predict;
  };
  const std::vector<Req> reqs = {{1, "", {}, 40}, {3, "", {" mom"}, 60}, {2, "snapkv:ratio=0.5,window=8", {}, 30},
                                 {5, "", {}, 7}};
  std::vector<RequestStats> want;
  for (const Req& r : reqs) {
    SessionParams p = params();
    p.ctx.kv_press = r.press;
    auto s = Session::create(*model, p);
    ASSERT_TRUE(s.has_value()) << s.error().message;
    Sampler sm = greedy();
    GenerateOptions g;
    g.n_predict = r.n_predict;
    g.stop = r.stop;
    g.n_probs = 3;
    auto st = (*s)->run(Prompt{story_tokens(*model, r.copies)}, sm, g, nullptr);
    ASSERT_TRUE(st.has_value()) << st.error().message;
    want.push_back(*st);
  }
  std::vector<std::unique_ptr<Session>> ss;
  std::vector<Sampler> samplers;
  std::vector<RequestStats> got(reqs.size());
  std::vector<std::string> streamed(reqs.size());
  std::vector<std::unique_ptr<Generation>> gens(reqs.size());
  std::vector<bool> prefilled(reqs.size(), false);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SessionParams p = params();
    p.ctx.kv_press = reqs[i].press;
    auto s = Session::create(*model, p);
    ASSERT_TRUE(s.has_value());
    ss.push_back(std::move(*s));
    samplers.push_back(greedy());
    ASSERT_TRUE(ss[i]->begin_run(Prompt{story_tokens(*model, reqs[i].copies)}).is_ok());
  }
  for (int round = 0; round < 1000; ++round) {
    bool any = false;
    std::vector<Context*> ctxs;
    std::vector<int32_t> toks;
    std::vector<size_t> who;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (!prefilled[i]) {
        any = true;
        auto done = ss[i]->prefill_step();
        ASSERT_TRUE(done.has_value()) << done.error().message;
        if (*done) {
          prefilled[i] = true;
          got[i] = ss[i]->prefill_stats();
          GenerateOptions g;
          g.n_predict = reqs[i].n_predict;
          g.stop = reqs[i].stop;
          g.n_probs = 3;
          gens[i] = std::make_unique<Generation>(
              *ss[i], samplers[i], g,
              [&, i](int32_t, std::string_view t) {
                streamed[i] += t;
                return true;
              },
              got[i]);
        }
        continue;
      }
      if (gens[i]->ended()) continue;
      any = true;
      auto next = gens[i]->next();
      ASSERT_TRUE(next.has_value()) << next.error().message;
      if (!*next) {
        gens[i]->finish();
        continue;
      }
      ctxs.push_back(&ss[i]->context());
      toks.push_back(**next);
      who.push_back(i);
    }
    for (const Status& s : Context::decode_batch(ctxs, toks)) ASSERT_TRUE(s.is_ok()) << s.message();
    if (!any) break;
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(gens[i] && gens[i]->ended()) << i;
    EXPECT_EQ(got[i].generated, want[i].generated) << i;
    EXPECT_EQ(got[i].text, want[i].text) << i;
    EXPECT_EQ(streamed[i], want[i].text) << i;
    EXPECT_EQ(got[i].stop, want[i].stop) << i;
    EXPECT_EQ(got[i].n_prompt, want[i].n_prompt) << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << i;
    for (size_t k = 0; k < got[i].logprobs.size(); ++k) {
      EXPECT_EQ(got[i].logprobs[k].id, want[i].logprobs[k].id);
      EXPECT_NEAR(got[i].logprobs[k].logprob, want[i].logprobs[k].logprob, 1e-4);
      ASSERT_EQ(got[i].logprobs[k].top.size(), 3u);
    }
    EXPECT_EQ(ss[i]->history().size(), story_tokens(*model, reqs[i].copies).size() + got[i].generated.size()) << i;
  }
  EXPECT_EQ(want[1].stop, StopReason::kStopString) << want[1].text;
  EXPECT_EQ(want[3].stop, StopReason::kLength);
}

// Logprobs against their definition: log-softmax of the logits the token was sampled from,
// computed here in double precision; the greedy token is the top one.
TEST(SessionSteps, LogprobsAreTheLogSoftmaxOfTheLogits) {
  auto model = load();
  auto s = Session::create(*model, params());
  ASSERT_TRUE(s.has_value());
  const auto prompt = story_tokens(*model);
  ASSERT_TRUE((*s)->begin_run(Prompt{prompt}).is_ok());
  for (;;) {
    auto d = (*s)->prefill_step();
    ASSERT_TRUE(d.has_value());
    if (*d) break;
  }
  const int32_t nv = model->tokenizer().n_vocab();
  std::vector<float> logits((*s)->context().logits(0), (*s)->context().logits(0) + nv);
  RequestStats st;
  Sampler sm = greedy();
  GenerateOptions g;
  g.n_predict = 1;
  g.n_probs = 5;
  Generation gen(**s, sm, g, nullptr, st);
  auto n = gen.next();
  ASSERT_TRUE(n.has_value());
  EXPECT_FALSE(n->has_value());  // n_predict 1: no forward pass needed
  ASSERT_EQ(st.logprobs.size(), 1u);
  double mx = -INFINITY, sum = 0;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  const double lse = mx + std::log(sum);
  const TokenLogprob& tl = st.logprobs[0];
  EXPECT_NEAR(tl.logprob, logits[static_cast<size_t>(tl.id)] - lse, 1e-5);
  ASSERT_EQ(tl.top.size(), 5u);
  EXPECT_EQ(tl.top[0].first, tl.id);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_NEAR(tl.top[k].second, logits[static_cast<size_t>(tl.top[k].first)] - lse, 1e-5);
    if (k > 0) {
      EXPECT_GE(tl.top[k - 1].second, tl.top[k].second);
    }
  }
}

}  // namespace
}  // namespace lc
