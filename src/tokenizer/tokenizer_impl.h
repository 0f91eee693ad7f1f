// Internal: the concrete tokenizers and the loader that fills them from GGUF metadata.
#pragma once

#include <optional>

#include <algorithm>

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace lc {

namespace tok {

// A piece of the text being merged, in a doubly linked list; n == 0 marks a piece merged into
// its left neighbour.
struct MergeSymbol {
  int32_t prev, next;
  size_t start, n;
};

// A queued merge of two adjacent symbols: higher priority first, then the leftmost pair.
struct MergeCandidate {
  float priority;
  int32_t left, right;
  size_t size;  // bytes of both sides when queued; a mismatch later means the entry is stale
};

// One symbol per UTF-8 character of text.
inline void split_chars(std::string_view text, std::vector<MergeSymbol>& sym) {
  sym.clear();
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(utf8_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back(MergeSymbol{idx - 1, off + n == text.size() ? -1 : idx + 1, off, n});
    off += n;
  }
}

// The merge loop both tokenizers share: queue every adjacent pair the vocabulary can merge,
// then repeatedly merge the best one and queue the pairs it forms with its neighbours.
// priority(l, r) gives the merge's priority, or nullopt when the pair cannot merge.
template <class Priority>
void merge_best_first(std::vector<MergeSymbol>& sym, std::vector<MergeCandidate>& heap,
                      const Priority& priority) {
  const auto less = [](const MergeCandidate& a, const MergeCandidate& b) {
    return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
  };
  const auto add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const std::optional<float> p = priority(l, r);
    if (!p) return;
    heap.push_back(MergeCandidate{*p, l, r, sym[static_cast<size_t>(l)].n + sym[static_cast<size_t>(r)].n});
    std::push_heap(heap.begin(), heap.end(), less);
  };
  heap.clear();
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) add(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), less);
    const MergeCandidate c = heap.back();
    heap.pop_back();
    MergeSymbol& l = sym[static_cast<size_t>(c.left)];
    MergeSymbol& r = sym[static_cast<size_t>(c.right)];
    // Stale: one side was merged into something else since this pair was queued.
    if (l.n == 0 || r.n == 0 || l.n + r.n != c.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
    add(l.prev, c.left);
    add(c.left, l.next);
  }
}

}  // namespace tok


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
  std::vector<int32_t> encode_segments(std::string_view text, const std::vector<Segment>& segs,
                                       bool add_special) const override;
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
  std::vector<int32_t> encode_segments(std::string_view text, const std::vector<Segment>& segs,
                                       bool add_special) const override;
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

// WordPiece ("bert"), matching llama.cpp's llm_tokenizer_wpm: BERT's normaliser splits the
// text into words (whitespace, each punctuation mark, ASCII symbol and CJK ideograph a word of
// its own; lowercase and accents stripped as the GGUF asks), then every word, with a U+2581 in
// front, is cut greedily into the longest vocabulary entries; a word that cannot be cut all
// the way becomes the unknown token.
class WpmTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode_segments(std::string_view text, const std::vector<Segment>& segs,
                                       bool add_special) const override;
  std::string token_to_piece(int32_t id, bool special = false) const override;

 private:
  friend class TokenizerLoader;
  void encode_fragment(std::string_view text, std::vector<int32_t>& out, std::string& word) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  size_t max_token_len_ = 0;  // bytes of the longest token
  bool lowercase_ = true;  // tokenizer.ggml.normalizer.lowercase
  bool strip_accents_ = true;  // tokenizer.ggml.normalizer.strip_accents (NFD, marks dropped)
};

}  // namespace lc
