#include "train/curriculum.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "readers/reader.h"
#include "tasks/haystack.h"
#include "tasks/needles.h"
#include "tasks/text.h"

namespace lc::train {

namespace {

// Tasks trained on and their default weights. The needle tasks with many distractors and
// variable tracking (multi-hop) are the hardest to learn and get the most weight; the
// counting/state tasks are in the mix at a low weight (a model of this size is not expected
// to master them); recall and copy teach the copying circuit quickly; text keeps a prior.
const std::vector<CurriculumTask>& default_mix() {
  static const std::vector<CurriculumTask> mix = {
      {"niah_single_1", 1.0},   {"niah_single_2", 1.0},   {"niah_single_3", 1.0},
      {"niah_multikey_1", 1.0}, {"niah_multikey_2", 1.5}, {"niah_multikey_3", 1.5},
      {"niah_multivalue", 0.5}, {"niah_multiquery", 0.5}, {"vt", 2.0},
      {"passkey", 0.5},         {"dense_count", 0.25},    {"dense_state", 0.25},
      {"recall", 1.0},          {"copy", 0.5},            {"text", 0.5},
  };
  return mix;
}

bool is_sculptor_task(const std::string& n) { return n == "sculptor_search" || n == "sculptor_answer"; }

// MemAgent on variable tracking (Curriculum::vt_task).
bool is_vt_task(const std::string& n) {
  return n == "vt_update" || n == "vt_decide" || n == "vt_first" || n == "vt_open" || n == "vt_answer";
}

bool is_reader_task(const std::string& n) {
  return n == "mem_update" || n == "mem_carry" || n == "mem_answer" || n == "map_answer" || is_vt_task(n) ||
         n == "smooth_note" || n == "smooth_answer" || is_sculptor_task(n);
}

bool is_own_task(const std::string& n) {
  return n == "recall" || n == "quiz" || n == "copy" || n == "text" || n == "repeat" || n == "induction" ||
         is_reader_task(n);
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == ',') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

// The text the model should produce after a bench task's prompt, in the form the scorer
// accepts (every reference contained in the output).
std::string answer_text(const tasks::Sample& s) {
  std::string a = " ";  // (appending rather than " " + ... sidesteps a GCC 12 -Wrestrict false positive)
  a += tasks::join(s.answers, s.spec.task == "vt" ? " " : ", ");
  if (s.spec.task != "vt") a += '.';
  return a;
}

}  // namespace

std::string hard_number(tasks::Rng& rng, int digits) {
  // A random set of 2-4 distinct digits, then each digit drawn from it (the first not 0).
  const int64_t k = tasks::uniform(rng, 2, 4);
  std::string pool;
  for (int64_t d : tasks::sample_without_replacement(rng, 10, k)) pool += static_cast<char>('0' + d);
  std::string s;
  while (static_cast<int>(s.size()) < digits) {
    const char c = pool[static_cast<size_t>(tasks::uniform(rng, 0, k - 1))];
    if (!(s.empty() && c == '0')) s += c;
  }
  return s;
}

std::string Curriculum::value_number(tasks::Rng& rng, int digits) const {
  if (o_.hard_values > 0 && tasks::uniform01(rng) < o_.hard_values) return hard_number(rng, digits);
  return tasks::random_number(rng, digits);
}

Expected<std::vector<CurriculumTask>> parse_curriculum(const std::string& spec) {
  if (spec == "default") return default_mix();
  std::vector<CurriculumTask> out;
  std::set<std::string> seen;
  for (const std::string& item : split_commas(spec)) {
    const std::string it = trim(item);
    if (it.empty()) return make_error(fmt::format("--curriculum '{}': empty entry", spec));
    CurriculumTask t;
    const size_t eq = it.find('=');
    t.name = trim(it.substr(0, eq));
    if (eq != std::string::npos) {
      const std::string w = trim(it.substr(eq + 1));
      char* end = nullptr;
      t.weight = std::strtod(w.c_str(), &end);
      if (w.empty() || *end != '\0' || !(t.weight > 0) || t.weight > 1e6)
        return make_error(fmt::format("--curriculum: weight '{}' of '{}' must be a positive number", w, t.name));
    }
    if (!is_own_task(t.name) && !tasks::find_task(t.name))
      return make_error(fmt::format("--curriculum: unknown task '{}' (bench tasks, recall, quiz, copy, repeat, induction, text, mem_update, mem_carry, mem_answer, vt_update, vt_decide, vt_first, vt_open, vt_answer, map_answer, smooth_note, smooth_answer, sculptor_search, sculptor_answer)", t.name));
    if (!seen.insert(t.name).second)
      return make_error(fmt::format("--curriculum: task '{}' is listed twice", t.name));
    out.push_back(t);
  }
  if (out.empty()) return make_error("--curriculum: no tasks");
  return out;
}

std::string curriculum_to_string(const std::vector<CurriculumTask>& tasks) {
  std::string s;
  for (const auto& t : tasks) s += (s.empty() ? "" : ",") + t.name + "=" + fmt::format("{:g}", t.weight);
  return s;
}

Expected<std::unique_ptr<Curriculum>> Curriculum::create(const Tokenizer& tok, const CurriculumOptions& o,
                                                         const TokenData* text) {
  if (o.tasks.empty()) return make_error("curriculum: no tasks");
  if (o.min_len < 64 || o.min_len > o.max_len)
    return make_error(fmt::format("curriculum: lengths must satisfy 64 <= min_len ({}) <= max_len ({})",
                                  o.min_len, o.max_len));
  if (!(o.ramp >= 0 && o.ramp <= 1)) return make_error(fmt::format("curriculum: ramp {:g} is not in [0, 1]", o.ramp));
  if (!(o.lm_fraction >= 0 && o.lm_fraction <= 1))
    return make_error(fmt::format("curriculum: lm fraction {:g} is not in [0, 1]", o.lm_fraction));
  if (!(o.hard_values >= 0 && o.hard_values <= 1))
    return make_error(fmt::format("curriculum: hard-values fraction {:g} is not in [0, 1]", o.hard_values));
  if (tok.eos() < 0) return make_error("curriculum: the vocabulary has no end-of-sequence token");
  std::unique_ptr<Curriculum> c(new Curriculum(tok));
  c->o_ = o;
  c->o_.total_steps = std::max<int64_t>(1, o.total_steps);
  double acc = 0;
  bool need_text = false, need_readers = false;
  for (const auto& t : o.tasks) {
    acc += t.weight;
    c->cdf_.push_back(acc);
    need_text |= t.name == "text";
    need_readers |= is_reader_task(t.name);
  }
  if (need_readers) {  // the templates the readers run with (compiled in)
    const readers::TemplateSource src;
    LC_ASSIGN_OR_RETURN(c->mem_update_, src.load("memagent_update", {"problem", "memory", "chunk"}));
    LC_ASSIGN_OR_RETURN(c->mem_final_, src.load("memagent_final", {"problem", "memory"}));
    LC_ASSIGN_OR_RETURN(c->map_, src.load("mapreduce_map", {"problem", "chunk"}));
    LC_ASSIGN_OR_RETURN(c->smooth_read_, src.load("smooth_read", {"problem", "summary", "chunk"}));
    LC_ASSIGN_OR_RETURN(c->smooth_final_, src.load("smooth_final", {"problem", "summary"}));
    LC_ASSIGN_OR_RETURN(c->sculptor_text_, src.load("sculptor_text", {"problem", "fragments", "fragment_tokens"}));
  }
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {  // pieces of text, for "repeat"
    const std::string p = tok.token_to_piece(id);
    if (!p.empty() && !(p.size() == 1 && static_cast<unsigned char>(p[0]) >= 0x80) && id != tok.bos() && id != tok.eos())
      c->plain_ids_.push_back(id);
  }
  if (c->plain_ids_.empty()) return make_error("curriculum: the vocabulary has no text pieces");
  if (o.alphabet < 0 || o.alphabet == 1)
    return make_error(fmt::format("curriculum: alphabet {} must be 0 (all pieces) or at least 2", o.alphabet));
  if (o.alphabet > 0 && o.alphabet < static_cast<int64_t>(c->plain_ids_.size())) c->plain_ids_.resize(static_cast<size_t>(o.alphabet));
  if (need_text) {
    if (text) {
      c->text_tokens_ = text->tokens();
    } else {
      LC_ASSIGN_OR_RETURN(const std::vector<std::string>* words, tasks::essay_words());
      c->text_tokens_ = tok.encode(tasks::join(*words, " "), false, false);
    }
    if (static_cast<int64_t>(c->text_tokens_.size()) < o.max_len + 1)
      return make_error(fmt::format("curriculum: the plain text has {} tokens, fewer than max_len + 1 = {}",
                                    c->text_tokens_.size(), o.max_len + 1));
  }
  // Each task's shortest workable length (a task with four needles needs more room than
  // min_len may give), found now rather than in the middle of a run; then it must also work at
  // max_len.
  std::vector<int32_t> tk(static_cast<size_t>(o.max_len)), tg(static_cast<size_t>(o.max_len));
  for (const auto& t : o.tasks) {
    int64_t len = o.min_len;
    if (t.name != "text") {
      for (;; len = std::min(o.max_len, len + 32)) {
        auto s = c->draw(t.name, len, 1, tk.data(), tg.data());
        if (s && s->n_scored > 0) break;
        if (len == o.max_len)
          return make_error(fmt::format("curriculum: task {} does not fit in {} tokens (--seq-len): {}", t.name,
                                        o.max_len, s ? "nothing to score" : s.error().message));
      }
      auto s = c->draw(t.name, o.max_len, 1, tk.data(), tg.data());
      if (!s) return make_error(fmt::format("curriculum: task {} at {} tokens: {}", t.name, o.max_len,
                                            s.error().message));
    }
    c->min_len_.push_back(len);
  }
  return c;
}

std::vector<int32_t> Curriculum::warmup_pieces() const {
  if (o_.alphabet <= 0) return {};
  for (const auto& t : o_.tasks)
    if (t.name != "repeat" && t.name != "induction") return {};
  std::vector<int32_t> ids = plain_ids_;
  if (tok_.bos() >= 0) ids.push_back(tok_.bos());
  std::sort(ids.begin(), ids.end());
  return ids;
}

int64_t Curriculum::max_len_at(int64_t step) const {
  const double ramp_steps = o_.ramp * static_cast<double>(o_.total_steps);
  const double f = ramp_steps <= 0 ? 1.0 : std::min(1.0, static_cast<double>(step) / ramp_steps);
  return o_.min_len + static_cast<int64_t>(f * static_cast<double>(o_.max_len - o_.min_len));
}

Expected<CurriculumSample> Curriculum::sample(Rng& rng, int64_t step, int32_t* tokens, int32_t* targets) const {
  const double u = rng.uniform() * cdf_.back();
  size_t ti = 0;
  while (ti + 1 < cdf_.size() && u >= cdf_[ti]) ++ti;
  const std::string& task = o_.tasks[ti].name;
  const int64_t hi = max_len_at(step);
  const int64_t len = std::max(min_len_[ti], o_.min_len + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - o_.min_len + 1))));
  const uint64_t seed = rng.next();
  if (task == "text") return text(rng, len, tokens, targets);
  // A task's room depends on its draws (keys of different token lengths): where the sample
  // does not fit, the same sample is asked for again with more room.
  const bool lm = rng.uniform() < o_.lm_fraction;
  for (int64_t l = len;; l = std::min(o_.max_len, l + 32)) {
    auto s = draw(task, l, seed, tokens, targets);
    if (!s && l < o_.max_len) continue;
    if (s && lm) {  // score the whole sequence
      for (int64_t t = 0; t + 1 < s->n; ++t) targets[t] = tokens[t + 1];
      if (targets[s->n - 1] < 0) {  // the sequence was cut: its last target is the next token
        s->n -= 1;
      }
      s->n_scored = 0;
      for (int64_t t = 0; t < s->n; ++t) s->n_scored += targets[t] >= 0;
    }
    return s;
  }
}

