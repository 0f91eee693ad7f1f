// `sculptor`: Sculptor's active context management (seeds/000, "Sculptor: Empowering LLMs with
// Cognitive Agency via Active Context Management"). The model works in one conversation (its
// working memory) and calls tools on the document: the context fragmentation (the document
// cut into fragments of F tokens, numbered), read, summarize, hide and restore a fragment,
// and precise search (exact text or a regular expression over the whole document, each match
// returned with its neighbourhood and fragment number). Hide and restore act on the KV cache:
// a hidden fragment's rows leave the cache, kept, and come back at their positions
// (Conversation::hide/restore over Context::hide/restore); nothing is recomputed.
//
// Built from the paper's description (its code was not available to us); the tool names and
// the protocol are ours. The protocol is JSON in <tool_call> tags for a model with a chat
// template (results in <tool_response> tags), and one "TOOL ARGUMENT" line for a model without
// one (results after "Result:"); protocol= chooses. A reply without a tool call is the answer
// (read from \boxed{} when it has one). A malformed or unknown call gets an error result the
// model sees; more than retries= in a row end the read with an error. The working memory is
// kept inside the window: before a result would overflow it, the oldest fragments read are
// hidden (logged as "auto-hide"), then the result is cut.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <regex>

#include "readers/readers_impl.h"

namespace lc::readers {
namespace {

using nlohmann::json;

struct ToolCall {
  std::string name;
  json args;
};

class Sculptor final : public Reader {
 public:
  Status parse(MethodSpec& s) {
    LC_TRY(s.get_int("fragment", &fragment_, 16, int64_t{1} << 24, "tokens per fragment of the document"));
    LC_TRY(s.get_int("window", &window_key_, 0, int64_t{1} << 30,
                     "tokens the working memory may hold; 0: the model's training context, at most 8192"));
    LC_TRY(s.get_int("reply", &reply_, 1, int64_t{1} << 20, "cap on one reply of the model, tokens"));
    LC_TRY(s.get_int("turns", &turns_, 1, int64_t{1} << 20, "cap on the model's replies in the conversation"));
    LC_TRY(s.get_int("matches", &matches_, 1, 1000, "search: matches shown at most"));
    LC_TRY(s.get_int("around", &around_, 0, 1 << 20, "search: characters of neighbourhood either side of a match"));
    LC_TRY(s.get_int("retries", &retries_, 0, 100, "malformed or failed tool calls in a row before the read fails"));
    LC_TRY(s.get_string("protocol", &protocol_,
                        "tool-call protocol: json (<tool_call> tags), text (TOOL ARGUMENT lines), or auto (json "
                        "with a chat template, else text)"));
    LC_TRY(s.get_int("calls", &calls_, 1, int64_t{1} << 40, "cap on model calls in one read"));
    if (protocol_ != "auto" && protocol_ != "json" && protocol_ != "text")
      return make_error(fmt::format("reader 'sculptor': key 'protocol' expects json, text or auto, got '{}'", protocol_));
    return s.finish();
  }

  std::string spec() const override {
    return fmt::format("sculptor:fragment={},window={},reply={},turns={},matches={},around={},retries={},protocol={},"
                       "calls={}",
                       fragment_, window_ ? window_ : window_key_, reply_, turns_, matches_, around_, retries_,
                       protocol_, calls_);
  }
  int64_t chunk_tokens() const override { return fragment_; }
  int64_t max_calls() const override { return calls_; }

  Status prepare(ReaderEnv& env, const std::string& question) override {
    LC_ASSIGN_OR_RETURN(json_tpl_, env.load("sculptor_json", {"problem", "fragments", "fragment_tokens"}));
    LC_ASSIGN_OR_RETURN(text_tpl_, env.load("sculptor_text", {"problem", "fragments", "fragment_tokens"}));
    LC_ASSIGN_OR_RETURN(summ_tpl_, env.load("sculptor_summarize", {"problem", "chunk"}));
    window_ = window_key_ > 0 ? window_key_ : env.model().default_window();
    const int64_t base = env.model().prompt_tokens(
        render(text_tpl_, {{"problem", question}, {"fragments", "1000000"}, {"fragment_tokens", "1000"}}), "");
    if (base + reply_ + 16 > window_)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("sculptor: the instructions and question ({} tokens) + a reply ({}) do not fit "
                                    "the window of {} tokens",
                                    base, reply_, window_));
    starts_.clear();
    bytes_ = 0;
    return ok_status();
  }

