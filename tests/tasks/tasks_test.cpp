// Task generators: exact token lengths, needles present once at their depth, answers that
// follow from the context (checked by re-deriving them here, independently of the
// generators), determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "tasks/haystack.h"
#include "tasks/tasks.h"
#include "tasks/text.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace lc::tasks {
namespace {

const std::string kData = LONGCTX_TEST_DATA;

struct Vocab {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
  ChatTemplate tmpl = ChatTemplate::kNone;
};

Vocab load_vocab(const std::string& path) {
  Vocab v;
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  v.file = std::move(*f);
  auto t = Tokenizer::from_gguf(*v.file);
  EXPECT_TRUE(t.has_value());
  v.tok = std::move(*t);
  v.tmpl = detect_chat_template(*v.file, *v.tok);
  return v;
}

const Vocab& stories() {
  static Vocab v = load_vocab(kData + "/golden/models/stories260K.gguf");
  return v;
}
const Vocab& llama3() {
  static Vocab v = load_vocab(kData + "/vocab/ggml-vocab-llama-bpe.gguf");
  return v;
}

Sample make(const Vocab& v, const std::string& task, int64_t len, int depth = -1, int64_t index = 0,
            GenOptions opts = {}, uint64_t seed = 42) {
  PromptRenderer r(*v.tok, v.tmpl);
  SampleSpec spec{task, len, depth, index, seed, opts};
  auto s = make_sample(r, spec);
  EXPECT_TRUE(s.has_value()) << task << " @ " << len << ": " << (s ? "" : s.error().message);
  return s ? std::move(*s) : Sample{};
}

// The invariants every sample keeps.
void check_common(const Vocab& v, const Sample& s) {
  SCOPED_TRACE(s.spec.task + " @ " + std::to_string(s.spec.length));
  PromptRenderer r(*v.tok, v.tmpl);
  // The prompt is exactly what the tokenizer makes of the rendered text, and fills the length.
  EXPECT_EQ(r.tokens(s.user, s.answer_prefix), s.tokens);
  EXPECT_EQ(s.n_prompt, static_cast<int64_t>(s.tokens.size()));
  EXPECT_EQ(s.n_prompt + s.max_new_tokens, s.spec.length);
  EXPECT_GE(s.max_new_tokens, s.budget_new_tokens);
  // The search left at most about one haystack unit unused (a needle of UUIDs is the largest).
  EXPECT_LE(s.max_new_tokens - s.budget_new_tokens, 160);
  EXPECT_FALSE(s.answers.empty());
  EXPECT_NE(s.user.find(s.context), std::string::npos);
  EXPECT_EQ(s.input_hash.size(), 16u);
  for (const auto& n : s.needles) {
    ASSERT_LE(n.pos + n.text.size(), s.context.size());
    EXPECT_EQ(s.context.compare(n.pos, n.text.size(), n.text), 0) << n.text;
    EXPECT_GE(n.depth, 0.0);
    EXPECT_LE(n.depth, 1.0);
  }
}

// The haystack sentence (or document) lengths bound how close a needle can get to its depth.
double depth_tolerance(const Sample& s) {
  size_t longest = 0;
  for (const auto& sent : split_sentences(s.context)) longest = std::max(longest, sent.size());
  for (const auto& n : s.needles) longest = std::max(longest, n.text.size());
  return static_cast<double>(longest + 2) / static_cast<double>(s.context.size()) + 0.01;
}

TEST(BenchTasks, ListAndGroups) {
  EXPECT_EQ(task_list().size(), 20u);
  auto ruler = expand_task_names({"ruler"});
  ASSERT_TRUE(ruler.has_value());
  EXPECT_EQ(ruler->size(), 13u);
  auto all = expand_task_names({"passkey", "all", "vt"});
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->size(), 20u);
  EXPECT_EQ((*all)[0], "passkey");
  auto bad = expand_task_names({"niah_single_9"});
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("niah_single_9"), std::string::npos);
  EXPECT_EQ(ruler_depths().size(), 40u);
  EXPECT_EQ(ruler_depths().front(), 0);
  EXPECT_EQ(ruler_depths().back(), 100);
}

