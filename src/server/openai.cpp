#include "server/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace lc::server {

using nlohmann::json;

namespace {

// Typed field readers: absent or null leaves the value as it is; a wrong type or range is
// an error naming the field.
struct Reader {
  const json& body;
  ApiError& err;
  bool ok = true;

  bool fail(std::string msg) {
    if (ok) err = {400, std::move(msg)};
    ok = false;
    return false;
  }
  const json* get(const char* key) const {
    auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  }
  template <class T>
  bool number(const char* key, T& out, double lo, double hi) {
    const json* v = get(key);
    if (!v) return true;
    if (!v->is_number()) return fail(fmt::format("'{}' must be a number", key));
    const double d = v->get<double>();
    if (!(d >= lo && d <= hi)) return fail(fmt::format("'{}' is {}; it must be in [{}, {}]", key, v->dump(), lo, hi));
    if constexpr (std::is_integral_v<T>) {
      if (!v->is_number_integer()) return fail(fmt::format("'{}' must be an integer", key));
      out = static_cast<T>(v->get<int64_t>());
    } else {
      out = static_cast<T>(d);
    }
    return true;
  }
  bool boolean(const char* key, bool& out) {
    const json* v = get(key);
    if (!v) return true;
    if (!v->is_boolean()) return fail(fmt::format("'{}' must be true or false", key));
    out = v->get<bool>();
    return true;
  }
  bool string(const char* key, std::string& out) {
    const json* v = get(key);
    if (!v) return true;
    if (!v->is_string()) return fail(fmt::format("'{}' must be a string", key));
    out = v->get<std::string>();
    return true;
  }
};

// Message content: a string, or an array of {"type": "text", "text": ...} parts.
bool content_text(const json& c, std::string& out, std::string& why) {
  if (c.is_null()) return true;
  if (c.is_string()) {
    out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) {
    why = "a message's content must be a string or an array of text parts";
    return false;
  }
  for (const json& p : c) {
    if (!p.is_object() || p.value("type", "") != "text" || !p.contains("text") || !p["text"].is_string()) {
      why = "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported";
      return false;
    }
    out += p["text"].get<std::string>();
  }
  return true;
}

// logit_bias: OpenAI's object {"TOKEN_ID": BIAS, ...} or llama.cpp's array [[TOKEN_ID, BIAS], ...];
// BIAS a number in [-100, 100], or false to ban the token (llama.cpp). Entries replace the
// server's defaults (--logit-bias) for the same token and add to them for others.
bool parse_logit_bias(Reader& r, const json& v, int32_t n_vocab, SamplerParams& sp) {
  std::vector<std::pair<int32_t, float>> mine;
  auto add = [&](int64_t id, const json& b) {
    if (id < 0 || id >= n_vocab)
      return r.fail(fmt::format("'logit_bias': token id {} is not in the vocabulary (ids 0 to {})", id, n_vocab - 1));
    float bias = 0;
    if (b.is_boolean() && !b.get<bool>()) {
      bias = -std::numeric_limits<float>::infinity();
    } else if (b.is_number() && std::fabs(b.get<double>()) <= 100) {
      bias = b.get<float>();
    } else {
      return r.fail(fmt::format("'logit_bias' of token {}: {} is not a number in [-100, 100] (or false to ban it)", id,
                                b.dump()));
    }
    mine.emplace_back(static_cast<int32_t>(id), bias);
    return true;
  };
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& k = it.key();
      if (k.empty() || k.size() > 9 || k.find_first_not_of("0123456789") != std::string::npos)
        return r.fail(fmt::format("'logit_bias': key '{}' is not a token id", k));
      if (!add(std::stoll(k), it.value())) return false;
    }
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer())
        return r.fail("'logit_bias' as an array must hold [token id, bias] pairs");
      if (!add(e[0].get<int64_t>(), e[1])) return false;
    }
  } else {
    return r.fail("'logit_bias' must be an object of token id to bias (or an array of [token id, bias] pairs)");
  }
  std::erase_if(sp.logit_bias, [&](const auto& d) {
    return std::any_of(mine.begin(), mine.end(), [&](const auto& m) { return m.first == d.first; });
  });
  // The same id twice in one request: the last one counts.
  for (const auto& m : mine) {
    std::erase_if(sp.logit_bias, [&](const auto& d) { return d.first == m.first; });
    sp.logit_bias.push_back(m);
  }
  std::vector<bool> banned(static_cast<size_t>(n_vocab));
  int64_t n_banned = 0;
  for (const auto& [id, b] : sp.logit_bias)
    if (b == -std::numeric_limits<float>::infinity() && id < n_vocab && !banned[static_cast<size_t>(id)]) {
      banned[static_cast<size_t>(id)] = true;
      ++n_banned;
    }
  if (n_banned >= n_vocab) return r.fail("'logit_bias' bans every token of the vocabulary");
  return true;
}

}  // namespace

