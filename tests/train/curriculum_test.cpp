// The synthetic curriculum: what is scored is exactly the answer (whose text is found in the
// context it was hidden in), targets are the next tokens, draws are reproducible, the length
// ramp holds, bad specs give clear errors, and a curriculum run resumes bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tasks/tasks.h"
#include "gguf/gguf.h"
#include "train/curriculum.h"
#include "train/trainer.h"

namespace lc::train {
namespace {

namespace fs = std::filesystem;

const std::string kVocab = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

struct Vocab {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
};

const Vocab& vocab() {
  static Vocab* v = [] {
    auto* r = new Vocab;
    auto f = gguf::File::open(kVocab);
    LC_CHECK(f.has_value());
    r->file = std::move(f.value());
    auto t = Tokenizer::from_gguf(*r->file);
    LC_CHECK(t.has_value());
    r->tok = std::move(t.value());
    return r;
  }();
  return *v;
}

std::unique_ptr<Curriculum> make(const std::string& spec, int64_t min_len, int64_t max_len, double lm = 0) {
  CurriculumOptions o;
  o.lm_fraction = lm;
  o.tasks = *parse_curriculum(spec);
  o.min_len = min_len;
  o.max_len = max_len;
  o.ramp = 0.5;
  o.total_steps = 100;
  auto c = Curriculum::create(*vocab().tok, o);
  EXPECT_TRUE(c) << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

// The scored tokens of a sequence, as text, and the text of what precedes the first one.
struct Split {
  std::string prompt, scored;
  bool eos_last = false;
};

Split split(const std::vector<int32_t>& tk, const std::vector<int32_t>& tg, int64_t n) {
  const Tokenizer& tok = *vocab().tok;
  Split s;
  int64_t first = -1;
  for (int64_t t = 0; t < n; ++t) {
    if (tg[t] < 0) continue;
    if (first < 0) first = t;
    if (tg[t] == tok.eos()) {
      s.eos_last = t + 1 == n;
      continue;
    }
    s.scored += tok.token_to_piece(tg[t]);
  }
  std::vector<int32_t> head(tk.begin(), tk.begin() + (first < 0 ? n : first + 1));
  s.prompt = tok.decode(head);
  return s;
}

TEST(Curriculum, ParseSpecs) {
  auto d = parse_curriculum("default");
  ASSERT_TRUE(d);
  EXPECT_GE(d->size(), 10u);
  auto c = parse_curriculum("vt=2, recall ,passkey=0.5");
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_EQ(c->size(), 3u);
  EXPECT_EQ((*c)[0].name, "vt");
  EXPECT_DOUBLE_EQ((*c)[0].weight, 2.0);
  EXPECT_DOUBLE_EQ((*c)[1].weight, 1.0);
  EXPECT_EQ(curriculum_to_string(*c), "vt=2,recall=1,passkey=0.5");
  for (const char* bad : {"", "nope", "vt=0", "vt=-1", "vt=x", "vt,vt", "vt,,copy"}) {
    auto e = parse_curriculum(bad);
    EXPECT_FALSE(e) << bad;
    if (!e) {
      EXPECT_NE(e.error().message.find("--curriculum"), std::string::npos) << e.error().message;
    }
  }
  auto e = parse_curriculum("vt,nope");
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("'nope'"), std::string::npos);
}

// Every bench task of the default mix: the scored tokens spell the answer and the EOS, the
// answer's values occur in the prompt (where the generator hid them), targets are the next
// tokens, and the sequence fits the window.
TEST(Curriculum, BenchTasksScoreTheAnswerOnly) {
  for (const char* task : {"niah_single_1", "niah_single_3", "niah_multikey_2", "niah_multikey_3", "niah_multiquery",
                           "vt", "passkey", "dense_state"}) {
    auto c = make(task, 256, 640);
    ASSERT_TRUE(c);
    Rng rng(3);
    std::vector<int32_t> tk(640), tg(640);
    for (int i = 0; i < 3; ++i) {
      auto s = c->sample(rng, 100, tk.data(), tg.data());
      ASSERT_TRUE(s) << task << ": " << s.error().message;
      EXPECT_EQ(s->task, task);
      ASSERT_LE(s->n, 640);
      ASSERT_GT(s->n_scored, 1);
      for (int64_t t = 0; t + 1 < s->n; ++t)
        if (tg[t] >= 0) {
          ASSERT_EQ(tg[t], tk[t + 1]) << task << " t=" << t;
        }
      const Split sp = split(tk, tg, s->n);
      EXPECT_TRUE(sp.eos_last) << task;
      ASSERT_FALSE(sp.scored.empty());
      EXPECT_EQ(sp.scored[0], ' ') << task << ": '" << sp.scored << "'";
      // The values of the answer were hidden in the context (dense_state's answer is a box
      // name, also in the context).
      std::string ans = sp.scored.substr(1);
      if (!ans.empty() && ans.back() == '.') ans.pop_back();
      size_t pos = 0;
      while (pos <= ans.size()) {
        size_t e = ans.find_first_of(", ", pos);
        if (e == std::string::npos) e = ans.size();
        const std::string v = ans.substr(pos, e - pos);
        if (!v.empty() && v != "and") {
          EXPECT_NE(sp.prompt.find(v), std::string::npos) << task << ": " << v;
        }
        pos = e + 1;
      }
      // The prompt is the bench prompt: it does not end in a space and holds the question.
      EXPECT_NE(sp.prompt.back(), ' ');
    }
  }
}

// Recall: each scored value is the one that followed the same key earlier in the sequence.
TEST(Curriculum, RecallScoresValuesOfEarlierKeys) {
  auto c = make("recall", 256, 512);
  ASSERT_TRUE(c);
  Rng rng(11);
  std::vector<int32_t> tk(512), tg(512);
  auto s = c->sample(rng, 0, tk.data(), tg.data());
  ASSERT_TRUE(s) << s.error().message;
  const Tokenizer& tok = *vocab().tok;
  std::vector<int32_t> all(tk.begin(), tk.begin() + s->n);
  all.push_back(tg[s->n - 1] >= 0 ? tg[s->n - 1] : tk[s->n - 1]);
  const std::string text = tok.decode(all);
  const size_t recall_at = text.find("Recall the numbers.\n");
  ASSERT_NE(recall_at, std::string::npos);
  // Walk the recalled lines: "key: value".
  int checked = 0;
  size_t p = recall_at + 20;
  while (true) {
    const size_t colon = text.find(':', p), nl = text.find('\n', p);
    if (colon == std::string::npos || nl == std::string::npos) break;
    const std::string key = text.substr(p, colon - p), value = text.substr(colon + 2, nl - colon - 2);
    const size_t first = text.find(key + ": ");
    ASSERT_LT(first, recall_at) << key;
    EXPECT_EQ(text.substr(first + key.size() + 2, value.size()), value) << key;
    ++checked;
    p = nl + 1;
  }
  EXPECT_GE(checked, 3);
  EXPECT_GE(s->n_scored, 4 * checked);  // four digits each (the space joins the first)
}

// Quiz: some needles' keys are asked, each once, after the haystack, in RULER's question
// template, and at least one needle is never asked where there are two or more; the scored
// text is exactly " value." of each asked key's needle, in the order asked, then EOS.
TEST(Curriculum, QuizScoresTheValueOfEveryAskedKey) {
  auto c = make("quiz", 256, 1024);
  ASSERT_TRUE(c);
  const Tokenizer& tok = *vocab().tok;
  const std::string q = "\nWhat is the special magic number for ";
  const std::string needle = "One of the special magic numbers for ";
  std::vector<int32_t> tk(1024), tg(1024);
  int max_keys = 0, max_needles = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed);
    auto s = c->sample(rng, 100, tk.data(), tg.data());  // past the ramp: lengths up to 1,024
    ASSERT_TRUE(s) << s.error().message;
    ASSERT_LE(s->n, 1024);
    const Split sp = split(tk, tg, s->n);
    EXPECT_TRUE(sp.eos_last);
    std::vector<int32_t> all(tk.begin(), tk.begin() + s->n);
    const std::string text = tok.decode(all);
    const size_t first_q = text.find(q);
    ASSERT_NE(first_q, std::string::npos) << seed;
    // The needles, all before the first question.
    std::map<std::string, std::string> needles;
    for (size_t p = text.find(needle); p != std::string::npos && p < first_q; p = text.find(needle, p + 1)) {
      const size_t ks = p + needle.size(), ke = text.find(" is: ", ks);
      ASSERT_NE(ke, std::string::npos);
      const size_t ve = text.find('.', ke + 5);
      EXPECT_TRUE(needles.emplace(text.substr(ks, ke - ks), text.substr(ke + 5, ve - ke - 5)).second);
    }
    EXPECT_EQ(text.find(needle, first_q), std::string::npos);
    // The questions, in order: each key once, answered with its needle's value.
    std::string expected;
    std::set<std::string> asked;
    for (size_t p = first_q; p != std::string::npos; p = text.find(q, p + 1)) {
      const size_t ks = p + q.size(), ke = text.find(" mentioned in the provided text?", ks);
      ASSERT_NE(ke, std::string::npos);
      const std::string key = text.substr(ks, ke - ks);
      ASSERT_TRUE(needles.count(key)) << key;
      EXPECT_TRUE(asked.insert(key).second) << key;
      EXPECT_NE(text.find(" The special magic number for " + key + " mentioned in the provided text is " + needles[key] + ".", ke),
                std::string::npos);
      expected += " " + needles[key] + ".";
    }
    EXPECT_GE(asked.size(), 1u);
    if (needles.size() >= 2) {
      EXPECT_LT(asked.size(), needles.size());
    }
    max_needles = std::max(max_needles, static_cast<int>(needles.size()));
    EXPECT_EQ(sp.scored, expected) << seed;
    max_keys = std::max(max_keys, static_cast<int>(asked.size()));
  }
  EXPECT_GE(max_keys, 2);     // long sequences ask several keys
  EXPECT_GE(max_needles, 5);  // among more distractors than the bench task's
}