TEST(BenchTasks, EveryTaskFitsExactlyOnBothVocabularies) {
  const GenOptions small{8, 0};
  for (const auto& t : task_list()) {
    for (int64_t len : {1024, 2048}) {
      Sample s = make(stories(), t.name, len, 50, 0, small);
      check_common(stories(), s);
    }
    for (int64_t len : {1024, 4096}) {
      Sample s = make(llama3(), t.name, len, 50, 1);
      check_common(llama3(), s);
      EXPECT_EQ(s.budget_new_tokens, t.new_tokens);
    }
  }
  // The Llama 3 vocabulary brings its chat template: the prompt is a user turn, and the answer
  // prefix opens the assistant's turn.
  ASSERT_EQ(llama3().tmpl, ChatTemplate::kLlama3);
  Sample s = make(llama3(), "niah_single_1", 1024);
  const std::string text = PromptRenderer(*llama3().tok, llama3().tmpl).text(s.user, s.answer_prefix);
  EXPECT_NE(text.find("<|start_header_id|>assistant<|end_header_id|>\n\nThe special magic number"), std::string::npos);
}

TEST(BenchTasks, LongLengthIsExact) {
  for (const char* t : {"niah_single_2", "cwe", "qa_1"}) {
    Sample s = make(llama3(), t, 16384);
    check_common(llama3(), s);
  }
}

TEST(BenchTasks, Deterministic) {
  Sample a = make(llama3(), "niah_multikey_1", 2048, 30, 3);
  Sample b = make(llama3(), "niah_multikey_1", 2048, 30, 3);
  EXPECT_EQ(a.input_hash, b.input_hash);
  EXPECT_EQ(a.user, b.user);
  EXPECT_EQ(a.answers, b.answers);
  Sample c = make(llama3(), "niah_multikey_1", 2048, 30, 4);
  EXPECT_NE(a.input_hash, c.input_hash);
  Sample d = make(llama3(), "niah_multikey_1", 2048, 30, 3, {}, 7);
  EXPECT_NE(a.input_hash, d.input_hash);
}

TEST(BenchTasks, TooShortIsAnErrorNamingTheTask) {
  PromptRenderer r(*stories().tok, stories().tmpl);
  auto s = make_sample(r, {"qa_2", 128, -1, 0, 42, {}});
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("qa_2"), std::string::npos);
  EXPECT_NE(s.error().message.find("is too short"), std::string::npos);
  EXPECT_FALSE(make_sample(r, {"nope", 1024, -1, 0, 42, {}}).has_value());
  EXPECT_FALSE(make_sample(r, {"passkey", 1024, 120, 0, 42, {}}).has_value());
}

TEST(BenchTasks, NeedleOnceAtItsDepth) {
  const std::vector<std::string> tasks = {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
                                          "niah_multikey_2", "niah_multikey_3", "niah_multivalue",
                                          "niah_multiquery", "passkey"};
  for (const auto& t : tasks) {
    for (int depth : {0, 25, 50, 75, 100}) {
      Sample s = make(llama3(), t, 4096, depth);
      SCOPED_TRACE(t + " depth " + std::to_string(depth));
      ASSERT_FALSE(s.needles.empty());
      // The queried needle is there once and says its answer.
      EXPECT_EQ(count_occurrences(s.context, s.needles[0].text), 1u);
      EXPECT_NE(s.needles[0].text.find(s.answers[0]), std::string::npos);
      for (const auto& a : s.answers) EXPECT_EQ(count_occurrences(s.context, a), t == "passkey" ? 2u : 1u) << a;
      EXPECT_NEAR(s.needles[0].depth, depth / 100.0, depth_tolerance(s));
      // Needles sit at sentence boundaries: what precedes one ends a sentence or a line.
      for (const auto& n : s.needles) {
        if (n.pos == 0) continue;
        const std::string before = s.context.substr(0, n.pos);
        const std::string trimmed = before.substr(0, before.find_last_not_of(" \n") + 1);
        ASSERT_FALSE(trimmed.empty());
        const char c = trimmed.back();
        EXPECT_TRUE(c == '.' || c == '!' || c == '?' || before.back() == '\n') << before.substr(before.size() - 40);
      }
      // The question asks for the queried key.
      const std::string key = s.needles[0].text.substr(std::string("One of the special magic ").size());
      if (t != "passkey") {
        const std::string k = key.substr(key.find(" for ") + 5, key.find(" is: ") - key.find(" for ") - 5);
        EXPECT_NE(s.user.rfind(k), s.user.find(k)) << "key " << k << " in the needle and the question";
      }
    }
  }
}

