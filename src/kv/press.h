// KV presses: policies that decide which cached (layer, KV head, token) entries to keep.
// A press scores; the framework here selects; the cache alone mutates storage (retain()).
//
// Common frame (kvpress, Devoto et al. 2024; METHODS.md §2), applied per layer by compress():
//   1. score every held token of every head (a PressScorer: per query head or per KV head);
//   2. reduce per-query-head scores over the GQA group (reduce=mean|max) to one row per KV head;
//   3. protect the first n_sink tokens of the sequence and the last `window` held tokens;
//   4. keep the top entries per KV head (uniform), per layer with falling budgets (pyramidkv)
//      or per layer with head-wise budgets (adakv); ties go to the lower token index, so a run
//      is reproducible bit for bit;
//   5. kv.retain(il, h, keep): storage is compacted and freed blocks go back to the pool. Heads
//      may end with different lengths (the paged cache stores each head's tokens apart).
//
// Budget: ratio=r removes floor(r * n) of the n tokens the layer has seen (kvpress:
// n_kept = int(n * (1 - r))), or budget=B keeps B tokens per head. A head holding no more than
// n_sink + window tokens is never compressed. The protected tokens always stay, so a budget
// below n_sink + window keeps exactly n_sink + window.
//
// INTEGRATION CONTRACT (the model / runtime):
//
//   auto press = make_kv_press("snapkv:ratio=0.75,window=64", shape);   // once
//   const PressSchedule& s = (*press)->schedule();
//   // During prefill keep, per layer, the pre-RoPE queries of the last (*press)->n_obs()
//   // tokens appended ([n_obs, n_head, head_dim]) and their positions.
//   PressContext c{&kv, &pool};
//   for each layer il:
//     c.phase = PressPhase::kPrefill;   // or kChunk after each prefill chunk, kDecode
//     c.queries = q_obs[il]; c.query_pos = pos_obs; c.n_obs = n;
//     LC_TRY((*press)->compress(c, il));
//   - kPrefill: once, when the whole prompt is in (s.after_prefill). In query-agnostic mode
//     (s.query_aware == false) the runtime compresses after the context and BEFORE the
//     question is appended, so the question never steers the selection.
//   - kChunk: after every prefill chunk (s.per_chunk): the budget is enforced as the prompt
//     streams in, so peak memory stays bounded by budget + one chunk.
//   - kDecode: when s.decode_due(n_generated): compress back down to s.decode_target tokens.
//   compress() is a no-op in a phase the press's schedule does not include, so a chain can mix.
//   The observation queries are those of the LAST n_obs tokens appended to layer il (sequence
//   indices n_appended(il) - n_obs ... n_appended(il) - 1): causal masks use these indices.
//   Queries are rotated with kv.rope(il), the table the stored keys are rotated with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/method_info.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/attention_caps.h"
#include "kv/kv_cache.h"

