// Test oracles for the attention backends, computed from the test's own pre-RoPE data in
// double precision: never from a backend's or the cache's output.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/backend.h"
#include "kv/kv_cache.h"
#include "rope/rope_table.h"

namespace lc::test {

inline RopeTable test_rope(int64_t head_dim, bool neox, float base = 10000.0f, float mscale = 1.0f) {
  LlamaCppRopeParams p;
  p.n_rot = head_dim;
  p.neox = neox;
  p.base = base;
  RopeTable t = make_llama_cpp_rope(p);
  t.mscale = mscale;
  return t;
}

// x rotated at position p in double (the angle is formed in float, p * inv_freq, as the
// engine's convention defines it; cos and sin in double).
inline std::vector<double> rotate(const float* x, int64_t d, const RopeTable& rt, int32_t p) {
  std::vector<double> y(x, x + d);
  const int64_t half = rt.n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(static_cast<float>(p) * rt.inv_freq[static_cast<size_t>(i)]);
    const double c = std::cos(a) * rt.mscale, s = std::sin(a) * rt.mscale;
    const int64_t i0 = rt.neox ? i : 2 * i, i1 = rt.neox ? i + half : 2 * i + 1;
    y[static_cast<size_t>(i0)] = x[i0] * c - x[i1] * s;
    y[static_cast<size_t>(i1)] = x[i0] * s + x[i1] * c;
  }
  return y;
}

// A random sequence: q [T, H, d], k [T, Hkv, d] (pre-RoPE), v [T, Hkv, dv].
struct Seq {
  int64_t T, H, Hkv, d, dv;
  std::vector<float> q, k, v;
  std::vector<int32_t> pos;  // [T] = 0..T-1
  Seq(int64_t T_, int64_t H_, int64_t Hkv_, int64_t d_, int64_t dv_, uint32_t seed, float qscale = 2.0f)
      : T(T_), H(H_), Hkv(Hkv_), d(d_), dv(dv_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    q.resize(static_cast<size_t>(T * H * d));
    k.resize(static_cast<size_t>(T * Hkv * d));
    v.resize(static_cast<size_t>(T * Hkv * dv));
    for (auto& x : q) x = nd(rng) * qscale;
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (int64_t t = 0; t < T; ++t) pos.push_back(static_cast<int32_t>(t));
  }
  const float* qt(int64_t t, int64_t h) const { return q.data() + (t * H + h) * d; }
  const float* kt(int64_t t, int64_t h) const { return k.data() + (t * Hkv + h) * d; }
  const float* vt(int64_t t, int64_t h) const { return v.data() + (t * Hkv + h) * dv; }
};

// softmax over the given keys of rope(q, q_pos) . rope(k_j, k_pos_j) * scale, times v_j.
// keys: (sequence index, q_pos, k_pos) of query token t, head h.
inline std::vector<double> oracle_row(const Seq& s, const RopeTable& rt, float scale, int64_t t, int64_t h,
                                      const std::vector<SelectedKey>& keys) {
  const int64_t hk = h / (s.H / s.Hkv);
  std::vector<double> sc(keys.size());
  double mx = -INFINITY;
  for (size_t j = 0; j < keys.size(); ++j) {
    const auto qr = rotate(s.qt(t, h), s.d, rt, keys[j].q_pos);
    const auto kr = rotate(s.kt(keys[j].seq_index, hk), s.d, rt, keys[j].k_pos);
    double a = 0;
    for (int64_t c = 0; c < s.d; ++c) a += qr[static_cast<size_t>(c)] * kr[static_cast<size_t>(c)];
    sc[j] = a * scale;
    mx = std::max(mx, sc[j]);
  }
  double sum = 0;
  for (auto& x : sc) sum += (x = std::exp(x - mx));
  std::vector<double> o(static_cast<size_t>(s.dv), 0.0);
  for (size_t j = 0; j < keys.size(); ++j)
    for (int64_t c = 0; c < s.dv; ++c) o[static_cast<size_t>(c)] += sc[j] * s.vt(keys[j].seq_index, hk)[c];
  for (auto& x : o) x /= sum;
  return o;
}

inline AttnShape shape_of(const Seq& s, int64_t n_layer = 1) {
  AttnShape a;
  a.n_layer = n_layer;
  a.n_head = s.H;
  a.n_head_kv = s.Hkv;
  a.head_dim = s.d;
  a.head_dim_v = s.dv;
  return a;
}

inline KvCacheConfig kv_config(const Seq& s, int64_t block, const RopeTable& rt, int64_t n_layer = 1) {
  KvCacheConfig c;
  c.n_layer = n_layer;
  c.n_head_kv = s.Hkv;
  c.head_dim = s.d;
  c.head_dim_v = s.dv;
  c.block_tokens = block;
  c.rope = rt;
  return c;
}

inline // Full causal attention of every token, from the test's own data (rotated once, in double).
std::vector<float> full_oracle(const Seq& s, const RopeTable& rt) {
  std::vector<float> out(static_cast<size_t>(s.T * s.H * s.dv));
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<std::vector<double>> kr(static_cast<size_t>(s.T * s.Hkv));
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.Hkv; ++h) kr[static_cast<size_t>(t * s.Hkv + h)] = rotate(s.kt(t, h), s.d, rt, s.pos[t]);
  std::vector<double> sc(static_cast<size_t>(s.T)), o(static_cast<size_t>(s.dv));
  const int64_t g = s.H / s.Hkv;
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      const auto qr = rotate(s.qt(t, h), s.d, rt, s.pos[t]);
      double mx = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        const auto& k = kr[static_cast<size_t>(j * s.Hkv + h / g)];
        double a = 0;
        for (int64_t c = 0; c < s.d; ++c) a += qr[static_cast<size_t>(c)] * k[static_cast<size_t>(c)];
        sc[static_cast<size_t>(j)] = a * scale;
        mx = std::max(mx, a * scale);
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j <= t; ++j) {
        const double p = std::exp(sc[static_cast<size_t>(j)] - mx);
        sum += p;
        const float* v = s.vt(j, h / g);
        for (int64_t c = 0; c < s.dv; ++c) o[static_cast<size_t>(c)] += p * v[c];
      }
      for (int64_t i = 0; i < s.dv; ++i) out[static_cast<size_t>((t * s.H + h) * s.dv + i)] = static_cast<float>(o[static_cast<size_t>(i)] / sum);
    }
  return out;
}

// Fixed-distance attention of every token: keys within W at their real positions, every other
// key scored as rope(q, W) . rope(k, 0).
inline std::vector<float> fixed_oracle(const Seq& s, const RopeTable& rt, int64_t W) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  std::vector<float> out(static_cast<size_t>(s.T * s.H * s.dv));
  for (int64_t i = 0; i < s.T; ++i)
    for (int64_t h = 0; h < s.H; ++h) {
      std::vector<SelectedKey> keys;
      for (int64_t j = 0; j <= i; ++j) {
        const bool far = i - j > W;
        keys.push_back({static_cast<int32_t>(j), static_cast<int32_t>(far ? W : i), static_cast<int32_t>(far ? 0 : j)});
      }
      const auto o = oracle_row(s, rt, scale, i, h, keys);
      for (int64_t c = 0; c < s.dv; ++c) out[static_cast<size_t>((i * s.H + h) * s.dv + c)] = static_cast<float>(o[static_cast<size_t>(c)]);
    }
  return out;
}

}  // namespace lc::test