std::string new_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

bool parse_request(Endpoint ep, const json& body, const Tokenizer& tok, const RequestLimits& lim, ParsedRequest& out,
                   ApiError& err) {
  if (!body.is_object()) {
    err = {400, "the request body must be a JSON object"};
    return false;
  }
  Reader r{body, err};
  JobSpec& spec = out.spec;
  spec.sampling = lim.defaults;
  int64_t max_tokens = lim.default_max_tokens;
  r.string("model", out.model);
  r.number("max_tokens", max_tokens, 1, 1e12);
  if (ep == Endpoint::kChat) r.number("max_completion_tokens", max_tokens, 1, 1e12);
  if (r.ok && max_tokens > lim.max_tokens_cap)
    return r.fail(fmt::format("'max_tokens' is {}; this server allows at most {} (--max-tokens)", max_tokens,
                              lim.max_tokens_cap));
  spec.gen.n_predict = max_tokens;
  r.number("temperature", spec.sampling.temp, 0, 2);
  r.number("top_p", spec.sampling.top_p, 1e-9, 1);
  r.number("top_k", spec.sampling.top_k, 0, 1e9);
  r.number("min_p", spec.sampling.min_p, 0, 0.999999);
  r.number("presence_penalty", spec.sampling.presence_penalty, -2, 2);
  r.number("frequency_penalty", spec.sampling.frequency_penalty, -2, 2);
  r.number("repeat_penalty", spec.sampling.repeat_penalty, 1e-6, 100);
  int64_t seed = -1;
  r.number("seed", seed, -9.2e18, 9.2e18);
  if (seed >= 0) spec.sampling.seed = static_cast<uint64_t>(seed);
  int64_t n = 1;
  r.number("n", n, 1, 128);
  if (r.ok && n != 1) return r.fail("'n' must be 1: one choice per request");
  r.boolean("stream", out.stream);
  r.boolean("ignore_eos", spec.gen.ignore_eos);  // llama-server's extension
  if (const json* so = r.get("stream_options")) {
    if (!so->is_object()) return r.fail("'stream_options' must be an object");
    Reader sr{*so, err};
    sr.boolean("include_usage", out.include_usage);
    if (!sr.ok) return false;
  }
  // stop: a string or an array of strings.
  if (const json* s = r.get("stop")) {
    if (s->is_string()) {
      spec.gen.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const json& x : *s) {
        if (!x.is_string()) return r.fail("'stop' must be a string or an array of strings");
        spec.gen.stop.push_back(x.get<std::string>());
      }
    } else {
      return r.fail("'stop' must be a string or an array of strings");
    }
    if (spec.gen.stop.size() > 16) return r.fail("'stop' has more than 16 strings");
    for (const auto& x : spec.gen.stop)
      if (x.empty()) return r.fail("'stop' has an empty string");
  }
  // What is not supported is refused, never ignored.
  if (const json* lb = r.get("logit_bias"); lb && !parse_logit_bias(r, *lb, tok.n_vocab(), spec.sampling)) return false;
  for (const char* key : {"tools", "functions", "tool_choice", "function_call", "suffix"}) {
    const json* v = r.get(key);
    if (v && !(v->is_array() && v->empty()) && !(v->is_object() && v->empty()) && !(v->is_string() && *v == "none"))
      return r.fail(fmt::format("'{}' is not supported by this server", key));
  }
  if (const json* rf = r.get("response_format"))
    if (!rf->is_object() || rf->value("type", "text") != "text")
      return r.fail("'response_format' other than {\"type\": \"text\"} is not supported by this server");
  if (const json* e = r.get("echo"); e && !(e->is_boolean() && !e->get<bool>()))
    return r.fail("'echo' is not supported by this server");
  if (const json* b = r.get("best_of"); b && !(b->is_number_integer() && b->get<int64_t>() == 1))
    return r.fail("'best_of' must be 1");
  if (ep == Endpoint::kChat) {
    r.boolean("logprobs", out.logprobs);
    int top = 0;
    r.number("top_logprobs", top, 0, 20);
    if (r.ok && r.get("top_logprobs") && !out.logprobs) return r.fail("'top_logprobs' needs 'logprobs': true");
    if (out.logprobs) spec.gen.n_probs = top;
  } else {
    int lp = -1;
    r.number("logprobs", lp, 0, 5);
    if (r.get("logprobs")) {
      out.logprobs = true;
      spec.gen.n_probs = lp;
    }
  }
  if (!r.ok) return false;
  // The long-context methods of this request.
  std::string question;
  if (const json* lc = r.get("longctx")) {
    if (!lc->is_object()) return r.fail("'longctx' must be an object");
    static const char* kKeys[] = {"rope", "attn", "kv_press", "reader", "qttt", "read_map", "question"};
    for (auto it = lc->begin(); it != lc->end(); ++it) {
      if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return it.key() == k; }) ==
          std::end(kKeys))
        return r.fail(fmt::format("longctx.{}: unknown key (rope, attn, kv_press, reader, qttt, read_map, question)",
                                  it.key()));
    }
    Reader lr{*lc, err};
    lr.string("rope", spec.methods.rope);
    lr.string("attn", spec.methods.attn);
    lr.string("kv_press", spec.methods.kv_press);
    lr.string("reader", spec.methods.reader);
    lr.string("qttt", spec.methods.qttt);
    lr.boolean("read_map", spec.methods.read_map);
    lr.string("question", question);
    if (!lr.ok) return false;
    if (!question.empty() && ep == Endpoint::kChat)
      return r.fail("longctx.question is for /v1/completions; in a chat the last user message is the question");
  }
  if (ep == Endpoint::kChat) {
    const json* msgs = r.get("messages");
    if (!msgs || !msgs->is_array() || msgs->empty()) return r.fail("'messages' must be a non-empty array");
    std::vector<ChatMessage> m;
    for (const json& x : *msgs) {
      if (!x.is_object() || !x.contains("role") || !x["role"].is_string())
        return r.fail("each message must be an object with a string 'role'");
      std::string role = x["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant")
        return r.fail(fmt::format("message role '{}' is not supported (system, developer, user, assistant)", role));
      std::string text, why;
      if (!content_text(x.contains("content") ? x["content"] : json(), text, why)) return r.fail(why);
      m.push_back({role, text});
    }
    if (!spec.methods.reader.empty()) {
      // The last user message is the question; the messages before it are the document.
      size_t last = m.size();
      while (last > 0 && m[last - 1].role != "user") --last;
      if (last == 0) return r.fail("longctx.reader needs a user message (the question)");
      spec.question = m[last - 1].content;
      for (size_t i = 0; i + 1 < last; ++i) spec.document += (spec.document.empty() ? "" : "\n\n") + m[i].content;
      return true;
    }
    spec.prompt = tokenize_chat(tok, lim.chat_template, m, true, true);
    // The document is everything before the last user message (query-agnostic presses, qTTT).
    if (m.size() > 1 && m.back().role == "user") {
      std::vector<ChatMessage> before(m.begin(), m.end() - 1);
      const auto head = tokenize_chat(tok, lim.chat_template, before, false, true);
      size_t c = 0;
      while (c < head.size() && c < spec.prompt.size() && head[c] == spec.prompt[c]) ++c;
      if (c > 0 && c < spec.prompt.size()) spec.n_context = static_cast<int64_t>(c);
    }
    return true;
  }
  // Completions: a string, an array of one string, or an array of token ids.
  const json* p = r.get("prompt");
  if (!p) return r.fail("'prompt' is required");
  std::string text;
  std::vector<int32_t> ids;
  if (p->is_string()) {
    text = p->get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    text = (*p)[0].get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
    for (const json& x : *p) {
      if (!x.is_number_integer()) return r.fail("'prompt' token ids must all be integers");
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= tok.n_vocab())
        return r.fail(fmt::format("'prompt' token id {} is outside the vocabulary [0, {})", id, tok.n_vocab()));
      ids.push_back(static_cast<int32_t>(id));
    }
  } else {
    return r.fail("'prompt' must be a string, an array of one string, or an array of token ids");
  }
  if (!spec.methods.reader.empty()) {
    if (question.empty()) return r.fail("longctx.reader on /v1/completions needs longctx.question");
    spec.document = ids.empty() ? text : tok.decode(ids);
    spec.question = question;
    return true;
  }
  if (ids.empty()) {
    spec.prompt = tok.encode(text + question, true, true);
    if (!question.empty()) {
      const auto head = tok.encode(text, true, true);
      size_t c = 0;
      while (c < head.size() && c < spec.prompt.size() && head[c] == spec.prompt[c]) ++c;
      spec.n_context = static_cast<int64_t>(c);
    }
  } else {
    spec.prompt = std::move(ids);
    if (!question.empty()) {
      spec.n_context = static_cast<int64_t>(spec.prompt.size());
      const auto q = tok.encode(question, false, true);
      spec.prompt.insert(spec.prompt.end(), q.begin(), q.end());
    }
  }
  return true;
}