namespace lc {

struct PressShape {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;
  float scale = 0.0f;  // on q.k; 0: 1/sqrt(head_dim)
};

enum class PressPhase { kPrefill, kChunk, kDecode };

// The model's attention output projection W_o, for presses that weigh a value by what it adds to
// the layer's output (CriticalKV's ||W_o v||_1). The model runtime implements it (press_runner.cpp)
// and dequantises a layer's matrix on first use; tests give their own.
class OutputProjection {
 public:
  virtual ~OutputProjection() = default;
  virtual int64_t n_embd() const = 0;
  // W_o of layer il as f32, row-major [n_embd][n_head * head_dim_v] (row r: output feature r;
  // columns h * head_dim_v ... of query head h). Valid while the projection lives.
  virtual const float* layer(int64_t il) = 0;
};

struct PressContext {
  KvCache* kv = nullptr;
  ThreadPool* pool = nullptr;       // scratch parallelism over heads; may be null (serial)
  PressPhase phase = PressPhase::kPrefill;
  const float* queries = nullptr;   // [n_obs, n_head, head_dim] pre-RoPE, layer il
  const int32_t* query_pos = nullptr;  // [n_obs]
  int64_t n_obs = 0;                // may be less than the press's n_obs() (short prompt)
  // [n_obs] sequence index of each query; null: the last n_obs tokens appended (the default
  // contract). SpecKV gives it: its lookahead queries come from draft tokens that were run
  // through the model and removed from the cache again, so they lie after n_appended(il).
  const int32_t* query_seq = nullptr;
  // SpecKV's lookahead: the LAST n_lookahead of the n_obs queries are those of draft tokens run
  // through the model after the prompt (sequence indices from query_seq), and lookahead_keys
  // [n_head_kv, n_lookahead, head_dim] are the keys those tokens had in layer il, post-RoPE as
  // the cache stores keys. The tokens are no longer in the cache; a press that looks ahead
  // puts their keys in its softmax (the authors score with them present), the others never
  // see them (a chain hands the lookahead queries and keys to its look-ahead parts only).
  int64_t n_lookahead = 0;
  const float* lookahead_keys = nullptr;
  OutputProjection* out_proj = nullptr;  // W_o per layer (criticalkv); null: no model attached
};

// PressScorer::lookahead() / KvPress::lookahead(): look ahead by the request's answer budget
// (its max new tokens; SpecKV's default, as the authors' configs: lookahead_tokens = null).
inline constexpr int64_t kLookaheadAnswer = -1;

// When the model calls compress().
struct PressSchedule {
  bool after_prefill = true;    // once, when the prompt is in
  bool per_chunk = false;       // after every prefill chunk (chunk=1)
  int64_t decode_interval = 0;  // every N generated tokens (interval=N); 0: never
  int64_t decode_target = 0;    // ... back down to this many tokens per head (target=T)
  bool query_aware = true;      // query=aware|agnostic (see the contract above)
  bool decode_due(int64_t n_generated) const {
    return decode_interval > 0 && n_generated > 0 && n_generated % decode_interval == 0;
  }
  bool covers(PressPhase p) const {
    return p == PressPhase::kPrefill ? after_prefill
         : p == PressPhase::kChunk   ? per_chunk
                                     : decode_interval > 0;
  }
};

// Attention statistics of the real forward passes (H2O's cumulative attention). The model calls
// observe() after each layer's attention, for prefill chunks and decode steps alike, but only
// when the active press returns an observer (no cost otherwise). The observer recomputes the
// exact softmax rows of those queries over the tokens the layer's heads held at that moment
// (press_observer.cpp); from the attention backend it takes at most each row's log-sum-exp,
// which the dense backend keeps on request (AttentionBackend::row_lse).
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  // Layer il has just attended n queries: q [n, n_head, head_dim] pre-RoPE, at positions q_pos
  // and sequence indices q_seq; kv holds what they attended (their own keys included).
  // row_lse: [n, n_head] each row's log-sum-exp over every token it could see, from a dense
  // backend (AttentionBackend::row_lse), or null: the observer then computes it itself.
  virtual void observe(const KvCache& kv, int64_t il, const float* q, const int32_t* q_pos,
                       const int32_t* q_seq, int64_t n, ThreadPool* pool, const float* row_lse) = 0;
  // The sequence was cut back to n_seq tokens: statistics of tokens >= n_seq are dropped.
  virtual void truncate(int64_t n_seq) = 0;
};

// SpecPC's parameters (press_spec.cpp): the press compresses the PROMPT before the model
// prefills it, from a draft model's attention; the model runtime does the work.
struct PromptCompression {
  double ratio = -1;        // fraction of the prompt removed (< 0: budget given)
  int64_t budget = -1;      // prompt tokens kept (< 0: ratio given)
  int64_t window = 64;      // last prompt tokens always kept; also the draft's observation queries
  int64_t lookahead = 8;    // tokens the draft generates; its queries of the first lookahead-1 count
  int64_t kernel = 64;      // max-pool size over the sequence
  int64_t neighbours = 64;  // tokens kept around each selected one
  int64_t start_layer = 8;  // draft layers >= this vote (clamped to the draft's last layer)
  bool weighted = true;     // window queries weighted linearly 0..1 (later queries count more)
  bool reduce_max = true;   // max (the authors' default) or sum over layers, heads and queries
  int64_t kept(int64_t n_prompt) const;  // prompt tokens kept for a prompt of n_prompt
};

// One layer's scores (higher = keep). A scorer fills ONE of the two: per query head (the
// framework reduces over the group) or per KV head.
struct PressScores {
  std::vector<std::vector<float>> by_query_head;  // [n_head][n_tokens(il, h / group)]
  std::vector<std::vector<float>> by_kv_head;     // [n_head_kv][n_tokens(il, h)]
};

