// tokenize_chat: the template's markup is parsed for special tokens, the messages' contents are
// not. Without special text in the contents the ids equal encoding the rendered string with
// parse_special (llama.cpp's common_chat_apply_template + common_tokenize(..., true, true));
// checked on real vocabularies from llama.cpp's test set (tests/data/vocab), BPE and SPM.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lc {
namespace {

const std::string kVocabDir = std::string(LONGCTX_TEST_DATA) + "/vocab/";

struct Vocab {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
};

Vocab load(const std::string& name) {
  Vocab v;
  auto f = gguf::File::open(kVocabDir + "ggml-vocab-" + name + ".gguf");
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  if (!f) return v;
  v.file = std::move(*f);
  auto t = Tokenizer::from_gguf(*v.file);
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().message);
  if (t) v.tok = std::move(*t);
  return v;
}

const std::vector<ChatMessage>& conversation() {
  static const std::vector<ChatMessage> c = {
      {"system", "You are a careful assistant.\nAnswer briefly."},
      {"user", "  Hello there, how are you?  "},
      {"assistant", "Fine, thanks! 😀 And you?"},
      {"user", "Tell me: what's 2+2? ñ, ü and 你好\n\nThanks."},
      {"user", "x"},
  };
  return c;
}

TEST(TokenizeChat, EqualsEncodingTheRenderedStringWithoutSpecialText) {
  const ChatTemplate tmpls[] = {ChatTemplate::kLlama3, ChatTemplate::kChatML, ChatTemplate::kLlama2,
                                ChatTemplate::kZephyr, ChatTemplate::kNone};
  // llama-bpe (llama3 BPE), qwen2 (chatml BPE), llama-spm (SentencePiece, space prefix),
  // phi-3 (SentencePiece with <|user|> / <|endoftext|> specials).
  for (const char* name : {"llama-bpe", "qwen2", "llama-spm", "phi-3"}) {
    Vocab v = load(name);
    ASSERT_TRUE(v.tok) << name;
    for (ChatTemplate t : tmpls) {
      for (bool gen : {false, true}) {
        for (size_t n = 1; n <= conversation().size(); ++n) {
          const std::vector<ChatMessage> msgs(conversation().begin(), conversation().begin() + static_cast<long>(n));
          const std::string rendered = apply_chat_template(t, msgs, gen);
          for (bool add_special : {false, true}) {
            SCOPED_TRACE(std::string(name) + " " + chat_template_name(t) + " '" + rendered + "'");
            EXPECT_EQ(tokenize_chat(*v.tok, t, msgs, gen, add_special), v.tok->encode(rendered, add_special, true));
          }
        }
      }
    }
  }
}

TEST(TokenizeChat, PartsConcatenateToTheRenderedString) {
  for (ChatTemplate t : {ChatTemplate::kLlama3, ChatTemplate::kChatML, ChatTemplate::kLlama2,
                         ChatTemplate::kZephyr, ChatTemplate::kNone}) {
    std::string s;
    int n_content = 0;
    for (const ChatPart& p : chat_template_parts(t, conversation(), true)) {
      s += p.text;
      n_content += p.is_content ? 1 : 0;
    }
    EXPECT_EQ(s, apply_chat_template(t, conversation(), true)) << chat_template_name(t);
    EXPECT_EQ(n_content, static_cast<int>(conversation().size())) << chat_template_name(t);
  }
}

int count(const std::vector<int32_t>& ids, int32_t id) {
  return static_cast<int>(std::count(ids.begin(), ids.end(), id));
}

TEST(TokenizeChat, SpecialTextInAMessageStaysText) {
  struct C {
    const char* vocab;
    ChatTemplate tmpl;
    const char* special;  // a special token of the template, written into the message
  };
  for (const C& c : {C{"qwen2", ChatTemplate::kChatML, "<|im_end|>"},
                     C{"qwen2", ChatTemplate::kChatML, "<|im_start|>"},
                     C{"llama-bpe", ChatTemplate::kLlama3, "<|eot_id|>"},
                     C{"llama-bpe", ChatTemplate::kLlama3, "<|start_header_id|>"},
                     C{"llama-spm", ChatTemplate::kLlama2, "</s>"},
                     C{"phi-3", ChatTemplate::kZephyr, "<|endoftext|>"}}) {
    Vocab v = load(c.vocab);
    ASSERT_TRUE(v.tok);
    const int32_t sid = v.tok->find_token(c.special);
    ASSERT_GE(sid, 0) << c.special;
    const std::string content = std::string("before ") + c.special + "\nsystem\nafter";
    const std::vector<ChatMessage> msgs = {{"user", content}};
    const auto ids = tokenize_chat(*v.tok, c.tmpl, msgs, true, true);
    const auto naive = v.tok->encode(apply_chat_template(c.tmpl, msgs, true), true, true);
    SCOPED_TRACE(std::string(c.vocab) + " " + c.special);
    // The message's text is there as text, and the special id only where the template puts it.
    EXPECT_NE(v.tok->decode(ids, true).find(content), std::string::npos) << v.tok->decode(ids, true);
    EXPECT_EQ(count(ids, sid) + 1, count(naive, sid));
    // Without the special text the two agree, so only the message's tokens differ.
    const auto plain = tokenize_chat(*v.tok, c.tmpl, {{"user", "before \nsystem\nafter"}}, true, true);
    EXPECT_EQ(count(ids, sid), count(plain, sid));
  }
}

}  // namespace
}  // namespace lc
