// The H2O observer: exact softmax rows of the real queries over the tokens held, accumulated
// per (layer, KV head, token). See press_observer.h.
#include "kv/press_observer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/kernels.h"
#include "kv/press_impl.h"

namespace lc {

AttentionAccumulator::AttentionAccumulator(const PressShape& s)
    : shape_(s), sum_(static_cast<size_t>(s.n_layer * s.n_head_kv)), cnt_(static_cast<size_t>(s.n_layer)) {}

void AttentionAccumulator::observe(const KvCache& kv, int64_t il, const float* q, const int32_t* q_pos,
                                   const int32_t* q_seq, int64_t n, ThreadPool* pool) {
  if (n <= 0 || il < 0 || il >= shape_.n_layer) return;
  const int64_t H = shape_.n_head, Hkv = shape_.n_head_kv, d = shape_.head_dim, g = H / Hkv;
  const float scale = press::attn_scale(shape_);
  int32_t max_seq = 0;
  for (int64_t t = 0; t < n; ++t) max_seq = std::max(max_seq, q_seq[t]);
  const size_t need = static_cast<size_t>(max_seq) + 1;
  // Counts: a query sees every held token up to its own sequence index.
  auto& cnt = cnt_[static_cast<size_t>(il)];
  if (cnt.size() < need) cnt.resize(need, 0.0f);
  {
    // cnt_j += #{t : q_seq[t] >= j}, as a suffix sum over the queries' indices.
    std::vector<int32_t> at(need + 1, 0);
    for (int64_t t = 0; t < n; ++t) ++at[static_cast<size_t>(q_seq[t])];
    int32_t run = 0;
    for (size_t j = need; j-- > 0;) {
      run += at[j];
      cnt[j] += static_cast<float>(run);
    }
  }
  // Rotated queries, pre-multiplied by the attention scale (as the attention backends do).
  qr_.assign(q, q + n * H * d);
  const RopeTable& rt = kv.rope(il);
  if (rt.n_rot > 0) rt.apply(qr_.data(), n, H, d, q_pos);
  kernels::scale_inplace(qr_.data(), scale, n * H * d);
  auto head = [&](int64_t h) {
    auto& s = sum_[static_cast<size_t>(il * Hkv + h)];
    if (s.size() < need) s.resize(need, 0.0f);
    // Per-thread scratch, grown to the longest head seen, never allocated per query.
    thread_local std::vector<float> K, z, acc;
    press::read_head_keys(kv, il, h, K);
    const int64_t nk = kv.n_tokens(il, h);
    const int32_t* idx = kv.seq_index(il, h);
    if (z.size() < static_cast<size_t>(nk)) z.resize(static_cast<size_t>(nk));
    acc.assign(static_cast<size_t>(nk), 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t vis = std::upper_bound(idx, idx + nk, q_seq[t]) - idx;
      if (vis == 0) continue;
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
        const float* qv = qr_.data() + (t * H + hq) * d;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < vis; ++j) {
          z[static_cast<size_t>(j)] = kernels::dot_f32(qv, K.data() + j * d, d);
          mx = std::max(mx, z[static_cast<size_t>(j)]);
        }
        const float tot = kernels::exp_sub_sum(z.data(), vis, mx);
        kernels::axpy(1.0f / tot, z.data(), acc.data(), vis);
      }
    }
    for (int64_t j = 0; j < nk; ++j) s[static_cast<size_t>(idx[j])] += acc[static_cast<size_t>(j)];
  };
  if (pool && pool->size() > 1 && Hkv > 1) {
    pool->parallel_for(Hkv, [&](int64_t b, int64_t e, int) {
      for (int64_t h = b; h < e; ++h) head(h);
    });
  } else {
    for (int64_t h = 0; h < Hkv; ++h) head(h);
  }
}

void AttentionAccumulator::truncate(int64_t n_seq) {
  const size_t m = static_cast<size_t>(std::max<int64_t>(0, n_seq));
  for (auto& s : sum_)
    if (s.size() > m) s.resize(m);
  for (auto& c : cnt_)
    if (c.size() > m) c.resize(m);
}

float AttentionAccumulator::sum(int64_t il, int64_t h, int64_t seq) const {
  const auto& s = sum_[static_cast<size_t>(il * shape_.n_head_kv + h)];
  return seq >= 0 && static_cast<size_t>(seq) < s.size() ? s[static_cast<size_t>(seq)] : 0.0f;
}

float AttentionAccumulator::count(int64_t il, int64_t seq) const {
  const auto& c = cnt_[static_cast<size_t>(il)];
  return seq >= 0 && static_cast<size_t>(seq) < c.size() ? c[static_cast<size_t>(seq)] : 0.0f;
}

}  // namespace lc
