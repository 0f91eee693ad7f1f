// The RULER tasks' prompts against RULER's own text (Hsieh et al., 2024, "RULER: What's the
// Real Context Size of Your Long-Context Language Models?"). The strings below are RULER's,
// copied from NVIDIA/RULER at commit c3f5e3b (scripts/data/synthetic/constants.py, niah.py,
// variable_tracking.py, common_words_extraction.py, freq_words_extraction.py, qa.py), with
// RULER's "{field}" slots. Each sample's prompt (user message + answer prefix, what RULER's
// base template sends) must equal them filled in the way RULER's scripts fill them, with the
// sample's own draws (keys, values, variables, words, question) read back from the sample.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <regex>
#include <set>

#include "gguf/gguf.h"
#include "tasks/needles.h"
#include "tasks/tasks.h"
#include "tasks/text.h"
#include "tokenizer/tokenizer.h"

namespace lc::tasks {
namespace {

// ---- RULER's text ----

// constants.py, TASKS[...]['template'] and ['answer_prefix'].
const std::string kNiahTemplate =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?";
const std::string kNiahAnswerPrefix = " The special magic {type_needle_v} for {query} mentioned in the provided text are";
const std::string kVtTemplate =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find "
    "all variables that are assigned the value {query} in the text above.";
const std::string kVtAnswerPrefix =
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the "
    "value {query}, they are: ";
const std::string kCweTemplate =
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?";
const std::string kCweAnswerPrefix = " Answer: The top 10 words that appear most often in the list are:";
const std::string kFweTemplate =
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What "
    "are the three most frequently appeared words in the above coded text?";
const std::string kFweAnswerPrefix = " Answer: According to the coded text above, the three most frequently appeared words are:";
const std::string kQaTemplate =
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. "
    "Only give me the answer and do not output any other words.\n\nQuestion: {query}";
const std::string kQaAnswerPrefix = " Answer:";
// niah.py: the needle; niah.py and variable_tracking.py: the noise haystack (one entry of
// `[haystack] * n`, joined by "\n").
const std::string kNeedle = "One of the special magic {type_needle_v} for {key} is: {value}.";
const std::string kNoise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
// qa.py: DOCUMENT_PROMPT, the documents joined by "\n\n".
const std::string kDocument = "Document {i}:\n{document}";

// ---- Python's str.format and str.replace, as RULER's scripts use them ----

std::string py_format(const std::string& t, const std::map<std::string, std::string>& f) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '{') {
      const size_t e = t.find('}', i);
      const std::string name = t.substr(i + 1, e - i - 1);
      EXPECT_TRUE(f.count(name)) << "no field " << name;
      if (f.count(name)) out += f.at(name);
      i = e + 1;
    } else {
      out += t[i++];
    }
  }
  return out;
}

std::string py_replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '\n') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

std::string between(const std::string& s, const std::string& a, const std::string& b, size_t from = 0) {
  const size_t i = s.find(a, from);
  if (i == std::string::npos) return "";
  const size_t j = s.find(b, i + a.size());
  if (j == std::string::npos) return "";
  return s.substr(i + a.size(), j - i - a.size());
}

// ---- samples ----

struct Vocab {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
  ChatTemplate tmpl = ChatTemplate::kNone;
};

const Vocab& llama3() {
  static Vocab v = [] {
    Vocab x;
    auto f = gguf::File::open(std::string(LONGCTX_TEST_DATA) + "/vocab/ggml-vocab-llama-bpe.gguf");
    EXPECT_TRUE(f.has_value());
    x.file = std::move(*f);
    auto t = Tokenizer::from_gguf(*x.file);
    EXPECT_TRUE(t.has_value());
    x.tok = std::move(*t);
    x.tmpl = detect_chat_template(*x.file, *x.tok);
    return x;
  }();
  return v;
}

Sample make(const std::string& task, int64_t len, int depth = -1, int64_t index = 0) {
  PromptRenderer r(*llama3().tok, llama3().tmpl);
  auto s = make_sample(r, {task, len, depth, index, 42, {}});
  EXPECT_TRUE(s.has_value()) << task << " @ " << len << ": " << (s ? "" : s.error().message);
  return s ? std::move(*s) : Sample{};
}

std::string info(const Sample& s, const std::string& key) {
  for (const auto& [k, v] : s.info)
    if (k == key) return v;
  ADD_FAILURE() << "no info " << key;
  return "";
}

