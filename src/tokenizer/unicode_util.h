// Unicode helpers shared by the tokenizers: a UTF-8 decoder that never fails, codepoint classes
// (from ICU) as the pre-tokeniser regexes see them, and GPT-2's byte <-> unicode mapping.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lc::tok {

// Length of the UTF-8 sequence a lead byte announces (1 for stray continuation bytes), the way
// llama.cpp splits text into symbols.
inline size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes one codepoint at `pos` and advances it. Malformed input gives U+FFFD and advances one
// byte, so any byte string decodes (the BPE pre-tokeniser then sees U+FFFD, as llama.cpp does).
uint32_t decode_utf8(std::string_view s, size_t& pos);
std::vector<uint32_t> decode_utf8_all(std::string_view s);
void append_utf8(std::string& out, uint32_t cpt);

// Codepoint classes used by the pre-tokeniser regexes (\p{L}, \p{N}, \p{P}, \s) and by
// WordPiece's normaliser (\p{S}, \p{M}, and \p{C} less the unassigned codepoints).
enum CptClass : uint8_t {
  kLetter = 1 << 0,
  kNumber = 1 << 1,
  kPunct = 1 << 2,
  kSpace = 1 << 3,  // Unicode White_Space
  kSymbol = 1 << 4,
  kMark = 1 << 5,
  kControl = 1 << 6,  // Cc, Cf, Co, Cs: llama.cpp's CONTROL flag (Cn is not one)
};
uint8_t cpt_class(uint32_t cpt);
uint32_t cpt_tolower(uint32_t cpt);  // simple (one codepoint) lowercase mapping
// The first codepoint of the codepoint's canonical decomposition (NFD), or the codepoint itself
// when it has none: llama.cpp's unicode_cpts_normalize_nfd maps each codepoint to exactly this
// one, so U+00E9 gives 'e' and its accent is gone without a combining mark left behind.
uint32_t cpt_nfd_first(uint32_t cpt);

// GPT-2 bytes_to_unicode: every byte maps to a printable codepoint so byte-level BPE tokens are
// valid text. byte_to_utf8[b] is the UTF-8 of the codepoint standing for byte b.
struct ByteUnicode {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cpt_to_byte;  // -1 where the codepoint stands for no byte
};
const ByteUnicode& byte_unicode();

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or codepoints past U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace lc::tok
