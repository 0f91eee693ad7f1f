// A test prompt for the press oracles: n_layer layers of L tokens with pre-RoPE q, k, v drawn
// from N(0, 1) (seeded), positions 0 .. L-1, a KvCache holding the keys and values (neox RoPE
// over all dims, base 10000), and the rotation in double the oracles apply themselves.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/kv_test_support.h"
#include "kv/press.h"

namespace lc::test {

struct PressPrompt {
  int64_t n_layer, H, Hkv, d, L;
  std::vector<float> k, v, q;  // k, v: [il][t][Hkv][d]; q: [il][t][H][d], pre-RoPE
  std::vector<int32_t> pos;
  std::unique_ptr<KvCache> kv;
  PressShape shape;
  DType type_k;
  int64_t block;

  // fill: make the cache now; otherwise the caller edits the data first, then calls fill_cache().
  PressPrompt(int64_t n_layer_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t L_, uint32_t seed,
              DType type_k_ = DType::F32, int64_t block_ = 8, bool fill = true)
      : n_layer(n_layer_), H(H_), Hkv(Hkv_), d(d_), L(L_), type_k(type_k_), block(block_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(n_layer * L * Hkv * d));
    v.resize(k.size());
    q.resize(static_cast<size_t>(n_layer * L * H * d));
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    for (int64_t t = 0; t < L; ++t) pos.push_back(static_cast<int32_t>(t));
    shape = PressShape{n_layer, H, Hkv, d, d, 0.0f};
    if (fill) fill_cache();
  }

  // A fresh cache holding every layer's keys and values.
  void fill_cache() {
    const KvCacheConfig c = kvtest::cache_config(n_layer, Hkv, d, block, type_k, DType::F32);
    auto r = KvCache::create(c);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    kv = std::move(r.value());
    for (int64_t il = 0; il < n_layer; ++il)
      ASSERT_TRUE(kv->append(il, L, &k[static_cast<size_t>(il * L * Hkv * d)], &v[static_cast<size_t>(il * L * Hkv * d)],
                             pos.data())
                      .is_ok());
  }

  const float* qpre(int64_t il, int64_t t) const { return &q[static_cast<size_t>((il * L + t) * H * d)]; }
  const float* kpre(int64_t il, int64_t t, int64_t h) const {
    return &k[static_cast<size_t>(((il * L + t) * Hkv + h) * d)];
  }
  const float* vpre(int64_t il, int64_t t, int64_t h) const {
    return &v[static_cast<size_t>(((il * L + t) * Hkv + h) * d)];
  }

  // Rotation in double (neox pairs (i, i + d/2), angle p * 10000^(-2i/d)).
  std::vector<double> rot(const float* x, int32_t p) const {
    std::vector<double> out(static_cast<size_t>(d));
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      out[static_cast<size_t>(i)] = x[i] * std::cos(a) - x[i + d / 2] * std::sin(a);
      out[static_cast<size_t>(i + d / 2)] = x[i] * std::sin(a) + x[i + d / 2] * std::cos(a);
    }
    return out;
  }

  // Every key and query rotated in double at its position, for the oracles: kr [il][t][Hkv][d],
  // qr [il][t][H][d] (after rotate_all()).
  std::vector<double> kr, qr;
  void rotate_all() {
    kr.resize(k.size());
    qr.resize(q.size());
    for (int64_t il = 0; il < n_layer; ++il)
      for (int64_t t = 0; t < L; ++t) {
        for (int64_t h = 0; h < Hkv; ++h) {
          const auto r = rot(kpre(il, t, h), pos[static_cast<size_t>(t)]);
          std::copy(r.begin(), r.end(), K(il, t, h));
        }
        for (int64_t h = 0; h < H; ++h) {
          const auto r = rot(qpre(il, t) + h * d, pos[static_cast<size_t>(t)]);
          std::copy(r.begin(), r.end(), Q(il, t, h));
        }
      }
  }
  double* K(int64_t il, int64_t t, int64_t h) { return kr.data() + ((il * L + t) * Hkv + h) * d; }
  double* Q(int64_t il, int64_t t, int64_t h) { return qr.data() + ((il * L + t) * H + h) * d; }

  // The model's call after prefill: the last min(n_obs(), L) queries, every layer.
  void compress(KvPress& p) {
    for (int64_t il = 0; il < n_layer; ++il) {
      const int64_t n = std::min(p.n_obs(), L);
      PressContext c;
      c.kv = kv.get();
      c.queries = qpre(il, L - n);
      c.query_pos = pos.data() + (L - n);
      c.n_obs = n;
      ASSERT_TRUE(p.compress(c, il).is_ok());
    }
  }

  // The sequence indices head (il, h) holds.
  std::vector<int32_t> held(int64_t il, int64_t h) const {
    const int32_t* s = kv->seq_index(il, h);
    return std::vector<int32_t>(s, s + kv->n_tokens(il, h));
  }
};

}  // namespace lc::test
