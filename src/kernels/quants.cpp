// Row conversions between f32 and the storage types (dequantize_row / quantize_row), and the
// activation quantisers of the integer dot products.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "core/status.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_internal.h"
#include "kernels/simd.h"

// GCC 12 reports _mm512_cvtph_ps as reading an uninitialised value (a false positive in its
// own header).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace lc::kernels {

namespace detail {

void quantize_q8_32(const float* x, int8_t* qs, float* d, int32_t* sum, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
    __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
    const __m256 m = _mm256_max_ps(
        _mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
        _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
    const float amax = simd::hmax(m);
    const float dd = amax / 127.0f;
    const float id = dd != 0 ? 1.0f / dd : 0.0f;
    d[b] = fp16_to_fp32(fp32_to_fp16(dd));
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i i0 = _mm256_cvtps_epi32(simd::round_away(_mm256_mul_ps(v0, vid)));
    const __m256i i1 = _mm256_cvtps_epi32(simd::round_away(_mm256_mul_ps(v1, vid)));
    const __m256i i2 = _mm256_cvtps_epi32(simd::round_away(_mm256_mul_ps(v2, vid)));
    const __m256i i3 = _mm256_cvtps_epi32(simd::round_away(_mm256_mul_ps(v3, vid)));
    sum[b] = simd::hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * b), simd::pack_i32_to_i8(i0, i1, i2, i3));
  }
}

void quantize_q8_k(const float* x, int8_t* qs, float* d, int16_t* bsums, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* v = x + 256 * b;
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 256; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v + j), abs_mask));
    const float amax = simd::hmax(m);
    int8_t* q = qs + 256 * b;
    int16_t* bs = bsums + 16 * b;
    if (amax == 0) {
      d[b] = 0;
      std::memset(q, 0, 256);
      std::memset(bs, 0, 32);
      continue;
    }
    // The first value of largest magnitude keeps its sign: it maps to -127 exactly.
    float mx = 0;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(v[j]) == amax) {
        mx = v[j];
        break;
      }
    const float iscale = -127.0f / mx;
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i lim = _mm256_set1_epi32(127);
    for (int j = 0; j < 256; j += 32) {
      __m256i i[4];
      for (int k = 0; k < 4; ++k)  // cvtps rounds half to even, as ggml's nearest_int
        i[k] = _mm256_min_epi32(lim, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + j + 8 * k), vs)));
      const __m256i p = simd::pack_i32_to_i8(i[0], i[1], i[2], i[3]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), p);
      // Sums of 16: widen to int16 and add pairs down to one value per 16.
      const __m256i w = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p);  // 16 pair sums
      const __m256i s4 = _mm256_madd_epi16(w, _mm256_set1_epi16(1));   // 8 sums of 4
      const __m128i s8 = _mm_hadd_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
      const __m128i s16 = _mm_hadd_epi32(s8, s8);
      bs[j / 16] = static_cast<int16_t>(_mm_extract_epi32(s16, 0));
      bs[j / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(s16, 1));
    }
    d[b] = 1.0f / iscale;
  }
}

}  // namespace detail

namespace {

inline float h2f(uint16_t v) { return fp16_to_fp32(v); }

void dequant_f16(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
#if defined(LC_AVX512)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
#endif
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = h2f(s[i]);
}

void dequant_bf16(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i) d[i] = bf16_to_fp32(s[i]);
}

// Nibble j of a 16-byte Q4/Q5 nibble array: low nibbles first, then high.
inline void nibbles(const uint8_t* qs, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 15;
    q[j + 16] = qs[j] >> 4;
  }
}

