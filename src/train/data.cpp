#include "train/data.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace lc::train {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Expected<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(fmt::format("data file '{}' cannot be opened: {}", path, std::strerror(errno)));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return make_error(fmt::format("data file '{}': read error", path));
  return s;
}

}  // namespace

Expected<DataFormat> parse_data_format(const std::string& s) {
  if (s == "auto") return DataFormat::kAuto;
  if (s == "text") return DataFormat::kText;
  if (s == "tokens") return DataFormat::kTokens;
  return make_error(fmt::format("unknown data format '{}' (auto, text, tokens)", s));
}

Expected<TokenData> TokenData::from_tokens(std::vector<int32_t> tokens, int64_t n_vocab, std::string name) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      return make_error(fmt::format("{}: token {} at index {} is outside the vocabulary [0, {})",
                                    name, tokens[i], i, n_vocab));
  }
  if (tokens.size() < 2) return make_error(fmt::format("{}: fewer than 2 tokens", name));
  TokenData d;
  d.tokens_ = std::move(tokens);
  d.name_ = std::move(name);
  return d;
}

Expected<TokenData> TokenData::load(const std::string& path, DataFormat fmt, const Tokenizer& tok) {
  if (fmt == DataFormat::kAuto)
    fmt = (ends_with(path, ".bin") || ends_with(path, ".tok") || ends_with(path, ".tokens")) ? DataFormat::kTokens
                                                                                             : DataFormat::kText;
  LC_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  std::vector<int32_t> ids;
  if (fmt == DataFormat::kTokens) {
    if (bytes.size() % 4 != 0)
      return make_error(fmt::format("token file '{}': size {} is not a multiple of 4 (little-endian int32 ids)",
                                    path, bytes.size()));
    ids.resize(bytes.size() / 4);
    std::memcpy(ids.data(), bytes.data(), bytes.size());
  } else {
    if (bytes.empty()) return make_error(fmt::format("text file '{}' is empty", path));
    ids = tok.encode(bytes, /*add_special=*/true, /*parse_special=*/false);
  }
  return from_tokens(std::move(ids), tok.n_vocab(), path);
}

void TokenData::sample(Rng& rng, int64_t n, int32_t* inputs, int32_t* targets) const {
  const uint64_t starts = static_cast<uint64_t>(size() - n);  // windows of n + 1 tokens
  const size_t s = static_cast<size_t>(rng.below(starts));
  std::memcpy(inputs, tokens_.data() + s, static_cast<size_t>(n) * sizeof(int32_t));
  std::memcpy(targets, tokens_.data() + s + 1, static_cast<size_t>(n) * sizeof(int32_t));
}

}  // namespace lc::train
