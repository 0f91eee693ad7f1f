// The reader protocol tasks of the curriculum (mem_update, mem_answer, map_answer,
// sculptor_search, sculptor_answer): every sample's prompt is the reader's template (read from
// data/readers/*.txt and parsed here)
// rendered with the problem, memory and section found in the decoded prompt; the problem is a
// needle question of the benchmark's wording; the scored tokens are exactly the reply the
// protocol asks for, derived here from the prompt's text alone, then EOS; both branches
// (needle in the chunk or not, memory carried or not) occur; no sequence passes the window.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "readers/templates.h"
#include "train/curriculum.h"

namespace lc::train {
namespace {

// The 512-piece SentencePiece vocabulary the curriculum tests use, and the shipped model's
// byte-level BPE one (whose pre-tokeniser must also keep the reply's tokens apart from the
// prompt's).
const std::string kVocab = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";
const std::string kShipped = std::string(LONGCTX_TEST_DATA) + "/../../models/longctx-2l.gguf";
const std::string kTemplates = std::string(LONGCTX_TEST_DATA) + "/../../data/readers/";

struct Vocab {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
};

Vocab* open_vocab(const std::string& path) {
  auto* r = new Vocab;
  auto f = gguf::File::open(path);
  LC_CHECK(f.has_value());
  r->file = std::move(f.value());
  auto t = Tokenizer::from_gguf(*r->file);
  LC_CHECK(t.has_value());
  r->tok = std::move(t.value());
  return r;
}

const Tokenizer& vocab(bool shipped = false) {
  static Vocab* v = open_vocab(kVocab);
  static Vocab* w = open_vocab(kShipped);
  return shipped ? *w->tok : *v->tok;
}

// A template parsed from its file in the source tree (not the compiled-in copy).
readers::Template load_template(const std::string& name, const std::vector<std::string>& required) {
  std::ifstream in(kTemplates + name + ".txt", std::ios::binary);
  EXPECT_TRUE(in) << kTemplates + name + ".txt";
  std::ostringstream ss;
  ss << in.rdbuf();
  auto t = readers::parse_template(name, ss.str(), required);
  EXPECT_TRUE(t) << (t ? "" : t.error().message);
  return t ? *t : readers::Template{};
}

std::unique_ptr<Curriculum> make(const Tokenizer& tok, const std::string& spec, int64_t min_len, int64_t max_len,
                                 double hard_values = 0) {
  CurriculumOptions o;
  o.lm_fraction = 0;
  o.hard_values = hard_values;
  o.tasks = *parse_curriculum(spec);
  o.min_len = min_len;
  o.max_len = max_len;
  o.ramp = 0.5;
  o.total_steps = 100;
  auto c = Curriculum::create(tok, o);
  EXPECT_TRUE(c) << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

// A sequence split into the prompt (what precedes the first scored target) and the reply (what
// the scored targets spell, EOS excluded), with the targets' structure checked on the way.
struct Seq {
  std::string prompt, reply;
};

Seq split(const Tokenizer& tok, const std::vector<int32_t>& tk, const std::vector<int32_t>& tg, int64_t n) {
  Seq s;
  int64_t first = -1;
  for (int64_t t = 0; t < n && first < 0; ++t)
    if (tg[t] >= 0) first = t;
  EXPECT_GE(first, 1);
  if (first < 1) return s;
  for (int64_t t = first; t < n; ++t) {
    EXPECT_GE(tg[t], 0) << "t=" << t;  // scored from the first reply token to the end
    if (t + 1 < n) {
      EXPECT_EQ(tg[t], tk[t + 1]) << "t=" << t;
      EXPECT_NE(tg[t], tok.eos()) << "t=" << t;
    }
  }
  EXPECT_EQ(tg[n - 1], tok.eos());  // the last target is EOS
  s.prompt = tok.decode(std::vector<int32_t>(tk.begin(), tk.begin() + first + 1));
  std::string all = tok.decode(std::vector<int32_t>(tk.begin(), tk.begin() + n));
  // SentencePiece's dummy prefix: the space it puts in front of the text.
  if (!s.prompt.empty() && s.prompt[0] == ' ') {
    s.prompt.erase(0, 1);
    all.erase(0, 1);
  }
  EXPECT_EQ(all.compare(0, s.prompt.size(), s.prompt), 0);
  if (all.size() >= s.prompt.size()) s.reply = all.substr(s.prompt.size());
  return s;
}

// The text between `open` and the next `close` after it.
std::optional<std::string> between(const std::string& s, const std::string& open, const std::string& close) {
  const size_t a = s.find(open);
  if (a == std::string::npos) return std::nullopt;
  const size_t b = s.find(close, a + open.size());
  if (b == std::string::npos) return std::nullopt;
  return s.substr(a + open.size(), b - a - open.size());
}

// A reader step's prompt in its parts: the problem, the state between <tag> and </tag> (the
// template's `placeholder`) and the section; the template must render them back into the prompt.
struct StepParts {
  std::string problem, state, section;
};
std::optional<StepParts> step_parts(const Seq& s, const readers::Template& t, const std::string& tag,
                                    const std::string& placeholder) {
  auto problem = between(s.prompt, "<problem>\n", "\n</problem>");
  auto state = between(s.prompt, "<" + tag + ">\n", "\n</" + tag + ">");
  auto section = between(s.prompt, "<section>\n", "\n</section>");
  EXPECT_TRUE(problem && state && section) << s.prompt;
  if (!problem || !state || !section) return std::nullopt;
  EXPECT_EQ(s.prompt, readers::render(t, {{"problem", *problem}, {placeholder, *state}, {"chunk", *section}}));
  return StepParts{*problem, *state, *section};
}

// What the problem asks: RULER's single-needle question or the passkey question.
struct Query {
  bool passkey = false;
  std::string type, key;  // "number" / "uuid"
};

std::optional<Query> parse_problem(const std::string& p) {
  if (p == "What is the pass key?") return Query{true, "", ""};
  static const std::regex re("What is the special magic (number|uuid) for ([a-z]+-[a-z]+) mentioned in the provided text\\?");
  std::smatch m;
  if (!std::regex_match(p, m, re)) return std::nullopt;
  return Query{false, m[1].str(), m[2].str()};
}

struct Found {
  std::string sentence, value;
};

// The queried needle in a text, in the benchmark's needle wording.
std::optional<Found> find_needle(const std::string& text, const Query& q) {
  if (q.passkey) {
    const size_t a = text.find("The pass key is ");
    if (a == std::string::npos) return std::nullopt;
    const size_t vs = a + 16, ve = text.find('.', vs);
    if (ve == std::string::npos) return std::nullopt;
    const std::string v = text.substr(vs, ve - vs);
    const std::string rest = ". Remember it. " + v + " is the pass key.";
    EXPECT_EQ(text.compare(ve, rest.size(), rest), 0) << text.substr(a);
    return Found{text.substr(a, ve + rest.size() - a), v};
  }
  const std::string head = "One of the special magic " + q.type + "s for " + q.key + " is: ";
  const size_t a = text.find(head);
  if (a == std::string::npos) return std::nullopt;
  EXPECT_EQ(text.find(head, a + 1), std::string::npos);  // the key's needle occurs once
  const size_t vs = a + head.size(), ve = text.find('.', vs);
  if (ve == std::string::npos) return std::nullopt;
  return Found{text.substr(a, ve + 1 - a), text.substr(vs, ve - vs)};
}

size_t count(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + 1)) ++n;
  return n;
}

struct Stats {
  int in_chunk = 0, not_in_chunk = 0, from_memory = 0, no_memory = 0, other_memory = 0;
  int distractors = 0, passkey = 0, uuid = 0, number = 0, samples = 0, two_in_memory = 0;
};

// Draws samples of `task` over vocabularies, lengths, steps and seeds; `check` gets the decoded
// sequence.
template <class F>
void for_samples(const std::string& task, F check,
                 const std::vector<std::pair<bool, int64_t>>& configs = {{false, 640}, {false, 1024}, {true, 1024}}) {
  for (const auto& [shipped, max_len] : configs) {
    SCOPED_TRACE(testing::Message() << (shipped ? "shipped vocabulary" : "stories260K") << ", max_len " << max_len);
    const Tokenizer& tok = vocab(shipped);
    auto c = make(tok, task, 256, max_len);
    ASSERT_TRUE(c);
    std::vector<int32_t> tk(static_cast<size_t>(max_len)), tg(static_cast<size_t>(max_len));
    for (int64_t step : {0, 25, 100})
      for (uint64_t seed = 1; seed <= 12; ++seed) {
        Rng rng(seed * 1000 + static_cast<uint64_t>(step));
        auto s = c->sample(rng, step, tk.data(), tg.data());
        ASSERT_TRUE(s) << task << ": " << s.error().message;
        EXPECT_EQ(s->task, task);
        ASSERT_LE(s->n, max_len);
        if (step >= 50) {
          EXPECT_LE(s->n, c->max_len_at(step));
        }
        const Seq q = split(tok, tk, tg, s->n);
        check(q, max_len, tok);
      }
  }
}

// The question, from the prompt; counts the kinds.
Query query_of(const std::string& problem, Stats& st) {
  auto q = parse_problem(problem);
  EXPECT_TRUE(q) << problem;
  if (!q) return {};
  st.passkey += q->passkey;
  st.uuid += q->type == "uuid";
  st.number += q->type == "number";
  return *q;
}

// A step whose state (memory or notes) is empty, the queried sentence or another key's, and whose
// chunk holds the needle or not: every case and question kind occurred.
void expect_every_case(const Stats& st) {
  EXPECT_GT(st.in_chunk, st.samples / 5);
  EXPECT_GT(st.not_in_chunk, st.samples / 5);
  EXPECT_GT(st.from_memory, 0);
  EXPECT_GT(st.no_memory, 0);
  EXPECT_GT(st.other_memory, 0);
  EXPECT_GT(st.distractors, 0);
  EXPECT_GT(st.passkey, 0);
}

TEST(ReaderTasks, ParseNotInDefault) {
  auto c = parse_curriculum("mem_update=2,mem_answer,map_answer=0.5");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(curriculum_to_string(*c), "mem_update=2,mem_answer=1,map_answer=0.5");
  auto d = parse_curriculum("default");
  ASSERT_TRUE(d);
  for (const auto& t : *d) {
    EXPECT_NE(t.name, "mem_update");
    EXPECT_NE(t.name, "mem_answer");
    EXPECT_NE(t.name, "map_answer");
  }
}

// mem_update: the new memory is the queried needle sentence when the section holds it, else
// the previous memory when that holds it, else "No previous memory".
TEST(ReaderTasks, MemUpdateCarriesTheRelevantSentence) {
  const readers::Template t = load_template("memagent_update", {"problem", "memory", "chunk"});
  Stats st;
  for_samples("mem_update", [&](const Seq& s, int64_t max_len, const Tokenizer& tok) {
    ++st.samples;
    const auto parts = step_parts(s, t, "memory", "memory");
    ASSERT_TRUE(parts);
    const std::string *problem = &parts->problem, *memory = &parts->state, *section = &parts->section;
    const Query q = query_of(*problem, st);
    const auto in_chunk = find_needle(*section, q);
    const auto in_memory = find_needle(*memory, q);
    std::string expected;
    if (in_chunk) {
      expected = in_chunk->sentence;
      ++st.in_chunk;
    } else {
      ++st.not_in_chunk;
      if (in_memory) {
        expected = *memory;
        ++st.from_memory;
      } else {
        expected = "No previous memory";
        ++(*memory == "No previous memory" ? st.no_memory : st.other_memory);
      }
    }
    if (in_chunk && in_memory) ADD_FAILURE() << "the queried needle is both in the memory and in the chunk";
    EXPECT_EQ(s.reply, expected) << s.prompt;
    st.distractors += count(*section, "One of the special magic") > (in_chunk && !q.passkey ? 1u : 0u);
    // The chunk is what the memagent reader gives a window of this size at most (5000/8192).
    const int64_t chunk_tokens = static_cast<int64_t>(tok.encode(*section, false, false).size());
    EXPECT_LE(chunk_tokens, max_len * 5000 / 8192 + 8);
  });
  expect_every_case(st);
  EXPECT_GT(st.uuid, 0);
  EXPECT_GT(st.number, 0);
}

// mem_carry: the memory holds the queried sentence, the section does not; the reply is the
// memory as it was. The essay is the haystack more often than the noise sentences.
TEST(ReaderTasks, MemCarryCopiesTheMemory) {
  const readers::Template t = load_template("memagent_update", {"problem", "memory", "chunk"});
  Stats st;
  int essay = 0, noise = 0;
  for_samples("mem_carry", [&](const Seq& s, int64_t max_len, const Tokenizer& tok) {
    ++st.samples;
    const auto parts = step_parts(s, t, "memory", "memory");
    ASSERT_TRUE(parts);
    const std::string *problem = &parts->problem, *memory = &parts->state, *section = &parts->section;
    const Query q = query_of(*problem, st);
    const auto in_memory = find_needle(*memory, q);
    ASSERT_TRUE(in_memory) << *memory;
    EXPECT_EQ(in_memory->sentence, *memory);
    EXPECT_FALSE(find_needle(*section, q)) << *section;
    EXPECT_EQ(s.reply, *memory);
    st.distractors += count(*section, "One of the special magic") > 0;
    if (!q.passkey) ++(section->find("The grass is green.") == std::string::npos ? essay : noise);
    const int64_t chunk_tokens = static_cast<int64_t>(tok.encode(*section, false, false).size());
    EXPECT_LE(chunk_tokens, max_len * 5000 / 8192 + 8);
  });
  EXPECT_GT(st.distractors, 0);
  EXPECT_GT(st.passkey, 0);
  EXPECT_GT(essay, noise);
  EXPECT_GT(noise, 0);
}

// RULER's variable-tracking statements in a text, in order: (variable, right-hand side).
std::vector<std::pair<std::string, std::string>> vt_statements(const std::string& text) {
  static const std::regex re("VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|([0-9]{5}))");
  std::vector<std::pair<std::string, std::string>> out;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
    out.emplace_back((*it)[1].str(), (*it)[3].matched ? (*it)[3].str() : (*it)[4].str());
  return out;
}

std::string vt_value(const std::string& problem) {
  static const std::regex re("Question: Find all variables that are assigned the value ([0-9]{5}) in the text above\\.");
  std::smatch m;
  EXPECT_TRUE(std::regex_match(problem, m, re)) << problem;
  return m.size() > 1 ? m[1].str() : "";
}

// vt_update: the new memory is every statement of the memory and the section that follows the
// chain from the question's value, in order, one a line (RULER's text, its trailing spaces
// inside the memory kept), or "No previous memory" while there is none.
TEST(ReaderTasks, VtUpdateFollowsTheChain) {
  const readers::Template t = load_template("memagent_update", {"problem", "memory", "chunk"});
  int fresh = 0, none_new = 0, empty_memory = 0, full = 0, samples = 0;
  for_samples("vt_update", [&](const Seq& s, int64_t max_len, const Tokenizer& tok) {
    ++samples;
    const auto parts = step_parts(s, t, "memory", "memory");
    ASSERT_TRUE(parts);
    const std::string *problem = &parts->problem, *memory = &parts->state, *section = &parts->section;
    std::set<std::string> tracked = {vt_value(*problem)};
    std::vector<std::string> kept;
    auto follow = [&](const std::string& text) {
      int n = 0;
      for (const auto& [var, rhs] : vt_statements(text)) {
        EXPECT_TRUE(tracked.count(rhs)) << "a statement off the chain: " << var << " = " << rhs;
        tracked.insert(var);
        kept.push_back(std::isdigit(static_cast<unsigned char>(rhs[0])) ? "VAR " + var + " = " + rhs
                                                                        : "VAR " + var + " = VAR " + rhs + " ");
        ++n;
      }
      return n;
    };
    if (*memory == "No previous memory") ++empty_memory;
    else EXPECT_GT(follow(*memory), 0) << *memory;
    full += kept.size() == 5;
    const int n_new = follow(*section);
    ++(n_new > 0 ? fresh : none_new);
    // Each new statement sits on a line of its own in the section.
    // RULER's document: noise blocks one a line (the first may open mid-block), statements
    // between them.
    static const std::string kBlock = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
    std::istringstream lines_in(*section);
    bool first_block = true;
    for (std::string l; std::getline(lines_in, l);) {
      if (l.rfind("VAR ", 0) == 0) continue;
      if (first_block) EXPECT_TRUE(l.size() <= kBlock.size() && kBlock.compare(kBlock.size() - l.size(), l.size(), l) == 0) << l;
      else EXPECT_EQ(l, kBlock);
      first_block = false;
    }
    for (const auto& [var, rhs] : vt_statements(*section)) {
      const size_t at = section->find("VAR " + var + " = ");
      EXPECT_TRUE(at == 0 || (*section)[at - 1] == '\n') << *section;
      const size_t eol = section->find('\n', at);
      static const std::regex line("VAR [A-Z]{5} = (VAR [A-Z]{5} |[0-9]{5})");
      EXPECT_TRUE(std::regex_match(section->substr(at, eol == std::string::npos ? std::string::npos : eol - at), line))
          << *section;
    }
    std::string expected;
    for (const std::string& k : kept) expected += (expected.empty() ? "" : "\n") + k;
    while (!expected.empty() && expected.back() == ' ') expected.pop_back();
    EXPECT_EQ(s.reply, kept.empty() ? "No previous memory" : expected) << s.prompt;
    EXPECT_LE(kept.size(), 5u);
    const int64_t chunk_tokens = static_cast<int64_t>(tok.encode(*section, false, false).size());
    EXPECT_LE(chunk_tokens, max_len * 5000 / 8192 + 8);
  });
  EXPECT_GT(fresh, samples / 5);
  EXPECT_GT(none_new, samples / 5);
  EXPECT_GT(empty_memory, 0);
  EXPECT_GT(full, 0);
}

// vt_open: the document's first chunk as the bench gives it to memagent. The section opens
// with RULER's one-shot example: the instruction, noise blocks with a chain of 3-letter names
// from another value (the most blocks that keep the example's prompt within 500 tokens, at
// least 5), the question and answer prefix, a space, its answer, two new lines; then the
// instruction again and the task's noise blocks with its chain's first statements. The memory
// is empty; the reply is the task chain's statements in the section, one a line, never the
// example's, or "No previous memory".
TEST(ReaderTasks, VtOpenCopiesTheTaskChainNotTheExample) {
  const readers::Template t = load_template("memagent_update", {"problem", "memory", "chunk"});
  static const std::string kHead =
      "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
  static const std::string kBlock = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
  static const std::regex ex_stmt("VAR ([A-Z]{3}) = (VAR ([A-Z]{3}) |([0-9]{5}))");
  static const std::regex ex_tail(
      "\\nQuestion: Find all variables that are assigned the value ([0-9]{5}) in the text above\\. Answer: According to "
      "the chain\\(s\\) of variable assignment in the text above, 5 variables are assigned the value ([0-9]{5}), they "
      "are:  ([A-Z]{3}) ([A-Z]{3}) ([A-Z]{3}) ([A-Z]{3}) ([A-Z]{3})\\n\\n");
  int none = 0, some = 0;
  for_samples("vt_open", [&](const Seq& s, int64_t, const Tokenizer& tok) {
    const auto parts = step_parts(s, t, "memory", "memory");
    ASSERT_TRUE(parts);
    EXPECT_EQ(parts->state, "No previous memory");
    const std::string& sec = parts->section;
    const std::string value = vt_value(parts->problem);
    // The example: from the section's start to the second instruction.
    ASSERT_EQ(sec.compare(0, kHead.size(), kHead), 0) << sec;
    const size_t second = sec.find(kHead, kHead.size());
    ASSERT_NE(second, std::string::npos) << sec;
    const std::string example = sec.substr(0, second), task = sec.substr(second + kHead.size());
    const size_t q = example.find("\nQuestion: ");
    ASSERT_NE(q, std::string::npos);
    std::smatch m;
    const std::string tail = example.substr(q);
    ASSERT_TRUE(std::regex_match(tail, m, ex_tail)) << tail;
    EXPECT_EQ(m[1].str(), m[2].str());
    EXPECT_NE(m[1].str(), value);
    // Its context: noise blocks and its chain's statements, one a line, in chain order.
    std::istringstream in(example.substr(kHead.size(), q - kHead.size()));
    std::string tracked = m[1].str();
    int blocks = 0;
    size_t hop = 0;
    for (std::string l; std::getline(in, l);) {
      std::smatch st;
      if (std::regex_match(l, st, ex_stmt)) {
        EXPECT_EQ(st[3].matched ? st[3].str() : st[4].str(), tracked) << l;
        EXPECT_EQ(st[1].str(), m[3 + hop].str());  // the answer names the chain in order
        tracked = st[1].str();
        ++hop;
      } else {
        EXPECT_EQ(l, kBlock);
        ++blocks;
      }
    }
    EXPECT_EQ(hop, 5u);
    // RULER's block count: the prompt (all but the answer) within 500 tokens, and one block
    // more would pass it, or the floor of 5. RULER counts with the run's first names and the
    // value 12345, which the sample's replace, so the counts here are within a few tokens.
    // (the answer prefix ends in a space, and the answer follows after another)
    const std::string ex_prompt = example.substr(0, example.size() - 2 - 3 * 5 - 4 - 1);
    ASSERT_EQ(ex_prompt.substr(ex_prompt.size() - 5), "are: ") << ex_prompt;
    const int64_t n_ex = static_cast<int64_t>(tok.encode(ex_prompt, false, false).size());
    const int64_t n_more = static_cast<int64_t>(
        tok.encode(kHead + kBlock + "\n" + ex_prompt.substr(kHead.size()), false, false).size());
    EXPECT_GE(blocks, 5);
    if (blocks > 5) EXPECT_LE(n_ex, 500 + 6);
    EXPECT_GT(n_more, 500 - 6) << blocks;
    // The task's part: noise blocks, and the chain's first statements from the value.
    std::vector<std::string> kept;
    std::string from = value;
    for (const auto& [var, rhs] : vt_statements(task)) {
      EXPECT_EQ(rhs, from);
      from = var;
      kept.push_back(std::isdigit(static_cast<unsigned char>(rhs[0])) ? "VAR " + var + " = " + rhs
                                                                      : "VAR " + var + " = VAR " + rhs + " ");
    }
    std::istringstream tin(task);
    for (std::string l; std::getline(tin, l);)
      if (l.rfind("VAR ", 0) != 0) EXPECT_EQ(l, kBlock);
    std::string expected;
    for (const std::string& k : kept) expected += (expected.empty() ? "" : "\n") + k;
    while (!expected.empty() && expected.back() == ' ') expected.pop_back();
    EXPECT_LE(kept.size(), 2u);
    EXPECT_EQ(s.reply, kept.empty() ? "No previous memory" : expected) << sec;
    ++(kept.empty() ? none : some);
  }, {{false, 1536}, {true, 1024}});  // the example alone is about 500 tokens
  EXPECT_GT(none, 0);
  EXPECT_GT(some, 0);
}

// Expects `dec` to score exactly the decisions of a reply whose every token `full` scores (-1
// elsewhere), with full's targets: the first reply token, the first whitespace token after a
// line's text (a hop's trailing space, or the new line: go on with another statement), and the
// EOS (stop). Returns how many line ends it saw.
int expect_decisions(const Tokenizer& tok, const int32_t* full, const int32_t* dec, int64_t n, int64_t n_scored,
                     const std::string& where) {
  auto blank = [&](int32_t id) {
    const std::string p = tok.token_to_piece(id);  // decode() drops a lone leading space
    return !p.empty() && p.find_first_not_of(" \n") == std::string::npos;
  };
  int64_t first = -1, n_dec = 0;
  int lines = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (full[i] < 0) {
      EXPECT_LT(dec[i], 0) << where << " t=" << i;
      continue;
    }
    const bool is_first = first < 0;
    if (is_first) first = i;
    // The first of a run of whitespace tokens that holds a new line.
    bool newline = false;
    for (int64_t k = i; k < n && full[k] >= 0 && blank(full[k]); ++k)
      newline |= tok.token_to_piece(full[k]).find('\n') != std::string::npos;
    const bool line_end = newline && !is_first && !blank(full[i - 1]);
    const bool decides = is_first || line_end || full[i] == tok.eos();
    lines += line_end;
    EXPECT_EQ(dec[i], decides ? full[i] : -1) << where << " t=" << i;
    n_dec += decides;
  }
  EXPECT_EQ(n_scored, n_dec) << where;
  return lines;
}