  // The fragmentation pass: fragment i is chunk i; its byte range in the document is kept.
  Status read_chunk(ReaderEnv&, const std::string&, int64_t index, const std::string& chunk) override {
    if (index != static_cast<int64_t>(starts_.size())) return make_error("sculptor: fragments out of order");
    starts_.push_back(bytes_);
    bytes_ += static_cast<int64_t>(chunk.size());
    return ok_status();
  }

  Expected<ReadResult> finish(ReaderEnv& env, const std::string& question) override {
    LC_ASSIGN_OR_RETURN(std::unique_ptr<Conversation> conv, env.model().converse());
    const bool json_mode = protocol_ == "json" || (protocol_ == "auto" && conv->chat());
    const Template& intro = json_mode ? json_tpl_ : text_tpl_;
    const std::vector<std::string> stop = {json_mode ? "</tool_call>" : "\n"};
    CallCost cost;
    {
      auto first = conv->add("user",
                             render(intro, {{"problem", question},
                                            {"fragments", std::to_string(starts_.size())},
                                            {"fragment_tokens", std::to_string(fragment_)}}),
                             cost);
      if (!first) return first.error();
    }
    env.stats().prompt_tokens += cost.n_prompt;
    std::map<int64_t, int64_t> shown;  // fragment -> the message showing it (read)
    std::vector<int64_t> shown_order;  // fragments in the order read (for auto-hide)
    int64_t errors = 0;
    std::string last_error;
    for (int64_t turn = 0; turn < turns_; ++turn) {
      LC_TRY(env.budget());
      CallRecord rec;
      rec.step = "sculptor_turn";
      LC_ASSIGN_OR_RETURN(auto reply, conv->reply(reply_, stop, rec.cost));
      rec.reply = reply.second;
      LC_TRY(env.record(rec, true));
      auto call = parse_call(reply.second, json_mode);
      std::string result;
      bool failed = false;
      if (!call) {
        failed = true;
        result = "error: " + call.error().message;
      } else if (call->name.empty()) {
        ReadResult r;
        r.reply = reply.second;
        r.answer = extract_boxed(reply.second);
        return r;
      } else {
        auto out = run_tool(env, *conv, question, *call, shown, shown_order);
        if (!out) {
          failed = true;
          result = "error: " + out.error().message;
        } else {
          result = std::move(*out);
        }
      }
      if (failed) {
        last_error = result;
        if (++errors > retries_)
          return make_error(fmt::format("sculptor: the model's tool calls failed {} times in a row; the last: {}",
                                        errors, result));
      } else {
        errors = 0;
      }
      CallRecord tr;
      tr.step = call && !call->name.empty() ? "tool:" + call->name : "tool:error";
      tr.reply = result;
      // Room for the result and the next reply: hide the oldest fragments read, then cut.
      std::string content = sculptor_result_message(result, json_mode, reply.second);
      int64_t need = env.count_tokens(content) + reply_ + 8;
      // (Never the fragment this turn restored: the model's own choice stands.)
      const int64_t keep = call && call->name == "restore" ? call->args.value("fragment", int64_t{-1}) : -1;
      for (size_t k = 0; k < shown_order.size() && conv->tokens_held() + need > window_;) {
        const int64_t f = shown_order[k];
        if (f == keep) {
          ++k;
          continue;
        }
        shown_order.erase(shown_order.begin() + static_cast<std::ptrdiff_t>(k));
        if (conv->hidden(shown[f])) continue;
        LC_TRY(conv->hide(shown[f]));
        LC_TRY(env.record({"auto-hide", f, fmt::format("fragment {} hidden to make room", f), {}}, false));
      }
      const int64_t room = window_ - conv->tokens_held() - reply_ - 8;
      if (need - reply_ - 8 > room)
        content = sculptor_result_message(cut_to(env, result, room - 16) + " ...(cut)", json_mode, reply.second);
      CallCost c2;
      LC_ASSIGN_OR_RETURN(int64_t id, conv->add("user", content, c2));
      env.stats().prompt_tokens += c2.n_prompt;
      tr.cost = c2;
      LC_TRY(env.record(tr, false));
      if (call && call->name == "read" && result.rfind("error", 0) != 0) {
        const int64_t f = call->args.at("fragment").get<int64_t>();
        shown[f] = id;
        shown_order.push_back(f);
      }
    }
    return make_error(fmt::format("sculptor: no answer after {} turns (turns=){}", turns_,
                                  last_error.empty() ? "" : "; the last tool error: " + last_error));
  }

