// One sequence's inference state over a Model: the KV cache, the attention backend, activation
// buffers sized for one prefill chunk (n_batch tokens), and the forward pass. A prompt longer
// than n_batch is evaluated chunk by chunk, so activation memory does not grow with the prompt.
// Methods beyond the cache and the backend attach through ForwardHooks (model/forward_hooks.h):
// the press of --kv-press runs in a PressRunner (model/press_runner.h) the context makes.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "attention/backend.h"
#include "kv/kv_cache.h"
#include "kv/press.h"
#include "model/forward_hooks.h"
#include "model/model.h"
#include "model/sequence_parallel.h"
#include "rope/rope_scaling.h"
#include "rope/rope_table.h"

namespace lc {

// The largest forward chunk (ContextParams::n_batch): a ring shard is evaluated as one chunk.
inline constexpr int64_t kMaxBatch = int64_t{1} << 20;

struct ContextParams {
  // 0: the context grows as the input needs, bounded by kv_budget, or without one by 3/4 of the
  // memory available when the context is made; N: at most N tokens (an error beyond).
  int64_t n_ctx = 0;
  int64_t n_batch = 512; // tokens per forward chunk
  int n_threads = 0;     // 0: all cores
  // A pool to run on instead of one of the context's own (the server's slots share one, so
  // that idle pools do not spin beside the busy one). It must outlive the context, and only
  // one thread at a time may drive the contexts that share it. n_threads is then ignored.
  ThreadPool* pool = nullptr;
  // A KV block pool shared with other contexts of the same model and cache settings (the
  // server's slots): the budget is then the pool's, and contexts may share the blocks of a
  // common prefix (adopt_prefix). Only one thread at a time may drive them.
  std::shared_ptr<BlockPool> kv_pool;
  std::string rope;      // --rope spec; "" = the model's own rope from its GGUF metadata
  std::string attn;  // --attn spec (attention backend registry); empty: the model's default (dense, or fixed)
  int64_t kv_block = 64;       // --kv-block: tokens per KV block
  DType kv_type_k = DType::F32, kv_type_v = DType::F32;  // --kv-type-k / --kv-type-v
  int64_t kv_budget = 0;       // --kv-budget in bytes; 0 = no cap
  std::string kv_spill;        // --kv-spill DIR: cold blocks go to a file there
  std::string kv_press;        // --kv-press spec ("" or "none": no compression)
  // --draft: a small model with the same vocabulary, for the draft-guided presses (speckv,
  // specpc); it must outlive the context. Names for error messages: the two files.
  const Model* draft = nullptr;
  std::string model_name = "the model", draft_name = "the draft";
};

// The n_ctx of a context made with n_ctx = 0: positions are int32.
inline constexpr int64_t kGrowingContext = INT32_MAX;

class PressRunner;

// A fragment of a sequence hidden by Context::hide (Sculptor, "Empowering LLMs with Cognitive
// Agency via Active Context Management": the model hides part of its context and restores it
// later). It owns the tokens' KV rows as they were stored (nothing is recomputed on restore).
struct HiddenFragment {
  int64_t first = 0, count = 0;  // sequence indices [first, first + count)
  uint64_t id = 0;               // which hide() made it (unique in the process)
  std::vector<int32_t> tokens;   // [count] their token ids
  KvFragment kv;                 // their rows in every layer and head (KvCache::extract)
};

class Context {
 public:
  ~Context();
  static Expected<std::unique_ptr<Context>> create(const Model& model, const ContextParams& p);
  // With an attention backend made by the caller (e.g. a calibrating one) instead of p.attn.
  static Expected<std::unique_ptr<Context>> create(const Model& model, const ContextParams& p,
                                                   std::unique_ptr<AttentionBackend> backend);

  // Appends tokens to the sequence (positions n_past() ...) and runs the forward pass.
  // kLast keeps the logits of the last token, kAll of every token of this call.
  // With a press, a prompt (more than one token) is compressed after it is in. With SpecPC a
  // prompt decoded into an EMPTY context is first compressed by the draft: only the selected
  // tokens are evaluated, at contiguous positions 0.. (n_past() is then the kept count).
  Status decode(std::span<const int32_t> tokens, Logits which = Logits::kLast);
  // Query-agnostic compression (a press with query=agnostic): decodes the CONTEXT part of a
  // prompt and compresses after it; the prompt tokens decoded next with decode() (the question)
  // are appended without prefill compression, so the question never steers the selection.
  // Until decode_context() is called (or after a truncate), an agnostic press compresses
  // after every prompt as an aware one does (runtimes that do not split: perplexity, speed).
  // No logits are kept.
  Status decode_context(std::span<const int32_t> tokens);

