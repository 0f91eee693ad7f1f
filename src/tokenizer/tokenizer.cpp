// Loading a tokenizer from GGUF metadata, the parts shared by the tokenizers (special-token
// partition, pieces, decode) and the streaming decoder. The behaviour follows llama.cpp's
// llama-vocab.cpp, whose outputs are the test oracle.
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>

#include "core/log.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode_util.h"

namespace lc {

namespace tok {
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  const auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}
}  // namespace tok

using namespace tok;

namespace {

constexpr const char* kKeyModel = "tokenizer.ggml.model";
constexpr const char* kKeyPre = "tokenizer.ggml.pre";
constexpr const char* kKeyTokens = "tokenizer.ggml.tokens";
constexpr const char* kKeyScores = "tokenizer.ggml.scores";
constexpr const char* kKeyTypes = "tokenizer.ggml.token_type";
constexpr const char* kKeyMerges = "tokenizer.ggml.merges";

// What a "tokenizer.ggml.pre" name selects, as in llama.cpp's llama_vocab::impl::load.
struct PreInfo {
  PreType type = PreType::kDefault;
  bool clean_spaces = true;
  bool ignore_merges = false;
  bool add_bos = false;
  bool known = true;
};

PreInfo pre_info(const std::string& pre) {
  const auto any = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (pre == n) return true;
    return false;
  };
  PreInfo r;
  if (pre.empty() || pre == "default") {
    r.known = !pre.empty();
  } else if (any({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                  "midm-2.0", "lfm2", "jina-v5-nano"})) {
    r.type = PreType::kLlama3;
    r.ignore_merges = true;
    r.add_bos = true;
  } else if (any({"dbrx", "smaug-bpe"})) {
    r.type = PreType::kLlama3;
  } else if (pre == "deepseek-llm") {
    r.type = PreType::kDeepseekLlm;
    r.clean_spaces = false;
  } else if (pre == "deepseek-coder") {
    r.type = PreType::kDeepseekCoder;
    r.clean_spaces = false;
  } else if (pre == "falcon") {
    r.type = PreType::kFalcon;
  } else if (any({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                  "a.x-4.0", "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais"})) {
    r.type = PreType::kGpt2;
  } else if (any({"trillion", "granite-docling"})) {
    r.type = PreType::kGpt2;
    r.clean_spaces = false;
  } else if (any({"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"})) {
    r.type = PreType::kStarcoder;
  } else if (any({"command-r", "smollm"})) {
    r.type = PreType::kStarcoder;
    r.clean_spaces = false;
  } else if (any({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open",
                  "grok-2"})) {
    r.type = PreType::kQwen2;
    r.clean_spaces = false;
  } else if (any({"stablelm2", "megrez"})) {
    r.type = PreType::kQwen2;
  } else {
    r.known = false;
  }
  return r;
}

// Texts llama.cpp treats as end of generation (and forces to CONTROL), and the FIM tokens it
// forces to CONTROL; some of those (pad, repo, file separator) also end generation.
const char* const kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek
};
const char* const kFimTexts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\xE2\x96\x81<PRE>",
    "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\xE2\x96\x81<SUF>",
    "<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\xE2\x96\x81<MID>",
    "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>",
};
const char* const kFimEogTexts[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>",
    "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
};

uint32_t attr_from_type(int32_t type) {
  switch (static_cast<TokenAttr>(type)) {
    case TokenAttr::kNormal: return kAttrNormal;
    case TokenAttr::kUnknown: return kAttrUnknown;
    case TokenAttr::kControl: return kAttrControl;
    case TokenAttr::kUserDefined: return kAttrUserDefined;
    case TokenAttr::kUnused: return kAttrUnused;
    case TokenAttr::kByte: return kAttrByte;
    default: return 0;  // undefined (also unknown type values): decodes to nothing
  }
}

}  // namespace

// Fills a tokenizer from the GGUF file, validating everything it reads.
class TokenizerLoader {
 public:
  explicit TokenizerLoader(const gguf::File& f) : f_(f) {}

