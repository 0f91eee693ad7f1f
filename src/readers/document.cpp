#include "readers/document.h"

#include <fmt/format.h>

#include <filesystem>

namespace lc::readers {

Expected<ChunkStream> ChunkStream::open(const std::string& path, const Tokenizer& tok, int64_t chunk_tokens,
                                        int64_t block_bytes) {
  if (chunk_tokens < 1) return make_error(fmt::format("reader: chunk size must be >= 1 token, got {}", chunk_tokens));
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return make_error(fmt::format("{}: is a directory, not a document file", path));
  ChunkStream s(tok, chunk_tokens, std::max<int64_t>(block_bytes, 64));
  s.path_ = path;
  s.in_ = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*s.in_) return make_error(fmt::format("{}: cannot open document file", path));
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(fmt::format("{}: cannot read the file size: {}", path, ec.message()));
  s.size_ = static_cast<int64_t>(size);
  if (s.size_ == 0) return make_error(fmt::format("{}: the document is empty", path));
  return s;
}

Status ChunkStream::fill() {
  std::string buf(static_cast<size_t>(block_), '\0');
  in_->read(buf.data(), block_);
  const auto got = in_->gcount();
  if (in_->bad()) return make_error(fmt::format("{}: read error after {} bytes", path_, read_));
  buf.resize(static_cast<size_t>(got));
  read_ += got;
  std::string text = std::move(carry_);
  carry_.clear();
  text += buf;
  if (got < block_ || read_ >= size_) {
    eof_ = true;
  } else {
    // Keep the bytes from the last whitespace on for the next block, so the space stays with
    // the word after it as byte-level BPE pre-tokenisers keep it (a block without whitespace
    // is cut where it ends).
    const size_t cut = text.find_last_of(" \n\t\r");
    if (cut != std::string::npos && cut > 0) {
      carry_ = text.substr(cut);
      text.resize(cut);
    }
  }
  for (int32_t id : tok_->encode(text, false, false)) pending_.push_back(id);
  return ok_status();
}

Expected<Chunk> ChunkStream::next() {
  while (static_cast<int64_t>(pending_.size()) < chunk_ && !eof_) LC_TRY(fill());
  Chunk c;
  c.index = index_;
  const int64_t n = std::min<int64_t>(chunk_, static_cast<int64_t>(pending_.size()));
  for (int64_t i = 0; i < n; ++i) {
    c.text += tok_->token_to_piece(pending_.front());
    pending_.pop_front();
  }
  c.n_tokens = n;
  tokens_ += n;
  if (n > 0) ++index_;
  return c;
}

}  // namespace lc::readers
