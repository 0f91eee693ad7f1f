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

// A conversation held in one model context: Sculptor's working memory. Messages are added
// turn by turn (the implementation applies the chat template), replies are generated after
// them and stay in the context, and a message can be hidden from the context (its KV rows
// leave the cache and are kept, not recomputed) and restored at its place.
class Conversation {
 public:
  virtual ~Conversation() = default;
  // Adds a message ("system", "user", "assistant"); returns its id (0, 1, ... in order).
  virtual Expected<int64_t> add(const std::string& role, const std::string& content, CallCost& cost) = 0;
  // Generates the assistant's reply after the messages, adds it as a message and returns its
  // id and text. With stop strings the reply ends at the first one; with a single stop string
  // the reply (and the message) keep it.
  virtual Expected<std::pair<int64_t, std::string>> reply(int64_t max_tokens, const std::vector<std::string>& stop,
                                                          CallCost& cost) = 0;
  virtual Status hide(int64_t message) = 0;
  virtual Status restore(int64_t message) = 0;
  virtual bool hidden(int64_t message) const = 0;
  // Tokens the context holds now (hidden messages excluded), and of one message.
  virtual int64_t tokens_held() const = 0;
  virtual int64_t message_tokens(int64_t message) const = 0;
  // Whether the model has a chat template (JSON tool calls) or reads plain text.
  virtual bool chat() const = 0;
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
  // Independent calls of one template, answered together (mapreduce's chunks): replies in the
  // order of `users`, one cost each. The default answers them one after another; SessionCaller
  // runs them in contexts of their own and generates their replies as rows of one batch.
  virtual Expected<std::vector<std::string>> call_batch(const std::vector<std::string>& users,
                                                        const std::string& reply_prefix, int64_t max_tokens,
                                                        const std::vector<std::string>& stop,
                                                        std::vector<CallCost>& costs) {
    std::vector<std::string> out;
    costs.assign(users.size(), CallCost{});
    for (size_t i = 0; i < users.size(); ++i) {
      LC_ASSIGN_OR_RETURN(std::string r, call(users[i], reply_prefix, max_tokens, stop, costs[i]));
      out.push_back(std::move(r));
    }
    return out;
  }
  // A fresh conversation in a context of its own (Sculptor); an error when the caller has none.
  virtual Expected<std::unique_ptr<Conversation>> converse() {
    return make_error(ErrorCode::kUnsupported, "this model caller holds no conversations");
  }
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
  // The same for several independent renderings of `t` (ModelCaller::call_batch), logged in
  // order, the i-th as chunk first_chunk + i; each counts as a call against the cap.
  Expected<std::vector<std::string>> call_batch(const Template& t,
                                                const std::vector<std::map<std::string, std::string>>& values,
                                                int64_t max_tokens, int64_t first_chunk);
  // Tokens of a text on its own (no BOS): what it adds to a prompt.
  int64_t count_tokens(std::string_view text) const;
  Expected<Template> load(std::string_view name, const std::vector<std::string>& required) const {
    return templates_.load(name, required);
  }
  ModelCaller& model() { return model_; }
  // An error when the cap on model calls is reached (checked before every call).
  Status budget() const;
  Status budget_error() const;  // the error budget() gives at the cap
  // Logs a record that is not a ModelCaller call: a conversation's reply (counted as a model
  // call against the cap, model_call) or a tool's result.
  Status record(const CallRecord& rec, bool model_call);
  // The document being read (for readers that search it, Sculptor).
  const std::string& document() const { return document_; }
  void set_document(std::string path) { document_ = std::move(path); }
  const ReadStats& stats() const { return stats_; }
  ReadStats& stats() { return stats_; }
  void set_log(std::function<void(const CallRecord&)> fn) { log_ = std::move(fn); }

 private:
  ModelCaller& model_;
  const TemplateSource& templates_;
  int64_t max_calls_;
  std::string document_;
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
  // Chunks read_document hands over at once (their calls independent of each other), and the
  // call for them: chunks first_index, first_index + 1, ... The default reads them one by one.
  virtual int64_t batch() const { return 1; }
  virtual Status read_chunks(ReaderEnv& env, const std::string& question, int64_t first_index,
                             const std::vector<std::string>& chunks) {
    for (size_t i = 0; i < chunks.size(); ++i)
      LC_TRY(read_chunk(env, question, first_index + static_cast<int64_t>(i), chunks[i]));
    return ok_status();
  }
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

// Sculptor's tool texts (sculptor.cpp), shared with the curriculum that teaches them:
// a search's result: "N match(es) for 'Q'" then one "[fragment F] ...TEXT..." line per match shown
// (TEXT: the match and `around` characters either side, newlines and tabs as spaces);
std::string sculptor_search_result(const std::string& query, int64_t total,
                                   const std::vector<std::pair<int64_t, std::string>>& shown);
// a tool result as the next message: "<tool_response>\nR\n</tool_response>" (json), or
// "Result: R\n" (text) on a line of its own after the reply `after`.
std::string sculptor_result_message(const std::string& result, bool json_mode, const std::string& after);

// The text inside the last \boxed{...} of a reply (braces nested), or the reply trimmed when
// it has none.
std::string extract_boxed(std::string_view reply);
std::string trim(std::string_view s);

}  // namespace lc::readers
