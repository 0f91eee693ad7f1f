// The readers' control flow on scripted model replies (a real tokenizer, the shipped model's),
// their templates, the document stream, checkpoints and bad input.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include "model/model.h"
#include "readers/document.h"
#include "readers/reader.h"
#include "readers/templates.h"
#include "support.h"

namespace lc::readers {
namespace {

using namespace test;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A model whose replies a function computes from the user message; records every call.
class ScriptedCaller final : public ModelCaller {
 public:
  using Fn = std::function<Expected<std::string>(const std::string& user, int64_t call_index)>;
  explicit ScriptedCaller(Fn fn, int64_t window = 1024) : fn_(std::move(fn)), window_(window) {}
  Expected<std::string> call(const std::string& user, const std::string& prefix, int64_t max_tokens,
                             const std::vector<std::string>&, CallCost& cost) override {
    users.push_back(user);
    caps.push_back(max_tokens);
    cost.n_prompt = prompt_tokens(user, prefix);
    auto r = fn_(user, static_cast<int64_t>(users.size()) - 1);
    if (r) cost.n_gen = static_cast<int64_t>(tokenizer().encode(*r, false, false).size());
    return r;
  }
  int64_t prompt_tokens(const std::string& user, const std::string& prefix) const override {
    return static_cast<int64_t>(tokenizer().encode(user + prefix, true, false).size());
  }
  const Tokenizer& tokenizer() const override { return shipped().tokenizer(); }
  int64_t default_window() const override { return window_; }

  std::vector<std::string> users;
  std::vector<int64_t> caps;

