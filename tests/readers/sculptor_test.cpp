// Sculptor's tools and protocol on a scripted conversation (a real tokenizer, the shipped
// model's), and its working memory over a real Session.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>

#include "model/model.h"
#include "readers/document.h"
#include "readers/reader.h"
#include "readers/session_caller.h"
#include "runtime/session.h"
#include "support.h"

namespace lc::readers {
namespace {

using namespace test;

const std::string kQuestion = "What is the special magic number for anxious-circle mentioned in the provided text?";
const std::string kNeedle = "One of the special magic numbers for anxious-circle is: 4816203.";

std::string filler(int sentences, uint64_t seed) { return make_doc(sentences, {}, seed); }

// The conversation as text; hidden messages leave the visible transcript.
class ScriptedConversation final : public Conversation {
 public:
  using Fn = std::function<std::string(const std::string& visible, int64_t turn)>;
  ScriptedConversation(Fn fn, bool chat) : fn_(std::move(fn)), chat_(chat) {}
  Expected<int64_t> add(const std::string& role, const std::string& content, CallCost& cost) override {
    msgs.push_back({role, content, false});
    cost.n_prompt = count(content);
    return static_cast<int64_t>(msgs.size()) - 1;
  }
  Expected<std::pair<int64_t, std::string>> reply(int64_t, const std::vector<std::string>& stop,
                                                  CallCost& cost) override {
    std::string r = fn_(visible(), turns++);
    for (const auto& s : stop)  // a scripted reply ends at its stop string, which it keeps
      if (const size_t at = r.find(s); at != std::string::npos) r = r.substr(0, at + s.size());
    msgs.push_back({"assistant", r, false});
    cost.n_gen = count(r);
    return std::pair<int64_t, std::string>{static_cast<int64_t>(msgs.size()) - 1, r};
  }
  Status hide(int64_t m) override {
    if (m < 0 || m >= static_cast<int64_t>(msgs.size()) || msgs[static_cast<size_t>(m)].hidden)
      return make_error("bad hide");
    msgs[static_cast<size_t>(m)].hidden = true;
    return ok_status();
  }
  Status restore(int64_t m) override {
    if (m < 0 || m >= static_cast<int64_t>(msgs.size()) || !msgs[static_cast<size_t>(m)].hidden)
      return make_error("bad restore");
    msgs[static_cast<size_t>(m)].hidden = false;
    return ok_status();
  }
  bool hidden(int64_t m) const override { return msgs[static_cast<size_t>(m)].hidden; }
  int64_t tokens_held() const override { return count(visible()); }
  int64_t message_tokens(int64_t m) const override { return count(msgs[static_cast<size_t>(m)].content); }
  bool chat() const override { return chat_; }

  std::string visible() const {
    std::string s;
    for (const auto& m : msgs)
      if (!m.hidden) s += m.content;
    return s;
  }
  static int64_t count(const std::string& s) {
    return static_cast<int64_t>(shipped().tokenizer().encode(s, false, false).size());
  }

  struct Msg {
    std::string role, content;
    bool hidden;
  };
  std::vector<Msg> msgs;
  int64_t turns = 0;

 private:
  Fn fn_;
  bool chat_;
};

// Forwards to a conversation the caller keeps, so the test reads it after the reader is done.
class Proxy final : public Conversation {
 public:
  explicit Proxy(Conversation& c) : c_(c) {}
  Expected<int64_t> add(const std::string& r, const std::string& t, CallCost& c) override { return c_.add(r, t, c); }
  Expected<std::pair<int64_t, std::string>> reply(int64_t n, const std::vector<std::string>& s, CallCost& c) override {
    return c_.reply(n, s, c);
  }
  Status hide(int64_t m) override { return c_.hide(m); }
  Status restore(int64_t m) override { return c_.restore(m); }
  bool hidden(int64_t m) const override { return c_.hidden(m); }
  int64_t tokens_held() const override { return c_.tokens_held(); }
  int64_t message_tokens(int64_t m) const override { return c_.message_tokens(m); }
  bool chat() const override { return c_.chat(); }

 private:
  Conversation& c_;
};

class ScriptedCaller final : public ModelCaller {
 public:
  ScriptedCaller(ScriptedConversation::Fn fn, bool chat) : fn_(std::move(fn)), chat_(chat) {}
  Expected<std::string> call(const std::string& user, const std::string&, int64_t, const std::vector<std::string>&,
                             CallCost&) override {
    side_calls.push_back(user);
    return std::string("a short summary");
  }
  int64_t prompt_tokens(const std::string& user, const std::string& prefix) const override {
    return static_cast<int64_t>(tokenizer().encode(user + prefix, true, false).size());
  }
  const Tokenizer& tokenizer() const override { return shipped().tokenizer(); }
  int64_t default_window() const override { return window; }
  Expected<std::unique_ptr<Conversation>> converse() override {
    kept_.push_back(std::make_unique<ScriptedConversation>(fn_, chat_));
    last = kept_.back().get();
    return std::unique_ptr<Conversation>(std::make_unique<Proxy>(*last));
  }
  ScriptedConversation* last = nullptr;
  std::vector<std::unique_ptr<ScriptedConversation>> kept_;
  std::vector<std::string> side_calls;
  int64_t window = 1024;