Expected<CurriculumSample> Curriculum::draw(const std::string& task, int64_t len, uint64_t seed, int32_t* tokens,
                                            int32_t* targets) const {
  CurriculumSample s;
  if (task == "repeat") {
    s = repeat(len, seed, tokens, targets);
  } else if (task == "induction") {
    s = induction(len, seed, tokens, targets);
  } else if (task == "recall") {
    LC_ASSIGN_OR_RETURN(s, recall(len, seed, tokens, targets));
  } else if (task == "quiz") {
    LC_ASSIGN_OR_RETURN(s, quiz(len, seed, tokens, targets));
  } else if (task == "copy") {
    LC_ASSIGN_OR_RETURN(s, copy(len, seed, tokens, targets));
  } else if (is_sculptor_task(task)) {
    LC_ASSIGN_OR_RETURN(s, sculptor_task(task, len, seed, tokens, targets));
  } else if (is_reader_task(task)) {
    LC_ASSIGN_OR_RETURN(s, reader_task(task, len, seed, tokens, targets));
  } else {
    LC_ASSIGN_OR_RETURN(s, bench_task(task, len, seed, tokens, targets));
  }
  s.task = task;
  return s;
}

Expected<CurriculumSample> Curriculum::bench_task(const std::string& task, int64_t len, uint64_t seed,
                                                  int32_t* tokens, int32_t* targets) const {
  tasks::SampleSpec spec;
  spec.task = task;
  spec.length = len;
  spec.depth = -1;
  spec.index = -1;  // never an evaluation index
  spec.seed = seed;
  spec.opts.max_new_tokens = 48;  // room for the longest answer (a UUID, or four numbers)
  LC_ASSIGN_OR_RETURN(tasks::Sample smp, tasks::make_sample(render_, spec));
  const std::string prompt = render_.text(smp.user, smp.answer_prefix);
  std::vector<int32_t> full = tok_.encode(prompt + answer_text(smp), true, false);
  // The answer must continue the prompt's tokens, as generation will.
  if (full.size() <= smp.tokens.size() || !std::equal(smp.tokens.begin(), smp.tokens.end(), full.begin()))
    return make_error(fmt::format("curriculum: task {}: the answer's tokens do not continue the prompt's", task));
  full.push_back(tok_.eos());
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(full.size()) - 1, o_.max_len);
  CurriculumSample s;
  s.n = n;
  for (int64_t t = 0; t < n; ++t) {
    tokens[t] = full[static_cast<size_t>(t)];
    const bool scored = t + 1 >= smp.n_prompt;  // predicts an answer token or the EOS
    targets[t] = scored ? full[static_cast<size_t>(t + 1)] : -1;
    s.n_scored += scored;
  }
  return s;
}

