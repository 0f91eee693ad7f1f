// Quest's page bounds over tiles of 8-bit codes (kernels.h, attention/page_bounds.h): one
// multiply-add per channel bounds 16 pages at once, with no horizontal sum per page.
#include <limits>

#include "kernels/kernels.h"
#include "kernels/simd.h"

namespace lc::kernels {
namespace {

constexpr int64_t T = kBoundTile;

// Channel c of a tile, 16 pages: the minima and maxima as floats, scale times code.
struct Row16 {
  __m256 m0, m1, M0, M1;
};
inline Row16 widen_row(const float* scale, const int8_t* mn, const int8_t* mx, int64_t c) {
  const __m256 s = _mm256_broadcast_ss(scale + c);
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + c * T));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mx + c * T));
  Row16 r;
  r.m0 = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)));
  r.m1 = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))));
  r.M0 = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
  r.M1 = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
  return r;
}

// Up to four point queries (pos, neg) on one tile; each widened row serves all of them.
template <int NQ>
void tile_points(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* pos,
                 const float* const* neg, float* out) {
  __m256 a[NQ][2];
  for (int s = 0; s < NQ; ++s) a[s][0] = a[s][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    const Row16 r = widen_row(scale, mn, mx, c);
    for (int s = 0; s < NQ; ++s) {
      const __m256 p = _mm256_broadcast_ss(pos[s] + c), n = _mm256_broadcast_ss(neg[s] + c);
      a[s][0] = _mm256_fmadd_ps(n, r.m0, _mm256_fmadd_ps(p, r.M0, a[s][0]));
      a[s][1] = _mm256_fmadd_ps(n, r.m1, _mm256_fmadd_ps(p, r.M1, a[s][1]));
    }
  }
  for (int s = 0; s < NQ; ++s) {
    _mm256_storeu_ps(out + s * T, a[s][0]);
    _mm256_storeu_ps(out + s * T + 8, a[s][1]);
  }
}

// Up to four box queries [lo, hi] on one tile: sum_i max(lo m, lo M, hi m, hi M).
template <int NQ>
void tile_boxes(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* lo,
                const float* const* hi, float* out) {
  __m256 a[NQ][2];
  for (int s = 0; s < NQ; ++s) a[s][0] = a[s][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    const Row16 r = widen_row(scale, mn, mx, c);
    for (int s = 0; s < NQ; ++s) {
      const __m256 l = _mm256_broadcast_ss(lo[s] + c), h = _mm256_broadcast_ss(hi[s] + c);
      auto term = [&](__m256 m, __m256 M) {
        return _mm256_max_ps(_mm256_max_ps(_mm256_mul_ps(l, m), _mm256_mul_ps(l, M)),
                             _mm256_max_ps(_mm256_mul_ps(h, m), _mm256_mul_ps(h, M)));
      };
      a[s][0] = _mm256_add_ps(a[s][0], term(r.m0, r.M0));
      a[s][1] = _mm256_add_ps(a[s][1], term(r.m1, r.M1));
    }
  }
  for (int s = 0; s < NQ; ++s) {
    _mm256_storeu_ps(out + s * T, a[s][0]);
    _mm256_storeu_ps(out + s * T + 8, a[s][1]);
  }
}

}  // namespace

void bound_tile_points(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* pos,
                       const float* const* neg, int64_t nq, float* out) {
  for (int64_t s = 0; s < nq; s += 4) {
    switch (nq - s) {
      case 1: tile_points<1>(scale, mn, mx, d, pos + s, neg + s, out + s * T); break;
      case 2: tile_points<2>(scale, mn, mx, d, pos + s, neg + s, out + s * T); break;
      case 3: tile_points<3>(scale, mn, mx, d, pos + s, neg + s, out + s * T); break;
      default: tile_points<4>(scale, mn, mx, d, pos + s, neg + s, out + s * T); break;
    }
  }
}

void bound_tile_boxes(const float* scale, const int8_t* mn, const int8_t* mx, int64_t d, const float* const* lo,
                      const float* const* hi, int64_t nq, float* out) {
  for (int64_t s = 0; s < nq; s += 4) {
    switch (nq - s) {
      case 1: tile_boxes<1>(scale, mn, mx, d, lo + s, hi + s, out + s * T); break;
      case 2: tile_boxes<2>(scale, mn, mx, d, lo + s, hi + s, out + s * T); break;
      case 3: tile_boxes<3>(scale, mn, mx, d, lo + s, hi + s, out + s * T); break;
      default: tile_boxes<4>(scale, mn, mx, d, lo + s, hi + s, out + s * T); break;
    }
  }
}

void max_bound_rows(const float* rows, int64_t nq, const uint8_t* wide, float* out) {
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t h = 0; h < T; h += 8) {
    __m256 m = _mm256_loadu_ps(rows + h);
    for (int64_t s = 1; s < nq; ++s) {
      const __m256 v = _mm256_loadu_ps(rows + s * T + h);
      const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      m = _mm256_blendv_ps(m, v, take);
    }
    // wide pages: +inf
    const __m128i w8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wide + h));
    const __m256 w = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(w8), _mm256_setzero_si256()));
    _mm256_storeu_ps(out + h, _mm256_blendv_ps(m, inf, w));
  }
}

}  // namespace lc::kernels
