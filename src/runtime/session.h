// One request's life over a model: the home of the request flow that every front end (run,
// chat, bench run, and the readers and server to come) goes through.
//
// A request is a prompt (a document, then optionally a question), the method settings of the
// Session (rope, attention, press, qTTT in SessionParams), sampling and stop conditions. The
// Session owns, in order:
//   1. prefill: the document, compressed by a query-agnostic press before the question is read
//      (METHODS.md §2), or the whole prompt with a query-aware press compressing after it;
//   2. qTTT (runtime/qttt.h): after the document's prefill, a few steps on W_q; the question and
//      the answer use the trained W_q, and the model's own weights come back when the request
//      ends, whether it succeeds or fails;
//   3. generation, streamed through a callback, with end-of-generation, stop strings, a token
//      cap and cancellation;
//   4. timings and memory figures.
// A Session can be saved to a file and restored (tokens, KV blocks, the press's schedule
// state and qTTT's weights), so that a later request continues from the same cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/context.h"
#include "model/model.h"
#include "runtime/qttt.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace lc {

struct SessionParams {
  ContextParams ctx;  // rope, attention, press, KV cache, threads, draft
  QtttParams qttt{.steps = 0};  // steps 0: no test-time training
};

// The prompt of a request, tokenised as one text (so that a token straddling the boundary
// between document and question is what the model sees).
struct Prompt {
  std::vector<int32_t> tokens;  // document then question, BOS included if the model adds one
  // Tokens of `tokens` before the question: what a query-agnostic press compresses and qTTT
  // trains on. -1 or >= tokens.size(): no question (then both use all but the last token,
  // which generation evaluates).
  int64_t n_context = -1;
};

struct GenerateOptions {
  int64_t n_predict = 128;         // cap on generated tokens
  std::vector<std::string> stop;   // generation ends before the first of these strings
  uint64_t qttt_seed = 0;          // seed of qTTT's span draws
  // Log-probabilities of each generated token and of the n_probs most likely ones, from the
  // model's distribution (log-softmax of the logits, before penalties and filters). -1: none.
  int n_probs = -1;
  bool ignore_eos = false;  // end-of-generation tokens do not end the answer (benchmarks)
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the n_probs most likely tokens, best first
};

// Called with each piece of generated text as it becomes final (never a partial UTF-8
// character, never the start of a stop string); id is the token that completed it, -1 for
// text flushed at the end. Return false to stop.
using TokenCallback = std::function<bool(int32_t id, std::string_view text)>;

enum class StopReason { kLength, kEog, kStopString, kCallback, kCancelled };
const char* stop_reason_name(StopReason r);

struct RequestStats {
  int64_t n_prompt = 0;   // prompt tokens evaluated by this request
  int64_t n_reused = 0;   // prompt tokens found in the cache already (continue_with)
  int64_t n_gen = 0;      // tokens generated
  double t_prompt = 0;    // seconds of prefill (press work included)
  double t_gen = 0;       // seconds of generation
  StopReason stop = StopReason::kLength;
  std::string text;       // the generated text, stop string excluded
  std::vector<int32_t> generated;  // the generated token ids
  std::vector<TokenLogprob> logprobs;  // one per generated token when n_probs >= 0
  bool qttt_ran = false;
  QtttStats qttt;
};

class Generation;

// Where a Session's forward passes run. Without one, on the calling thread. The server gives a
// reader's Sessions one (server/engine.cpp) so that their passes run on its loop, as rows of
// its decode batches and as prefill chunks paced beside the other slots, while the reader
// itself runs on its own thread and waits for each pass.
class StepGate {
 public:
  virtual ~StepGate() = default;
  // One generated token: what ctx.decode({id}, Logits::kLast) does.
  virtual Status decode_token(Context& ctx, int32_t id) = 0;
  // The next chunk of ctx's pending decode call: what ctx.decode_step(max_tokens) does.
  virtual Expected<bool> prefill_chunk(Context& ctx, int64_t max_tokens) = 0;
};

class Session {
 public:
  // Makes the context from p.ctx and checks that the methods work together (qTTT needs the
  // whole cache: dense or fixed attention, no press).
  static Expected<std::unique_ptr<Session>> create(const Model& model, const SessionParams& p);