Expected<std::vector<size_t>> Curriculum::token_starts(const std::vector<int32_t>& ids, const std::string& text) const {
  // The tokens' pieces concatenated are the text, after a space the SentencePiece vocabularies
  // put in front (a token's span is then shifted back by one, the first clamped at 0).
  std::vector<size_t> start(ids.size() + 1, 0);
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    start[i] = joined.size();
    joined += tok_.token_to_piece(ids[i]);
  }
  start[ids.size()] = joined.size();
  size_t shift = 0;
  if (joined.size() == text.size() + 1 && joined[0] == ' ' && joined.compare(1, std::string::npos, text) == 0)
    shift = 1;
  else if (joined != text)
    return make_error("curriculum: the tokenizer does not reproduce the generated text byte for byte");
  for (size_t& b : start) b = b >= shift ? b - shift : 0;
  return start;
}

Expected<CurriculumSample> Curriculum::encode_scored(const std::string& text,
                                                     const std::vector<std::pair<size_t, size_t>>& scored, bool eos,
                                                     int64_t len, int32_t* tokens, int32_t* targets) const {
  std::vector<int32_t> ids = tok_.encode(text, true, false);
  LC_ASSIGN_OR_RETURN(std::vector<size_t> start, token_starts(ids, text));
  if (eos) {
    ids.push_back(tok_.eos());
    start.push_back(start.back());
  }
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(ids.size()) - 1, std::min(len, o_.max_len));
  CurriculumSample s;
  s.n = n;
  for (int64_t t = 0; t < n; ++t) {
    const size_t i = static_cast<size_t>(t + 1);  // the token predicted at t
    bool sc = eos && i + 1 == ids.size();
    for (const auto& r : scored) sc |= start[i] < r.second && start[i + 1] > r.first;
    tokens[t] = ids[i - 1];
    targets[t] = sc ? ids[i] : -1;
    s.n_scored += sc;
  }
  return s;
}

Expected<CurriculumSample> Curriculum::encode_reply(const std::string& prompt, const std::string& reply, int64_t len,
                                                    int32_t* tokens, int32_t* targets,
                                                    const std::vector<size_t>* only_at) const {
  const std::vector<int32_t> head = tok_.encode(prompt, true, false);
  std::vector<int32_t> full = tok_.encode(prompt + reply, true, false);
  // The reply must continue the prompt's tokens, as generation will.
  if (full.size() <= head.size() || !std::equal(head.begin(), head.end(), full.begin()))
    return make_error("curriculum: a reader task's reply tokens do not continue the prompt's");
  full.push_back(tok_.eos());
  const int64_t n = static_cast<int64_t>(full.size()) - 1;
  if (n > std::min(len, o_.max_len))
    return make_error(fmt::format("curriculum: a reader task's sequence needs {} tokens, more than {}", n,
                                  std::min(len, o_.max_len)));
  // Where only_at is given, the positions to score: each predicts the reply token whose bytes
  // hold one of those reply offsets (the EOS for reply.size()).
  std::vector<bool> at;
  if (only_at) {
    at.assign(static_cast<size_t>(n), false);
    LC_ASSIGN_OR_RETURN(const std::vector<size_t> start,
                        token_starts(std::vector<int32_t>(full.begin(), full.end() - 1), prompt + reply));
    for (const size_t off : *only_at) {
      if (off > reply.size()) return make_error("curriculum: a scored offset lies past the reply");
      size_t k = full.size() - 1;  // the EOS
      if (off < reply.size()) {
        const size_t b = prompt.size() + off;
        k = head.size();
        while (k + 1 < full.size() - 1 && start[k + 1] <= b) ++k;
      }
      at[k - 1] = true;
    }
  }
  CurriculumSample s;
  s.n = n;
  for (int64_t t = 0; t < n; ++t) {
    tokens[t] = full[static_cast<size_t>(t)];
    // Predicts a reply token or the EOS.
    const bool scored = only_at ? at[static_cast<size_t>(t)] : t + 1 >= static_cast<int64_t>(head.size());
    targets[t] = scored ? full[static_cast<size_t>(t + 1)] : -1;
    s.n_scored += scored;
  }
  return s;
}

