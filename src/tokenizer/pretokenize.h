// Pre-tokenisers of the byte-level BPE families: the text is split into words by a cascade of
// regexes (each regex splits every piece left by the previous one into matches and the gaps
// between them, as llama.cpp's unicode_regex_split does). std::regex cannot express \p{L}, so
// each regex is a hand-written matcher over ICU codepoint classes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lc::tok {

// The pre-tokeniser families (llama.cpp's LLAMA_VOCAB_PRE_TYPE_* that share a regex set).
enum class PreType {
  kDefault,        // "default", missing or unknown pre: llama.cpp's default regex cascade
  kLlama3,         // llama3, llama-bpe, ... (also dbrx, smaug-bpe, chatglm-bpe/glm4)
  kQwen2,          // qwen2, stablelm2, megrez, deepseek-r1-qwen: llama3 regex with \p{N}
  kGpt2,           // gpt-2, mpt, olmo, jais, phi-2, ...
  kStarcoder,      // starcoder, refact, command-r, smollm, codeshell, exaone, minerva-7b
  kFalcon,         // falcon
  kDeepseekLlm,    // deepseek-llm
  kDeepseekCoder,  // deepseek-coder
};

class PreTokenizer {
 public:
  explicit PreTokenizer(PreType type) : type_(type) {}
  // Splits `cpts` into words; returns the length (in codepoints) of each word, in order.
  std::vector<size_t> split(const std::vector<uint32_t>& cpts) const;

 private:
  PreType type_;
};

}  // namespace lc::tok
