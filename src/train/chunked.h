// Chunk-recurrent training, after OOMB ("Out of the Memory Barrier: A Highly Memory Efficient
// Training System for LLMs with Million-Token Contexts", Li et al., 2026; seeds/002).
//
// A window of n tokens is processed as chunks of C tokens. The forward pass runs the chunks in
// order and keeps, of everything it computes, only each layer's rotated keys and values, in a
// paged pool; chunk c attends over the pooled K/V of positions [0, end of c). The backward pass
// walks the chunks in reverse: it recomputes chunk c's forward (its inputs are its tokens and the
// pooled K/V of earlier chunks, so the recomputation is exact), backpropagates through it, and
// adds attention's gradient with respect to every pooled key and value it read into a gradient
// pool of the same pages:
//     dK_j += sum over chunk-c queries i >= j of scale * dS_ij q_i,   dV_j += sum P_ij dO_i.
// When chunk c is reached, the later chunks have already added their share to its own rows, so
// its dK/dV are complete and go through inverse RoPE and the k/v projections into the parameter
// gradients. Activation memory is that of one chunk (no [T, T] matrix: attention runs over
// blocks of 64 queries by one page of keys with an online softmax, and the backward pass
// recomputes the probabilities from the saved row log-sum-exp); what grows with n is the K/V pool
// and its gradient, 4 * n_layer * n_head_kv * head_dim * sizeof(T) bytes per token.
//
// Not done here (OOMB also has them): offloading pages to host memory (everything is host memory
// here) and page-level sparse attention.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "train/block.h"
#include "rope/rope_table.h"
#include "train/transformer.h"

namespace lc::train {

// Keys and values of every layer in fixed-size pages of page_tokens rows. A page holds
// [2, page_tokens, kv_dim]: the keys, then the values of one layer. Pages, not one contiguous
// [n_layer, n, kv_dim] buffer: the pool grows with the sequence a page at a time without
// reallocating and copying what it holds (a grown contiguous buffer would briefly need old +
// new), released pages are kept and reused so steps after the first do not allocate, and a page
// is the unit that attention reads (one key block per page) and that offloading or page-level
// sparse attention would move or skip.
template <class T>
class PagedKv {
 public:
  PagedKv(int64_t n_layer, int64_t kv_dim, int64_t page_tokens);

  // Allocates (free) pages until rows [0, n_tokens) of every layer could be held without
  // allocating again; an out-of-memory is an error.
  Status reserve(int64_t n_tokens);
  // Makes rows [0, n_tokens) of every layer addressable, taking pages from the free list or
  // allocating them. With zero = true, the pages it takes are zeroed.
  void ensure(int64_t n_tokens, bool zero);
  // Returns every page to the free list (kept allocated for the next sequence).
  void release();

  int64_t page_tokens() const { return page_; }
  int64_t n_tokens() const { return n_tok_; }
  // [page_tokens, kv_dim] keys / values of page p of layer il (row r = position p * page + r).
  T* keys(int64_t il, int64_t p) { return page(il, p); }
  T* values(int64_t il, int64_t p) { return page(il, p) + page_ * kv_dim_; }
  const T* keys(int64_t il, int64_t p) const { return const_cast<PagedKv*>(this)->page(il, p); }
  const T* values(int64_t il, int64_t p) const { return keys(il, p) + page_ * kv_dim_; }
  // The row of position pos in layer il.
  T* key_row(int64_t il, int64_t pos) { return keys(il, pos / page_) + (pos % page_) * kv_dim_; }
  T* value_row(int64_t il, int64_t pos) { return values(il, pos / page_) + (pos % page_) * kv_dim_; }

  size_t page_bytes() const { return static_cast<size_t>(2 * page_ * kv_dim_) * sizeof(T); }
  size_t pages_in_use() const;
  size_t pages_allocated() const { return storage_.size(); }
  size_t bytes_allocated() const { return pages_allocated() * page_bytes(); }

 private:
  T* page(int64_t il, int64_t p) {
    return storage_[static_cast<size_t>(table_[static_cast<size_t>(il)][static_cast<size_t>(p)])].data();
  }
  int32_t take_page(bool zero);

  int64_t n_layer_, kv_dim_, page_;
  int64_t n_tok_ = 0;
  std::vector<Buffer<T>> storage_;              // physical pages
  std::vector<std::vector<int32_t>> table_;     // [n_layer][logical page] -> physical page
  std::vector<int32_t> free_;                   // physical pages not in use
};

// Chunk-recurrent forward and backward passes over the parameters and gradients of a
// Transformer (which it does not own and whose own activation buffers it does not use). Same
// contract as Transformer::forward/backward, for sequences of any length up to max_tokens.
template <class T>
class ChunkRecurrent {
 public:
  // chunk: tokens per chunk (>= 1); max_tokens: the longest sequence (<= n_ctx; only checked,
  // the pool grows as sequences need it); page_tokens: rows per K/V page.
  static Expected<std::unique_ptr<ChunkRecurrent>> create(Transformer<T>& model, int64_t chunk,
                                                          int64_t max_tokens, int64_t page_tokens = 128);

