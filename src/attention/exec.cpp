#include "attention/exec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "core/fp16.h"
#include "kernels/kernels.h"

namespace lc::attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();


// f16 storage is read in place by the fused kernels (Runner::run): each row is widened in
// registers as it is used (kernels::dot_rows_f16, kernels::accumulate_rows_f16), instead of
// into a scratch block that is then read back. Requires d % 8 == 0 and d <= kMaxRowWidth.
constexpr int64_t kFusedMaxRows = 8;

}  // namespace

float dot(const float* a, const float* b, int64_t n) { return kernels::dot_f32(a, b, n); }


float kth_largest(const float* v, int64_t n, int64_t k) {
  // The bucket of a value is a nondecreasing function of it, so every value of a higher bucket
  // is larger than every value of a lower one.
  constexpr int kBuckets = 512;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float lo = kInf, hi = -kInf;
  int64_t n_inf = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i];
    if (x == kInf) {
      ++n_inf;
    } else if (x != -kInf) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  if (k <= n_inf) return kInf;
  const double scale = hi > lo ? (kBuckets - 1) / (static_cast<double>(hi) - lo) : 0.0;
  auto bucket = [&](float x) -> int {
    if (x == -kInf) return 0;
    return std::min(kBuckets - 1, static_cast<int>((static_cast<double>(x) - lo) * scale));
  };
  int64_t hist[kBuckets] = {};
  for (int64_t i = 0; i < n; ++i)
    if (v[i] != kInf) ++hist[bucket(v[i])];
  int64_t above = n_inf;
  int b = kBuckets - 1;
  while (above + hist[b] < k) above += hist[b--];
  thread_local std::vector<float> cand;
  cand.clear();
  for (int64_t i = 0; i < n; ++i)
    if (v[i] != kInf && bucket(v[i]) == b) cand.push_back(v[i]);
  const int64_t r = k - above;  // the r-th largest of the bucket
  std::nth_element(cand.begin(), cand.begin() + (r - 1), cand.end(), std::greater<float>());
  return cand[static_cast<size_t>(r - 1)];
}

void unrotate_rows(float* x, int64_t count, int64_t head_dim, const int32_t* pos, const RopeTable& rt) {
  const int64_t half = rt.n_rot / 2;
  if (half == 0 || count == 0) return;
  constexpr int64_t kMaxHalf = 512;
  if (half > kMaxHalf) {
    for (int64_t j = 0; j < count; ++j) {
      const int32_t neg = -pos[j];
      kernels::rope_apply(x + j * head_dim, 1, 1, head_dim, rt.n_rot, &neg, rt.inv_freq.data(), 1.0f, rt.neox);
    }
    return;
  }
  double c[kMaxHalf], s[kMaxHalf], c1[kMaxHalf], s1[kMaxHalf];
  for (int64_t i = 0; i < half; ++i) {  // one step back: angle -theta_i
    c1[i] = std::cos(static_cast<double>(rt.inv_freq[static_cast<size_t>(i)]));
    s1[i] = -std::sin(static_cast<double>(rt.inv_freq[static_cast<size_t>(i)]));
  }
  for (int64_t j = 0; j < count; ++j) {
    if (j == 0 || pos[j] != pos[j - 1] + 1) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = -static_cast<double>(static_cast<float>(pos[j]) * rt.inv_freq[static_cast<size_t>(i)]);
        c[i] = std::cos(a);
        s[i] = std::sin(a);
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {  // angle(p+1) = angle(p) - theta, in double
        const double cn = c[i] * c1[i] - s[i] * s1[i];
        s[i] = s[i] * c1[i] + c[i] * s1[i];
        c[i] = cn;
      }
    }
    float* v = x + j * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = rt.neox ? i : 2 * i, i1 = rt.neox ? i + half : 2 * i + 1;
      const float x0 = v[i0], x1 = v[i1];
      const float cf = static_cast<float>(c[i]), sf = static_cast<float>(s[i]);
      v[i0] = x0 * cf - x1 * sf;
      v[i1] = x0 * sf + x1 * cf;
    }
  }
}

std::vector<Item> make_items(const ExecCtx& c, int64_t align, int64_t max_tokens) {
  std::vector<Item> items;
  const int64_t g = c.group;
  const int64_t gs = std::min(g, kMaxRows);
  int64_t tile = std::max<int64_t>(1, kMaxRows / gs);
  if (max_tokens > 0) tile = std::min(tile, max_tokens);
  for (int64_t hk = 0; hk < c.n_head_kv; ++hk) {
    for (int64_t t0 = 0; t0 < c.n;) {
      int64_t end = std::min(c.n, t0 + tile);
      if (align > 0) end = std::min(end, (t0 / align + 1) * align);
      for (int64_t h0 = hk * g; h0 < (hk + 1) * g; h0 += gs)
        items.push_back(Item{hk, t0, end - t0, h0, std::min(gs, (hk + 1) * g - h0)});
      t0 = end;
    }
  }
  return items;
}

