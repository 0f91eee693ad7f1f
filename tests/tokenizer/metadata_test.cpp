// Tokenizers built from in-memory GGUFs: hostile or inconsistent metadata must give an Error
// (never a crash), and arbitrary input bytes must encode and decode safely.
#include <fmt/format.h>

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace lc {
namespace {

// Keeps the bytes alive for as long as the File that points into them.
struct Mem {
  std::vector<uint8_t> bytes;
  std::unique_ptr<gguf::File> file;
};

Expected<std::unique_ptr<Tokenizer>> build(const gguf::Writer& w, Mem& m) {
  EXPECT_TRUE(w.status().is_ok()) << w.status().message();
  m.bytes = w.to_bytes();
  auto f = gguf::File::parse(m.bytes.data(), m.bytes.size(), "hostile.gguf");
  if (!f) return f.error();
  m.file = std::move(*f);
  return Tokenizer::from_gguf(*m.file);
}

std::vector<std::string> spm_tokens() {
  std::vector<std::string> t = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) t.push_back(fmt::format("<0x{:02X}>", b));
  for (const char* s : {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab"})
    t.push_back(s);
  return t;
}

gguf::Writer spm_writer() {
  gguf::Writer w;
  const auto toks = spm_tokens();
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", toks);
  std::vector<float> scores(toks.size(), 0.0f);
  std::vector<int32_t> types(toks.size(), 1);
  types[0] = 2;
  types[1] = types[2] = 3;
  for (size_t i = 3; i < 259; ++i) types[i] = 6;
  for (size_t i = 259; i < toks.size(); ++i) scores[i] = -static_cast<float>(i);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  return w;
}

gguf::Writer bpe_writer() {
  gguf::Writer w;
  const tok::ByteUnicode& bu = tok::byte_unicode();
  std::vector<std::string> toks(bu.byte_to_utf8.begin(), bu.byte_to_utf8.end());
  toks.push_back("he");
  toks.push_back("llo");
  toks.push_back("hello");
  toks.push_back("<|endoftext|>");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt-2");
  w.set_string_array("tokenizer.ggml.tokens", toks);
  std::vector<int32_t> types(toks.size(), 1);
  types.back() = 3;
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", {"h e", "l l", "ll o", "he llo", "garbage"});
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(toks.size() - 1));
  return w;
}

// A small WordPiece vocabulary: [PAD] [UNK] [CLS] [SEP], word starts ("\u2581ab") and
// continuations ("b").
std::vector<std::string> wpm_tokens() {
  const std::string w = "\xE2\x96\x81";
  return {"[PAD]", "[UNK]", "[CLS]", "[SEP]", w + "a", w + "ab", "b", "c", w + "A",
          w + "\xC3\xA9", w + "e", w + ","};
}

gguf::Writer wpm_writer() {
  gguf::Writer w;
  const auto toks = wpm_tokens();
  w.set_string("tokenizer.ggml.model", "bert");
  w.set_string_array("tokenizer.ggml.tokens", toks);
  std::vector<int32_t> types(toks.size(), 1);
  types[0] = types[1] = types[2] = types[3] = 3;
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.unknown_token_id", 1);
  w.set_u32("tokenizer.ggml.bos_token_id", 2);
  w.set_u32("tokenizer.ggml.seperator_token_id", 3);
  w.set_u32("tokenizer.ggml.padding_token_id", 0);
  return w;
}

void expect_error(const Expected<std::unique_ptr<Tokenizer>>& t, const char* needle) {
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("hostile.gguf"), std::string::npos) << t.error().message;
}

TEST(TokenizerMetadata, ValidSpmAndBpeLoad) {
  Mem m1, m2;
  auto spm = build(spm_writer(), m1);
  ASSERT_TRUE(spm.has_value()) << spm.error().message;
  EXPECT_EQ((*spm)->encode("ab a", true, false),
            (std::vector<int32_t>{1, (*spm)->find_token("\xE2\x96\x81" "ab"),
                                  (*spm)->find_token("\xE2\x96\x81" "a")}));
  // 'c' is not in the vocabulary: byte fallback.
  EXPECT_EQ((*spm)->encode("c", false, false),
            (std::vector<int32_t>{(*spm)->find_token("\xE2\x96\x81"), 3 + 'c'}));
  auto bpe = build(bpe_writer(), m2);
  ASSERT_TRUE(bpe.has_value()) << bpe.error().message;
  EXPECT_EQ((*bpe)->encode("hello", false, false),
            std::vector<int32_t>{(*bpe)->find_token("hello")});
  EXPECT_FALSE((*bpe)->add_bos());
  EXPECT_TRUE((*bpe)->is_eog((*bpe)->find_token("<|endoftext|>")));
}

TEST(TokenizerMetadata, WordPieceLoadsAndMatchesLongestFirst) {
  Mem m;
  auto t = build(wpm_writer(), m);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.bos(), 2);
  EXPECT_EQ(tok.sep(), 3);
  EXPECT_EQ(tok.unk(), 1);
  // "\u2581ab" before "\u2581a"; then the continuation "b"; upper case folds to lower case.
  EXPECT_EQ(tok.encode("abb", false, false), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(tok.encode("ABB a", true, false), (std::vector<int32_t>{2, 5, 6, 4, 3}));
  // A word that cannot be cut all the way is one [UNK], its matched pieces dropped.
  EXPECT_EQ(tok.encode("abd a", false, false), (std::vector<int32_t>{1, 4}));
  // Punctuation is a word of its own; accents are stripped (lowercase implies strip_accents).
  EXPECT_EQ(tok.encode("a,\xC3\xA9", false, false), (std::vector<int32_t>{4, 11, 10}));
}

TEST(TokenizerMetadata, WordPieceNormaliserKeys) {
  // lowercase = false: case is kept, and strip_accents follows it unless given.
  gguf::Writer w = wpm_writer();
  w.set_bool("tokenizer.ggml.normalizer.lowercase", false);
  Mem m;
  auto t = build(w, m);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->encode("A a", false, false), (std::vector<int32_t>{8, 4}));
  EXPECT_EQ((*t)->encode("\xC3\xA9", false, false), std::vector<int32_t>{9});
  w.set_bool("tokenizer.ggml.normalizer.strip_accents", true);
  Mem m2;
  auto t2 = build(w, m2);
  ASSERT_TRUE(t2.has_value()) << t2.error().message;
  EXPECT_EQ((*t2)->encode("\xC3\xA9 A", false, false), (std::vector<int32_t>{10, 8}));
  // lowercase without strip_accents: "\u00C9" lowercases to "\u00E9" and keeps its accent.
  gguf::Writer w3 = wpm_writer();
  w3.set_bool("tokenizer.ggml.normalizer.strip_accents", false);
  Mem m3;
  auto t3 = build(w3, m3);
  ASSERT_TRUE(t3.has_value()) << t3.error().message;
  EXPECT_EQ((*t3)->encode("\xC3\x89", false, false), std::vector<int32_t>{9});
}

