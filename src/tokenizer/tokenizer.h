// Tokenizers read from GGUF metadata: SentencePiece-style ("llama") and byte-level BPE
// ("gpt2") with the pre-tokenisers of the supported model families.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"

namespace lc {

enum class TokenAttr : int32_t {  // tokenizer.ggml.token_type values
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static Expected<std::unique_ptr<Tokenizer>> from_gguf(const gguf::File& f);

  // add_special: BOS/EOS as the model's add_bos/add_eos flags say.
  // parse_special: text matching special/control tokens becomes those tokens.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;
  // Bytes of one token (SentencePiece spaces and byte tokens resolved). Control tokens give ""
  // unless `special` is set.
  virtual std::string token_to_piece(int32_t id, bool special = false) const = 0;
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.size()); }
  const std::string& token_text(int32_t id) const { return vocab_[static_cast<size_t>(id)]; }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool is_eog(int32_t id) const;  // end of generation (eos, eot, im_end, ...)
  bool is_control(int32_t id) const;
  int32_t find_token(std::string_view text) const;  // -1 if absent
  const std::string& model_name() const { return model_; }  // "llama" / "gpt2"
  const std::string& pre_name() const { return pre_; }

 protected:
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::vector<int32_t> attrs_;  // TokenAttr per id
  std::vector<int32_t> eog_ids_;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1, pad_ = -1;
  bool add_bos_ = false, add_eos_ = false;
  std::string model_, pre_;
};

// Turns a stream of token ids into text that never splits a UTF-8 character: push() returns
// only complete characters; bytes of an incomplete one wait for the next token.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);
  std::string flush();  // whatever is left (invalid trailing bytes as U+FFFD)

 private:
  const Tokenizer& tok_;
  std::string pending_;
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

}  // namespace lc
