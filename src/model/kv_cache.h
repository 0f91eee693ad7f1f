// A contiguous KV cache per layer that grows with the context actually used (doubling up to
// n_ctx), so a large --ctx-size costs nothing until tokens arrive.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace lc {

class KvCache {
 public:
  KvCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t head_dim_v, int64_t n_ctx);

  // Makes room for n tokens in total (n <= n_ctx).
  Status reserve(int64_t n);
  int64_t n_ctx() const { return n_ctx_; }
  int64_t capacity() const { return cap_; }
  int64_t size() const { return n_; }
  void set_size(int64_t n) { n_ = n; }
  size_t bytes() const;

  // [n_head_kv, capacity, head_dim]: head h's keys are contiguous over positions.
  float* k(int64_t il) { return k_[static_cast<size_t>(il)].data(); }
  float* v(int64_t il) { return v_[static_cast<size_t>(il)].data(); }
  const float* k(int64_t il) const { return k_[static_cast<size_t>(il)].data(); }
  const float* v(int64_t il) const { return v_[static_cast<size_t>(il)].data(); }
  int64_t head_dim() const { return head_dim_; }
  int64_t head_dim_v() const { return head_dim_v_; }
  int64_t n_head_kv() const { return n_head_kv_; }

 private:
  int64_t n_layer_, n_head_kv_, head_dim_, head_dim_v_, n_ctx_;
  int64_t cap_ = 0, n_ = 0;
  std::vector<Buffer<float>> k_, v_;
};

}  // namespace lc
