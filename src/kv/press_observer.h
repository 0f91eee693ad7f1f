// H2O's statistics from the real forward passes (Zhang et al., "H2O: Heavy-Hitter Oracle for
// Efficient Generative Inference of Large Language Models", NeurIPS 2023): for every
// (layer, KV head, token j) the attention the token has received so far,
//   sum_j = sum over queries t that could see j, over the query heads hq of the GQA group:
//           softmax_j(rope(q_t,hq) . k_j * scale)   (over the tokens the head held at t)
//   cnt_j = #{queries t that could see j}
// so that sum_j / (g * cnt_j) is H2O's score with causal normalisation (kvpress's
// ObservedAttentionPress divides by the number of queries that could attend the key; without
// it the oldest tokens win by age alone).
//
// The probabilities are recomputed exactly from the cached (post-RoPE) keys and the layer's
// pre-RoPE queries rotated with kv.rope(il): the same q.k, scale and causal visibility as a
// dense backend, with SIMD dot and exp kernels. Queries go in tiles of a few tokens x the GQA
// group, each tile walking the head's keys one KV block at a time, so a block is read once per
// tile instead of once per query row. The softmax denominators come from the dense backend
// (its row log-sum-exp, AttentionBackend::row_lse) when it hands them over, so one pass of
// O(n_queries * n_held * head_dim) per query head suffices; otherwise a first pass computes
// them. Only when a press asks for it.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/press.h"

namespace lc {

class AttentionAccumulator final : public AttentionObserver {
 public:
  explicit AttentionAccumulator(const PressShape& s);
  void observe(const KvCache& kv, int64_t il, const float* q, const int32_t* q_pos, const int32_t* q_seq,
               int64_t n, ThreadPool* pool, const float* row_lse) override;
  void truncate(int64_t n_seq) override;
  // Indexed by sequence index; tokens never observed read 0.
  float sum(int64_t il, int64_t h, int64_t seq) const;
  float count(int64_t il, int64_t seq) const;
  int64_t n_query_heads_per_kv() const { return shape_.n_head / shape_.n_head_kv; }

 private:
  // Query slices per call (units of parallel work per KV head) and query rows per tile.
  static constexpr int64_t kSlices = 8;
  static constexpr int64_t kTileRows = 48;
  PressShape shape_;
  std::vector<std::vector<float>> sum_;  // [n_layer * n_head_kv][seq]
  std::vector<std::vector<float>> cnt_;  // [n_layer][seq]
  std::vector<float> qr_;                // scratch: rotated, scaled queries of one call
  std::vector<std::vector<float>> part_; // scratch: per (KV head, slice) column sums of one call
};

}  // namespace lc
