// llama.cpp's tokenizer test vectors (tests/data/vocab/ggml-vocab-*.gguf with .inp/.out, as
// test-tokenizer-0 reads them: inputs separated by "\n__ggml_vocab_test__\n", one line of ids
// per input, add_special = false, parse_special = false).
#include <fmt/format.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace lc {
namespace {

const std::string kVocabDir = std::string(LONGCTX_TEST_DATA) + "/vocab/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> read_cases(const std::string& base) {
  const std::string inp = read_file(base + ".inp");
  const std::string out = read_file(base + ".out");
  std::vector<std::string> texts;
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<Case> cases;
  std::istringstream lines(out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    Case c;
    c.text = i < texts.size() ? texts[i] : std::string();
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) c.ids.push_back(id);
    cases.push_back(std::move(c));
    ++i;
  }
  EXPECT_EQ(texts.size(), cases.size()) << base;
  return cases;
}

std::unique_ptr<Tokenizer> load(const std::string& path, std::unique_ptr<gguf::File>& file) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  if (!f) return nullptr;
  file = std::move(*f);
  auto t = Tokenizer::from_gguf(*file);
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().message);
  if (!t) return nullptr;
  return std::move(*t);
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

class VocabTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabTest, MatchesLlamaCpp) {
  const std::string base = kVocabDir + "ggml-vocab-" + GetParam() + ".gguf";
  std::unique_ptr<gguf::File> file;
  auto tok = load(base, file);
  ASSERT_TRUE(tok);
  const auto cases = read_cases(base);
  ASSERT_GE(cases.size(), 40u);
  int failures = 0;
  size_t n_ids = 0;
  for (const Case& c : cases) {
    const auto ids = tok->encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(ids, c.ids) << "input '" << c.text << "'\n got:      " << show(ids)
                          << "\n expected: " << show(c.ids);
    if (ids != c.ids) ++failures;
    n_ids += c.ids.size();
    if (tok->model_name() == "gpt2" && tok::is_valid_utf8(c.text)) {
      // Byte-level BPE loses nothing: the pieces put back together are the input.
      std::string joined;
      for (int32_t id : ids) joined += tok->token_to_piece(id);
      EXPECT_EQ(joined, c.text);
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(n_ids, 200u);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, VocabTest,
                         ::testing::Values("llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2",
                                           "starcoder", "deepseek-llm", "deepseek-coder",
                                           "refact", "mpt", "falcon"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(VocabTest, DetokenizeRoundTripWithoutCleanup) {
  // Vocabularies whose llama_detokenize does not tidy spaces give the input back.
  for (const char* name : {"qwen2", "deepseek-llm", "deepseek-coder"}) {
    const std::string base = kVocabDir + "ggml-vocab-" + name + ".gguf";
    std::unique_ptr<gguf::File> file;
    auto tok = load(base, file);
    ASSERT_TRUE(tok);
    for (const Case& c : read_cases(base)) {
      if (!tok::is_valid_utf8(c.text)) continue;
      EXPECT_EQ(tok->decode(tok->encode(c.text, false, false)), c.text) << name;
    }
  }
}

TEST(VocabTest, WordPieceIsRejectedClearly) {
  auto f = gguf::File::open(kVocabDir + "ggml-vocab-bert-bge.gguf");
  ASSERT_TRUE(f.has_value());
  auto t = Tokenizer::from_gguf(**f);
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message.find("bert"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("ggml-vocab-bert-bge.gguf"), std::string::npos);
}

TEST(VocabTest, GptNeoxWithoutPreUsesDefault) {
  std::unique_ptr<gguf::File> file;
  auto tok = load(kVocabDir + "ggml-vocab-gpt-neox.gguf", file);
  ASSERT_TRUE(tok);
  const std::string s = "Hello world, 123 times!";
  std::string joined;
  for (int32_t id : tok->encode(s, false, false)) joined += tok->token_to_piece(id);
  EXPECT_EQ(joined, s);
}

TEST(VocabTest, SpecialTokensAndEog) {
  std::unique_ptr<gguf::File> file;
  auto tok = load(kVocabDir + "ggml-vocab-llama-bpe.gguf", file);
  ASSERT_TRUE(tok);
  const int32_t eot = tok->find_token("<|eot_id|>");
  ASSERT_GE(eot, 0);
  EXPECT_TRUE(tok->is_eog(eot));
  EXPECT_TRUE(tok->is_eog(tok->eos()));
  EXPECT_TRUE(tok->is_control(eot));
  EXPECT_FALSE(tok->is_eog(tok->find_token("Hello")));
  EXPECT_EQ(tok->bos(), 128000);
  EXPECT_TRUE(tok->add_bos());
  // Control tokens are text unless parse_special.
  const std::string s = "<|start_header_id|>user<|end_header_id|>";
  const auto parsed = tok->encode(s, false, true);
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0], tok->find_token("<|start_header_id|>"));
  EXPECT_EQ(parsed[2], tok->find_token("<|end_header_id|>"));
  EXPECT_GT(tok->encode(s, false, false).size(), 3u);
  // add_special puts BOS first.
  const auto with_bos = tok->encode("Hi", true, false);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 128000);
  EXPECT_EQ(tok->token_to_piece(eot), "");
  EXPECT_EQ(tok->token_to_piece(eot, true), "<|eot_id|>");
}

// Encoding throughput (the engine reads million-token prompts): about 1 MB of English must take
// seconds, not minutes (the bound is loose enough for sanitizer builds).
TEST(VocabTest, EncodeThroughput) {
  std::unique_ptr<gguf::File> file;
  auto tok = load(kVocabDir + "ggml-vocab-llama-bpe.gguf", file);
  ASSERT_TRUE(tok);
  const std::string para =
      "The quick brown fox jumps over the lazy dog. In 1984, researchers at the institute "
      "published 3,217 pages of notes; nobody read them all. \"It's fine,\" she said, and "
      "walked away --- carrying a lamp, two books and a cat named O'Malley.\n\n";
  std::string text;
  while (text.size() < (1u << 20)) text += para;
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false, false);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("[ perf ] llama-bpe: {} bytes -> {} tokens in {:.3f} s ({:.0f} tokens/s)\n",
             text.size(), ids.size(), sec, static_cast<double>(ids.size()) / sec);
  EXPECT_LT(sec, 60.0);
  std::unique_ptr<gguf::File> file2;
  auto spm = load(kVocabDir + "ggml-vocab-llama-spm.gguf", file2);
  ASSERT_TRUE(spm);
  const auto t1 = std::chrono::steady_clock::now();
  const auto ids2 = spm->encode(text, false, false);
  const double sec2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  fmt::print("[ perf ] llama-spm: {} bytes -> {} tokens in {:.3f} s ({:.0f} tokens/s)\n",
             text.size(), ids2.size(), sec2, static_cast<double>(ids2.size()) / sec2);
  EXPECT_LT(sec2, 60.0);
  // gpt-2 runs every merge (no whole-word shortcut).
  std::unique_ptr<gguf::File> file3;
  auto gpt2 = load(kVocabDir + "ggml-vocab-gpt-2.gguf", file3);
  ASSERT_TRUE(gpt2);
  const auto t2 = std::chrono::steady_clock::now();
  const auto ids3 = gpt2->encode(text, false, false);
  const double sec3 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count();
  fmt::print("[ perf ] gpt-2:     {} bytes -> {} tokens in {:.3f} s ({:.0f} tokens/s)\n",
             text.size(), ids3.size(), sec3, static_cast<double>(ids3.size()) / sec3);
  EXPECT_LT(sec3, 60.0);
}

}  // namespace
}  // namespace lc
