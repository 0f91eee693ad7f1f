// The synthetic long-context curriculum: training sequences drawn from the benchmark's own
// task generators (src/tasks: passkey, RULER needles with distractors, variable tracking,
// counting and state tracking) with seeds of their own, plus generators that exist for
// training only (multi-query associative recall, a quiz of several keys of multi-key needles,
// copying of words, repeated random pieces, the induction warm-up, and plain text that keeps a
// language prior). A task sequence scores either only its answer (and the end-of-sequence
// token that stops generation; the prompt's targets are -1) or, with probability lm_fraction,
// every token. Plain text scores every token.
//
// The reading agents' protocols (src/readers) have tasks of their own, not in the default mix,
// each a prompt rendered from the reader's real template (data/readers/*.txt, so training and
// inference share one prompt text) with a needle question of the benchmark's wording:
//   mem_update  memagent_update: the chunk holds the queried needle or not (distractor needles
//               of other keys), the previous memory is "No previous memory", the queried needle
//               sentence, or another key's; the reply (the new memory) is the queried needle
//               sentence when the chunk holds it, else the previous memory when it holds it,
//               else "No previous memory";
//   mem_carry   memagent_update's carry case alone: the memory holds the queried sentence, the
//               chunk does not (other keys' needles at most); the reply is the memory;
//   mem_answer  memagent_final: a memory holding the queried needle sentence (and sometimes
//               another key's); the reply is \boxed{VALUE};
//   vt_update   memagent_update on RULER's variable tracking: the memory holds the chain's first
//               statements, the chunk the next 0-2; the reply adds them, one a line;
//   vt_decide   vt_update's sequence scored only where the reply decides: its first token
//               (a statement or "No previous memory") and the token after each of its lines'
//               text (a hop's trailing space or a new line, which go on; or the end);
//   vt_first    vt_decide with a memory of at most the chain's first statement;
//   vt_open     memagent_update on the document's first chunk: RULER's one-shot example (its own
//               chain, another value), the task's instruction and the context's start with the
//               chain's first 0-2 statements; the reply is those statements, or "No previous
//               memory" (never the example's);
//   vt_answer   memagent_final on a memory of the chain's statements: \boxed{the variables};
//   smooth_note smooth_read: the chunk holds the queried needle or not, the notes so far are
//               "none yet", another key's sentence or the queried one; the reply is the queried
//               sentence when the chunk holds it, else "none";
//   smooth_answer smooth_final: notes holding the queried sentence (and sometimes others');
//               the reply is \boxed{VALUE};
//   map_answer  mapreduce_map: the chunk holds the queried needle or not; the reply is the
//               value, or "none";
//   sculptor_search  sculptor_text (Sculptor's first message, text protocol; {fragments} drawn
//               log-uniform in [2, 20000]); the reply is the search call "search KEY" (KEY the
//               queried needle's key as the question and needle write it, "pass key" for the
//               passkey);
//   sculptor_answer  that message, the call "search KEY" and the tool's result message (what
//               `search` prints for a document holding the needle: up to 3 matches with 120
//               characters either side; sometimes the needle twice, or another key's needle
//               next to it); the reply is \boxed{VALUE}.
// Questions are RULER's numbers and UUIDs needles (the Sculptor tasks also niah_multikey_3's
// UUID keys) or the passkey; haystacks are the noise
// sentences or the essay; chunks are sized as the readers size them for the sequence's length.
//
// Disjoint from evaluation: an evaluation sample's generator is seeded with
// sample_seed(run seed, task, length, depth, index >= 0); a training sample is the bench
// sample with index -1, which evaluation never uses, under a fresh 64-bit run seed drawn from
// the trainer's generator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tasks/tasks.h"
#include "tasks/text.h"
#include "core/status.h"
#include "readers/templates.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/rng.h"