 private:
  ScriptedConversation::Fn fn_;
  bool chat_;
};

// The fragment (of `tokens` tokens each) that holds byte `at` of `path`, found by streaming the
// chunks independently of the reader.
int64_t fragment_at(const std::string& path, int64_t tokens, int64_t at) {
  auto s = ChunkStream::open(path, shipped().tokenizer(), tokens);
  int64_t bytes = 0;
  for (;;) {
    auto c = s->next();
    if (!c || c->n_tokens == 0) return -1;
    bytes += static_cast<int64_t>(c->text.size());
    if (at < bytes) return c->index;
  }
}

std::string last_result(const std::string& visible) {
  const size_t at = visible.rfind("Result: ");
  return at == std::string::npos ? "" : visible.substr(at);
}

TEST(Sculptor, TextProtocolSearchesThenAnswersFromTheSpan) {
  const std::string doc = filler(300, 1) + kNeedle + " " + filler(300, 2);
  const std::string path = write_temp("text.txt", doc);
  ScriptedCaller model(
      [](const std::string& visible, int64_t turn) -> std::string {
        if (turn == 0) return "search anxious-circle\nignored second line";
        std::smatch m;
        const std::string r = last_result(visible);
        if (std::regex_search(r, m, std::regex("anxious-circle is: ([0-9]+)"))) return "\\boxed{" + std::string(m[1]) + "}";
        return "\\boxed{none}";
      },
      false);
  auto reader = make_reader("sculptor:fragment=256");
  ASSERT_TRUE(reader.has_value()) << reader.error().message;
  std::vector<CallRecord> log;
  ReadOptions opt;
  opt.log = [&](const CallRecord& r) { log.push_back(r); };
  auto r = read_document(**reader, model, TemplateSource(), path, kQuestion, opt);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->answer, "4816203");
  EXPECT_EQ(r->stats.calls, 2);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].step, "sculptor_turn");
  EXPECT_EQ(log[0].reply, "search anxious-circle\n");  // the reply ends at its newline
  EXPECT_EQ(log[1].step, "tool:search");
  const int64_t at = static_cast<int64_t>(doc.find("anxious-circle"));
  const std::string want = "1 match for 'anxious-circle'\n[fragment " +
                           std::to_string(fragment_at(path, 256, at)) + "] ..." + doc.substr(at - 120, 120 + 14 + 120) +
                           "...";
  EXPECT_EQ(log[1].reply, want);
  // The transcript: the instructions with the problem and the fragment count, the call, the
  // result on a line of its own, the answer.
  const std::string& v = model.last->visible();
  EXPECT_NE(v.find("It is cut into " + std::to_string(r->stats.chunks) + " fragments of about 256 tokens"),
            std::string::npos);
  EXPECT_NE(v.find("Problem: " + kQuestion + "\nsearch anxious-circle\nResult: " + want + "\n\\boxed{4816203}"),
            std::string::npos)
      << v;
  std::filesystem::remove(path);
}

TEST(Sculptor, JsonProtocolReadHideRestoreAndSummarize) {
  const std::string doc = filler(200, 3) + kNeedle + " " + filler(200, 4);
  const std::string path = write_temp("json.txt", doc);
  const int64_t f = fragment_at(path, 200, static_cast<int64_t>(doc.find(kNeedle)));
  const auto call = [](const std::string& name, const std::string& args) {
    return "<tool_call>{\"name\": \"" + name + "\", \"arguments\": " + args + "}</tool_call> trailing text";
  };
  std::vector<std::string> seen;  // the visible transcript at each turn
  ScriptedCaller model(
      [&](const std::string& visible, int64_t turn) -> std::string {
        seen.push_back(visible);
        const std::string frag = "{\"fragment\": " + std::to_string(f) + "}";
        switch (turn) {
          case 0: return call("read", frag);
          case 1: return call("hide", frag);
          case 2: return call("summarize", frag);
          case 3: return call("restore", frag);
          default: return "The answer is \\boxed{4816203}.";
        }
      },
      true);
  auto reader = make_reader("sculptor:fragment=200,protocol=auto");
  ASSERT_TRUE(reader.has_value());
  auto r = read_document(**reader, model, TemplateSource(), path, kQuestion, {});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->answer, "4816203");
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0].find(kNeedle), std::string::npos);
  EXPECT_NE(seen[1].find("<tool_response>\n[fragment " + std::to_string(f) + "] "), std::string::npos);
  EXPECT_NE(seen[1].find(kNeedle), std::string::npos);  // read shows the fragment
  EXPECT_EQ(seen[2].find(kNeedle), std::string::npos);  // hidden
  EXPECT_NE(seen[2].find("fragment " + std::to_string(f) + " hidden"), std::string::npos);
  EXPECT_NE(seen[3].find("[summary of fragment " + std::to_string(f) + "] a short summary"), std::string::npos);
  ASSERT_EQ(model.side_calls.size(), 1u);
  EXPECT_NE(model.side_calls[0].find(kNeedle), std::string::npos);  // the summary call read the fragment
  EXPECT_NE(seen[4].find(kNeedle), std::string::npos);  // restored
  EXPECT_EQ(r->stats.calls, 6);  // five turns and the summary
  std::filesystem::remove(path);
}