void dequant_blocks(DType t, const void* src, float* y, int64_t n) {
  int q[32];
  switch (t) {
    case DType::Q4_0:
      for (int64_t b = 0; b < n / 32; ++b, y += 32) {
        const auto& x = static_cast<const BlockQ4_0*>(src)[b];
        const float d = h2f(x.d);
        nibbles(x.qs, q);
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - 8) * d;
      }
      return;
    case DType::Q4_1:
      for (int64_t b = 0; b < n / 32; ++b, y += 32) {
        const auto& x = static_cast<const BlockQ4_1*>(src)[b];
        const float d = h2f(x.d), m = h2f(x.m);
        nibbles(x.qs, q);
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d + m;
      }
      return;
    case DType::Q5_0:
      for (int64_t b = 0; b < n / 32; ++b, y += 32) {
        const auto& x = static_cast<const BlockQ5_0*>(src)[b];
        uint32_t qh;
        std::memcpy(&qh, x.qh, 4);
        const float d = h2f(x.d);
        nibbles(x.qs, q);
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>((q[j] | static_cast<int>((qh >> j) & 1) << 4) - 16) * d;
      }
      return;
    case DType::Q5_1:
      for (int64_t b = 0; b < n / 32; ++b, y += 32) {
        const auto& x = static_cast<const BlockQ5_1*>(src)[b];
        uint32_t qh;
        std::memcpy(&qh, x.qh, 4);
        const float d = h2f(x.d), m = h2f(x.m);
        nibbles(x.qs, q);
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] | static_cast<int>((qh >> j) & 1) << 4) * d + m;
      }
      return;
    case DType::Q8_0:
      for (int64_t b = 0; b < n / 32; ++b, y += 32) {
        const auto& x = static_cast<const BlockQ8_0*>(src)[b];
        const float d = h2f(x.d);
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(x.qs[j]) * d;
      }
      return;
    case DType::Q8_1:
      for (int64_t b = 0; b < n / 32; ++b, y += 32) {
        const auto& x = static_cast<const BlockQ8_1*>(src)[b];
        const float d = h2f(x.d);
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(x.qs[j]) * d;
      }
      return;
    case DType::Q8_K:
      for (int64_t b = 0; b < n / 256; ++b, y += 256) {
        const auto& x = static_cast<const BlockQ8_K*>(src)[b];
        for (int j = 0; j < 256; ++j) y[j] = static_cast<float>(x.qs[j]) * x.d;
      }
      return;
    case DType::Q2_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const auto& x = static_cast<const BlockQ2_K*>(src)[b];
        const float d = h2f(x.d), dmin = h2f(x.dmin);
        for (int half = 0; half < 2; ++half)
          for (int k = 0; k < 4; ++k)
            for (int s = 0; s < 2; ++s, y += 16) {
              const uint8_t sc = x.scales[8 * half + 2 * k + s];
              const float dl = d * static_cast<float>(sc & 15), ml = dmin * static_cast<float>(sc >> 4);
              const uint8_t* qq = x.qs + 32 * half + 16 * s;
              for (int l = 0; l < 16; ++l) y[l] = dl * static_cast<float>((qq[l] >> (2 * k)) & 3) - ml;
            }
      }
      return;
    case DType::Q3_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const auto& x = static_cast<const BlockQ3_K*>(src)[b];
        const float d = h2f(x.d);
        int8_t sc[16];
        for (int g = 0; g < 16; ++g) {
          const int lo = g < 8 ? (x.scales[g] & 15) : (x.scales[g - 8] >> 4);
          const int hi = (x.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
          sc[g] = static_cast<int8_t>((lo | hi << 4) - 32);
        }
        for (int half = 0; half < 2; ++half)
          for (int k = 0; k < 4; ++k) {
            const int bit = 4 * half + k;
            for (int s = 0; s < 2; ++s, y += 16) {
              const float dl = d * sc[8 * half + 2 * k + s];
              const uint8_t* qq = x.qs + 32 * half + 16 * s;
              const uint8_t* hm = x.hmask + 16 * s;
              for (int l = 0; l < 16; ++l)
                y[l] = dl * static_cast<float>(((qq[l] >> (2 * k)) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4));
            }
          }
      }
      return;
    case DType::Q4_K:
    case DType::Q5_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const bool five = t == DType::Q5_K;
        const uint8_t *scales, *qs, *qh = nullptr;
        uint16_t dh, mh;
        if (five) {
          const auto& x = static_cast<const BlockQ5_K*>(src)[b];
          scales = x.scales, qs = x.qs, qh = x.qh, dh = x.d, mh = x.dmin;
        } else {
          const auto& x = static_cast<const BlockQ4_K*>(src)[b];
          scales = x.scales, qs = x.qs, dh = x.d, mh = x.dmin;
        }
        const float d = h2f(dh), dmin = h2f(mh);
        for (int c = 0; c < 4; ++c) {
          int sc0, mn0, sc1, mn1;
          k4_scale_min(scales, 2 * c, sc0, mn0);
          k4_scale_min(scales, 2 * c + 1, sc1, mn1);
          const float d0 = d * sc0, m0 = dmin * mn0, d1 = d * sc1, m1 = dmin * mn1;
          const uint8_t* qq = qs + 32 * c;
          for (int l = 0; l < 32; ++l) {
            int lo = qq[l] & 15, hi = qq[l] >> 4;
            if (five) {
              lo |= ((qh[l] >> (2 * c)) & 1) << 4;
              hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            y[l] = d0 * static_cast<float>(lo) - m0;
            y[l + 32] = d1 * static_cast<float>(hi) - m1;
          }
          y += 64;
        }
      }
      return;
    case DType::Q6_K:
      for (int64_t b = 0; b < n / 256; ++b) {
        const auto& x = static_cast<const BlockQ6_K*>(src)[b];
        const float d = h2f(x.d);
        for (int half = 0; half < 2; ++half) {
          const uint8_t* L = x.ql + 64 * half;
          const uint8_t* H = x.qh + 32 * half;
          const int8_t* sc = x.scales + 8 * half;
          for (int l = 0; l < 32; ++l) {
            const int g = l / 16;
            y[l] = d * sc[g] * static_cast<float>(((L[l] & 15) | (H[l] & 3) << 4) - 32);
            y[l + 32] = d * sc[g + 2] * static_cast<float>(((L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4) - 32);
            y[l + 64] = d * sc[g + 4] * static_cast<float>((L[l] >> 4 | ((H[l] >> 4) & 3) << 4) - 32);
            y[l + 96] = d * sc[g + 6] * static_cast<float>((L[l + 32] >> 4 | ((H[l] >> 6) & 3) << 4) - 32);
          }
          y += 128;
        }
      }
      return;
    default:
      LC_CHECK(false && "dequantize_row: unsupported type");
  }
}