TEST(Curriculum, CopyScoresTheCopy) {
  auto c = make("copy", 256, 512);
  ASSERT_TRUE(c);
  Rng rng(5);
  std::vector<int32_t> tk(512), tg(512);
  auto s = c->sample(rng, 0, tk.data(), tg.data());
  ASSERT_TRUE(s);
  const Split sp = split(tk, tg, s->n);
  const size_t at = sp.prompt.find("Copy the list.\n");
  ASSERT_NE(at, std::string::npos);
  std::string copied = sp.scored.substr(1);
  if (!copied.empty() && copied.back() == '.') copied.pop_back();
  EXPECT_EQ(sp.prompt.substr(at + 15, copied.size()), copied);
}

// Repeat: every scored target is the token that followed the same position of the block's first
// copy; unscored targets are -1; no control token is drawn.
TEST(Curriculum, RepeatScoresTheSecondCopy) {
  auto c = make("repeat", 256, 512);
  ASSERT_TRUE(c);
  Rng rng(21);
  std::vector<int32_t> tk(512), tg(512);
  auto s = c->sample(rng, 0, tk.data(), tg.data());
  ASSERT_TRUE(s);
  EXPECT_EQ(s->task, "repeat");
  ASSERT_GT(s->n_scored, 50);
  ASSERT_LT(s->n_scored, s->n);
  const Tokenizer& tok = *vocab().tok;
  // Find blocks: a run of scored targets [a, b) copies the run of unscored tokens just before.
  int64_t t = 1, checked = 0;
  while (t < s->n) {
    if (tg[t] < 0) {
      ++t;
      continue;
    }
    int64_t e = t;
    while (e < s->n && tg[e] >= 0) ++e;
    const int64_t len = e - t;  // scored predictions t..e-1 are tokens t+1..e
    if (e < s->n) {             // a whole block: its first copy is tokens t+1-len .. t
      for (int64_t i = 0; i < len; ++i) {
        EXPECT_EQ(tg[t + i], tk[t + 1 - len + i]) << "t=" << t << " i=" << i;
        EXPECT_NE(tg[t + i], tok.bos());
        EXPECT_NE(tg[t + i], tok.eos());
      }
      ++checked;
    }
    t = e;
  }
  EXPECT_GE(checked, 1);
}