namespace lc::train {

struct CurriculumTask {
  std::string name;  // a bench task, or "recall", "quiz", "copy", "repeat", "induction", "text",
                     // "mem_update", "mem_carry", "mem_answer", "vt_update", "vt_decide", "vt_first",
                     // "vt_open", "vt_answer", "map_answer",
                     // "smooth_note", "smooth_answer", "sculptor_search", "sculptor_answer"
  double weight = 1;
};

// "default" (the mix the shipped model is trained on), or "name=weight,..." / "name,...".
// Unknown names and non-positive weights are errors that name them.
Expected<std::vector<CurriculumTask>> parse_curriculum(const std::string& spec);
std::string curriculum_to_string(const std::vector<CurriculumTask>& tasks);

struct CurriculumOptions {
  std::vector<CurriculumTask> tasks;
  int64_t min_len = 256;  // shortest sequence, tokens (a task that needs more gets its minimum)
  int64_t max_len = 1024; // longest sequence (the training window)
  // The longest length drawn grows linearly from min_len to max_len over this fraction of
  // the run's steps; lengths are uniform in [min_len, current longest].
  double ramp = 0.3;
  int64_t total_steps = 1;
  // Fraction of task sequences that score every token (prompt and answer) instead of the answer
  // only. Predicting a haystack of repeated sentences and needles is what grows the copying
  // (induction) circuits that retrieval needs; the answer-only sequences then weigh the answer
  // fully (a window's loss is the mean over its scored tokens).
  double lm_fraction = 0.5;
  // "repeat" and "induction" draw their random pieces from the first `alphabet` text pieces of
  // the vocabulary (lowest ids: a BPE vocabulary's bytes and most frequent merges); 0 = all.
  // A large vocabulary's induction warm-up stalls where 512 pieces form the circuit
  // (docs/model.md). The trainer then keeps the other pieces' embeddings frozen
  // (warmup_pieces()).
  int64_t alphabet = 0;
  // Fraction of the reader protocol tasks' number values (RULER's 7-digit needle values and the
  // 5-digit pass key) drawn from 2 to 4 distinct digits (hard_number()), where runs and
  // repeated pairs make a copy by content alone ambiguous (5055554 read back as 5055555).
  // The rest, and every bench task, draw RULER's uniform digits. 0 draws nothing extra, so a
  // recipe without it gives the same sequences as before it existed.
  double hard_values = 0;
};

// A number of `digits` digits (no leading zero) drawn from a random set of 2 to 4 distinct
// digits: every adjacent pair and run recurs, so only the position in the number tells which
// digit comes next.
std::string hard_number(tasks::Rng& rng, int digits);

struct CurriculumSample {
  std::string task;
  int64_t n = 0;         // tokens (<= max_len)
  int64_t n_scored = 0;  // targets >= 0
};

class Curriculum {
 public:
  // text: plain text for the "text" task (its tokens); null = the shipped essay text.
  static Expected<std::unique_ptr<Curriculum>> create(const Tokenizer& tok, const CurriculumOptions& o,
                                                      const TokenData* text = nullptr);
  // One training sequence for optimizer step `step`: tokens and targets (both [max_len];
  // targets[t] is the token after tokens[t], or -1 where not scored). Draws only from rng.
  Expected<CurriculumSample> sample(Rng& rng, int64_t step, int32_t* tokens, int32_t* targets) const;
  // The length bound at a step (the ramp).
  int64_t max_len_at(int64_t step) const;
  // Where an alphabet is set and every task draws random pieces (repeat, induction): the only
  // pieces a sequence can hold (the alphabet and BOS), sorted. Empty otherwise.
  std::vector<int32_t> warmup_pieces() const;
  const CurriculumOptions& options() const { return o_; }