void prepare_queries(const float* q, int64_t n, int64_t n_head, int64_t head_dim, const RopeTable& rt,
                     const int32_t* qpos, float scale, float* dst) {
  const int64_t total = n * n_head * head_dim;
  std::memcpy(dst, q, static_cast<size_t>(total) * sizeof(float));
  if (rt.n_rot > 0) rt.apply(dst, n, n_head, head_dim, qpos);
  kernels::scale_inplace(dst, scale, total);
}

Runner& thread_runner() {
  thread_local Runner r;
  return r;
}

void Runner::begin(const ExecCtx& c, const Item& it) {
  c_ = &c;
  item_ = it;
  n_head_tokens_ = c.kv->n_tokens(c.il, it.hk);
  const int64_t rows = it.rows();
  const size_t need_o = static_cast<size_t>(kMaxRows * c.dv);
  if (o_.size() < need_o) o_.resize(need_o);
  if (to_.size() < need_o) to_.resize(need_o);
  // A span holds at most one run of stored rows: a block, or a thin block (more tokens).
  const size_t B = static_cast<size_t>(c.kv->max_run_tokens(c.il, it.hk));
  if (kbuf_.size() < B * static_cast<size_t>(c.d)) kbuf_.resize(B * static_cast<size_t>(c.d));
  if (vbuf_.size() < B * static_cast<size_t>(c.dv)) vbuf_.resize(B * static_cast<size_t>(c.dv));
  if (sc_.size() < B) sc_.resize(B);
  if (qg_.size() < static_cast<size_t>(kMaxRows * c.d)) qg_.resize(static_cast<size_t>(kMaxRows * c.d));
  for (int64_t r = 0; r < rows; ++r) {
    m_[r] = tm_[r] = kNegInf;
    l_[r] = tl_[r] = 0.0f;
  }
  std::fill(o_.data(), o_.data() + rows * c.dv, 0.0f);
  std::fill(to_.data(), to_.data() + rows * c.dv, 0.0f);
}

void Runner::merge_row(int64_t r, float m, float l, const float* o) {
  if (m == kNegInf) return;  // the segment saw no key of this row
  const int64_t dv = c_->dv;
  const float mnew = std::max(tm_[r], m);
  const float a = std::exp(tm_[r] - mnew), b = std::exp(m - mnew);  // a = 0 on the first merge
  float* t = to_.data() + r * dv;
  for (int64_t i = 0; i < dv; ++i) t[i] = t[i] * a + o[i] * b;
  tl_[r] = tl_[r] * a + l * b;
  tm_[r] = mnew;
}

void Runner::flush() {
  const int64_t rows = item_.rows(), dv = c_->dv;
  for (int64_t r = 0; r < rows; ++r) {
    merge_row(r, m_[r], l_[r], o_.data() + r * dv);
    m_[r] = kNegInf;
    l_[r] = 0.0f;
  }
  std::fill(o_.data(), o_.data() + rows * dv, 0.0f);
}

int64_t Runner::partial_floats() const { return 2 + c_->dv; }

void Runner::export_partial(float* dst) const {
  const int64_t dv = c_->dv;
  for (int64_t r = 0; r < item_.rows(); ++r, dst += 2 + dv) {
    dst[0] = m_[r];
    dst[1] = l_[r];
    std::memcpy(dst + 2, o_.data() + r * dv, static_cast<size_t>(dv) * sizeof(float));
  }
}

void Runner::merge_partial(const float* src) {
  const int64_t dv = c_->dv;
  for (int64_t r = 0; r < item_.rows(); ++r, src += 2 + dv) merge_row(r, src[0], src[1], src + 2);
}