 private:
  Fn fn_;
  int64_t window_;
};

// The text between <tag> and </tag> in a rendered prompt.
std::string between(const std::string& s, const std::string& tag) {
  const size_t a = s.find("<" + tag + ">\n");
  const size_t b = s.find("\n</" + tag + ">");
  if (a == std::string::npos || b == std::string::npos) return "<missing " + tag + ">";
  return s.substr(a + tag.size() + 3, b - a - tag.size() - 3);
}

const std::string kQuestion = "What is the special magic number for anxious-circle mentioned in the provided text?";
const std::string kNeedle = "One of the special magic numbers for anxious-circle is: 4816203.";
const std::string kOther = "One of the special magic numbers for quiet-lake is: 1112223.";

// An ideal MemAgent: copies the queried needle into the memory, keeps the memory otherwise,
// answers from the memory.
Expected<std::string> ideal_memagent(const std::string& user, int64_t) {
  const std::regex needle("One of the special magic numbers for anxious-circle is: ([0-9]+)\\.");
  std::smatch m;
  if (user.find("<section>") != std::string::npos) {
    const std::string section = between(user, "section");
    if (std::regex_search(section, m, needle)) return std::string(m[0]);
    return between(user, "memory");
  }
  const std::string memory = between(user, "memory");
  if (std::regex_search(memory, m, needle)) return "The answer is \\boxed{" + std::string(m[1]) + "}.";
  return std::string("\\boxed{unknown}");
}

// An ideal Smooth Reading model: a note is the needle sentences of its section (or "none"); the
// answer is the queried value found in the notes.
Expected<std::string> ideal_smooth(const std::string& user, int64_t) {
  const std::regex any("One of the special magic numbers for [a-z-]+ is: [0-9]+\\.");
  if (user.find("<section>") != std::string::npos) {
    const std::string section = between(user, "section");
    std::string note;
    for (std::sregex_iterator it(section.begin(), section.end(), any), end; it != end; ++it)
      note += (note.empty() ? "" : " ") + it->str();
    return note.empty() ? std::string("None.") : note;
  }
  const std::regex needle("anxious-circle is: ([0-9]+)\\.");
  std::smatch m;
  const std::string notes = between(user, "notes");
  if (std::regex_search(notes, m, needle)) return "\\boxed{" + std::string(m[1]) + "}";
  return std::string("\\boxed{unknown}");
}

TEST(ReaderTemplates, RenderExactlyAsTheFileSays) {
  // The oracle: the file's text without its "#!" lines, placeholders replaced by plain string
  // replacement, "{{" / "}}" as braces.
  for (const std::string name : {"memagent_update", "memagent_final", "mapreduce_map", "mapreduce_reduce",
                                 "smooth_read", "smooth_final"}) {
    std::string raw = slurp(kRoot + "data/readers/" + name + ".txt");
    ASSERT_FALSE(raw.empty()) << name;
    std::string body;
    std::istringstream in(raw);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("#!", 0) != 0) body += line + "\n";
    if (raw.back() != '\n') body.pop_back();
    const std::map<std::string, std::string> values = {{"problem", "Q {chunk} Q"}, {"memory", "M"},
                                                       {"chunk", "C\nC"},          {"answers", "1. x"},
                                                       {"summary", "S"}};
    std::vector<std::string> used;
    std::string want = body;
    for (const auto& [k, v] : values) {
      const std::string ph = "{" + k + "}";
      if (want.find(ph) == std::string::npos) continue;
      used.push_back(k);
      for (size_t at; (at = want.find(ph)) != std::string::npos;) want.replace(at, ph.size(), "\x01" + k + "\x02");
    }
    for (size_t at; (at = want.find("{{")) != std::string::npos;) want.replace(at, 2, "{");
    for (size_t at; (at = want.find("}}")) != std::string::npos;) want.replace(at, 2, "}");
    for (const auto& [k, v] : values)
      for (size_t at; (at = want.find("\x01" + k + "\x02")) != std::string::npos;) want.replace(at, k.size() + 2, v);
    auto t = TemplateSource().load(name, used);
    ASSERT_TRUE(t.has_value()) << t.error().message;
    EXPECT_EQ(render(*t, values), want) << name;
    // The compiled-in copy is the file.
    EXPECT_EQ(builtin_templates().at(name), raw) << name;
  }
}

// MemAgent's reference wording, shipped for --reader-prompts, loads and reads.
TEST(ReaderTemplates, MemAgentPaperWording) {
  const TemplateSource paper(kRoot + "data/readers/memagent-paper");
  auto u = paper.load("memagent_update", {"problem", "memory", "chunk"});
  ASSERT_TRUE(u.has_value()) << u.error().message;
  EXPECT_EQ(render(*u, {{"problem", "Q"}, {"memory", "M"}, {"chunk", "C"}}).substr(0, 60),
            "You are presented with a problem, a section of an article th");
  EXPECT_NE(render(*u, {{"problem", "Q"}, {"memory", "M"}, {"chunk", "C"}})
                .find("<problem> \nQ\n</problem>\n\n<memory>\nM\n</memory>\n\n<section>\nC\n</section>\n\nUpdated memory:\n"),
            std::string::npos);
  const std::string doc = write_temp("paper.txt", make_doc(100, {{50, kNeedle}}));
  ScriptedCaller model(ideal_memagent);
  auto reader = make_reader("memagent:chunk=300,memory=64");
  auto r = read_document(**reader, model, paper, doc, kQuestion, {});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->answer, "4816203");
  std::filesystem::remove(doc);
}

TEST(ReaderTemplates, DirectivesAndErrors) {
  auto t = parse_template("x", "#! a comment\n#! prefix: The answer is\n#! stop: \\n\\n\nA {a} {{b}} {a}.", {"a"});
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ(t->prefix, "The answer is");
  ASSERT_EQ(t->stop.size(), 1u);
  EXPECT_EQ(t->stop[0], "\n\n");
  EXPECT_EQ(render(*t, {{"a", "1"}}), "A 1 {b} 1.");
  auto unknown = parse_template("x", "A {b}", {"a"});
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.error().message.find("unknown placeholder {b}"), std::string::npos) << unknown.error().message;
  auto missing = parse_template("x", "A only", {"a"});
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("missing placeholder {a}"), std::string::npos);
  EXPECT_FALSE(parse_template("x", "A { a}", {"a"}).has_value());
  EXPECT_FALSE(parse_template("x", "A {a} }", {"a"}).has_value());
  EXPECT_FALSE(parse_template("x", "A {a", {"a"}).has_value());
}

