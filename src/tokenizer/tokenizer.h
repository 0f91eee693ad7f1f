// Tokenizers read from GGUF metadata: SentencePiece-style ("llama"), byte-level BPE ("gpt2")
// with the pre-tokenisers of the supported model families, and WordPiece ("bert").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"

namespace lc {

namespace tok {
class SpecialMatcher;
}

enum class TokenAttr : int32_t {  // tokenizer.ggml.token_type values
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static Expected<std::unique_ptr<Tokenizer>> from_gguf(const gguf::File& f);

  // add_special: BOS/EOS as the model's add_bos/add_eos flags say; on WordPiece vocabularies,
  // as llama.cpp does, always BOS ([CLS]) first and SEP ([SEP]) last (those present).
  // parse_special: text matching special/control tokens becomes those tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // A text given in parts, each with its own parse_special; the parts are encoded as their
  // concatenation would be (raw text runs across part boundaries, so SentencePiece's space
  // prefix and BPE's pre-tokeniser see the same fragments), except that special-token text is
  // parsed only inside the parts that ask for it. encode(t, a, p) == encode_parts({{t, p}}, a).
  struct TextPart {
    std::string_view text;
    bool parse_special = false;
  };
  std::vector<int32_t> encode_parts(const std::vector<TextPart>& parts, bool add_special) const;
  // Bytes of one token (SentencePiece spaces and byte tokens resolved). Control tokens give ""
  // unless `special` is set.
  virtual std::string token_to_piece(int32_t id, bool special = false) const = 0;
  // Text of `ids` as llama_detokenize(remove_special = false, unparse_special = special) gives
  // it: the pieces joined, one leading space dropped from the first on SentencePiece vocabs,
  // and for the BPE families llama.cpp cleans up (gpt-2, llama3, falcon, starcoder, ...) and
  // WordPiece " ," " ." " ?" " !" " 's" " 'm" " 're" " 've" lose their space. WordPiece words
  // each print with a space in front, the first one included ("hello world" -> " hello world").
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.size()); }
  const std::string& token_text(int32_t id) const { return vocab_[static_cast<size_t>(id)]; }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  int32_t sep() const { return sep_; }  // WordPiece's [SEP], or -1
  bool add_sep() const { return add_sep_; }  // llama_vocab_get_add_sep
  bool is_eog(int32_t id) const;  // end of generation (eos, eot, im_end, ...)
  bool is_control(int32_t id) const;
  int32_t find_token(std::string_view text) const;  // -1 if absent
  const std::string& model_name() const { return model_; }  // "llama" / "gpt2" / "bert"
  const std::string& pre_name() const { return pre_; }
  int32_t unk() const { return unk_; }
  int32_t pad() const { return pad_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  TokenAttr token_attr(int32_t id) const;

 protected:
  // A piece of the input: raw text [begin, end) or, when token >= 0, one special token.
  struct Segment {
    size_t begin = 0, end = 0;
    int32_t token = -1;
  };
  // Splits out special tokens as llama.cpp's tokenizer_st_partition does: user-defined tokens
  // always, control tokens only when parse_special.
  std::vector<Segment> partition(std::string_view text, bool parse_special) const;
  // Encodes `text` already partitioned into `segs` (in order, raw segments as ranges of text).
  virtual std::vector<int32_t> encode_segments(std::string_view text, const std::vector<Segment>& segs,
                                               bool add_special) const = 0;
  // The precomputed piece of a token (as token_to_piece with special = true), or "" for
  // control/unknown tokens unless `special`.
  const std::string& piece(int32_t id, bool special) const;
  int32_t lookup(std::string_view text) const;  // -1 if absent

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::vector<int32_t> attrs_;  // TokenAttr per id
  std::vector<int32_t> eog_ids_;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1, pad_ = -1, sep_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_sep_ = false;
  std::string model_, pre_;
  // Loader state beyond the public accessors.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<uint32_t> attr_bits_;  // llama.cpp attribute bits per id (see tokenizer.cpp)
  std::vector<std::string> pieces_;  // token_to_piece(id, special = true)
  bool add_space_prefix_ = false;
  bool clean_spaces_ = false;  // decode() tidies " ," and " 's" like llama_detokenize
  std::shared_ptr<const tok::SpecialMatcher> specials_;  // user-defined only / all special

  friend class TokenizerLoader;
};

// Turns a stream of token ids into text that never splits a UTF-8 character: push() returns
// only complete characters; bytes of an incomplete one wait for the next token.
//
// The output is the raw concatenation of token_to_piece(), as llama.cpp streams generated text
// (a continuation keeps its leading space). With strip_first_space, the first piece loses one
// leading space on vocabularies that prefix one (SentencePiece), so that the concatenation
// equals decode(ids) for vocabularies without decode()'s space clean-up (SentencePiece,
// qwen2, deepseek, ...).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool strip_first_space = false)
      : tok_(tok), first_(strip_first_space) {}
  std::string push(int32_t id);
  std::string flush();  // whatever is left (invalid trailing bytes as U+FFFD)

 private:
  const Tokenizer& tok_;
  std::string pending_;
  bool first_;  // the next piece loses its leading space (strip_first_space, first piece)
};

// Chat templates of the supported families.
enum class ChatTemplate { kNone, kLlama3, kChatML, kLlama2, kZephyr };
struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};
// Picks the family from the template stored in the GGUF (tokenizer.chat_template) or, without
// one, from the vocabulary's special tokens. kNone when nothing is known.
ChatTemplate detect_chat_template(const gguf::File& f, const Tokenizer& tok);
Expected<ChatTemplate> chat_template_from_name(std::string_view name);
const char* chat_template_name(ChatTemplate t);
std::string apply_chat_template(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);
// The same rendering in parts: the template's own markup (is_content false) and each
// message's content (is_content true). Their concatenation is apply_chat_template's string.
struct ChatPart {
  std::string text;
  bool is_content = false;
};
std::vector<ChatPart> chat_template_parts(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt);
// The conversation's token ids, for every caller that sends chat messages to a model: the
// template's markup is encoded with special-token parsing and the messages' contents without,
// so a message that contains "<|im_end|>" (or "<s>", ...) gets the text's tokens, never the
// special token. add_special: BOS/EOS as the vocabulary asks, as in Tokenizer::encode. When no
// content holds special-token text, the ids equal tok.encode(apply_chat_template(...),
// add_special, true).
std::vector<int32_t> tokenize_chat(const Tokenizer& tok, ChatTemplate t,
                                   const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt, bool add_special);

}  // namespace lc
