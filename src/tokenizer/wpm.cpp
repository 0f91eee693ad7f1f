// WordPiece tokenizer ("bert" vocabularies), matching llama.cpp's llm_tokenizer_wpm. The GGUF
// stores BERT's vocabulary with word-initial pieces as U+2581 + "piece" and continuations
// ("##piece" in BERT's own vocab.txt) as bare "piece", so a word is matched with U+2581 in
// front and no continuation marker is needed.
#include <algorithm>
#include <string>
#include <vector>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"

namespace lc {

namespace {

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581

// The CJK ideograph blocks BERT (and llama.cpp after it) gives a word each. The fifth range
// starts at U+2B920, not U+2B820, as in Hugging Face's Rust tokenizer.
bool is_cjk_ideograph(uint32_t c) {
  struct Range {
    uint32_t lo, hi;
  };
  static constexpr Range kRanges[] = {
      {0x4E00, 0x9FFF},   {0x3400, 0x4DBF},   {0x20000, 0x2A6DF}, {0x2A700, 0x2B73F},
      {0x2B740, 0x2B81F}, {0x2B920, 0x2CEAF}, {0xF900, 0xFAFF},   {0x2F800, 0x2FA1F},
  };
  for (const Range& r : kRanges)
    if (c >= r.lo && c <= r.hi) return true;
  return false;
}

}  // namespace

void WpmTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  // Longest match first at every position; one position without any match discards the pieces
  // found so far and the whole word becomes the unknown token. Positions are bytes; a match
  // always ends on a character boundary because vocabulary entries are whole characters, and a
  // position that is not on one finds nothing, as in llama.cpp.
  const size_t start = out.size();
  const size_t n = word.size();
  for (size_t i = 0; i < n;) {
    bool found = false;
    for (size_t j = std::min(n, i + max_token_len_ + 1); j > i; --j) {
      const int32_t id = lookup(word.substr(i, j - i));
      if (id >= 0) {
        out.push_back(id);
        i = j;
        found = true;
        break;
      }
    }
    if (!found) {
      out.resize(start);
      break;
    }
  }
  // llama.cpp pushes the unknown id even when there is none (-1); no token is better than that.
  if (out.size() == start && unk_ >= 0) out.push_back(unk_);
}

void WpmTokenizer::encode_fragment(std::string_view text, std::vector<int32_t>& out,
                                   std::string& word) const {
  // BERT's normaliser as llama.cpp's llm_tokenizer_wpm_session::preprocess applies it, fused
  // with the matching so that no list of words is built: word holds U+2581 and the word so far.
  word.assign(kWordStart);
  const auto finish = [&] {
    if (word.size() > kWordStart.size()) encode_word(word, out);
    word.assign(kWordStart);
  };
  std::string single;
  for (size_t pos = 0; pos < text.size();) {
    // Ill-formed UTF-8 decodes to U+FFFD, one byte at a time, which is then dropped.
    uint32_t c = tok::decode_utf8(text, pos);
    if (strip_accents_) c = tok::cpt_nfd_first(c);
    const uint8_t cls = tok::cpt_class(c);
    if (cls & tok::kSpace) {
      finish();
      continue;
    }
    if (c == 0 || c == 0xFFFD || (cls & tok::kControl)) continue;
    if (strip_accents_ && (cls & tok::kMark)) continue;
    const uint32_t lower = lowercase_ ? tok::cpt_tolower(c) : c;
    // Punctuation, ASCII symbols and CJK ideographs are words of their own (the codepoint
    // before lowercasing decides, as in llama.cpp).
    if ((cls & tok::kPunct) || (c < 0x7F && (cls & tok::kSymbol)) || is_cjk_ideograph(c)) {
      finish();
      single.assign(kWordStart);
      tok::append_utf8(single, lower);
      encode_word(single, out);
      continue;
    }
    tok::append_utf8(word, lower);
  }
  finish();
}

std::vector<int32_t> WpmTokenizer::encode_segments(std::string_view text,
                                                   const std::vector<Segment>& segs,
                                                   bool add_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 2);
  // llama.cpp adds [CLS] and [SEP] for add_special whatever add_bos / add_sep say (it asserts
  // they exist; a vocabulary without them gets none here).
  if (add_special && bos_ >= 0) out.push_back(bos_);
  std::string word;
  for (const Segment& seg : segs) {
    if (seg.token >= 0)
      out.push_back(seg.token);
    else
      encode_fragment(text.substr(seg.begin, seg.end - seg.begin), out, word);
  }
  if (add_special && sep_ >= 0) out.push_back(sep_);
  return out;
}

std::string WpmTokenizer::token_to_piece(int32_t id, bool special) const {
  return piece(id, special);
}

}  // namespace lc