TEST(ReaderDocument, ChunksPutTogetherGiveTheDocumentBack) {
  const std::string doc = make_doc(300, {{100, kNeedle}}) + "\nlast line without a trailing space";
  const std::string path = write_temp("doc.txt", doc);
  const Tokenizer& tok = shipped().tokenizer();
  const auto whole = tok.encode(doc, false, false);
  for (int64_t block : {64, 1000, 1 << 20}) {
    auto s = ChunkStream::open(path, tok, 100, block);
    ASSERT_TRUE(s.has_value()) << s.error().message;
    std::string back;
    int64_t n = 0, chunks = 0;
    for (;;) {
      auto c = s->next();
      ASSERT_TRUE(c.has_value());
      if (c->n_tokens == 0) break;
      EXPECT_EQ(c->index, chunks);
      ++chunks;
      back += c->text;
      n += c->n_tokens;
    }
    EXPECT_EQ(back, doc) << "block " << block;
    // Cut before whitespace, the blocks tokenise as the whole document does.
    EXPECT_EQ(n, static_cast<int64_t>(whole.size())) << "block " << block;
    EXPECT_EQ(chunks, (n + 99) / 100);
    EXPECT_EQ(s->bytes_read(), static_cast<int64_t>(doc.size()));
  }
  std::filesystem::remove(path);
}

TEST(ReaderDocument, BadFilesAreClearErrors) {
  const Tokenizer& tok = shipped().tokenizer();
  const std::string empty = write_temp("empty.txt", "");
  auto e = ChunkStream::open(empty, tok, 100);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("the document is empty"), std::string::npos);
  auto m = ChunkStream::open(temp_path("no-such-file"), tok, 100);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message.find("cannot open"), std::string::npos);
  auto d = ChunkStream::open(std::filesystem::temp_directory_path().string(), tok, 100);
  ASSERT_FALSE(d.has_value());
  EXPECT_NE(d.error().message.find("directory"), std::string::npos);
  std::filesystem::remove(empty);
}

TEST(MemAgent, ScriptedReadCarriesTheMemoryAndAnswersFromIt) {
  const std::string doc = make_doc(400, {{220, kNeedle}, {60, kOther}});
  const std::string path = write_temp("mem.txt", doc);
  ScriptedCaller model(ideal_memagent);
  auto reader = make_reader("memagent:chunk=300,memory=64");
  ASSERT_TRUE(reader.has_value()) << reader.error().message;
  std::vector<CallRecord> log;
  ReadOptions opt;
  opt.log = [&](const CallRecord& r) { log.push_back(r); };
  auto r = read_document(**reader, model, TemplateSource(), path, kQuestion, opt);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->answer, "4816203");
  const int64_t n_tok = static_cast<int64_t>(model.tokenizer().encode(doc, false, false).size());
  const int64_t chunks = (n_tok + 299) / 300;
  EXPECT_EQ(r->stats.chunks, chunks);
  EXPECT_EQ(r->stats.doc_tokens, n_tok);
  EXPECT_EQ(r->stats.calls, chunks + 1);
  ASSERT_EQ(static_cast<int64_t>(model.users.size()), chunks + 1);
  ASSERT_EQ(static_cast<int64_t>(log.size()), chunks + 1);
  // Step k's memory is step k-1's reply; the first is MemAgent's "No previous memory".
  bool seen = false;
  for (int64_t k = 0; k < chunks; ++k) {
    const std::string& u = model.users[static_cast<size_t>(k)];
    EXPECT_EQ(between(u, "problem"), kQuestion);
    EXPECT_EQ(between(u, "memory"), k == 0 ? "No previous memory" : log[static_cast<size_t>(k - 1)].reply);
    EXPECT_EQ(log[static_cast<size_t>(k)].chunk, k);
    EXPECT_EQ(model.caps[static_cast<size_t>(k)], 64);  // the memory's cap
    seen = seen || between(u, "section").find(kNeedle) != std::string::npos;
  }
  EXPECT_TRUE(seen);
  EXPECT_EQ(between(model.users.back(), "memory"), kNeedle);
  EXPECT_EQ(model.users.back().find("<section>"), std::string::npos);
  EXPECT_EQ(log.back().step, "memagent_final");
  EXPECT_EQ(r->stats.candidates, 0);
  std::filesystem::remove(path);
}