json error_json(const ApiError& e) {
  return {{"error", {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", e.status}}}};
}

const char* finish_reason(StopReason r) {
  switch (r) {
    case StopReason::kEog:
    case StopReason::kStopString: return "stop";
    default: return "length";
  }
}

json timings_json(const RequestStats& st) {
  const double pms = st.t_prompt * 1e3, gms = st.t_gen * 1e3;
  return {{"cache_n", st.n_reused},
          {"prompt_n", st.n_prompt},
          {"prompt_ms", pms},
          {"prompt_per_token_ms", st.n_prompt ? pms / static_cast<double>(st.n_prompt) : 0.0},
          {"prompt_per_second", st.t_prompt > 0 ? static_cast<double>(st.n_prompt) / st.t_prompt : 0.0},
          {"predicted_n", st.n_gen},
          {"predicted_ms", gms},
          {"predicted_per_token_ms", st.n_gen ? gms / static_cast<double>(st.n_gen) : 0.0},
          {"predicted_per_second", st.t_gen > 0 ? static_cast<double>(st.n_gen) / st.t_gen : 0.0}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
// A piece as a JSON string: bytes that are part of a character (invalid UTF-8 alone) are replaced.
std::string safe_piece(const Tokenizer& tok, int32_t id) {
  const std::string dumped = json(tok.token_to_piece(id)).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(dumped).get<std::string>();
}
}  // namespace

json logprobs_json(Endpoint ep, const Tokenizer& tok, const std::vector<TokenLogprob>& lp, size_t text_base) {
  if (ep == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprob& t : lp) {
      json top = json::array();
      for (const auto& [id, l] : t.top)
        top.push_back({{"token", safe_piece(tok, id)}, {"logprob", l}, {"bytes", bytes_of(tok.token_to_piece(id))}});
      content.push_back({{"token", safe_piece(tok, t.id)},
                         {"logprob", t.logprob},
                         {"bytes", bytes_of(tok.token_to_piece(t.id))},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_lp = json::array(), top = json::array(), offs = json::array();
  size_t off = text_base;
  for (const TokenLogprob& t : lp) {
    tokens.push_back(safe_piece(tok, t.id));
    token_lp.push_back(t.logprob);
    json m = json::object();
    for (const auto& [id, l] : t.top) m[safe_piece(tok, id)] = l;
    top.push_back(m);
    offs.push_back(off);
    off += tok.token_to_piece(t.id).size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lp}, {"top_logprobs", top}, {"text_offset", offs}};
}

json response_json(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                   const ParsedRequest& req, const RequestStats& st, const Tokenizer& tok,
                   const std::vector<float>& read_map) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason(st.stop)}};
  json lp = req.logprobs ? logprobs_json(ep, tok, st.logprobs) : json(nullptr);
  if (ep == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", st.text}};
  } else {
    choice["text"] = st.text;
  }
  choice["logprobs"] = lp;
  const int64_t n_prompt_all = static_cast<int64_t>(req.spec.prompt.size());
  json out = {{"id", id},
              {"object", ep == Endpoint::kChat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})},
              {"usage", usage_json(req.spec.methods.reader.empty() ? n_prompt_all : st.n_prompt, st.n_gen)},
              {"timings", timings_json(st)}};
  if (!read_map.empty()) out["longctx"] = {{"read_map", read_map}};
  return out;
}

json chunk_json(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                const std::string& text, const json& logprobs, const char* finish, bool first) {
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
  if (ep == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (!finish && !first)) delta["content"] = text;
    if (first && text.empty() && !finish) delta["content"] = "";
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

}  // namespace lc::server