  // ---- a decode() taken one forward chunk at a time ----
  // The server interleaves a long prompt's chunks with other requests' decode steps.
  // begin_decode() does what decode() (context_part: decode_context()) does before the first
  // chunk (checks, SpecPC's selection) and keeps a copy of the tokens; decode_step() runs the
  // next chunk of at most n_batch tokens and returns true once the call is complete (its hooks
  // ran). decode() is begin_decode() then decode_step() until done, so the results are the same.
  // An error in a step ends the call (its finished chunks stay in the cache). Any other
  // operation on the context while a call is pending is the caller's mistake, except
  // truncate()/clear(), which abandon it.
  Status begin_decode(std::span<const int32_t> tokens, Logits which = Logits::kLast, bool context_part = false);
  // max_tokens > 0 caps this chunk below n_batch (the server keeps a prefill step about as
  // long as a decode step while other requests generate).
  Expected<bool> decode_step(int64_t max_tokens = 0);
  bool decode_pending() const { return pending_.active; }

  // Continuous batching: one generated token for each of several sequences (distinct contexts
  // over the same model), in one forward pass over the weights. Row i is tokens[i] appended to
  // ctxs[i] at its position n_past(); the weight products run once over the B rows, and each
  // row's RoPE, cache, attention backend and hooks (press) are its own context's, so each
  // sequence gets exactly what decode() of its one token gives. Logits as kLast. Returns one
  // status per sequence: a sequence that fails (context full, budget, a hook's error) is left
  // as it was, and the others go on. B must be at most the first context's n_batch.
  static std::vector<Status> decode_batch(std::span<Context* const> ctxs, std::span<const int32_t> tokens);
  // decode_batch() and the next chunk of `prefill`'s pending decode call in ONE forward pass
  // over the weights (chunked prefill merged into the decode batch, as vLLM schedules it): the
  // chunk takes at most max_tokens (0: no cap) and at most the batch rows the B decode rows leave
  // free in the first context's n_batch. Every decode row gets what decode_batch() gives it, and
  // `prefill` what its decode_step(max_tokens) gives (same chunk length, cache, hooks, logits,
  // errors). A prefill that cannot share the pass (sequence-parallel, all-token logits, no free
  // rows, the first context's buffers smaller) runs as decode_batch() then decode_step(): the
  // same results, two passes. `prefill` must not be one of ctxs and must have a call pending.
  struct MixedResult {
    std::vector<Status> rows;  // per decode row, as decode_batch
    Expected<bool> prefill;    // as decode_step: true when the pending call is done
    bool merged = false;       // one pass (false: the fallback ran)
  };
  static MixedResult decode_mixed(std::span<Context* const> ctxs, std::span<const int32_t> tokens,
                                  Context& prefill, int64_t max_tokens);

  // Logits of output row i of the last decode() ([n_vocab]); row 0 for kLast.
  const float* logits(int64_t i = 0) const { return logits_.data() + i * hp_.n_vocab; }
  int64_t n_outputs() const { return n_outputs_; }
  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return params_.n_ctx; }
  int64_t n_batch() const { return params_.n_batch; }
  void clear() { truncate(0); }
  // Forgets every token after the first n.
  void truncate(int64_t n);
  // The tokens the cache holds, in order (after SpecPC: the selected prompt tokens).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // SpecPC: indices into the last compressed prompt of the tokens kept (empty: none ran).
  const std::vector<int32_t>& prompt_kept() const;

  // ---- hiding and restoring fragments (Sculptor's active context management) ----
  // Takes the tokens of sequence indices [first, first + count) out of the context: their K/V
  // rows leave the cache (KvCache::extract) and their ids leave tokens(), which stays "the
  // tokens the cache holds, in order". n_past() does not change: the next token still goes at
  // position n_past() (positions and sequence indices are never reused), so restoring later
  // puts every token back at its own position. Errors (context unchanged): an empty range, one
  // past n_past(), one overlapping a range already hidden; a press that accumulates attention
  // statistics of the forward passes (H2O's observer, kUnsupported): its per-token sums would
  // count queries that could not see the hidden tokens, so its scores would silently drift.
  // Presses without an observer and attached hooks keep working: a press may evict tokens
  // while a fragment is hidden (they are just absent), and its query window is indexed by
  // sequence index, which hiding does not change. Attention backends rebuild their summaries
  // (the cache's epochs move on).
  Expected<HiddenFragment> hide(int64_t first, int64_t count);
  // Puts a hidden fragment back (cache and tokens()), also after more tokens were decoded.
  // Errors (context unchanged, the fragment left usable for another try): the fragment is not
  // hidden in this context (restored already, or hidden by another context: its id), or the cache refuses it
  // (KvCache::insert: budget, shape). After a
  // truncate() into a hidden range, its tokens before the cut can still be restored; a range
  // wholly cut off is forgotten (restoring it is an error).
  Status restore(HiddenFragment&& fragment);
  // The ranges [first, first + count) hidden now, ascending.
  struct HiddenRange {
    int64_t first = 0, count = 0;
    uint64_t id = 0;  // HiddenFragment::id
  };
  const std::vector<HiddenRange>& hidden() const { return hidden_; }
  // Called after every forward chunk of a decode() with the tokens done and the call's total:
  // progress for long prompts, and cancellation (returning false stops the call with an
  // ErrorCode::kCancelled error; the chunks already evaluated stay in the cache). Empty: none.
  using ChunkCallback = std::function<bool(int64_t done, int64_t total)>;
  void set_chunk_callback(ChunkCallback cb) { on_chunk_ = std::move(cb); }
  // Seconds spent in press work since the context was last cleared (model/press_runner.h).
  double press_seconds() const;
  // Methods attached to the forward pass (model/forward_hooks.h), called in the order attached
  // after the press's runner; h must outlive the context or be detached.
  void attach_hooks(ForwardHooks* h) { hooks_.push_back(h); }
  void detach_hooks(ForwardHooks* h);
  // Runs tokens through the model at positions n_past() ... and takes them out of the cache
  // again: the hooks see their queries (on_queries) and their attention, n_past() and the cache
  // end as they were, on success and on error. SpecKV's lookahead.
  Status evaluate_scratch(std::span<const int32_t> tokens);

