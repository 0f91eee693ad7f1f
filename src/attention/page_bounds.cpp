#include "attention/page_bounds.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/kernels.h"

namespace lc::attn {
namespace {

constexpr int64_t T = PageBounds::kTile;
static_assert(T == kernels::kBoundTile, "page-bound tiles are the kernels' tiles");

// A query's factors for the point form: q_i >= 0 ? q_i M_i : q_i m_i is computed as
// pos_i M_i + neg_i m_i with pos = max(q, 0) and neg = min(q, 0) (one of them is 0, and a
// multiply-add of 0 by a finite bound adds exactly 0). A NaN query channel stays NaN in both,
// so the bound is NaN (selection treats it as +inf).
void split_signs(const float* q, int64_t d, float* pos, float* neg) {
  for (int64_t c = 0; c < d; ++c) {
    const float x = q[c];
    pos[c] = x != x ? x : (x > 0.0f ? x : 0.0f);
    neg[c] = x != x ? x : (x < 0.0f ? x : 0.0f);
  }
}

// The smallest scale s with 127 s >= a (exactly, in double), so every bound of magnitude at
// most a has a code in [-127, 127].
float scale_for(float a) {
  if (!(a > 0.0f)) return 0.0f;
  float s = a / 127.0f;
  while (static_cast<double>(s) * 127.0 < static_cast<double>(a)) s = std::nextafter(s, INFINITY);
  return s;
}

// The largest code i with i s <= m, and the smallest with i s >= m, for |m| <= 127 s. The
// products are exact in double (24-bit by 8-bit mantissas), so the checks are exact.
int8_t code_down(float m, float s) {
  if (s == 0.0f) return 0;
  double i = std::floor(static_cast<double>(m) / s);
  if (i * s > m) i -= 1;
  return static_cast<int8_t>(std::clamp(i, -127.0, 127.0));
}
int8_t code_up(float m, float s) {
  if (s == 0.0f) return 0;
  double i = std::ceil(static_cast<double>(m) / s);
  if (i * s < m) i += 1;
  return static_cast<int8_t>(std::clamp(i, -127.0, 127.0));
}

}  // namespace

void PageBounds::reset(int64_t d) {
  d_ = d;
  n_pages_ = 0;
  data_.clear();
  wide_.clear();
  open_ = -1;
  exact_.assign(static_cast<size_t>(2 * d * T), 0.0f);
  absmax_.assign(static_cast<size_t>(d), 0.0f);
}

int64_t PageBounds::restart(int64_t p) {
  p = std::max<int64_t>(0, std::min(p, n_pages_));
  const int64_t t = p / T;
  const int64_t first = t == open_ ? p : t * T;
  if (t != open_) open_ = -1;
  // Dropped pages of the open tile leave its exact bounds (its scales may stay larger than
  // they need: the codes are still bounds, a little looser).
  if (open_ >= 0)
    for (int64_t j = first % T; j < T; ++j)
      for (int64_t c = 0; c < 2 * d_; ++c) exact_[static_cast<size_t>(c * T + j)] = 0.0f;
  n_pages_ = first;
  wide_.resize(static_cast<size_t>(first));
  data_.resize(static_cast<size_t>((open_ >= 0 ? t + 1 : t) * tile_bytes()));  // the open tile keeps its scales
  return first;
}

void PageBounds::resize(int64_t n_pages) {
  if (n_pages <= n_pages_) return;
  data_.resize(static_cast<size_t>((n_pages + T - 1) / T * tile_bytes()), 0);
  wide_.resize(static_cast<size_t>(n_pages), 0);
  n_pages_ = n_pages;
}

void PageBounds::encode_channel(int64_t c, float scale) {
  uint8_t* t = tile(open_);
  std::memcpy(t + c * sizeof(float), &scale, sizeof(float));
  int8_t* mn = reinterpret_cast<int8_t*>(t + d_ * sizeof(float)) + c * T;
  int8_t* mx = mn + d_ * T;
  const float* emn = exact_.data() + c * T;
  const float* emx = exact_.data() + (d_ + c) * T;
  for (int64_t j = 0; j < T; ++j) {
    mn[j] = code_down(emn[j], scale);
    mx[j] = code_up(emx[j], scale);
  }
}

bool PageBounds::set(int64_t p, const float* mn, const float* mx) {
  const int64_t t = p / T, j = p % T;
  if (t != open_) {
    // A new open tile. Its pages below p (kept by the last restart) come back as their stored
    // bounds, which still bound their keys.
    std::fill(exact_.begin(), exact_.end(), 0.0f);
    std::fill(absmax_.begin(), absmax_.end(), 0.0f);
    for (int64_t jj = 0; jj < j; ++jj)
      for (int64_t c = 0; c < d_; ++c) {
        const float a = wide(t * T + jj) ? 0.0f : min(t * T + jj, c);
        const float b = wide(t * T + jj) ? 0.0f : max(t * T + jj, c);
        exact_[static_cast<size_t>(c * T + jj)] = a;
        exact_[static_cast<size_t>((d_ + c) * T + jj)] = b;
        absmax_[static_cast<size_t>(c)] = std::max({absmax_[static_cast<size_t>(c)], std::fabs(a), std::fabs(b)});
      }
    open_ = t;
    for (int64_t c = 0; c < d_; ++c) encode_channel(c, scale_for(absmax_[static_cast<size_t>(c)]));
  }
  bool finite = true;
  for (int64_t c = 0; c < d_ && finite; ++c) finite = std::isfinite(mn[c]) && std::isfinite(mx[c]);
  wide_[static_cast<size_t>(p)] = finite ? 0 : 1;
  uint8_t* tp = tile(t);
  int8_t* qmn = reinterpret_cast<int8_t*>(tp + d_ * sizeof(float));
  int8_t* qmx = qmn + d_ * T;
  for (int64_t c = 0; c < d_; ++c) {
    const float a = finite ? mn[c] : 0.0f, b = finite ? mx[c] : 0.0f;  // a wide page codes 0
    exact_[static_cast<size_t>(c * T + j)] = a;
    exact_[static_cast<size_t>((d_ + c) * T + j)] = b;
    const float m = std::max(std::fabs(a), std::fabs(b));
    if (m > absmax_[static_cast<size_t>(c)]) {  // the channel's scale grows: re-encode its pages
      absmax_[static_cast<size_t>(c)] = m;
      encode_channel(c, scale_for(m));
    } else {
      float scale;
      std::memcpy(&scale, tp + c * sizeof(float), sizeof(float));
      qmn[c * T + j] = code_down(a, scale);
      qmx[c * T + j] = code_up(b, scale);
    }
  }
  return finite;
}

bool PageBounds::set_rows(int64_t p, const float* rows, int64_t count) {
  thread_local std::vector<float> mn, mx;
  mn.assign(static_cast<size_t>(d_), std::numeric_limits<float>::infinity());
  mx.assign(static_cast<size_t>(d_), -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < count; ++j)
    for (int64_t c = 0; c < d_; ++c) {
      const float x = rows[j * d_ + c];
      // a NaN key makes the page wide (std::min and std::max would drop it)
      mn[static_cast<size_t>(c)] = x != x ? x : std::min(mn[static_cast<size_t>(c)], x);
      mx[static_cast<size_t>(c)] = x != x ? x : std::max(mx[static_cast<size_t>(c)], x);
    }
  return set(p, mn.data(), mx.data());
}

float PageBounds::min(int64_t p, int64_t c) const {
  const uint8_t* t = tile(p / T);
  float scale;
  std::memcpy(&scale, t + c * sizeof(float), sizeof(float));
  return scale * static_cast<float>(reinterpret_cast<const int8_t*>(t + d_ * sizeof(float))[c * T + p % T]);
}

float PageBounds::max(int64_t p, int64_t c) const {
  const uint8_t* t = tile(p / T);
  float scale;
  std::memcpy(&scale, t + c * sizeof(float), sizeof(float));
  return scale * static_cast<float>(reinterpret_cast<const int8_t*>(t + d_ * sizeof(float))[(d_ + c) * T + p % T]);
}

void PageBounds::tile_bounds(const float* const* lo, const float* const* hi, const float* const* neg, int64_t nq,
                             int64_t t, float* out) const {
  const uint8_t* tp = tile(t);
  const int8_t* mn = reinterpret_cast<const int8_t*>(tp + d_ * sizeof(float));
  const int8_t* mx = mn + d_ * T;
  thread_local std::vector<float> scale;
  scale.resize(static_cast<size_t>(d_));
  std::memcpy(scale.data(), tp, static_cast<size_t>(d_) * sizeof(float));
  const float* sc = scale.data();
  // Runs of queries of one kind: the kernel bounds them four at a time.
  for (int64_t s0 = 0; s0 < nq;) {
    const bool box = hi[s0] != nullptr;
    int64_t k = 1;
    while (s0 + k < nq && (hi[s0 + k] != nullptr) == box) ++k;
    if (box)
      kernels::bound_tile_boxes(sc, mn, mx, d_, lo + s0, hi + s0, k, out + s0 * T);
    else
      kernels::bound_tile_points(sc, mn, mx, d_, lo + s0, neg + s0, k, out + s0 * T);
    s0 += k;
  }
}

void PageBounds::bounds(const float* const* lo, const float* const* hi, int64_t nq, int64_t p0, int64_t p1,
                        float* out, bool max_of_queries) const {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr int64_t kMaxQ = 64;  // queries per pass (the tile buffer)
  float tb[kMaxQ * T];
  // Point queries as (pos, neg) (split_signs), once per call.
  thread_local std::vector<float> signs;
  thread_local std::vector<const float*> first, second;
  signs.resize(static_cast<size_t>(2 * nq * d_));
  first.resize(static_cast<size_t>(nq));
  second.resize(static_cast<size_t>(nq));
  for (int64_t s = 0; s < nq; ++s) {
    if (hi[s]) {
      first[static_cast<size_t>(s)] = lo[s];
      second[static_cast<size_t>(s)] = nullptr;
      continue;
    }
    float* pos = signs.data() + 2 * s * d_;
    split_signs(lo[s], d_, pos, pos + d_);
    first[static_cast<size_t>(s)] = pos;
    second[static_cast<size_t>(s)] = pos + d_;
  }
  for (int64_t q0 = 0; q0 < nq; q0 += kMaxQ) {
    const int64_t nqc = std::min(kMaxQ, nq - q0);
    const int64_t t_end = (p1 + T - 1) / T;
    for (int64_t t = p0 / T; t * T < p1; ++t) {
      // The tile two ahead, from memory while this one is bounded: a unit is a few tiles,
      // too short for the hardware prefetcher to ramp up.
      if (t + 2 < t_end) {
        const char* nx = reinterpret_cast<const char*>(tile(t + 2));
        for (int64_t o = 0; o < tile_bytes(); o += 64) __builtin_prefetch(nx + o);
      }
      tile_bounds(first.data() + q0, hi + q0, second.data() + q0, nqc, t, tb);
      const int64_t a = std::max(p0, t * T), b = std::min(p1, (t + 1) * T);
      if (max_of_queries && q0 == 0 && a == t * T && b == a + T) {  // a whole tile at once
        kernels::max_bound_rows(tb, nqc, wide_.data() + a, out + (a - p0));
        continue;
      }
      for (int64_t p = a; p < b; ++p) {
        const int64_t j = p - t * T;
        const bool w = wide_[static_cast<size_t>(p)] != 0;
        if (max_of_queries) {
          float m = q0 == 0 ? tb[j] : out[p - p0];
          for (int64_t s = q0 == 0 ? 1 : 0; s < nqc; ++s) {
            const float v = tb[s * T + j];
            m = v > m || v != v ? v : m;
          }
          out[p - p0] = w ? kInf : m;
        } else {
          for (int64_t s = 0; s < nqc; ++s) out[(p - p0) * nq + q0 + s] = w ? kInf : tb[s * T + j];
        }
      }
    }
  }
}

}  // namespace lc::attn
