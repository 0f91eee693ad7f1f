#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace lc {

KvCache::KvCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t head_dim_v,
                 int64_t n_ctx)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), head_dim_(head_dim), head_dim_v_(head_dim_v),
      n_ctx_(n_ctx), k_(static_cast<size_t>(n_layer)), v_(static_cast<size_t>(n_layer)) {}

Status KvCache::reserve(int64_t n) {
  if (n <= cap_) return Status::ok();
  if (n > n_ctx_) {
    return make_error(strprintf("KV cache: %lld tokens requested but the context holds %lld (raise --ctx-size)",
                                (long long)n, (long long)n_ctx_));
  }
  const int64_t new_cap = std::min(n_ctx_, std::max({n, cap_ * 2, int64_t{256}}));
  auto grow = [&](Buffer<float>& buf, int64_t d) {
    Buffer<float> nb(static_cast<size_t>(n_head_kv_ * new_cap * d));
    for (int64_t h = 0; h < n_head_kv_ && cap_ > 0; ++h)
      std::memcpy(nb.data() + h * new_cap * d, buf.data() + h * cap_ * d,
                  static_cast<size_t>(n_ * d) * sizeof(float));
    buf = std::move(nb);
  };
  try {
    for (int64_t il = 0; il < n_layer_; ++il) {
      grow(k_[static_cast<size_t>(il)], head_dim_);
      grow(v_[static_cast<size_t>(il)], head_dim_v_);
    }
  } catch (const std::bad_alloc&) {
    return make_error(strprintf("KV cache: out of memory growing to %lld tokens", (long long)new_cap));
  }
  cap_ = new_cap;
  return Status::ok();
}

size_t KvCache::bytes() const {
  return static_cast<size_t>(n_layer_ * n_head_kv_ * cap_ * (head_dim_ + head_dim_v_)) * sizeof(float);
}

}  // namespace lc
