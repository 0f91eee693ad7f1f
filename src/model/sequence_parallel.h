// Context parallelism (src/dist): one sequence's cache spread over several processes, each
// Context holding a shard of it (one or two runs of its tokens). A Context with a SequenceParallel attached asks it
// how to run each decode call (which of the call's tokens this process evaluates, at which
// positions, whether it stores their keys and values), and in every layer of a step that needs
// it lets it merge the attention the other processes compute over their shards into this one's.
// The forward pass stays the Context's own: ring attention and Star Attention differ only in
// the plans and the merges src/dist makes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/forward_hooks.h"

namespace lc {

class Context;

// One forward chunk of a decode call on this process.
struct ShardStep {
  int64_t first = 0, count = 0;  // tokens [first, first + count) of the call
  int64_t pos0 = 0;              // the position of token `first` (the next ones follow)
  // A second run of the call's tokens, [tail_first, tail_first + tail_count), evaluated after
  // the first in the same chunk, at positions pos0 + (i - first) for its token i (a ring's
  // zig-zag shard: an early and a late piece of the prompt). count + tail_count rows in all.
  int64_t tail_first = 0, tail_count = 0;
  // Their keys and values go into this cache. Otherwise they are queries only: they attend
  // every token the cache holds (AttentionBackend::set_detached) and leave nothing behind.
  bool store = true;
  bool merge = false;  // SequenceParallel::merge_attention runs in every layer of this step
  // Before this step, in this order (offsets count the call's stored tokens in the order its
  // steps stored them, dropped and set-aside ones included: the sequence indices from the call's
  // first):
  //  * [drop_first, drop_first + drop_count) leave the cache (Star Attention's anchor block,
  //    once the block after it is evaluated);
  //  * [hide_first, hide_first + hide_count) are set aside (a rank's earlier context blocks,
  //    which its next block must not see);
  //  * with restore, every token set aside comes back in its place.
  int64_t drop_first = 0, drop_count = 0;
  int64_t hide_first = 0, hide_count = 0;
  bool restore = false;
};

struct ShardPlan {
  std::vector<ShardStep> steps;  // in order; each is one forward chunk (count <= n_batch)
};

class SequenceParallel {
 public:
  virtual ~SequenceParallel() = default;
  // The plan of a decode call of n tokens (every process is given the same call).
  virtual Expected<ShardPlan> plan(int64_t n, const DecodeCall& call) = 0;
  // Layer il of a merge step of n tokens: q (pre-RoPE, scaled), k and v (pre-RoPE) are the
  // step's rows and pos their positions; out [n, n_head, head_dim_v] and lse [n, n_head] hold
  // this process's attention over its own cache (lse: AttentionBackend::partial_lse). On return
  // out holds the attention over the whole sequence, the same on every process that needs it.
  virtual Status merge_attention(Context& ctx, int64_t il, int64_t n, const float* q, const float* k,
                                 const float* v, const int32_t* pos, float* out, const float* lse) = 0;
  // After a call that wants logits: `have` says whether this process computed the logits of
  // the call's last token. On return every process holds the same ones.
  virtual Status share_logits(float* logits, int64_t n_vocab, bool have) = 0;
  // The context was cut back to its first n sequence indices (Context::truncate; 0: cleared).
  virtual void on_truncate(int64_t n) {}
};

}  // namespace lc
