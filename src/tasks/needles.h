// Needles in haystacks: the public building blocks of the needle tasks' text. The benchmark's
// samples (make_sample in tasks.h) are built from them, and so are the trainer's curriculum
// tasks (train/curriculum.cpp), so that a trained needle reads like a benchmark needle.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "tasks/tasks.h"
#include "tasks/text.h"

namespace lc::tasks {

// Something to hide at a depth (percent of the haystack).
struct Insert {
  double depth = 0;  // 0..100
  std::string text;
};

// Joins haystack sentences with `sep` and puts each insert at the sentence boundary nearest
// its depth (boundary b of n sits before sentence b). Inserts at the same boundary keep
// their order. With own_line, an insert sits on a line of its own. Records where each insert
// landed in `needles`, in the order of `inserts`.
std::string assemble(const std::vector<std::string>& hay, const std::vector<Insert>& inserts,
                     const std::string& sep, bool own_line, std::vector<Needle>* needles);

// Depths for k needles: the first at `depth` when it is >= 0, the rest drawn from RULER's
// 40 depths without replacement (all drawn when depth < 0).
std::vector<double> needle_depths(Rng& rng, int depth, size_t k);

// RULER's needle sentence: "One of the special magic {type} for {key} is: {value}."
std::string needle_sentence(const std::string& type, const std::string& key, const std::string& value);

// RULER's wording for one queried key with one value (the singular template): the prompt is
// head + context + question, and the answer follows answer_prefix. type is plural ("numbers").
struct NiahWording {
  std::string head, question, answer_prefix;
};
NiahWording niah_single_wording(const std::string& type, const std::string& query);

// RULER's variable tracking (tasks_ruler.cpp): the instruction, the question and answer prefix
// of the value's chain, n distinct names of `letters` upper-case letters (not in `used`, and
// added to it), and the chain's statements ("VAR A = value", then "VAR B = VAR A " ...).
std::string vt_head();
std::string vt_question(const std::string& value);
std::string vt_answer_prefix(size_t num_v, const std::string& value);
std::vector<std::string> vt_names(Rng& rng, size_t n, int letters, std::set<std::string>& used);
std::vector<std::string> vt_chain(const std::vector<std::string>& vars, const std::string& value);
// RULER's one-shot example of variable tracking as the vt task prepends it to a sample:
// vt_example_blocks is the run's number of noise blocks (the most that keep the example's
// prompt within 500 tokens of `tok`, at least 5); vt_example the text (the example's prompt,
// " ", its answer, two new lines) with 3-letter names (not in `used`, added to it) and a value
// drawn from rng, the statements at the run's positions.
int64_t vt_example_blocks(const Tokenizer& tok, uint64_t run_seed);
std::string vt_example(uint64_t run_seed, int64_t blocks, Rng& rng, std::set<std::string>& used);

}  // namespace lc::tasks