void Runner::run(const Span& s, float* lse) {
  const ExecCtx& c = *c_;
  const int64_t rows = item_.rows();
  if (lse)
    for (int64_t r = 0; r < rows; ++r) lse[r] = kNegInf;
  uint64_t mask = s.rows & all_rows();
  // Drop rows that see none of the span (causality) before touching storage.
  for (int64_t r = 0; r < rows; ++r)
    if ((mask >> r & 1) && vis(r) <= s.first) mask &= ~(uint64_t{1} << r);
  if (!mask || s.count <= 0) return;
  const KvCache& kv = *c.kv;
  if (!s.unrotate && !lse && kv.n_thin(c.il, item_.hk) > 0) {
    // Keys stored without dropped channels (think): each run of rows that lies in one block is
    // attended as stored, the query reduced to the kept channels (ThinK's pruned q . k).
    // The queries reduced to the kept channels once for the span (zero-padded to the rows' k_dim).
    const auto kept = kv.kept_channels(c.il, item_.hk);
    const QueryVariant& qv = c.var[s.var];
    for (int64_t r = 0; r < rows; ++r) {
      if (!(mask >> r & 1)) continue;
      const float* q = qv.q + (token_of(r) * c.n_head + head_of(r)) * c.d;
      float* g = qg_.data() + r * c.d;
      std::fill(g, g + c.d, 0.0f);
      for (size_t e = 0; e < kept.size(); ++e) g[e] = q[kept[e]];
    }
    int64_t first = s.first, left = s.count;
    while (left > 0) {
      const KvCache::StoredRows p = kv.stored_rows(c.il, item_.hk, first, left);
      run_stored(Span{first, p.count, s.var, false, s.rows}, mask, p);
      first += p.count;
      left -= p.count;
    }
    return;
  }
  // f16 storage (what llama.cpp caches by default) is read in place by the fused kernels when
  // few rows share the block (decoding: one token x a GQA group), where the block is streamed
  // once and converting it into scratch first was half the time (docs/performance.md). A
  // prefill tile of many rows re-reads the block per row, so it converts once instead.
  const bool fused = rows <= kFusedMaxRows && c.d % 8 == 0 && c.d <= kernels::kMaxRowWidth && c.dv % 8 == 0;
  const uint16_t* Kh = fused && !s.unrotate ? kv.keys_f16(c.il, item_.hk, s.first) : nullptr;
  const uint16_t* Vh = fused ? kv.values_f16(c.il, item_.hk, s.first) : nullptr;
  const float* K = Kh ? nullptr : kv.keys_f32(c.il, item_.hk, s.first, s.count, kbuf_.data());
  if (s.unrotate) {
    const RopeTable& rt = kv.rope(c.il);
    if (K != kbuf_.data()) std::memcpy(kbuf_.data(), K, static_cast<size_t>(s.count * c.d) * sizeof(float));
    // R(-p) on a stored key R(p) k * mscale gives k * mscale: the key "at position 0".
    unrotate_rows(kbuf_.data(), s.count, c.d, kv.positions(c.il, item_.hk) + s.first, rt);
    K = kbuf_.data();
  }
  const float* V = Vh ? nullptr : kv.values_f32(c.il, item_.hk, s.first, s.count, vbuf_.data());
  rows_loop(s, mask, K, Kh, c.d, false, V, Vh, lse);
}

void Runner::run_stored(const Span& s, uint64_t mask, const KvCache::StoredRows& p) {
  const ExecCtx& c = *c_;
  const KvCache& kv = *c.kv;
  const int64_t kd = p.k_dim;
  for (int64_t r = 0; r < item_.rows(); ++r)
    if ((mask >> r & 1) && vis(r) <= s.first) mask &= ~(uint64_t{1} << r);
  if (!mask) return;
  const bool fused = item_.rows() <= kFusedMaxRows && kd % 8 == 0 && kd <= kernels::kMaxRowWidth && c.dv % 8 == 0;
  const uint16_t* Kh = fused && kv.type_k() == DType::F16 ? reinterpret_cast<const uint16_t*>(p.k) : nullptr;
  const uint16_t* Vh = fused && kv.type_v() == DType::F16 ? reinterpret_cast<const uint16_t*>(p.v) : nullptr;
  const float* K = nullptr;
  if (!Kh) {
    if (kv.type_k() == DType::F32) {
      K = reinterpret_cast<const float*>(p.k);
    } else {
      const size_t rb = row_bytes(kv.type_k(), kd);
      for (int64_t i = 0; i < s.count; ++i) kernels::dequantize_row(kv.type_k(), p.k + i * rb, kbuf_.data() + i * kd, kd);
      K = kbuf_.data();
    }
  }
  const float* V = nullptr;
  if (!Vh) {
    if (kv.type_v() == DType::F32) {
      V = reinterpret_cast<const float*>(p.v);
    } else {
      const size_t rb = row_bytes(kv.type_v(), c.dv);
      for (int64_t i = 0; i < s.count; ++i)
        kernels::dequantize_row(kv.type_v(), p.v + i * rb, vbuf_.data() + i * c.dv, c.dv);
      V = vbuf_.data();
    }
  }
  rows_loop(s, mask, K, Kh, kd, p.thin, V, Vh, nullptr);
}