// vt_decide: vt_update's very sequence, scored only at its decisions (above), each with
// vt_update's target there.
TEST(ReaderTasks, VtDecideScoresWhereTheReplyGoesOnOrStops) {
  for (const auto& [shipped, max_len] : std::vector<std::pair<bool, int64_t>>{{false, 640}, {true, 1024}}) {
    const Tokenizer& tok = vocab(shipped);
    auto upd = make(tok, "vt_update", 256, max_len), dec = make(tok, "vt_decide", 256, max_len);
    ASSERT_TRUE(upd && dec);
    std::vector<int32_t> tk(static_cast<size_t>(max_len)), tg(tk.size()), tk2(tk.size()), tg2(tk.size());
    int lines = 0;
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      Rng r1(seed), r2(seed);
      auto a = upd->sample(r1, 100, tk.data(), tg.data());
      auto b = dec->sample(r2, 100, tk2.data(), tg2.data());
      ASSERT_TRUE(a && b);
      ASSERT_EQ(a->n, b->n);
      EXPECT_TRUE(std::equal(tk.begin(), tk.begin() + a->n, tk2.begin()));
      lines += expect_decisions(tok, tg.data(), tg2.data(), a->n, b->n_scored, "seed " + std::to_string(seed));
      EXPECT_LT(b->n_scored, a->n_scored);
    }
    EXPECT_GT(lines, 0);
  }
}