  // Fragment byte starts as strings.
  std::vector<std::string> state() const override {
    std::vector<std::string> s;
    for (int64_t b : starts_) s.push_back(std::to_string(b));
    s.push_back("end " + std::to_string(bytes_));
    return s;
  }
  Status restore(const std::vector<std::string>& s) override {
    starts_.clear();
    if (s.empty() || s.back().rfind("end ", 0) != 0) return make_error(ErrorCode::kBadFile, "sculptor: bad checkpoint state");
    try {
      for (size_t i = 0; i + 1 < s.size(); ++i) starts_.push_back(std::stoll(s[i]));
      bytes_ = std::stoll(s.back().substr(4));
    } catch (const std::exception&) {
      return make_error(ErrorCode::kBadFile, "sculptor: bad checkpoint state");
    }
    return ok_status();
  }

 private:

  std::string cut_to(ReaderEnv& env, const std::string& s, int64_t tokens) const {
    if (tokens <= 0) return "";
    const auto ids = env.model().tokenizer().encode(s, false, false);
    if (static_cast<int64_t>(ids.size()) <= tokens) return s;
    std::string out;
    for (int64_t i = 0; i < tokens; ++i) out += env.model().tokenizer().token_to_piece(ids[static_cast<size_t>(i)]);
    return out;
  }

  // A tool call in a reply; name empty when the reply calls no tool (the answer).
  static Expected<ToolCall> parse_call(const std::string& reply, bool json_mode) {
    static const char* kTools[] = {"search", "read", "summarize", "hide", "restore"};
    ToolCall c;
    if (json_mode) {
      const size_t at = reply.find("<tool_call>");
      if (at == std::string::npos) return c;
      size_t end = reply.find("</tool_call>", at);
      const std::string body = reply.substr(at + 11, end == std::string::npos ? std::string::npos : end - at - 11);
      json j = json::parse(body, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string())
        return make_error(fmt::format("a tool call is JSON {{\"name\": ..., \"arguments\": {{...}}}}, got '{}'",
                                      body.substr(0, 200)));
      c.name = j["name"].get<std::string>();
      c.args = j.value("arguments", json::object());
      if (!c.args.is_object()) return make_error("a tool call's \"arguments\" must be an object");
    } else {
      // The first non-empty line: "TOOL ARGUMENT"; a line that starts with no tool's name is
      // the answer.
      std::string line;
      for (size_t p = 0; p < reply.size();) {
        size_t e = reply.find('\n', p);
        line = trim(reply.substr(p, e == std::string::npos ? std::string::npos : e - p));
        if (!line.empty() || e == std::string::npos) break;
        p = e + 1;
      }
      const size_t sp = line.find(' ');
      const std::string word = line.substr(0, sp);
      bool tool = false;
      for (const char* t : kTools) tool = tool || word == t;
      if (!tool) return c;
      c.name = word;
      const std::string arg = sp == std::string::npos ? "" : trim(line.substr(sp + 1));
      if (word == "search") {
        c.args = {{"query", arg}, {"regex", false}};
      } else {
        char* endp = nullptr;
        const long long n = std::strtoll(arg.c_str(), &endp, 10);
        if (arg.empty() || *endp != '\0') return make_error(fmt::format("{} takes a fragment number, got '{}'", word, arg));
        c.args = {{"fragment", n}};
      }
    }
    bool known = false;
    for (const char* t : kTools) known = known || c.name == t;
    if (!known) return make_error(fmt::format("unknown tool '{}' (search, read, summarize, hide, restore)", c.name));
    return c;
  }

