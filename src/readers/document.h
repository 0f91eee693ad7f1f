// A document read from disk in chunks of a fixed number of tokens, without holding it whole:
// the file is read a block of bytes at a time, each block cut before its last whitespace (so a
// word is not split between blocks) and tokenised, and chunks are cut from the tokens.
// A chunk's text is its tokens' pieces joined, so the chunks of a document put together give
// the document back (for byte-level BPE vocabularies exactly).
#pragma once

#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace lc::readers {

struct Chunk {
  int64_t index = 0;      // 0-based
  int64_t n_tokens = 0;
  std::string text;
};

class ChunkStream {
 public:
  // Opens the file; an unreadable or empty file is an error naming it.
  static Expected<ChunkStream> open(const std::string& path, const Tokenizer& tok, int64_t chunk_tokens,
                                    int64_t block_bytes = 1 << 20);
  // The next chunk; an empty Chunk (n_tokens 0) at the end of the document.
  Expected<Chunk> next();
  int64_t bytes_total() const { return size_; }
  int64_t bytes_read() const { return read_; }
  int64_t tokens_read() const { return tokens_; }  // tokens handed out in chunks so far

 private:
  ChunkStream(const Tokenizer& tok, int64_t chunk, int64_t block) : tok_(&tok), chunk_(chunk), block_(block) {}
  Status fill();  // tokenises the next block into pending_

  const Tokenizer* tok_;
  int64_t chunk_, block_;
  std::string path_;
  std::unique_ptr<std::ifstream> in_;
  int64_t size_ = 0, read_ = 0, tokens_ = 0, index_ = 0;
  std::string carry_;             // bytes after the last whitespace of the previous block
  std::deque<int32_t> pending_;   // tokens not yet handed out
  bool eof_ = false;
};

}  // namespace lc::readers