// What RULER's prompt is (base template: the template, then the answer prefix).
std::string prompt(const Sample& s) { return s.user + s.answer_prefix; }

// ---- fixed inputs ----

TEST(RulerTemplates, NeedleAndSingularWordingOnFixedInputs) {
  EXPECT_EQ(needle_sentence("numbers", "young-engine", "5485304"),
            "One of the special magic numbers for young-engine is: 5485304.");
  const NiahWording w = niah_single_wording("numbers", "young-engine");
  EXPECT_EQ(w.head + "CONTEXT" + w.question + w.answer_prefix,
            "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
            "about the number afterwards.\nCONTEXT\nWhat is the special magic number for young-engine mentioned in "
            "the provided text? The special magic number for young-engine mentioned in the provided text is");
}

// ---- every task ----

TEST(RulerTemplates, NeedleTasksAreRulersTemplateFilledIn) {
  struct Case {
    const char* task;
    const char* value_type;
    const char* haystack;
    bool singular;
  };
  const Case cases[] = {{"niah_single_1", "numbers", "noise", true},     {"niah_single_2", "numbers", "essay", true},
                        {"niah_single_3", "uuids", "essay", true},       {"niah_multikey_1", "numbers", "essay", true},
                        {"niah_multikey_2", "numbers", "needle", true},  {"niah_multikey_3", "uuids", "needle", true},
                        {"niah_multivalue", "numbers", "essay", false}, {"niah_multiquery", "numbers", "essay", false}};
  for (const Case& c : cases) {
    for (int depth : {0, 50, 100}) {
      const Sample s = make(c.task, 2048, depth);
      SCOPED_TRACE(std::string(c.task) + " depth " + std::to_string(depth));
      // niah.py: with one query and one value, RULER rewrites its plural template.
      std::string t = kNiahTemplate + kNiahAnswerPrefix;
      std::string type = c.value_type;
      if (c.singular) {
        t = py_replace(t, "Some", "A");
        t = py_replace(t, "are all", "is");
        t = py_replace(t, "are", "is");
        t = py_replace(t, "answers", "answer");
        type = type.substr(0, type.size() - 1);
      }
      const std::string query = info(s, "query");
      EXPECT_EQ(prompt(s), py_format(t, {{"type_needle_v", type}, {"context", s.context}, {"query", query}}));
      // The queried needle is RULER's sentence with the plural type.
      const std::string first_key = query.substr(0, query.find(','));
      EXPECT_EQ(s.needles[0].text,
                py_format(kNeedle, {{"type_needle_v", c.value_type}, {"key", first_key}, {"value", s.answers[0]}}));
      const std::string needle_head = py_format(kNeedle, {{"type_needle_v", c.value_type}, {"key", ""}, {"value", ""}});
      const std::string before_key = needle_head.substr(0, needle_head.find(" is: "));
      if (std::string(c.haystack) == "noise") {
        // [haystack] * n joined by "\n", the needles on lines of their own.
        size_t blocks = 0, needles = 0;
        for (const std::string& l : lines(s.context)) {
          if (l == kNoise) {
            ++blocks;
          } else {
            EXPECT_EQ(l.rfind(before_key, 0), 0u) << l;
            ++needles;
          }
        }
        EXPECT_EQ(static_cast<int64_t>(blocks), s.size_units);
        EXPECT_GT(blocks, 20u);
        EXPECT_EQ(needles, s.needles.size());
      } else if (std::string(c.haystack) == "needle") {
        // Every line a needle.
        for (const std::string& l : lines(s.context)) {
          EXPECT_EQ(l.rfind(before_key, 0), 0u) << l;
          EXPECT_NE(l.find(" is: "), std::string::npos) << l;
          EXPECT_EQ(l.back(), '.');
        }
      } else {
        // The essay: sentences and needles joined by spaces on one line.
        EXPECT_EQ(s.context.find('\n'), std::string::npos);
      }
    }
  }
}

// The variables and value of a chain written as variable_tracking.py writes it: the value's
// statement, then one per hop with the f-string's trailing space.
std::vector<std::string> chain(const std::vector<std::string>& vars, const std::string& value) {
  std::vector<std::string> c = {"VAR " + vars[0] + " = " + value};
  for (size_t j = 0; j + 1 < vars.size(); ++j) c.push_back("VAR " + vars[j + 1] + " = VAR " + vars[j] + " ");
  return c;
}

