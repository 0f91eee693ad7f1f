#include "attention/page_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LC_PB_AVX2 1
#endif

#include "core/fp16.h"

namespace lc::attn {
namespace {

constexpr int64_t T = PageBounds::kTile;

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

#if !LC_PB_AVX2
// Scalar form of one query on one tile, the order of operations of the vector forms. A point
// query comes as lo = pos, hi = null, neg.
void tile_scalar(const uint16_t* mn, const uint16_t* mx, int64_t d, const float* lo, const float* hi,
                 const float* neg, float* out) {
  for (int64_t j = 0; j < T; ++j) {
    float acc = 0.0f;
    for (int64_t c = 0; c < d; ++c) {
      const float m = fp16_to_fp32(mn[c * T + j]), M = fp16_to_fp32(mx[c * T + j]);
      const float l = lo[c];
      if (hi) {
        const float h = hi[c];
        // max as the vector max does: the second operand when either is NaN
        auto vmax = [](float a, float b) { return a > b ? a : b; };
        acc += vmax(vmax(l * m, l * M), vmax(h * m, h * M));
      } else {
        acc = std::fma(neg[c], m, std::fma(l, M, acc));
      }
    }
    out[j] = acc;
  }
}
#endif

#if LC_PB_AVX2
inline __m256 cvt8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Up to four point queries on one tile (16 pages as two halves of eight).
template <int NQ>
void tile_points_avx2(const uint16_t* mn, const uint16_t* mx, int64_t d, const float* const* pos,
                      const float* const* neg, float* out) {
  __m256 a[NQ][2];
  for (int s = 0; s < NQ; ++s) a[s][0] = a[s][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    const __m256 m0 = cvt8(mn + c * T), m1 = cvt8(mn + c * T + 8);
    const __m256 M0 = cvt8(mx + c * T), M1 = cvt8(mx + c * T + 8);
    for (int s = 0; s < NQ; ++s) {
      const __m256 p = _mm256_broadcast_ss(pos[s] + c), n = _mm256_broadcast_ss(neg[s] + c);
      a[s][0] = _mm256_fmadd_ps(n, m0, _mm256_fmadd_ps(p, M0, a[s][0]));
      a[s][1] = _mm256_fmadd_ps(n, m1, _mm256_fmadd_ps(p, M1, a[s][1]));
    }
  }
  for (int s = 0; s < NQ; ++s) {
    _mm256_storeu_ps(out + s * T, a[s][0]);
    _mm256_storeu_ps(out + s * T + 8, a[s][1]);
  }
}

// One box query on one tile: sum_i max(lo m, lo M, hi m, hi M).
void tile_box_avx2(const uint16_t* mn, const uint16_t* mx, int64_t d, const float* lo, const float* hi,
                   float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    const __m256 m0 = cvt8(mn + c * T), m1 = cvt8(mn + c * T + 8);
    const __m256 M0 = cvt8(mx + c * T), M1 = cvt8(mx + c * T + 8);
    const __m256 l = _mm256_broadcast_ss(lo + c), h = _mm256_broadcast_ss(hi + c);
    auto term = [&](__m256 m, __m256 M) {
      return _mm256_max_ps(_mm256_max_ps(_mm256_mul_ps(l, m), _mm256_mul_ps(l, M)),
                           _mm256_max_ps(_mm256_mul_ps(h, m), _mm256_mul_ps(h, M)));
    };
    a0 = _mm256_add_ps(a0, term(m0, M0));
    a1 = _mm256_add_ps(a1, term(m1, M1));
  }
  _mm256_storeu_ps(out, a0);
  _mm256_storeu_ps(out + 8, a1);
}
#endif

}  // namespace

void PageBounds::reset(int64_t d) {
  d_ = d;
  n_pages_ = 0;
  data_.clear();
  wide_.clear();
}

