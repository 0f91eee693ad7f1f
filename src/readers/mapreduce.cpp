// `mapreduce`: multi-agent chunk reading (seeds/002, which separates task noise, model noise
// and aggregator noise; the workers-then-manager shape of Chain-of-Agents, Zhang et al.,
// NeurIPS 2024, without the worker-to-worker message). Each chunk is answered on its own from
// (problem, chunk): a partial answer, or "none" when the chunk does not hold it. The partial
// answers are combined by agg=:
//   vote   the most frequent answer (compared trimmed, case-folded, without a final '.'); a tie
//          goes to the answer seen first;
//   first  the first chunk's answer, in document order;
//   model  one more call over the distinct answers, numbered in document order with how many
//          chunks gave each (mapreduce_reduce.txt), read from \boxed{}.
// The chunks are independent: batch= of them are answered together (ModelCaller::call_batch:
// contexts of their own whose replies are generated as rows of one batch; the same replies as
// one call after another at temperature 0), batch=1 calls them one after another.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "readers/readers_impl.h"

namespace lc::readers {
namespace {

std::string fold(std::string_view s) {
  std::string t = trim(s);
  while (!t.empty() && t.back() == '.') t.pop_back();
  for (auto& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

class MapReduce final : public Reader {
 public:
  Status parse(MethodSpec& s) {
    LC_TRY(s.get_int("chunk", &chunk_key_, 0, int64_t{1} << 30,
                     "tokens of document per call; 0: what the window leaves after the template, question and answer"));
    LC_TRY(s.get_int("window", &window_key_, 0, int64_t{1} << 30,
                     "tokens one call may hold (prompt + reply); 0: the model's training context, at most 8192"));
    LC_TRY(s.get_int("answer", &answer_, 1, int64_t{1} << 20, "cap on each partial answer's reply, tokens"));
    LC_TRY(s.get_string("agg", &agg_, "how partial answers combine: vote, first or model"));
    LC_TRY(s.get_string("none", &none_, "the reply that means a chunk has no answer (compared case-folded)"));
    LC_TRY(s.get_int("calls", &calls_, 1, int64_t{1} << 40, "cap on model calls in one read"));
    LC_TRY(s.get_int("batch", &batch_, 1, 256,
                     "chunks answered together, each in a context of its own, their replies generated as one "
                     "batch (1: one call after another)"));
    if (agg_ != "vote" && agg_ != "first" && agg_ != "model")
      return make_error(fmt::format("reader 'mapreduce': key 'agg' expects vote, first or model, got '{}'", agg_));
    if (trim(none_).empty()) return make_error("reader 'mapreduce': key 'none' must not be empty");
    return s.finish();
  }

  std::string spec() const override {
    return fmt::format("mapreduce:chunk={},window={},answer={},agg={},none={},calls={},batch={}",
                       chunk_ ? chunk_ : chunk_key_, window_ ? window_ : window_key_, answer_, agg_, none_, calls_,
                       batch_);
  }
  int64_t batch() const override { return batch_; }
  int64_t chunk_tokens() const override { return chunk_; }
  int64_t max_calls() const override { return calls_; }

  Status prepare(ReaderEnv& env, const std::string& question) override {
    LC_ASSIGN_OR_RETURN(map_, env.load("mapreduce_map", {"problem", "chunk"}));
    if (agg_ == "model") {
      LC_ASSIGN_OR_RETURN(reduce_, env.load("mapreduce_reduce", {"problem", "answers"}));
    }
    window_ = window_key_ > 0 ? window_key_ : env.model().default_window();
    const int64_t base =
        env.model().prompt_tokens(render(map_, {{"problem", question}, {"chunk", ""}}), map_.prefix);
    const int64_t room = window_ - base - answer_;
    chunk_ = chunk_key_ > 0 ? chunk_key_ : room;
    if (chunk_ < 1 || chunk_ > room)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("mapreduce: a call does not fit the window of {} tokens: template and question {} "
                                    "+ chunk {} + answer {} (the question is too long, or chunk=/answer= too large)",
                                    window_, base, chunk_, answer_));
    partials_.clear();
    return ok_status();
  }

  Status read_chunk(ReaderEnv& env, const std::string& question, int64_t index, const std::string& chunk) override {
    LC_ASSIGN_OR_RETURN(std::string reply, env.call(map_, {{"problem", question}, {"chunk", chunk}}, answer_, index));
    take(env, index, reply);
    return ok_status();
  }

  Status read_chunks(ReaderEnv& env, const std::string& question, int64_t first_index,
                     const std::vector<std::string>& chunks) override {
    std::vector<std::map<std::string, std::string>> values;
    for (const auto& c : chunks) values.push_back({{"problem", question}, {"chunk", c}});
    LC_ASSIGN_OR_RETURN(std::vector<std::string> replies, env.call_batch(map_, values, answer_, first_index));
    for (size_t i = 0; i < replies.size(); ++i) take(env, first_index + static_cast<int64_t>(i), replies[i]);
    return ok_status();
  }

  // A chunk's reply: its partial answer, unless it says the chunk has none.
  void take(ReaderEnv& env, int64_t index, const std::string& reply) {
    std::string a = trim(reply);
    if (const size_t nl = a.find('\n'); nl != std::string::npos) a = trim(a.substr(0, nl));
    if (a.empty() || fold(a).rfind(fold(none_), 0) == 0) return;
    partials_.emplace_back(index, a);
    ++env.stats().candidates;
  }

  Expected<ReadResult> finish(ReaderEnv& env, const std::string& question) override {
    ReadResult r;
    for (const auto& [i, a] : partials_) r.partials.push_back(a);
    if (partials_.empty()) {
      r.answer = none_;
      r.reply = "no chunk gave an answer";
      return r;
    }
    // Distinct answers in order of first appearance, with how many chunks gave each.
    std::vector<std::pair<std::string, int64_t>> distinct;
    for (const auto& [i, a] : partials_) {
      auto it = std::find_if(distinct.begin(), distinct.end(),
                             [&](const auto& d) { return fold(d.first) == fold(a); });
      if (it == distinct.end()) distinct.emplace_back(a, 1);
      else ++it->second;
    }
    if (agg_ == "first") {
      r.answer = r.reply = partials_.front().second;
    } else if (agg_ == "vote") {
      size_t best = 0;
      for (size_t k = 1; k < distinct.size(); ++k)
        if (distinct[k].second > distinct[best].second) best = k;
      r.answer = r.reply = distinct[best].first;
    } else {
      std::string list;
      for (size_t k = 0; k < distinct.size(); ++k)
        list += fmt::format("{}{}. {} ({} section{})", k ? "\n" : "", k + 1, distinct[k].first, distinct[k].second,
                            distinct[k].second == 1 ? "" : "s");
      LC_ASSIGN_OR_RETURN(r.reply, env.call(reduce_, {{"problem", question}, {"answers", list}}, answer_, -1));
      r.answer = extract_boxed(r.reply);
    }
    return r;
  }

  std::vector<std::string> state() const override {
    std::vector<std::string> s;
    for (const auto& [i, a] : partials_) s.push_back(fmt::format("{}\t{}", i, a));
    return s;
  }
  Status restore(const std::vector<std::string>& s) override {
    partials_.clear();
    for (const auto& e : s) {
      const size_t tab = e.find('\t');
      char* end = nullptr;
      const long long i = tab == std::string::npos ? -1 : std::strtoll(e.c_str(), &end, 10);
      if (tab == std::string::npos || end != e.c_str() + tab || i < 0)
        return make_error(ErrorCode::kBadFile, "mapreduce: a checkpoint's partial answer is not INDEX<tab>ANSWER");
      partials_.emplace_back(i, e.substr(tab + 1));
    }
    return ok_status();
  }

 private:
  int64_t chunk_key_ = 0, window_key_ = 0, answer_ = 32, calls_ = kDefaultMaxCalls, batch_ = 8;
  std::string agg_ = "vote", none_ = "none";
  int64_t chunk_ = 0, window_ = 0;
  Template map_, reduce_;
  std::vector<std::pair<int64_t, std::string>> partials_;
};

}  // namespace

Expected<std::unique_ptr<Reader>> make_mapreduce(MethodSpec& spec) {
  auto r = std::make_unique<MapReduce>();
  LC_TRY(r->parse(spec));
  return std::unique_ptr<Reader>(std::move(r));
}

}  // namespace lc::readers
