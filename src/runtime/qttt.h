// Query-only test-time training (qTTT), from the paper that introduces "query-only test-time
// training (qTTT): a cache-preserving adaptation that performs a single prefill to fix
// keys/values and then applies a handful of gradient updates to the query projections"
// (ICLR 2026 submission, shared/seeds/000, METHODS.md §4).
//
// After one prefill the KV cache is frozen. A step draws a span x[s .. s+S) of the context and
// minimises the mean next-token loss of its S-1 predictions over W_q alone:
//
//   L(W_q) = -1/(S-1) * sum_{t=s}^{s+S-2} log softmax(f(x_t; W_q, K, V))[x_{t+1}]
//
// where every layer's attention of a span token reads the CACHED keys and values (fixed, as
// the prefill computed them) and only its own query q_t = RoPE(W_q h_t) depends on W_q. The
// gradient does not reach K, V or earlier positions; it flows down the span token's own
// residual stream (attention output, MLP, RMSNorm and dq -> dh through W_q) into lower layers.
// A span token at sequence index i attends, per KV head, to every cached token with index <= i
// (what dense attention reads), so qTTT needs the whole cache: presses that drop entries and
// attention backends that read a subset are refused. Attention `fixed:distance=W` (a distance
// ceiling, the default of models trained with one) reads every key too: a key more than W
// positions back is scored as rope(q, W) . rope(k, 0), so such a query has two rotations and
// its gradient flows back through both.
//
// The update is Adam (beta1 0.9, beta2 0.999, eps 1e-8, no weight decay; grad::adam_update, the
// trainer's) on an f32 copy of each layer's attn_q.weight. The copy is installed in the Context (set_query_weights) for the
// tokens decoded next (the question and the answer); clear_query_weights() restores the
// model's own weights, which are never written.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/context.h"

namespace lc {

struct QtttParams {
  int64_t steps = 8;     // gradient steps (0: qTTT off)
  double lr = 1e-3;      // Adam step size
  int64_t span = 128;    // tokens per training span (S-1 predictions)
  bool enabled() const { return steps > 0; }
  std::string spec() const;  // "steps=8,lr=0.001,span=128"
};

// Parses "steps=N,lr=X,span=S" (any subset; the others keep their defaults); "" and "none"
// give steps=0. Errors name --qttt and the bad value.
Expected<QtttParams> parse_qttt(std::string_view spec);

// Whether qTTT can run on this context: no press that drops entries; dense attention, or
// fixed-distance attention without a budget.
Status check_qttt_context(const Context& ctx);
// Whether spans of p.span tokens fit in a context of n_context tokens.
Status check_qttt_span(const QtttParams& p, int64_t n_context);

struct QtttStats {
  int64_t steps = 0, span = 0;
  int64_t n_context = 0;          // tokens the spans were drawn from
  double seconds = 0;             // the whole call: weight preparation, steps, evaluation
  double step_seconds = 0;        // the gradient steps alone
  double loss_before = 0;         // loss of the first span with the model's W_q
  double loss_after = 0;          // loss of the same span with the trained W_q
  std::vector<double> step_loss;  // each step's span loss, before its update
  std::vector<int64_t> starts;    // each step's span start
  size_t extra_bytes = 0;         // memory qTTT allocated (weights, optimiser, activations)
  // Training tokens per second (S tokens per step, forward + backward).
  double tokens_per_second() const {
    return step_seconds > 0 ? static_cast<double>(steps * span) / step_seconds : 0.0;
  }
};

// The loss and its W_q gradient over a frozen cache: the engine of qTTT, exposed for tests.
// Holds f32 copies of what it multiplies (W_q trainable; W_o, the MLP and the output matrix
// widened once, or used in place when they are f32 in the file) and the activations of one
// span.
class QueryTrainer {
 public:
  // Over the first n_context tokens of ctx (-1: all of ctx.n_past()); checks the context.
  static Expected<std::unique_ptr<QueryTrainer>> create(Context& ctx, int64_t n_context = -1);
  ~QueryTrainer();

  int64_t n_layer() const;
  int64_t n_context() const { return n_context_; }
  // Layer il's W_q: [n_head * head_dim, n_embd] f32, row o = output feature o (GGUF layout).
  float* wq(int64_t il);
  const float* grad(int64_t il) const;  // dL/dW_q of the last loss(..., true)

  // Mean next-token cross-entropy of the S-1 predictions inside tokens [start, start + S) of
  // the context; with want_grad, dL/dW_q into grad() (overwritten).
  Expected<double> loss(int64_t start, int64_t span, bool want_grad);
  // One Adam step on every layer's W_q with the current grad().
  void adam_step(double lr);
  // Moves the trained W_q into the context (Context::set_query_weights).
  void install();
  size_t bytes() const;

 private:
  QueryTrainer(Context& ctx);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Context& ctx_;
  int64_t n_context_ = 0;
};

// Runs qTTT over the first n_context tokens of ctx (-1: all of them) and installs the trained
// W_q in ctx; the caller decodes the question and the answer, then calls
// ctx.clear_query_weights(). Spans are drawn from `seed`. steps == 0 does nothing.
Expected<QtttStats> run_qttt(Context& ctx, const QtttParams& p, uint64_t seed, int64_t n_context = -1);

// run_qttt() one gradient step at a time, so that a caller (the server's engine) can run other
// work between the steps: create() checks and prepares, each step() takes one Adam step, and
// the last one evaluates, installs the trained W_q and returns true. stats() is run_qttt()'s
// result once done. Same spans, same arithmetic: the result equals run_qttt()'s.
class QtttRun {
 public:
  static Expected<std::unique_ptr<QtttRun>> create(Context& ctx, const QtttParams& p, uint64_t seed,
                                                   int64_t n_context = -1);
  Expected<bool> step();
  const QtttStats& stats() const { return st_; }

 private:
  QtttRun() = default;
  QtttParams p_;
  QtttStats st_;
  std::unique_ptr<QueryTrainer> tr_;
  std::mt19937_64 rng_;
  uint64_t n_starts_ = 0;
  double t0_ = 0;
  bool done_ = false;
};

// One line for an end-of-run summary: "qTTT: 8 steps x 128 tokens in 1.2 s (850 tokens/s), ...".
std::string qttt_summary(const QtttStats& s);

}  // namespace lc