// ---- weight quantisers (used to write models: Q4_0 round-to-nearest, Q8_0 as the activations,
// the others as ggml's reference quantisers) ----
//
// Compiled without floating-point contraction (a * b + c fused into one FMA): ggml builds its
// quantisers as ISO C, where GCC does not contract, and a fused multiply-add rounds once where
// ggml rounds twice, which changes a few levels per thousand rows.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float amax = 0, mx = 0;  // the signed value of largest magnitude maps to -8
    for (int j = 0; j < 32; ++j)
      if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), mx = v[j];
    const float d = mx / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::clamp(static_cast<int>(std::nearbyint(v[j] * id)) + 8, 0, 15);
    for (int j = 0; j < 16; ++j) y[b].qs[j] = static_cast<uint8_t>(q[j] | q[j + 16] << 4);
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  alignas(32) int8_t qs[32];
  float d;
  int32_t s;
  for (int64_t b = 0; b < n / 32; ++b) {
    detail::quantize_q8_32(x + 32 * b, qs, &d, &s, 32);
    y[b].d = fp32_to_fp16(d);  // d is already f16-exact
    std::memcpy(y[b].qs, qs, 32);
  }
}

void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b)
    detail::quantize_q8_k(x + 256 * b, y[b].qs, &y[b].d, y[b].bsums, 256);
}

// Q5_0, Q5_1, Q4_K, Q5_K and Q6_K follow ggml's reference quantisers (quantize_row_q5_0_ref,
// _q5_1_ref, _q4_K_ref, _q5_K_ref, _q6_K_ref in ggml-quants.c), which llama-quantize uses when
// it has no importance matrix: the same arithmetic in the same order, so that a model written
// here has the bytes llama-quantize would write for the same floats.

