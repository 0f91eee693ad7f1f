// Internals shared by the task generators (not part of the bench API).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/tasks.h"
#include "bench/text.h"

namespace lc::bench::detail {

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

// Task generators: the layouts of one sample.
using MakeLayouts = Expected<std::vector<Layout>> (*)(const SampleSpec& spec, uint64_t seed);

Expected<std::vector<Layout>> make_niah(const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_vt(const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_cwe(const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_fwe(const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_qa(const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_passkey(const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_babilong(const SampleSpec& spec, uint64_t seed);
Expected<std::vector<Layout>> make_dense(const SampleSpec& spec, uint64_t seed);

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

// `n` haystack sentences cycling through the noise sentences.
std::vector<std::string> noise_haystack(int64_t n);

}  // namespace lc::bench::detail