TEST(TokenizerMetadata, WordPieceSpecialIds) {
  // Without id keys, BERT's defaults (101 [CLS], 102 [SEP], 100 [UNK]) are outside a small
  // vocabulary: as in llama.cpp, add_bos (true for WordPiece) then needs a BOS it does not have.
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "bert");
  w.set_string_array("tokenizer.ggml.tokens", wpm_tokens());
  Mem m;
  expect_error(build(w, m), "BOS");
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  Mem m2;
  expect_error(build(w, m2), "SEP");
  // Neither asked for: it loads, add_special adds nothing and an unmatched word gives no id
  // (llama.cpp would emit -1 for the missing [UNK]).
  w.set_bool("tokenizer.ggml.add_sep_token", false);
  Mem m3;
  auto t = build(w, m3);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->bos(), -1);
  EXPECT_EQ((*t)->unk(), -1);
  EXPECT_EQ((*t)->encode("ab zz", true, false), std::vector<int32_t>{5});
  // A bad separator id is ignored like a bad padding id.
  gguf::Writer w4 = wpm_writer();
  w4.set_u32("tokenizer.ggml.seperator_token_id", 5000);
  w4.set_bool("tokenizer.ggml.add_sep_token", false);
  Mem m4;
  auto t4 = build(w4, m4);
  ASSERT_TRUE(t4.has_value()) << t4.error().message;
  EXPECT_EQ((*t4)->sep(), -1);
}

TEST(TokenizerMetadata, UnknownOrMissingModel) {
  gguf::Writer w = spm_writer();
  w.set_string("tokenizer.ggml.model", "sentencepiece-unigram-9000");
  Mem m;
  expect_error(build(w, m), "sentencepiece-unigram-9000");

  gguf::Writer w2;
  w2.set_string_array("tokenizer.ggml.tokens", {"a"});
  Mem m2;
  expect_error(build(w2, m2), "tokenizer.ggml.model");
}

TEST(TokenizerMetadata, MissingOrBadTokens) {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "llama");
  Mem m;
  expect_error(build(w, m), "tokenizer.ggml.tokens");

  gguf::Writer w2;
  w2.set_string("tokenizer.ggml.model", "llama");
  w2.set_f32_array("tokenizer.ggml.tokens", {1.0f, 2.0f});
  Mem m2;
  expect_error(build(w2, m2), "tokenizer.ggml.tokens");

  gguf::Writer w3;
  w3.set_string("tokenizer.ggml.model", "gpt2");
  w3.set_string_array("tokenizer.ggml.tokens", {});
  Mem m3;
  expect_error(build(w3, m3), "tokenizer.ggml.tokens");

  gguf::Writer w4 = spm_writer();
  auto toks = spm_tokens();
  toks[5] = toks[4];
  w4.set_string_array("tokenizer.ggml.tokens", toks);
  Mem m4;
  expect_error(build(w4, m4), "duplicate");
}

