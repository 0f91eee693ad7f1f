// Byte-level BPE training; see bpe_train.h.
#include "tokenizer/bpe_train.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "core/log.h"
#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode_util.h"

namespace lc {
namespace {

struct Word {
  std::vector<int32_t> sym;
  int64_t count = 0;
};

uint64_t pair_key(int32_t a, int32_t b) { return static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b); }

void add_pairs(const Word& w, int64_t sign, std::unordered_map<uint64_t, int64_t>& pc) {
  for (size_t i = 0; i + 1 < w.sym.size(); ++i) pc[pair_key(w.sym[i], w.sym[i + 1])] += sign * w.count;
}

std::string mapped(const std::string& bytes) {
  const tok::ByteUnicode& bu = tok::byte_unicode();
  std::string out;
  for (char c : bytes) out += bu.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace

Expected<BpeVocab> train_bpe(const std::vector<std::string>& texts, const BpeTrainOptions& o) {
  constexpr int64_t kControl = 2;  // <s>, </s>
  if (o.vocab_size < 256 + kControl || o.vocab_size > (int64_t{1} << 20))
    return make_error(fmt::format("vocabulary size {} is outside {}..{} (256 byte tokens and {} control "
                                  "tokens come first)",
                                  o.vocab_size, 256 + kControl, int64_t{1} << 20,
                                  kControl));
  if (o.min_pair_count < 1) return make_error("the minimum pair count must be at least 1");

  // Words as the encoder will see them: pre-tokenised, malformed UTF-8 turned into U+FFFD.
  std::map<std::string, int64_t> counts;  // ordered: the word list is the same on every run
  const tok::PreTokenizer pre(tok::PreType::kStarcoder);
  std::string utf8;
  for (const std::string& text : texts) {
    const std::vector<uint32_t> cpts = tok::decode_utf8_all(text);
    size_t at = 0;
    for (size_t len : pre.split(cpts)) {
      utf8.clear();
      for (size_t k = at; k < at + len; ++k) tok::append_utf8(utf8, cpts[k]);
      at += len;
      ++counts[utf8];
    }
  }
  if (counts.empty()) return make_error("no text to train the vocabulary on");

  std::vector<std::string> bytes(256);  // each symbol's bytes
  for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t b = 0; b < 256; ++b) id_of.emplace(bytes[static_cast<size_t>(b)], b);
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [w, c] : counts) {
    Word x;
    x.count = c;
    for (char ch : w) x.sym.push_back(static_cast<uint8_t>(ch));
    words.push_back(std::move(x));
  }
  std::unordered_map<uint64_t, int64_t> pc;
  for (const Word& w : words) add_pairs(w, 1, pc);

  BpeVocab v;
  const int64_t n_pieces = o.vocab_size - kControl;
  while (static_cast<int64_t>(bytes.size()) < n_pieces) {
    // The most frequent pair; ties to the smaller (left, right) ids.
    uint64_t best = 0;
    int64_t best_n = 0;
    for (const auto& [k, n] : pc)
      if (n > best_n || (n == best_n && n > 0 && k < best)) best = k, best_n = n;
    if (best_n < o.min_pair_count) break;
    const int32_t a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xffffffffu);
    const std::string joined = bytes[static_cast<size_t>(a)] + bytes[static_cast<size_t>(b)];
    // Two merge paths can spell the same piece ("a"+"bc", "ab"+"c"): one token, two merges.
    int32_t id;
    if (auto it = id_of.find(joined); it != id_of.end()) {
      id = it->second;
    } else {
      id = static_cast<int32_t>(bytes.size());
      bytes.push_back(joined);
      id_of.emplace(joined, id);
    }
    v.merges.push_back(mapped(bytes[static_cast<size_t>(a)]) + " " + mapped(bytes[static_cast<size_t>(b)]));
    for (Word& w : words) {
      bool has = false;
      for (size_t i = 0; i + 1 < w.sym.size() && !has; ++i) has = w.sym[i] == a && w.sym[i + 1] == b;
      if (!has) continue;
      add_pairs(w, -1, pc);
      std::vector<int32_t> s;
      s.reserve(w.sym.size());
      for (size_t i = 0; i < w.sym.size(); ++i) {
        if (i + 1 < w.sym.size() && w.sym[i] == a && w.sym[i + 1] == b) {
          s.push_back(id);
          ++i;
        } else {
          s.push_back(w.sym[i]);
        }
      }
      w.sym = std::move(s);
      add_pairs(w, 1, pc);
    }
    for (auto it = pc.begin(); it != pc.end();) it = it->second == 0 ? pc.erase(it) : std::next(it);
  }

  for (const std::string& s : bytes) v.tokens.push_back(mapped(s));
  v.types.assign(v.tokens.size(), 1);
  v.bos = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("<s>");
  v.eos = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("</s>");
  v.types.push_back(3);
  v.types.push_back(3);
  return v;
}

Status write_bpe_vocab(const BpeVocab& v, const std::string& name, const std::string& path) {
  gguf::Writer w;
  w.set_string("general.name", name);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", kBpeTrainPre);
  w.set_string_array("tokenizer.ggml.tokens", v.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", v.types);
  w.set_string_array("tokenizer.ggml.merges", v.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos));
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  return w.write(path);
}

}  // namespace lc