// The reading agents' protocols (src/readers; the prompts are the readers' own templates,
// rendered as the engine renders them for a model without a chat template). The question asks
// for one needle in the benchmark's wording: a RULER numbers needle (half the samples), a UUID
// needle (a quarter) or the pass key (a quarter, needle and question of the passkey task in
// src/tasks/tasks_extra.cpp); distractors are needles of other keys.
//   mem_update  (memagent_update) chunk with the queried needle or not; previous memory "No
//               previous memory", the queried needle sentence (read in an earlier chunk, so
//               only when the chunk does not hold it) or another key's sentence. The new memory:
//               the queried sentence when the chunk holds it, else the previous memory when it
//               holds it, else "No previous memory": the relevant sentence, copied and carried.
//   mem_carry   (memagent_update) the memory holds the queried sentence and the chunk does not
//               (0-2 other keys' needles, the essay three times in four): the reply is the
//               memory, copied. mem_update's carry case alone, where a long read's memory
//               decays: a read of N chunks copies its memory about N/2 times.
//   mem_answer  (memagent_final) a memory with the queried sentence, sometimes next to another
//               key's; the reply is \boxed{VALUE}.
//   vt_update   (memagent_update) RULER's variable tracking (one chain of 4 hops, RULER's noise
//               blocks one a line): the memory holds the chain's first k statements (k in 0..5; "No
//               previous memory" for 0), the chunk the next 0-2, each on a line of its own; the
//               new memory is the first k + new statements, one a line.
//   vt_decide   vt_update's sequence, scored only at the reply's first token and at the token
//               after each of its lines' text (a hop's trailing space or a new line, to go on; or
//               the EOS): the decision to append is one token in a reply of tens, and a
//               window's loss is the mean over its scored tokens, so this weights it up.
//   vt_first    vt_decide with a memory of at most the chain's first statement (k in 0..1): the
//               decision after that statement (a new line, or the EOS) is the one the reader
//               model kept missing, and vt_update's k in 0..5 draws it a ninth of the time.
//   vt_open     (memagent_update) the document's first chunk, as the bench gives it: RULER's
//               one-shot example (3-letter names, another value; its own run of positions and
//               block count), the instruction, then noise blocks with the chain's first 0-2
//               statements; memory "No previous memory"; the reply is those statements, or "No
//               previous memory".
//   vt_answer   (memagent_final) a memory of the chain's first 1-5 statements (all five half the
//               time); the reply is \boxed{the variables, in chain order, space-separated}.
//   map_answer  (mapreduce_map) chunk with the queried needle or not; the reply is the value or
//               "none".
//   smooth_note (smooth_read) chunk with the queried needle or not; the notes so far are "none
//               yet", another key's sentence or the queried one (only when the chunk does not
//               hold it), as "[chunk] entry" lines; the reply is the queried sentence, or "none".
//   smooth_answer (smooth_final) notes holding the queried sentence among 0-2 other keys';
//               the reply is \boxed{VALUE}.
// The chunk (noise sentences or essay, RULER's haystacks, the needles at RULER's depths) gets
// what the reader would give it in a window of the sequence's length: memagent 5000/8192 of
// it, at most what is left after the template, the question and twice its memory cap
// (1024/8192); mapreduce what is left after the template, the question and 32 answer tokens.
Expected<CurriculumSample> Curriculum::reader_task(const std::string& task, int64_t len, uint64_t seed,
                                                   int32_t* tokens, int32_t* targets) const {
  static const std::string kNoMemory = "No previous memory";  // readers/memagent.cpp
  tasks::Rng rng(tasks::mix64(seed ^ 0x72656164657273ull));
  len = std::min(len, o_.max_len);
  const int64_t kind = tasks::uniform(rng, 0, 3);  // 0, 1: numbers, 2: UUIDs, 3: pass key
  const bool passkey = kind == 3;
  const std::string type = kind == 2 ? "uuids" : "numbers";
  std::set<std::string> used;  // keys and values are unique in the sample, as in the niah tasks
  auto fresh = [&](bool value) {
    for (;;) {
      std::string v = !value ? tasks::random_key_word(rng)
                             : type == "uuids" ? tasks::random_uuid(rng) : value_number(rng, 7);
      if (used.insert(v).second) return v;
    }
  };
  struct Fact {
    std::string value, sentence;
  };
  auto other = [&] {  // a needle of another key
    const std::string key = fresh(false), value = fresh(true);
    return Fact{value, tasks::needle_sentence(type, key, value)};
  };
  if (is_vt_task(task)) return vt_task(task, len, rng, tokens, targets);
  Fact q;
  std::string question;
  if (passkey) {
    q.value = value_number(rng, 5);
    used.insert(q.value);
    q.sentence = "The pass key is " + q.value + ". Remember it. " + q.value + " is the pass key.";
    question = "What is the pass key?";
  } else {
    const std::string key = fresh(false);
    q.value = fresh(true);
    q.sentence = tasks::needle_sentence(type, key, q.value);
    question = trim(tasks::niah_single_wording(type, key).question);
  }

  if (task == "mem_answer") {
    std::string memory = q.sentence;
    if (tasks::uniform(rng, 0, 1)) {
      const Fact d = other();
      memory = tasks::uniform(rng, 0, 1) ? memory + " " + d.sentence : d.sentence + " " + memory;
    }
    const std::string prompt =
        render_.text(readers::render(mem_final_, {{"problem", question}, {"memory", memory}}), mem_final_.prefix);
    return encode_reply(prompt, "\\boxed{" + q.value + "}", len, tokens, targets);
  }

  // Smooth Reading's notes as the reader shows them: "[chunk] entry" lines in reading order.
  auto notes_of = [&](const std::vector<std::string>& entries) {
    if (entries.empty()) return std::string("none yet");
    std::vector<int64_t> at;
    for (size_t i = 0; i < entries.size(); ++i) at.push_back(tasks::uniform(rng, 1, 400));
    std::sort(at.begin(), at.end());
    std::string out;
    for (size_t i = 0; i < entries.size(); ++i)
      out += fmt::format("{}[{}] {}", out.empty() ? "" : "\n", at[i] + static_cast<int64_t>(i), entries[i]);
    return out;
  };
  if (task == "smooth_answer") {
    std::vector<std::string> entries = {q.sentence};
    for (int64_t i = tasks::uniform(rng, 0, 2); i > 0; --i)
      entries.insert(entries.begin() + tasks::uniform(rng, 0, static_cast<int64_t>(entries.size())), other().sentence);
    const std::string prompt = render_.text(
        readers::render(smooth_final_, {{"problem", question}, {"summary", notes_of(entries)}}), smooth_final_.prefix);
    return encode_reply(prompt, "\\boxed{" + q.value + "}", len, tokens, targets);
  }

  const bool carry = task == "mem_carry";
  const bool smooth = task == "smooth_note";
  const bool update = task == "mem_update" || carry;
  const bool present = !carry && tasks::uniform(rng, 0, 1) == 1;
  std::vector<tasks::Insert> inserts;
  if (present) inserts.push_back({0, q.sentence});
  for (int64_t i = tasks::uniform(rng, 0, 2); i > 0; --i) inserts.push_back({0, other().sentence});
  const std::vector<double> depths = tasks::needle_depths(rng, -1, inserts.size());
  for (size_t i = 0; i < inserts.size(); ++i) inserts[i].depth = depths[i];
  std::string memory = kNoMemory, notes, reply;
  if (update) {
    // 0: no memory yet, 1: the queried sentence (from an earlier chunk), 2: another key's.
    const int64_t m = carry ? 1 : present ? 2 * tasks::uniform(rng, 0, 1) : tasks::uniform(rng, 0, 2);
    if (m == 1) memory = q.sentence;
    if (m == 2) memory = other().sentence;
    reply = present ? q.sentence : m == 1 ? memory : kNoMemory;
  } else if (smooth) {
    // Notes so far: none, another key's sentence, or (from an earlier chunk) the queried one.
    const int64_t m = present ? 2 * tasks::uniform(rng, 0, 1) : tasks::uniform(rng, 0, 2);
    notes = notes_of(m == 0 ? std::vector<std::string>{} : std::vector<std::string>{m == 1 ? q.sentence : other().sentence});
    reply = present ? q.sentence : "none";
  } else {
    reply = present ? q.value : "none";
  }
  const bool essay = !passkey && (carry ? tasks::uniform(rng, 0, 3) != 0 : tasks::uniform(rng, 0, 1) == 1);
  const std::vector<std::string>* words = nullptr;
  size_t start = 0;
  if (essay) {
    LC_ASSIGN_OR_RETURN(words, tasks::essay_words());
    start = tasks::essay_sentence_start(
        *words, static_cast<size_t>(tasks::uniform(rng, 0, static_cast<int64_t>(words->size()) - 1)));
  } else {
    start = static_cast<size_t>(tasks::uniform(rng, 0, static_cast<int64_t>(tasks::noise_sentences().size()) - 1));
  }
  auto chunk_of = [&](int64_t units) {  // essay words or noise sentences, with the needles
    std::vector<std::string> hay;
    if (essay) {
      hay = tasks::essay_sentences(*words, start, static_cast<size_t>(units));
    } else {
      const auto& noise = tasks::noise_sentences();
      for (int64_t i = 0; i < units; ++i) hay.push_back(noise[(start + static_cast<size_t>(i)) % noise.size()]);
    }
    return tasks::assemble(hay, inserts, " ", false, nullptr);
  };
  // Distractors are dropped (the last first) until the needles fit.
  auto drop = [&] {
    if (inserts.size() <= (present ? 1u : 0u)) return false;
    inserts.pop_back();
    return true;
  };
  return fit_step(task, len, update ? Step::kMemAgent : smooth ? Step::kSmooth : Step::kMap, question,
                  smooth ? notes : memory, reply, chunk_of, drop, tokens, targets);
}