TEST(BenchTasks, RandomDepthsSpreadOverTheGrid) {
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    Sample s = make(stories(), "niah_single_1", 2048, -1, i, {8, 0});
    seen.insert(static_cast<int>(std::lround(s.needles[0].depth * 10)));
  }
  EXPECT_GE(seen.size(), 5u);
}

TEST(BenchTasks, MultiNeedleCounts) {
  Sample mk = make(llama3(), "niah_multikey_1", 4096, 50);
  EXPECT_EQ(mk.needles.size(), 4u);
  EXPECT_EQ(mk.answers.size(), 1u);
  Sample mv = make(llama3(), "niah_multivalue", 4096, 50);
  EXPECT_EQ(mv.needles.size(), 4u);
  EXPECT_EQ(mv.answers.size(), 4u);
  Sample mq = make(llama3(), "niah_multiquery", 4096, 50);
  EXPECT_EQ(mq.needles.size(), 4u);
  EXPECT_EQ(mq.answers.size(), 4u);
  Sample h = make(llama3(), "niah_multikey_2", 4096, 50);
  // A haystack of needles: every line is a needle, the queried one among them once.
  size_t lines = 0;
  for (const auto& l : split_sentences(h.context)) lines += l.rfind("One of the special magic numbers for ", 0) == 0;
  EXPECT_GT(lines, 20u);
  Sample u = make(llama3(), "niah_multikey_3", 4096, 50);
  EXPECT_TRUE(std::regex_search(u.needles[0].text, std::regex("for [0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12} is")));
}

TEST(BenchTasks, VariableTrackingResolves) {
  for (int i = 0; i < 3; ++i) {
    Sample s = make(llama3(), "vt", 2048, -1, i);
    std::map<std::string, std::string> assign;  // var -> number or var
    std::regex re("VAR ([A-Z]{5}) = (VAR )?([A-Z0-9]+)");
    for (std::sregex_iterator it(s.context.begin(), s.context.end(), re), end; it != end; ++it)
      assign[(*it)[1]] = (*it)[3];
    auto value_of = [&](std::string v) {
      for (int k = 0; k < 10 && assign.count(v); ++k) v = assign[v];
      return v;
    };
    const std::string value = s.info[0].second;
    std::set<std::string> expect;
    for (const auto& [v, _] : assign)
      if (value_of(v) == value) expect.insert(v);
    EXPECT_EQ(expect, std::set<std::string>(s.answers.begin(), s.answers.end()));
    EXPECT_EQ(s.answers.size(), 5u);
    EXPECT_NE(s.answer_prefix.find(value), std::string::npos);
  }
}

std::map<std::string, int> count_words(const std::vector<std::string>& words) {
  std::map<std::string, int> c;
  for (const auto& w : words) ++c[w];
  return c;
}

TEST(BenchTasks, CommonWordsAreTheTopTen) {
  for (int64_t len : {1024, 8192}) {
    Sample s = make(llama3(), "cwe", len);
    std::vector<std::string> list;
    std::regex re("[0-9]+\\. ([a-z]+)");
    for (std::sregex_iterator it(s.context.begin(), s.context.end(), re), end; it != end; ++it) list.push_back((*it)[1]);
    auto c = count_words(list);
    std::vector<std::pair<int, std::string>> by;
    for (const auto& [w, n] : c) by.emplace_back(-n, w);
    std::sort(by.begin(), by.end());
    ASSERT_GT(by.size(), 10u);
    std::set<std::string> top;
    for (int i = 0; i < 10; ++i) top.insert(by[static_cast<size_t>(i)].second);
    EXPECT_EQ(top, std::set<std::string>(s.answers.begin(), s.answers.end()));
    EXPECT_GT(-by[9].first, -by[10].first) << "the tenth word must be strictly more common than the rest";
  }
}

