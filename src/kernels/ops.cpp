// Element-wise and row kernels on contiguous f32.
#include <algorithm>
#include <cmath>

#include "core/tensor.h"
#include "kernels/kernels.h"
#include "kernels/simd.h"

namespace lc::kernels {

namespace {

// exp on 8 floats, Cephes-style: n = round(x / ln 2), r = x - n ln 2 (two-part ln 2), a
// degree-6 polynomial for e^r on [-ln2/2, ln2/2], times 2^n. About 1 ulp over the range that
// matters; inputs below -87.3 (results under the smallest normal float, and -inf from masked
// attention scores) give 0, inputs above 88.3 saturate near FLT_MAX.
inline __m256 exp8(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n in two halves so that n = 128 (x near 88.3) does not overflow the exponent field.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i h1 = _mm256_srai_epi32(ni, 1), h2 = _mm256_sub_epi32(ni, h1);
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h1, _mm256_set1_epi32(127)), 23));
  const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h2, _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(_mm256_mul_ps(p, p1), p2));
}

inline float exp1(float x) {  // the same function on one value (tails), for consistency
  alignas(32) float v[8] = {x};
  _mm256_store_ps(v, exp8(_mm256_load_ps(v)));
  return v[0];
}

}  // namespace

void rmsnorm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  // As ggml: squares in float, their sum in double, then x * scale and (x * scale) * w.
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 sq = _mm256_mul_ps(v, v);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(s0, s1));
  double sum = (t[0] + t[1]) + (t[2] + t[3]);
  for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(weight + i)));
  for (; i < n; ++i) y[i] = (x[i] * scale) * weight[i];
}

void pool_seq(const float* a, int64_t n, int64_t kernel, bool max_pool, float scale, float* out) {
  const int64_t half = kernel / 2;
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t i = std::max<int64_t>(0, j - half); i <= std::min(n - 1, j + half); ++i)
      acc = max_pool ? std::max(acc, a[i]) : acc + a[i];
    out[j] = max_pool ? acc * scale : acc * scale / static_cast<float>(kernel);
  }
}

float exp_sub_sum(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vs = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    vs = _mm256_add_ps(vs, e);
  }
  float sum = simd::hsum(vs);
  for (; i < n; ++i) sum += (x[i] = exp1(x[i] - m));
  return sum;
}

void softmax_inplace(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 vm = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
  float mx = simd::hmax(vm);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  if (mx == -INFINITY) mx = 0;  // all masked: avoid inf - inf (the row still sums to 0 -> NaN, as ref)
  const float sum = exp_sub_sum(x, n, mx);
  const float inv = 1.0f / sum;
  scale_inplace(x, inv, n);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, neg))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + exp1(-gate[i])) * up[i];
}

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = simd::hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void dot_rows_f32(const float* q, const float* k, int64_t nk, int64_t d, float* out) {
  int64_t j = 0;
  if (d % 8 == 0) {
    for (; j + 4 <= nk; j += 4) {
      const float* k0 = k + j * d;
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        const __m256 qc = _mm256_loadu_ps(q + c);
        s0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k0 + c), s0);
        s1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k0 + d + c), s1);
        s2 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k0 + 2 * d + c), s2);
        s3 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k0 + 3 * d + c), s3);
      }
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
      _mm_storeu_ps(out + j, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
  }
  for (; j < nk; ++j) out[j] = dot_f32(q, k + j * d, d);
}

namespace {
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t h) { return _cvtsh_ss(h); }

