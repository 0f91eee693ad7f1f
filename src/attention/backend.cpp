#include "attention/backend.h"

#include <fmt/format.h>

#include <cmath>

namespace lc {

AttentionBackend::AttentionBackend(const AttnShape& s) : shape_(s) {
  if (shape_.scale == 0.0f) shape_.scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));
}

Status AttentionBackend::attach(KvCache& kv) {
  if (kv.n_layer() != shape_.n_layer || kv.n_head_kv() != shape_.n_head_kv ||
      kv.head_dim() != shape_.head_dim || kv.head_dim_v() != shape_.head_dim_v)
    return make_error(fmt::format("attention {}: the KV cache shape (layers {}, KV heads {}, head_dim {}/{}) "
                                  "does not match the model's ({}, {}, {}/{})",
                                  spec(), kv.n_layer(), kv.n_head_kv(),
                                  kv.head_dim(), kv.head_dim_v(), shape_.n_layer,
                                  shape_.n_head_kv, shape_.head_dim,
                                  shape_.head_dim_v));
  kv.set_evictor(nullptr);  // a cache serves one backend: the evictor of the one before goes
  return ok_status();
}

Status AttentionBackend::check_call(int64_t il, int64_t n, const KvCache& kv) const {
  if (il < 0 || il >= shape_.n_layer)
    return make_error(fmt::format("attention: layer {} out of range [0, {})", il,
                                  shape_.n_layer));
  if (n < 1) return make_error("attention: no queries");
  if (kv.n_head_kv() != shape_.n_head_kv || kv.head_dim() != shape_.head_dim ||
      kv.head_dim_v() != shape_.head_dim_v)
    return make_error("attention: KV cache shape differs from the backend's (call attach first)");
  if (detached_) {
    if (!supports_detached())
      return make_error(ErrorCode::kUnsupported,
                        fmt::format("attention {}: cannot attend a cache that does not hold its queries (context "
                                    "parallelism runs dense, fixed, quest or quest_fast attention)", spec()));
    return ok_status();
  }
  for (int64_t h = 0; h < shape_.n_head_kv; ++h)
    if (kv.n_tokens(il, h) < n)
      return make_error(fmt::format("attention: layer {} KV head {} holds {} tokens but the chunk has {} "
                                    "queries: append the chunk's keys before forward()",
                                    il, h, kv.n_tokens(il, h), n));
  return ok_status();
}

}  // namespace lc