TEST(BenchTasks, FrequentWordsAreTheTopThree) {
  for (int64_t len : {1024, 8192}) {
    Sample s = make(llama3(), "fwe", len);
    auto c = count_words(split_words(s.context));
    c.erase("...");
    std::vector<std::pair<int, std::string>> by;
    for (const auto& [w, n] : c) by.emplace_back(-n, w);
    std::sort(by.begin(), by.end());
    ASSERT_GT(by.size(), 3u);
    std::set<std::string> top = {by[0].second, by[1].second, by[2].second};
    EXPECT_EQ(top, std::set<std::string>(s.answers.begin(), s.answers.end()));
    EXPECT_GT(-by[2].first, -by[3].first);
  }
}

TEST(BenchTasks, QaGoldDocumentsAnswerTheQuestion) {
  for (const char* t : {"qa_1", "qa_2"}) {
    for (int depth : {0, 50, 100}) {
      Sample s = make(llama3(), t, 4096, depth);
      SCOPED_TRACE(std::string(t) + " depth " + std::to_string(depth));
      ASSERT_EQ(s.needles.size(), std::string(t) == "qa_1" ? 1u : 2u);
      for (const auto& n : s.needles) EXPECT_EQ(count_occurrences(s.context, n.text), 1u);
      EXPECT_NE(s.needles.back().text.find(s.answers[0]), std::string::npos);
      EXPECT_NEAR(s.needles[0].depth, depth / 100.0, 0.08);
      // The person asked about (qa_1) or the institution (qa_2) has no other entry.
      const std::string q = s.info[0].second;
      std::smatch m;
      if (std::string(t) == "qa_1") {
        ASSERT_TRUE(std::regex_search(q, m, std::regex("([A-Z][a-z]+ [A-Z][a-z]+)")));
      } else {
        ASSERT_TRUE(std::regex_search(q, m, std::regex("founder of the ([A-Z][a-z]+ [A-Z][a-z]+ [a-z ]+?)( born| study)")));
      }
      EXPECT_EQ(count_occurrences(s.context, std::string(m[1])), std::string(t) == "qa_1" ? 1u : 2u) << m[1];
      EXPECT_NE(s.user.find("Document 1:\n"), std::string::npos);
    }
  }
}

// An independent bAbI reader: replays the facts found in the context.
std::string babi_answer(const Sample& s) {
  std::map<std::string, std::string> where, holder, lies;
  std::map<std::string, std::vector<std::string>> trail;
  auto place = [&](const std::string& o) {
    if (holder.count(o) && !holder[o].empty()) return where[holder[o]];
    return lies.count(o) ? lies[o] : std::string();
  };
  auto note = [&](const std::string& o) {
    const std::string p = place(o);
    if (!p.empty() && (trail[o].empty() || trail[o].back() != p)) trail[o].push_back(p);
  };
  std::regex move("([A-Z][a-z]+) (went|moved|travelled|journeyed) to the ([a-z]+)\\.");
  std::regex pick("([A-Z][a-z]+) (picked up|got) the ([a-z]+) there\\.");
  std::regex drop("([A-Z][a-z]+) (dropped|put down) the ([a-z]+)\\.");
  for (const auto& n : s.needles) {
    std::smatch m;
    if (std::regex_match(n.text, m, move)) {
      where[m[1]] = m[3];
      for (auto& [o, h] : holder)
        if (h == m[1].str()) note(o);
    } else if (std::regex_match(n.text, m, pick)) {
      holder[m[3]] = m[1];
      lies.erase(m[3]);
      note(m[3]);
    } else if (std::regex_match(n.text, m, drop)) {
      holder[m[3]] = "";
      lies[m[3]] = where[m[1]];
    } else {
      ADD_FAILURE() << "not a fact: " << n.text;
    }
  }
  const std::string q = s.info[0].second;
  std::smatch m;
  if (std::regex_match(q, m, std::regex("Where is ([A-Z][a-z]+)\\?"))) return where[m[1]];
  if (std::regex_match(q, m, std::regex("Where is the ([a-z]+)\\?"))) return place(m[1]);
  if (std::regex_match(q, m, std::regex("Where was the ([a-z]+) before the ([a-z]+)\\?"))) {
    const auto& t = trail[m[1]];
    if (t.size() >= 2 && t.back() == m[2].str()) return t[t.size() - 2];
  }
  return "?";
}