// vt_first: a memagent update whose memory holds no statement or only the chain's first (both
// occur), scored at the reply's decisions as vt_decide is. The reply starts after the
// template's "Updated memory:" line.
TEST(ReaderTasks, VtFirstDecidesAfterTheFirstStatement) {
  for (const auto& [shipped, max_len] : std::vector<std::pair<bool, int64_t>>{{false, 640}, {true, 1024}}) {
    const Tokenizer& tok = vocab(shipped);
    auto c = make(tok, "vt_first", 256, max_len);
    ASSERT_TRUE(c);
    std::vector<int32_t> tk(static_cast<size_t>(max_len)), tg(tk.size()), full(tk.size());
    int empty = 0, one = 0, lines = 0;
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      Rng rng(seed);
      auto s = c->sample(rng, 100, tk.data(), tg.data());
      ASSERT_TRUE(s);
      int64_t first = 0;
      while (first < s->n && tg[first] < 0) ++first;
      ASSERT_LT(first, s->n);
      const std::string prompt = tok.decode(std::vector<int32_t>(tk.begin(), tk.begin() + first + 1));
      ASSERT_TRUE(prompt.size() > 16 && prompt.compare(prompt.size() - 16, 16, "Updated memory:\n") == 0) << prompt;
      const auto memory = between(prompt, "<memory>\n", "\n</memory>");
      ASSERT_TRUE(memory);
      const size_t k = vt_statements(*memory).size();
      EXPECT_LE(k, 1u) << *memory;
      ++(k == 0 ? empty : one);
      if (k == 0) EXPECT_EQ(*memory, "No previous memory");
      for (int64_t t = 0; t < s->n; ++t) full[t] = t < first ? -1 : t + 1 < s->n ? tk[t + 1] : tok.eos();
      lines += expect_decisions(tok, full.data(), tg.data(), s->n, s->n_scored, "seed " + std::to_string(seed));
    }
    EXPECT_GT(empty, 0);
    EXPECT_GT(one, 0);
    EXPECT_GT(lines, 0);
  }
}