// A reader step's sequence, its chunk as long as the reader would make it at a window of len
// tokens (memagent: 5000/8192 of the window, at most what is left after the template, the
// question and twice its memory cap of 1024/8192; mapreduce: what is left after the template,
// the question and 32 answer tokens; smooth: what is left after the template, the question, the
// notes' cap of a quarter of the window and a 64-token entry), with the most haystack
// (chunk_of's units) that fits.
Expected<CurriculumSample> Curriculum::fit_step(const std::string& task, int64_t len, Step step,
                                                const std::string& question, const std::string& mem,
                                                const std::string& reply,
                                                const std::function<std::string(int64_t)>& chunk_of,
                                                const std::function<bool()>& drop, int32_t* tokens,
                                                int32_t* targets, const std::vector<size_t>* only_at) const {
  const readers::Template& t = step == Step::kMemAgent ? mem_update_ : step == Step::kMap ? map_ : smooth_read_;
  auto prompt_of = [&](const std::string& chunk, const std::string& state) {
    std::map<std::string, std::string> v = {{"problem", question}, {"chunk", chunk}};
    if (step == Step::kMemAgent) v["memory"] = state;
    if (step == Step::kSmooth) v["summary"] = state;
    return render_.text(readers::render(t, v), t.prefix);
  };
  auto n_tokens = [&](const std::string& text) { return static_cast<int64_t>(tok_.encode(text, true, false).size()); };
  const int64_t base = n_tokens(prompt_of("", ""));
  const int64_t chunk_cap = step == Step::kMemAgent ? std::min(len * 5000 / 8192, len - base - 2 * (len * 1024 / 8192))
                            : step == Step::kMap    ? len - base - 32
                                                    : len - base - len / 4 - 64;  // smooth: notes, entry
  const int64_t empty = n_tokens(prompt_of("", mem) + reply);  // the sequence (less EOS) without a chunk
  int64_t needles_only = n_tokens(prompt_of(chunk_of(0), mem) + reply);
  while (needles_only > len && drop()) needles_only = n_tokens(prompt_of(chunk_of(0), mem) + reply);
  // Where the reader would leave no room for a chunk, the sample is drawn again longer; at the
  // longest length (where that cannot be), and where the needles alone pass the reader's
  // chunk, the chunk gets what is left.
  if ((chunk_cap < 1 && len < o_.max_len) || needles_only > len)
    return make_error(fmt::format("curriculum: task {} does not fit in {} tokens", task, len));
  const int64_t limit = std::max(needles_only, std::min(len, empty + std::max<int64_t>(chunk_cap, 0)));
  // The most haystack that fits (the tokens grow with the units; each unit is a token or more).
  int64_t lo = 0, hi = limit - empty + 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (n_tokens(prompt_of(chunk_of(mid), mem) + reply) <= limit) lo = mid;
    else hi = mid;
  }
  return encode_reply(prompt_of(chunk_of(lo), mem), reply, len, tokens, targets, only_at);
}

// MemAgent on RULER's variable tracking (vt_update, vt_answer; the question is RULER's, as the
// bench gives it to a reader: the text after the context).
Expected<CurriculumSample> Curriculum::vt_task(const std::string& task, int64_t len, tasks::Rng& rng, int32_t* tokens,
                                               int32_t* targets) const {
  static const std::string kNoMemory = "No previous memory";  // readers/memagent.cpp
  constexpr size_t kHops = 4;
  std::set<std::string> used;
  const std::vector<std::string> vars = tasks::vt_names(rng, kHops + 1, 5, used);
  const std::string value = std::to_string(tasks::uniform(rng, 10000, 99998));
  const std::vector<std::string> chain = tasks::vt_chain(vars, value);
  const std::string question = trim(tasks::vt_question(value));
  auto lines = [&](size_t n) {  // the chain's first n statements, one a line
    return n == 0 ? kNoMemory : trim(tasks::join({chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(n)}, "\n"));
  };
  if (task == "vt_answer") {
    const size_t k = tasks::uniform(rng, 0, 1) ? chain.size() : static_cast<size_t>(tasks::uniform(rng, 1, kHops));
    const std::string prompt =
        render_.text(readers::render(mem_final_, {{"problem", question}, {"memory", lines(k)}}), mem_final_.prefix);
    return encode_reply(prompt, "\\boxed{" + tasks::join({vars.begin(), vars.begin() + static_cast<std::ptrdiff_t>(k)}, " ") + "}",
                        len, tokens, targets);
  }
  if (task == "vt_open") {
    // The document's first chunk: RULER's one-shot example (a run of its own per sample), the
    // instruction, then the context's first noise blocks with the chain's first 0-2 statements.
    const uint64_t run = static_cast<uint64_t>(tasks::uniform(rng, 0, INT64_MAX));
    const std::string example =
        tasks::vt_example(run, tasks::vt_example_blocks(tok_, run), rng, used) + tasks::vt_head();
    const size_t fresh = static_cast<size_t>(tasks::uniform(rng, 0, 2));
    std::vector<tasks::Insert> inserts;
    std::vector<double> depths;
    for (size_t j = 0; j < fresh; ++j) depths.push_back(100.0 * tasks::uniform01(rng));
    std::sort(depths.begin(), depths.end());
    for (size_t j = 0; j < fresh; ++j) inserts.push_back({depths[j], chain[j]});
    auto chunk_of = [&](int64_t units) {
      std::vector<std::string> hay(static_cast<size_t>(units), tasks::noise_block());
      return example + tasks::assemble(hay, inserts, "\n", true, nullptr);
    };
    return fit_step(task, len, Step::kMemAgent, question, kNoMemory, lines(fresh), chunk_of, [] { return false; },
                    tokens, targets);
  }
  const bool first_only = task == "vt_first";  // the memory holds at most the chain's first statement
  const size_t k = static_cast<size_t>(tasks::uniform(rng, 0, first_only ? 1 : static_cast<int64_t>(chain.size())));
  const size_t fresh = static_cast<size_t>(tasks::uniform(rng, 0, static_cast<int64_t>(std::min<size_t>(2, chain.size() - k))));
  std::vector<tasks::Insert> inserts;
  std::vector<double> depths;
  for (size_t j = 0; j < fresh; ++j) depths.push_back(100.0 * tasks::uniform01(rng));
  std::sort(depths.begin(), depths.end());  // the chain's order, as in the document
  for (size_t j = 0; j < fresh; ++j) inserts.push_back({depths[j], chain[k + j]});
  const std::string memory = lines(k), reply = lines(k + fresh);
  const size_t start = static_cast<size_t>(tasks::uniform(rng, 0, static_cast<int64_t>(tasks::noise_sentences().size()) - 1));
  // RULER's variable-tracking document: the noise block once a line, each statement on a line of
  // its own between blocks; the chunk opens inside a block (at sentence `start`), as a reader's
  // chunk cut from the document's tokens does.
  const std::string first = tasks::join({tasks::noise_sentences().begin() + static_cast<std::ptrdiff_t>(start),
                                         tasks::noise_sentences().end()},
                                        " ");
  auto chunk_of = [&](int64_t units) {
    std::vector<std::string> hay;
    for (int64_t i = 0; i < units; ++i) hay.push_back(i == 0 ? first : tasks::noise_block());
    return tasks::assemble(hay, inserts, "\n", true, nullptr);
  };
  // vt_decide: the reply's first token and the one after each of its lines' text: the hop
  // statements' trailing space (RULER's) then the new line, or the new line, or the EOS.
  std::vector<size_t> decisions = {0};
  for (size_t i = reply.find('\n'); i != std::string::npos; i = reply.find('\n', i + 1)) {
    size_t j = i;
    while (j > 0 && reply[j - 1] == ' ') --j;
    decisions.push_back(j);
  }
  decisions.push_back(reply.size());
  return fit_step(task, len, Step::kMemAgent, question, memory, reply, chunk_of, [] { return false; }, tokens, targets,
                  task == "vt_decide" || first_only ? &decisions : nullptr);
}