  // A fresh request: clears the cache, prefills the prompt (with compression and qTTT), then
  // generates. The Session's history is the prompt (as the cache holds it) plus the answer.
  Expected<RequestStats> run(const Prompt& prompt, Sampler& sampler, const GenerateOptions& g,
                             const TokenCallback& on_token);

  // The checks run() makes before any work: a prompt that is not empty, fits the context, and
  // leaves room for qTTT's spans. Front ends call it before they print anything.
  Status validate(const Prompt& prompt) const;

  // The next turn of a conversation (chat, server slots): `tokens` is the whole conversation
  // so far. The longest prefix the cache already holds is kept, the rest is evaluated, then
  // the answer is generated. Needs a Session whose cache holds every token it was given
  // (check_multi_turn()).
  Expected<RequestStats> continue_with(std::vector<int32_t> tokens, Sampler& sampler, const GenerateOptions& g,
                                       const TokenCallback& on_token);
  // Whether continue_with() can work with these methods: a query-agnostic press needs to know
  // where the question starts, and SpecPC compresses one prompt before its prefill.
  Status check_multi_turn() const;

  // ---- a request in steps (the server interleaves many Sessions) ----
  // begin_run() / begin_continue() make run()'s / continue_with()'s checks and set the prompt's
  // work up; prefill_step() does the next piece of it (one forward chunk of at most n_batch
  // tokens, or qTTT's training) and returns true once the prompt is in and the logits of its
  // last token are ready; prefill_stats() are the figures so far. Then a Generation (below)
  // samples the answer a token at a time. run() and continue_with() are these steps in a loop,
  // so the results are the same (run() and continue_with() first give the context the answer
  // budget, g.n_predict, with context().set_answer_tokens(): a caller of the steps does the
  // same). end_request() puts the model's own W_q back after qTTT.
  Status begin_run(const Prompt& prompt, uint64_t qttt_seed = 0);
  Status begin_continue(std::vector<int32_t> tokens);
  Expected<bool> prefill_step(int64_t max_tokens = 0);  // max_tokens: Context::decode_step
  // The same, with the forward chunk run by `step` instead of context().decode_step(max_tokens):
  // the server passes a step that runs the chunk inside its decode batch (Context::decode_mixed).
  // `step` must do what decode_step(max_tokens) does to the context; it is not called for a
  // piece of work that is not a forward chunk (qTTT's training, a finished prompt).
  using ChunkStep = std::function<Expected<bool>(Context& ctx, int64_t max_tokens)>;
  Expected<bool> prefill_step(int64_t max_tokens, const ChunkStep& step);
  const RequestStats& prefill_stats() const { return plan_.st; }
  void end_request() { ctx_->clear_query_weights(); }

  // ---- working memory, turn by turn (the Sculptor reader) ----
  // Evaluates `tokens` after what the cache holds (the Context's press still runs on its
  // schedule; no qTTT), keeping the last token's logits for generate_next(). Counts into st.
  Status append(std::span<const int32_t> tokens, RequestStats& st);
  // Generates after the last append() as run() does; the generated tokens stay in the cache.
  // An error when the last operation was not an append (the logits would be stale).
  Expected<RequestStats> generate_next(Sampler& sampler, const GenerateOptions& g, const TokenCallback& on_token);
  // Starts this Session from the first n tokens of `src` (Context::adopt_prefix: full KV
  // blocks shared, not recomputed); what this Session held is dropped. Returns the tokens taken;
  // a begin_continue() with a prompt that starts with them then evaluates only the rest.
  Expected<int64_t> adopt_prefix(const Session& src, int64_t n);
  // Drops every token whose sequence index is >= n (Context::truncate); the history follows.
  void truncate(int64_t n);
  // Hides tokens [first, first + count) of the sequence from the cache and restores them
  // (Context::hide / restore: the rows are kept, not recomputed; positions are not reused).
  Expected<HiddenFragment> hide(int64_t first, int64_t count);
  Status restore(HiddenFragment&& fragment);
  // Tokens appended so far (the next token's position); hidden tokens count.
  int64_t n_past() const { return ctx_->n_past(); }