template <class T>
void accumulate_rows(float* o, const float* p, const T* v, int64_t nk, int64_t dv) {
  int64_t c = 0;
  // Four accumulators of 8 columns stay in registers across all the keys.
  for (; c + 32 <= dv; c += 32) {
    __m256 a0 = _mm256_loadu_ps(o + c), a1 = _mm256_loadu_ps(o + c + 8);
    __m256 a2 = _mm256_loadu_ps(o + c + 16), a3 = _mm256_loadu_ps(o + c + 24);
    const T* vc = v + c;
    for (int64_t j = 0; j < nk; ++j, vc += dv) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      a0 = _mm256_fmadd_ps(pj, load8(vc), a0);
      a1 = _mm256_fmadd_ps(pj, load8(vc + 8), a1);
      a2 = _mm256_fmadd_ps(pj, load8(vc + 16), a2);
      a3 = _mm256_fmadd_ps(pj, load8(vc + 24), a3);
    }
    _mm256_storeu_ps(o + c, a0);
    _mm256_storeu_ps(o + c + 8, a1);
    _mm256_storeu_ps(o + c + 16, a2);
    _mm256_storeu_ps(o + c + 24, a3);
  }
  for (; c + 8 <= dv; c += 8) {
    __m256 a0 = _mm256_loadu_ps(o + c);
    for (int64_t j = 0; j < nk; ++j) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), load8(v + j * dv + c), a0);
    _mm256_storeu_ps(o + c, a0);
  }
  for (; c < dv; ++c) {
    float a = o[c];
    // fma, as the vector body: the same rounding whatever the compiler contracts.
    for (int64_t j = 0; j < nk; ++j) a = std::fma(p[j], to_f32(v[j * dv + c]), a);
    o[c] = a;
  }
}
}  // namespace

void dot_rows_f16(const float* q, const uint16_t* k, int64_t nk, int64_t d, float* out) {
  int64_t j = 0;
  if (d % 8 == 0) {
    for (; j + 4 <= nk; j += 4) {
      const uint16_t* k0 = k + j * d;
      // The next four rows are usually in the same block: ask for them while these compute.
      _mm_prefetch(reinterpret_cast<const char*>(k0 + 4 * d), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(k0 + 6 * d), _MM_HINT_T0);
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        const __m256 qc = _mm256_loadu_ps(q + c);
        s0 = _mm256_fmadd_ps(qc, load8(k0 + c), s0);
        s1 = _mm256_fmadd_ps(qc, load8(k0 + d + c), s1);
        s2 = _mm256_fmadd_ps(qc, load8(k0 + 2 * d + c), s2);
        s3 = _mm256_fmadd_ps(qc, load8(k0 + 3 * d + c), s3);
      }
      // Horizontal sums of the four accumulators at once, as dot_rows_f32 does.
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
      _mm_storeu_ps(out + j, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
  }
  for (; j < nk; ++j) {
    alignas(32) float row[kMaxRowWidth];
    for (int64_t c = 0; c < d; ++c) row[c] = to_f32(k[j * d + c]);
    out[j] = dot_f32(q, row, d);
  }
}

void accumulate_rows_f32(float* o, const float* p, const float* v, int64_t nk, int64_t dv) {
  accumulate_rows(o, p, v, nk, dv);
}
void accumulate_rows_f16(float* o, const float* p, const uint16_t* v, int64_t nk, int64_t dv) {
  accumulate_rows(o, p, v, nk, dv);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float a, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), va));
  for (; i < n; ++i) y[i] *= a;
}

void rope_apply(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_rot,
                const int32_t* pos, const float* inv_freq, float mscale, bool neox) {
  const int64_t half = n_rot / 2;
  thread_local Buffer<float> cs;  // [2, half]: cos, sin of one token (grown, never shrunk)
  if (cs.size() < static_cast<size_t>(2 * half)) cs.resize(static_cast<size_t>(2 * half));
  float* cosv = cs.data();
  float* sinv = cs.data() + half;
  for (int64_t t = 0; t < n_tokens; ++t) {
    // One angle per pair, shared by every head of the token; precise sinf/cosf.
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos[t]) * inv_freq[i];
      cosv[i] = std::cos(angle) * mscale;
      sinv[i] = std::sin(angle) * mscale;
    }
    for (int64_t h = 0; h < n_head; ++h) {
      float* v = x + (t * n_head + h) * head_dim;
      if (neox) {
        float* a = v;
        float* b = v + half;
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = a[i], x1 = b[i];
          a[i] = x0 * cosv[i] - x1 * sinv[i];
          b[i] = x0 * sinv[i] + x1 * cosv[i];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * cosv[i] - x1 * sinv[i];
          v[2 * i + 1] = x0 * sinv[i] + x1 * cosv[i];
        }
      }
    }
  }
}

}  // namespace lc::kernels
