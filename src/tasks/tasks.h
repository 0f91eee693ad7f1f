// Long-context task generators: the 13 RULER tasks (Hsieh et al., 2024, "RULER: What's the
// Real Context Size of Your Long-Context Language Models?"), passkey retrieval, a
// BABILong-style family (bAbI facts scattered in book text) and dense-reasoning tasks in the
// spirit of MMReD (the answer needs every observation, not one needle).
//
// A sample is generated with the model's own tokenizer and chat template: the haystack size
// is found by binary search so that the prompt plus the answer budget fills the requested
// length exactly (n_prompt + max_new_tokens == length, with max_new_tokens at least the
// task's budget). Everything is a function of (run seed, task, length, depth, index).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace lc::tasks {

enum class Metric {
  kMatchAll,     // RULER string_match_all: mean over references of "contained in the output"
  kMatchPart,    // RULER string_match_part: any reference contained
  kFirstNumber,  // counting tasks: the first integer of the output equals the reference
};
const char* metric_name(Metric m);

struct TaskInfo {
  std::string name;
  std::string family;       // "ruler", "passkey", "babilong", "dense"
  std::string description;  // one line: what it measures
  Metric metric = Metric::kMatchAll;
  int64_t new_tokens = 32;  // the answer budget (RULER's tokens_to_generate)
  bool uses_depth = false;  // whether the depth axis of the run matrix means anything
};

const std::vector<TaskInfo>& task_list();
const TaskInfo* find_task(std::string_view name);
// Task names and groups ("ruler", "passkey", "babilong", "dense", "all") to task names, in
// the order given, duplicates dropped.
Expected<std::vector<std::string>> expand_task_names(const std::vector<std::string>& names);

// RULER's 40 evenly spaced needle depths, in percent: round(i * 100 / 39).
const std::vector<int>& ruler_depths();

struct GenOptions {
  int64_t max_new_tokens = 0;  // > 0: cap on every task's answer budget (small suites)
  int64_t observations = 0;    // dense tasks: 0 = as many observations as fit; N = exactly N,
                               // spread through essay filler that fills the length
};

struct SampleSpec {
  std::string task;
  int64_t length = 4096;  // tokens: prompt + answer budget
  int depth = -1;         // percent, for tasks that use it; -1: drawn from ruler_depths()
  int64_t index = 0;      // sample number within its cell
  uint64_t seed = 42;     // the run's seed
  GenOptions opts;
};

// A needle (or fact, or gold document) as placed in the context.
struct Needle {
  std::string text;
  size_t pos = 0;      // byte offset in Sample::context
  double depth = 0;    // pos / context size, in [0, 1]
};

struct Sample {
  SampleSpec spec;
  uint64_t seed = 0;            // sample_seed(spec...)
  std::string context;          // the haystack with what was hidden in it
  std::string user;             // the whole user message (instructions, context, question)
  std::string answer_prefix;    // appended after the question (after the assistant header)
  std::vector<std::string> answers;
  std::vector<Needle> needles;  // needles[0] is the queried one where a task has needles
  std::vector<int32_t> tokens;  // the prompt as the model sees it
  int64_t n_prompt = 0;
  // Prompt tokens up to the end of the context (the question and answer prefix follow): where
  // a query-agnostic press compresses. The tokens of the text up to the context's end and of the
  // whole prompt share this prefix (a token straddling the boundary belongs to the question).
  int64_t n_context_tokens = 0;
  int64_t max_new_tokens = 0;   // length - n_prompt
  int64_t budget_new_tokens = 0;  // the task's answer budget (max_new_tokens >= it)
  int64_t size_units = 0;       // haystack size found by the search
  std::string unit;             // its unit: "sentences", "words", "needles", ...
  std::vector<std::pair<std::string, std::string>> info;  // task facts, in a fixed order
  std::string input_hash;       // FNV-1a of the token ids, hex
};

// Renders a user message and an answer prefix into the model's prompt: the chat template when
// the model has one (the prefix then starts the assistant's turn), else the plain text.
class PromptRenderer {
 public:
  PromptRenderer(const Tokenizer& tok, ChatTemplate tmpl) : tok_(tok), tmpl_(tmpl) {}
  std::string text(const std::string& user, const std::string& answer_prefix) const;
  std::vector<int32_t> tokens(const std::string& user, const std::string& answer_prefix) const;
  const Tokenizer& tokenizer() const { return tok_; }
  ChatTemplate chat_template() const { return tmpl_; }

 private:
  const Tokenizer& tok_;
  ChatTemplate tmpl_;
};

Expected<Sample> make_sample(const PromptRenderer& r, const SampleSpec& spec);

}  // namespace lc::tasks
