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
                                   const int32_t* q_seq, int64_t n, ThreadPool* pool, const float* row_lse) {
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

  // Work units: (KV head h, slice s of the queries). Each unit sums into its own column buffer
  // and the slices are added in order afterwards, so the result does not depend on the number
  // of threads or on which thread ran what. Within a slice, tiles of a few tokens x the GQA group
  // walk the head's keys one KV block at a time, so a block is read once per tile rather than
  // once per query row (at 64K tokens a head's keys are 16 MiB, beyond the cache).
  const int64_t B = kv.block_tokens();
  const int64_t n_slice = std::min<int64_t>(n, kSlices);
  const int64_t per_slice = (n + n_slice - 1) / n_slice;
  int64_t nk_max = 0;
  for (int64_t h = 0; h < Hkv; ++h) nk_max = std::max(nk_max, kv.n_tokens(il, h));
  part_.resize(static_cast<size_t>(Hkv * n_slice));
  for (auto& p : part_) p.assign(static_cast<size_t>(nk_max), 0.0f);
  const int64_t tile_tokens = std::max<int64_t>(1, kTileRows / g);
  auto unit = [&](int64_t u) {
    const int64_t h = u / n_slice, sl = u % n_slice;
    const int64_t t_begin = sl * per_slice, t_end = std::min(n, t_begin + per_slice);
    const int64_t nk = kv.n_tokens(il, h);
    const int32_t* idx = kv.seq_index(il, h);
    float* acc = part_[static_cast<size_t>(u)].data();
    // Per-thread scratch, grown to the largest shape seen, never allocated per tile. A tile has
    // at most kTileRows tokens and max(kTileRows, g) rows (one token when the group is large).
    thread_local std::vector<float> kbuf, z, m, l;
    thread_local std::vector<int64_t> vis;
    const size_t max_rows = static_cast<size_t>(tile_tokens * g);
    if (kbuf.size() < static_cast<size_t>(B * d)) kbuf.resize(static_cast<size_t>(B * d));
    if (z.size() < static_cast<size_t>(B)) z.resize(static_cast<size_t>(B));
    if (m.size() < max_rows) m.resize(max_rows), l.resize(max_rows);
    if (vis.size() < static_cast<size_t>(tile_tokens)) vis.resize(static_cast<size_t>(tile_tokens));
    for (int64_t t0 = t_begin; t0 < t_end; t0 += tile_tokens) {
      const int64_t nt = std::min(tile_tokens, t_end - t0), rows = nt * g;
      int64_t vmax = 0;
      for (int64_t i = 0; i < nt; ++i) {
        vis[i] = std::upper_bound(idx, idx + nk, q_seq[t0 + i]) - idx;
        vmax = std::max(vmax, vis[i]);
      }
      for (int64_t r = 0; r < rows; ++r) {
        // With the backend's log-sum-exp, exp(s - lse) is the probability itself.
        m[r] = row_lse ? row_lse[(t0 + r / g) * H + h * g + r % g] : -std::numeric_limits<float>::infinity();
        l[r] = row_lse ? 1.0f : 0.0f;
      }
      // Pass 1 (without row_lse): each row's softmax normaliser (online max and sum over the
      // blocks). Pass 2: the probabilities exp(s - m) / l, added to the key's column.
      for (int pass = row_lse ? 1 : 0; pass < 2; ++pass) {
        for (int64_t j0 = 0; j0 < vmax; j0 += B) {
          const int64_t cnt_b = std::min(B, vmax - j0);
          const float* K = kv.keys_f32(il, h, j0, cnt_b, kbuf.data());
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = r / g, hq = h * g + r % g;
            const int64_t lim = std::min(cnt_b, vis[i] - j0);
            if (lim <= 0) continue;
            const float* qv = qr_.data() + ((t0 + i) * H + hq) * d;
            kernels::dot_rows_f32(qv, K, lim, d, z.data());
            if (pass == 0) {
              float mx = -std::numeric_limits<float>::infinity();
              for (int64_t j = 0; j < lim; ++j) mx = std::max(mx, z[static_cast<size_t>(j)]);
              const float mnew = std::max(m[r], mx);
              l[r] = l[r] * std::exp(m[r] - mnew) + kernels::exp_sub_sum(z.data(), lim, mnew);
              m[r] = mnew;
            } else {
              kernels::exp_sub_sum(z.data(), lim, m[r]);
              kernels::axpy(1.0f / l[r], z.data(), acc + j0, lim);
            }
          }
        }
      }
    }
  };
  const int64_t n_units = Hkv * n_slice;
  if (pool && pool->size() > 1 && n_units > 1) {
    pool->parallel_for(n_units, [&](int64_t b, int64_t e, int) {
      for (int64_t u = b; u < e; ++u) unit(u);
    });
  } else {
    for (int64_t u = 0; u < n_units; ++u) unit(u);
  }
  for (int64_t h = 0; h < Hkv; ++h) {
    auto& s = sum_[static_cast<size_t>(il * Hkv + h)];
    if (s.size() < need) s.resize(need, 0.0f);
    const int64_t nk = kv.n_tokens(il, h);
    const int32_t* idx = kv.seq_index(il, h);
    for (int64_t sl = 0; sl < n_slice; ++sl) {
      const float* acc = part_[static_cast<size_t>(h * n_slice + sl)].data();
      for (int64_t j = 0; j < nk; ++j) s[static_cast<size_t>(idx[j])] += acc[j];
    }
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