// ggml's nearest_int: round half to even (ggml's is exact for |x| < 2^22; beyond, and for
// NaN, this returns the saturated bound, which every caller clamps).
inline int nearest_int(float x) {
  if (!(std::fabs(x) < 4194304.0f)) return x > 0 ? 4194304 : -4194304;
  return static_cast<int>(std::nearbyint(x));
}

// Q5_0: d = (signed value of largest magnitude) / -16, q = trunc(x / d + 16.5) capped at 31,
// so that value maps to 0 and its negation to 31.
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), mx = v[j];
    const float d = mx / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const float x0 = v[j] * id, x1 = v[j + 16] * id;
      const int q0 = std::min(31, static_cast<int>(x0 + 16.5f));
      const int q1 = std::min(31, static_cast<int>(x1 + 16.5f));
      y[b].qs[j] = static_cast<uint8_t>((q0 & 15) | (q1 & 15) << 4);
      qh |= static_cast<uint32_t>(q0 >> 4 & 1) << j | static_cast<uint32_t>(q1 >> 4 & 1) << (j + 16);
    }
    std::memcpy(y[b].qh, &qh, 4);
  }
}

// Q5_1: m = the block's minimum, d = (max - min) / 31, q = trunc((x - min) / d + 0.5).
void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float lo = v[0], hi = v[0];
    for (int j = 1; j < 32; ++j) lo = std::min(lo, v[j]), hi = std::max(hi, v[j]);
    const float d = (hi - lo) / 31;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(lo);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const float x0 = (v[j] - lo) * id, x1 = (v[j + 16] - lo) * id;
      const int q0 = static_cast<uint8_t>(x0 + 0.5f), q1 = static_cast<uint8_t>(x1 + 0.5f);
      y[b].qs[j] = static_cast<uint8_t>((q0 & 15) | (q1 & 15) << 4);
      qh |= static_cast<uint32_t>(q0 >> 4 & 1) << j | static_cast<uint32_t>(q1 >> 4 & 1) << (j + 16);
    }
    std::memcpy(y[b].qh, &qh, 4);
  }
}

// One group of 32 of Q4_K (nmax 15) or Q5_K (nmax 31): the affine fit x ~ scale * q - m (q in
// 0..nmax, m >= 0) that ggml's make_qkx2_quants finds. It starts from the range
// [min(x, 0), max(x)], then tries nstep + 1 other inverse scales
// ((nmax + rmin + 0.1 k) / (max - offset so far)) and for each the least-squares scale and
// offset of the levels they give, weighted by w, keeping the one with the smallest weighted
// squared error. Returns the scale; *m gets the offset, q the levels.
float fit_affine_group(const float* x, const float* w, int nmax, float rmin, int nstep, uint8_t* q, float* m) {
  constexpr int kN = 32;
  float lo = x[0], hi = x[0], sum_w = 0, sum_x = 0;
  for (int i = 0; i < kN; ++i) {
    lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::memset(q, 0, kN);
    *m = -lo;
    return 0;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1 / iscale, min = lo;
  float best = 0;
  for (int i = 0; i < kN; ++i) {
    q[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * q[i] + min - x[i];
    best += w[i] * (diff * diff);
  }
  uint8_t trial[kN];
  for (int k = 0; k <= nstep; ++k) {
    // As ggml does, each trial starts from the offset of the best fit so far.
    iscale = (rmin + 0.1f * k + nmax) / (hi - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < kN; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;
    float s = (sum_w * sum_xl - sum_x * sum_l) / det;
    float mn = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (mn > 0) {
      mn = 0;
      s = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < kN; ++i) {
      const float diff = s * trial[i] + mn - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best) {
      std::memcpy(q, trial, kN);
      best = err, scale = s, min = mn;
    }
  }
  *m = -min;
  return scale;
}

// The common part of Q4_K and Q5_K: each group of 32 of a super-block fitted by
// fit_affine_group with weights rms(group) + |x|; the 8 scales and 8 offsets then quantised to
// 6 bits against the largest of each (d = max / 63) and packed; every value quantised again
// against the stored d * sc, dmin * mn. q gets the 256 levels (0..nmax).
void quantize_k_affine(const float* v, int nmax, float rmin, int nstep, uint16_t* d_out, uint16_t* dmin_out,
                       uint8_t* scales, uint8_t* q) {
  float scale[8], minv[8], w[32];
  float max_scale = 0, max_min = 0;
  for (int g = 0; g < 8; ++g) {
    const float* xg = v + 32 * g;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xg[l] * xg[l];
    const float av = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av + std::fabs(xg[l]);
    scale[g] = fit_affine_group(xg, w, nmax, rmin, nstep, q + 32 * g, &minv[g]);
    if (scale[g] > max_scale) max_scale = scale[g];
    if (minv[g] > max_min) max_min = minv[g];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  int sc[8], mn[8];
  for (int g = 0; g < 8; ++g) {
    sc[g] = std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_scale * scale[g]))));
    mn[g] = std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_min * minv[g]))));
  }
  for (int g = 0; g < 4; ++g) {
    scales[g] = static_cast<uint8_t>(sc[g] | (sc[g + 4] >> 4) << 6);
    scales[g + 4] = static_cast<uint8_t>(mn[g] | (mn[g + 4] >> 4) << 6);
    scales[g + 8] = static_cast<uint8_t>((sc[g + 4] & 15) | (mn[g + 4] & 15) << 4);
  }
  *d_out = fp32_to_fp16(max_scale / 63.0f);
  *dmin_out = fp32_to_fp16(max_min / 63.0f);
  for (int g = 0; g < 8; ++g) {
    const float d = fp16_to_fp32(*d_out) * sc[g];
    if (d == 0) continue;  // the group keeps the levels of its fit
    const float dm = fp16_to_fp32(*dmin_out) * mn[g];
    for (int l = 0; l < 32; ++l)
      q[32 * g + l] = static_cast<uint8_t>(std::clamp(nearest_int((v[32 * g + l] + dm) / d), 0, nmax));
  }
}