// Induction: after the BOS the window is blocks of 4 to 16 pieces, each written three times;
// every target is the next token and no control token is drawn.
TEST(Curriculum, InductionWritesEveryBlockThreeTimes) {
  auto c = make("induction", 256, 256);
  ASSERT_TRUE(c);
  Rng rng(5);
  std::vector<int32_t> tk(256), tg(256);
  const Tokenizer& tok = *vocab().tok;
  for (int rep = 0; rep < 4; ++rep) {
    auto s = c->sample(rng, 0, tk.data(), tg.data());
    ASSERT_TRUE(s);
    EXPECT_EQ(s->task, "induction");
    EXPECT_EQ(s->n_scored, s->n);
    for (int64_t t = 0; t + 1 < s->n; ++t) ASSERT_EQ(tg[t], tk[t + 1]);
    EXPECT_EQ(tk[0], tok.bos());
    int64_t p = 1, blocks = 0;
    while (p < s->n) {
      int64_t b = 4;  // the shortest period that repeats three times is the block
      auto is_block = [&](int64_t len) {
        for (int64_t i = 0; i < len; ++i)
          if (tk[p + i] != tk[p + len + i] || tk[p + i] != tk[p + 2 * len + i]) return false;
        return true;
      };
      if (p + 3 * 16 > s->n) break;  // the last block may be cut by the window
      while (b <= 16 && !is_block(b)) ++b;
      ASSERT_LE(b, 16) << "no block of 4..16 pieces written three times at " << p;
      for (int64_t i = 0; i < b; ++i) {
        EXPECT_NE(tk[p + i], tok.bos());
        EXPECT_NE(tk[p + i], tok.eos());
      }
      p += 3 * b;
      ++blocks;
    }
    EXPECT_GE(blocks, 3);
  }
}

