// llama.cpp's tokenizer test vectors (tests/data/vocab/ggml-vocab-*.gguf with .inp/.out, as
// test-tokenizer-0 reads them: inputs separated by "\n__ggml_vocab_test__\n", one line of ids
// per input, add_special = false, parse_special = false).
#include <fmt/format.h>

#include <gtest/gtest.h>

#include <algorithm>
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
                                           "refact", "mpt", "falcon", "bert-bge"),
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

// WordPiece (BERT, llama.cpp's WPM). The expected ids come from the .out vectors and from the
// GGUF's metadata, never from this tokenizer's own output.
TEST(VocabTest, WordPieceAddSpecialAndSpecialText) {
  const std::string base = kVocabDir + "ggml-vocab-bert-bge.gguf";
  std::unique_ptr<gguf::File> file;
  auto tok = load(base, file);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->model_name(), "bert");
  // The GGUF's cls_token_id, seperator_token_id and unknown_token_id (also llama.cpp's BERT
  // defaults): add_special wraps every input in [CLS] ... [SEP], the empty one included, as
  // llama_tokenize(add_special = true) does for WPM vocabularies.
  EXPECT_EQ(tok->bos(), 101);
  EXPECT_EQ(tok->sep(), 102);
  EXPECT_EQ(tok->unk(), 100);
  EXPECT_EQ(tok->eos(), -1);
  EXPECT_EQ(tok->token_text(101), "[CLS]");
  EXPECT_EQ(tok->token_text(102), "[SEP]");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->add_sep());
  EXPECT_FALSE(tok->add_eos());
  for (const Case& c : read_cases(base)) {
    std::vector<int32_t> want{101};
    want.insert(want.end(), c.ids.begin(), c.ids.end());
    want.push_back(102);
    EXPECT_EQ(tok->encode(c.text, true, false), want) << c.text;
  }
  // [CLS] / [SEP] typed in the text are control tokens: only parse_special makes them tokens.
  // Without it they are text: "[", "cls", "]" (as the text "[cls]" encodes).
  const auto hello = tok->encode("hello", false, false);
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(tok->encode("[CLS] hello[SEP]", false, true),
            (std::vector<int32_t>{101, hello[0], 102}));
  const auto plain = tok->encode("[CLS]", false, false);
  EXPECT_EQ(plain, tok->encode("[cls]", false, false));
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 101), 0);
  EXPECT_EQ(plain.front(), tok->find_token("\xE2\x96\x81["));
  EXPECT_EQ(plain.back(), tok->find_token("\xE2\x96\x81]"));
}

TEST(VocabTest, WordPieceDecode) {
  std::unique_ptr<gguf::File> file;
  auto tok = load(kVocabDir + "ggml-vocab-bert-bge.gguf", file);
  ASSERT_TRUE(tok);
  // token_to_piece: U+2581 is a space, continuation pieces have none, control tokens print
  // only with special.
  EXPECT_EQ(tok->token_to_piece(7592), " hello");  // "\u2581hello" (vectors: "Hello" -> 7592)
  EXPECT_EQ(tok->token_to_piece(2140), "l");  // "Äpfel" -> "\u2581ap" "fe" "l"
  EXPECT_EQ(tok->token_to_piece(101), "");
  EXPECT_EQ(tok->token_to_piece(101, true), "[CLS]");
  // llama_detokenize on WPM: no leading space is removed (add_space_prefix is false), and the
  // BPE clean-up applies (clean_spaces is true): " ," and " !" lose their space.
  EXPECT_EQ(tok->decode({7592, 1010, 2088, 999}), " hello, world!");
  EXPECT_EQ(tok->decode({9706, 7959, 2140}), " apfel");
  EXPECT_EQ(tok->decode({101, 7592, 102}), " hello");
  EXPECT_EQ(tok->decode({101, 7592, 102}, true), "[CLS] hello[SEP]");
}

TEST(VocabTest, WordPieceNormaliserCorners) {
  std::unique_ptr<gguf::File> file;
  auto tok = load(kVocabDir + "ggml-vocab-bert-bge.gguf", file);
  ASSERT_TRUE(tok);
  const auto enc = [&](const std::string& s) { return tok->encode(s, false, false); };
  // Accents go whether precomposed (NFD's first codepoint) or already decomposed (the combining
  // mark is dropped, as BertNormalizer's strip_accents and llama.cpp do).
  EXPECT_EQ(enc("caf\xC3\xA9"), enc("cafe"));
  EXPECT_EQ(enc("cafe\xCC\x81"), enc("cafe"));
  EXPECT_EQ(enc("CAF\xC3\x89"), enc("cafe"));
  // Format characters (U+200B, U+200D) and NUL are dropped without splitting the word.
  EXPECT_EQ(enc("hel\xE2\x80\x8Blo"), enc("hello"));
  EXPECT_EQ(enc(std::string("hel\0lo", 6)), enc("hello"));
  // Ill-formed UTF-8 decodes to U+FFFD byte by byte, and U+FFFD is dropped like a control
  // character (llama.cpp's unicode_cpts_from_utf8 and WPM preprocess).
  EXPECT_EQ(enc("hel\xFFlo"), enc("hello"));
  EXPECT_EQ(enc("hello\xC3"), enc("hello"));
  EXPECT_TRUE(enc("\xC3").empty());
  EXPECT_TRUE(enc("\xF4\x90\x80\x80").empty());  // past U+10FFFF (llama.cpp throws on it)
  EXPECT_TRUE(enc("\xED\xA0\x80").empty());  // a surrogate: category Cs, a control
  // Each punctuation mark, ASCII symbol and CJK ideograph is a word of its own; other symbols
  // stay inside their word, which then cannot be matched and becomes [UNK] whole.
  EXPECT_EQ(enc("a+b"), enc("a + b"));
  EXPECT_EQ(enc("\xE6\x88\x91\xE6\x83\xB3"), enc("\xE6\x88\x91 \xE6\x83\xB3"));
  EXPECT_EQ(enc("hello\xE2\x9C\x85"), std::vector<int32_t>{100});
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
  // WordPiece normalises every codepoint (NFD, classes, lowercase) before matching.
  std::unique_ptr<gguf::File> file4;
  auto bert = load(kVocabDir + "ggml-vocab-bert-bge.gguf", file4);
  ASSERT_TRUE(bert);
  const auto t3 = std::chrono::steady_clock::now();
  const auto ids4 = bert->encode(text, false, false);
  const double sec4 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t3).count();
  fmt::print("[ perf ] bert-bge:  {} bytes -> {} tokens in {:.3f} s ({:.0f} tokens/s)\n",
             text.size(), ids4.size(), sec4, static_cast<double>(ids4.size()) / sec4);
  EXPECT_LT(sec4, 60.0);
}

}  // namespace
}  // namespace lc