TEST(MemAgent, DefaultsFollowThePaperProportionsAndShrinkToFit) {
  const std::string path = write_temp("fit.txt", make_doc(50, {}));
  ScriptedCaller big(ideal_memagent, 8192);
  auto r8k = make_reader("memagent");
  ASSERT_TRUE(read_document(**r8k, big, TemplateSource(), path, kQuestion, {}).has_value());
  EXPECT_EQ((*r8k)->chunk_tokens(), 5000);
  EXPECT_NE((*r8k)->spec().find("memory=1024,window=8192"), std::string::npos) << (*r8k)->spec();
  // A 1K window: memory 128; the chunk shrinks from 625 to what the template leaves.
  ScriptedCaller small(ideal_memagent, 1024);
  auto r1k = make_reader("memagent");
  ASSERT_TRUE(read_document(**r1k, small, TemplateSource(), path, kQuestion, {}).has_value());
  const std::string update = between(small.users[0], "section");
  EXPECT_NE((*r1k)->spec().find("memory=128,window=1024"), std::string::npos) << (*r1k)->spec();
  const int64_t base = small.prompt_tokens(small.users[0], "") -
                       static_cast<int64_t>(small.tokenizer().encode(update, false, false).size()) -
                       static_cast<int64_t>(small.tokenizer().encode("No previous memory", false, false).size());
  EXPECT_LE((*r1k)->chunk_tokens() + base + 2 * 128, 1024 + 4);  // +4: tokens merging across the joins
  EXPECT_GT((*r1k)->chunk_tokens(), 400);
  std::filesystem::remove(path);
}

TEST(Smooth, NotesAccumulateAndTheOldestGoPastTheCap) {
  // Needles in three different chunks: two other keys first, the queried one last.
  const std::string n1 = "One of the special magic numbers for red-fox is: 1000001.";
  const std::string n2 = "One of the special magic numbers for blue-owl is: 2000002.";
  const std::string doc = make_doc(300, {{20, n1}, {120, n2}, {220, kNeedle}});
  const std::string path = write_temp("smooth.txt", doc);
  for (const int64_t cap : {500, 40}) {
    ScriptedCaller model(ideal_smooth);
    auto reader = make_reader("smooth:chunk=150,entry=40,summary=" + std::to_string(cap));
    ASSERT_TRUE(reader.has_value()) << reader.error().message;
    auto r = read_document(**reader, model, TemplateSource(), path, kQuestion, {});
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(r->answer, "4816203");
    EXPECT_EQ(r->stats.calls, r->stats.chunks + 1);
    // Each round shows the notes of the rounds before it, "[chunk] note" in reading order.
    std::vector<std::string> notes;  // expected entries so far
    for (int64_t k = 0; k < r->stats.chunks; ++k) {
      const std::string& u = model.users[static_cast<size_t>(k)];
      std::string want;
      for (const auto& e : notes) want += (want.empty() ? "" : "\n") + e;
      EXPECT_EQ(between(u, "notes"), want.empty() ? "none yet" : want) << "cap " << cap << " round " << k;
      auto reply = ideal_smooth(u, k);
      if (*reply != "None.") {
        notes.push_back("[" + std::to_string(k + 1) + "] " + *reply);
        // The cap keeps the newest entries whose lines fit.
        int64_t total = 0;
        for (const auto& e : notes) total += static_cast<int64_t>(model.tokenizer().encode(e + "\n", false, false).size());
        while (total > cap) {
          total -= static_cast<int64_t>(model.tokenizer().encode(notes.front() + "\n", false, false).size());
          notes.erase(notes.begin());
        }
      }
    }
    EXPECT_EQ(r->partials.size(), cap == 500 ? 3u : 1u);
    EXPECT_EQ(r->partials.back(), kNeedle);
  }
  std::filesystem::remove(path);
}