// vt_answer: the memory holds the chain's first statements; the reply boxes their variables in
// chain order.
TEST(ReaderTasks, VtAnswerBoxesTheVariables) {
  const readers::Template t = load_template("memagent_final", {"problem", "memory"});
  int whole = 0, part = 0;
  for_samples("vt_answer", [&](const Seq& s, int64_t, const Tokenizer&) {
    auto problem = between(s.prompt, "<problem>\n", "\n</problem>");
    auto memory = between(s.prompt, "<memory>\n", "\n</memory>");
    ASSERT_TRUE(problem && memory) << s.prompt;
    EXPECT_EQ(s.prompt, readers::render(t, {{"problem", *problem}, {"memory", *memory}}));
    std::string tracked = vt_value(*problem), names;
    const auto st = vt_statements(*memory);
    ASSERT_FALSE(st.empty()) << *memory;
    for (const auto& [var, rhs] : st) {
      EXPECT_EQ(rhs, tracked);
      tracked = var;
      names += (names.empty() ? "" : " ") + var;
    }
    ++(st.size() == 5 ? whole : part);
    EXPECT_EQ(s.reply, "\\boxed{" + names + "}");
  });
  EXPECT_GT(whole, 0);
  EXPECT_GT(part, 0);
}

// mem_answer: the memory holds the queried sentence; the reply is \boxed{value}.
TEST(ReaderTasks, MemAnswerBoxesTheValue) {
  const readers::Template t = load_template("memagent_final", {"problem", "memory"});
  Stats st;
  for_samples("mem_answer", [&](const Seq& s, int64_t, const Tokenizer&) {
    ++st.samples;
    auto problem = between(s.prompt, "<problem>\n", "\n</problem>");
    auto memory = between(s.prompt, "<memory>\n", "\n</memory>");
    ASSERT_TRUE(problem && memory) << s.prompt;
    EXPECT_EQ(s.prompt, readers::render(t, {{"problem", *problem}, {"memory", *memory}}));
    const Query q = query_of(*problem, st);
    const auto f = find_needle(*memory, q);
    ASSERT_TRUE(f) << s.prompt;
    st.two_in_memory += count(*memory, "One of the special magic") > (q.passkey ? 0u : 1u);
    EXPECT_EQ(s.reply, "\\boxed{" + f->value + "}");
  });
  EXPECT_GT(st.two_in_memory, 0);
  EXPECT_LT(st.two_in_memory, st.samples);
  EXPECT_GT(st.passkey, 0);
}

