// Byte-level BPE training: the merges on a hand-counted corpus, and the written vocabulary
// loaded by the engine's tokenizer (llama.cpp's algorithm), whose encoding must equal an
// independent rank-by-rank application of the merges and decode back to the input.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/bpe_train.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace lc {
namespace {

// "abc abc abc ab" splits into "abc", " abc" x2, " ab". Counted by hand: (a,b) occurs 4 times;
// then (ab,c) and (' ',ab) 3 times each, the tie going to the smaller ids (' ' = 32 < 256);
// then (" ab",c) twice, and (ab,c) once more, below the minimum count of 2.
TEST(BpeTrain, MergesTheMostFrequentPairFirst) {
  BpeTrainOptions o;
  o.vocab_size = 300;
  auto v = train_bpe({"abc abc abc ab"}, o);
  ASSERT_TRUE(v.has_value()) << v.error().message;
  const std::vector<std::string> want = {"a b", "\xC4\xA0 ab", "\xC4\xA0" "ab c"};  // U+0120 stands for ' '
  EXPECT_EQ(v->merges, want);
  ASSERT_EQ(v->tokens.size(), 256u + 3 + 2);
  EXPECT_EQ(v->tokens[256], "ab");
  EXPECT_EQ(v->tokens[258], "\xC4\xA0" "abc");
  EXPECT_EQ(v->tokens[static_cast<size_t>(v->bos)], "<s>");
  EXPECT_EQ(v->tokens[static_cast<size_t>(v->eos)], "</s>");
  EXPECT_EQ(v->types[static_cast<size_t>(v->eos)], 3);
  EXPECT_EQ(v->types[65], 1);
}

TEST(BpeTrain, StopsAtTheRequestedSize) {
  BpeTrainOptions o;
  o.vocab_size = 256 + 2 + 1;  // one merge
  auto v = train_bpe({"abc abc abc ab"}, o);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->merges.size(), 1u);
  EXPECT_EQ(v->tokens.size(), 259u);
}

TEST(BpeTrain, BadOptionsAndEmptyTextAreErrors) {
  BpeTrainOptions o;
  o.vocab_size = 100;
  auto v = train_bpe({"text"}, o);
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.error().message.find("100"), std::string::npos) << v.error().message;
  o.vocab_size = 512;
  EXPECT_FALSE(train_bpe({}, o).has_value());
  EXPECT_FALSE(train_bpe({""}, o).has_value());
  o.min_pair_count = 0;
  EXPECT_FALSE(train_bpe({"text"}, o).has_value());
}

// The merges applied word by word in rank order, lowest rank first and leftmost on ties, the
// textbook BPE encoder, written from the merge list alone.
std::vector<std::string> naive_encode(const std::string& text, const std::vector<std::string>& merges) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t sp = merges[i].find(' ');
    rank.emplace(std::make_pair(merges[i].substr(0, sp), merges[i].substr(sp + 1)), i);
  }
  const tok::ByteUnicode& bu = tok::byte_unicode();
  const std::vector<uint32_t> cpts = tok::decode_utf8_all(text);
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t len : tok::PreTokenizer(tok::PreType::kStarcoder).split(cpts)) {
    std::string utf8;
    for (size_t k = at; k < at + len; ++k) tok::append_utf8(utf8, cpts[k]);
    at += len;
    std::vector<std::string> sym;
    for (char c : utf8) sym.push_back(bu.byte_to_utf8[static_cast<uint8_t>(c)]);
    for (;;) {
      size_t best = merges.size(), where = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = rank.find({sym[i], sym[i + 1]});
        if (it != rank.end() && it->second < best) best = it->second, where = i;
      }
      if (best == merges.size()) break;
      sym[where] += sym[where + 1];
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(where) + 1);
    }
    for (auto& s : sym) out.push_back(s);
  }
  return out;
}

TEST(BpeTrain, WrittenVocabularyEncodesAsTheMergesSayAndRoundTrips) {
  std::string corpus;
  const char* words[] = {"the", "needle", "value", "key", "is", "hidden", "in", "text", "magic", "number"};
  for (int i = 0; i < 400; ++i) {
    corpus += words[i % 10];
    corpus += i % 7 == 0 ? ".\n" : " ";
    if (i % 13 == 0) corpus += std::to_string(1000003 * i % 9999991) + " ";
  }
  corpus += "Ünïcödé — 東京 🙂 tabs\tand  spaces";
  BpeTrainOptions o;
  o.vocab_size = 400;
  auto v = train_bpe({corpus}, o);
  ASSERT_TRUE(v.has_value()) << v.error().message;
  const std::string path = testing::TempDir() + "/bpe_train_test.gguf";
  ASSERT_TRUE(write_bpe_vocab(*v, "test vocabulary", path).is_ok());
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  auto tok = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(tok.has_value()) << tok.error().message;
  EXPECT_EQ((*tok)->n_vocab(), static_cast<int32_t>(v->tokens.size()));
  EXPECT_EQ((*tok)->bos(), v->bos);
  EXPECT_EQ((*tok)->eos(), v->eos);
  for (const std::string& s :
       {corpus, std::string("the magic number is 4395874."), std::string("unseen wörds ✓ \x01\x7f"),
        std::string("  leading and trailing  "), std::string("\n\n")}) {
    const std::vector<int32_t> ids = (*tok)->encode(s, false, false);
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back((*tok)->token_text(id));
    EXPECT_EQ(pieces, naive_encode(s, v->merges)) << s;
    EXPECT_EQ((*tok)->decode(ids), s);
  }
  // Digits stay one token each (the smollm pre-tokeniser), and BOS leads an encoded prompt.
  EXPECT_EQ((*tok)->encode("4395874", false, false).size(), 7u);
  EXPECT_EQ((*tok)->encode("key", true, false).front(), v->bos);
  // The merges pay off on text like the training text: well under one token per byte.
  const size_t n = (*tok)->encode(corpus, false, false).size();
  EXPECT_LT(n * 2, corpus.size()) << n << " tokens for " << corpus.size() << " bytes";
  std::remove(path.c_str());
}

}  // namespace
}  // namespace lc
