// Attention backends: one layer's attention for a chunk of queries over the paged KV cache.
//
// INTEGRATION CONTRACT (per layer il, for a chunk of n tokens at positions pos[0..n)):
//
//   auto be = make_attention_backend("quest:budget=2048,page=16", shape);   // once
//   LC_TRY((*be)->attach(kv));                                             // once, after the cache exists
//   ...
//   LC_TRY(kv.append(il, n, k, v, pos));          // k: [n, n_head_kv, head_dim] pre-RoPE
//                                                 // v: [n, n_head_kv, head_dim_v]
//   LC_TRY(be->forward(il, n, q, pos, kv, out, pool));
//                                                 // q:   [n, n_head, head_dim] pre-RoPE
//                                                 // out: [n, n_head, head_dim_v]
//
// * append() must come first: the chunk's queries are the last n tokens appended to layer il.
//   Query t sees the tokens appended before it and itself (causal); tokens evicted from a
//   head are not seen.
// * forward() rotates q itself with kv.rope(il) (the table the layer's keys are rotated with;
//   for dynamic NTK the cache has already re-rotated its keys if the table changed), and
//   scales scores by shape.scale (default 1/sqrt(head_dim)).
// * Query head h reads KV head h / (n_head / n_head_kv).
// * A backend may mutate the cache only through the cache's API (streaming evicts tokens
//   outside sinks + window; that is why kv is not const).
// * forward() does not allocate per token: per-call scratch is sized by n and the context.
// * Errors are values; a backend never throws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/method_info.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/attention_caps.h"
#include "kv/kv_cache.h"

namespace lc {

struct AttnShape {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;
  float scale = 0.0f;  // on q.k; 0: 1/sqrt(head_dim)
  int64_t fixed_distance = 0;  // the model's trained distance ceiling (attention `fixed`), 0: none
};

// One key a query attended: the score was rope(q, q_pos) . rope(k, k_pos) * scale, where q
// and k are the pre-RoPE vectors. Recorded only when record_selection(true) (tests): "naive
// attention restricted to exactly the selected tokens" is the oracle of sparse backends.
struct SelectedKey {
  int32_t seq_index;  // the token's index in the sequence (KvCache::seq_index)
  int32_t q_pos;
  int32_t k_pos;
};

struct Selection {
  int64_t il = -1, n = 0, n_head = 0;
  std::vector<std::vector<SelectedKey>> keys;  // [n * n_head], row t * n_head + h, ascending seq_index
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  // The method's name and its full parameter list, e.g. "quest:budget=2048,page=16,dense_layers=2".
  virtual std::string spec() const = 0;
  // What the backend does with the cache (typed; see kv/attention_caps.h). The default claims
  // nothing: a backend is taken to read a subset of the keys unless it says otherwise.
  virtual AttentionCaps caps() const { return AttentionCaps{spec()}; }

  // Checks the cache against the method (shapes, block sizes) and installs what the method
  // needs from it (an evictor). Call once after the cache is created, and again to hand the
  // cache to another backend: attaching removes the evictor the backend before installed.
  virtual Status attach(KvCache& kv);

  // q: [n, n_head, head_dim] pre-RoPE; pos: [n]; out: [n, n_head, head_dim_v].
  virtual Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv,
                         float* out, ThreadPool& pool) = 0;

  const AttnShape& shape() const { return shape_; }

  // Tests: record which tokens every query head attended in the next forward() calls.
  void record_selection(bool on) { record_ = on; }
  const Selection& selection() const { return selection_; }

  // With keep_row_lse(true), a backend whose rows attend every visible token (dense) keeps the
  // log-sum-exp of each row's scores from its last forward(): [n, n_head], row t * n_head + h
  // (-inf for a row that saw no token). H2O's observer normalises its probabilities with it
  // instead of recomputing the softmax denominators. Null for every other backend.
  void keep_row_lse(bool on) { keep_lse_ = on; }
  virtual const float* row_lse() const { return nullptr; }

  // Context parallelism (src/dist), where each process caches one shard of the sequence:
  // * set_detached(true): the next forward() calls' queries are not in this cache (another
  //   process holds them and their keys), so each query sees every cached token of its KV head
  //   and forward() needs no appended chunk. A backend that cannot do that refuses the call.
  // * keep_partial_lse(true): partial_lse() gives each row's log-sum-exp over the keys it
  //   attended in the last forward(), as the backend scored them: [n, n_head], -inf for a row
  //   that attended none. Two partial outputs of one row merge exactly with it.
  // Dense, fixed, quest and quest_fast support both.
  void set_detached(bool on) { detached_ = on; }
  bool detached() const { return detached_; }
  void keep_partial_lse(bool on) { keep_partial_ = on; }
  virtual const float* partial_lse() const { return nullptr; }
  virtual bool supports_detached() const { return false; }

 protected:
  explicit AttentionBackend(const AttnShape& s);
  // The caps of an exact softmax over every visible key (dense, naive).
  AttentionCaps exact_caps() const {
    AttentionCaps c{spec()};
    c.exact = c.reads_all_keys = true;
    return c;
  }
  Status check_call(int64_t il, int64_t n, const KvCache& kv) const;

  AttnShape shape_;
  bool record_ = false;
  bool keep_lse_ = false;
  bool keep_partial_ = false;
  bool detached_ = false;
  Selection selection_;
};

// The registry: "name" or "name:key=value,key=value". Methods: naive, dense (the default),
// streaming, quest, infllm, dssa, lychee. Errors name the method or key and list what is
// accepted.
Expected<std::unique_ptr<AttentionBackend>> make_attention_backend(std::string_view spec,
                                                                   const AttnShape& shape);
// `spec` with the keys that size its read set chosen so that a decoded token reads n key
// positions per query head (`bench speed --budget N`, to compare methods at equal budgets);
// its other keys are kept. Exact methods (dense, naive) are returned unchanged: they are the
// baseline and read every key. Errors for a method with no read budget (fixed: a distance
// ceiling), for n below 512 or not a multiple of 256, and for a key the budget sets that the
// spec also gives. docs/attention.md lists what each method is set to.
Expected<std::string> equal_budget_spec(std::string_view spec, int64_t n);
// Names the registry accepts, with one line of help each (for --help).
std::vector<std::pair<std::string, std::string>> attention_methods();
// Each method with its keys, types, defaults and ranges, read off its factory (the `fixed`
// distance's default shown is that of a model trained with a ceiling of 64).
std::vector<MethodInfo> attention_method_info();

}  // namespace lc