  Expected<std::unique_ptr<Tokenizer>> load() {
    LC_ASSIGN_OR_RETURN(std::string model, f_.get_string(kKeyModel));
    if (model == "llama") {
      auto t = std::make_unique<SpmTokenizer>();
      LC_TRY(load_common(*t, model));
      LC_TRY(finish_spm(*t));
      return std::unique_ptr<Tokenizer>(std::move(t));
    }
    if (model == "gpt2") {
      auto t = std::make_unique<BpeTokenizer>();
      LC_TRY(load_common(*t, model));
      LC_TRY(finish_bpe(*t));
      return std::unique_ptr<Tokenizer>(std::move(t));
    }
    if (model == "bert") {
      auto t = std::make_unique<WpmTokenizer>();
      LC_TRY(load_common(*t, model));
      LC_TRY(finish_wpm(*t));
      return std::unique_ptr<Tokenizer>(std::move(t));
    }
    return fail(fmt::format("unknown tokenizer model '{}' ({}); supported: 'llama' "
                            "(SentencePiece), 'gpt2' (byte-level BPE), 'bert' (WordPiece)",
                            model, kKeyModel));
  }

 private:
  Error fail(const std::string& what) const {
    return make_error(fmt::format("{}: {}", f_.path(), what));
  }

  // A special token id key: absent, or -1 / 0xFFFFFFFF ("none"), keeps `id`. Out of range is
  // an error when `strict` (ids the engine relies on) and otherwise ignored with a warning.
  Status read_id(const char* key, int32_t& id, bool strict) const {
    if (!f_.has(key)) return ok_status();
    LC_ASSIGN_OR_RETURN(int64_t v, f_.get_i64(key));
    if (v == -1 || v == 0xFFFFFFFFll) return ok_status();
    const int64_t n = static_cast<int64_t>(tok_->vocab_.size());
    if (v < 0 || v >= n) {
      if (strict)
        return fail(fmt::format("{} = {} is outside the vocabulary ({} tokens)", key,
                                v, n));
      LC_LOG_WARN("{}: ignoring {} = {}: outside the vocabulary ({} tokens)",
                  f_.path(), key, v, n);
      return ok_status();
    }
    id = static_cast<int32_t>(v);
    return ok_status();
  }

  Status load_common(Tokenizer& t, const std::string& model) {
    tok_ = &t;
    t.model_ = model;
    const bool spm = model == "llama";
    const bool wpm = model == "bert";
    if (!f_.has(kKeyTokens)) return fail(fmt::format("missing {}", kKeyTokens));
    LC_ASSIGN_OR_RETURN(t.vocab_, f_.get_string_array(kKeyTokens));
    const size_t n = t.vocab_.size();
    if (n == 0) return fail(fmt::format("{} is empty", kKeyTokens));
    if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      return fail(fmt::format("{} has too many tokens ({})", kKeyTokens, n));

    if (f_.has(kKeyScores)) {
      LC_ASSIGN_OR_RETURN(t.scores_, f_.get_f32_array(kKeyScores));
      if (t.scores_.size() != n)
        return fail(fmt::format("{} has {} entries but {} has {}", kKeyScores, t.scores_.size(),
                                kKeyTokens, n));
    } else {
      t.scores_.assign(n, 0.0f);
    }
    if (f_.has(kKeyTypes)) {
      LC_ASSIGN_OR_RETURN(t.attrs_, f_.get_i32_array(kKeyTypes));
      if (t.attrs_.size() != n)
        return fail(fmt::format("{} has {} entries but {} has {}", kKeyTypes, t.attrs_.size(),
                                kKeyTokens, n));
    } else {
      t.attrs_.assign(n, static_cast<int32_t>(TokenAttr::kNormal));
    }
    t.attr_bits_.resize(n);
    for (size_t i = 0; i < n; ++i) t.attr_bits_[i] = attr_from_type(t.attrs_[i]);

    t.token_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      std::string& w = t.vocab_[i];
      // An empty token could never be produced and would match everywhere: give it a
      // placeholder text like llama.cpp does.
      if (w.empty()) w = "[EMPTY_" + std::to_string(i) + "]";
      auto [it, fresh] = t.token_to_id_.emplace(w, static_cast<int32_t>(i));
      if (!fresh)
        return fail(fmt::format("duplicate token in {}: '{}' has ids {} and {}", kKeyTokens,
                                w, it->second, i));
    }

