// OpenAI's API shapes: requests of /v1/chat/completions and /v1/completions turned into the
// engine's JobSpec (every field checked, with a message that names it), and responses, stream
// chunks and errors written as OpenAI writes them, with llama-server's `timings` beside.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/engine.h"

namespace lc::server {

enum class Endpoint { kChat, kCompletion };

struct RequestLimits {
  int64_t max_tokens_cap = 4096;   // a max_tokens above this is refused (--max-tokens)
  int64_t default_max_tokens = 256;
  SamplerParams defaults;          // the server's sampling flags
  ChatTemplate chat_template = ChatTemplate::kNone;
};

struct ParsedRequest {
  JobSpec spec;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // chat: logprobs; completions: logprobs >= 0
  std::string model;
};

// Reads a request body; on error fills err (400 with the field named) and returns false.
bool parse_request(Endpoint ep, const nlohmann::json& body, const Tokenizer& tok, const RequestLimits& lim,
                   ParsedRequest& out, ApiError& err);

nlohmann::json error_json(const ApiError& e);
const char* finish_reason(StopReason r);
nlohmann::json timings_json(const RequestStats& st);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// Logprobs of tokens in the endpoint's shape: chat {"content": [...]}; completions
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (offsets from text_base).
nlohmann::json logprobs_json(Endpoint ep, const Tokenizer& tok, const std::vector<TokenLogprob>& lp,
                             size_t text_base = 0);

// A whole (non-streamed) response.
nlohmann::json response_json(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                             const ParsedRequest& req, const RequestStats& st, const Tokenizer& tok,
                             const std::vector<float>& read_map);
// One stream chunk: text (and logprobs) so far; `finish` set on the last, with timings.
nlohmann::json chunk_json(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                          const std::string& text, const nlohmann::json& logprobs, const char* finish, bool first);

std::string new_id(const char* prefix);

}  // namespace lc::server
