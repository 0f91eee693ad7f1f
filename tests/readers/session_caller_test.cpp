// The engine's ModelCaller over a real Session and the shipped model: a reader's call is the
// request a Session would run on the rendered prompt itself.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "readers/document.h"
#include "readers/reader.h"
#include "readers/session_caller.h"
#include "runtime/session.h"
#include "tasks/tasks.h"

namespace lc::readers {
namespace {

const std::string kRoot = std::string(LONGCTX_TEST_DATA) + "/../../";

std::string render_text(const Template& t, const std::string& q, const std::string& chunk) {
  return render(t, {{"problem", q}, {"memory", "No previous memory"}, {"chunk", chunk}});
}

TEST(SessionCaller, ACallIsTheSessionRequestOfTheRenderedPrompt) {
  auto model = Model::load(kRoot + "models/longctx-2l.gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  std::string doc;
  for (int i = 0; i < 150; ++i) doc += "The river runs past the old mill under the hill. ";
  doc += "One of the special magic numbers for anxious-circle is: 4816203. ";
  for (int i = 0; i < 150; ++i) doc += "The grass is green and the sky is blue. ";
  const std::string path = (std::filesystem::temp_directory_path() / "lc_session_caller_doc.txt").string();
  std::ofstream(path, std::ios::binary) << doc;
  const std::string q = "What is the special magic number for anxious-circle mentioned in the provided text?";

  SessionParams sp;
  auto session = Session::create(**model, sp);
  ASSERT_TRUE(session.has_value()) << session.error().message;
  SamplerParams gp;
  gp.temp = 0;
  Sampler sampler(gp);
  SessionCaller caller(**session, sampler, ChatTemplate::kNone);
  EXPECT_EQ(caller.default_window(), (*model)->hparams().n_ctx_train);
  auto reader = make_reader("memagent:memory=32,answer=16");
  ASSERT_TRUE(reader.has_value());
  std::vector<CallRecord> log;
  ReadOptions opt;
  opt.log = [&](const CallRecord& r) { log.push_back(r); };
  auto r = read_document(**reader, caller, TemplateSource(), path, q, opt);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->stats.calls, r->stats.chunks + 1);
  ASSERT_EQ(static_cast<int64_t>(log.size()), r->stats.calls);
  int64_t prompt = 0, gen = 0;
  for (const auto& c : log) {
    prompt += c.cost.n_prompt;
    gen += c.cost.n_gen;
    EXPECT_LE(c.cost.n_gen, c.step == "memagent_final" ? 16 : 32);
  }
  EXPECT_EQ(prompt, r->stats.prompt_tokens);
  EXPECT_EQ(gen, r->stats.gen_tokens);

  // The oracle: the first step run directly on a fresh Session.
  auto t = TemplateSource().load("memagent_update", {"problem", "memory", "chunk"});
  ASSERT_TRUE(t.has_value());
  auto chunks = ChunkStream::open(path, (*model)->tokenizer(), (*reader)->chunk_tokens());
  ASSERT_TRUE(chunks.has_value());
  auto first = chunks->next();
  ASSERT_TRUE(first.has_value());
  tasks::PromptRenderer render((*model)->tokenizer(), ChatTemplate::kNone);
  Prompt p;
  p.tokens = render.tokens(render_text(*t, q, first->text), "");
  auto direct_session = Session::create(**model, sp);
  ASSERT_TRUE(direct_session.has_value());
  Sampler s2(gp);
  GenerateOptions g;
  g.n_predict = 32;
  auto direct = (*direct_session)->run(p, s2, g, nullptr);
  ASSERT_TRUE(direct.has_value()) << direct.error().message;
  EXPECT_EQ(log[0].reply, direct->text);
  EXPECT_EQ(log[0].cost.n_prompt, static_cast<int64_t>(p.tokens.size()));

  // Reusing the prompt prefix the calls share gives the replies fresh requests give, with
  // fewer tokens prefilled.
  auto fresh_session = Session::create(**model, sp);
  ASSERT_TRUE(fresh_session.has_value());
  Sampler s3(gp);
  SessionCaller fresh(**fresh_session, s3, ChatTemplate::kNone, /*reuse_prefix=*/false);
  std::vector<CallRecord> log2;
  ReadOptions opt2;
  opt2.log = [&](const CallRecord& r) { log2.push_back(r); };
  auto reader2 = make_reader("memagent:memory=32,answer=16");
  auto r2 = read_document(**reader2, fresh, TemplateSource(), path, q, opt2);
  ASSERT_TRUE(r2.has_value()) << r2.error().message;
  ASSERT_EQ(log2.size(), log.size());
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i].reply, log2[i].reply) << "call " << i;
    if (i > 0) EXPECT_LT(log[i].cost.n_prompt, log2[i].cost.n_prompt) << "call " << i;
  }
  EXPECT_EQ(r->answer, r2->answer);
  std::filesystem::remove(path);
}

