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

#include "core/status.h"
#include "core/thread_pool.h"
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

struct PressContext {
  KvCache* kv = nullptr;
  ThreadPool* pool = nullptr;       // scratch parallelism over heads; may be null (serial)
  PressPhase phase = PressPhase::kPrefill;
  const float* queries = nullptr;   // [n_obs, n_head, head_dim] pre-RoPE, layer il
  const int32_t* query_pos = nullptr;  // [n_obs]
  int64_t n_obs = 0;                // may be less than the press's n_obs() (short prompt)
};

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

// Optional: attention statistics fed by the attention path during forward (H2O's column sums,
// TOVA's last-query attention over the whole prompt). Not fed by any backend yet: the
// observed-attention presses compute the same statistics from the observation window queries
// (see press_h2o.cpp). A backend that supports it calls observe() once per (layer, query head,
// query) with the softmax row over the head's held tokens.
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  // probs: [n_keys] over the tokens of KV head h / group held at the time, in storage order;
  // q_seq: the query's sequence index.
  virtual void observe(int64_t il, int64_t q_head, int32_t q_seq, const float* probs, int64_t n_keys) = 0;
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
  virtual Status score(const PressContext& c, int64_t il, const PressShape& shape, PressScores& s) = 0;
};

class KvPress {
 public:
  virtual ~KvPress() = default;
  // The press's name and full parameter list, e.g. "snapkv:ratio=0.75,n_sink=0,window=64,...".
  virtual std::string spec() const = 0;
  virtual const PressSchedule& schedule() const = 0;
  // Observation queries the model must keep per layer (0: none).
  virtual int64_t n_obs() const = 0;
  bool needs_queries() const { return n_obs() > 0; }
  virtual AttentionObserver* observer() { return nullptr; }
  // Computes the keep lists of layer il without touching the cache:
  // keep[h] ascending indices into head (il, h)'s tokens. Empty outer vector: nothing to do.
  virtual Status select(const PressContext& c, int64_t il, std::vector<std::vector<int32_t>>& keep) = 0;
  // select() then kv.retain() for every head whose list is shorter than its length.
  virtual Status compress(const PressContext& c, int64_t il);
};

// The registry: "name[:key=value,...][+name[:...]]". Presses: streaming_llm, snapkv, pyramidkv,
// h2o, tova, knorm, expected_attention, random, adakv (inner=NAME wraps any scorer).
// Errors name the press or key and list what is accepted.
Expected<std::unique_ptr<KvPress>> make_kv_press(std::string_view spec, const PressShape& shape);
// Names the registry accepts, with one line of help each (for --help).
std::vector<std::pair<std::string, std::string>> kv_press_methods();

}  // namespace lc
