// The server's engine: a fixed set of slots, each a Session that keeps its cache between
// requests, a bounded queue in front of them, and one thread that drives them all.
//
// Continuous batching: every step of the engine's loop takes one token from each slot that is
// generating and evaluates them in one forward pass over the weights (Context::decode_batch),
// each sequence with its own cache, attention backend and press. A prompt is evaluated one
// chunk (--batch-size tokens) per step, between those decode steps, so a long document does
// not stall the chats beside it. Requests that name a reader (a reading agent) run on a thread
// of their own, outside the batch: a reader makes many model calls of its own.
//
// Prefix reuse: a request goes to the idle slot whose cached tokens share the longest prefix
// with its prompt (when the slot's methods are the request's), and only the rest is evaluated.
//
// Memory: one KV budget for the whole server. Each slot's cache is capped by what its request
// reserved, and the caps together never exceed the budget: a request whose prompt plus
// max_tokens cannot fit even alone is refused with the bytes it needs; one that fits later
// waits in the queue; idle slots' caches are dropped to make room (never an active request's).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/block_pool.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace lc::server {

// An error for the client: the HTTP status and OpenAI's error type.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
};

// The long-context methods of one request (the body's "longctx" object); empty: the server's.
struct Methods {
  std::string rope, attn, kv_press, reader, qttt;
  bool read_map = false;  // report which parts of the sequence the last token read
};

struct JobSpec {
  std::vector<int32_t> prompt;  // the prompt's tokens (a chat is rendered with its template)
  int64_t n_context = -1;       // tokens before the question (Prompt::n_context)
  std::string document, question;  // reader requests: what the reader reads and is asked
  SamplerParams sampling;
  GenerateOptions gen;
  Methods methods;
};

// What a request produces as it runs, taken by the HTTP side.
struct JobEvent {
  std::string text;                   // text that became final
  std::vector<TokenLogprob> logprobs; // logprobs of the tokens generated since the last event
};

enum class JobPhase { kQueued, kPrefill, kGenerating, kReading, kDone };

class Job {
 public:
  Job(uint64_t id, JobSpec spec, double deadline) : id_(id), spec_(std::move(spec)), deadline_(deadline) {}
  uint64_t id() const { return id_; }
  const JobSpec& spec() const { return spec_; }
  double deadline() const { return deadline_; }

  // Takes the events produced so far, waiting up to timeout_s for one; true once the job is
  // done (and every event taken).
  bool wait(std::vector<JobEvent>& out, double timeout_s);
  // Asks the job to stop (client gone): it ends at the next chunk or token and frees its slot.
  void cancel() { cancel_.store(true); }
  bool cancelled() const { return cancel_.load(); }
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }

  // After wait() returned true: the figures, and the error if it failed.
  const RequestStats& stats() const { return stats_; }
  const std::optional<ApiError>& error() const { return error_; }
  std::vector<float> read_map() const;
  int slot() const { return slot_; }

  // ---- engine side ----
  void push(JobEvent e);
  void finish(const RequestStats& st, std::optional<ApiError> err, std::vector<float> read_map = {});
  void set_slot(int s) { slot_ = s; }
  double t_submit = 0;

 private:
  uint64_t id_;
  JobSpec spec_;
  double deadline_;
  std::atomic<bool> cancel_{false};
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
  bool done_ = false;
  RequestStats stats_;
  std::optional<ApiError> error_;
  std::vector<float> read_map_;
  std::atomic<int> slot_{-1};
};

// Which queued request a free slot takes next. FCFS by default; the scale-out work adds its
// own behind this interface.
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual std::string name() const = 0;
  // Index into `queue` (not empty) of the job to start now.
  virtual size_t pick(const std::deque<std::shared_ptr<Job>>& queue, double now) const = 0;
};
// "fcfs" or "sjf" (shortest prompt first; a job's prompt length counts down by aging_tokens
// per second of waiting, so a long prompt is not starved).
Expected<std::unique_ptr<Scheduler>> make_scheduler(std::string_view name, double aging_tokens_per_s = 2048);

struct EngineParams {
  SessionParams defaults;   // the server's flags: methods, cache types, threads, batch
  int n_slots = 4;
  int64_t kv_budget = 0;    // bytes for every slot's cache together; 0: 3/4 of available memory
  size_t max_queue = 64;    // queued requests beyond this are refused (429)
  int64_t max_prompt = 0;   // tokens; 0: no cap beyond the budget
  std::string schedule = "fcfs";
  std::string slot_save_path;  // folder for /slots save and restore; empty: refused
  ChatTemplate chat_template = ChatTemplate::kNone;  // for readers' calls
  // A prompt's prefill chunk runs in the same forward pass as the other slots' decode rows
  // (Context::decode_mixed); false: its own pass between decode steps (A/B, --no-merge-prefill).
  bool merge_prefill = true;
  // A reader's forward passes run on the engine's loop, its generated tokens as rows of the
  // decode steps and its prompts as paced chunks; false: on the reader's own thread and thread
  // pool, beside the loop (A/B, --no-reader-batch).
  bool reader_batch = true;
  // While other slots generate, prefill chunks may add this fraction of their decode step's
  // time, on average (a slow chunk runs every few steps): the generating slots' time per token
  // stays near (1 + prefill_share) of theirs alone.
  double prefill_share = 0.5;
};