// With lm_fraction 1 a task sequence scores every token: each target is the next token.
TEST(Curriculum, LmFractionScoresEveryToken) {
  auto c = make("niah_single_1,vt", 256, 512, 1.0);
  ASSERT_TRUE(c);
  Rng rng(4);
  std::vector<int32_t> tk(512), tg(512);
  for (int i = 0; i < 4; ++i) {
    auto s = c->sample(rng, 0, tk.data(), tg.data());
    ASSERT_TRUE(s);
    EXPECT_EQ(s->n_scored, s->n);
    for (int64_t t = 0; t + 1 < s->n; ++t) ASSERT_EQ(tg[t], tk[t + 1]);
    EXPECT_EQ(tg[s->n - 1], vocab().tok->eos());
  }
  CurriculumOptions o;
  o.tasks = *parse_curriculum("vt");
  o.lm_fraction = 1.5;
  EXPECT_FALSE(Curriculum::create(*vocab().tok, o));
}

TEST(Curriculum, DrawsAreReproducibleAndLengthsRamp) {
  auto c = make("default", 256, 1024);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->max_len_at(0), 256);
  EXPECT_EQ(c->max_len_at(25), 256 + 384);
  EXPECT_EQ(c->max_len_at(50), 1024);
  EXPECT_EQ(c->max_len_at(99), 1024);
  Rng a(9), b(9);
  std::vector<int32_t> ta(1024), ga(1024), tb(1024), gb(1024);
  std::set<std::string> tasks;
  for (int i = 0; i < 20; ++i) {
    auto sa = c->sample(a, 0, ta.data(), ga.data());
    auto sb = c->sample(b, 0, tb.data(), gb.data());
    ASSERT_TRUE(sa) << sa.error().message;
    ASSERT_TRUE(sb) << sb.error().message;
    ASSERT_EQ(sa->n, sb->n);
    ASSERT_EQ(sa->task, sb->task);
    EXPECT_TRUE(std::equal(ta.begin(), ta.begin() + sa->n, tb.begin()));
    EXPECT_TRUE(std::equal(ga.begin(), ga.begin() + sa->n, gb.begin()));
    tasks.insert(sa->task);
    // At step 0 the ramp allows min_len, or a task's own minimum when it needs more room.
    if (sa->task == "text" || sa->task == "recall" || sa->task == "copy") {
      EXPECT_LE(sa->n, 256) << sa->task;
    }
  }
  EXPECT_GE(tasks.size(), 5u);
}

// --cur-alphabet N: repeat and induction draw only from the N text pieces of lowest id (the
// plain pieces: not BOS/EOS, not a lone byte >= 0x80), and they do use more than a few of them.
TEST(Curriculum, AlphabetLimitsTheRandomPieces) {
  const Tokenizer& tok = *vocab().tok;
  std::set<int32_t> first;
  for (int32_t id = 0; id < tok.n_vocab() && static_cast<int>(first.size()) < 40; ++id) {
    const std::string p = tok.token_to_piece(id);
    if (!p.empty() && !(p.size() == 1 && static_cast<unsigned char>(p[0]) >= 0x80) && id != tok.bos() && id != tok.eos())
      first.insert(id);
  }
  ASSERT_EQ(first.size(), 40u);
  for (const char* task : {"induction", "repeat"}) {
    CurriculumOptions o;
    o.tasks = *parse_curriculum(task);
    o.min_len = o.max_len = 512;
    o.alphabet = 40;
    auto c = Curriculum::create(tok, o);
    ASSERT_TRUE(c) << c.error().message;
    Rng rng(3);
    std::vector<int32_t> tk(512), tg(512);
    std::set<int32_t> seen;
    for (int rep = 0; rep < 4; ++rep) {
      auto s = (*c)->sample(rng, 0, tk.data(), tg.data());
      ASSERT_TRUE(s);
      for (int64_t t = 1; t < s->n; ++t) {
        ASSERT_TRUE(first.count(tk[t])) << task << ": piece " << tk[t] << " is outside the alphabet";
        seen.insert(tk[t]);
      }
    }
    EXPECT_GE(seen.size(), 30u) << task;
  }
  CurriculumOptions o;
  o.tasks = *parse_curriculum("induction");
  o.alphabet = 1;
  auto e = Curriculum::create(tok, o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("alphabet"), std::string::npos) << e.error().message;
}

