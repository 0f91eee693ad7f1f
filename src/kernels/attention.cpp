#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/kernels.h"

namespace lc::kernels {
namespace {

constexpr int64_t kKeyTile = 64;
constexpr int64_t kMaxGroup = 16;  // query heads sharing one KV head handled together

// One query token against one KV head, for the g query heads of that head's group: each key
// tile is loaded once and used by all g heads.
void attend_group(const AttnShape& s, const float* q /*[g, head_dim]*/, int64_t g,
                  const float* kh /*[kv_stride, head_dim]*/, const float* vh /*[kv_stride, head_dim_v]*/,
                  int64_t n_kv, float* out /*[g, head_dim_v]*/, float* scratch) {
  const int64_t d = s.head_dim, dv = s.head_dim_v;
  float* scores = scratch;                   // [g, kKeyTile]
  float m[kMaxGroup], l[kMaxGroup];
  for (int64_t j = 0; j < g; ++j) {
    m[j] = -std::numeric_limits<float>::infinity();
    l[j] = 0.0f;
    std::fill(out + j * dv, out + (j + 1) * dv, 0.0f);
  }
  for (int64_t t0 = 0; t0 < n_kv; t0 += kKeyTile) {
    const int64_t nt = std::min(kKeyTile, n_kv - t0);
    for (int64_t j = 0; j < g; ++j) {
      float* sc = scores + j * kKeyTile;
      const float* qj = q + j * d;
      float mx = m[j];
      for (int64_t t = 0; t < nt; ++t) {
        sc[t] = dot_f32(qj, kh + (t0 + t) * d, d) * s.scale;
        mx = std::max(mx, sc[t]);
      }
      const float corr = std::exp(m[j] - mx);  // exp(-inf) = 0 on the first tile
      float sum = 0.0f;
      for (int64_t t = 0; t < nt; ++t) {
        sc[t] = std::exp(sc[t] - mx);
        sum += sc[t];
      }
      l[j] = l[j] * corr + sum;
      m[j] = mx;
      float* oj = out + j * dv;
      if (corr != 1.0f) scale_inplace(oj, corr, dv);
      for (int64_t t = 0; t < nt; ++t) axpy(sc[t], vh + (t0 + t) * dv, oj, dv);
    }
  }
  for (int64_t j = 0; j < g; ++j) scale_inplace(out + j * dv, l[j] > 0 ? 1.0f / l[j] : 0.0f, dv);
}

}  // namespace

void attention_causal(const AttnShape& s, const float* q, const float* k, const float* v,
                      float* out, ThreadPool& pool) {
  const int64_t group = s.n_head / s.n_head_kv;
  // Work items: (token, kv head, sub-group of at most kMaxGroup query heads).
  const int64_t n_sub = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t n_items = s.n_tokens * s.n_head_kv * n_sub;
  pool.parallel_for(n_items, [&](int64_t b, int64_t e, int) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(kMaxGroup * kKeyTile))
      scratch.resize(static_cast<size_t>(kMaxGroup * kKeyTile));
    for (int64_t it = b; it < e; ++it) {
      const int64_t t = it / (s.n_head_kv * n_sub);
      const int64_t rem = it % (s.n_head_kv * n_sub);
      const int64_t hk = rem / n_sub, sub = rem % n_sub;
      const int64_t h0 = hk * group + sub * kMaxGroup;
      const int64_t g = std::min(kMaxGroup, (hk + 1) * group - h0);
      attend_group(s, q + (t * s.n_head + h0) * s.head_dim, g,
                   k + hk * s.kv_stride * s.head_dim, v + hk * s.kv_stride * s.head_dim_v,
                   s.n_past + t + 1, out + (t * s.n_head + h0) * s.head_dim_v, scratch.data());
    }
  });
}

namespace ref {

void attention_causal(const AttnShape& s, const float* q, const float* k, const float* v,
                      float* out) {
  const int64_t group = s.n_head / s.n_head_kv;
  std::vector<double> sc;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    const int64_t n_kv = s.n_past + t + 1;
    sc.assign(static_cast<size_t>(n_kv), 0.0);
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t hk = h / group;
      const float* qh = q + (t * s.n_head + h) * s.head_dim;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_kv; ++j) {
        double acc = 0;
        const float* kj = k + (hk * s.kv_stride + j) * s.head_dim;
        for (int64_t c = 0; c < s.head_dim; ++c) acc += static_cast<double>(qh[c]) * kj[c];
        sc[static_cast<size_t>(j)] = acc * s.scale;
        mx = std::max(mx, sc[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      float* o = out + (t * s.n_head + h) * s.head_dim_v;
      for (int64_t c = 0; c < s.head_dim_v; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < n_kv; ++j)
          acc += sc[static_cast<size_t>(j)] * v[(hk * s.kv_stride + j) * s.head_dim_v + c];
        o[c] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace ref
}  // namespace lc::kernels