size_t distinct_digits(const std::string& v) { return std::set<char>(v.begin(), v.end()).size(); }

// hard_number: the length asked for, no leading zero, 2 to 4 distinct digits drawn from a set
// that varies (every digit and every set size occur).
TEST(ReaderTasks, HardNumbersComeFromTwoToFourDigits) {
  tasks::Rng rng(7);
  std::set<char> seen;
  std::set<size_t> sizes;
  for (int i = 0; i < 2000; ++i) {
    const int n = i % 2 ? 7 : 5;
    const std::string v = hard_number(rng, n);
    ASSERT_EQ(v.size(), static_cast<size_t>(n));
    EXPECT_NE(v[0], '0') << v;
    for (char c : v) EXPECT_TRUE(c >= '0' && c <= '9') << v;
    EXPECT_LE(distinct_digits(v), 4u) << v;
    sizes.insert(distinct_digits(v));
    seen.insert(v.begin(), v.end());
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_TRUE(sizes.count(2) && sizes.count(3) && sizes.count(4));
}

// --cur-hard-values: at 1 every number value of the reader tasks (needles and pass keys) has at
// most 4 distinct digits; at 0 the values are RULER's uniform digits, most with 5 or more.
TEST(ReaderTasks, HardValuesReachTheReaderTasks) {
  const Tokenizer& tok = vocab(true);
  for (const std::string task : {"mem_answer", "smooth_answer", "sculptor_answer"}) {
    SCOPED_TRACE(task);
    auto hard = make(tok, task, 256, 1024, 1.0), plain = make(tok, task, 256, 1024, 0.0);
    ASSERT_TRUE(hard && plain);
    int hard_numbers = 0, plain_wide = 0, plain_numbers = 0;
    std::vector<int32_t> tk(1024), tg(1024), tk2(1024), tg2(1024);
    for (uint64_t seed = 1; seed <= 60; ++seed) {
      static const std::regex boxed("\\\\boxed\\{([0-9]+)\\}");
      std::smatch m;
      Rng r1(seed), r2(seed);
      auto a = hard->sample(r1, 100, tk.data(), tg.data());
      ASSERT_TRUE(a) << a.error().message;
      const Seq sa = split(tok, tk, tg, a->n);
      if (std::regex_match(sa.reply, m, boxed)) {
        ++hard_numbers;
        EXPECT_LE(distinct_digits(m[1].str()), 4u) << sa.reply;
      }
      auto b = plain->sample(r2, 100, tk2.data(), tg2.data());
      ASSERT_TRUE(b) << b.error().message;
      const Seq sb = split(tok, tk2, tg2, b->n);
      if (std::regex_match(sb.reply, m, boxed)) {
        ++plain_numbers;
        plain_wide += distinct_digits(m[1].str()) > 4;
      }
    }
    EXPECT_GT(hard_numbers, 20);
    EXPECT_GT(plain_wide, plain_numbers / 3);
  }
}

// map_answer: the reply is the queried value when the section holds its needle, else "none".
TEST(ReaderTasks, MapAnswerGivesTheValueOrNone) {
  const readers::Template t = load_template("mapreduce_map", {"problem", "chunk"});
  Stats st;
  for_samples("map_answer", [&](const Seq& s, int64_t max_len, const Tokenizer& tok) {
    ++st.samples;
    auto problem = between(s.prompt, "<problem>\n", "\n</problem>");
    auto section = between(s.prompt, "<section>\n", "\n</section>");
    ASSERT_TRUE(problem && section) << s.prompt;
    EXPECT_EQ(s.prompt, readers::render(t, {{"problem", *problem}, {"chunk", *section}}));
    const Query q = query_of(*problem, st);
    const auto f = find_needle(*section, q);
    ++(f ? st.in_chunk : st.not_in_chunk);
    EXPECT_EQ(s.reply, f ? f->value : "none") << s.prompt;
    st.distractors += count(*section, "One of the special magic") > (f && !q.passkey ? 1u : 0u);
    // The map prompt leaves the reader's 32 answer tokens free.
    const int64_t prompt_tokens = static_cast<int64_t>(tok.encode(s.prompt, true, false).size());
    EXPECT_LE(prompt_tokens + 32, max_len);
  });
  EXPECT_GT(st.in_chunk, st.samples / 5);
  EXPECT_GT(st.not_in_chunk, st.samples / 5);
  EXPECT_GT(st.distractors, 0);
  EXPECT_GT(st.passkey, 0);
  EXPECT_GT(st.uuid, 0);
}

// Smooth Reading's notes: "none yet", or "[chunk] entry" lines with ascending chunk numbers.
std::vector<std::string> parse_notes(const std::string& notes) {
  std::vector<std::string> out;
  if (notes == "none yet") return out;
  static const std::regex line("\\[([0-9]+)\\] (.*)");
  std::istringstream in(notes);
  long last = 0;
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    EXPECT_TRUE(std::regex_match(l, m, line)) << notes;
    if (m.size() < 3) continue;
    const long at = std::stol(m[1].str());
    EXPECT_GT(at, last) << notes;
    last = at;
    out.push_back(m[2].str());
  }
  return out;
}