// The Sculptor reader's text protocol (readers/sculptor.cpp, protocol=text, the shipped model's:
// it has no chat template, so the conversation is its messages' texts one after the other).
// The first message is the sculptor_text template with the question, {fragments} drawn
// log-uniform in [2, 20000] (the model must not depend on it) and the reader's default
// fragment of 512 tokens. The question asks for one needle in the benchmark's wording: a RULER
// numbers needle (two fifths), a UUID needle with a word key (a fifth) or a UUID key
// (niah_multikey_3, a fifth), or the pass key (a fifth).
//   sculptor_search  the reply is the search call "search KEY": KEY as the question and the
//                    needle sentence write it ("pass key" for the passkey);
//   sculptor_answer  after the call, the tool's result message as the reader adds it
//                    (sculptor_result_message of sculptor_search_result): what `search` prints
//                    for a document holding the needle in a haystack (noise sentences or essay),
//                    up to 3 matches, each with its fragment number and 120 characters either
//                    side (fewer at the document's ends); a quarter of the documents hold the
//                    needle sentence twice (same value, a later fragment or the same), a quarter
//                    another key's needle next to the queried one. The reply is \boxed{VALUE}.
Expected<CurriculumSample> Curriculum::sculptor_task(const std::string& task, int64_t len, uint64_t seed,
                                                     int32_t* tokens, int32_t* targets) const {
  constexpr int64_t kFragmentTokens = 512, kAround = 120, kShown = 3;  // the reader's defaults
  tasks::Rng rng(tasks::mix64(seed ^ 0x7363756c70746f72ull));
  len = std::min(len, o_.max_len);
  const int64_t kind = tasks::uniform(rng, 0, 4);  // 0, 1: numbers, 2: UUIDs, 3: UUID keys, 4: pass key
  const bool passkey = kind == 4;
  const std::string type = kind == 2 || kind == 3 ? "uuids" : "numbers";
  std::set<std::string> used;
  auto fresh = [&](bool value, bool uuid) {
    for (;;) {
      std::string v = uuid ? tasks::random_uuid(rng) : value ? value_number(rng, 7) : tasks::random_key_word(rng);
      if (used.insert(v).second) return v;
    }
  };
  std::string key, value, sentence, question;
  if (passkey) {
    key = "pass key";
    value = value_number(rng, 5);
    used.insert(value);
    sentence = "The pass key is " + value + ". Remember it. " + value + " is the pass key.";
    question = "What is the pass key?";
  } else {
    key = fresh(false, kind == 3);
    value = fresh(true, type == "uuids");
    sentence = tasks::needle_sentence(type, key, value);
    question = trim(tasks::niah_single_wording(type, key).question);
  }
  const double u = tasks::uniform01(rng);
  const int64_t fragments =
      std::clamp<int64_t>(std::llround(std::exp(std::log(2.0) + u * (std::log(20000.0) - std::log(2.0)))), 2, 20000);
  const std::string intro =
      render_.text(readers::render(sculptor_text_, {{"problem", question},
                                                    {"fragments", std::to_string(fragments)},
                                                    {"fragment_tokens", std::to_string(kFragmentTokens)}}),
                   sculptor_text_.prefix);
  const std::string call = "search " + key;
  if (task == "sculptor_search") return encode_reply(intro, call, len, tokens, targets);

  // The document around the matches: one region per copy of the needle, each the needle in
  // haystack sentences, in fragment order. Everything is drawn first, so that dropping the
  // second copy or the distractor (where the sequence would not fit) changes nothing else.
  bool repeat = tasks::uniform(rng, 0, 3) == 0, distractor = tasks::uniform(rng, 0, 3) == 0;
  // The distractor: another key's needle (a RULER numbers needle next to the pass key).
  const std::string dtype = passkey ? "numbers" : type;
  const std::string dkey = fresh(false, kind == 3), dvalue = fresh(true, dtype == "uuids");
  const std::string dsentence = tasks::needle_sentence(dtype, dkey, dvalue);
  const bool distractor_before = tasks::uniform(rng, 0, 1) == 1;
  const int64_t edge = tasks::uniform(rng, 0, 7);  // 0: the first region opens the document, 1: the last ends it
  // The fragments of the copies: one alone anywhere, or two in document order.
  const int64_t frag_one = tasks::uniform(rng, 0, fragments - 1);
  std::vector<int64_t> frag = {tasks::uniform(rng, 0, fragments - 1), tasks::uniform(rng, 0, fragments - 1)};
  std::sort(frag.begin(), frag.end());
  const bool essay = !passkey && tasks::uniform(rng, 0, 1) == 1;
  const std::vector<std::string>* words = nullptr;
  if (essay) {
    LC_ASSIGN_OR_RETURN(words, tasks::essay_words());
  }
  struct Region {
    // Haystack sentences before and after the needle, in document order: after_end where the
    // region ends the document.
    std::vector<std::string> before, after, after_end;
  };
  auto sentences = [&](size_t min_chars) {  // haystack sentences from a random place, >= min_chars
    std::vector<std::string> out;
    std::vector<std::string> pool;
    size_t n = 0;
    if (essay) {
      const size_t w = tasks::essay_sentence_start(
          *words, static_cast<size_t>(tasks::uniform(rng, 0, static_cast<int64_t>(words->size()) - 1)));
      pool = tasks::essay_sentences(*words, w, 400);
    } else {
      const auto& noise = tasks::noise_sentences();
      const size_t at = static_cast<size_t>(tasks::uniform(rng, 0, static_cast<int64_t>(noise.size()) - 1));
      for (size_t i = 0; i < 200; ++i) pool.push_back(noise[(at + i) % noise.size()]);
    }
    for (size_t i = 0; i < pool.size() && n < min_chars; ++i) {
      n += pool[i].size() + 1;
      out.push_back(pool[i]);
    }
    return out;
  };
  Region regions[2];
  for (int r = 0; r < 2; ++r) {
    // The neighbourhood shown is 120 characters: a region in the middle of the document has
    // more on each side; at the document's ends there may be less (or nothing).
    const bool opens = r == 0 && edge == 0;
    const size_t before_chars = opens ? static_cast<size_t>(tasks::uniform(rng, 0, kAround)) : kAround + 1;
    const size_t end_chars = static_cast<size_t>(tasks::uniform(rng, 0, kAround));
    regions[r].before = sentences(before_chars);
    regions[r].after = sentences(kAround + 1);
    regions[r].after_end = sentences(end_chars);
  }
  for (;;) {
    const int n_regions = repeat ? 2 : 1;
    std::string doc;
    std::vector<std::pair<size_t, int64_t>> starts;  // region byte start, its fragment
    for (int r = 0; r < n_regions; ++r) {
      std::vector<std::string> parts = regions[r].before;
      if (distractor && r == 0 && distractor_before) parts.push_back(dsentence);
      parts.push_back(sentence);
      if (distractor && r == 0 && !distractor_before) parts.push_back(dsentence);
      const bool ends = r == n_regions - 1 && edge == 1;
      const std::vector<std::string>& after = ends ? regions[r].after_end : regions[r].after;
      parts.insert(parts.end(), after.begin(), after.end());
      if (!doc.empty()) doc += ' ';
      int64_t f = n_regions == 1 ? frag_one : frag[static_cast<size_t>(r)];
      if (r == 0 && edge == 0) f = 0;
      if (ends) f = fragments - 1;
      starts.emplace_back(doc.size(), f);
      doc += tasks::join(parts, " ");
    }
    // `search KEY` over the document, as the tool runs it.
    int64_t total = 0;
    std::vector<std::pair<int64_t, std::string>> shown;
    for (size_t p = doc.find(key); p != std::string::npos; p = doc.find(key, p + 1)) {
      ++total;
      if (static_cast<int64_t>(shown.size()) >= kShown) continue;
      const size_t lo = p >= static_cast<size_t>(kAround) ? p - kAround : 0;
      const size_t hi = std::min(doc.size(), p + key.size() + kAround);
      std::string t = doc.substr(lo, hi - lo);
      for (auto& ch : t)
        if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
      int64_t f = starts[0].second;
      for (const auto& [b, fr] : starts)
        if (p >= b) f = fr;
      shown.emplace_back(f, std::move(t));
    }
    const std::string prompt = intro + call +
                               readers::sculptor_result_message(readers::sculptor_search_result(key, total, shown),
                                                                /*json_mode=*/false, call);
    const std::string reply = "\\boxed{" + value + "}";
    const int64_t n = static_cast<int64_t>(tok_.encode(prompt + reply, true, false).size());  // + EOS - 1
    if (n <= len || len < o_.max_len) return encode_reply(prompt, reply, len, tokens, targets);
    // At the longest length, the second copy and then the distractor go before the sample fails.
    if (repeat) repeat = false;
    else if (distractor) distractor = false;
    else return encode_reply(prompt, reply, len, tokens, targets);
  }
}