TEST(Sculptor, SearchFindsMatchesAcrossBlocksOnceAndRegex) {
  // Over 2 MiB, with matches around the 1 MiB block boundary.
  std::string doc = filler(45000, 5);
  ASSERT_GT(doc.size(), size_t{2} << 20);
  const size_t boundary = size_t{1} << 20;
  doc.replace(boundary - 7, 14, "anxious-circle");          // straddles the boundary
  doc.replace(boundary + 5000, 14, "anxious-circle");       // after it
  doc.replace(1000, 20, "code 12345 and 67890");            // for the regex
  const std::string path = write_temp("big.txt", doc);
  ScriptedCaller model(
      [](const std::string&, int64_t turn) -> std::string {
        if (turn == 0) return "search anxious-circle";
        return "\\boxed{x}";
      },
      false);
  std::vector<CallRecord> log;
  ReadOptions opt;
  opt.log = [&](const CallRecord& r) { log.push_back(r); };
  auto reader = make_reader("sculptor:fragment=4096,around=10,matches=5");
  ASSERT_TRUE(read_document(**reader, model, TemplateSource(), path, kQuestion, opt).has_value());
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log[1].reply.substr(0, 30), "2 matches for 'anxious-circle'") << log[1].reply;
  EXPECT_NE(log[1].reply.find("..." + doc.substr(boundary - 17, 34) + "..."), std::string::npos) << log[1].reply;

  ScriptedCaller rx(
      [](const std::string&, int64_t turn) -> std::string {
        if (turn == 0) return R"(<tool_call>{"name": "search", "arguments": {"query": "[0-9]{5}", "regex": true}}</tool_call>)";
        if (turn == 1) return R"(<tool_call>{"name": "search", "arguments": {"query": "([0-9", "regex": true}}</tool_call>)";
        return "\\boxed{x}";
      },
      true);
  log.clear();
  auto reader2 = make_reader("sculptor:fragment=4096,around=0");
  ASSERT_TRUE(read_document(**reader2, rx, TemplateSource(), path, kQuestion, opt).has_value());
  ASSERT_GE(log.size(), 4u);
  EXPECT_EQ(log[1].reply, "2 matches for '[0-9]{5}'\n[fragment 0] ...12345...\n[fragment 0] ...67890...");
  EXPECT_EQ(log[3].reply.substr(0, 31), "error: bad regular expression '") << log[3].reply;
  std::filesystem::remove(path);
}

TEST(Sculptor, TheModelsMistakesAreBoundedAndNamed) {
  const std::string path = write_temp("err.txt", filler(100, 6));
  struct Case {
    std::function<std::string(int64_t)> reply;
    std::string spec, want;
  };
  const Case cases[] = {
      {[](int64_t) { return std::string("<tool_call>{not json</tool_call>"); }, "sculptor:retries=2",
       "failed 3 times in a row; the last: error: a tool call is JSON"},
      {[](int64_t) { return std::string("<tool_call>{\"name\": \"delete\"}</tool_call>"); }, "sculptor:retries=0",
       "unknown tool 'delete'"},
      {[](int64_t) { return std::string("<tool_call>{\"name\": \"read\", \"arguments\": {\"fragment\": 999}}</tool_call>"); },
       "sculptor:retries=1", "no fragment 999 (there are"},
      {[](int64_t t) {
         return t % 2 ? std::string("<tool_call>{\"name\": \"hide\", \"arguments\": {\"fragment\": 0}}</tool_call>")
                      : std::string("<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"zzz\"}}</tool_call>");
       },
       "sculptor:turns=4,retries=9", "no answer after 4 turns"},
      {[](int64_t) { return std::string("<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"the\"}}</tool_call>"); },
       "sculptor:calls=3,turns=10", "cap of 3 model calls"},
  };
  for (const auto& c : cases) {
    ScriptedCaller model([&](const std::string&, int64_t t) { return c.reply(t); }, true);
    auto reader = make_reader(c.spec);
    ASSERT_TRUE(reader.has_value()) << c.spec;
    auto r = read_document(**reader, model, TemplateSource(), path, kQuestion, {});
    ASSERT_FALSE(r.has_value()) << c.spec;
    EXPECT_NE(r.error().message.find(c.want), std::string::npos) << c.spec << ": " << r.error().message;
    EXPECT_LE(model.last->turns, 10) << c.spec;
  }
  std::filesystem::remove(path);
}

TEST(Sculptor, OldFragmentsAreHiddenToKeepTheWindow) {
  const std::string path = write_temp("window.txt", filler(400, 7));
  ScriptedCaller model(
      [](const std::string&, int64_t turn) -> std::string {
        if (turn < 4) return "read " + std::to_string(turn);
        return "\\boxed{done}";
      },
      false);
  model.window = 700;
  std::vector<CallRecord> log;
  ReadOptions opt;
  opt.log = [&](const CallRecord& r) { log.push_back(r); };
  auto reader = make_reader("sculptor:fragment=200");
  auto r = read_document(**reader, model, TemplateSource(), path, kQuestion, opt);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  int hides = 0;
  for (const auto& c : log) hides += c.step == "auto-hide";
  EXPECT_GE(hides, 2);
  // The working memory stayed inside the window.
  EXPECT_LE(model.last->tokens_held(), 700);
  std::filesystem::remove(path);
}

// Over a real Session: each message is one range of the cache, hide takes it out and restore
// puts it back; the cache holds the rendered conversation.
TEST(SessionConversation, MessagesHideAndRestoreInTheCache) {
  const Model& m = shipped();
  auto session = Session::create(m, SessionParams{});
  ASSERT_TRUE(session.has_value());
  SamplerParams gp;
  gp.temp = 0;
  Sampler sampler(gp);
  SessionCaller caller(**session, sampler, ChatTemplate::kNone);
  auto conv = caller.converse();
  ASSERT_TRUE(conv.has_value()) << conv.error().message;
  CallCost cost;
  const std::string intro = "Problem: where is the key?\n";
  auto a = (*conv)->add("user", intro, cost);
  ASSERT_TRUE(a.has_value()) << a.error().message;
  auto rep = (*conv)->reply(6, {"\n"}, cost);
  ASSERT_TRUE(rep.has_value()) << rep.error().message;
  const std::string result = "\nResult: " + kNeedle + "\n";
  auto b = (*conv)->add("user", result, cost);
  ASSERT_TRUE(b.has_value());
  // The cache holds the messages tokenised one after another.
  const Tokenizer& tok = m.tokenizer();
  std::vector<int32_t> want = tok.encode(intro, true, false);
  for (const std::string& t : {rep->second, result}) {
    const auto ids = tok.encode(t, false, false);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  Context& ctx = (*session)->context();
  (void)ctx;
  auto held = [&] { return (*conv)->tokens_held(); };
  EXPECT_EQ(held(), static_cast<int64_t>(want.size()));
  const int64_t n_result = (*conv)->message_tokens(*b);
  EXPECT_EQ(n_result, static_cast<int64_t>(tok.encode(result, false, false).size()));
  ASSERT_TRUE((*conv)->hide(*b).is_ok());
  EXPECT_TRUE((*conv)->hidden(*b));
  EXPECT_EQ(held(), static_cast<int64_t>(want.size()) - n_result);
  EXPECT_FALSE((*conv)->hide(*b).is_ok());  // twice
  // A plain-text conversation replies after a message (the logits of its last token): right
  // after a hide there is none, which is an error, not a reply on stale logits.
  EXPECT_FALSE((*conv)->reply(3, {"\n"}, cost).has_value());
  // A message and a reply after the hide go after the hidden range; then the range comes back
  // in order.
  const std::string note = "Result: hidden\n";
  ASSERT_TRUE((*conv)->add("user", note, cost).has_value());
  auto rep2 = (*conv)->reply(3, {"\n"}, cost);
  ASSERT_TRUE(rep2.has_value()) << rep2.error().message;
  const auto idsn = tok.encode(note, false, false);
  want.insert(want.end(), idsn.begin(), idsn.end());
  ASSERT_TRUE((*conv)->restore(*b).is_ok());
  EXPECT_FALSE((*conv)->restore(*b).is_ok());
  const auto ids2 = tok.encode(rep2->second, false, false);
  want.insert(want.end(), ids2.begin(), ids2.end());
  EXPECT_EQ(held(), static_cast<int64_t>(want.size()));
  EXPECT_FALSE((*conv)->hide(99).is_ok());
}

}  // namespace
}  // namespace lc::readers
