// Finds special tokens in raw text with the precedence of llama.cpp's tokenizer_st_partition
// (every special token, longest first, splits every remaining text fragment at each of its
// leftmost non-overlapping occurrences), but in one Aho-Corasick pass instead of one scan of
// the text per special token: vocabularies with thousands of user-defined tokens and prompts
// of megabytes would otherwise cost billions of comparisons.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lc::tok {

struct SpecialPattern {
  int32_t id;
  std::string text;
  bool lstrip = false;  // drop whitespace before the token
  bool rstrip = false;  // drop whitespace after the token
};

struct SpecialMatch {
  size_t begin, end;
  int32_t id;
  bool lstrip, rstrip;
};

class SpecialAutomaton {
 public:
  // `patterns` in precedence order (longest first); empty texts are ignored.
  explicit SpecialAutomaton(std::vector<SpecialPattern> patterns);
  bool empty() const { return patterns_.empty(); }
  // The accepted occurrences, sorted by position and non-overlapping.
  std::vector<SpecialMatch> find(std::string_view text) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t fail = 0;
    int32_t out = -1;   // pattern ending exactly here
    int32_t dict = -1;  // nearest node on the fail chain with out >= 0
    int32_t depth = 0;
  };
  int32_t child(int32_t node, uint8_t b) const;
  int32_t step(int32_t state, uint8_t b) const;

  std::vector<SpecialPattern> patterns_;
  std::vector<Node> nodes_;
  std::array<int32_t, 256> root_next_{};
};

class SpecialMatcher {
 public:
  SpecialMatcher(std::vector<SpecialPattern> user_defined, std::vector<SpecialPattern> all)
      : user_(std::move(user_defined)), all_(std::move(all)) {}
  const SpecialAutomaton& get(bool parse_special) const { return parse_special ? all_ : user_; }

 private:
  SpecialAutomaton user_;  // what is matched without parse_special
  SpecialAutomaton all_;
};

}  // namespace lc::tok