// A noise context of variable tracking: noise blocks and the chain's statements in order, one a
// line. Returns the number of blocks.
size_t check_vt_context(const std::string& context, const std::vector<std::string>& c) {
  size_t blocks = 0, k = 0;
  for (const std::string& l : lines(context)) {
    if (l == kNoise) {
      ++blocks;
    } else {
      EXPECT_LT(k, c.size()) << l;
      if (k < c.size()) {
        EXPECT_EQ(l, c[k]);
      }
      ++k;
    }
  }
  EXPECT_EQ(k, c.size());
  return blocks;
}

TEST(RulerTemplates, VariableTrackingWithRulersOneShotExample) {
  for (int64_t index = 0; index < 3; ++index) {
    const Sample s = make("vt", 2048, -1, index);
    SCOPED_TRACE("sample " + std::to_string(index));
    ASSERT_EQ(info(s, "example"), "yes");
    const std::string value = info(s, "value");
    EXPECT_TRUE(std::regex_match(value, std::regex("[1-9][0-9]{4}")));
    ASSERT_EQ(s.answers.size(), 5u);
    for (const auto& v : s.answers) EXPECT_TRUE(std::regex_match(v, std::regex("[A-Z]{5}"))) << v;
    const size_t blocks = check_vt_context(s.context, chain(s.answers, value));
    EXPECT_EQ(static_cast<int64_t>(blocks), s.size_units);
    const std::string t = kVtTemplate + kVtAnswerPrefix;
    const std::string task = py_format(t, {{"context", s.context}, {"query", value}, {"num_v", "5"}});
    const std::string full = prompt(s);
    ASSERT_GT(full.size(), task.size());
    ASSERT_EQ(full.substr(full.size() - task.size()), task);
    // Before it, the example: the same template filled with a chain of 3-letter variables, the
    // answer after the prefix and a space, "\n", then the "\n" main() puts before the task.
    const std::string icl = full.substr(0, full.size() - task.size());
    const std::string ex_context = between(icl, "in the following text.\n\n", "\nQuestion: ");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(icl, m, std::regex("assigned the value ([0-9]+) in the text above")));
    const std::string ex_value = m[1];
    EXPECT_TRUE(std::regex_match(ex_value, std::regex("[1-9][0-9]{4}")));
    std::vector<std::string> ex_vars;
    const std::string ex_answer = between(icl, "they are:  ", "\n");
    for (const std::string& v : split_words(ex_answer)) ex_vars.push_back(v);
    ASSERT_EQ(ex_vars.size(), 5u);
    for (const auto& v : ex_vars) EXPECT_TRUE(std::regex_match(v, std::regex("[A-Z]{3}"))) << v;
    EXPECT_EQ(std::set<std::string>(ex_vars.begin(), ex_vars.end()).size(), 5u);
    const size_t ex_blocks = check_vt_context(ex_context, chain(ex_vars, ex_value));
    const std::string ex_prompt = py_format(t, {{"context", ex_context}, {"query", ex_value}, {"num_v", "5"}});
    EXPECT_EQ(icl, ex_prompt + " " + join(ex_vars, " ") + "\n" + "\n");
    // Sized as RULER sizes it: the most noise blocks that keep the example's prompt within 500
    // tokens (RULER counts it with the value 12345 and other names: a few tokens of slack).
    auto n_tokens = [](const std::string& text) {
      return static_cast<int64_t>(llama3().tok->encode(text, false, false).size());
    };
    EXPECT_GE(ex_blocks, 5u);
    EXPECT_LE(n_tokens(ex_prompt), 510);
    const std::string more = py_format(t, {{"context", kNoise + "\n" + ex_context}, {"query", ex_value}, {"num_v", "5"}});
    EXPECT_GT(n_tokens(more), 490);
  }
  // Too short for the example (RULER does not run there): the task alone, said so.
  const Sample s = make("vt", 400);
  EXPECT_EQ(info(s, "example"), "no");
  const std::string value = info(s, "value");
  check_vt_context(s.context, chain(s.answers, value));
  EXPECT_EQ(prompt(s), py_format(kVtTemplate + kVtAnswerPrefix, {{"context", s.context}, {"query", value}, {"num_v", "5"}}));
}

