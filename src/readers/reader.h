// Reading agents: strategies that read a document far longer than the model's window in
// window-sized pieces, calling the model once or more per piece (MemAgent, map-reduce chunking;
// METHODS.md §5). A reader drives model calls through a ModelCaller, which the engine
// implements over runtime::Session (session_caller.h) and tests implement with scripted
// replies. `longctx read` and `bench run --reader` use them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/method_info.h"
#include "core/status.h"
#include "readers/templates.h"
#include "tokenizer/tokenizer.h"

namespace lc::readers {

// What one model call cost.
struct CallCost {
  int64_t n_prompt = 0;  // tokens prefilled
  int64_t n_gen = 0;     // tokens generated
  double seconds = 0;
};

// One model call: a user message (the caller applies the model's chat template), a reply
// prefix that opens the reply, a cap on the reply, and stop strings. Returns the reply without
// the prefix.
class ModelCaller {
 public:
  virtual ~ModelCaller() = default;
  virtual Expected<std::string> call(const std::string& user, const std::string& reply_prefix, int64_t max_tokens,
                                     const std::vector<std::string>& stop, CallCost& cost) = 0;
  // Tokens the rendered call of `user` + `reply_prefix` holds (chat template and BOS included).
  virtual int64_t prompt_tokens(const std::string& user, const std::string& reply_prefix) const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  // The window a reader fits its calls into by default: the model's training context, capped
  // at 8K (MemAgent's window).
  virtual int64_t default_window() const = 0;
};

// One logged model call.
struct CallRecord {
  std::string step;     // the template's name
  int64_t chunk = -1;   // the chunk it read, -1 for none
  std::string reply;
  CallCost cost;
};

struct ReadStats {
  int64_t chunks = 0;           // chunks read
  int64_t calls = 0;            // model calls
  int64_t doc_tokens = 0;       // tokens of the document
  int64_t prompt_tokens = 0;    // tokens prefilled over all calls
  int64_t gen_tokens = 0;       // tokens generated over all calls
  double seconds = 0;           // wall time of the read
  int64_t resumed_chunks = 0;   // chunks taken from a checkpoint, not read again
  // mapreduce: chunks that returned a candidate answer.
  int64_t candidates = 0;
};

struct ReadResult {
  std::string answer;   // the final answer (from \boxed{} when the reply has one)
  std::string reply;    // the final call's whole reply
  std::vector<std::string> partials;  // mapreduce: the candidates in document order
  ReadStats stats;
};

// What a reader sees of the run: the model, its templates, the call budget and the log.
class ReaderEnv {
 public:
  ReaderEnv(ModelCaller& model, const TemplateSource& templates, int64_t max_calls)
      : model_(model), templates_(templates), max_calls_(max_calls) {}
  // Renders `t` with `values` and calls the model (counting the call against max_calls).
  Expected<std::string> call(const Template& t, const std::map<std::string, std::string>& values,
                             int64_t max_tokens, int64_t chunk);
  // Tokens of a text on its own (no BOS): what it adds to a prompt.
  int64_t count_tokens(std::string_view text) const;
  Expected<Template> load(std::string_view name, const std::vector<std::string>& required) const {
    return templates_.load(name, required);
  }
  ModelCaller& model() { return model_; }
  const ReadStats& stats() const { return stats_; }
  ReadStats& stats() { return stats_; }
  void set_log(std::function<void(const CallRecord&)> fn) { log_ = std::move(fn); }

 private:
  ModelCaller& model_;
  const TemplateSource& templates_;
  int64_t max_calls_;
  ReadStats stats_;
  std::function<void(const CallRecord&)> log_;
};

// A reader: set up for a question, fed the document chunk by chunk, then asked for the answer.
// Its state between chunks is a list of strings, so a read can be checkpointed after any chunk
// and resumed.
class Reader {
 public:
  virtual ~Reader() = default;
  // The full spec, every key with its value ("memagent:chunk=625,memory=128,...").
  virtual std::string spec() const = 0;
  // Loads the templates and fits the chunk and memory sizes to the window; a question or a
  // template that leaves no room is an error here, before any model call.
  virtual Status prepare(ReaderEnv& env, const std::string& question) = 0;
  virtual int64_t chunk_tokens() const = 0;
  // The cap on model calls of one read (the calls= key): a read that would pass it fails.
  virtual int64_t max_calls() const = 0;
  virtual Status read_chunk(ReaderEnv& env, const std::string& question, int64_t index, const std::string& chunk) = 0;
  virtual Expected<ReadResult> finish(ReaderEnv& env, const std::string& question) = 0;
  virtual std::vector<std::string> state() const = 0;
  virtual Status restore(const std::vector<std::string>& state) = 0;
};

// Parses "NAME:key=value,..." against the registry (reader_list.h). Unknown names and keys are
// errors listing the accepted ones.
Expected<std::unique_ptr<Reader>> make_reader(std::string_view spec);
std::vector<MethodInfo> reader_method_info();
std::vector<std::pair<std::string, std::string>> reader_methods();

struct ReadOptions {
  std::string checkpoint;  // a file written after each chunk (empty: none)
  bool resume = false;     // continue from `checkpoint` when it exists
  std::function<void(int64_t bytes_done, int64_t bytes_total)> progress;
  std::function<void(const CallRecord&)> log;
  const std::atomic<bool>* cancel = nullptr;
};

// Reads the document at `path` with `reader`: streams its chunks, checkpoints after each,
// and returns the answer with the run's figures.
Expected<ReadResult> read_document(Reader& reader, ModelCaller& model, const TemplateSource& templates,
                                   const std::string& path, const std::string& question, const ReadOptions& opt);

// The text inside the last \boxed{...} of a reply (braces nested), or the reply trimmed when
// it has none.
std::string extract_boxed(std::string_view reply);
std::string trim(std::string_view s);

}  // namespace lc::readers