// The scoring half of a press (what differs between methods).
class PressScorer {
 public:
  virtual ~PressScorer() = default;
  virtual std::string name() const = 0;
  virtual std::string params() const { return ""; }  // "key=value,..." of its own keys
  // Observation queries wanted (the last n_obs tokens' pre-RoPE queries); 0: none.
  virtual int64_t n_obs() const { return 0; }
  // Default protected recent window when the spec gives none.
  virtual int64_t default_window() const { return n_obs(); }
  virtual int64_t default_sinks() const { return 0; }
  virtual bool default_reduce_max() const { return false; }
  // Draft tokens whose target queries (and keys) the press scores with (SpecKV): the model
  // generates them with the draft, runs them through itself, scores, then removes them.
  // 0: none; > 0: that many; kLookaheadAnswer: the request's answer budget. n_obs() counts the
  // prompt's observation queries only; the lookahead queries come on top (PressContext).
  virtual int64_t lookahead() const { return 0; }
  // SpecKV's sparse prefill (prefill=sparse): the attention spec the prompt and the draft's
  // answer are evaluated with, in one pass, given the scoring window (the last n_obs prompt
  // tokens and the answer's); "": the prompt is prefilled by the context's own backend.
  virtual std::string prefill_attention(int64_t window) const { (void)window; return ""; }
  // Non-null: feed it the real attention of every forward pass (H2O).
  virtual AttentionObserver* observer() { return nullptr; }
  virtual Status score(const PressContext& c, int64_t il, const PressShape& shape, PressScores& s) = 0;
};

class KvzipReconstruction;  // kv/press_kvzip.h

class KvPress {
 public:
  virtual ~KvPress() = default;
  // The press's name and full parameter list, e.g. "snapkv:ratio=0.75,n_sink=0,window=64,...".
  virtual std::string spec() const = 0;
  virtual const PressSchedule& schedule() const = 0;
  // Observation queries the model must keep per layer (0: none).
  virtual int64_t n_obs() const = 0;
  bool needs_queries() const { return n_obs() > 0; }
  // Feeds of the real forward pass (see AttentionObserver); null: none wanted.
  virtual AttentionObserver* observer() { return nullptr; }
  // SpecKV: draft tokens to look ahead with before the after-prefill compression (0: none;
  // kLookaheadAnswer: the request's answer budget; see PressScorer::lookahead).
  virtual int64_t lookahead() const { return 0; }
  // SpecKV's sparse prefill: see PressScorer::prefill_attention.
  virtual std::string prefill_attention(int64_t window) const { (void)window; return ""; }
  // Whether the prompt is prefilled with prefill_attention() (SpecKV's prefill=sparse).
  bool sparse_prefill() const { return !prefill_attention(1).empty(); }
  // SpecPC: non-null when the press compresses the prompt before prefill (with a draft model).
  virtual const PromptCompression* prompt_compression() const { return nullptr; }
  // KVzip: non-null when the press scores by context reconstruction (kv/press_kvzip.h): the
  // runtime runs the reconstruction prompts through the model after the context, then compress().
  virtual KvzipReconstruction* reconstruction() { return nullptr; }
  // Whether the press needs a draft model (speckv, specpc).
  bool needs_draft() const { return lookahead() != 0 || prompt_compression() != nullptr; }
  // An attention backend the press cannot work with (error naming both), e.g. h2o's observer
  // recomputes dense attention, which a sparse backend does not compute.
  virtual Status check_backend(const AttentionCaps& attn) const { (void)attn; return ok_status(); }
  // Computes the keep lists of layer il without touching the cache:
  // keep[h] ascending indices into head (il, h)'s tokens. Empty outer vector: nothing to do.
  virtual Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) = 0;
  // select() then kv.retain() for every head whose list is shorter than its length.
  virtual Status compress(const PressContext& c, int64_t il);
};

// The registry: "name[:key=value,...][+name[:...]]". The presses are listed once, one line each,
// in kv/press_list.h (adakv's inner=NAME wraps any scorer; speckv and specpc need a draft model,
// given to the model's Context). Errors name the press or key and list what is accepted.
Expected<std::unique_ptr<KvPress>> make_kv_press(std::string_view spec, const PressShape& shape);
// Names the registry accepts, with one line of help each (for --help), in the list's order.
std::vector<std::pair<std::string, std::string>> kv_press_methods();

// One registry entry, as kv/press_list.h declares it, with the keys its spec accepts.
struct PressMethodInfo {
  std::string name;
  std::string help;   // the line kv_press_methods() gives
  std::string paper;  // citation
  bool scorer = false;  // a plain scorer (usable as adakv's inner=); else pyramidkv, adakv, specpc
  // Every key the spec accepts, the common ones (ratio, budget, window, ...) included, in the
  // order the parser reads them; read off the parser itself, so it cannot drift. adakv's are
  // those with its default inner scorer.
  std::vector<std::string> keys;
  std::vector<MethodKey> key_info;  // the same keys with type, default and range
};
std::vector<PressMethodInfo> kv_press_method_info();

}  // namespace lc