  // Asks the request in progress (from another thread, or from a callback) to stop at the next
  // chunk or token: it returns with stop reason kCancelled (during generation) or a kCancelled
  // error (during prefill). The flag is cleared when the next request starts.
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancel_.load(std::memory_order_relaxed); }
  // Every forward pass from now on goes through `gate` (null: back to the calling thread). The
  // gate outlives the Session or is unset first.
  void set_step_gate(StepGate* gate) { gate_ = gate; }
  StepGate* step_gate() const { return gate_; }
  // Progress of a long prefill: tokens done of the prompt's total (called after every chunk).
  void set_progress(std::function<void(int64_t done, int64_t total)> fn) { progress_ = std::move(fn); }

  // Writes the state a later request continues from: the history, every KV block of every
  // (layer, head) with its positions, the press's schedule state and qTTT's weights. The file
  // names the model's shape and the cache settings; load() refuses a file made with others.
  Status save(const std::string& path) const;
  Status load(const std::string& path);

  const std::vector<int32_t>& history() const { return history_; }
  Context& context() { return *ctx_; }
  const Context& context() const { return *ctx_; }
  const Model& model() const { return model_; }
  const SessionParams& params() const { return params_; }

 private:
  Session(const Model& model, const SessionParams& p, std::unique_ptr<Context> ctx);
  // Samples up to g.n_predict tokens after the prompt the cache holds (its logits are those of
  // history_'s last token), appending them to history_.
  Status generate(Sampler& sampler, const GenerateOptions& g, const TokenCallback& on_token, RequestStats& st);
  Status decode_timed(std::span<const int32_t> tokens, Logits which, bool context_part, RequestStats& st);
  // The rest of run() / continue_with() once the request is begun: the prefill, then the answer.
  Expected<RequestStats> finish_request(Sampler& sampler, const GenerateOptions& g, const TokenCallback& on_token);
  friend class Generation;

  // The prompt work of the request begun by begin_run / begin_continue.
  struct PrefillPlan {
    enum Stage { kIdle, kAgnostic, kQtttDoc, kQtttTrain, kRest, kDone } stage = kIdle;
    std::unique_ptr<QtttRun> qttt;  // kQtttTrain: the run in progress, one step per prefill_step
    int64_t n_doc = 0;           // document tokens (run)
    int64_t stage_tokens = 0;    // tokens of the decode call in progress
    bool in_call = false;        // a begin_decode of this stage is pending
    uint64_t qttt_seed = 0;
    RequestStats st;
  };
  PrefillPlan plan_;

  const Model& model_;
  SessionParams params_;
  std::unique_ptr<Context> ctx_;
  std::vector<int32_t> history_;  // the tokens of the request so far (the cache holds them)
  std::atomic<bool> cancel_{false};
  std::function<void(int64_t, int64_t)> progress_;
  bool logits_ready_ = false;  // the last operation was append(): generate_next() may run
  StepGate* gate_ = nullptr;
};

// The answer of one request, a token at a time: next() samples from the logits the Session's
// context holds, streams the text (stop strings held back, complete UTF-8 only) and returns
// the token that must be evaluated before the next call, or nothing once the answer has ended
// (RequestStats::stop says why). The caller evaluates it alone (Session::context().decode) or
// batched with other Sessions' tokens (Context::decode_batch), then calls next() again.
// finish() flushes the text left and fills the timings; call it once the answer has ended or
// when abandoning it.
class Generation {
 public:
  Generation(Session& session, Sampler& sampler, const GenerateOptions& g, TokenCallback on_token,
             RequestStats& st);
  Expected<std::optional<int32_t>> next();
  void finish();
  bool ended() const { return ended_; }
  RequestStats& stats() { return st_; }

 private:
  bool emit(int32_t id, bool final_piece);
  size_t find_stop(size_t from) const;
  void record_logprobs(const float* logits, int32_t id);

  Session& s_;
  Sampler& sampler_;
  GenerateOptions g_;
  TokenCallback on_token_;
  RequestStats& st_;
  StreamDecoder dec_;
  size_t emitted_ = 0, longest_ = 0;
  int64_t i_ = 0;
  double t0_ = 0;
  bool ended_ = false, finished_ = false;
};

}  // namespace lc
