// The llama.cpp goldens for the stories260K SPM vocabulary (tests/data/golden/tokenizer), the
// stream decoder on byte-fallback characters, and chat templates.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

struct Loaded {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
};

Loaded load_stories() {
  Loaded l;
  auto f = gguf::File::open(kGolden + "models/stories260K.gguf");
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  if (!f) return l;
  l.file = std::move(*f);
  auto t = Tokenizer::from_gguf(*l.file);
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().message);
  if (t) l.tok = std::move(*t);
  return l;
}

nlohmann::json golden_cases() {
  std::ifstream in(kGolden + "tokenizer/tokenizer_cases.json");
  return nlohmann::json::parse(in);
}

TEST(GoldenTokenizer, Stories260KCases) {
  Loaded l = load_stories();
  ASSERT_TRUE(l.tok);
  const Tokenizer& tok = *l.tok;
  EXPECT_EQ(tok.model_name(), "llama");
  EXPECT_EQ(tok.n_vocab(), 512);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_FALSE(tok.add_eos());
  EXPECT_TRUE(tok.is_eog(2));
  const auto j = golden_cases();
  ASSERT_EQ(j["cases"].size(), 16u);
  for (const auto& c : j["cases"]) {
    const std::string name = c["name"];
    const std::string text = c["text"];
    SCOPED_TRACE(name);
    const auto ids = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    const auto no_bos = tok.encode(text, false, false);
    EXPECT_EQ(no_bos, c["ids_no_bos"].get<std::vector<int32_t>>());
    std::vector<std::string> texts;
    for (int32_t id : ids) texts.push_back(tok.token_text(id));
    EXPECT_EQ(texts, c["tokens"].get<std::vector<std::string>>());
    EXPECT_EQ(tok.decode(c["ids_no_bos"].get<std::vector<int32_t>>()),
              c["detok_no_bos"].get<std::string>());
  }
}

TEST(GoldenTokenizer, StreamDecoderMatchesDecode) {
  Loaded l = load_stories();
  ASSERT_TRUE(l.tok);
  const Tokenizer& tok = *l.tok;
  const auto j = golden_cases();
  std::vector<std::string> texts;
  for (const auto& c : j["cases"]) texts.push_back(c["text"]);
  texts.push_back("中文 and 😀🎉 mixed with ñ, ü and ∑ symbols 你好世界");
  bool saw_split = false;
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    const auto ids = tok.encode(text, false, false);
    StreamDecoder sd(tok, /*strip_first_space=*/true);
    StreamDecoder raw(tok);
    std::string joined, raw_joined;
    for (int32_t id : ids) {
      raw_joined += raw.push(id);
      const std::string part = sd.push(id);
      EXPECT_TRUE(tok::is_valid_utf8(part)) << "id " << id;
      // A byte token that starts a multi-byte character must not be emitted on its own.
      const std::string p = tok.token_to_piece(id);
      if (p.size() == 1 && static_cast<uint8_t>(p[0]) >= 0xC0) {
        EXPECT_EQ(part, "");
        saw_split = true;
      }
      joined += part;
    }
    joined += sd.flush();
    raw_joined += raw.flush();
    EXPECT_EQ(joined, tok.decode(ids));
    EXPECT_EQ(joined, text);
    // Without stripping, a continuation keeps the space SentencePiece put in front of it.
    EXPECT_EQ(raw_joined, ids.empty() ? "" : " " + text);
  }
  EXPECT_TRUE(saw_split);  // the inputs do exercise byte fallback
}

TEST(GoldenTokenizer, StreamDecoderFlushesBrokenTail) {
  Loaded l = load_stories();
  ASSERT_TRUE(l.tok);
  const Tokenizer& tok = *l.tok;
  const int32_t e4 = tok.find_token("<0xE4>");
  const int32_t bd = tok.find_token("<0xBD>");
  ASSERT_GE(e4, 0);
  ASSERT_GE(bd, 0);
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(e4), "");
  EXPECT_EQ(sd.push(bd), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  // A stray continuation byte becomes U+FFFD instead of reaching the output.
  StreamDecoder sd2(tok);
  EXPECT_EQ(sd2.push(bd), "\xEF\xBF\xBD");
}

TEST(GoldenTokenizer, ControlTokensPrintOnlyWhenSpecial) {
  Loaded l = load_stories();
  ASSERT_TRUE(l.tok);
  EXPECT_EQ(l.tok->token_to_piece(1), "");
  EXPECT_EQ(l.tok->token_to_piece(1, true), "<s>");
  EXPECT_EQ(l.tok->token_to_piece(-5), "");
  EXPECT_EQ(l.tok->token_to_piece(1 << 20), "");
  EXPECT_EQ(l.tok->decode({1, 2}, true), "<s></s>");
  // parse_special turns literal control-token text into the token.
  const auto ids = l.tok->encode("<s>Hi</s>", false, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
}

TEST(ChatTemplate, Llama3) {
  const std::vector<ChatMessage> msgs = {{"user", "Hello"}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::kLlama3, msgs, true),
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::vector<ChatMessage> conv = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::kLlama3, conv, false),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>");
}

TEST(ChatTemplate, ChatML) {
  const std::vector<ChatMessage> msgs = {{"user", "Hello"}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::kChatML, msgs, true),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> conv = {{"system", "You are helpful."}, {"user", "Hi"}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::kChatML, conv, false),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, Llama2AndZephyr) {
  const std::vector<ChatMessage> conv = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(apply_chat_template(ChatTemplate::kLlama2, conv, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
  EXPECT_EQ(apply_chat_template(ChatTemplate::kZephyr, {{"user", "Hello"}}, true),
            "<|user|>\nHello<|endoftext|>\n<|assistant|>\n");
}

TEST(ChatTemplate, Names) {
  for (ChatTemplate t : {ChatTemplate::kNone, ChatTemplate::kLlama3, ChatTemplate::kChatML,
                         ChatTemplate::kLlama2, ChatTemplate::kZephyr}) {
    auto back = chat_template_from_name(chat_template_name(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
  }
  EXPECT_FALSE(chat_template_from_name("jinja-magic").has_value());
}

TEST(ChatTemplate, DetectFromVocabAndTemplate) {
  const std::string vocab = std::string(LONGCTX_TEST_DATA) + "/vocab/";
  struct C {
    const char* file;
    ChatTemplate want;
  };
  for (const C& c : {C{"ggml-vocab-llama-bpe.gguf", ChatTemplate::kLlama3},
                     C{"ggml-vocab-qwen2.gguf", ChatTemplate::kChatML},
                     C{"ggml-vocab-gpt-2.gguf", ChatTemplate::kNone},
                     // phi-3's template uses <|user|> ... <|end|>: not one of ours.
                     C{"ggml-vocab-phi-3.gguf", ChatTemplate::kNone}}) {
    auto f = gguf::File::open(vocab + c.file);
    ASSERT_TRUE(f.has_value());
    auto t = Tokenizer::from_gguf(**f);
    ASSERT_TRUE(t.has_value()) << t.error().message;
    EXPECT_EQ(detect_chat_template(**f, **t), c.want) << c.file;
  }
  Loaded l = load_stories();
  ASSERT_TRUE(l.tok);
  EXPECT_EQ(detect_chat_template(*l.file, *l.tok), ChatTemplate::kNone);
}

}  // namespace
}  // namespace lc