    // Defaults as in llama.cpp, then the keys.
    t.pad_ = -1;
    if (spm) {
      t.bos_ = n > 1 ? 1 : -1;
      t.eos_ = n > 2 ? 2 : -1;
      t.unk_ = 0;
      t.add_bos_ = true;
      t.add_space_prefix_ = true;
      t.clean_spaces_ = false;
      LC_ASSIGN_OR_RETURN(t.pre_, f_.get_string_or(kKeyPre, "default"));
    } else if (wpm) {
      // BERT's ids, each dropped when the vocabulary is too small for it (llama.cpp's defaults).
      const auto in_vocab = [&](int32_t id) { return static_cast<size_t>(id) < n ? id : -1; };
      t.bos_ = in_vocab(101);  // [CLS]
      t.eos_ = -1;
      t.unk_ = in_vocab(100);
      t.sep_ = in_vocab(102);
      t.pad_ = in_vocab(0);
      t.add_bos_ = true;
      t.add_sep_ = true;
      t.add_space_prefix_ = false;
      t.clean_spaces_ = true;
      LC_ASSIGN_OR_RETURN(t.pre_, f_.get_string_or(kKeyPre, ""));  // not used by WordPiece
    } else {
      t.bos_ = t.eos_ = t.unk_ = -1;
      LC_ASSIGN_OR_RETURN(t.pre_, f_.get_string_or(kKeyPre, ""));
      const PreInfo pi = pre_info(t.pre_);
      if (!pi.known)
        LC_LOG_WARN("{}: {} pre-tokenizer '{}'; using llama.cpp's default regexes (token ids "
                    "may differ from the original tokenizer)",
                    f_.path(), t.pre_.empty() ? "missing" : "unknown", t.pre_);
      t.add_bos_ = pi.add_bos;
      t.clean_spaces_ = pi.clean_spaces;
      auto& b = static_cast<BpeTokenizer&>(t);
      b.pre_tok_ = PreTokenizer(pi.type);
      b.ignore_merges_ = pi.ignore_merges;
    }
    LC_ASSIGN_OR_RETURN(t.add_space_prefix_,
                        f_.get_bool_or("tokenizer.ggml.add_space_prefix", t.add_space_prefix_));

    int32_t eot = -1, eom = -1;
    LC_TRY(read_id("tokenizer.ggml.bos_token_id", t.bos_, true));
    LC_TRY(read_id("tokenizer.ggml.eos_token_id", t.eos_, true));
    LC_TRY(read_id("tokenizer.ggml.unknown_token_id", t.unk_, false));
    LC_TRY(read_id("tokenizer.ggml.padding_token_id", t.pad_, false));
    LC_TRY(read_id("tokenizer.ggml.seperator_token_id", t.sep_, false));  // GGUF's spelling
    LC_TRY(read_id("tokenizer.ggml.eot_token_id", eot, false));
    LC_TRY(read_id("tokenizer.ggml.eom_token_id", eom, false));

    LC_ASSIGN_OR_RETURN(t.add_bos_, f_.get_bool_or("tokenizer.ggml.add_bos_token", t.add_bos_));
    LC_ASSIGN_OR_RETURN(t.add_eos_, f_.get_bool_or("tokenizer.ggml.add_eos_token", t.add_eos_));
    if (t.add_bos_ && t.bos_ < 0)
      return fail("tokenizer.ggml.add_bos_token is true but there is no BOS token");
    if (t.add_eos_ && t.eos_ < 0)
      return fail("tokenizer.ggml.add_eos_token is true but there is no EOS token");
    LC_ASSIGN_OR_RETURN(t.add_sep_, f_.get_bool_or("tokenizer.ggml.add_sep_token", t.add_sep_));
    if (t.add_sep_ && t.sep_ < 0)
      return fail("tokenizer.ggml.add_sep_token is true but there is no SEP token");

    // End of generation: the eos/eot/eom ids and the tokens known by their text. llama.cpp
    // also makes those control tokens (so they are only parsed with parse_special).
    std::vector<int32_t> eog;
    for (int32_t id : {t.eos_, eot, eom})
      if (id >= 0) eog.push_back(id);
    for (const char* text : kEogTexts) {
      if (int32_t id = t.lookup(text); id >= 0) {
        eog.push_back(id);
        t.attr_bits_[static_cast<size_t>(id)] |= kAttrControl;
      }
    }
    for (const char* text : kFimEogTexts) {
      if (int32_t id = t.lookup(text); id >= 0) {
        eog.push_back(id);
        t.attr_bits_[static_cast<size_t>(id)] |= kAttrControl;
      }
    }
    for (const char* text : kFimTexts)
      if (int32_t id = t.lookup(text); id >= 0) t.attr_bits_[static_cast<size_t>(id)] |= kAttrControl;
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    t.eog_ids_ = std::move(eog);