  Expected<int64_t> fragment_arg(const ToolCall& c) const {
    if (!c.args.contains("fragment") || !c.args["fragment"].is_number_integer())
      return make_error(fmt::format("{} needs {{\"fragment\": N}}", c.name));
    const int64_t f = c.args["fragment"].get<int64_t>();
    if (f < 0 || f >= static_cast<int64_t>(starts_.size()))
      return make_error(fmt::format("no fragment {} (there are {}, numbered from 0)", f, starts_.size()));
    return f;
  }

  int64_t fragment_of(int64_t byte) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), byte);
    return static_cast<int64_t>(it - starts_.begin()) - 1;
  }

  Expected<std::string> read_bytes(const std::string& path, int64_t from, int64_t n) const {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error(ErrorCode::kIo, fmt::format("{}: cannot open the document again", path));
    in.seekg(from);
    std::string s(static_cast<size_t>(std::max<int64_t>(n, 0)), '\0');
    in.read(s.data(), n);
    s.resize(static_cast<size_t>(in.gcount()));
    return s;
  }

  Expected<std::string> run_tool(ReaderEnv& env, Conversation& conv, const std::string& question, const ToolCall& c,
                                 std::map<int64_t, int64_t>& shown, std::vector<int64_t>& shown_order) {
    if (c.name == "search") return search(env, c);
    LC_ASSIGN_OR_RETURN(int64_t f, fragment_arg(c));
    const int64_t end = f + 1 < static_cast<int64_t>(starts_.size()) ? starts_[static_cast<size_t>(f + 1)] : bytes_;
    if (c.name == "read") {
      if (shown.count(f) && !conv.hidden(shown[f])) return make_error(fmt::format("fragment {} is shown already", f));
      LC_ASSIGN_OR_RETURN(std::string text, read_bytes(env.document(), starts_[static_cast<size_t>(f)],
                                                       end - starts_[static_cast<size_t>(f)]));
      return fmt::format("[fragment {}] {}", f, text);
    }
    if (c.name == "summarize") {
      LC_ASSIGN_OR_RETURN(std::string text, read_bytes(env.document(), starts_[static_cast<size_t>(f)],
                                                       end - starts_[static_cast<size_t>(f)]));
      LC_ASSIGN_OR_RETURN(std::string s, env.call(summ_tpl_, {{"problem", question}, {"chunk", text}}, reply_, f));
      return fmt::format("[summary of fragment {}] {}", f, trim(s));
    }
    if (!shown.count(f)) return make_error(fmt::format("fragment {} was never read", f));
    if (c.name == "hide") {
      LC_TRY(conv.hide(shown[f]));
      shown_order.erase(std::remove(shown_order.begin(), shown_order.end(), f), shown_order.end());
      return fmt::format("fragment {} hidden", f);
    }
    LC_TRY(conv.restore(shown[f]));  // restore
    shown_order.push_back(f);
    return fmt::format("fragment {} restored", f);
  }

  // Exact or regular-expression search over the document, streamed in blocks that overlap so
  // that a match across a block boundary is found once.
  Expected<std::string> search(ReaderEnv& env, const ToolCall& c) const {
    if (!c.args.contains("query") || !c.args["query"].is_string() || c.args["query"].get<std::string>().empty())
      return make_error("search needs {\"query\": TEXT}");
    const std::string q = c.args["query"].get<std::string>();
    const bool use_regex = c.args.value("regex", false);
    std::regex re;
    if (use_regex) {
      try {
        re = std::regex(q, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return make_error(fmt::format("bad regular expression '{}': {}", q, e.what()));
      }
    }
    std::ifstream in(env.document(), std::ios::binary);
    if (!in) return make_error(ErrorCode::kIo, fmt::format("{}: cannot open the document again", env.document()));
    const int64_t block = 1 << 20, keep = std::max<int64_t>(static_cast<int64_t>(q.size()) + 2 * around_, 4096);
    std::string buf;
    int64_t buf_at = 0;  // document offset of buf[0]
    int64_t searched_to = 0;  // matches starting before this offset were taken already
    std::vector<std::pair<int64_t, std::string>> found;  // offset, text shown
    int64_t total = 0;
    std::string chunk(static_cast<size_t>(block), '\0');
    for (bool eof = false; !eof;) {
      in.read(chunk.data(), block);
      const auto got = in.gcount();
      eof = got < block;
      buf.append(chunk.data(), static_cast<size_t>(got));
      // Matches must start in the part of buf that the next block cannot change.
      const int64_t safe_end = eof ? buf_at + static_cast<int64_t>(buf.size())
                                   : buf_at + static_cast<int64_t>(buf.size()) - keep;
      auto take = [&](int64_t at, int64_t len) {
        if (at < searched_to || at >= safe_end) return;
        ++total;
        if (static_cast<int64_t>(found.size()) >= matches_) return;
        const int64_t lo = std::max(buf_at, at - around_);
        const int64_t hi = std::min(buf_at + static_cast<int64_t>(buf.size()), at + len + around_);
        std::string t = buf.substr(static_cast<size_t>(lo - buf_at), static_cast<size_t>(hi - lo));
        for (auto& ch : t)
          if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
        found.emplace_back(at, t);
      };
      if (use_regex) {
        for (auto it = std::sregex_iterator(buf.begin(), buf.end(), re); it != std::sregex_iterator(); ++it)
          if (it->length() > 0) take(buf_at + it->position(), it->length());
      } else {
        for (size_t p = buf.find(q); p != std::string::npos; p = buf.find(q, p + 1))
          take(buf_at + static_cast<int64_t>(p), static_cast<int64_t>(q.size()));
      }
      searched_to = std::max(searched_to, safe_end);
      if (!eof && static_cast<int64_t>(buf.size()) > keep) {
        const int64_t drop = static_cast<int64_t>(buf.size()) - keep;
        buf.erase(0, static_cast<size_t>(drop));
        buf_at += drop;
      }
    }
    std::vector<std::pair<int64_t, std::string>> shown;
    for (auto& [at, t] : found) shown.emplace_back(fragment_of(at), std::move(t));
    return sculptor_search_result(q, total, shown);
  }

  int64_t fragment_ = 512, window_key_ = 0, reply_ = 64, turns_ = 8, matches_ = 3, around_ = 120, retries_ = 2;
  int64_t calls_ = 64;
  std::string protocol_ = "auto";
  int64_t window_ = 0, bytes_ = 0;
  std::vector<int64_t> starts_;  // byte offset of each fragment
  Template json_tpl_, text_tpl_, summ_tpl_;
};

}  // namespace

std::string sculptor_search_result(const std::string& query, int64_t total,
                                   const std::vector<std::pair<int64_t, std::string>>& shown) {
  if (total == 0) return fmt::format("no match for '{}'", query);
  std::string out = fmt::format("{} match{} for '{}'{}", total, total == 1 ? "" : "es", query,
                                total > static_cast<int64_t>(shown.size())
                                    ? fmt::format(" (the first {} shown)", shown.size())
                                    : "");
  for (const auto& [f, t] : shown) out += fmt::format("\n[fragment {}] ...{}...", f, t);
  return out;
}

std::string sculptor_result_message(const std::string& result, bool json_mode, const std::string& after) {
  if (json_mode) return "<tool_response>\n" + result + "\n</tool_response>";
  return (after.empty() || after.back() == '\n' ? "" : "\n") + std::string("Result: ") + result + "\n";
}

Expected<std::unique_ptr<Reader>> make_sculptor(MethodSpec& spec) {
  auto r = std::make_unique<Sculptor>();
  LC_TRY(r->parse(spec));
  return std::unique_ptr<Reader>(std::move(r));
}

}  // namespace lc::readers