// An alphabet-limited warm-up leaves the embeddings of the pieces it never shows exactly as
// initialised (tied and separate output rows), and trains the ones it shows. With another task
// in the mix every piece trains.
TEST(Curriculum, AlphabetWarmUpFreezesTheUnseenPieces) {
  const Tokenizer& tok = *vocab().tok;
  std::set<int32_t> alphabet = {tok.bos()};  // the 40 text pieces of lowest id, and BOS
  for (int32_t id = 0, n = 0; id < tok.n_vocab() && n < 40; ++id) {
    const std::string p = tok.token_to_piece(id);
    if (!p.empty() && !(p.size() == 1 && static_cast<unsigned char>(p[0]) >= 0x80) && id != tok.bos() && id != tok.eos()) {
      alphabet.insert(id);
      ++n;
    }
  }
  for (const char* output : {"tied", "separate"}) {
    for (const char* mix : {"induction=1,repeat=1", "induction=1,text=1"}) {
      TrainOptions o;
      o.vocab_path = kVocab;
      o.curriculum = mix;
      o.cur_alphabet = 40;
      o.model.n_layer = 1;
      o.model.n_embd = 32;
      o.model.n_head = 2;
      o.model.n_ff = 64;
      o.model.tied = std::string(output) == "tied";
      o.seq_len = 64;
      o.cur_min_len = 64;
      o.batch = 2;
      o.optim.lr = 1e-2f;
      o.optim.weight_decay = 0;
      o.optim.steps = 3;
      o.n_threads = 1;
      o.verbose = false;
      auto tr = Trainer::create(o);
      ASSERT_TRUE(tr) << tr.error().message;
      Transformer<float>& m = (*tr)->model();
      const std::vector<float> before(m.params(), m.params() + m.n_params());
      for (int i = 0; i < 3; ++i) (*tr)->step();
      const bool warmup_only = std::string(mix) == "induction=1,repeat=1";
      int n_tensors = 0;
      for (const ParamTensor& pt : m.tensors()) {
        if (pt.name != "token_embd.weight" && pt.name != "output.weight") continue;
        ++n_tensors;
        const size_t row = static_cast<size_t>(pt.ne[0]);
        int moved_in = 0, moved_out = 0;
        for (int32_t id = 0; id < tok.n_vocab(); ++id) {
          const size_t at = pt.offset + static_cast<size_t>(id) * row;
          const bool moved = !std::equal(before.begin() + static_cast<std::ptrdiff_t>(at),
                                         before.begin() + static_cast<std::ptrdiff_t>(at + row), m.params() + at);
          (alphabet.count(id) ? moved_in : moved_out) += moved;
        }
        EXPECT_GE(moved_in, 30) << output << " " << mix << " " << pt.name;
        if (warmup_only) {
          EXPECT_EQ(moved_out, 0) << output << " " << pt.name;
        } else {
          EXPECT_GT(moved_out, 30) << output << " " << mix << " " << pt.name;
        }
      }
      EXPECT_EQ(n_tensors, o.model.tied ? 1 : 2);
    }
  }
}

TEST(Curriculum, BadOptions) {
  CurriculumOptions o;
  o.tasks = *parse_curriculum("vt");
  o.min_len = 32;
  EXPECT_FALSE(Curriculum::create(*vocab().tok, o));
  o.min_len = 512;
  o.max_len = 256;
  EXPECT_FALSE(Curriculum::create(*vocab().tok, o));
  // A window too short for the task says so.
  o.tasks = *parse_curriculum("niah_multikey_1");
  o.min_len = 64;
  o.max_len = 128;
  auto e = Curriculum::create(*vocab().tok, o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("niah_multikey_1"), std::string::npos) << e.error().message;
}