  // Saving and restoring a sequence (runtime::Session): the tokens, the cache, the logits of
  // the last decode, the press's schedule state and observation window, and qTTT's weights.
  // The attention backend is made afresh on load and rebuilds what it summarises of the cache.
  // Refused while a press accumulates attention statistics of the forward passes (H2O's
  // observer), which are not part of the cache, and while a fragment is hidden (it lives
  // outside the context: restore it first).
  Status save_state(std::ostream& out) const;
  // Into a context made with the same model and settings; on error the context is empty.
  Status load_state(std::istream& in);

  const Model& model() const { return model_; }
  const RopePlan& rope_plan() const { return *rope_plan_; }
  const KvCache& kv() const { return *kv_; }
  KvCache& kv() { return *kv_; }
  const AttentionBackend& attention() const { return *backend_; }
  AttentionBackend& attention() { return *backend_; }  // diagnostics: record_selection
  // Starts this (empty) context from the first n tokens of `src`, a context over the same
  // model, cache settings, block pool and methods: the full KV blocks of that prefix are shared
  // by reference, not recomputed (KvCache::adopt_prefix). Returns the tokens taken, a whole
  // number of blocks (0: fewer than a block in common). Refused (kUnsupported, this context
  // unchanged) when either context runs a press or other hooks (their state is not the cache's),
  // hides a fragment, uses a dynamic rope, has a decode call pending, or when this one is not
  // empty.
  Expected<int64_t> adopt_prefix(const Context& src, int64_t n);

  // Replaces the attention backend (a spec as --attn takes) for the tokens decoded next; the
  // cache is kept and the new backend builds what it summarises of it lazily. Benchmarks fill
  // a deep cache with a cheap backend and time another over it.
  Status set_attention(std::string_view spec);
  // The press attached to the forward pass (null: none), and its runner.
  const KvPress* press() const;
  const PressRunner* press_runner() const { return press_.get(); }
  // The answer budget of the request whose prompt is decoded next (its max new tokens; < 0:
  // none, the default): how far SpecKV's draft looks ahead with lookahead=answer. Kept until
  // set again (clear() keeps it).
  void set_answer_tokens(int64_t n);
  ThreadPool& pool() { return *pool_; }
  size_t activation_bytes() const;
  // qTTT (runtime/qttt.h): every layer's attn_q.weight is replaced, for the tokens decoded next,
  // by the f32 rows of wq: [n_layer, n_head * head_dim, n_embd]. The model's weights are never
  // written; clear_query_weights() goes back to them.
  void set_query_weights(Buffer<float> wq);
  void clear_query_weights();
  bool has_query_weights() const { return !wq_views_.empty(); }
  // Context parallelism (model/sequence_parallel.h; src/dist): from now on every decode call
  // runs as sp plans it; sp must outlive its use. Refused (an error that names why) with a
  // press, a dynamic rope, qTTT's weights, or an attention backend that cannot attend a cache
  // its queries are not in. Call on an empty context; null detaches.
  Status set_sequence_parallel(SequenceParallel* sp);
  bool sequence_parallel() const { return sp_ != nullptr; }

