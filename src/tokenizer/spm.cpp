// SentencePiece-style tokenizer ("llama" vocabularies), matching llama.cpp's
// llm_tokenizer_spm: characters are merged pairwise, highest-scoring vocabulary entry first;
// what never becomes a token falls back to <0xXX> byte tokens.
#include <algorithm>
#include <vector>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"

namespace lc {

void SpmTokenizer::encode_fragment(std::string_view text, std::vector<int32_t>& out) const {
  if (!split_at_spaces_) {
    encode_chunk(text, out);
    return;
  }
  // No token has a U+2581 after another character, so no merge crosses the start of a run of
  // U+2581: encode word by word with small queues (same result, far better cache behaviour
  // on long prompts). Cuts are made at symbol boundaries only, so the symbols are unchanged.
  static constexpr std::string_view kSpace = "\xE2\x96\x81";
  size_t chunk = 0;
  bool prev_space = true;
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(tok::utf8_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const bool space = text.substr(off, n) == kSpace;
    if (space && !prev_space && off > chunk) {
      encode_chunk(text.substr(chunk, off - chunk), out);
      chunk = off;
    }
    prev_space = space;
    off += n;
  }
  encode_chunk(text.substr(chunk), out);
}

void SpmTokenizer::encode_chunk(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<tok::MergeSymbol> sym;
  sym.reserve(text.size());
  tok::split_chars(text, sym);
  std::vector<tok::MergeCandidate> heap;
  heap.reserve(sym.size());
  // Higher-scoring vocabulary pieces merge first.
  tok::merge_best_first(sym, heap, [&](int32_t l, int32_t r) -> std::optional<float> {
    const tok::MergeSymbol& a = sym[static_cast<size_t>(l)];
    const size_t len = a.n + sym[static_cast<size_t>(r)].n;
    if (len > max_token_len_) return std::nullopt;
    const int32_t id = lookup(text.substr(a.start, len));
    if (id < 0) return std::nullopt;
    return scores_[static_cast<size_t>(id)];
  });

  for (int32_t i = sym.empty() ? -1 : 0; i != -1; i = sym[static_cast<size_t>(i)].next) {
    const tok::MergeSymbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece = text.substr(s.start, s.n);
    if (const int32_t id = lookup(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Every merge product is a token, so only single characters get here.
    for (char c : piece) {
      const int32_t id = byte_token_[static_cast<uint8_t>(c)];
      if (id >= 0)
        out.push_back(id);
      else if (unk_ >= 0)
        out.push_back(unk_);
    }
  }
}

std::vector<int32_t> SpmTokenizer::encode_segments(std::string_view text, const std::vector<Segment>& segs,
                                                   bool add_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) out.push_back(bos_);
  bool prev_special = true;  // a fragment at the start or after a special token gets a space
  std::string buf;
  for (const Segment& seg : segs) {
    if (seg.token >= 0) {
      out.push_back(seg.token);
      prev_special = true;
      continue;
    }
    buf.clear();
    if (add_space_prefix_ && prev_special) buf += "\xE2\x96\x81";
    for (size_t i = seg.begin; i < seg.end; ++i) {
      if (text[i] == ' ')
        buf += "\xE2\x96\x81";
      else
        buf.push_back(text[i]);
    }
    encode_fragment(buf, out);
    prev_special = false;
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string SpmTokenizer::token_to_piece(int32_t id, bool special) const {
  return piece(id, special);
}

}  // namespace lc