// Q4_K: levels 0..15, the fit's trials from 15 - 1 in 21 steps of 0.1.
void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  uint8_t q[256];
  for (int64_t b = 0; b < n / 256; ++b) {
    BlockQ4_K& o = y[b];
    quantize_k_affine(x + 256 * b, 15, -1.0f, 20, &o.d, &o.dmin, o.scales, q);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) o.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | q[64 * c + 32 + l] << 4);
  }
}

// Q5_K: levels 0..31, the fit's trials from 31 - 0.5 in 16 steps of 0.1.
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  uint8_t q[256];
  for (int64_t b = 0; b < n / 256; ++b) {
    BlockQ5_K& o = y[b];
    quantize_k_affine(x + 256 * b, 31, -0.5f, 15, &o.d, &o.dmin, o.scales, q);
    std::memset(o.qh, 0, 32);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int lo4 = q[64 * c + l], hi4 = q[64 * c + 32 + l];
        o.qs[32 * c + l] = static_cast<uint8_t>((lo4 & 15) | (hi4 & 15) << 4);
        o.qh[l] |= static_cast<uint8_t>((lo4 >> 4) << (2 * c) | (hi4 >> 4) << (2 * c + 1));
      }
  }
}

// One group of 16 of Q6_K: ggml's make_qx_quants with weights x^2. The value of largest
// magnitude sets the first inverse scale, -32 / it; 18 others (-(32 + 0.1 k) / it, k = -9..9)
// are tried, keeping the one whose least-squares scale explains most of sum w x^2
// ((sum w x l)^2 / sum w l^2 largest). Levels are -32..31 stored + 32. Returns the scale.
float fit_q6_k_group(const float* x, int8_t* q) {
  constexpr int kN = 16, kMax = 32;
  float amax = 0, mx = 0;
  for (int i = 0; i < kN; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), mx = x[i];
  if (amax < 1e-15f) {
    std::memset(q, 0, kN);
    return 0;
  }
  auto level = [](float iscale, float v) { return std::clamp(nearest_int(iscale * v), -kMax, kMax - 1); };
  float iscale = -kMax / mx;
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < kN; ++i) {
    const int l = level(iscale, x[i]);
    q[i] = static_cast<int8_t>(l + kMax);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * l;
    sum_l2 += w * l * l;
  }
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(kMax + 0.1f * k) / mx;
    sum_lx = sum_l2 = 0;
    for (int i = 0; i < kN; ++i) {
      const int l = level(iscale, x[i]);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * l;
      sum_l2 += w * l * l;
    }
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      for (int i = 0; i < kN; ++i) q[i] = static_cast<int8_t>(level(iscale, x[i]) + kMax);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

