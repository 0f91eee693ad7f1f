// Context parallelism over MPI: each process holds a contiguous shard of one sequence's tokens
// and of its KV cache, so the cache of each process is about 1/N of the whole.
//
// ring (exact): the prompt is split into N shards, one per rank, each evaluated as one chunk.
//   In every layer the shards' keys and values pass around the ring (N - 1 steps) while each
//   rank attends its queries over every earlier shard it receives; the partial outputs merge
//   with their log-sum-exps (the online softmax of the dense backend), so the result is causal
//   attention over the whole prompt (Liu et al. 2023, "Ring Attention with Blockwise
//   Transformers for Near-Infinite Context").
//   split=contiguous: rank r holds the r-th of N equal runs. The causal mask leaves rank r
//   r + 1 blocks of attention to do, so the last rank sets the pace.
//   split=zigzag (the default): the prompt is cut into 2N pieces and rank r holds pieces r and
//   2N - 1 - r, evaluated as one chunk. In a ring step, a block from an earlier rank j < r is
//   seen by all of r's queries through its early piece only (its late piece comes after both
//   of r's); a block from a later rank j > r is seen whole by r's late piece only. Either is
//   half a block of work, so every rank does the same work in every step (the load-balanced
//   split of Megatron-LM's context parallelism and of zhuzilin/ring-flash-attention).
// star (approximate): Star Attention (Acharya et al. 2024, "Star Attention: Efficient LLM
//   Inference over Long Sequences"). Phase 1: the context (the prompt without its query) is
//   split into blocks, one per rank, `block` tokens each (the paper's block size) or `blocks`
//   of equal size, and each
//   rank takes a run of them; every block but the first is evaluated after the anchor (the
//   first block) and alone (the rank's earlier blocks set aside), and the anchor's keys and
//   values are dropped: local attention only, no communication. Phase 2: the query attends every rank's cache; each rank sends only its
//   partial output and log-sum-exp per head, and the merge is exact.
// Decoding, in both: every rank runs the new token's forward pass; it attends each rank's shard
// (dense, fixed, quest or quest_fast attention) and the partials merge as in phase 2. With
// quest, each rank pages its own shard from its first token and its query heads choose their
// pages among them, with the budget per shard (N ranks read up to N x budget keys per head).
// The last rank stores the query and the generated tokens. Every rank merges the gathered partials in rank order, so all
// of them compute the same bits and sample the same tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "dist/comm.h"
#include "model/context.h"
#include "model/sequence_parallel.h"

namespace lc::dist {

enum class CpMode { kRing, kStar };

struct CpParams {
  CpMode mode = CpMode::kRing;
  bool zigzag = true;  // ring: split=zigzag (else contiguous shards)
  int64_t anchor = 0;  // star: tokens of the anchor block (0: the first context block, as the paper)
  int64_t block = 0;   // star: tokens per context block (0: blocks=, else one block per rank)
  int64_t blocks = 0;  // star: context blocks of equal size (0: block=, else one per rank)
  std::string spec() const;
};

// "ring[:split=zigzag|contiguous]" or "star[:anchor=A,block=B|blocks=K]"; errors name the mode or key.
Expected<CpParams> parse_cp(std::string_view spec);

struct CpStats {
  int64_t shard_first = 0, shard_end = 0;  // this rank's tokens of the first prompt
  int64_t tail_first = 0, tail_end = 0;    // and its second run of them (zigzag), else empty
  int64_t shard_tokens() const { return shard_end - shard_first + tail_end - tail_first; }
  // The first prompt's (query, key) pairs this rank attended in one layer. Ring: its own shard's
  // causal pairs and the other ranks' blocks' (over all ranks, n (n + 1) / 2). Star, phase 1:
  // each of its blocks after its anchor, T (T + 1) / 2 for T = anchor + block tokens.
  int64_t prefill_pairs = 0;
  int64_t star_blocks = 0;  // star: this rank's context blocks
  double t_comm = 0;  // seconds in ring steps and gathers: the transfers and the waits for other ranks
  uint64_t bytes_sent = 0;
};

class ContextParallel final : public SequenceParallel {
 public:
  // Attaches itself to ctx (Context::set_sequence_parallel); comm and ctx must outlive it.
  static Expected<std::unique_ptr<ContextParallel>> create(Comm& comm, const CpParams& p, Context& ctx);
  ~ContextParallel() override;

  // Star: the last q tokens of the first prompt are the query, attended in phase 2 (default 1:
  // the prompt's last token). Ring ignores it.
  void set_query_tokens(int64_t q) { n_query_ = q; }

  Expected<ShardPlan> plan(int64_t n, const DecodeCall& call) override;
  Status merge_attention(Context& ctx, int64_t il, int64_t n, const float* q, const float* k, const float* v,
                         const int32_t* pos, float* out, const float* lse) override;
  Status share_logits(float* logits, int64_t n_vocab, bool have) override;
  void on_truncate(int64_t n) override;

  const CpStats& stats() const { return stats_; }
  const CpParams& params() const { return p_; }

 private:
  ContextParallel(Comm& comm, const CpParams& p, Context& ctx) : comm_(comm), p_(p), ctx_(ctx) {}
  Status ring_merge(int64_t il, int64_t n, const float* q, const float* k, const float* v, const int32_t* pos,
                    float* out);
  Status gather_merge(int64_t n, float* out);
  // Rows [r0, r0 + n) of the step's queries q (positions qpos) attend a block of m keys and
  // values from another rank, all of them visible, and the partial result merges into rows
  // [r0, r0 + n) of (out, lse_).
  Status attend_block(int64_t il, int64_t r0, int64_t n, const float* q, const int32_t* qpos, int64_t m,
                      const float* k, const float* v, const int32_t* kpos, float* out);
  // Ring shard j's pieces: early [a, b) and late (zigzag) [c, d), else c = d.
  void ring_pieces(int j, int64_t* a, int64_t* b, int64_t* c, int64_t* d) const;

  Comm& comm_;
  CpParams p_;
  Context& ctx_;
  int64_t n_query_ = 1;
  int64_t n_global_ = 0;      // tokens of the sequence so far (all ranks)
  bool broken_ = false;       // cut back in the middle: the shards no longer make a sequence
  bool ring_call_ = false;    // the call in progress is a ring prompt
  // ring: contiguous: shard r is [cuts_[r], cuts_[r + 1]); zigzag: piece p is [cuts_[p],
  // cuts_[p + 1]) of 2N, and rank r holds pieces r and 2N - 1 - r.
  std::vector<int64_t> cuts_;
  int ring_root_ = 0;         // the rank that evaluates the ring prompt's last token
  std::vector<float> lse_;    // [n, n_head] this rank's running log-sum-exp
  std::vector<float> send_, recv_, part_;
  std::unique_ptr<KvCache> scratch_;             // one remote block of one layer
  std::unique_ptr<AttentionBackend> scratch_be_;
  CpStats stats_;
};

}  // namespace lc::dist