void Runner::rows_loop(const Span& s, uint64_t mask, const float* K, const uint16_t* Kh, int64_t kd,
                       bool thin, const float* V, const uint16_t* Vh, float* lse) {
  const ExecCtx& c = *c_;
  const KvCache& kv = *c.kv;
  const int64_t rows = item_.rows();
  const QueryVariant& qv = c.var[s.var];
  float* sc = sc_.data();
  for (int64_t r = 0; r < rows; ++r) {
    if (!(mask >> r & 1)) continue;
    const int64_t t = token_of(r), h = head_of(r);
    const int64_t lim = std::min<int64_t>(s.count, vis(r) - s.first);
    // Thin rows: the query reduced to the kept channels (run()).
    const float* q = thin ? qg_.data() + r * c.d : qv.q + (t * c.n_head + h) * c.d;
    if (Kh)
      kernels::dot_rows_f16(q, Kh, lim, kd, sc);
    else
      kernels::dot_rows_f32(q, K, lim, kd, sc);
    float mx = kNegInf;
    for (int64_t j = 0; j < lim; ++j) mx = std::max(mx, sc[j]);
    const float mnew = std::max(m_[r], mx);
    const float corr = std::exp(m_[r] - mnew);  // 0 on the first span (exp(-inf))
    const float sum = kernels::exp_sub_sum(sc, lim, mnew);
    float* o = o_.data() + r * c.dv;
    if (corr != 1.0f) kernels::scale_inplace(o, corr, c.dv);
    if (Vh)
      kernels::accumulate_rows_f16(o, sc, Vh, lim, c.dv);
    else
      kernels::accumulate_rows_f32(o, sc, V, lim, c.dv);
    l_[r] = l_[r] * corr + sum;
    m_[r] = mnew;
    if (lse) lse[r] = mnew + std::log(sum);
    if (c.sel) {
      auto& rec = c.sel->keys[static_cast<size_t>(t * c.n_head + h)];
      const int32_t* idx = kv.seq_index(c.il, item_.hk) + s.first;
      const int32_t* kp = kv.positions(c.il, item_.hk) + s.first;
      for (int64_t j = 0; j < lim; ++j)
        rec.push_back(SelectedKey{idx[j], qv.qpos[t], s.unrotate ? 0 : kp[j]});
    }
  }
}

int64_t Runner::cut(int64_t first, int64_t end) const {
  const KvCache& kv = *c_->kv;
  // A head with thin rows: its ordinary blocks start after the thin ones, not at multiples of B.
  if (kv.n_thin(c_->il, item_.hk) > 0) return first + kv.stored_rows(c_->il, item_.hk, first, end - first).count;
  const int64_t B = kv.block_tokens();
  return std::min(end, (first / B + 1) * B);
}

void Runner::run_range(int64_t first, int64_t count, int var, bool unrotate, uint64_t rows) {
  const int64_t end = first + count;
  // Rotated-back keys (unrotate) are expanded to every channel: block by block.
  const int64_t B = c_->kv->block_tokens();
  while (first < end) {
    const int64_t next = unrotate ? std::min(end, (first / B + 1) * B) : cut(first, end);
    run(Span{first, next - first, var, unrotate, rows});
    first = next;
  }
}

void Runner::run_windows(const int64_t* lower, int var, uint64_t row_mask) {
  int64_t cuts[kMaxRows + 1];
  int64_t nc = 0;
  for (int64_t t = 0; t < item_.nt; ++t) cuts[nc++] = lower[t];
  const int64_t hi = vis(rows() - 1);
  cuts[nc++] = hi;
  std::sort(cuts, cuts + nc);
  nc = std::unique(cuts, cuts + nc) - cuts;
  for (int64_t c = 0; c + 1 < nc; ++c) {
    const int64_t lo = cuts[c], up = cuts[c + 1];
    if (up <= lo) continue;
    uint64_t mask = 0;
    for (int64_t r = 0; r < rows(); ++r)
      if (lower[token_of(r) - item_.t0] <= lo) mask |= uint64_t{1} << r;
    run_range(lo, up - lo, var, false, mask & row_mask);
  }
}

void Runner::finish(uint64_t mask) {
  const ExecCtx& c = *c_;
  flush();
  for (int64_t r = 0; r < item_.rows(); ++r) {
    if (!(mask >> r & 1)) continue;
    const int64_t t = token_of(r), h = head_of(r);
    float* dst = c.out + (t * c.n_head + h) * c.dv;
    const float inv = tl_[r] > 0.0f ? 1.0f / tl_[r] : 0.0f;
    const float* o = to_.data() + r * c.dv;
    for (int64_t i = 0; i < c.dv; ++i) dst[i] = o[i] * inv;
    if (c.lse) c.lse[t * c.n_head + h] = tl_[r] > 0.0f ? tm_[r] + std::log(tl_[r]) : kNegInf;
  }
}

}  // namespace lc::attn