 private:
  // Refuses an attention that rotates cached keys with one table when a dynamic rope leaves
  // each key with its own (dynamic-ntk:cache=append).
  Status check_rope_backend(const AttentionBackend& b) const;
  Context(const Model& model, const ContextParams& p);
  // logits: [n_tokens or 1, n_vocab] destination of this chunk's output rows.
  // pos0: the position of tokens[0]. shard: the step of a sequence-parallel call (else null).
  Status forward_chunk(const int32_t* tokens, int64_t n, Logits which, float* logits, int64_t pos0,
                       const ShardStep* shard = nullptr);
  // decode_step() of a sequence-parallel context: the whole call, as sp_ plans it.
  Expected<bool> decode_sharded();
  // What decode_step() does after tokens [i, i + m) of the pending call went through the model
  // (n_past_ already advanced): records them, runs the hooks and the chunk callback.
  Expected<bool> finish_step(int64_t i, int64_t m);
  // decode_batch() with an optional prefill chunk of pf (decode_mixed); pf_m rows of it.
  static std::vector<Status> batch_forward(std::span<Context* const> ctxs, std::span<const int32_t> tokens,
                                           Context* pf, int64_t pf_m, Expected<bool>* pf_out);
  Status decode_impl(std::span<const int32_t> tokens, Logits which, bool context_part);
  // Biases, QK-norm and the rope plan's query scaling of one token's q, k, v rows of layer L.
  void prepare_qkv_row(const LayerWeights& L, float* qt, float* kt, float* vt, const int32_t* pos) const;
  // Layer il's attention for n rows of this context's tokens at positions pos, from their
  // projected q, k, v [n, *_dim]: the rows prepared, the query hooks, the K/V appended to the
  // cache, the backend over it into attn [n, n_head * head_dim_v], the attention hooks.
  // shard: a sequence-parallel step (forward_chunk), else null.
  Status attend_rows(int64_t il, const LayerWeights& L, int64_t n, float* q, float* k, float* v, const int32_t* pos,
                     float* attn, ThreadPool& pool, const ShardStep* shard = nullptr);

  // The decode() call in progress (begin_decode / decode_step).
  struct PendingDecode {
    bool active = false;
    std::vector<int32_t> tokens;  // what is evaluated (after SpecPC's selection)
    int64_t done = 0;             // tokens evaluated so far
    DecodeCall call;
  };
  PendingDecode pending_;

  const Model& model_;
  const HParams& hp_;
  ContextParams params_;
  std::unique_ptr<ThreadPool> own_pool_;  // null when ContextParams::pool is given
  ThreadPool* pool_ = nullptr;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<PressRunner> press_;  // null: no compression
  std::vector<ForwardHooks*> hooks_;    // the press's runner first, then those attached
  SequenceParallel* sp_ = nullptr;      // context parallelism (null: this process holds it all)
  std::vector<int32_t> tokens_;         // the tokens the cache holds (none of hidden_)
  std::vector<HiddenRange> hidden_;     // hidden ranges of sequence indices, ascending
  ChunkCallback on_chunk_;
  std::unique_ptr<RopePlan> rope_plan_;
  Buffer<float> wq_override_;         // qTTT: [n_layer, n_head * head_dim, n_embd]
  std::vector<TensorView> wq_views_;  // [n_layer] views of wq_override_; empty: the model's
  RopeTable rope_;        // the table in use (recomputed per chunk for dynamic scalings)
  int64_t n_past_ = 0;
  int64_t n_outputs_ = 0;

  // Activations for one chunk of at most n_batch tokens. The work of a layer before and after
  // its attention goes over sub-chunks of at most sub_rows_ rows (kLayerRows), so only the
  // residual stream, q, k, v and the attention output grow with the chunk: a ring shard of a
  // hundred thousand tokens is one chunk.
  static constexpr int64_t kLayerRows = 512;
  int64_t sub_rows_ = 0;  // min(n_batch, kLayerRows)
  std::vector<int32_t> shard_tokens_;  // decode_sharded: one step's tokens
  std::vector<std::pair<int64_t, int32_t>> shard_held_;  // decode_sharded: the call's held tokens
  Buffer<float> x_;      // [n_batch, n_embd] residual stream
  Buffer<float> cur_;    // [sub_rows, max(n_embd, q_dim)]
  Buffer<float> q_;      // [n_batch, n_head * head_dim]
  Buffer<float> k_;      // [n_batch, n_head_kv * head_dim]
  Buffer<float> v_;      // [n_batch, n_head_kv * head_dim_v]
  Buffer<float> attn_;   // [n_batch, n_head * head_dim_v]
  Buffer<float> gate_;   // [sub_rows, n_ff]
  Buffer<float> up_;     // [sub_rows, n_ff]
  Buffer<float> norm_;   // [threads, 8, n_embd]: each thread's normed rows in a decode-sized region
  std::vector<int32_t> pos_;  // [n_batch]
  std::vector<float> logits_; // [n_outputs, n_vocab]
  std::vector<float> batch_logits_;  // decode_batch's [B, n_vocab] when this context leads a batch
};

}  // namespace lc