    // Phi-3 strips whitespace after its special tokens (llama.cpp keys this on the name).
    LC_ASSIGN_OR_RETURN(std::string name, f_.get_string_or("general.name", ""));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
    const uint32_t kSpecialBits = kAttrControl | kAttrUserDefined | kAttrUnknown;
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
      for (size_t i = 0; i < n; ++i)
        if (t.attr_bits_[i] & kSpecialBits) t.attr_bits_[i] |= kAttrRstrip;
      if (int32_t id = t.lookup("</s>"); id >= 0) t.attr_bits_[static_cast<size_t>(id)] |= kAttrRstrip;
      for (const char* text : {"<unk>", "<s>", "<|endoftext|>"})
        if (int32_t id = t.lookup(text); id >= 0)
          t.attr_bits_[static_cast<size_t>(id)] &= ~kAttrRstrip;
    }

    // Special tokens, longest first (ties by id, where llama.cpp's order is unspecified).
    std::vector<int32_t> special;
    for (size_t i = 0; i < n; ++i)
      if (t.attr_bits_[i] & kSpecialBits) special.push_back(static_cast<int32_t>(i));
    std::stable_sort(special.begin(), special.end(), [&](int32_t a, int32_t b) {
      return t.vocab_[static_cast<size_t>(a)].size() > t.vocab_[static_cast<size_t>(b)].size();
    });
    std::vector<SpecialPattern> user, all;
    for (int32_t id : special) {
      const uint32_t a = t.attr_bits_[static_cast<size_t>(id)];
      SpecialPattern p{id, t.vocab_[static_cast<size_t>(id)], (a & kAttrLstrip) != 0,
                       (a & kAttrRstrip) != 0};
      if (!(a & (kAttrControl | kAttrUnknown))) user.push_back(p);
      all.push_back(std::move(p));
    }
    t.specials_ = std::make_shared<SpecialMatcher>(std::move(user), std::move(all));
    return ok_status();
  }

  // Pieces as SentencePiece and WordPiece print them: U+2581 becomes a space.
  static void unescaped_pieces(Tokenizer& t) {
    t.pieces_.resize(t.vocab_.size());
    for (size_t i = 0; i < t.vocab_.size(); ++i) {
      const uint32_t a = t.attr_bits_[i];
      const std::string& text = t.vocab_[i];
      std::string& p = t.pieces_[i];
      if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
        p = text;
      } else if (a & kAttrNormal) {
        for (size_t k = 0; k < text.size();) {
          if (text.compare(k, 3, "\xE2\x96\x81") == 0) {
            p.push_back(' ');
            k += 3;
          } else {
            p.push_back(text[k++]);
          }
        }
      } else if (a & kAttrByte) {
        const int b = parse_byte_token(text);
        if (b >= 0) p.assign(1, static_cast<char>(b));
      }
    }
  }

  Status finish_spm(SpmTokenizer& t) {
    t.split_at_spaces_ = true;
    for (const std::string& w : t.vocab_) {
      t.max_token_len_ = std::max(t.max_token_len_, w.size());
      // A U+2581 preceded by anything but U+2581 would let a merge cross a word start.
      for (size_t p = w.find("\xE2\x96\x81", 1); p != std::string::npos;
           p = w.find("\xE2\x96\x81", p + 1)) {
        if (p < 3 || w.compare(p - 3, 3, "\xE2\x96\x81") != 0) {
          t.split_at_spaces_ = false;
          break;
        }
      }
    }
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      const auto end = fmt::format_to_n(buf, sizeof buf, "<0x{:02X}>", b).out;
      int32_t id = t.lookup(std::string_view(buf, static_cast<size_t>(end - buf)));
      if (id < 0) id = t.lookup(std::string(1, static_cast<char>(b)));
      t.byte_token_[static_cast<size_t>(b)] = id;
    }
    unescaped_pieces(t);
    return ok_status();
  }

  Status finish_wpm(WpmTokenizer& t) {
    for (const std::string& w : t.vocab_) t.max_token_len_ = std::max(t.max_token_len_, w.size());
    // BertNormalizer's options; strip_accents follows lowercase unless given (as in HF).
    LC_ASSIGN_OR_RETURN(t.lowercase_, f_.get_bool_or("tokenizer.ggml.normalizer.lowercase", true));
    LC_ASSIGN_OR_RETURN(t.strip_accents_,
                        f_.get_bool_or("tokenizer.ggml.normalizer.strip_accents", t.lowercase_));
    // llama.cpp cannot print WordPiece byte tokens (it aborts); they print their byte here.
    unescaped_pieces(t);
    return ok_status();
  }

  Status finish_bpe(BpeTokenizer& t) {
    if (!f_.has(kKeyMerges)) return fail(fmt::format("missing {} (required for 'gpt2')", kKeyMerges));
    LC_ASSIGN_OR_RETURN(std::vector<std::string> merges, f_.get_string_array(kKeyMerges));
    if (merges.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      return fail(fmt::format("{} has too many entries", kKeyMerges));
    t.ranks_.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      // llama.cpp splits at the first space after the first byte; a merge without one can
      // never apply. The first rank of a repeated merge wins.
      if (merges[i].find(' ', 1) == std::string::npos) continue;
      t.ranks_.emplace(std::move(merges[i]), static_cast<int32_t>(i));
    }
    const ByteUnicode& bu = byte_unicode();
    t.pieces_.resize(t.vocab_.size());
    for (size_t i = 0; i < t.vocab_.size(); ++i) {
      const uint32_t a = t.attr_bits_[i];
      const std::string& text = t.vocab_[i];
      std::string& p = t.pieces_[i];
      if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
        p = text;
      } else if (a & kAttrNormal) {
        // Undo bytes_to_unicode; a codepoint outside the mapping is kept as it is.
        size_t pos = 0;
        while (pos < text.size()) {
          const uint32_t c = decode_utf8(text, pos);
          if (c < bu.cpt_to_byte.size() && bu.cpt_to_byte[c] >= 0)
            p.push_back(static_cast<char>(bu.cpt_to_byte[c]));
          else
            append_utf8(p, c);
        }
      } else if (a & kAttrByte) {
        const int b = parse_byte_token(text);
        if (b >= 0) p.assign(1, static_cast<char>(b));
      }
    }
    return ok_status();
  }

  const gguf::File& f_;
  Tokenizer* tok_ = nullptr;
};

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::File& f) {
  return TokenizerLoader(f).load();
}