void PageBounds::resize(int64_t n_pages) {
  const int64_t tiles = (n_pages + T - 1) / T;
  data_.resize(static_cast<size_t>(tiles * 2 * d_ * T), 0);
  // Pages of the last tile beyond n_pages hold zeros (finite): their lanes are computed and
  // never read.
  for (int64_t p = n_pages; p < std::min(n_pages_, tiles * T); ++p)
    for (int64_t c = 0; c < 2 * d_; ++c) data_[static_cast<size_t>((p / T) * 2 * d_ * T + c * T + p % T)] = 0;
  wide_.resize(static_cast<size_t>(n_pages), 0);
  n_pages_ = n_pages;
}

bool PageBounds::set(int64_t p, const float* mn, const float* mx) {
  uint16_t* t = data_.data() + (p / T) * 2 * d_ * T + p % T;
  bool finite = true;
  for (int64_t c = 0; c < d_; ++c) {
    const uint16_t lo = fp32_to_fp16_down(mn[c]), hi = fp32_to_fp16_up(mx[c]);
    t[c * T] = lo;
    t[(d_ + c) * T] = hi;
    finite = finite && (lo & 0x7c00u) != 0x7c00u && (hi & 0x7c00u) != 0x7c00u;
  }
  wide_[static_cast<size_t>(p)] = finite ? 0 : 1;
  return finite;
}

bool PageBounds::set_rows(int64_t p, const float* rows, int64_t count) {
  thread_local std::vector<float> mn, mx;
  mn.assign(static_cast<size_t>(d_), std::numeric_limits<float>::infinity());
  mx.assign(static_cast<size_t>(d_), -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < count; ++j)
    for (int64_t c = 0; c < d_; ++c) {
      mn[static_cast<size_t>(c)] = std::min(mn[static_cast<size_t>(c)], rows[j * d_ + c]);
      mx[static_cast<size_t>(c)] = std::max(mx[static_cast<size_t>(c)], rows[j * d_ + c]);
    }
  return set(p, mn.data(), mx.data());
}

float PageBounds::min(int64_t p, int64_t c) const { return fp16_to_fp32(tile(p / T)[c * T + p % T]); }
float PageBounds::max(int64_t p, int64_t c) const { return fp16_to_fp32(tile(p / T)[(d_ + c) * T + p % T]); }

void PageBounds::tile_bounds(const float* const* lo, const float* const* hi, const float* const* neg, int64_t nq,
                             int64_t t, float* out) const {
  const uint16_t* mn = tile(t);
  const uint16_t* mx = mn + d_ * T;
#if LC_PB_AVX2
  for (int64_t s0 = 0; s0 < nq;) {
    // Point queries in runs of up to four share each converted tile row; a box goes alone.
    if (hi[s0]) {
      tile_box_avx2(mn, mx, d_, lo[s0], hi[s0], out + s0 * T);
      ++s0;
      continue;
    }
    int64_t k = 1;
    while (k < 4 && s0 + k < nq && !hi[s0 + k]) ++k;
    float* o = out + s0 * T;
    switch (k) {
      case 1: tile_points_avx2<1>(mn, mx, d_, lo + s0, neg + s0, o); break;
      case 2: tile_points_avx2<2>(mn, mx, d_, lo + s0, neg + s0, o); break;
      case 3: tile_points_avx2<3>(mn, mx, d_, lo + s0, neg + s0, o); break;
      default: tile_points_avx2<4>(mn, mx, d_, lo + s0, neg + s0, o); break;
    }
    s0 += k;
  }
#else
  for (int64_t s = 0; s < nq; ++s) tile_scalar(mn, mx, d_, lo[s], hi[s], neg[s], out + s * T);
#endif
}

void PageBounds::bounds(const float* const* lo, const float* const* hi, int64_t nq, int64_t p0, int64_t p1,
                        float* out, bool max_of_queries) const {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr int64_t kMaxQ = 64;
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
  for (int64_t q0 = 0; q0 < nq; q0 += kMaxQ) {  // more queries than one tile buffer holds
    const int64_t nqc = std::min(kMaxQ, nq - q0);
    for (int64_t t = p0 / T; t * T < p1; ++t) {
      tile_bounds(first.data() + q0, hi + q0, second.data() + q0, nqc, t, tb);
      const int64_t a = std::max(p0, t * T), b = std::min(p1, (t + 1) * T);
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