// Q6_K: each group of 16 fitted by fit_q6_k_group; the 16 scales quantised to int8 against the
// one of largest magnitude (-> -128, capped at 127), every value quantised again against the
// stored d * scale. A super-block whose scales are all ~0 is all zero.
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* v = x + 256 * b;
    BlockQ6_K& o = y[b];
    int8_t q[256];
    float scale[16], max_scale = 0, max_abs_scale = 0;
    for (int g = 0; g < 16; ++g) {
      scale[g] = fit_q6_k_group(v + 16 * g, q + 16 * g);
      if (std::fabs(scale[g]) > max_abs_scale) max_abs_scale = std::fabs(scale[g]), max_scale = scale[g];
    }
    if (max_abs_scale < 1e-15f) {
      std::memset(&o, 0, sizeof(o));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    o.d = fp32_to_fp16(1 / iscale);
    for (int g = 0; g < 16; ++g) o.scales[g] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scale[g])));
    for (int g = 0; g < 16; ++g) {
      const float d = fp16_to_fp32(o.d) * o.scales[g];
      if (d == 0) continue;  // the group keeps the levels of its fit
      for (int l = 0; l < 16; ++l)
        q[16 * g + l] = static_cast<int8_t>(std::clamp(nearest_int(v[16 * g + l] / d), -32, 31) + 32);
    }
    for (int half = 0; half < 2; ++half) {
      uint8_t* L = o.ql + 64 * half;
      uint8_t* H = o.qh + 32 * half;
      const int8_t* qq = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        L[l] = static_cast<uint8_t>((qq[l] & 15) | (qq[l + 64] & 15) << 4);
        L[l + 32] = static_cast<uint8_t>((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
        H[l] = static_cast<uint8_t>((qq[l] >> 4) | (qq[l + 32] >> 4) << 2 | (qq[l + 64] >> 4) << 4 |
                                    (qq[l + 96] >> 4) << 6);
      }
    }
  }
}

#if defined(__clang__)
#pragma clang fp contract(on)
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
      dequant_f16(static_cast<const uint16_t*>(src), dst, n);
      return;
    case DType::BF16:
      dequant_bf16(static_cast<const uint16_t*>(src), dst, n);
      return;
    default:
      dequant_blocks(t, src, dst, n);
  }
}

bool can_quantize(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q8_0:
    case DType::Q8_K: case DType::Q4_K: case DType::Q6_K: case DType::Q5_0: case DType::Q5_1:
    case DType::Q5_K:
      return true;
    default:
      return false;
  }
}

bool quantize_row(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return true;
    case DType::F16: {
      auto* o = static_cast<uint16_t*>(dst);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
      for (; i < n; ++i) o[i] = fp32_to_fp16(src[i]);
      return true;
    }
    case DType::BF16: {
      auto* o = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) o[i] = fp32_to_bf16(src[i]);
      return true;
    }
    case DType::Q4_0:
      quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), n);
      return true;
    case DType::Q8_0:
      quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return true;
    case DType::Q8_K:
      quantize_q8_k(src, static_cast<BlockQ8_K*>(dst), n);
      return true;
    case DType::Q4_K:
      quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), n);
      return true;
    case DType::Q6_K:
      quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), n);
      return true;
    case DType::Q5_0:
      quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), n);
      return true;
    case DType::Q5_1:
      quantize_q5_1(src, static_cast<BlockQ5_1*>(dst), n);
      return true;
    case DType::Q5_K:
      quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), n);
      return true;
    default:
      return false;
  }
}

}  // namespace lc::kernels