int32_t Tokenizer::lookup(std::string_view text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

int32_t Tokenizer::find_token(std::string_view text) const { return lookup(text); }

TokenAttr Tokenizer::token_attr(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return TokenAttr::kUndefined;
  return static_cast<TokenAttr>(attrs_[static_cast<size_t>(id)]);
}

bool Tokenizer::is_eog(int32_t id) const {
  return id >= 0 && std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < n_vocab() && (attr_bits_[static_cast<size_t>(id)] & kAttrControl);
}

const std::string& Tokenizer::piece(int32_t id, bool special) const {
  static const std::string kEmpty;
  if (id < 0 || id >= n_vocab()) return kEmpty;
  if (!special && (attr_bits_[static_cast<size_t>(id)] & (kAttrControl | kAttrUnknown))) return kEmpty;
  return pieces_[static_cast<size_t>(id)];
}

std::vector<Tokenizer::Segment> Tokenizer::partition(std::string_view text,
                                                     bool parse_special) const {
  std::vector<Segment> out;
  if (text.empty()) return out;
  const auto matches = specials_ ? specials_->get(parse_special).find(text)
                                 : std::vector<SpecialMatch>{};
  // C-locale isspace, as llama.cpp strips with.
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
  };
  size_t pos = 0;
  for (size_t k = 0; k <= matches.size(); ++k) {
    size_t b = pos, e = k < matches.size() ? matches[k].begin : text.size();
    if (k > 0 && matches[k - 1].rstrip)
      while (b < e && is_space(text[b])) ++b;
    if (k < matches.size() && matches[k].lstrip)
      while (e > b && is_space(text[e - 1])) --e;
    if (e > b) out.push_back(Segment{b, e, -1});
    if (k < matches.size()) {
      out.push_back(Segment{matches[k].begin, matches[k].end, matches[k].id});
      pos = matches[k].end;
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                      bool parse_special) const {
  return encode_segments(text, partition(text, parse_special), add_special);
}

std::vector<int32_t> Tokenizer::encode_parts(const std::vector<TextPart>& parts, bool add_special) const {
  std::string text;
  for (const TextPart& p : parts) text += p.text;
  // Each part is partitioned with its own parse_special; raw runs that meet at a part boundary
  // become one fragment, as they are in the concatenation.
  std::vector<Segment> segs;
  size_t at = 0;
  for (const TextPart& p : parts) {
    for (Segment s : partition(p.text, p.parse_special)) {
      s.begin += at;
      s.end += at;
      if (s.token < 0 && !segs.empty() && segs.back().token < 0 && segs.back().end == s.begin)
        segs.back().end = s.end;
      else
        segs.push_back(s);
    }
    at += p.text.size();
  }
  // A special token that strips spaces (lstrip/rstrip, e.g. phi-3's <|user|>) strips them
  // across a part boundary too, as partition() does on the whole text.
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
  };
  const auto all_space = [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      if (!is_space(text[i])) return false;
    return true;
  };
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].token < 0) continue;
    const uint32_t bits = attr_bits_[static_cast<size_t>(segs[i].token)];
    if ((bits & tok::kAttrRstrip) && i + 1 < segs.size() && segs[i + 1].token < 0 &&
        all_space(segs[i].end, segs[i + 1].begin))
      while (segs[i + 1].begin < segs[i + 1].end && is_space(text[segs[i + 1].begin])) ++segs[i + 1].begin;
    if ((bits & tok::kAttrLstrip) && i > 0 && segs[i - 1].token < 0 && all_space(segs[i - 1].end, segs[i].begin))
      while (segs[i - 1].end > segs[i - 1].begin && is_space(text[segs[i - 1].end - 1])) --segs[i - 1].end;
  }
  std::erase_if(segs, [](const Segment& s) { return s.token < 0 && s.begin >= s.end; });
  return encode_segments(text, segs, add_special);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  // llama_detokenize(remove_special = false, unparse_special = special): the first token loses
  // one leading space when the vocabulary prefixes one, even if that token prints nothing.
  std::string text;
  bool strip = add_space_prefix_;
  for (int32_t id : ids) {
    const std::string& p = piece(id, special);
    if (strip && !p.empty() && p[0] == ' ')
      text.append(p, 1, std::string::npos);
    else
      text += p;
    strip = false;
  }
  if (!clean_spaces_ || text.empty()) return text;

  // llama.cpp's clean-up passes (from HF's clean_up_tokenization): " ?" " !" " ." " ," lose
  // the space, " ' " becomes "'", and " 's" " 'm" " 're" " 've" lose the space.
  std::string s = std::move(text);
  std::string r;
  r.reserve(s.size());
  r.push_back(s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) r.pop_back();
    r.push_back(x);
  }
  s.swap(r);
  r.clear();
  r.push_back(s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (x == '\'' && i + 1 < s.size() && s[i - 1] == ' ' && s[i + 1] == ' ') {
      r.pop_back();
      s[++i] = '\0';  // the space after it goes too (and no longer counts as a space)
    }
    r.push_back(x);
  }
  s.swap(r);
  r.clear();
  r.push_back(s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && x == '\'' && i + 1 < s.size()) {
      const char x1 = s[i + 1];
      if (x1 == 's' || x1 == 'm') {
        r.pop_back();
      } else if (i + 2 < s.size()) {
        const char x2 = s[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) r.pop_back();
      }
    }
    r.push_back(x);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// StreamDecoder

namespace {
// Length of the valid UTF-8 sequence at s[i] (strict), 0 if s[i..] is a valid but incomplete
// prefix, -1 if it is ill-formed.
int utf8_seq(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return 1;
  int n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < n; ++k) {
    if (i + static_cast<size_t>(k) >= s.size()) return 0;
    const uint8_t x = b(i + static_cast<size_t>(k));
    if (k == 1 ? (x < lo || x > hi) : (x & 0xC0) != 0x80) return -1;
  }
  return n;
}
}  // namespace

std::string StreamDecoder::push(int32_t id) {
  std::string p = tok_.token_to_piece(id);
  if (first_ && tok_.add_space_prefix() && !p.empty() && p[0] == ' ') p.erase(0, 1);
  first_ = false;
  pending_ += p;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int n = utf8_seq(pending_, i);
    if (n == 0) break;  // wait for the rest of this character
    if (n < 0) {
      out += "\xEF\xBF\xBD";  // never pass ill-formed bytes on
      ++i;
      continue;
    }
    out.append(pending_, i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  return out;
}

}  // namespace lc