struct SlotInfo {
  int id = 0;
  std::string state;  // idle, prefill, generating, reading
  int64_t n_past = 0;
  size_t kv_resident_bytes = 0, kv_spilled_bytes = 0, kv_cap_bytes = 0;
  std::string attn, rope, kv_press;
  uint64_t job = 0;
};

struct EngineMetrics {
  int64_t prompt_tokens = 0, predicted_tokens = 0, cached_tokens = 0;
  double prompt_seconds = 0, predicted_seconds = 0;
  int64_t busy_slots = 0, queued = 0;
  size_t kv_resident_bytes = 0, kv_spilled_bytes = 0, kv_budget_bytes = 0, kv_reserved_bytes = 0;
  size_t kv_in_use_bytes = 0;
  int64_t kv_shared_blocks = 0;      // blocks held by more than one slot (a common prefix)
  int64_t prefix_shared_tokens = 0;  // prompt tokens a slot took from another slot's cache
  double predicted_per_second_recent = 0;  // generated tokens/s over the last 10 s
  int64_t requests_finished = 0, requests_failed = 0, requests_cancelled = 0, requests_refused = 0;
  int64_t batch_steps = 0, batched_tokens = 0;
  int64_t merged_prefill_chunks = 0;  // prefill chunks that ran inside a decode step's pass
  int64_t reader_rows = 0;            // readers' generated tokens evaluated as rows of a decode step
  int64_t reader_chunks = 0;          // readers' prompt chunks the engine's loop evaluated
};

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> create(const Model& model, const EngineParams& p);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks the request (methods, lengths, budget) and queues it.
  std::shared_ptr<Job> submit(JobSpec spec, double deadline, ApiError& err);

  std::vector<SlotInfo> slots() const;
  void count_refused() {
    std::lock_guard<std::mutex> lk(mu_);
    m_.requests_refused += 1;
  }
  EngineMetrics metrics() const;
  const Model& model() const { return model_; }
  const EngineParams& params() const { return p_; }
  size_t bytes_per_token() const { return bytes_per_token_; }

  // /slots/{id}?action=save|restore|erase: an idle slot's session to a file under
  // slot_save_path (the Session's save format), back from it, or its cache dropped.
  std::optional<ApiError> slot_action(int id, const std::string& action, const std::string& filename,
                                      std::string& detail);

 private:
  struct Slot;
  class ReaderGate;
  struct GatePass;
  Engine(const Model& model, const EngineParams& p);
  void loop();
  bool admit();                 // under mu_
  void start(Slot& s);
  // One engine step: the generating slots' next tokens (collect_rows), one prefill chunk of a
  // slot in prefill, merged into the rows' forward pass when it can be, then the rows.
  struct DecodeRows {
    std::vector<Context*> ctxs;
    std::vector<int32_t> toks;
    std::vector<Slot*> who;
    std::vector<GatePass*> pass;  // a reader's generated token (its gate's pass), else null
  };
  DecodeRows collect_rows();
  bool step_prefill(DecodeRows& rows);  // true: the rows ran inside the prefill chunk's pass
  void step_decode(DecodeRows& rows);
  void rows_done(DecodeRows& rows, const std::vector<Status>& st, double seconds);
  void finish(Slot& s, std::optional<ApiError> err);
  void run_reader(Slot& s);
  // The pass a reading slot's gate waits on, when it is of this kind (under mu_ or on the loop).
  GatePass* gate_pass(Slot& s, int kind);
  void gate_done(Slot& s, GatePass& p, Status st, Expected<bool> chunk);
  size_t reservation(int64_t tokens) const;
  Expected<SessionParams> session_params(const Methods& m) const;

  const Model& model_;
  EngineParams p_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<ThreadPool> pool_;  // every slot's session runs on it (the engine's thread drives them)
  std::shared_ptr<BlockPool> kv_pool_;  // every slot's KV blocks: one budget, prefix blocks shared
  double last_publish_ = 0;
  size_t bytes_per_token_ = 0;
  int64_t block_tokens_ = 64;
  size_t budget_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  uint64_t next_id_ = 1;
  size_t prefill_rr_ = 0;
  double decode_step_s_ = 0;  // seconds of the last batched decode step (prefill chunks are sized to it)
  size_t decode_step_rows_ = 0;   // the rows of that step
  double prefill_credit_s_ = 0;   // seconds prefill chunks may still add beside generating slots
  int merged_since_measure_ = 0;  // merged steps since decode_step_s_ was measured
  EngineMetrics m_;
  // Tokens decoded per second of the last 10 (second, tokens): a ring, constant memory.
  std::array<std::pair<int64_t, int64_t>, 10> recent_{};
  std::vector<SlotInfo> snapshot_;                 // what slots() shows, published by the loop
  std::deque<std::function<void()>> tasks_;        // run on the engine's thread (slot actions)
  void publish();
  std::thread thread_;
};

}  // namespace lc::server
