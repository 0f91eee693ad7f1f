// Training a byte-level BPE vocabulary (Sennrich et al. 2016, "Neural Machine Translation of
// Rare Words with Subword Units"; byte-level as in GPT-2) and writing it as the tokenizer of a
// vocabulary-only GGUF, the form `longctx train --vocab` reads and every GGUF tool loads.
//
// The text is split into words by the "smollm" pre-tokeniser (the StarCoder regex family: every
// digit is a word of its own, so numbers stay digit by digit, which the retrieval tasks copy),
// each word's bytes start as one symbol each, and the most frequent adjacent pair over all
// words (weighted by word count) is merged, again and again, until the vocabulary is full or no
// pair occurs min_pair_count times. Ties go to the pair of smaller symbol ids, so the result
// depends on the text only. The encoder (BpeTokenizer, llama.cpp's algorithm) applies the
// merges by rank to the same words, so encoding the training text reproduces the training
// segmentation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lc {

struct BpeTrainOptions {
  int64_t vocab_size = 2048;    // tokens in all: 256 bytes, the merged pieces, 2 control tokens
  int64_t min_pair_count = 2;   // stop when the best pair occurs fewer times
};

struct BpeVocab {
  std::vector<std::string> tokens;  // GPT-2 byte-level text (bytes mapped to printable codepoints)
  std::vector<int32_t> types;       // tokenizer.ggml.token_type: 1 normal, 3 control
  std::vector<std::string> merges;  // "left right" in rank order
  int32_t bos = -1, eos = -1;
};

// The pre-tokeniser name the vocabulary is trained with and stored under.
inline constexpr const char* kBpeTrainPre = "smollm";

Expected<BpeVocab> train_bpe(const std::vector<std::string>& texts, const BpeTrainOptions& o);

// Writes a GGUF holding only the vocabulary: tokenizer.ggml.model "gpt2", pre "smollm", tokens,
// token types, merges, BOS/EOS ids, add_bos_token true.
Status write_bpe_vocab(const BpeVocab& v, const std::string& name, const std::string& path);

}  // namespace lc
