// Internal: the concrete tokenizers and the loader that fills them from GGUF metadata.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace lc {

namespace tok {
// llama.cpp's token attribute bits. They are bits, not the GGUF token_type enum, because the
// loader adds CONTROL to end-of-generation tokens and RSTRIP/LSTRIP to some model's tokens.
enum : uint32_t {
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
};
// "<0xAB>" -> 0xAB, or -1 when the text is not a byte token.
int parse_byte_token(std::string_view text);
}  // namespace tok

// SentencePiece BPE ("llama"): bigram merges by score over characters, byte fallback.
class SpmTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool special = false) const override;

 private:
  friend class TokenizerLoader;
  void encode_fragment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_chunk(std::string_view text, std::vector<int32_t>& out) const;
  std::array<int32_t, 256> byte_token_{};  // id of each byte's fallback token, or -1
  bool split_at_spaces_ = false;  // no token has U+2581 right after another character
  size_t max_token_len_ = 0;  // bytes; longer candidate merges need no lookup
};

// Byte-level BPE ("gpt2"): regex pre-tokeniser, then merges by rank inside each word.
class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer() : pre_tok_(tok::PreType::kDefault) {}
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool special = false) const override;

 private:
  friend class TokenizerLoader;
  struct Scratch;
  void encode_fragment(std::string_view text, std::vector<int32_t>& out, Scratch& s) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out, Scratch& s) const;
  int32_t rank(std::string_view left, std::string_view right, std::string& key) const;

  tok::PreTokenizer pre_tok_;
  bool ignore_merges_ = false;  // whole words found in the vocabulary skip the merges (llama3)
  // "left right" merge strings -> rank (merge order).
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;
};

}  // namespace lc