TEST(BenchTasks, BabilongAnswersFollowFromTheFacts) {
  for (const char* t : {"babilong_1", "babilong_2", "babilong_3"}) {
    for (int i = 0; i < 6; ++i) {
      Sample s = make(llama3(), t, 2048, -1, i);
      SCOPED_TRACE(std::string(t) + " sample " + std::to_string(i));
      // Facts keep their order in the text (a fact may repeat: someone goes back to a room).
      for (const auto& n : s.needles) EXPECT_GE(count_occurrences(s.context, n.text), 1u) << n.text;
      for (size_t k = 1; k < s.needles.size(); ++k) EXPECT_LT(s.needles[k - 1].pos, s.needles[k].pos);
      EXPECT_EQ(babi_answer(s), s.answers[0]);
    }
  }
}

TEST(BenchTasks, DenseAnswersNeedEveryObservation) {
  for (int i = 0; i < 4; ++i) {
    Sample c = make(llama3(), "dense_count", 2048, -1, i);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(c.user, m, std::regex("report a ([a-z]+)\\?")));
    const std::string animal = m[1];
    EXPECT_EQ(std::to_string(count_occurrences(c.context, ": a " + animal + " was seen")), c.answers[0]);

    Sample st = make(llama3(), "dense_state", 2048, -1, i);
    ASSERT_TRUE(std::regex_search(st.user, m, std::regex("starts in the ([a-z]+) box")));
    std::string ball = m[1];
    std::regex sw("the ([a-z]+) box and the ([a-z]+) box are exchanged");
    int moves = 0;
    for (std::sregex_iterator it(st.context.begin(), st.context.end(), sw), end; it != end; ++it, ++moves) {
      if ((*it)[1] == ball) ball = (*it)[2];
      else if ((*it)[2] == ball) ball = (*it)[1];
    }
    EXPECT_GT(moves, 20);
    EXPECT_EQ(ball, st.answers[0]);

    Sample mj = make(llama3(), "dense_majority", 2048, -1, i);
    std::map<std::string, size_t> n;
    for (const char* col : {"red", "blue", "green", "yellow"}) n[col] = count_occurrences(mj.context, std::string("showed ") + col + ".");
    size_t best = 0;
    for (const auto& [col, k] : n) best = std::max(best, k);
    EXPECT_EQ(n[mj.answers[0]], best);
    size_t ties = 0;
    for (const auto& [col, k] : n) ties += k == best;
    EXPECT_EQ(ties, 1u);
  }
}

TEST(BenchTasks, DenseObservationCounts) {
  // Fixed counts, 8 to 128 observations, spread through book text that fills the length.
  for (int64_t obs : {8, 32, 128}) {
    Sample s = make(llama3(), "dense_state", 8192, -1, 0, {0, obs});
    check_common(llama3(), s);
    EXPECT_EQ(static_cast<int64_t>(s.needles.size()), obs);
    EXPECT_EQ(s.info[0].second, std::to_string(obs));
    EXPECT_EQ(s.unit, "words");
  }
  // Filling the length: more observations at a longer length.
  Sample a = make(llama3(), "dense_majority", 1024);
  Sample b = make(llama3(), "dense_majority", 4096);
  EXPECT_GT(b.needles.size(), 3 * a.needles.size());
}

TEST(BenchTasks, Text) {
  EXPECT_EQ(split_sentences("A b. C d!  E\nf? g"), (std::vector<std::string>{"A b.", "C d!", "E f?", "g"}));
  EXPECT_EQ(parse_length("4K"), 4096);
  EXPECT_EQ(parse_length("128k"), 131072);
  EXPECT_EQ(parse_length("1M"), 1048576);
  EXPECT_EQ(parse_length("300"), 300);
  EXPECT_EQ(parse_length("x"), -1);
  EXPECT_EQ(parse_length(""), -1);
  Rng r1(5), r2(5);
  EXPECT_EQ(random_uuid(r1), random_uuid(r2));
  EXPECT_EQ(sample_seed(1, "a", 2, 3, 4), sample_seed(1, "a", 2, 3, 4));
  EXPECT_NE(sample_seed(1, "a", 2, 3, 4), sample_seed(1, "a", 2, 3, 5));
  auto w = essay_words();
  ASSERT_TRUE(w.has_value()) << w.error().message;
  EXPECT_GT((*w)->size(), 50000u);
}

}  // namespace
}  // namespace lc::tasks