TEST(TokenizerMetadata, LengthMismatches) {
  gguf::Writer w = spm_writer();
  w.set_f32_array("tokenizer.ggml.scores", {0.0f, 1.0f});
  Mem m;
  expect_error(build(w, m), "tokenizer.ggml.scores");

  gguf::Writer w2 = spm_writer();
  w2.set_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(1000, 1));
  Mem m2;
  expect_error(build(w2, m2), "tokenizer.ggml.token_type");
}

TEST(TokenizerMetadata, SpecialIdsOutOfRange) {
  gguf::Writer w = spm_writer();
  w.set_u32("tokenizer.ggml.bos_token_id", 100000);
  Mem m;
  expect_error(build(w, m), "tokenizer.ggml.bos_token_id");

  gguf::Writer w2 = spm_writer();
  w2.set_i32("tokenizer.ggml.eos_token_id", -7);
  Mem m2;
  expect_error(build(w2, m2), "tokenizer.ggml.eos_token_id");

  // 0xFFFFFFFF means "none" (stories260K has such keys); a bad padding id is only ignored.
  gguf::Writer w3 = spm_writer();
  w3.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
  w3.set_u32("tokenizer.ggml.eot_token_id", 123456);
  Mem m3;
  auto t = build(w3, m3);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->pad(), -1);

  // add_bos_token without any BOS token.
  gguf::Writer w4 = bpe_writer();
  w4.set_bool("tokenizer.ggml.add_bos_token", true);
  Mem m4;
  expect_error(build(w4, m4), "BOS");
}

TEST(TokenizerMetadata, BpeNeedsMerges) {
  gguf::Writer w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
  Mem m;
  expect_error(build(w, m), "tokenizer.ggml.merges");
}

TEST(TokenizerMetadata, UnknownPreFallsBack) {
  gguf::Writer w = bpe_writer();
  w.set_string("tokenizer.ggml.pre", "some-future-model");
  Mem m;
  auto t = build(w, m);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->pre_name(), "some-future-model");
  EXPECT_EQ((*t)->encode("hello", false, false),
            std::vector<int32_t>{(*t)->find_token("hello")});
}

// Broken tokens (a byte token with bad hex, an undefined token type) and random input never
// crash and never produce out-of-range ids.
TEST(TokenizerMetadata, RandomInputIsSafe) {
  gguf::Writer w = spm_writer();
  auto toks = spm_tokens();
  toks[10] = "<0xZZ>";
  w.set_string_array("tokenizer.ggml.tokens", toks);
  std::vector<int32_t> types(toks.size(), 1);
  for (size_t i = 3; i < 259; ++i) types[i] = 6;
  types[20] = 77;  // not a token type
  w.set_i32_array("tokenizer.ggml.token_type", types);
  Mem m1, m2, m3;
  auto spm = build(w, m1);
  ASSERT_TRUE(spm.has_value()) << spm.error().message;
  auto bpe = build(bpe_writer(), m2);
  ASSERT_TRUE(bpe.has_value()) << bpe.error().message;
  auto wpm = build(wpm_writer(), m3);
  ASSERT_TRUE(wpm.has_value()) << wpm.error().message;
  std::mt19937 rng(42);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    if (iter % 3 == 0) s += "<s></s><|endoftext|>[CLS][SEP]";
    for (const auto* t : {spm->get(), bpe->get(), wpm->get()}) {
      for (bool special : {false, true}) {
        const auto ids = t->encode(s, special, special);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t->n_vocab());
        StreamDecoder sd(*t);
        std::string out;
        for (int32_t id : ids) {
          const std::string part = sd.push(id);
          EXPECT_TRUE(tok::is_valid_utf8(part));
          out += part;
        }
        out += sd.flush();
        EXPECT_TRUE(tok::is_valid_utf8(out));
        (void)t->decode(ids, special);
      }
    }
  }
}

TEST(TokenizerMetadata, ChatTemplateFromTemplateString) {
  struct C {
    const char* tmpl;
    ChatTemplate want;
  };
  for (const C& c : {
           C{"{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
             "{{ m.content }}<|eot_id|>{% endfor %}",
             ChatTemplate::kLlama3},
           C{"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
             "{% endfor %}",
             ChatTemplate::kChatML},
           C{"{{ bos_token }}[INST] <<SYS>>\n{{ system }}\n<</SYS>>\n\n{{ user }} [/INST]",
             ChatTemplate::kLlama2},
           C{"{% for m in messages %}<|user|>\n{{ m.content }}{{ eos_token }}{% endfor %}",
             ChatTemplate::kZephyr},
           C{"{{ messages }}", ChatTemplate::kNone},
       }) {
    gguf::Writer w = spm_writer();
    w.set_string("tokenizer.chat_template", c.tmpl);
    Mem m;
    auto t = build(w, m);
    ASSERT_TRUE(t.has_value()) << t.error().message;
    EXPECT_EQ(detect_chat_template(*m.file, **t), c.want) << c.tmpl;
  }
}

}  // namespace
}  // namespace lc
