// Text helpers of the task generators: deterministic random draws (seeded std::mt19937_64,
// never unordered-container order), word lists, sentence splitting, hashing.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace lc::tasks {

using Rng = std::mt19937_64;

// 64-bit FNV-1a; stable across platforms (std::hash is not), so seeds and input hashes are
// reproducible from one machine to the next.
uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull);
uint64_t fnv1a_ids(const std::vector<int32_t>& ids);
// splitmix64 finaliser: spreads nearby seeds apart.
uint64_t mix64(uint64_t x);
// The seed of one sample: a function of the run seed and the sample's coordinates only, so a
// sample is the same whatever else the matrix holds (and a resumed run regenerates it).
uint64_t sample_seed(uint64_t base, std::string_view task, int64_t length, int depth, int64_t index);

// Uniform integer in [lo, hi] (inclusive). Written out instead of
// std::uniform_int_distribution, whose output differs between standard libraries.
int64_t uniform(Rng& rng, int64_t lo, int64_t hi);
double uniform01(Rng& rng);
template <class T>
void shuffle(std::vector<T>& v, Rng& rng) {  // Fisher-Yates with our own uniform()
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(i) - 1))]);
}
// k distinct integers from [0, n), in the order drawn.
std::vector<int64_t> sample_without_replacement(Rng& rng, int64_t n, int64_t k);

std::string random_number(Rng& rng, int digits);   // no leading zero
std::string random_uuid(Rng& rng);                 // RFC 4122 version-4 layout
std::string random_key_word(Rng& rng);             // "adjective-noun", as RULER's word keys
std::string pseudo_word(Rng& rng, int syllables);  // pronounceable, lower case
std::string coded_word(Rng& rng, int letters);     // random lower-case letters (FWE)

// Built-in English word lists (written for this project; common words, no licence concerns).
const std::vector<std::string_view>& adjectives();
const std::vector<std::string_view>& nouns();
const std::vector<std::string_view>& first_names();
// Distinct words for the common-words task: the list words first, then pseudo-words.
std::vector<std::string> word_pool(Rng& rng, size_t n);

// Sentences of a text: split after '.', '!' or '?' followed by white space; white space is
// collapsed to single spaces.
std::vector<std::string> split_sentences(std::string_view text);
std::vector<std::string> split_words(std::string_view text);  // on white space
std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::string to_lower(std::string_view s);
bool icontains(std::string_view haystack, std::string_view needle);  // ASCII case-insensitive
size_t count_occurrences(std::string_view haystack, std::string_view needle);
std::string hex64(uint64_t v);
// "4096", "4K", "128k", "1M" -> tokens; -1 if malformed.
int64_t parse_length(std::string_view s);

}  // namespace lc::tasks
