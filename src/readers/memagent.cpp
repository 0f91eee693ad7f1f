// `memagent`: MemAgent (Yu et al. 2025, arXiv 2507.02259; seeds/002). The document is read in
// chunks of C tokens; at each chunk the model rewrites a memory of at most M tokens from
// (problem, memory, chunk), the reply replacing the memory whole. The memory starts as "No
// previous memory". The answer comes from (problem, memory), read from \boxed{} when the reply
// has one. As in the reference code (taskutils/memory_eval, utils/recurrent.py) the chunks are
// cut from the document's tokens and decoded, and the memory is bounded by the reply's token cap.
//
// Defaults keep the paper's proportions, C = 5,000 and M = 1,024 tokens of an 8K window, fitted
// to the window (the model's training context up to 8K): 625 and 128 for a 1K model. When the
// template and the question leave less room than that, the automatic chunk shrinks to what is
// left; an explicit chunk= that does not fit is an error.
#include <fmt/format.h>

#include "readers/readers_impl.h"

namespace lc::readers {
namespace {

constexpr const char* kNoMemory = "No previous memory";

class MemAgent final : public Reader {
 public:
  Status parse(MethodSpec& s) {
    LC_TRY(s.get_int("chunk", &chunk_key_, 0, int64_t{1} << 30,
                     "tokens of document per step; 0: 5000/8192 of the window, shrunk to what the template leaves"));
    LC_TRY(s.get_int("memory", &memory_key_, 0, int64_t{1} << 30,
                     "cap on the memory (the update's reply), tokens; 0: 1024/8192 of the window"));
    LC_TRY(s.get_int("window", &window_key_, 0, int64_t{1} << 30,
                     "tokens one call may hold (prompt + reply); 0: the model's training context, at most 8192"));
    LC_TRY(s.get_int("answer", &answer_, 1, int64_t{1} << 20, "cap on the final answer's reply, tokens"));
    LC_TRY(s.get_int("calls", &calls_, 1, int64_t{1} << 40, "cap on model calls in one read"));
    return s.finish();
  }

  std::string spec() const override {
    return fmt::format("memagent:chunk={},memory={},window={},answer={},calls={}", fit_.chunk ? fit_.chunk : chunk_key_,
                       fit_.memory ? fit_.memory : memory_key_, fit_.window ? fit_.window : window_key_, answer_, calls_);
  }
  int64_t chunk_tokens() const override { return fit_.chunk; }
  int64_t max_calls() const override { return calls_; }

  Status prepare(ReaderEnv& env, const std::string& question) override {
    LC_ASSIGN_OR_RETURN(update_, env.load("memagent_update", {"problem", "memory", "chunk"}));
    LC_ASSIGN_OR_RETURN(final_, env.load("memagent_final", {"problem", "memory"}));
    fit_ = fit_window(window_key_, chunk_key_, memory_key_, env.model().default_window());
    // Tokens of a step without its memory and chunk: template, chat markup, question.
    const int64_t base = env.model().prompt_tokens(render(update_, {{"problem", question}, {"memory", ""}, {"chunk", ""}}),
                                                   update_.prefix);
    const int64_t room = fit_.window - base - 2 * fit_.memory;  // memory in the prompt and in the reply
    if (chunk_key_ == 0) fit_.chunk = std::min(fit_.chunk, room);
    if (fit_.chunk < 1 || fit_.chunk > room)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("memagent: a step does not fit the window of {} tokens: template and question {} + "
                                    "memory {} in and {} out + chunk {} (the question is too long, or chunk=/memory= "
                                    "too large; window= raises the window)",
                                    fit_.window, base, fit_.memory, fit_.memory, fit_.chunk));
    const int64_t fbase = env.model().prompt_tokens(render(final_, {{"problem", question}, {"memory", ""}}),
                                                    final_.prefix);
    if (fbase + fit_.memory + answer_ > fit_.window)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("memagent: the final step does not fit the window of {} tokens: template and "
                                    "question {} + memory {} + answer {}",
                                    fit_.window, fbase, fit_.memory, answer_));
    memory_ = kNoMemory;
    return ok_status();
  }

  Status read_chunk(ReaderEnv& env, const std::string& question, int64_t index, const std::string& chunk) override {
    LC_ASSIGN_OR_RETURN(std::string reply,
                        env.call(update_, {{"problem", question}, {"memory", memory_}, {"chunk", chunk}}, fit_.memory,
                                 index));
    memory_ = trim(reply);
    return ok_status();
  }

  Expected<ReadResult> finish(ReaderEnv& env, const std::string& question) override {
    ReadResult r;
    LC_ASSIGN_OR_RETURN(r.reply, env.call(final_, {{"problem", question}, {"memory", memory_}}, answer_, -1));
    r.answer = extract_boxed(r.reply);
    r.partials = {memory_};
    return r;
  }

  std::vector<std::string> state() const override { return {memory_}; }
  Status restore(const std::vector<std::string>& s) override {
    if (s.size() != 1) return make_error(ErrorCode::kBadFile, "memagent: a checkpoint's state is one memory");
    memory_ = s[0];
    return ok_status();
  }

 private:
  int64_t chunk_key_ = 0, memory_key_ = 0, window_key_ = 0, answer_ = 256, calls_ = kDefaultMaxCalls;
  Fit fit_;
  Template update_, final_;
  std::string memory_ = kNoMemory;
};

}  // namespace

Expected<std::unique_ptr<Reader>> make_memagent(MethodSpec& spec) {
  auto r = std::make_unique<MemAgent>();
  LC_TRY(r->parse(spec));
  return std::unique_ptr<Reader>(std::move(r));
}

}  // namespace lc::readers
