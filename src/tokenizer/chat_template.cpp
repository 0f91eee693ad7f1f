// Chat templates of the supported families, rendered the way llama.cpp's built-in
// llm_chat_apply_template renders them (no Jinja: the GGUF's template only picks the family).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lc {

namespace {

bool contains(const std::string& s, const char* needle) {
  return s.find(needle) != std::string::npos;
}

// llama.cpp's trim(): ASCII whitespace off both ends.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\v\f\r";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace

ChatTemplate detect_chat_template(const gguf::File& f, const Tokenizer& tok) {
  // Same precedence as llama.cpp's llm_chat_detect_template for these families.
  auto tmpl = f.get_string_or("tokenizer.chat_template", "");
  if (tmpl && !tmpl->empty()) {
    const std::string& t = *tmpl;
    if (contains(t, "<|im_start|>")) {
      // Phi-4 (<|im_sep|>) and SmolVLM look like ChatML but are not.
      if (contains(t, "<|im_sep|>") || contains(t, "<end_of_utterance>")) return ChatTemplate::kNone;
      return ChatTemplate::kChatML;
    }
    if (contains(t, "[INST]")) {
      // Mistral's templates also use [INST] but differ in spacing/system handling.
      if (contains(t, "[SYSTEM_PROMPT]") || contains(t, "[AVAILABLE_TOOLS]") ||
          contains(t, "' [INST] ' + system_message"))
        return ChatTemplate::kNone;
      return ChatTemplate::kLlama2;
    }
    // Phi-3 uses <|user|> too but ends turns with <|end|>: not Zephyr.
    if (contains(t, "<|user|>") && !contains(t, "<|end|>")) return ChatTemplate::kZephyr;
    if (contains(t, "<|start_header_id|>") && contains(t, "<|end_header_id|>"))
      return ChatTemplate::kLlama3;
    return ChatTemplate::kNone;
  }
  // No template stored: the families' own special tokens give them away.
  if (tok.find_token("<|start_header_id|>") >= 0) return ChatTemplate::kLlama3;
  if (tok.find_token("<|im_start|>") >= 0) return ChatTemplate::kChatML;
  return ChatTemplate::kNone;
}

Expected<ChatTemplate> chat_template_from_name(std::string_view name) {
  if (name == "none") return ChatTemplate::kNone;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama2") return ChatTemplate::kLlama2;
  if (name == "zephyr") return ChatTemplate::kZephyr;
  return make_error(fmt::format("unknown chat template '{}' (known: llama3, chatml, llama2, "
                                "zephyr, none)",
                                name));
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kLlama3: return "llama3";
    case ChatTemplate::kChatML: return "chatml";
    case ChatTemplate::kLlama2: return "llama2";
    case ChatTemplate::kZephyr: return "zephyr";
    case ChatTemplate::kNone: break;
  }
  return "none";
}

std::vector<ChatPart> chat_template_parts(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) {
  std::vector<ChatPart> parts;
  // Markup is appended to the last part when that is markup too; contents are parts of their own.
  const auto markup = [&parts](const std::string& m) {
    if (m.empty()) return;
    if (parts.empty() || parts.back().is_content)
      parts.push_back({m, false});
    else
      parts.back().text += m;
  };
  const auto content = [&parts](std::string c) {
    if (!c.empty()) parts.push_back({std::move(c), true});
  };
  switch (t) {
    case ChatTemplate::kLlama3:
      // <|begin_of_text|> is the BOS token the tokenizer adds.
      for (const auto& m : messages) {
        markup("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
        content(trim(m.content));
        markup("<|eot_id|>");
      }
      if (add_generation_prompt) markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    case ChatTemplate::kChatML:
      for (const auto& m : messages) {
        markup("<|im_start|>" + m.role + "\n");
        content(m.content);
        markup("<|im_end|>\n");
      }
      if (add_generation_prompt) markup("<|im_start|>assistant\n");
      break;
    case ChatTemplate::kLlama2: {
      // Llama-2 chat with <<SYS>> system prompts; <s> of the first turn is the tokenizer's BOS,
      // and every assistant turn ends with </s>. There is no generation prompt to add: the
      // model answers after [/INST].
      bool in_turn = true;
      markup("[INST] ");
      for (const auto& m : messages) {
        if (!in_turn) {
          in_turn = true;
          markup("[INST] ");
        }
        if (m.role == "system") {
          markup("<<SYS>>\n");
          content(m.content);
          markup("\n<</SYS>>\n\n");
        } else if (m.role == "user") {
          content(m.content);
          markup(" [/INST]");
        } else {
          content(m.content);
          markup("</s>");
          in_turn = false;
        }
      }
      break;
    }
    case ChatTemplate::kZephyr:
      for (const auto& m : messages) {
        markup("<|" + m.role + "|>\n");
        content(m.content);
        markup("<|endoftext|>\n");
      }
      if (add_generation_prompt) markup("<|assistant|>\n");
      break;
    case ChatTemplate::kNone:
      // No template: the plain concatenation of the contents.
      for (const auto& m : messages) content(m.content);
      break;
  }
  return parts;
}

std::string apply_chat_template(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  std::string s;
  for (const ChatPart& p : chat_template_parts(t, messages, add_generation_prompt)) s += p.text;
  return s;
}

std::vector<int32_t> tokenize_chat(const Tokenizer& tok, ChatTemplate t,
                                   const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt, bool add_special) {
  const std::vector<ChatPart> parts = chat_template_parts(t, messages, add_generation_prompt);
  std::vector<Tokenizer::TextPart> tp;
  tp.reserve(parts.size());
  for (const ChatPart& p : parts) tp.push_back({p.text, !p.is_content});
  return tok.encode_parts(tp, add_special);
}

}  // namespace lc