// mapreduce's chunks answered together (SessionCaller::call_batch: contexts of their own, the
// replies generated as rows of one batch) give, call by call, the replies of one call after
// another, and the same answer: batch=4 over a document whose last group is smaller.
TEST(SessionCaller, BatchedCallsEqualCallsOneAfterAnother) {
  auto model = Model::load(kRoot + "models/longctx-2l-reader.gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  std::string doc;
  for (int i = 0; i < 90; ++i) doc += "The river runs past the old mill under the hill. ";
  doc += "One of the special magic numbers for anxious-circle is: 4816203. ";
  for (int i = 0; i < 90; ++i) doc += "The grass is green and the sky is blue. ";
  const std::string path = (std::filesystem::temp_directory_path() / "lc_session_caller_batch.txt").string();
  std::ofstream(path, std::ios::binary) << doc;
  const std::string q = "What is the special magic number for anxious-circle mentioned in the provided text?";
  struct Run {
    std::vector<CallRecord> log;
    ReadResult r;
  };
  auto read = [&](const std::string& spec) {
    Run run;
    SessionParams sp;
    sp.ctx.n_threads = 1;
    auto session = Session::create(**model, sp);
    EXPECT_TRUE(session.has_value());
    SamplerParams gp;
    gp.temp = 0;
    Sampler sampler(gp);
    SessionCaller caller(**session, sampler, ChatTemplate::kNone);
    auto reader = make_reader(spec);
    EXPECT_TRUE(reader.has_value());
    ReadOptions opt;
    opt.log = [&](const CallRecord& c) { run.log.push_back(c); };
    auto r = read_document(**reader, caller, TemplateSource(), path, q, opt);
    EXPECT_TRUE(r.has_value()) << r.error().message;
    if (r) run.r = *r;
    return run;
  };
  const Run one = read("mapreduce:chunk=140,batch=1");
  const Run four = read("mapreduce:chunk=140,batch=4");
  ASSERT_NE(one.r.stats.chunks % 4, 0) << one.r.stats.chunks << " chunks: no smaller group at the end";
  ASSERT_EQ(four.log.size(), one.log.size());
  for (size_t i = 0; i < one.log.size(); ++i) {
    EXPECT_EQ(four.log[i].chunk, one.log[i].chunk) << "call " << i;
    EXPECT_EQ(four.log[i].reply, one.log[i].reply) << "call " << i;
    EXPECT_EQ(four.log[i].cost.n_gen, one.log[i].cost.n_gen) << "call " << i;
  }
  EXPECT_EQ(four.r.answer, one.r.answer);
  EXPECT_EQ(four.r.partials, one.r.partials);
  EXPECT_EQ(four.r.stats.candidates, one.r.stats.candidates);
  EXPECT_GT(one.r.stats.candidates, 0) << "no chunk answered: the comparison says little";
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace lc::readers