TEST(MapReduce, AggregatorsOnScriptedPartialAnswers) {
  const std::string doc = make_doc(200, {});
  const std::string path = write_temp("map.txt", doc);
  const std::vector<std::string> replies = {"none", " 17\nbecause", "42.", "None of it", "42", ""};
  for (const std::string agg : {"vote", "first", "model"}) {
    ScriptedCaller model([&](const std::string& user, int64_t i) -> Expected<std::string> {
      if (user.find("<answers>") != std::string::npos) return std::string("so \\boxed{42}");
      return replies[static_cast<size_t>(i) % replies.size()];
    });
    auto reader = make_reader("mapreduce:chunk=60,agg=" + agg);
    ASSERT_TRUE(reader.has_value()) << reader.error().message;
    auto r = read_document(**reader, model, TemplateSource(), path, kQuestion, {});
    ASSERT_TRUE(r.has_value()) << r.error().message;
    const int64_t chunks = r->stats.chunks;
    ASSERT_GE(chunks, 6);
    // Candidates: chunks whose reply is not "none..." or empty.
    int64_t want = 0;
    for (int64_t i = 0; i < chunks; ++i) {
      const std::string& s = replies[static_cast<size_t>(i) % replies.size()];
      want += !(s.empty() || s.rfind("none", 0) == 0 || s.rfind("None", 0) == 0);
    }
    EXPECT_EQ(r->stats.candidates, want);
    EXPECT_EQ(r->partials.front(), "17");
    if (agg == "vote") EXPECT_EQ(r->answer, "42.");  // 42 twice per cycle, 17 once
    if (agg == "first") EXPECT_EQ(r->answer, "17");
    if (agg == "model") {
      EXPECT_EQ(r->answer, "42");
      EXPECT_EQ(r->stats.calls, chunks + 1);
      const std::string list = between(model.users.back(), "answers");
      int64_t n17 = 0;
      for (int64_t i = 0; i < chunks; ++i) n17 += i % 6 == 1;
      EXPECT_EQ(list.substr(0, list.find('\n')), "1. 17 (" + std::to_string(n17) + " sections)");
      EXPECT_NE(list.find("\n2. 42. ("), std::string::npos) << list;
    } else {
      EXPECT_EQ(r->stats.calls, chunks);
    }
  }
  std::filesystem::remove(path);
}

TEST(Readers, ResumeAfterAnInterruptionGivesTheSameAnswer) {
  const std::string doc = make_doc(400, {{40, kNeedle}});  // in the chunks before the interruption
  const std::string path = write_temp("resume.txt", doc);
  const std::string ck = temp_path("resume.ckpt");
  // mapreduce,batch=2 checkpoints after each pair of chunks: the fourth call (chunk 3) fails
  // inside the second pair, so the read resumes after chunk 1.
  for (const std::string spec : {"memagent:chunk=200,memory=64", "mapreduce:chunk=200,agg=vote,batch=1",
                                 "mapreduce:chunk=200,agg=vote,batch=2", "smooth:chunk=200,entry=32,summary=100"}) {
    const int64_t kept = spec.find("batch=2") != std::string::npos ? 2 : 3;
    std::filesystem::remove(ck);
    auto script = [](const std::string& user, int64_t i) -> Expected<std::string> {
      if (user.find("Answer from this section") != std::string::npos)
        return std::string(user.find(kNeedle) != std::string::npos ? "4816203" : "none");
      if (user.find("<notes>") != std::string::npos) return ideal_smooth(user, i);
      return ideal_memagent(user, i);
    };
    ScriptedCaller once(script);
    auto r0 = make_reader(spec);
    auto whole = read_document(**r0, once, TemplateSource(), path, kQuestion, {});
    ASSERT_TRUE(whole.has_value()) << whole.error().message;
    EXPECT_EQ(whole->answer, "4816203") << spec;
    const int64_t chunks = whole->stats.chunks;
    ASSERT_GE(chunks, 5);
    // Interrupted: the model fails at the fourth call.
    ScriptedCaller dies([&](const std::string& u, int64_t i) -> Expected<std::string> {
      if (i == 3) return make_error("connection lost");
      return script(u, i);
    });
    auto r1 = make_reader(spec);
    ReadOptions opt;
    opt.checkpoint = ck;
    auto broken = read_document(**r1, dies, TemplateSource(), path, kQuestion, opt);
    ASSERT_FALSE(broken.has_value());
    EXPECT_NE(broken.error().message.find("connection lost"), std::string::npos);
    ScriptedCaller again(script);
    auto r2 = make_reader(spec);
    opt.resume = true;
    auto resumed = read_document(**r2, again, TemplateSource(), path, kQuestion, opt);
    ASSERT_TRUE(resumed.has_value()) << resumed.error().message;
    EXPECT_EQ(resumed->answer, whole->answer) << spec;
    EXPECT_EQ(resumed->stats.resumed_chunks, kept) << spec;
    EXPECT_EQ(static_cast<int64_t>(again.users.size()), whole->stats.calls - kept) << spec;
    EXPECT_EQ(resumed->stats.calls, whole->stats.calls);
    EXPECT_EQ(resumed->stats.doc_tokens, whole->stats.doc_tokens);
    // The resumed run saw the same prompts as the uninterrupted one from chunk 3 on.
    for (size_t k = 0; k < again.users.size(); ++k)
      EXPECT_EQ(again.users[k], once.users[k + static_cast<size_t>(kept)]) << spec << " " << k;
    // Another question does not resume from this checkpoint.
    auto r3 = make_reader(spec);
    auto other = read_document(**r3, again, TemplateSource(), path, "What else?", opt);
    ASSERT_FALSE(other.has_value());
    EXPECT_NE(other.error().message.find("another question"), std::string::npos) << other.error().message;
  }
  std::filesystem::remove(ck);
  std::filesystem::remove(path);
}