// Multi-query associative recall (in the spirit of the MQAR task of Arora et al., 2023,
// "Zoology"): key-value lines, then some keys again, each followed by its value. Every queried
// value is scored, which gives many retrieval targets per sequence.
Expected<CurriculumSample> Curriculum::recall(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const {
  tasks::Rng rng(tasks::mix64(seed));
  // About 12 tokens per line, each key twice; the text is cut at len tokens anyway.
  const int64_t n_pairs = std::max<int64_t>(2, len / 26);
  std::set<std::string> used;
  std::vector<std::pair<std::string, std::string>> kv;
  while (static_cast<int64_t>(kv.size()) < n_pairs) {
    std::string k = tasks::random_key_word(rng);
    if (used.insert(k).second) kv.emplace_back(k, tasks::random_number(rng, 4));
  }
  std::string text = "Remember the number of each key.\n";
  for (const auto& [k, v] : kv) text += k + ": " + v + "\n";
  text += "Recall the numbers.\n";
  std::vector<std::pair<size_t, size_t>> scored;
  std::vector<int64_t> order = tasks::sample_without_replacement(rng, n_pairs, n_pairs);
  for (int64_t q : order) {
    const auto& [k, v] = kv[static_cast<size_t>(q)];
    text += k + ":";
    scored.emplace_back(text.size(), text.size() + 1 + v.size());
    text += " " + v + "\n";
  }
  return encode_scored(text, scored, false, len, tokens, targets);
}

// Needle quiz: niah_multikey_1's needles in its essay haystack, then some of the keys asked
// in RULER's question and answer template, each answer scored. The bench task asks one key
// among 4 needles; a quiz sequence asks up to 3 of its up to 6, and each question names its
// key several tokens before the answer starts, as at evaluation. One sequence thus carries up
// to three key-matching targets. Its generator is seeded apart from the bench tasks' (and the
// evaluation's), so no quiz sequence is an evaluation sample.
Expected<CurriculumSample> Curriculum::quiz(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const {
  tasks::Rng rng(tasks::mix64(seed ^ 0x71a7e5a1ull));
  LC_ASSIGN_OR_RETURN(const std::vector<std::string>* words, tasks::essay_words());
  // A needle takes about 35 tokens and a question about 80 with the 512-piece vocabulary:
  // up to 6 needles, up to 3 of them asked, leave about half of a 1K window to the haystack.
  // Asking only some of the keys keeps elimination ("the needle not asked yet") from
  // answering the later questions: each is a choice among the needles not asked before it.
  const int64_t k_max = std::clamp<int64_t>((std::min(len, o_.max_len) - 64) / 100, 1, 6);
  const int64_t k = tasks::uniform(rng, std::min<int64_t>(2, k_max), k_max);
  const int64_t m = tasks::uniform(rng, 1, std::clamp<int64_t>(k - 1, 1, 3));  // keys 0..m-1 are asked
  std::set<std::string> used;
  std::vector<std::pair<std::string, std::string>> kv;
  while (static_cast<int64_t>(kv.size()) < k) {
    std::string key = tasks::random_key_word(rng), value = tasks::random_number(rng, 7);
    if (used.count(key) || used.count(value)) continue;
    used.insert(key);
    used.insert(value);
    kv.emplace_back(key, value);
  }
  const std::vector<double> depths = tasks::needle_depths(rng, -1, kv.size());
  const std::vector<int64_t> order = tasks::sample_without_replacement(rng, m, m);
  const size_t start = tasks::essay_sentence_start(*words, static_cast<size_t>(tasks::uniform(rng, 0, static_cast<int64_t>(words->size()) - 1)));
  // The text with the first n_keys keys (needles and questions) and n_words of essay.
  auto build = [&](int64_t n_keys, int64_t n_words, std::vector<std::pair<size_t, size_t>>* scored) {
    std::vector<tasks::Insert> inserts;
    for (int64_t i = 0; i < n_keys; ++i) {
      const auto& [key, value] = kv[static_cast<size_t>(i)];
      inserts.push_back({depths[static_cast<size_t>(i)], tasks::needle_sentence("numbers", key, value)});
    }
    std::string text = tasks::niah_single_wording("numbers", "").head +
                       tasks::assemble(tasks::essay_sentences(*words, start, static_cast<size_t>(n_words)),
                                               inserts, " ", false, nullptr);
    scored->clear();
    const int64_t asked = n_keys >= 2 ? std::min(m, n_keys - 1) : 1;  // one needle stays unasked
    for (int64_t q : order) {
      if (q >= asked) continue;
      const auto& [key, value] = kv[static_cast<size_t>(q)];
      const tasks::NiahWording w = tasks::niah_single_wording("numbers", key);
      text += w.question + w.answer_prefix;
      scored->emplace_back(text.size(), text.size() + 2 + value.size());
      text += " " + value + ".";
    }
    return text;
  };
  auto n_tokens = [&](const std::string& text) { return static_cast<int64_t>(tok_.encode(text, true, false).size()) + 1; };  // + EOS
  // Needles are dropped (unasked ones first) until the needles and questions fit; the haystack
  // fills the rest, its size estimated from the tokens per word of a first try and shrunk
  // until the whole text fits.
  std::vector<std::pair<size_t, size_t>> scored;
  int64_t n_keys = k, fixed = 0;
  for (;; --n_keys) {
    fixed = n_tokens(build(n_keys, 0, &scored));
    if (fixed <= len + 1) break;
    if (n_keys == 1) return make_error(fmt::format("curriculum: a quiz of one key needs {} tokens", fixed));
  }
  int64_t n_words = (len + 1 - fixed) / 2;
  std::string text;
  for (int tries = 0;; ++tries) {
    text = build(n_keys, n_words, &scored);
    const int64_t n = n_tokens(text);
    if (n <= len + 1 || n_words == 0) break;
    n_words = tries < 4 ? n_words * (len + 1 - fixed) / std::max<int64_t>(1, n - fixed) * 19 / 20 : 0;
  }
  return encode_scored(text, scored, true, len, tokens, targets);
}

// Copying: a list of words, then the same list again; the copy is scored.
Expected<CurriculumSample> Curriculum::copy(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const {
  tasks::Rng rng(tasks::mix64(seed ^ 0xC0C0C0C0ull));
  const int64_t n_words = std::max<int64_t>(4, len / 11);
  std::vector<std::string> words;
  for (int64_t i = 0; i < n_words; ++i)
    words.push_back(tasks::uniform(rng, 0, 1) ? tasks::random_key_word(rng) : tasks::random_number(rng, 3));
  const std::string list = tasks::join(words, " ");
  std::string text = "Copy the list.\n" + list + "\nCopy:";
  std::vector<std::pair<size_t, size_t>> scored = {{text.size(), text.size() + 1 + list.size()}};
  text += " " + list + ".";
  return encode_scored(text, scored, true, len, tokens, targets);
}

// Random pieces repeated: blocks of 8 to 64 uniformly random vocabulary pieces (no control or
// byte tokens), each written twice, the second time scored. Nothing but copying predicts the
// second copy, so this is the quickest way to grow induction heads (Olsson et al., 2022, "In-
// context Learning and Induction Heads"); words and numbers of the other tasks have unigram
// statistics a model learns first, which slows that down.
CurriculumSample Curriculum::repeat(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const {
  Rng rng(seed);
  const int64_t n = std::min(len, o_.max_len);
  std::vector<int32_t> ids;
  std::vector<bool> sc;
  ids.push_back(tok_.bos() >= 0 ? tok_.bos() : 0);
  sc.push_back(false);
  while (static_cast<int64_t>(ids.size()) < n + 1) {
    const int64_t b = 8 + static_cast<int64_t>(rng.below(57));
    std::vector<int32_t> blk;
    for (int64_t i = 0; i < b; ++i) blk.push_back(plain_ids_[rng.below(plain_ids_.size())]);
    for (int32_t id : blk) ids.push_back(id), sc.push_back(false);
    for (int32_t id : blk) ids.push_back(id), sc.push_back(true);
  }
  CurriculumSample s;
  s.task = "repeat";
  s.n = n;
  for (int64_t t = 0; t < n; ++t) {
    tokens[t] = ids[static_cast<size_t>(t)];
    targets[t] = sc[static_cast<size_t>(t + 1)] ? ids[static_cast<size_t>(t + 1)] : -1;
    s.n_scored += targets[t] >= 0;
  }
  return s;
}

// Induction warm-up: the whole window is blocks of 4 to 16 random vocabulary pieces, each
// written three times, and every token is scored. From the second copy on, a block is predicted
// only by finding the previous occurrence of the current piece and copying what followed it:
// the induction circuit every retrieval task builds on (Olsson et al., 2022). Short blocks
// repeated often put that signal on more than half the tokens, which is what makes the circuit
// form within minutes on this machine (docs/model.md) where answer-only tasks never grow it.
CurriculumSample Curriculum::induction(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const {
  Rng rng(seed);
  const int64_t n = std::min(len, o_.max_len);
  std::vector<int32_t> ids;
  ids.push_back(tok_.bos() >= 0 ? tok_.bos() : 0);
  while (static_cast<int64_t>(ids.size()) < n + 1) {
    const int64_t b = 4 + static_cast<int64_t>(rng.below(13));
    std::vector<int32_t> blk;
    for (int64_t i = 0; i < b; ++i) blk.push_back(plain_ids_[rng.below(plain_ids_.size())]);
    for (int r = 0; r < 3; ++r) ids.insert(ids.end(), blk.begin(), blk.end());
  }
  CurriculumSample s;
  s.task = "induction";
  s.n = n;
  s.n_scored = n;
  for (int64_t t = 0; t < n; ++t) {
    tokens[t] = ids[static_cast<size_t>(t)];
    targets[t] = ids[static_cast<size_t>(t + 1)];
  }
  return s;
}

CurriculumSample Curriculum::text(Rng& rng, int64_t len, int32_t* tokens, int32_t* targets) const {
  const int64_t n = std::min(len, o_.max_len);
  const uint64_t span = text_tokens_.size() - static_cast<size_t>(n);
  const size_t at = static_cast<size_t>(rng.below(span));
  CurriculumSample s;
  s.task = "text";
  s.n = n;
  s.n_scored = n;
  tokens[0] = tok_.bos() >= 0 ? tok_.bos() : text_tokens_[at];
  for (int64_t t = 1; t < n; ++t) tokens[t] = text_tokens_[at + static_cast<size_t>(t) - 1];
  for (int64_t t = 0; t < n; ++t) targets[t] = text_tokens_[at + static_cast<size_t>(t)];
  return s;
}

}  // namespace lc::train
