// `smooth`: Smooth Reading (seeds/000, "Smooth Reading" for recurrent and windowed-attention
// models): multi-round incremental reading. Round i reads chunk i with the summary entries of
// the rounds before it in context and writes one new entry; the entries accumulate (MemAgent
// overwrites one memory instead). The answer comes from the problem and all entries.
// Built from the paper's description (its code was not available to us): an entry is capped at
// entry= tokens; when the entries pass summary= tokens the oldest are dropped, so every round
// fits the window and memory stays bounded; an entry that is empty or the word "none" is not
// kept. Pair it with --attn streaming or fixed, the windowed attention the paper reads with.
#include <fmt/format.h>

#include <cctype>
#include <deque>

#include "readers/readers_impl.h"

namespace lc::readers {
namespace {

class Smooth final : public Reader {
 public:
  Status parse(MethodSpec& s) {
    LC_TRY(s.get_int("chunk", &chunk_key_, 0, int64_t{1} << 30,
                     "tokens of document per round; 0: what the window leaves after the template, notes and entry"));
    LC_TRY(s.get_int("entry", &entry_, 1, int64_t{1} << 20, "cap on one round's summary entry (its reply), tokens"));
    LC_TRY(s.get_int("summary", &summary_key_, 0, int64_t{1} << 30,
                     "cap on all entries together, tokens (the oldest go first); 0: a quarter of the window"));
    LC_TRY(s.get_int("window", &window_key_, 0, int64_t{1} << 30,
                     "tokens one call may hold (prompt + reply); 0: the model's training context, at most 8192"));
    LC_TRY(s.get_int("answer", &answer_, 1, int64_t{1} << 20, "cap on the final answer's reply, tokens"));
    LC_TRY(s.get_int("calls", &calls_, 1, int64_t{1} << 40, "cap on model calls in one read"));
    return s.finish();
  }

  std::string spec() const override {
    return fmt::format("smooth:chunk={},entry={},summary={},window={},answer={},calls={}", chunk_ ? chunk_ : chunk_key_,
                       entry_, summary_ ? summary_ : summary_key_, window_ ? window_ : window_key_, answer_, calls_);
  }
  int64_t chunk_tokens() const override { return chunk_; }
  int64_t max_calls() const override { return calls_; }

  Status prepare(ReaderEnv& env, const std::string& question) override {
    LC_ASSIGN_OR_RETURN(read_, env.load("smooth_read", {"problem", "summary", "chunk"}));
    LC_ASSIGN_OR_RETURN(final_, env.load("smooth_final", {"problem", "summary"}));
    window_ = window_key_ > 0 ? window_key_ : env.model().default_window();
    summary_ = summary_key_ > 0 ? summary_key_ : window_ / 4;
    const int64_t base = env.model().prompt_tokens(
        render(read_, {{"problem", question}, {"summary", ""}, {"chunk", ""}}), read_.prefix);
    const int64_t room = window_ - base - summary_ - entry_;
    chunk_ = chunk_key_ > 0 ? chunk_key_ : room;
    if (chunk_ < 1 || chunk_ > room)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("smooth: a round does not fit the window of {} tokens: template and question {} + "
                                    "notes {} + chunk {} + entry {} (the question is too long, or chunk=/summary=/"
                                    "entry= too large)",
                                    window_, base, summary_, chunk_, entry_));
    const int64_t fbase =
        env.model().prompt_tokens(render(final_, {{"problem", question}, {"summary", ""}}), final_.prefix);
    if (fbase + summary_ + answer_ > window_)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("smooth: the final round does not fit the window of {} tokens: template and "
                                    "question {} + notes {} + answer {}",
                                    window_, fbase, summary_, answer_));
    entries_.clear();
    tokens_.clear();
    return ok_status();
  }

  // The entries as the templates show them: "[chunk] text" lines in reading order.
  std::string summary_text() const {
    if (entries_.empty()) return "none yet";
    std::string s;
    for (const auto& [i, e] : entries_) s += fmt::format("{}[{}] {}", s.empty() ? "" : "\n", i + 1, e);
    return s;
  }

  Status read_chunk(ReaderEnv& env, const std::string& question, int64_t index, const std::string& chunk) override {
    LC_ASSIGN_OR_RETURN(std::string reply,
                        env.call(read_, {{"problem", question}, {"summary", summary_text()}, {"chunk", chunk}}, entry_,
                                 index));
    std::string e = trim(reply);
    std::string folded = e;
    for (auto& c : folded) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    while (!folded.empty() && folded.back() == '.') folded.pop_back();
    if (e.empty() || folded == "none") return ok_status();
    const std::string line = fmt::format("[{}] {}\n", index + 1, e);
    entries_.emplace_back(index, e);
    tokens_.push_back(env.count_tokens(line));
    int64_t total = 0;
    for (int64_t t : tokens_) total += t;
    while (total > summary_ && !entries_.empty()) {  // the oldest entries go first
      total -= tokens_.front();
      entries_.pop_front();
      tokens_.pop_front();
    }
    return ok_status();
  }

  Expected<ReadResult> finish(ReaderEnv& env, const std::string& question) override {
    ReadResult r;
    LC_ASSIGN_OR_RETURN(r.reply, env.call(final_, {{"problem", question}, {"summary", summary_text()}}, answer_, -1));
    r.answer = extract_boxed(r.reply);
    for (const auto& [i, e] : entries_) r.partials.push_back(e);
    return r;
  }

  // Each entry as "INDEX<tab>TOKENS<tab>TEXT" (TOKENS: its line's count, for the cap).
  std::vector<std::string> state() const override {
    std::vector<std::string> s;
    for (size_t k = 0; k < entries_.size(); ++k)
      s.push_back(fmt::format("{}\t{}\t{}", entries_[k].first, tokens_[k], entries_[k].second));
    return s;
  }
  Status restore(const std::vector<std::string>& s) override {
    entries_.clear();
    tokens_.clear();
    for (const auto& e : s) {
      const size_t t1 = e.find('\t');
      const size_t t2 = t1 == std::string::npos ? t1 : e.find('\t', t1 + 1);
      char *end1 = nullptr, *end2 = nullptr;
      const long long i = t2 == std::string::npos ? -1 : std::strtoll(e.c_str(), &end1, 10);
      const long long n = t2 == std::string::npos ? -1 : std::strtoll(e.c_str() + t1 + 1, &end2, 10);
      if (t2 == std::string::npos || end1 != e.c_str() + t1 || end2 != e.c_str() + t2 || i < 0 || n < 0)
        return make_error(ErrorCode::kBadFile, "smooth: a checkpoint's entry is not INDEX<tab>TOKENS<tab>TEXT");
      entries_.emplace_back(i, e.substr(t2 + 1));
      tokens_.push_back(n);
    }
    return ok_status();
  }

 private:
  int64_t chunk_key_ = 0, entry_ = 64, summary_key_ = 0, window_key_ = 0, answer_ = 64, calls_ = kDefaultMaxCalls;
  int64_t chunk_ = 0, summary_ = 0, window_ = 0;
  Template read_, final_;
  std::deque<std::pair<int64_t, std::string>> entries_;
  std::deque<int64_t> tokens_;  // tokens of each entry's line
};

}  // namespace

Expected<std::unique_ptr<Reader>> make_smooth(MethodSpec& spec) {
  auto r = std::make_unique<Smooth>();
  LC_TRY(r->parse(spec));
  return std::unique_ptr<Reader>(std::move(r));
}

}  // namespace lc::readers