// smooth_note: the note is the queried needle sentence when the section holds it, else "none"
// (whatever the notes so far hold).
TEST(ReaderTasks, SmoothNoteCopiesTheSentenceOrSaysNone) {
  const readers::Template t = load_template("smooth_read", {"problem", "summary", "chunk"});
  Stats st;
  for_samples("smooth_note", [&](const Seq& s, int64_t max_len, const Tokenizer& tok) {
    ++st.samples;
    const auto parts = step_parts(s, t, "notes", "summary");
    ASSERT_TRUE(parts);
    const std::string *problem = &parts->problem, *notes = &parts->state, *section = &parts->section;
    const Query q = query_of(*problem, st);
    const auto in_chunk = find_needle(*section, q);
    const std::vector<std::string> entries = parse_notes(*notes);
    bool queried_in_notes = false;
    for (const std::string& e : entries) queried_in_notes |= find_needle(e, q).has_value();
    if (entries.empty()) ++st.no_memory;
    else ++(queried_in_notes ? st.from_memory : st.other_memory);
    if (in_chunk && queried_in_notes) ADD_FAILURE() << "the queried needle is both in the notes and in the chunk";
    ++(in_chunk ? st.in_chunk : st.not_in_chunk);
    EXPECT_EQ(s.reply, in_chunk ? in_chunk->sentence : "none") << s.prompt;
    st.distractors += count(*section, "One of the special magic") > (in_chunk && !q.passkey ? 1u : 0u);
    // The section leaves the reader's notes (a quarter of the window) and entry (64) free.
    const int64_t chunk_tokens = static_cast<int64_t>(tok.encode(*section, false, false).size());
    EXPECT_LE(chunk_tokens, max_len - max_len / 4 - 64);
  });
  expect_every_case(st);
}