TEST(RulerTemplates, CommonWordsWithRulersOneShotExample) {
  // common_words_extraction.py: below 4K an example of 20 words (common x3, others x1) and a
  // list of common x6, others x1; from 4K 40 words (x10 / x3) and x30 / x3.
  struct Case {
    int64_t len;
    size_t ex_entries;
    int freq_cw, freq_ucw;
  };
  for (const Case c : {Case{1024, 10 * 3 + 10 * 1, 6, 1}, Case{8192, 10 * 10 + 30 * 3, 30, 3}}) {
    const Sample s = make("cwe", c.len);
    SCOPED_TRACE("length " + std::to_string(c.len));
    ASSERT_EQ(info(s, "example"), "yes");
    const std::string t = kCweTemplate + kCweAnswerPrefix;
    const std::string task = py_format(t, {{"context", s.context}});
    const std::string full = prompt(s);
    ASSERT_GT(full.size(), task.size());
    ASSERT_EQ(full.substr(full.size() - task.size()), task);
    const std::string shot = full.substr(0, full.size() - task.size());
    const std::string ex_context = between(shot, "most often.\n", "\nQuestion: ");
    const std::string ex_answer = between(shot, "in the list are: ", "\n");
    std::vector<std::string> ex_common;
    const std::regex item("([0-9]+)\\. ([^ ]+)");
    for (std::sregex_iterator it(ex_answer.begin(), ex_answer.end(), item), end; it != end; ++it) {
      EXPECT_EQ((*it)[1], std::to_string(ex_common.size() + 1));
      ex_common.push_back((*it)[2]);
    }
    ASSERT_EQ(ex_common.size(), 10u);
    std::string numbered;
    for (size_t i = 0; i < ex_common.size(); ++i) {
      if (i) numbered += ' ';
      numbered += std::to_string(i + 1);
      numbered += ". ";
      numbered += ex_common[i];
    }
    // few_shots[n] = template.format(...) + ' ' + numbered answer, joined by "\n", then "\n".
    EXPECT_EQ(shot, py_format(t, {{"context", ex_context}}) + " " + numbered + "\n");
    // The example's list: RULER's counts, the answer its repeated words.
    std::map<std::string, int> n;
    size_t entries = 0;
    for (std::sregex_iterator it(ex_context.begin(), ex_context.end(), item), end; it != end; ++it, ++entries) {
      EXPECT_EQ((*it)[1], std::to_string(entries + 1));
      ++n[(*it)[2]];
    }
    EXPECT_EQ(entries, c.ex_entries);
    for (const auto& w : ex_common) EXPECT_EQ(n[w], c.ex_entries == 40 ? 3 : 10) << w;
    // The list itself: the common words freq_cw times, the others freq_ucw times.
    std::map<std::string, int> m;
    for (std::sregex_iterator it(s.context.begin(), s.context.end(), item), end; it != end; ++it) ++m[(*it)[2]];
    const std::set<std::string> common(s.answers.begin(), s.answers.end());
    for (const auto& [w, k] : m) EXPECT_EQ(k, common.count(w) ? c.freq_cw : c.freq_ucw) << w;
  }
}

TEST(RulerTemplates, FrequentWordsAndQaAreRulersTemplateFilledIn) {
  for (int64_t len : {1024, 4096}) {
    const Sample f = make("fwe", len);
    EXPECT_EQ(prompt(f), py_format(kFweTemplate + kFweAnswerPrefix, {{"context", f.context}}));
  }
  for (const char* task : {"qa_1", "qa_2"}) {
    const Sample q = make(task, 4096, 50);
    SCOPED_TRACE(task);
    EXPECT_EQ(prompt(q),
              py_format(kQaTemplate + kQaAnswerPrefix, {{"context", q.context}, {"query", info(q, "question")}}));
    // '\n\n'.join(DOCUMENT_PROMPT.format(i=i+1, document=d)).
    std::vector<std::string> docs;
    for (size_t p = 0;;) {
      const size_t e = q.context.find("\n\n", p);
      docs.push_back(q.context.substr(p, e == std::string::npos ? std::string::npos : e - p));
      if (e == std::string::npos) break;
      p = e + 2;
    }
    ASSERT_GT(docs.size(), 3u);
    for (size_t i = 0; i < docs.size(); ++i) {
      const std::string head = py_format(kDocument, {{"i", std::to_string(i + 1)}, {"document", ""}});
      EXPECT_EQ(docs[i].rfind(head, 0), 0u) << docs[i].substr(0, 40);
      EXPECT_GT(docs[i].size(), head.size());
    }
  }
}

}  // namespace
}  // namespace lc::tasks
