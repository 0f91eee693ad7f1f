// Training data: a token stream read from a file of raw token ids or from a text file
// tokenized with the model's GGUF tokenizer, and random windows drawn from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "train/rng.h"

namespace lc::train {

enum class DataFormat { kAuto, kText, kTokens };
// "auto" (by extension: .bin/.tok/.tokens are token files, anything else text), "text", "tokens".
Expected<DataFormat> parse_data_format(const std::string& s);

class TokenData {
 public:
  // Token files hold little-endian int32 ids, no header. Text is encoded whole, with the
  // tokenizer's BOS when it adds one. Ids are checked against n_vocab; the error names the file.
  static Expected<TokenData> load(const std::string& path, DataFormat fmt, const Tokenizer& tok);
  static Expected<TokenData> from_tokens(std::vector<int32_t> tokens, int64_t n_vocab, std::string name);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& name() const { return name_; }

  // A uniformly random window of n + 1 consecutive tokens: inputs: [n] its first n, targets:
  // [n] its last n. Needs size() >= n + 1.
  void sample(Rng& rng, int64_t n, int32_t* inputs, int32_t* targets) const;

 private:
  std::vector<int32_t> tokens_;
  std::string name_;
};

}  // namespace lc::train