 private:
  Curriculum(const Tokenizer& tok) : tok_(tok), render_(tok, ChatTemplate::kNone) {}
  // A sequence of a task other than "text".
  Expected<CurriculumSample> draw(const std::string& task, int64_t len, uint64_t seed, int32_t* tokens,
                                  int32_t* targets) const;
  Expected<CurriculumSample> bench_task(const std::string& task, int64_t len, uint64_t seed, int32_t* tokens,
                                        int32_t* targets) const;
  Expected<CurriculumSample> recall(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const;
  Expected<CurriculumSample> quiz(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const;
  Expected<CurriculumSample> copy(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const;
  // The reader protocol tasks: "mem_update", "mem_carry", "mem_answer", "map_answer",
  // "smooth_note", "smooth_answer".
  Expected<CurriculumSample> reader_task(const std::string& task, int64_t len, uint64_t seed, int32_t* tokens,
                                         int32_t* targets) const;
  // MemAgent on variable tracking: "vt_update", "vt_decide", "vt_first", "vt_open", "vt_answer".
  Expected<CurriculumSample> vt_task(const std::string& task, int64_t len, tasks::Rng& rng, int32_t* tokens,
                                     int32_t* targets) const;
  // A reader step (memagent's update with memory `state`, mapreduce's map, or smooth's round
  // with notes `state`) with the reader's chunk; drop() takes a distractor out when the needles
  // alone do not fit.
  enum class Step { kMemAgent, kMap, kSmooth };
  Expected<CurriculumSample> fit_step(const std::string& task, int64_t len, Step step, const std::string& question,
                                      const std::string& state, const std::string& reply,
                                      const std::function<std::string(int64_t)>& chunk_of,
                                      const std::function<bool()>& drop, int32_t* tokens, int32_t* targets,
                                      const std::vector<size_t>* only_at = nullptr) const;
  // The Sculptor reader's text protocol: "sculptor_search", "sculptor_answer".
  Expected<CurriculumSample> sculptor_task(const std::string& task, int64_t len, uint64_t seed, int32_t* tokens,
                                           int32_t* targets) const;
  CurriculumSample text(Rng& rng, int64_t len, int32_t* tokens, int32_t* targets) const;
  // A reader task's number value: hard_number() with probability hard_values, else RULER's.
  std::string value_number(tasks::Rng& rng, int digits) const;
  CurriculumSample repeat(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const;
  CurriculumSample induction(int64_t len, uint64_t seed, int32_t* tokens, int32_t* targets) const;
  // Tokenizes prompt + reply (with BOS) and scores the reply and EOS; the reply's tokens must
  // continue the prompt's, and the whole must fit `len` tokens (an error otherwise, not a cut).
  // With only_at, only the positions that predict the token starting at each of those reply
  // offsets are scored (reply.size(): the EOS); each offset must be a token boundary.
  Expected<CurriculumSample> encode_reply(const std::string& prompt, const std::string& reply, int64_t len,
                                          int32_t* tokens, int32_t* targets,
                                          const std::vector<size_t>* only_at = nullptr) const;
  // The byte offset in `text` where each of its tokens `ids` (text's encoding) starts, and the
  // text's size at the end; an error where the pieces do not spell the text.
  Expected<std::vector<size_t>> token_starts(const std::vector<int32_t>& ids, const std::string& text) const;
  // Tokenizes `text` (with BOS) and scores the tokens that lie inside the byte ranges `scored`,
  // plus EOS at the end when eos is set; cut to `len` tokens.
  Expected<CurriculumSample> encode_scored(const std::string& text, const std::vector<std::pair<size_t, size_t>>& scored,
                                           bool eos, int64_t len, int32_t* tokens, int32_t* targets) const;

  const Tokenizer& tok_;
  tasks::PromptRenderer render_;
  CurriculumOptions o_;
  std::vector<double> cdf_;          // cumulative task weights
  std::vector<int64_t> min_len_;     // per task: its shortest workable length (>= o_.min_len)
  std::vector<int32_t> text_tokens_; // the plain text
  std::vector<int32_t> plain_ids_;   // vocabulary pieces that are text (not control, not a lone byte)
  // The readers' templates, loaded when a reader task is in the mix.
  readers::Template mem_update_, mem_final_, map_, smooth_read_, smooth_final_, sculptor_text_;
};

}  // namespace lc::train
