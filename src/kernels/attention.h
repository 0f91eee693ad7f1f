// Causal attention over a contiguous per-head KV layout, tiled with an online softmax
// (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022) so no n x n score matrix is
// ever materialised.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace lc::kernels {

struct AttnShape {
  int64_t n_tokens = 0;    // queries in this chunk
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;    // q/k
  int64_t head_dim_v = 0;
  int64_t kv_stride = 0;   // slots per head in k/v (the cache capacity)
  int64_t n_past = 0;      // query t sits at cache slot n_past + t and sees slots [0, n_past + t]
  float scale = 1.0f;      // applied to q.k
};

// q:   [n_tokens, n_head, head_dim]
// k:   [n_head_kv, kv_stride, head_dim]
// v:   [n_head_kv, kv_stride, head_dim_v]
// out: [n_tokens, n_head, head_dim_v]
// Query head h reads KV head h / (n_head / n_head_kv).
void attention_causal(const AttnShape& s, const float* q, const float* k, const float* v,
                      float* out, ThreadPool& pool);

namespace ref {
// Materialises the scores in double: the oracle for attention_causal.
void attention_causal(const AttnShape& s, const float* q, const float* k, const float* v,
                      float* out);
}  // namespace ref

}  // namespace lc::kernels