// smooth_answer: the notes hold the queried sentence (sometimes among others); the reply is
// \boxed{value}.
TEST(ReaderTasks, SmoothAnswerBoxesTheValue) {
  const readers::Template t = load_template("smooth_final", {"problem", "summary"});
  Stats st;
  for_samples("smooth_answer", [&](const Seq& s, int64_t, const Tokenizer&) {
    ++st.samples;
    auto problem = between(s.prompt, "<problem>\n", "\n</problem>");
    auto notes = between(s.prompt, "<notes>\n", "\n</notes>");
    ASSERT_TRUE(problem && notes) << s.prompt;
    EXPECT_EQ(s.prompt, readers::render(t, {{"problem", *problem}, {"summary", *notes}}));
    const Query q = query_of(*problem, st);
    std::optional<Found> f;
    const std::vector<std::string> entries = parse_notes(*notes);
    for (const std::string& e : entries)
      if (auto g = find_needle(e, q)) f = g;
    ASSERT_TRUE(f) << s.prompt;
    st.two_in_memory += entries.size() > 1;
    EXPECT_EQ(s.reply, "\\boxed{" + f->value + "}");
  });
  EXPECT_GT(st.two_in_memory, 0);
  EXPECT_LT(st.two_in_memory, st.samples);
  EXPECT_GT(st.passkey, 0);
}

// ---- Sculptor (text protocol): sculptor_search, sculptor_answer ----

// The queried key, from the problem: the word or UUID key of a RULER question, "pass key".
struct SculptorQuery {
  bool passkey = false;
  std::string type, key;  // "number" / "uuid"
};

std::optional<SculptorQuery> parse_sculptor_problem(const std::string& p) {
  if (p == "What is the pass key?") return SculptorQuery{true, "", "pass key"};
  static const std::regex re(
      "What is the special magic (number|uuid) for ([a-z]+-[a-z]+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}) "
      "mentioned in the provided text\\?");
  std::smatch m;
  if (!std::regex_match(p, m, re)) return std::nullopt;
  return SculptorQuery{false, m[1].str(), m[2].str()};
}

// The first message: the sculptor_text template (parsed from its file) re-rendered with the
// problem and the number of fragments found in the prompt, and 512 tokens per fragment.
// Returns the problem and the number of fragments; `rest` gets what follows the message.
struct Intro {
  std::string problem;
  int64_t fragments = -1;
};

std::optional<Intro> check_intro(const std::string& prompt, std::string* rest) {
  static const readers::Template t = load_template("sculptor_text", {"problem", "fragments", "fragment_tokens"});
  const size_t a = prompt.find("\nProblem: ");
  if (a == std::string::npos) return std::nullopt;
  const size_t b = prompt.find('\n', a + 10);
  if (b == std::string::npos) return std::nullopt;
  Intro in;
  in.problem = prompt.substr(a + 10, b - a - 10);
  static const std::regex fr("cut into ([0-9]+) fragments of about 512 tokens");
  std::smatch m;
  const std::string head = prompt.substr(0, a);
  if (!std::regex_search(head, m, fr)) return std::nullopt;
  in.fragments = std::stoll(m[1].str());
  const std::string rendered = readers::render(
      t, {{"problem", in.problem}, {"fragments", std::to_string(in.fragments)}, {"fragment_tokens", "512"}});
  EXPECT_EQ(prompt.compare(0, rendered.size(), rendered), 0) << prompt;
  if (prompt.compare(0, rendered.size(), rendered) != 0) return std::nullopt;
  *rest = prompt.substr(rendered.size());
  return in;
}

struct SculptorStats {
  int samples = 0, passkey = 0, uuid_key = 0, word_key = 0, small = 0, large = 0;
  int repeated = 0, distractors = 0, cut_start = 0, cut_end = 0, more_than_shown = 0;
};

SculptorQuery sculptor_query(const std::string& problem, SculptorStats& st) {
  auto q = parse_sculptor_problem(problem);
  EXPECT_TRUE(q) << problem;
  if (!q) return {};
  st.passkey += q->passkey;
  st.uuid_key += !q->passkey && q->key.size() == 36;
  st.word_key += !q->passkey && q->key.size() != 36;
  return *q;
}

TEST(ReaderTasks, ParseSculptorTasksNotInDefault) {
  auto c = parse_curriculum("sculptor_search=2,sculptor_answer");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(curriculum_to_string(*c), "sculptor_search=2,sculptor_answer=1");
  auto d = parse_curriculum("default");
  ASSERT_TRUE(d);
  for (const auto& t : *d) {
    EXPECT_NE(t.name, "sculptor_search");
    EXPECT_NE(t.name, "sculptor_answer");
  }
  auto bad = parse_curriculum("sculptor");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("sculptor_answer"), std::string::npos) << bad.error().message;
}

// sculptor_search: the prompt is the first message alone; the reply is "search KEY".
const std::vector<std::pair<bool, int64_t>> kSculptorConfigs = {{false, 1024}, {true, 640}, {true, 1024}};