TEST(Readers, BadInputIsAClearError) {
  const std::string path = write_temp("bad.txt", make_doc(100, {}));
  ScriptedCaller model(ideal_memagent);
  auto expect_error = [&](const std::string& spec, const std::string& question, const std::string& want,
                          const TemplateSource& src = TemplateSource(), const std::string& doc = "") {
    auto r = make_reader(spec);
    if (!r) {
      EXPECT_NE(r.error().message.find(want), std::string::npos) << spec << ": " << r.error().message;
      return;
    }
    auto res = read_document(**r, model, src, doc.empty() ? path : doc, question, {});
    ASSERT_FALSE(res.has_value()) << spec;
    EXPECT_NE(res.error().message.find(want), std::string::npos) << spec << ": " << res.error().message;
  };
  expect_error("nosuch", kQuestion, "unknown reader 'nosuch' (accepted: memagent, mapreduce, smooth, sculptor)");
  expect_error("memagent:chunks=5", kQuestion, "unknown key 'chunks'");
  expect_error("mapreduce:agg=mean", kQuestion, "vote, first or model");
  expect_error("memagent", "  ", "the question is empty");
  std::string long_q;
  for (int i = 0; i < 300; ++i) long_q += "why and how ";
  expect_error("memagent", long_q, "does not fit the window of 1024 tokens");
  expect_error("mapreduce", long_q, "does not fit the window of 1024 tokens");
  expect_error("memagent:chunk=900", kQuestion, "chunk 900");
  expect_error("memagent:memory=600", kQuestion, "memory 600 in and 600 out");
  expect_error("memagent:chunk=50,calls=3", kQuestion, "cap of 3 model calls");
  expect_error("memagent", kQuestion, "the document is empty", TemplateSource(), write_temp("empty.txt", ""));
  // A template folder missing a file, and one whose template lacks a placeholder.
  const std::string dir = temp_path("prompts");
  std::filesystem::create_directories(dir);
  expect_error("memagent", kQuestion, "memagent_update.txt", TemplateSource(dir));
  std::ofstream(dir + "/memagent_update.txt") << "{problem} {chunk}";
  expect_error("memagent", kQuestion, "missing placeholder {memory}", TemplateSource(dir));
  std::filesystem::remove_all(dir);
  std::filesystem::remove(temp_path("empty.txt"));
  std::filesystem::remove(path);
}

TEST(Readers, EveryReaderIsDescribedWithItsPaperAndKeys) {
  const auto info = reader_method_info();
  ASSERT_EQ(info.size(), 4u);
  for (const auto& m : info) {
    EXPECT_FALSE(m.help.empty()) << m.name;
    EXPECT_GE(m.paper.size(), 20u) << m.name;
    EXPECT_GE(m.keys.size(), 4u) << m.name;
    for (const auto& k : m.keys) EXPECT_FALSE(k.help.empty()) << m.name << " " << k.name;
  }
}

TEST(Readers, ExtractBoxed) {
  EXPECT_EQ(extract_boxed("so \\boxed{42}."), "42");
  EXPECT_EQ(extract_boxed("\\boxed{1} then \\boxed{ {a} b }"), "{a} b");
  EXPECT_EQ(extract_boxed("  plain answer \n"), "plain answer");
  EXPECT_EQ(extract_boxed("\\boxed{open"), "open");
}

}  // namespace
}  // namespace lc::readers
