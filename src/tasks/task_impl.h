// Internals shared by the task generators: included only by src/tasks/*.cpp, never by another
// module (the public API is tasks.h, needles.h, text.h, haystack.h and score.h).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tasks/needles.h"
#include "tasks/tasks.h"
#include "tasks/text.h"

namespace lc::tasks::detail {

// One candidate prompt for a haystack size: what the fitter tokenizes.
struct Built {
  std::string context, user, answer_prefix;
  std::vector<std::string> answers;
  std::vector<Needle> needles;
  std::vector<std::pair<std::string, std::string>> info;
};

// A way to build the task at any haystack size. build(units) must be a pure function of
// units (it reseeds its own generator), and the prompt should grow with units, so that the
// fitter can binary-search. A task may offer several layouts, most faithful first (e.g. the
// common-words task drops its worked example at short lengths); the first whose smallest
// haystack fits is used.
struct Layout {
  std::function<Expected<Built>(int64_t units)> build;
  int64_t min_units = 0;
  std::string unit;
};

// Task generators: the layouts of one sample. The renderer's tokenizer sizes what RULER sizes in
// tokens apart from the prompt (vt's one-shot example).
using MakeLayouts = Expected<std::vector<Layout>> (*)(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);

Expected<std::vector<Layout>> make_niah(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_vt(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_cwe(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_fwe(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_qa(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_passkey(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_babilong(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_dense(const PromptRenderer& r, const SampleSpec& spec, uint64_t seed);

// `n` haystack sentences cycling through the noise sentences.
std::vector<std::string> noise_haystack(int64_t n);

}  // namespace lc::tasks::detail
