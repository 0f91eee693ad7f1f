// Haystacks: the built-in noise text and the shipped public-domain essay text
// (data/haystack/opticks.txt, Newton's Opticks; see data/haystack/README.md).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace lc::tasks {

// RULER's noise haystack, one sentence per entry; haystacks cycle through them.
const std::vector<std::string>& noise_sentences();

// Where the shipped texts are looked for, in order: the folder set here (the CLI's
// --data-dir), $LONGCTX_DATA_DIR, data/haystack next to the executable or one or two
// folders up (build trees), and the source tree this file was compiled from.
void set_data_dir(std::string dir);
Expected<std::string> find_data_file(const std::string& name);

// The essay text as words (white-space split, paragraphs joined), loaded once.
Expected<const std::vector<std::string>*> essay_words();

// `n_words` words of the essay starting at word `start` (wrapping around at the end), cut
// into sentences. The last sentence may be cut short, as RULER truncates its essays.
std::vector<std::string> essay_sentences(const std::vector<std::string>& words, size_t start,
                                         size_t n_words);
// Index of the first word of a sentence at or after `w` (so haystacks start cleanly).
size_t essay_sentence_start(const std::vector<std::string>& words, size_t w);

}  // namespace lc::tasks