  // Allocates the pool pages a sequence of n_tokens needs (values and gradients), so that an
  // out-of-memory shows as an error before training rather than at the first step.
  Status reserve(int64_t n_tokens);

  // tokens, targets: [n] (targets may hold -1: that position has no loss and no gradient; null:
  // no loss). Runs the chunks in order, keeps the K/V pool. Returns the mean cross-entropy over
  // the scored tokens (0 when none).
  double forward(const int32_t* tokens, const int32_t* targets, int64_t n, ThreadPool& pool);
  int64_t n_targets() const { return n_targets_; }
  // Adds loss_scale * d(sum of the last forward's token losses)/d(params) to the model's
  // gradients, walking the chunks in reverse. Needs a forward() with targets just before.
  void backward(T loss_scale, ThreadPool& pool);

  int64_t chunk() const { return chunk_; }
  const PagedKv<T>& kv() const { return kv_; }
  const PagedKv<T>& dkv() const { return dkv_; }
  // Per-chunk activations and scratch: depends on the chunk size, not on the sequence length.
  // (Besides these and the pools, a copy of the token ids and targets, 8 bytes a token of
  // max_tokens, is kept for the backward pass.)
  size_t activation_bytes() const;
  // K/V pool + gradient pool, as allocated now (grows with the longest sequence seen).
  size_t pool_bytes() const { return kv_.bytes_allocated() + dkv_.bytes_allocated(); }
  // Bytes the pools add per token of sequence: 4 * n_layer * kv_dim * sizeof(T).
  size_t pool_bytes_per_token() const;

 private:
  BlockActs<T> acts(int64_t il);  // layer il's slots of the chunk's activations
  ChunkRecurrent(Transformer<T>& m, int64_t chunk, int64_t page_tokens);
  void allocate_scratch(int n_threads);
  // Chunk [s, s + cn): fills the per-chunk activations and writes its K/V into the pool; returns
  // the sum of its token losses (0 without targets).
  double chunk_forward(int64_t s, int64_t cn, ThreadPool& pool);
  void chunk_backward(int64_t s, int64_t cn, T loss_scale, ThreadPool& pool);
  void attention_forward(int64_t il, int64_t s, int64_t cn, const T* q, T* out, T* lse, ThreadPool& pool);
  void attention_backward(int64_t il, int64_t s, int64_t cn, const T* q, const T* out, const T* lse,
                          const T* dout, T* dq, ThreadPool& pool);

  Transformer<T>& m_;
  ModelConfig c_;
  int64_t chunk_, max_t_ = 0;
  size_t tok_embd_ = 0, output_norm_ = 0, output_ = 0;
  RopeTable rope_, rope_inv_;
  PagedKv<T> kv_, dkv_;

  std::vector<int32_t> tokens_, targets_;  // [n] of the last forward
  int64_t n_ = 0, n_targets_ = 0;
  bool have_targets_ = false;
  std::vector<int32_t> pos_;               // [chunk] positions of the current chunk

  // Activations of one chunk; per-layer slots are `chunk` rows long.
  Buffer<T> resid_;         // [n_layer + 1, C, n_embd]
  Buffer<T> mid_;           // [n_layer, C, n_embd]
  Buffer<T> ln1_, ln2_;     // [n_layer, C, n_embd]
  Buffer<T> rstd1_, rstd2_; // [n_layer, C]
  Buffer<T> q_, att_;       // [n_layer, C, q_dim]
  Buffer<T> att_lse_;       // [n_layer, n_head, C] log-sum-exp of each attention row
  Buffer<T> k_, v_;         // [C, kv_dim] this chunk's keys / values (then dK / dV)
  Buffer<T> gate_, up_, h_; // [n_layer, C, n_ff]
  Buffer<T> lnf_, rstdf_;   // [C, n_embd], [C]
  Buffer<T> logits_;        // [C, n_vocab] (then dlogits)
  Buffer<T> lse_, losses_;  // [C]
  // Backward scratch of one chunk, reused by every layer.
  Buffer<T> dresid_, dln_, tmp_;  // [C, n_embd]
  Buffer<T> datt_, dq_;           // [C, q_dim]
  Buffer<T> dh_, dgate_, dup_;    // [C, n_ff]
  Buffer<T> dsum_;                // [n_head, C] rowsum(dO * O)
  // Attention tiles, one set per thread: S/P and dP/dS [kQBlock, page], O [kQBlock, head_dim],
  // running max / sum [kQBlock], the dQ accumulator [C, q_dim].
  int scratch_threads_ = 0;
  Buffer<T> tile_s_, tile_d_, tile_o_, tile_m_, tile_l_, tile_dq_;
};

extern template class PagedKv<float>;
extern template class PagedKv<double>;
extern template class ChunkRecurrent<float>;
extern template class ChunkRecurrent<double>;

}  // namespace lc::train