// A curriculum run checkpointed and resumed continues exactly as the uninterrupted run.
TEST(Curriculum, TrainerResumesBitForBit) {
  const fs::path dir = fs::temp_directory_path() / ("lc_cur_" + std::to_string(getpid()));
  fs::remove_all(dir);
  TrainOptions o;
  o.vocab_path = kVocab;
  o.curriculum = "recall=1,vt=1,text=1";
  o.model.n_layer = 1;
  o.model.n_embd = 32;
  o.model.n_head = 2;
  o.model.n_ff = 64;
  o.seq_len = 384;
  o.cur_min_len = 256;
  o.batch = 2;
  o.optim.lr = 1e-3f;
  o.optim.steps = 3;
  o.n_threads = 2;
  o.verbose = false;
  o.checkpoint_dir = (dir / "a").string();
  auto full = Trainer::create(o);
  ASSERT_TRUE(full) << full.error().message;
  for (int i = 0; i < 3; ++i) (*full)->step();
  o.checkpoint_dir = (dir / "b").string();
  fs::create_directories(o.checkpoint_dir);
  auto part = Trainer::create(o);
  ASSERT_TRUE(part) << part.error().message;
  for (int i = 0; i < 2; ++i) (*part)->step();
  ASSERT_TRUE((*part)->save_checkpoint((*part)->checkpoint_path()).is_ok());
  o.resume = true;
  auto resumed = Trainer::create(o);
  ASSERT_TRUE(resumed) << resumed.error().message;
  const StepRecord r = (*resumed)->step();
  EXPECT_EQ(r.loss, (*full)->history().back().loss);
  const auto& m1 = (*full)->model();
  const auto& m2 = (*resumed)->model();
  ASSERT_EQ(m1.n_params(), m2.n_params());
  EXPECT_EQ(0, std::memcmp(m1.params(), m2.params(), m1.n_params() * sizeof(float)));
  fs::remove_all(dir);
}

// --stop-at ends the process at that step with a checkpoint and an export; resuming finishes
// the run on the same schedule as one uninterrupted run.
TEST(Curriculum, StopAtThenResumeEqualsOneRun) {
  const fs::path dir = fs::temp_directory_path() / ("lc_stop_" + std::to_string(getpid()));
  fs::remove_all(dir);
  TrainOptions o;
  o.vocab_path = kVocab;
  o.curriculum = "recall=1,repeat=1";
  o.model.n_layer = 1;
  o.model.n_embd = 32;
  o.model.n_head = 2;
  o.model.n_ff = 64;
  o.seq_len = 256;
  o.batch = 1;
  o.optim.lr = 1e-3f;
  o.optim.steps = 4;
  o.n_threads = 1;
  o.verbose = false;
  o.checkpoint_dir = (dir / "one").string();
  o.out_path = (dir / "one.gguf").string();
  auto one = Trainer::create(o);
  ASSERT_TRUE(one) << one.error().message;
  ASSERT_TRUE((*one)->run().is_ok());
  o.checkpoint_dir = (dir / "two").string();
  o.out_path = (dir / "two.gguf").string();
  o.stop_at = 2;
  auto first = Trainer::create(o);
  ASSERT_TRUE(first);
  ASSERT_TRUE((*first)->run().is_ok());
  EXPECT_EQ((*first)->steps_done(), 2);
  EXPECT_TRUE(fs::exists(o.out_path));
  o.stop_at = 0;
  o.resume = true;
  auto second = Trainer::create(o);
  ASSERT_TRUE(second) << second.error().message;
  ASSERT_TRUE((*second)->run().is_ok());
  EXPECT_EQ((*second)->steps_done(), 4);
  EXPECT_EQ((*second)->history().back().loss, (*one)->history().back().loss);
  EXPECT_EQ(0, std::memcmp((*one)->model().params(), (*second)->model().params(),
                           (*one)->model().n_params() * sizeof(float)));
  fs::remove_all(dir);
}

TEST(Curriculum, TrainerNeedsDataOrCurriculum) {
  TrainOptions o;
  o.vocab_path = kVocab;
  auto e = Trainer::create(o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("--curriculum"), std::string::npos);
  o.curriculum = "vt,bogus";
  e = Trainer::create(o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("bogus"), std::string::npos);
}

}  // namespace
}  // namespace lc::train
