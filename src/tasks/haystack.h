// Haystacks: the built-in noise text and the shipped public-domain essay text
// (data/haystack/opticks.txt, Newton's Opticks; see data/haystack/README.md).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace lc::tasks {

// The noise text of RULER's haystack, one sentence per entry (the passkey task and the
// curriculum cycle through them).
const std::vector<std::string>& noise_sentences();
// RULER's noise haystack unit (scripts/data/synthetic/niah.py and variable_tracking.py): the
// five sentences as one block, "The grass is green. ... There and back again."; RULER's
// haystack is this block repeated, one block a line.
const std::string& noise_block();

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
