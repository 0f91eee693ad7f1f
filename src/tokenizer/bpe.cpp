// Byte-level BPE ("gpt2" vocabularies), matching llama.cpp's llm_tokenizer_bpe: the
// pre-tokeniser splits the text into words, each word's bytes are mapped to printable
// codepoints (GPT-2's bytes_to_unicode) and merged pairwise, lowest merge rank first.
#include <algorithm>
#include <vector>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"

namespace lc {

// Buffers reused across the words of one encode() call.
struct BpeTokenizer::Scratch {
  std::vector<tok::MergeSymbol> sym;
  std::vector<tok::MergeCandidate> heap;
  std::string key, word;
};

int32_t BpeTokenizer::rank(std::string_view left, std::string_view right, std::string& key) const {
  // Merges are stored as "left right" split at the first space after the first byte, so a left
  // side with a later space can never be part of one.
  if (left.find(' ', 1) != std::string_view::npos) return -1;
  key.assign(left);
  key.push_back(' ');
  key.append(right);
  auto it = ranks_.find(std::string_view(key));
  return it == ranks_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out,
                               Scratch& s) const {
  if (ignore_merges_) {
    if (const int32_t id = lookup(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  auto& sym = s.sym;
  tok::split_chars(word, sym);
  // Lower rank merges first; ranks are exact in a float (well below 2^24 merges).
  tok::merge_best_first(sym, s.heap, [&](int32_t l, int32_t r) -> std::optional<float> {
    const tok::MergeSymbol& a = sym[static_cast<size_t>(l)];
    const tok::MergeSymbol& b = sym[static_cast<size_t>(r)];
    const int32_t rk = rank(word.substr(a.start, a.n), word.substr(b.start, b.n), s.key);
    if (rk < 0) return std::nullopt;
    return -static_cast<float>(rk);
  });

  for (int32_t i = sym.empty() ? -1 : 0; i != -1; i = sym[static_cast<size_t>(i)].next) {
    const tok::MergeSymbol& sy = sym[static_cast<size_t>(i)];
    const std::string_view piece = word.substr(sy.start, sy.n);
    if (const int32_t id = lookup(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // A piece outside the vocabulary: llama.cpp looks each of its bytes up as a one-byte
    // token and drops the ones that are not.
    for (char c : piece)
      if (const int32_t id = lookup(std::string_view(&c, 1)); id >= 0) out.push_back(id);
  }
}

void BpeTokenizer::encode_fragment(std::string_view text, std::vector<int32_t>& out,
                                   Scratch& s) const {
  const std::vector<uint32_t> cpts = tok::decode_utf8_all(text);
  const std::vector<size_t> words = pre_tok_.split(cpts);
  const tok::ByteUnicode& bu = tok::byte_unicode();
  std::string utf8;
  size_t at = 0;
  for (size_t len : words) {
    // Re-encode the codepoints (malformed input became U+FFFD) and map every byte.
    utf8.clear();
    for (size_t k = at; k < at + len; ++k) tok::append_utf8(utf8, cpts[k]);
    at += len;
    s.word.clear();
    for (char c : utf8) s.word += bu.byte_to_utf8[static_cast<uint8_t>(c)];
    encode_word(s.word, out, s);
  }
}

std::vector<int32_t> BpeTokenizer::encode_segments(std::string_view text, const std::vector<Segment>& segs,
                                                   bool add_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) out.push_back(bos_);
  Scratch scratch;
  for (const Segment& seg : segs) {
    if (seg.token >= 0)
      out.push_back(seg.token);
    else
      encode_fragment(text.substr(seg.begin, seg.end - seg.begin), out, scratch);
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string BpeTokenizer::token_to_piece(int32_t id, bool special) const {
  return piece(id, special);
}

}  // namespace lc