TEST(ReaderTasks, SculptorSearchCallsTheKey) {
  SculptorStats st;
  for_samples("sculptor_search", [&](const Seq& s, int64_t, const Tokenizer&) {
    ++st.samples;
    std::string rest;
    auto in = check_intro(s.prompt, &rest);
    ASSERT_TRUE(in) << s.prompt;
    EXPECT_EQ(rest, "") << s.prompt;  // nothing after the first message
    EXPECT_GE(in->fragments, 2);
    EXPECT_LE(in->fragments, 20000);
    st.small += in->fragments < 20;
    st.large += in->fragments > 1000;
    const SculptorQuery q = sculptor_query(in->problem, st);
    EXPECT_EQ(s.reply, "search " + q.key) << s.prompt;
  }, kSculptorConfigs);
  EXPECT_GT(st.passkey, 0);
  EXPECT_GT(st.uuid_key, 0);
  EXPECT_GT(st.word_key, 0);
  EXPECT_GT(st.small, 0);  // {fragments} spans its range
  EXPECT_GT(st.large, 0);
}

// sculptor_answer: the first message, the call "search KEY", then "\nResult: " and the search
// result: "N match(es) for 'KEY'" and one "[fragment F] ...TEXT..." line per match shown (at
// most 3; TEXT the match and 120 characters either side, fewer at the document's ends). The
// reply is \boxed{VALUE}, VALUE the one the KEY's needle sentence in the result gives.
TEST(ReaderTasks, SculptorAnswerBoxesTheSearchedValue) {
  SculptorStats st;
  for_samples("sculptor_answer", [&](const Seq& s, int64_t, const Tokenizer&) {
    ++st.samples;
    std::string rest;
    auto in = check_intro(s.prompt, &rest);
    ASSERT_TRUE(in) << s.prompt;
    const SculptorQuery q = sculptor_query(in->problem, st);
    const std::string call = "search " + q.key;
    ASSERT_EQ(rest.compare(0, call.size() + 9, call + "\nResult: "), 0) << rest;
    ASSERT_FALSE(rest.empty());
    ASSERT_EQ(rest.back(), '\n');
    const std::string result = rest.substr(call.size() + 9, rest.size() - call.size() - 10);
    std::vector<std::string> lines;
    {
      std::istringstream ls(result);
      for (std::string l; std::getline(ls, l);) lines.push_back(l);
    }
    ASSERT_GE(lines.size(), 2u) << result;
    static const std::regex head_re("([0-9]+) (match|matches) for '(.*)'(?: \\(the first ([0-9]+) shown\\))?");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(lines[0], m, head_re)) << lines[0];
    const int64_t total = std::stoll(m[1].str());
    EXPECT_EQ(m[2].str(), total == 1 ? "match" : "matches");
    EXPECT_EQ(m[3].str(), q.key);
    const int64_t shown = static_cast<int64_t>(lines.size()) - 1;
    EXPECT_EQ(shown, std::min<int64_t>(total, 3)) << result;
    if (m[4].matched) {
      EXPECT_EQ(std::stoll(m[4].str()), shown);
      EXPECT_GT(total, shown);
      ++st.more_than_shown;
    } else {
      EXPECT_EQ(total, shown);
    }
    static const std::regex line_re("\\[fragment ([0-9]+)\\] \\.\\.\\.(.*)\\.\\.\\.");
    int64_t last_fragment = -1;
    std::string snippets;
    for (size_t i = 1; i < lines.size(); ++i) {
      ASSERT_TRUE(std::regex_match(lines[i], m, line_re)) << lines[i];
      const int64_t f = std::stoll(m[1].str());
      EXPECT_GE(f, last_fragment);  // in document order
      EXPECT_LT(f, in->fragments);
      last_fragment = f;
      const std::string t = m[2].str();
      EXPECT_EQ(t.find('\t'), std::string::npos);
      // The match with 120 characters either side; fewer only at the document's start (in
      // fragment 0, 120 after the match) or its end (in the last fragment, 120 before).
      const size_t k = q.key.size(), full = 2 * 120 + k;
      EXPECT_LE(t.size(), full) << t;
      if (t.size() == full) {
        EXPECT_EQ(t.compare(120, k, q.key), 0) << t;  // the match in the middle
      } else if (t.size() >= 120 + k && t.compare(t.size() - 120 - k, k, q.key) == 0) {
        EXPECT_EQ(f, 0) << "a snippet cut at the document's start: " << t;
        ++st.cut_start;
      } else {
        EXPECT_EQ(t.compare(120, k, q.key), 0) << t;
        EXPECT_EQ(f, in->fragments - 1) << "a snippet cut at the document's end: " << t;
        ++st.cut_end;
      }
      snippets += t + "\n";
    }
    // The value of the KEY's needle sentences in the result (all copies agree).
    std::vector<std::string> values;
    const std::string head = q.passkey ? "The pass key is " : "One of the special magic " + q.type + "s for " + q.key + " is: ";
    for (size_t a = snippets.find(head); a != std::string::npos; a = snippets.find(head, a + 1)) {
      const size_t vs = a + head.size(), ve = snippets.find('.', vs);
      if (ve == std::string::npos) continue;
      values.push_back(snippets.substr(vs, ve - vs));
    }
    ASSERT_FALSE(values.empty()) << result;
    for (const auto& v : values) EXPECT_EQ(v, values[0]) << result;
    if (q.passkey) {
      EXPECT_NE(snippets.find("The pass key is " + values[0] + ". Remember it. " + values[0] + " is the pass key."),
                std::string::npos)
          << result;
      st.repeated += total > 2;
    } else {
      st.repeated += total > 1;
    }
    // Another key's needle in the neighbourhood.
    const size_t magic = count(snippets, "One of the special magic");
    st.distractors += magic > (q.passkey ? 0u : count(snippets, head));
    EXPECT_EQ(s.reply, "\\boxed{" + values[0] + "}") << s.prompt;
  }, kSculptorConfigs);
  EXPECT_GT(st.passkey, 0);
  EXPECT_GT(st.uuid_key, 0);
  EXPECT_GT(st.word_key, 0);
  EXPECT_GT(st.repeated, 0);
  EXPECT_LT(st.repeated, st.samples / 2);
  EXPECT_GT(st.distractors, 0);
  EXPECT_LT(st.distractors, st.samples / 2);
  EXPECT_GT(st.cut_start, 0);
  EXPECT_GT(st.cut_end, 0);
  EXPECT_GT(st.more_than_shown, 0);
}

}  // namespace
}  // namespace lc::train
