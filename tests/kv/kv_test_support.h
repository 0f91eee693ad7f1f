// Shared by the KV-cache tests: a cache configuration with llama.cpp's rope (NeoX or not) and
// a cache made from it, the creation's error reported as a test failure.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "kv/kv_cache.h"

namespace lc::kvtest {

inline KvCacheConfig cache_config(int64_t n_layer, int64_t n_head_kv, int64_t d, int64_t block, DType tk,
                                  DType tv, bool neox = true) {
  KvCacheConfig c;
  c.n_layer = n_layer;
  c.n_head_kv = n_head_kv;
  c.head_dim = d;
  c.head_dim_v = d;
  c.block_tokens = block;
  c.type_k = tk;
  c.type_v = tv;
  LlamaCppRopeParams p;
  p.n_rot = d;
  p.neox = neox;
  c.rope = make_llama_cpp_rope(p);
  return c;
}

inline std::unique_ptr<KvCache> make_cache(const KvCacheConfig& c) {
  auto kv = KvCache::create(c);
  EXPECT_TRUE(kv.has_value()) << (kv ? "" : kv.error().message);
  return kv ? std::move(kv.value()) : nullptr;
}

}  // namespace lc::kvtest
