// matmul: y[t, o] = sum_i W[o, i] * x[t, i] for every weight type the engine reads.
//
// Quantised weights: the activations of all tokens are quantised once per call (Q8_0 blocks
// for Q4_0/Q5_0/Q8_0, Q8_1-style for Q4_1/Q5_1 -- Q8_0 plus the block's sum, which multiplies
// the weight block's min -- and Q8_K for the k-quants), into a structure-of-arrays scratch
// (int8 values contiguous per token, scales and sums apart). Each block then contributes
// d_w * d_x * (integer dot product) to an 8-lane float accumulator; integer products use
// vpdpbusd when the build has AVX512-VNNI, else maddubs/madd. Unsigned-times-signed is all
// either instruction does, so unsigned weight codes (q) multiply directly and the offset of
// symmetric types (q - 8, q - 16, q - 32) comes back as offset * sum(activation block).
//
// Work split: output rows over the pool's threads (contiguous ranges, so each thread streams
// its own part of W once); inside a thread, tiles of RM rows x CM tokens so that each unpacked
// weight block serves CM tokens and each activation block RM rows. Tokens go in panels of
// kTokPanel so a panel's activations stay in L2 while all row tiles of the thread pass over
// them. Every (row, token) pair does the same operations in the same order whatever the tile
// shape, so results do not depend on n_tokens or the thread count.
//
// F32/F16/BF16 weights: f32 FMA after widening (F16C / AVX-512). For n_tokens > 1 the default
// is OpenBLAS sgemm on f32 panels of rows when that measured faster (see kFloatGemmDefault).
#include <cblas.h>

// GCC 12 reports its own AVX-512 reduction intrinsics (_mm512_reduce_add_ps) as reading an
// uninitialised value; the false positive drowns real warnings.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/fp16.h"
#include "core/status.h"
#include "kernels/kernels.h"
#include "kernels/matmul_config.h"

#include "kernels/quant_blocks.h"
#include "kernels/quant_internal.h"
#include "kernels/simd.h"

namespace lc::kernels {

namespace {

// Measured with bench_kernels (AMD EPYC Zen, AVX-512, one thread, n_tokens = 512): OpenBLAS
// sgemm on f32 panels runs at 88-100 GFLOP/s against 37-47 (f32) and 65-73 (f16) for our
// 4x4 register tile, e.g. f16 576x1536: 9.7 ms vs 13.0 ms; f32 1536x576: 9.3 ms vs 20.3 ms.
// Decode (n_tokens = 1) always uses our kernels: sgemm has nothing to reuse there.
constexpr FloatGemm kFloatGemmDefault = FloatGemm::kBlas;
std::atomic<FloatGemm> g_float_gemm{FloatGemm::kAuto};
std::atomic<int> g_stream_prefetch{kDefaultStreamPrefetch};

constexpr int64_t kTokPanel = 64;   // tokens whose activations stay cache-resident together
constexpr int64_t kBlasPanel = 128; // weight rows converted to f32 per sgemm call
constexpr int64_t kBlasMinTokens = 8;

#if defined(LC_AVX512)
constexpr int kRM = 4, kCM = 4;  // 32 vector registers: 16 accumulators fit
constexpr int kFloatDecodeRows = 8;
#else
constexpr int kRM = 4, kCM = 2;  // 16 registers
constexpr int kFloatDecodeRows = 4;
#endif

template <class T>
void grow(Buffer<T>& b, size_t n) {
  if (b.size() < n) b.resize(n);
}

// ---------------------------------------------------------------------------------------------
// Quantised activations of the tokens of one call.
struct Acts {
  int64_t n = 0;               // n_in
  const int8_t* qs = nullptr;  // [n_tokens, n]
  const float* d = nullptr;    // [n_tokens, n/32] or [n_tokens, n/256]
  const int32_t* s = nullptr;  // [n_tokens, n/32]: sum of the block's q (32-blocks)
  const float* ds = nullptr;   // [n_tokens, n/32]: d * s (Q8_1 style)
  const int16_t* bs16 = nullptr;  // [n_tokens, n/16]: Q8_K sums of 16
  const int32_t* bs32 = nullptr;  // [n_tokens, n/32]: Q8_K sums of 32
  const float* f = nullptr;       // [n_tokens, n]: dequantised (fallback kernels)
  const uint32_t* bf = nullptr;   // [n_tokens, ceil(n/2)]: bf16 pairs (x[2j], x[2j+1]) (LC_BF16_DOT)
};

struct ActScratch {
  Buffer<int8_t> qs;
  Buffer<float> d, ds, f;
  Buffer<int32_t> s, bs32;
  Buffer<int16_t> bs16;
  Buffer<uint32_t> bf;
};
// Scratch of the thread that calls matmul (the pool's workers only read it during the call).
thread_local ActScratch tl_acts;

enum class ActKind { kQ8_32, kQ8_K, kQ8_KFloat };

// fn(b, e) over the tokens [0, nt): split over the pool, or in the calling thread when pool is
// null (inside a parallel region, where each thread prepares its own copy).
template <class F>
void each_token(ThreadPool* pool, int64_t nt, F&& fn) {
  if (pool) pool->parallel_for(nt, [&](int64_t b, int64_t e, int) { fn(b, e); });
  else fn(int64_t{0}, nt);
}

#if defined(LC_BF16_DOT)
// Each token's activations rounded to bf16 (to nearest even, as llama.cpp rounds them for its
// BF16 dot products), as (x[2j], x[2j+1]) pairs in 32-bit words; an odd width ends with a 0.
// Every element goes through vcvtne2ps2bf16, the tail from a zero-padded copy, so a value
// rounds the same wherever it sits.
Acts bf16_acts(const float* x, int64_t nt, int64_t n, ThreadPool* pool) {
  ActScratch& sc = tl_acts;
  const int64_t np = (n + 1) / 2;
  grow(sc.bf, static_cast<size_t>(nt * np));
  each_token(pool, nt, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xr = x + t * n;
      uint32_t* d = sc.bf.data() + t * np;
      int64_t i = 0;
      for (; i + 32 <= n; i += 32)
        _mm512_storeu_si512(d + i / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + i + 16), _mm512_loadu_ps(xr + i)));
      if (i < n) {
        alignas(64) float tail[32] = {};
        alignas(64) uint32_t out[16];
        std::memcpy(tail, xr + i, static_cast<size_t>(n - i) * sizeof(float));
        _mm512_store_si512(out, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(tail + 16), _mm512_load_ps(tail)));
        std::memcpy(d + i / 2, out, static_cast<size_t>(np - i / 2) * sizeof(uint32_t));
      }
    }
  });
  Acts a;
  a.n = n;
  a.bf = sc.bf.data();
  return a;
}
#endif

Acts quantize_acts(ActKind kind, const float* x, int64_t nt, int64_t n, ThreadPool* pool) {
  ActScratch& sc = tl_acts;
  const size_t nn = static_cast<size_t>(nt * n);
  grow(sc.qs, nn);
  Acts a;
  a.n = n;
  if (kind == ActKind::kQ8_32) {
    const int64_t nb = n / 32;
    grow(sc.d, static_cast<size_t>(nt * nb));
    grow(sc.s, static_cast<size_t>(nt * nb));
    grow(sc.ds, static_cast<size_t>(nt * nb));
    each_token(pool, nt, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        float* d = sc.d.data() + t * nb;
        int32_t* s = sc.s.data() + t * nb;
        detail::quantize_q8_32(x + t * n, sc.qs.data() + t * n, d, s, n);
        for (int64_t i = 0; i < nb; ++i) sc.ds[t * nb + i] = d[i] * static_cast<float>(s[i]);
      }
    });
    a.s = sc.s.data();
    a.ds = sc.ds.data();
  } else {
    const int64_t nb = n / 256;
    grow(sc.d, static_cast<size_t>(nt * nb));
    grow(sc.bs16, static_cast<size_t>(nt * n / 16));
    grow(sc.bs32, static_cast<size_t>(nt * n / 32));
    if (kind == ActKind::kQ8_KFloat) grow(sc.f, nn);
    each_token(pool, nt, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int8_t* q = sc.qs.data() + t * n;
        float* d = sc.d.data() + t * nb;
        int16_t* b16 = sc.bs16.data() + t * n / 16;
        detail::quantize_q8_k(x + t * n, q, d, b16, n);
        for (int64_t i = 0; i < n / 32; ++i) sc.bs32[t * n / 32 + i] = b16[2 * i] + b16[2 * i + 1];
        if (kind == ActKind::kQ8_KFloat)
          for (int64_t i = 0; i < n; ++i) sc.f[t * n + i] = static_cast<float>(q[i]) * d[i / 256];
      }
    });
    a.bs16 = sc.bs16.data();
    a.bs32 = sc.bs32.data();
    if (kind == ActKind::kQ8_KFloat) a.f = sc.f.data();
  }
  a.qs = sc.qs.data();
  a.d = sc.d.data();
  return a;
}

// Calls f.template operator()<R, C>(row, token) over [o0, o1) x [0, nt) in tiles. One token
// (decoding) takes RM1 rows at a time: more independent accumulator chains per weight stream.
template <int RM1 = kRM, class F>
void for_tiles(int64_t o0, int64_t o1, int64_t nt, F&& f) {
  if (nt == 1 && RM1 != kRM) {
    int64_t o = o0;
    for (; o + RM1 <= o1; o += RM1) f.template operator()<RM1, 1>(o, 0);
    for (; o < o1; ++o) f.template operator()<1, 1>(o, 0);
    return;
  }
  for (int64_t p0 = 0; p0 < nt; p0 += kTokPanel) {
    const int64_t p1 = std::min(nt, p0 + kTokPanel);
    int64_t o = o0;
    for (; o + kRM <= o1; o += kRM) {
      int64_t t = p0;
      for (; t + kCM <= p1; t += kCM) f.template operator()<kRM, kCM>(o, t);
      for (; t < p1; ++t) f.template operator()<kRM, 1>(o, t);
    }
    for (; o < o1; ++o) {
      int64_t t = p0;
      for (; t + kCM <= p1; t += kCM) f.template operator()<1, kCM>(o, t);
      for (; t < p1; ++t) f.template operator()<1, 1>(o, t);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 32-element block types.

inline __m256i nibbles16(const uint8_t* qs) {  // 16 bytes -> 32 codes, low nibbles first
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

inline __m256i fifth_bits(const uint8_t* qh) {  // bit j of qh -> 16 in byte j
  uint32_t v;
  std::memcpy(&v, qh, 4);
#if defined(LC_AVX512)
  return _mm256_maskz_mov_epi8(static_cast<__mmask32>(v), _mm256_set1_epi8(16));
#else
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(v)),
      _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
#endif
}

// Weight traits: unpack() gives 32 codes that multiply as unsigned bytes (signed for kSigned),
// kCorr * sum(activation block) per lane restores the symmetric offset, kMin adds m * d_x * s.
struct KQ4_0 {
  using Block = BlockQ4_0;
  static constexpr bool kMin = false, kSigned = false;
  static constexpr int kCorr = -1;  // -8 * s over 8 lanes
  static __m256i unpack(const Block& b) { return nibbles16(b.qs); }
};
struct KQ4_1 {
  using Block = BlockQ4_1;
  static constexpr bool kMin = true, kSigned = false;
  static constexpr int kCorr = 0;
  static __m256i unpack(const Block& b) { return nibbles16(b.qs); }
};
struct KQ5_0 {
  using Block = BlockQ5_0;
  static constexpr bool kMin = false, kSigned = false;
  static constexpr int kCorr = -2;  // -16 * s
  static __m256i unpack(const Block& b) { return _mm256_or_si256(nibbles16(b.qs), fifth_bits(b.qh)); }
};
struct KQ5_1 {
  using Block = BlockQ5_1;
  static constexpr bool kMin = true, kSigned = false;
  static constexpr int kCorr = 0;
  static __m256i unpack(const Block& b) { return _mm256_or_si256(nibbles16(b.qs), fifth_bits(b.qh)); }
};
struct KQ8_0 {
  using Block = BlockQ8_0;
  static constexpr bool kMin = false;
#if defined(LC_VNNI)
  // vpdpbusd wants unsigned weights: w + 128, then -128 * s (-16 * s per lane).
  static constexpr bool kSigned = false;
  static constexpr int kCorr = -16;
  static __m256i unpack(const Block& b) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)), _mm256_set1_epi8(-128));
  }
#else
  static constexpr bool kSigned = true;
  static constexpr int kCorr = 0;
  static __m256i unpack(const Block& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
#endif
};

template <bool Signed>
inline __m256i dot32(__m256i q, __m256i y, __m256i corr) {
#if defined(LC_VNNI)
  return _mm256_dpbusd_epi32(corr, q, y);
#else
  __m256i p;
  if constexpr (Signed)  // |q| * (y with q's sign); y is never -128
    p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
  else
    p = _mm256_maddubs_epi16(q, y);
  return _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), corr);
#endif
}

// y: points at y[t0, o0] of a [n_tokens, ldy] output.
template <class K, int R, int C>
void tile32(const uint8_t* w, size_t ws, const Acts& a, int64_t t0, float* y, int64_t ldy) {
  using B = typename K::Block;
  const int64_t nb = a.n / 32;
  __m256 acc[R][C];
  const B* wr[R];
  for (int r = 0; r < R; ++r) {
    wr[r] = reinterpret_cast<const B*>(w + r * ws);
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const int8_t* aq[C];
  const float* ad[C];
  const int32_t* as[C];
  const float* ads[C];
  for (int c = 0; c < C; ++c) {
    aq[c] = a.qs + (t0 + c) * a.n;
    ad[c] = a.d + (t0 + c) * nb;
    as[c] = a.s + (t0 + c) * nb;
    ads[c] = a.ds + (t0 + c) * nb;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i q[R];
    __m256 dw[R];
    [[maybe_unused]] __m256 mw[R];
    for (int r = 0; r < R; ++r) {
      q[r] = K::unpack(wr[r][b]);
      dw[r] = simd::bcast_f16(wr[r][b].d);
      if constexpr (K::kMin) mw[r] = simd::bcast_f16(wr[r][b].m);
    }
    for (int c = 0; c < C; ++c) {
      const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq[c] + 32 * b));
      const __m256 dx = _mm256_set1_ps(ad[c][b]);
      const __m256i corr = K::kCorr ? _mm256_set1_epi32(K::kCorr * as[c][b]) : _mm256_setzero_si256();
      // The min term m * d_x * s is spread over the 8 lanes (/8 is exact) so it goes through
      // the same vector operations whatever the tile shape: a scalar accumulation would be
      // contracted into FMAs differently per instantiation.
      [[maybe_unused]] const __m256 ds8 = _mm256_set1_ps(K::kMin ? ads[c][b] * 0.125f : 0.0f);
      for (int r = 0; r < R; ++r) {
        const __m256i p = dot32<K::kSigned>(q[r], yv, corr);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[r], dx), acc[r][c]);
        if constexpr (K::kMin) acc[r][c] = _mm256_fmadd_ps(mw[r], ds8, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = simd::hsum(acc[r][c]);
}

// ---------------------------------------------------------------------------------------------
// Row-interleaved (packed) Q8_0 and Q4_0: a group of R = kPackRows rows (16 with AVX512-VNNI,
// one 512-bit vector of 16 lanes; else 8, one 256-bit vector), block by block. A group-block
// is the R rows' f16 scales (2R bytes) and then vectors of 4R bytes whose 32-bit lane r holds
// four codes of row r:
//   Q8_0 (34R bytes): vector k = codes 4k..4k+3 of each row (k < 8); with VNNI stored as
//     q + 128 (vpdpbusd multiplies unsigned by signed; -128 * sum(x) restores the offset),
//     else as q (signed, the maddubs sign trick).
//   Q4_0 (18R bytes): vector j (j < 4) holds codes 4j..4j+3 in its low nibbles and codes
//     16+4j..16+4j+3 in its high nibbles; the value is (q - 8) d (-8 * sum(x) restores it).
// Lane r of the integer sum of chunk k is then dot(row r codes 4k..4k+3, x[4k..4k+3]) with x
// broadcast, and 8 chunks give the block's exact integer dot for all R rows at once.
namespace pv {
constexpr int kR = static_cast<int>(kPackRows);
#if defined(LC_VNNI)
static_assert(kR == 16);
using VI = __m512i;
using VF = __m512;
inline VI load(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline VI bcast(int32_t x) { return _mm512_set1_epi32(x); }
inline VI zero() { return _mm512_setzero_si512(); }
inline VI nib_lo(VI v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
inline VI nib_hi(VI v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }
inline VI dot_u8s8(VI acc, VI u, VI s) { return _mm512_dpbusd_epi32(acc, u, s); }
inline VI dot2_u8s8(VI acc, VI u, VI s, VI u2, VI s2) { return dot_u8s8(dot_u8s8(acc, u, s), u2, s2); }
inline VF scales(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VF to_float(VI v) { return _mm512_cvtepi32_ps(v); }
inline VF fzero() { return _mm512_setzero_ps(); }
inline VF fma_scaled(VI s, VF dw, float dx, VF acc) {
  return _mm512_fmadd_ps(to_float(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
}
inline void store(float* y, VF v) { _mm512_storeu_ps(y, v); }
inline VI and_(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI or_(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI bcast8(int8_t x) { return _mm512_set1_epi8(x); }
template <int N> VI slli32(VI v) { return _mm512_slli_epi32(v, N); }
template <int N> VI srli32(VI v) { return _mm512_srli_epi32(v, N); }
inline VF fmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF fnmadd(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
inline VF fmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF fset1(float x) { return _mm512_set1_ps(x); }
inline VI add32(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI mullo32(VI a, VI b) { return _mm512_mullo_epi32(a, b); }
inline VI madd16(VI a, VI b) { return _mm512_madd_epi16(a, b); }
// R bytes -> R 32-bit lanes (unsigned / signed); 2R bytes -> 2R 16-bit halves (unsigned).
inline VI u8_to_32(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VI s8_to_32(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VI u8_to_16(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#else
static_assert(kR == 8);
using VI = __m256i;
using VF = __m256;
inline VI load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VI bcast(int32_t x) { return _mm256_set1_epi32(x); }
inline VI zero() { return _mm256_setzero_si256(); }
inline VI nib_lo(VI v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
inline VI nib_hi(VI v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
// u unsigned below 128 (Q4_0 nibbles): maddubs cannot saturate.
inline VI dot_u8s8(VI acc, VI u, VI s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
// Two pairs with one widening: codes below 32 (Q4/Q5) keep each maddubs pair under 7,874 and
// their sum under 16-bit saturation.
inline VI dot2_u8s8(VI acc, VI u, VI s, VI u2, VI s2) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u, s), _mm256_maddubs_epi16(u2, s2)),
                                                 _mm256_set1_epi16(1)));
}
// Signed w (Q8_0): |w| times s with w's sign; s is never -128.
inline VI dot_s8s8(VI acc, VI w_abs, VI w, VI s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(s, w)),
                                                 _mm256_set1_epi16(1)));
}
inline VF scales(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VF to_float(VI v) { return _mm256_cvtepi32_ps(v); }
inline VF fzero() { return _mm256_setzero_ps(); }
inline VF fma_scaled(VI s, VF dw, float dx, VF acc) {
  return _mm256_fmadd_ps(to_float(s), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc);
}
inline void store(float* y, VF v) { _mm256_storeu_ps(y, v); }
inline VI and_(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI or_(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI bcast8(int8_t x) { return _mm256_set1_epi8(x); }
template <int N> VI slli32(VI v) { return _mm256_slli_epi32(v, N); }
template <int N> VI srli32(VI v) { return _mm256_srli_epi32(v, N); }
inline VF fmadd(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF fnmadd(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
inline VF fmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF fset1(float x) { return _mm256_set1_ps(x); }
inline VI add32(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI mullo32(VI a, VI b) { return _mm256_mullo_epi32(a, b); }
inline VI madd16(VI a, VI b) { return _mm256_madd_epi16(a, b); }
inline VI u8_to_32(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VI s8_to_32(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VI u8_to_16(const uint8_t* p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif
constexpr int kVB = 4 * kR;  // bytes per vector
inline int32_t x4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return v;
}
// Chunk k's fifth bits (codes 4k..4k+3 of every row) as 16 in each byte, or 0: lane r of hb
// holds row r's 32 fifth bits with bit 8i + k the bit of code 4k + i.
template <int K>
VI fifth(VI hb) {
  const VI bit = and_(hb, bcast8(static_cast<int8_t>(1 << K)));
  if constexpr (K < 4) return slli32<4 - K>(bit);
  else if constexpr (K > 4) return srli32<K - 4>(bit);
  else return bit;
}
// Codes 4J..4J+3 (low nibbles of vector J) and 16+4J..16+4J+3 (high nibbles) of a 32-code
// nibble block, with their fifth bits for Q5 types.
template <bool Fifth, int J>
void nib_pair(const uint8_t* p, [[maybe_unused]] VI hb, VI& lo, VI& hi) {
  const VI raw = load(p + kVB * J);
  lo = nib_lo(raw), hi = nib_hi(raw);
  if constexpr (Fifth) {
    lo = or_(lo, fifth<J>(hb));
    hi = or_(hi, fifth<J + 4>(hb));
  }
}
// The 32 codes' dot with one token's 32 activation codes x, added to acc.
inline VI nib_dot(const VI* lo, const VI* hi, const int8_t* x, VI acc) {
  for (int j = 0; j < 4; ++j) acc = dot2_u8s8(acc, lo[j], bcast(x4(x + 4 * j)), hi[j], bcast(x4(x + 16 + 4 * j)));
  return acc;
}
}  // namespace pv

struct PQ8_0 {
  using Block = BlockQ8_0;
  static constexpr int64_t kQK = 32;  // columns per group-block
  static constexpr size_t kBytes = 34 * pv::kR;
  static constexpr bool kMin = false;
  static constexpr bool kStreamPrefetch = false;  // measured no faster with it (docs/performance.md)
#if defined(LC_VNNI)
  static constexpr int kCorr = -128;
#else
  static constexpr int kCorr = 0;
#endif
  static void pack(const Block* const* rows, int64_t b, uint8_t* dst) {
    for (int r = 0; r < pv::kR; ++r) std::memcpy(dst + 2 * r, &rows[r][b].d, 2);
    for (int k = 0; k < 8; ++k)
      for (int r = 0; r < pv::kR; ++r)
        for (int i = 0; i < 4; ++i) {
          const uint8_t q = static_cast<uint8_t>(rows[r][b].qs[4 * k + i]);
          dst[2 * pv::kR + pv::kVB * k + 4 * r + i] = kCorr ? static_cast<uint8_t>(q ^ 0x80) : q;
        }
  }
  // The block's integer dots of the R rows against C tokens, added to is[c].
  template <int C>
  static void dots(const uint8_t* p, const int8_t* const* xq, pv::VI* is) {
    for (int k = 0; k < 8; ++k) {
      const pv::VI w = pv::load(p + pv::kVB * k);
#if defined(LC_VNNI)
      for (int c = 0; c < C; ++c) is[c] = pv::dot_u8s8(is[c], w, pv::bcast(pv::x4(xq[c] + 4 * k)));
#else
      const pv::VI wa = _mm256_sign_epi8(w, w);
      for (int c = 0; c < C; ++c) is[c] = pv::dot_s8s8(is[c], wa, w, pv::bcast(pv::x4(xq[c] + 4 * k)));
#endif
    }
  }
  static int32_t row_dot(const Block& w, const int8_t* x) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += static_cast<int32_t>(w.qs[i]) * x[i];
    return s;
  }
};

// Nibble types: Q4_0 ((q - 8) d), Q4_1 (q d + m), Q5_0 ((q - 16) d), Q5_1 (q d + m), q the
// nibble with, for Q5, a fifth bit from qh. Group-block: the R scales d (2R bytes), for Q4_1 /
// Q5_1 the R mins m (2R), the 4 nibble vectors (as Q4_0's), and for Q5 one vector whose lane r
// holds row r's 32 fifth bits reordered so that bit 8i + k is the bit of code 4k + i: chunk k's
// bits are then bit k of each byte, moved to bit 4 with one AND and one shift.
template <class B, bool Fifth, bool Min>
struct PNib {
  using Block = B;
  static constexpr int64_t kQK = 32;
  static constexpr int kHead = 2 * pv::kR * (Min ? 2 : 1);
  static constexpr size_t kBytes = kHead + 4 * pv::kVB + (Fifth ? pv::kVB : 0);
  static constexpr int kCorr = Min ? 0 : (Fifth ? -16 : -8);
  static constexpr bool kMin = Min;
  static constexpr bool kStreamPrefetch = true;
  static void pack(const Block* const* rows, int64_t b, uint8_t* dst) {
    for (int r = 0; r < pv::kR; ++r) {
      std::memcpy(dst + 2 * r, &rows[r][b].d, 2);
      if constexpr (Min) std::memcpy(dst + 2 * pv::kR + 2 * r, &rows[r][b].m, 2);
    }
    // Element e < 16 is the low nibble of qs[e], e >= 16 the high nibble of qs[e - 16]: the
    // byte for codes 4j+i (low) and 16+4j+i (high) is qs[4j+i] as stored.
    for (int j = 0; j < 4; ++j)
      for (int r = 0; r < pv::kR; ++r)
        for (int i = 0; i < 4; ++i) dst[kHead + pv::kVB * j + 4 * r + i] = rows[r][b].qs[4 * j + i];
    if constexpr (Fifth) {
      for (int r = 0; r < pv::kR; ++r) {
        uint32_t qh, out = 0;
        std::memcpy(&qh, rows[r][b].qh, 4);
        for (int k = 0; k < 8; ++k)
          for (int i = 0; i < 4; ++i) out |= ((qh >> (4 * k + i)) & 1u) << (8 * i + k);
        std::memcpy(dst + kHead + 4 * pv::kVB + 4 * r, &out, 4);
      }
    }
  }
  template <int J, int C>
  static void chunk_pair(const uint8_t* p, pv::VI hb, const int8_t* const* xq, pv::VI* is) {
    pv::VI lo, hi;
    pv::nib_pair<Fifth, J>(p, hb, lo, hi);
    for (int c = 0; c < C; ++c) {
      const pv::VI xa = pv::bcast(pv::x4(xq[c] + 4 * J)), xb = pv::bcast(pv::x4(xq[c] + 16 + 4 * J));
      is[c] = pv::dot2_u8s8(is[c], lo, xa, hi, xb);
    }
  }
  template <int C>
  static void dots(const uint8_t* p, const int8_t* const* xq, pv::VI* is) {
    p += kHead - 2 * pv::kR;  // dots gets p past the d scales
    const pv::VI hb = Fifth ? pv::load(p + 4 * pv::kVB) : pv::zero();
    chunk_pair<0, C>(p, hb, xq, is);
    chunk_pair<1, C>(p, hb, xq, is);
    chunk_pair<2, C>(p, hb, xq, is);
    chunk_pair<3, C>(p, hb, xq, is);
  }
  static int32_t row_dot(const Block& w, const int8_t* x) {
    int32_t s = 0;
    uint32_t qh = 0;
    if constexpr (Fifth) std::memcpy(&qh, w.qh, 4);
    const int off = Min ? 0 : (Fifth ? 16 : 8);
    for (int i = 0; i < 16; ++i) {
      const int lo = (w.qs[i] & 15) | static_cast<int>((qh >> i) & 1u) << 4;
      const int hi = (w.qs[i] >> 4) | static_cast<int>((qh >> (16 + i)) & 1u) << 4;
      s += (lo - off) * x[i] + (hi - off) * x[16 + i];
    }
    return s;
  }
};
using PQ4_0 = PNib<BlockQ4_0, false, false>;
using PQ4_1 = PNib<BlockQ4_1, false, true>;
using PQ5_0 = PNib<BlockQ5_0, true, false>;
using PQ5_1 = PNib<BlockQ5_1, true, true>;

// Packed k-quants: a group-superblock covers 256 columns of R rows.
//   Q4_K / Q5_K (148R / 180R bytes): the R d (f16), the R dmin (f16), the 6-bit scales as bytes
//     [j][r] (8R), the mins as byte pairs [j/2][r][j%2] (8R: one madd against two activation
//     sums of 32), then the 8 sub-blocks of 32 codes, each packed as a Q4_0 / Q5_0 block (4
//     nibble vectors, Q5_K then its fifth-bit vector). Value = d sc_j q - dmin m_j.
//   Q6_K (210R bytes, as many as the file's): the R d (f16), the int8 scales [s][r] (16R), then
//     per sub-block s of 16 codes two nibble vectors and one vector of high bit pairs. Nibble
//     vector v holds codes 16s+4v+i (low) and 16s+8+4v+i (high); byte i of a lane's high-bit
//     word holds the top two bits of codes 16s+i, 16s+8+i, 16s+4+i, 16s+12+i at bits 0, 2, 4
//     and 6. Value = d sc_s (q - 32); -32 * (sum of the 16 activation codes) starts each
//     sub-block's integer sum.
// dots() gives each lane's exact integer sum over the superblock, sum_j sc_j dot_j; mins() gives
// sum_j m_j bsum_j; row_sums() computes both from one unpacked row (the scalar tails).
template <bool Five>
struct PK45 {
  using Block = std::conditional_t<Five, BlockQ5_K, BlockQ4_K>;
  static constexpr int64_t kQK = 256;
  static constexpr bool kMin = true;
  static constexpr bool kStreamPrefetch = true;
  static constexpr int kSub = 4 * pv::kVB + (Five ? pv::kVB : 0);  // bytes per sub-block
  static constexpr int kScales = 4 * pv::kR, kMins = 12 * pv::kR, kHead = 20 * pv::kR;
  static constexpr size_t kBytes = kHead + 8 * kSub;
  // Code e (0..31) of sub-block j: qs[32(j/2) + e] holds sub-block j's code in its low (even j)
  // or high (odd j) nibble; Q5_K's fifth bit is bit j of qh[e].
  static int code(const Block& b, int j, int e) {
    const uint8_t v = b.qs[32 * (j / 2) + e];
    int q = (j & 1) ? v >> 4 : v & 15;
    if constexpr (Five) q |= ((b.qh[e] >> j) & 1) << 4;
    return q;
  }
  static void pack(const Block* const* rows, int64_t sb, uint8_t* dst) {
    constexpr int R = pv::kR;
    for (int r = 0; r < R; ++r) {
      const Block& b = rows[r][sb];
      std::memcpy(dst + 2 * r, &b.d, 2);
      std::memcpy(dst + 2 * R + 2 * r, &b.dmin, 2);
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        k4_scale_min(b.scales, j, sc, mn);
        dst[kScales + R * j + r] = static_cast<uint8_t>(sc);
        dst[kMins + 2 * R * (j / 2) + 2 * r + (j & 1)] = static_cast<uint8_t>(mn);
      }
      for (int j = 0; j < 8; ++j) {
        uint8_t* s = dst + kHead + kSub * j;
        for (int v = 0; v < 4; ++v)
          for (int i = 0; i < 4; ++i)
            s[pv::kVB * v + 4 * r + i] = static_cast<uint8_t>((code(b, j, 4 * v + i) & 15) | (code(b, j, 16 + 4 * v + i) & 15) << 4);
        if constexpr (Five) {
          uint32_t out = 0;
          for (int k = 0; k < 8; ++k)
            for (int i = 0; i < 4; ++i) out |= static_cast<uint32_t>(code(b, j, 4 * k + i) >> 4) << (8 * i + k);
          std::memcpy(s + 4 * pv::kVB + 4 * r, &out, 4);
        }
      }
    }
  }
  template <int C>
  static void dots(const uint8_t* p, const int8_t* const* xq, const int16_t* const*, pv::VI* isum) {
    for (int c = 0; c < C; ++c) isum[c] = pv::zero();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* s = p + kHead + kSub * j;
      const pv::VI hb = Five ? pv::load(s + 4 * pv::kVB) : pv::zero();
      pv::VI lo[4], hi[4];
      pv::nib_pair<Five, 0>(s, hb, lo[0], hi[0]);
      pv::nib_pair<Five, 1>(s, hb, lo[1], hi[1]);
      pv::nib_pair<Five, 2>(s, hb, lo[2], hi[2]);
      pv::nib_pair<Five, 3>(s, hb, lo[3], hi[3]);
      const pv::VI sc = pv::u8_to_32(p + kScales + pv::kR * j);
      for (int c = 0; c < C; ++c)
        isum[c] = pv::add32(isum[c], pv::mullo32(pv::nib_dot(lo, hi, xq[c] + 32 * j, pv::zero()), sc));
    }
  }
  // sum_j m_j * bsum32_j for one token (b32: its 8 sums of 32 in this superblock).
  static pv::VI mins(const uint8_t* p, const int32_t* b32) {
    pv::VI m = pv::zero();
    for (int k = 0; k < 4; ++k) {
      const uint32_t pair = static_cast<uint16_t>(b32[2 * k]) | static_cast<uint32_t>(b32[2 * k + 1]) << 16;
      m = pv::add32(m, pv::madd16(pv::u8_to_16(p + kMins + 2 * pv::kR * k), pv::bcast(static_cast<int32_t>(pair))));
    }
    return m;
  }
  static void row_sums(const Block& b, const int8_t* x, const int16_t*, const int32_t* b32, int32_t& isum, int32_t& msum) {
    isum = msum = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      k4_scale_min(b.scales, j, sc, mn);
      int32_t dot = 0;
      for (int e = 0; e < 32; ++e) dot += code(b, j, e) * x[32 * j + e];
      isum += sc * dot;
      msum += mn * b32[j];
    }
  }
  static uint16_t dmin(const Block& b) { return b.dmin; }
};
using PQ4_K = PK45<false>;
using PQ5_K = PK45<true>;

struct PQ6_K {
  using Block = BlockQ6_K;
  static constexpr int64_t kQK = 256;
  static constexpr bool kMin = false;
  static constexpr bool kStreamPrefetch = true;
  static constexpr int kScales = 2 * pv::kR, kHead = 18 * pv::kR, kSub = 3 * pv::kVB;
  static constexpr size_t kBytes = kHead + 16 * kSub;
  static int code(const Block& b, int e) {  // the 6-bit code of element e (quant_blocks.h)
    const int h = e / 128, l = e % 32, part = (e % 128) / 32;
    const uint8_t* L = b.ql + 64 * h;
    const uint8_t H = b.qh[32 * h + l];
    const int low = part == 0 ? L[l] & 15 : part == 1 ? L[l + 32] & 15 : part == 2 ? L[l] >> 4 : L[l + 32] >> 4;
    return low | ((H >> (2 * part)) & 3) << 4;
  }
  static void pack(const Block* const* rows, int64_t sb, uint8_t* dst) {
    constexpr int R = pv::kR;
    for (int r = 0; r < R; ++r) {
      const Block& b = rows[r][sb];
      std::memcpy(dst + 2 * r, &b.d, 2);
      for (int s = 0; s < 16; ++s) dst[kScales + R * s + r] = static_cast<uint8_t>(b.scales[s]);
      for (int s = 0; s < 16; ++s) {
        uint8_t* v = dst + kHead + kSub * s;
        int q[16];
        for (int e = 0; e < 16; ++e) q[e] = code(b, 16 * s + e);
        for (int i = 0; i < 4; ++i) {
          v[4 * r + i] = static_cast<uint8_t>((q[i] & 15) | (q[8 + i] & 15) << 4);
          v[pv::kVB + 4 * r + i] = static_cast<uint8_t>((q[4 + i] & 15) | (q[12 + i] & 15) << 4);
          v[2 * pv::kVB + 4 * r + i] = static_cast<uint8_t>(q[i] >> 4 | (q[8 + i] >> 4) << 2 | (q[4 + i] >> 4) << 4 | (q[12 + i] >> 4) << 6);
        }
      }
    }
  }
  template <int C>
  static void dots(const uint8_t* p, const int8_t* const* xq, const int16_t* const* b16, pv::VI* isum) {
    const pv::VI m30 = pv::bcast8(0x30);
    for (int c = 0; c < C; ++c) isum[c] = pv::zero();
    for (int s = 0; s < 16; ++s) {
      const uint8_t* v = p + kHead + kSub * s;
      const pv::VI r0 = pv::load(v), r1 = pv::load(v + pv::kVB), hb = pv::load(v + 2 * pv::kVB);
      const pv::VI lo0 = pv::or_(pv::nib_lo(r0), pv::and_(pv::slli32<4>(hb), m30));
      const pv::VI hi0 = pv::or_(pv::nib_hi(r0), pv::and_(pv::slli32<2>(hb), m30));
      const pv::VI lo1 = pv::or_(pv::nib_lo(r1), pv::and_(hb, m30));
      const pv::VI hi1 = pv::or_(pv::nib_hi(r1), pv::and_(pv::srli32<2>(hb), m30));
      const pv::VI sc = pv::s8_to_32(p + kScales + pv::kR * s);
      for (int c = 0; c < C; ++c) {
        const int8_t* x = xq[c] + 16 * s;
        pv::VI t = pv::bcast(-32 * b16[c][s]);
        t = pv::dot2_u8s8(t, lo0, pv::bcast(pv::x4(x)), hi0, pv::bcast(pv::x4(x + 8)));
        t = pv::dot2_u8s8(t, lo1, pv::bcast(pv::x4(x + 4)), hi1, pv::bcast(pv::x4(x + 12)));
        isum[c] = pv::add32(isum[c], pv::mullo32(t, sc));
      }
    }
  }
  static pv::VI mins(const uint8_t*, const int32_t*) { return pv::zero(); }
  static void row_sums(const Block& b, const int8_t* x, const int16_t*, const int32_t*, int32_t& isum, int32_t& msum) {
    isum = msum = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t dot = 0;
      for (int e = 0; e < 16; ++e) dot += (code(b, 16 * s + e) - 32) * x[16 * s + e];
      isum += b.scales[s] * dot;
    }
  }
  static uint16_t dmin(const Block&) { return 0; }
};

// R rows (one group) x C tokens from the packed group g; y points at y[t0, first row].
// pf > 0: prefetch the weights pf bytes ahead of the block being read (stream_prefetch()).
template <class P, int C>
void packed_tile(const uint8_t* g, const Acts& a, int64_t t0, float* y, int64_t ldy, size_t pf = 0) {
  const int64_t nb = a.n / 32;
  pv::VF acc[C];
  const int8_t* xq[C];
  for (int c = 0; c < C; ++c) acc[c] = pv::fzero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + static_cast<size_t>(b) * P::kBytes;
    if (pf) {
      const char* f = reinterpret_cast<const char*>(p) + pf;
      for (size_t l = 0; l < P::kBytes; l += 64) _mm_prefetch(f + l, _MM_HINT_T0);
    }
    pv::VI is[C];
    for (int c = 0; c < C; ++c) {
      const int64_t t = t0 + c;
      xq[c] = a.qs + t * a.n + 32 * b;
      is[c] = P::kCorr ? pv::bcast(P::kCorr * a.s[t * nb + b]) : pv::zero();
    }
    P::template dots<C>(p + 2 * pv::kR, xq, is);
    const pv::VF dw = pv::scales(p);
    for (int c = 0; c < C; ++c) acc[c] = pv::fma_scaled(is[c], dw, a.d[(t0 + c) * nb + b], acc[c]);
    if constexpr (P::kMin) {  // + m * (d_x * sum of the activation codes)
      const pv::VF mw = pv::scales(p + 2 * pv::kR);
      for (int c = 0; c < C; ++c) acc[c] = pv::fmadd(mw, pv::fset1(a.ds[(t0 + c) * nb + b]), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) pv::store(y + c * ldy, acc[c]);
}

// The k-quant version against Q8_K activations: per superblock, the exact integer sum times
// d * d_x with one FMA, then for Q4_K / Q5_K minus (sum_j m_j bsum_j) times dmin * d_x with a
// second.
template <class P, int C>
void packed_tile_k(const uint8_t* g, const Acts& a, int64_t t0, float* y, int64_t ldy, size_t pf = 0) {
  const int64_t nsb = a.n / 256;
  pv::VF acc[C];
  const int8_t* xq[C];
  const int16_t* b16[C];
  for (int c = 0; c < C; ++c) acc[c] = pv::fzero();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* p = g + static_cast<size_t>(sb) * P::kBytes;
    if (pf) {
      const char* f = reinterpret_cast<const char*>(p) + pf;
      for (size_t l = 0; l < P::kBytes; l += 64) _mm_prefetch(f + l, _MM_HINT_T0);
    }
    for (int c = 0; c < C; ++c) {
      xq[c] = a.qs + (t0 + c) * a.n + 256 * sb;
      b16[c] = a.bs16 + (t0 + c) * (a.n / 16) + 16 * sb;
    }
    pv::VI isum[C];
    P::template dots<C>(p, xq, b16, isum);
    const pv::VF dw = pv::scales(p);
    for (int c = 0; c < C; ++c) acc[c] = pv::fma_scaled(isum[c], dw, a.d[(t0 + c) * nsb + sb], acc[c]);
    if constexpr (P::kMin) {
      const pv::VF mw = pv::scales(p + 2 * pv::kR);
      for (int c = 0; c < C; ++c) {
        const pv::VI ms = P::mins(p, a.bs32 + (t0 + c) * (a.n / 32) + 8 * sb);
        acc[c] = pv::fnmadd(pv::to_float(ms), pv::fmul(mw, pv::fset1(a.d[(t0 + c) * nsb + sb])), acc[c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) pv::store(y + c * ldy, acc[c]);
}

// One row from the unpacked blocks, with the packed lanes' arithmetic.
template <class P>
void packed_row(const uint8_t* w, const Acts& a, int64_t t, float* y) {
  const auto* blk = reinterpret_cast<const typename P::Block*>(w);
  float acc = 0;
  if constexpr (P::kQK == 256) {
    const int64_t nsb = a.n / 256;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      int32_t isum, msum;
      P::row_sums(blk[sb], a.qs + t * a.n + 256 * sb, a.bs16 + t * (a.n / 16) + 16 * sb,
                  a.bs32 + t * (a.n / 32) + 8 * sb, isum, msum);
      const float dx = a.d[t * nsb + sb];
      acc = std::fma(static_cast<float>(isum), fp16_to_fp32(blk[sb].d) * dx, acc);
      if constexpr (P::kMin) acc = std::fma(-static_cast<float>(msum), fp16_to_fp32(P::dmin(blk[sb])) * dx, acc);
    }
  } else {
    const int64_t nb = a.n / 32;
    for (int64_t b = 0; b < nb; ++b) {
      const int32_t s = P::row_dot(blk[b], a.qs + t * a.n + 32 * b);
      acc = std::fma(static_cast<float>(s), fp16_to_fp32(blk[b].d) * a.d[t * nb + b], acc);
      if constexpr (P::kMin) acc = std::fma(fp16_to_fp32(blk[b].m), a.ds[t * nb + b], acc);
    }
  }
  *y = acc;
}

#if defined(LC_AVX512)
constexpr int kPackCols = 8;  // tokens per packed tile: 2 x 8 accumulators of 32 registers
#else
constexpr int kPackCols = 4;
#endif

// Rows [o0, o1) of a packed matrix: whole groups from the packed copy, the rest row by row.
template <class P>
void packed_rows(const TensorView& w, const Acts& a, int64_t nt, int64_t o0, int64_t o1, float* y) {
  const int64_t n_out = w.n_rows(), nb = a.n / P::kQK;
  const int64_t groups = n_out / kPackRows;
  const uint8_t* pk = static_cast<const uint8_t*>(w.packed);
  const uint8_t* wb = static_cast<const uint8_t*>(w.data);
  const size_t ws = w.row_size();
  // Prefetch only for a decode step (one or two tokens), and not for Q8_0: a larger product
  // reuses each block for its C tokens and is not bound by the weight stream.
  size_t pf = 0;
  if (P::kStreamPrefetch && nt <= 2) pf = static_cast<size_t>(stream_prefetch());
  auto one = [&](int64_t o) {
    for (int64_t t = 0; t < nt; ++t) packed_row<P>(wb + o * ws, a, t, y + t * n_out + o);
  };
  int64_t o = o0;
  while (o < o1 && o % kPackRows != 0) one(o++);  // up to a group boundary
  const int64_t g0 = o / kPackRows, g1 = std::min(groups, o1 / kPackRows);  // whole groups inside
  if (g1 > g0) {
    for (int64_t p0 = 0; p0 < nt; p0 += kTokPanel) {
      const int64_t p1 = std::min(nt, p0 + kTokPanel);
      for (int64_t g = g0; g < g1; ++g) {
        const uint8_t* gp = pk + static_cast<size_t>(g * nb) * P::kBytes;
        float* yg = y + g * kPackRows;
        int64_t t = p0;
        // Full tiles, then the rest in tiles of 4, 2 and 1 tokens (a decode batch of a few
        // sequences reads each group's weights once, not once per token).
        if constexpr (P::kQK == 256) {
          for (; t + kPackCols <= p1; t += kPackCols) packed_tile_k<P, kPackCols>(gp, a, t, yg + t * n_out, n_out);
          if constexpr (kPackCols > 4)
            for (; t + 4 <= p1; t += 4) packed_tile_k<P, 4>(gp, a, t, yg + t * n_out, n_out);
          for (; t + 2 <= p1; t += 2) packed_tile_k<P, 2>(gp, a, t, yg + t * n_out, n_out, pf);
          for (; t < p1; ++t) packed_tile_k<P, 1>(gp, a, t, yg + t * n_out, n_out, pf);
        } else {
          for (; t + kPackCols <= p1; t += kPackCols) packed_tile<P, kPackCols>(gp, a, t, yg + t * n_out, n_out);
          if constexpr (kPackCols > 4)
            for (; t + 4 <= p1; t += 4) packed_tile<P, 4>(gp, a, t, yg + t * n_out, n_out);
          for (; t + 2 <= p1; t += 2) packed_tile<P, 2>(gp, a, t, yg + t * n_out, n_out, pf);
          for (; t < p1; ++t) packed_tile<P, 1>(gp, a, t, yg + t * n_out, n_out, pf);
        }
      }
    }
    o = g1 * kPackRows;
  }
  while (o < o1) one(o++);  // rows past the last whole group
}

template <class P>
void pack_groups(const TensorView& w, uint8_t* dst) {
  const int64_t nb = w.ne[0] / P::kQK, groups = w.n_rows() / kPackRows;
  for (int64_t g = 0; g < groups; ++g) {
    const typename P::Block* rows[kPackRows];
    for (int r = 0; r < kPackRows; ++r) rows[r] = reinterpret_cast<const typename P::Block*>(w.row(g * kPackRows + r));
    for (int64_t b = 0; b < nb; ++b) P::pack(rows, b, dst + static_cast<size_t>(g * nb + b) * P::kBytes);
  }
}

// ---------------------------------------------------------------------------------------------
// k-quants against Q8_K activations.

// vpshufb controls broadcasting 16-bit word g (0..7) of each 128-bit lane.
alignas(32) constexpr uint8_t kWordBcast[8][32] = {
#define LC_W(g) {2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, \
                 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1, 2*g, 2*g+1}
    LC_W(0), LC_W(1), LC_W(2), LC_W(3), LC_W(4), LC_W(5), LC_W(6), LC_W(7)
#undef LC_W
};
// Low lane word 2k, high lane word 2k+1 (the two groups of 16 one 32-byte vector spans).
alignas(32) constexpr uint8_t kPairBcast[4][32] = {
#define LC_P(k) {4*k, 4*k+1, 4*k, 4*k+1, 4*k, 4*k+1, 4*k, 4*k+1, 4*k, 4*k+1, 4*k, 4*k+1, 4*k, 4*k+1, 4*k, 4*k+1, \
                 4*k+2, 4*k+3, 4*k+2, 4*k+3, 4*k+2, 4*k+3, 4*k+2, 4*k+3, 4*k+2, 4*k+3, 4*k+2, 4*k+3, 4*k+2, 4*k+3, 4*k+2, 4*k+3}
    LC_P(0), LC_P(1), LC_P(2), LC_P(3)
#undef LC_P
};

inline __m256i ctl(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Q4_K / Q5_K (Five = true): 8 groups of 32, 6-bit scales and mins.
template <bool Five, int R, int C>
void tile_q45k(const uint8_t* w, size_t ws, const Acts& a, int64_t t0, float* y, int64_t ldy) {
  using B = std::conditional_t<Five, BlockQ5_K, BlockQ4_K>;
  const int64_t nb = a.n / 256;
  const __m256i m4 = _mm256_set1_epi8(15), m16 = _mm256_set1_epi8(16);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const B& blk = reinterpret_cast<const B*>(w + r * ws)[b];
      uint32_t u[3];
      std::memcpy(u, blk.scales, 12);
      const uint32_t sc_lo = u[0] & 0x3f3f3f3f, mn_lo = u[1] & 0x3f3f3f3f;
      const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 6) & 0x03030303) << 4;
      const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 6) & 0x03030303) << 4;
      const __m256i scw = _mm256_broadcastsi128_si256(
          _mm_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0)));
      const __m256i mn32 =
          _mm256_cvtepu8_epi32(_mm_setr_epi32(static_cast<int>(mn_lo), static_cast<int>(mn_hi), 0, 0));
      __m256i isum[C];
      for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
      [[maybe_unused]] __m256i hb;
      if constexpr (Five) hb = ld(blk.qh);
      for (int k = 0; k < 4; ++k) {
        const __m256i raw = ld(blk.qs + 32 * k);
        __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if constexpr (Five) {
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), m16));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), m16));
          hb = _mm256_srli_epi16(hb, 2);
        }
        const __m256i s0 = _mm256_shuffle_epi8(scw, ctl(kWordBcast[2 * k]));
        const __m256i s1 = _mm256_shuffle_epi8(scw, ctl(kWordBcast[2 * k + 1]));
        for (int c = 0; c < C; ++c) {
          const int8_t* yq = a.qs + (t0 + c) * a.n + 256 * b + 64 * k;
          const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld(yq)), s0);
          const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld(yq + 32)), s1);
          isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(p0, p1));
        }
      }
      const __m256 dw = simd::bcast_f16(blk.d), mw = simd::bcast_f16(blk.dmin);
      for (int c = 0; c < C; ++c) {
        const __m256 dx = _mm256_set1_ps(a.d[(t0 + c) * nb + b]);
        const __m256i mp = _mm256_mullo_epi32(mn32, ld(a.bs32 + (t0 + c) * (a.n / 32) + 8 * b));
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(dw, dx), acc[r][c]);
        acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mp), _mm256_mul_ps(mw, dx), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = simd::hsum(acc[r][c]);
}

template <int R, int C>
void tile_q6k(const uint8_t* w, size_t ws, const Acts& a, int64_t t0, float* y, int64_t ldy) {
  const int64_t nb = a.n / 256;
  const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(w + r * ws)[b];
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales));
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
      __m256i isum[C];
      for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i l0 = ld(blk.ql + 64 * h), l1 = ld(blk.ql + 64 * h + 32), hb = ld(blk.qh + 32 * h);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        const __m256i base = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(sc16, 1)
                                                           : _mm256_castsi256_si128(sc16));
        __m256i s[4];
        for (int k = 0; k < 4; ++k) s[k] = _mm256_shuffle_epi8(base, ctl(kPairBcast[k]));
        for (int c = 0; c < C; ++c) {
          const int8_t* yq = a.qs + (t0 + c) * a.n + 256 * b + 128 * h;
          for (int k = 0; k < 4; ++k)
            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], ld(yq + 32 * k)), s[k]));
        }
      }
      const __m256 dw = simd::bcast_f16(blk.d);
      for (int c = 0; c < C; ++c) {
        // q - 32: subtract 32 * sum_g scale_g * bsum_g.
        const __m256i corr = _mm256_madd_epi16(sc16, ld(a.bs16 + (t0 + c) * (a.n / 16) + 16 * b));
        const __m256i tot = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(corr, 5));
        const __m256 dx = _mm256_set1_ps(a.d[(t0 + c) * nb + b]);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(dw, dx), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = simd::hsum(acc[r][c]);
}

// ---------------------------------------------------------------------------------------------
// Float weights.

#if defined(LC_AVX512)
using VF = __m512;
constexpr int kVL = 16;
inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VF vload(const uint16_t* p, DType t) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (t == DType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(VF v) { return _mm512_reduce_add_ps(v); }
#else
using VF = __m256;
constexpr int kVL = 8;
inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VF vload(const uint16_t* p, DType t) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (t == DType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(VF v) { return simd::hsum(v); }
#endif

template <DType T>
struct FW {
  using E = std::conditional_t<T == DType::F32, float, uint16_t>;
  static VF load(const E* p) {
    if constexpr (T == DType::F32) return vload(p);
    else return vload(p, T);
  }
  static float scalar(E v) {
    if constexpr (T == DType::F32) return v;
    else if constexpr (T == DType::F16) return fp16_to_fp32(v);
    else return bf16_to_fp32(v);
  }
};

template <DType T, int R, int C>
void tile_f(const uint8_t* w, size_t ws, const float* x, int64_t n, int64_t t0, float* y, int64_t ldy) {
  using W = FW<T>;
  using E = typename W::E;
  const E* wr[R];
  const float* xr[C];
  VF acc[R][C];
  for (int r = 0; r < R; ++r) {
    wr[r] = reinterpret_cast<const E*>(w + r * ws);
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  }
  for (int c = 0; c < C; ++c) xr[c] = x + (t0 + c) * n;
  int64_t i = 0;
  for (; i + kVL <= n; i += kVL) {
    VF wv[R];
    for (int r = 0; r < R; ++r) wv[r] = W::load(wr[r] + i);
    for (int c = 0; c < C; ++c) {
      const VF xv = vload(xr[c] + i);
      for (int r = 0; r < R; ++r) acc[r][c] = vfma(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = vsum(acc[r][c]);
      for (int64_t j = i; j < n; ++j) s += W::scalar(wr[r][j]) * xr[c][j];
      y[c * ldy + r] = s;
    }
}

// Packed float weights (F16, BF16): a group of R rows stored column by column, column k being
// the R rows' element k (2R bytes), so that one load and one conversion give a vector whose
// lane r is row r's weight and one FMA against the broadcast activation advances R rows.
// Every (row, token) output is one FMA chain over the columns in order, acc = fma(w_k, x_k,
// acc) from 0, whatever the tile shape: the same bits for any n_tokens, any split of the
// rows and the scalar tail rows. Tiles: G groups x C tokens, G = 8 (AVX-512) or 4 groups for
// one token (independent chains hide the FMA latency), 2 groups x 8 (4) tokens in prefill.
template <DType T>
inline pv::VF load_pf(const uint16_t* p) {
#if defined(LC_VNNI)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (T == DType::F16) return _mm512_cvtph_ps(h);
  else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (T == DType::F16) return _mm256_cvtph_ps(h);
  else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#endif
}

// G groups from g (gs elements apart) x C tokens from t0; y points at y[t0, first row of g].
template <DType T, int G, int C>
void packed_tile_f(const uint16_t* g, size_t gs, const float* x, int64_t n, int64_t t0, float* y, int64_t ldy) {
  constexpr int R = pv::kR;
  pv::VF acc[G][C];
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = pv::fzero();
  const float* xr = x + t0 * n;
  for (int64_t k = 0; k < n; ++k) {
    pv::VF w[G];
    for (int i = 0; i < G; ++i) w[i] = load_pf<T>(g + i * gs + k * R);
    for (int c = 0; c < C; ++c) {
      const pv::VF xb = pv::fset1(xr[c * n + k]);
      for (int i = 0; i < G; ++i) acc[i][c] = pv::fmadd(w[i], xb, acc[i][c]);
    }
  }
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < C; ++c) pv::store(y + c * ldy + i * R, acc[i][c]);
}

// Groups are kPfPad elements (one cache line) further apart than their n * R elements: model
// widths are multiples of 128, which would put the decode tile's 8 streams exactly a multiple
// of 4 KiB apart, on the same L1 sets.
constexpr int64_t kPfPad = 32;
#if defined(LC_VNNI)
constexpr int kPfDecodeGroups = 8, kPfCols = 8;
#else
constexpr int kPfDecodeGroups = 4, kPfCols = 4;
#endif

template <DType T>
void packed_rows_f(const TensorView& w, const float* x, int64_t nt, int64_t o0, int64_t o1, float* y) {
  const int64_t n_out = w.n_rows(), n = w.ne[0];
  const int64_t groups = n_out / kPackRows;
  const size_t gs = static_cast<size_t>(n * kPackRows + kPfPad);  // elements from group to group
  const uint16_t* pk = static_cast<const uint16_t*>(w.packed);
  auto one = [&](int64_t o) {  // a row outside the whole groups, from the file's layout
    const uint16_t* row = reinterpret_cast<const uint16_t*>(w.row(o));
    for (int64_t t = 0; t < nt; ++t) {
      float acc = 0;
      for (int64_t k = 0; k < n; ++k) acc = std::fma(FW<T>::scalar(row[k]), x[t * n + k], acc);
      y[t * n_out + o] = acc;
    }
  };
  int64_t o = o0;
  while (o < o1 && o % kPackRows != 0) one(o++);
  const int64_t g0 = o / kPackRows, g1 = std::min(groups, o1 / kPackRows);
  auto tiles = [&]<int G>(int64_t g, int64_t t0, int64_t t1) {
    const uint16_t* gp = pk + static_cast<size_t>(g) * gs;
    float* yg = y + g * kPackRows;
    int64_t t = t0;
    for (; t + kPfCols <= t1; t += kPfCols) packed_tile_f<T, G, kPfCols>(gp, gs, x, n, t, yg + t * n_out, n_out);
    if constexpr (kPfCols > 4)
      for (; t + 4 <= t1; t += 4) packed_tile_f<T, G, 4>(gp, gs, x, n, t, yg + t * n_out, n_out);
    for (; t + 2 <= t1; t += 2) packed_tile_f<T, G, 2>(gp, gs, x, n, t, yg + t * n_out, n_out);
    for (; t < t1; ++t) packed_tile_f<T, G, 1>(gp, gs, x, n, t, yg + t * n_out, n_out);
  };
  if (g1 > g0) {
    if (nt == 1) {
      int64_t g = g0;
      for (; g + kPfDecodeGroups <= g1; g += kPfDecodeGroups)
        packed_tile_f<T, kPfDecodeGroups, 1>(pk + g * gs, gs, x, n, 0, y + g * kPackRows, n_out);
      for (; g + 2 <= g1; g += 2) packed_tile_f<T, 2, 1>(pk + g * gs, gs, x, n, 0, y + g * kPackRows, n_out);
      for (; g < g1; ++g) packed_tile_f<T, 1, 1>(pk + g * gs, gs, x, n, 0, y + g * kPackRows, n_out);
    } else {
      for (int64_t p0 = 0; p0 < nt; p0 += kTokPanel) {
        const int64_t p1 = std::min(nt, p0 + kTokPanel);
        int64_t g = g0;
        for (; g + 2 <= g1; g += 2) tiles.template operator()<2>(g, p0, p1);
        for (; g < g1; ++g) tiles.template operator()<1>(g, p0, p1);
      }
    }
    o = g1 * kPackRows;
  }
  while (o < o1) one(o++);
}

#if defined(LC_BF16_DOT)
// Packed BF16 with bf16 dot products (LC_BF16_DOT): a group of R = 16 rows, every row padded
// to an even width, stored pair of columns by pair: pair j is 16 words whose word r is row r's
// (w[2j], w[2j+1]), so one vdpbf16ps against the broadcast activation pair (x[2j], x[2j+1])
// advances all 16 rows by two columns. Rows past n_out fill the last group with zeros, so every
// output, the last rows included, comes out of the same instruction chain (pairs in order, from
// 0) whatever the tile shape, the token count or the split of the rows.
inline int64_t bf_pairs(int64_t n) { return (n + 1) / 2; }
inline size_t bf_group_elems(int64_t n) { return static_cast<size_t>(bf_pairs(n) * 2 * pv::kR + kPfPad); }

// G groups from g (gs elements apart) x C tokens from t0 of the pairs xp (np per token).
template <int G, int C>
void packed_tile_bf(const uint16_t* g, size_t gs, const uint32_t* xp, int64_t np, int64_t t0, float* y,
                    int64_t ldy) {
  constexpr int R = pv::kR;
  __m512 acc[G][C];
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_setzero_ps();
  const uint32_t* xr = xp + t0 * np;
  for (int64_t j = 0; j < np; ++j) {
    __m512bh w[G];
    for (int i = 0; i < G; ++i) w[i] = (__m512bh)_mm512_loadu_si512(g + i * gs + j * 2 * R);
    for (int c = 0; c < C; ++c) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(xr[c * np + j]));
      for (int i = 0; i < G; ++i) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], w[i], xb);
    }
  }
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy + i * R, acc[i][c]);
}

// Rows [o0, o1) of y = x W^T: whole groups straight into y, a group that [o0, o1) cuts through
// (or the zero-padded last one) into a scratch tile first.
void packed_rows_bf(const TensorView& w, const Acts& a, int64_t nt, int64_t o0, int64_t o1, float* y) {
  constexpr int64_t R = pv::kR;
  const int64_t n_out = w.n_rows(), np = bf_pairs(w.ne[0]);
  const size_t gs = bf_group_elems(w.ne[0]);
  const uint16_t* pk = static_cast<const uint16_t*>(w.packed);
  const uint32_t* xp = a.bf;
  auto inside = [&](int64_t g) { return g * R >= o0 && (g + 1) * R <= o1; };
  // One group x tokens [t0, t1): into y when whole, else through a scratch tile.
  auto group = [&](int64_t g, int64_t t0, int64_t t1) {
    const uint16_t* gp = pk + static_cast<size_t>(g) * gs;
    if (inside(g)) {
      float* yg = y + g * R;
      int64_t t = t0;
      for (; t + kPfCols <= t1; t += kPfCols) packed_tile_bf<1, kPfCols>(gp, gs, xp, np, t, yg + t * n_out, n_out);
      for (; t + 4 <= t1; t += 4) packed_tile_bf<1, 4>(gp, gs, xp, np, t, yg + t * n_out, n_out);
      for (; t < t1; ++t) packed_tile_bf<1, 1>(gp, gs, xp, np, t, yg + t * n_out, n_out);
      return;
    }
    const int64_t r0 = std::max(o0, g * R), r1 = std::min(o1, (g + 1) * R);
    float tmp[R];
    for (int64_t t = t0; t < t1; ++t) {
      packed_tile_bf<1, 1>(gp, gs, xp, np, t, tmp, R);
      std::memcpy(y + t * n_out + r0, tmp + (r0 - g * R), static_cast<size_t>(r1 - r0) * sizeof(float));
    }
  };
  const int64_t g0 = o0 / R, g1 = (o1 + R - 1) / R;
  if (nt == 1) {
    int64_t g = g0;
    for (; g + kPfDecodeGroups <= g1 && inside(g) && inside(g + kPfDecodeGroups - 1); g += kPfDecodeGroups)
      packed_tile_bf<kPfDecodeGroups, 1>(pk + g * gs, gs, xp, np, 0, y + g * R, n_out);
    for (; g < g1; ++g) group(g, 0, 1);
    return;
  }
  for (int64_t p0 = 0; p0 < nt; p0 += kTokPanel) {
    const int64_t p1 = std::min(nt, p0 + kTokPanel);
    int64_t g = g0;
    for (; g + 2 <= g1 && inside(g) && inside(g + 1); g += 2) {
      const uint16_t* gp = pk + static_cast<size_t>(g) * gs;
      float* yg = y + g * R;
      int64_t t = p0;
      for (; t + kPfCols <= p1; t += kPfCols) packed_tile_bf<2, kPfCols>(gp, gs, xp, np, t, yg + t * n_out, n_out);
      for (; t + 4 <= p1; t += 4) packed_tile_bf<2, 4>(gp, gs, xp, np, t, yg + t * n_out, n_out);
      for (; t < p1; ++t) packed_tile_bf<2, 1>(gp, gs, xp, np, t, yg + t * n_out, n_out);
    }
    for (; g < g1; ++g) group(g, p0, p1);
  }
}

void pack_bf_pairs(const TensorView& w, uint16_t* dst) {
  constexpr int64_t R = pv::kR;
  const int64_t n = w.ne[0], n_out = w.n_rows(), groups = (n_out + R - 1) / R;
  const size_t gs = bf_group_elems(n);
  std::memset(dst, 0, static_cast<size_t>(groups) * gs * sizeof(uint16_t));
  for (int64_t o = 0; o < n_out; ++o) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(w.row(o));
    uint16_t* d = dst + static_cast<size_t>(o / R) * gs + (o % R) * 2;
    for (int64_t k = 0; k < n; ++k) d[(k / 2) * 2 * R + (k % 2)] = row[k];
  }
}
#endif

void pack_float(const TensorView& w, uint16_t* dst) {
  const int64_t n = w.ne[0], groups = w.n_rows() / kPackRows;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < kPackRows; ++r) {
      const uint16_t* row = reinterpret_cast<const uint16_t*>(w.row(g * kPackRows + r));
      uint16_t* d = dst + static_cast<size_t>(g * (n * kPackRows + kPfPad)) + r;
      for (int64_t k = 0; k < n; ++k) d[k * kPackRows] = row[k];
    }
}

// ---------------------------------------------------------------------------------------------

thread_local Buffer<float> tl_rows;  // per thread: weight rows widened to f32

void blas_init() {
  static std::once_flag once;
  // We split rows over our own pool; OpenBLAS threads would fight it for the cores.
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Rows [o0, o1) of y = x W^T with sgemm on f32 panels.
void blas_rows(const TensorView& w, int64_t o0, int64_t o1, const float* x, int64_t nt, float* y) {
  const int64_t n_in = w.ne[0], n_out = w.n_rows();
  if (w.type == DType::F32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nt), static_cast<int>(o1 - o0),
                static_cast<int>(n_in), 1.0f, x, static_cast<int>(n_in),
                reinterpret_cast<const float*>(w.row(o0)), static_cast<int>(n_in), 0.0f, y + o0,
                static_cast<int>(n_out));
    return;
  }
  grow(tl_rows, static_cast<size_t>(kBlasPanel * n_in));
  for (int64_t p = o0; p < o1; p += kBlasPanel) {
    const int64_t pr = std::min(kBlasPanel, o1 - p);
    for (int64_t r = 0; r < pr; ++r) dequantize_row(w.type, w.row(p + r), tl_rows.data() + r * n_in, n_in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nt), static_cast<int>(pr),
                static_cast<int>(n_in), 1.0f, x, static_cast<int>(n_in), tl_rows.data(),
                static_cast<int>(n_in), 0.0f, y + p, static_cast<int>(n_out));
  }
}

// How a weight type is multiplied: which activations it needs and which kernel takes its rows.
enum class Path { kFloat, kBlas, kQ32, kK, kFallback, kBf16 };

Path path_of(DType t, int64_t nt, bool packed) {
#if defined(LC_BF16_DOT)
  if (t == DType::BF16 && packed) return Path::kBf16;
#else
  (void)packed;
#endif
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: {
      const FloatGemm g = g_float_gemm.load(std::memory_order_relaxed);
      const bool blas = nt >= kBlasMinTokens &&
                        (g == FloatGemm::kBlas || (g == FloatGemm::kAuto && kFloatGemmDefault == FloatGemm::kBlas));
      return blas ? Path::kBlas : Path::kFloat;
    }
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
      return Path::kQ32;
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return Path::kK;
    default:
      return Path::kFallback;
  }
}

// Rows [b, e) of y = x W^T, once the activations `a` of the path are prepared (none for float).
void rows_of(const TensorView& w, Path path, const float* x, const Acts& a, int64_t nt, int64_t b, int64_t e,
             float* y) {
  const int64_t n_in = w.ne[0], n_out = w.n_rows();
  const uint8_t* wb = static_cast<const uint8_t*>(w.data);
  const size_t ws = w.row_size();
  if (w.packed && w.type == DType::F16) return packed_rows_f<DType::F16>(w, x, nt, b, e, y);
  if (w.packed && w.type == DType::BF16) {
#if defined(LC_BF16_DOT)
    return packed_rows_bf(w, a, nt, b, e, y);
#else
    return packed_rows_f<DType::BF16>(w, x, nt, b, e, y);
#endif
  }
  switch (path) {
    case Path::kBf16:  // packed BF16 only, handled above
      return;
    case Path::kBlas:
      return blas_rows(w, b, e, x, nt, y);
    case Path::kFloat:
      return for_tiles<kFloatDecodeRows>(b, e, nt, [&]<int R, int C>(int64_t o, int64_t t) {
        float* yo = y + t * n_out + o;
        if (w.type == DType::F32) tile_f<DType::F32, R, C>(wb + o * ws, ws, x, n_in, t, yo, n_out);
        else if (w.type == DType::F16) tile_f<DType::F16, R, C>(wb + o * ws, ws, x, n_in, t, yo, n_out);
        else tile_f<DType::BF16, R, C>(wb + o * ws, ws, x, n_in, t, yo, n_out);
      });
    case Path::kQ32:
      if (w.packed && w.type == DType::Q8_0) return packed_rows<PQ8_0>(w, a, nt, b, e, y);
      if (w.packed && w.type == DType::Q4_0) return packed_rows<PQ4_0>(w, a, nt, b, e, y);
      if (w.packed && w.type == DType::Q4_1) return packed_rows<PQ4_1>(w, a, nt, b, e, y);
      if (w.packed && w.type == DType::Q5_0) return packed_rows<PQ5_0>(w, a, nt, b, e, y);
      if (w.packed && w.type == DType::Q5_1) return packed_rows<PQ5_1>(w, a, nt, b, e, y);
      return for_tiles(b, e, nt, [&]<int R, int C>(int64_t o, int64_t t) {
        const uint8_t* wo = wb + o * ws;
        float* yo = y + t * n_out + o;
        switch (w.type) {
          case DType::Q4_0: return tile32<KQ4_0, R, C>(wo, ws, a, t, yo, n_out);
          case DType::Q4_1: return tile32<KQ4_1, R, C>(wo, ws, a, t, yo, n_out);
          case DType::Q5_0: return tile32<KQ5_0, R, C>(wo, ws, a, t, yo, n_out);
          case DType::Q5_1: return tile32<KQ5_1, R, C>(wo, ws, a, t, yo, n_out);
          default: return tile32<KQ8_0, R, C>(wo, ws, a, t, yo, n_out);
        }
      });
    case Path::kK:
      if (w.packed && w.type == DType::Q4_K) return packed_rows<PQ4_K>(w, a, nt, b, e, y);
      if (w.packed && w.type == DType::Q5_K) return packed_rows<PQ5_K>(w, a, nt, b, e, y);
      if (w.packed && w.type == DType::Q6_K) return packed_rows<PQ6_K>(w, a, nt, b, e, y);
      return for_tiles(b, e, nt, [&]<int R, int C>(int64_t o, int64_t tok) {
        float* yo = y + tok * n_out + o;
        if (w.type == DType::Q4_K) tile_q45k<false, R, C>(wb + o * ws, ws, a, tok, yo, n_out);
        else if (w.type == DType::Q5_K) tile_q45k<true, R, C>(wb + o * ws, ws, a, tok, yo, n_out);
        else tile_q6k<R, C>(wb + o * ws, ws, a, tok, yo, n_out);
      });
    case Path::kFallback: {
      // Types without an integer kernel (Q2_K, Q3_K): widen each weight row and take float dot
      // products with the dequantised Q8_K activations -- the same value the integer path would
      // give, up to float rounding, only slower.
      grow(tl_rows, static_cast<size_t>(n_in));
      for (int64_t o = b; o < e; ++o) {
        dequantize_row(w.type, w.row(o), tl_rows.data(), n_in);
        for (int64_t t = 0; t < nt; ++t) y[t * n_out + o] = dot_f32(tl_rows.data(), a.f + t * n_in, n_in);
      }
      return;
    }
  }
}

}  // namespace

void set_float_gemm(FloatGemm g) { g_float_gemm.store(g, std::memory_order_relaxed); }
FloatGemm float_gemm() { return g_float_gemm.load(std::memory_order_relaxed); }
void set_stream_prefetch(int bytes) { g_stream_prefetch.store(std::max(0, bytes), std::memory_order_relaxed); }
int stream_prefetch() { return g_stream_prefetch.load(std::memory_order_relaxed); }
bool bf16_dot_products() {
#if defined(LC_BF16_DOT)
  return true;
#else
  return false;
#endif
}

bool matmul_supports(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q4_1:
    case DType::Q5_0: case DType::Q5_1: case DType::Q8_0: case DType::Q2_K: case DType::Q3_K:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const TensorView* ws[1] = {&w};
  float* ys[1] = {y};
  matmul_multi(ws, ys, x, n_tokens, pool);
}

namespace {
// The activations path's kernels need, in the calling thread's scratch (tokens split over the
// pool when one is given).
Acts prepare_acts(Path path, const float* x, int64_t nt, int64_t n_in, ThreadPool* pool) {
  Acts a;
  if (path == Path::kQ32) a = quantize_acts(ActKind::kQ8_32, x, nt, n_in, pool);
  else if (path == Path::kK) a = quantize_acts(ActKind::kQ8_K, x, nt, n_in, pool);
  else if (path == Path::kFallback) a = quantize_acts(ActKind::kQ8_KFloat, x, nt, n_in, pool);
  else if (path == Path::kBlas) blas_init();
#if defined(LC_BF16_DOT)
  else if (path == Path::kBf16) a = bf16_acts(x, nt, n_in, pool);
#endif
  return a;
}

int64_t grain_of(Path path) { return path == Path::kBlas ? 16 : path == Path::kFallback ? kRM : kPackRows; }

// Whether every matrix takes the first one's path and input width (one preparation for all).
bool same_path(std::span<const TensorView* const> ws, int64_t n_tokens, Path path) {
  bool same = true;
  for (const TensorView* w : ws) {
    LC_CHECK(matmul_supports(w->type));
    LC_CHECK(w->ne[0] % traits(w->type).block_size == 0);  // whole blocks per row
    same = same && w->ne[0] == ws[0]->ne[0] && path_of(w->type, n_tokens, w->packed != nullptr) == path;
  }
  return same;
}
}  // namespace

void matmul_multi(std::span<const TensorView* const> ws, std::span<float* const> ys, const float* x,
                  int64_t n_tokens, ThreadPool& pool) {
  LC_CHECK(ws.size() == ys.size());
  if (ws.empty() || n_tokens <= 0) return;
  const int64_t n_in = ws[0]->ne[0];
  const Path path = path_of(ws[0]->type, n_tokens, ws[0]->packed != nullptr);
  if (!same_path(ws, n_tokens, path)) {  // one call per matrix: each quantises the activations its type needs
    for (size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, n_tokens, ys[i], pool);
    return;
  }
  const Acts a = prepare_acts(path, x, n_tokens, n_in, &pool);
  // The rows of all the matrices, one after the other, in one parallel loop: contiguous ranges
  // per thread, cut where they cross from one matrix to the next.
  int64_t total = 0;
  for (const TensorView* w : ws) total += w->n_rows();
  if (total == 0) return;
  pool.parallel_for(total, [&](int64_t b, int64_t e, int) {
    int64_t first = 0;  // the first row of matrix i in the joint numbering
    for (size_t i = 0; i < ws.size() && first < e; first += ws[i]->n_rows(), ++i) {
      const int64_t lo = std::max(b, first), hi = std::min(e, first + ws[i]->n_rows());
      if (lo < hi) rows_of(*ws[i], path, x, a, n_tokens, lo - first, hi - first, ys[i]);
    }
  }, grain_of(path));
}

int64_t matmul_grain(const TensorView& w, int64_t n_tokens) {
  return grain_of(path_of(w.type, n_tokens, w.packed != nullptr));
}

void matmul_rows(std::span<const TensorView* const> ws, std::span<float* const> ys, const float* x,
                 int64_t n_tokens, std::span<const RowRange> rows) {
  LC_CHECK(ws.size() == ys.size() && ws.size() == rows.size());
  if (ws.empty() || n_tokens <= 0) return;
  const Path path = path_of(ws[0]->type, n_tokens, ws[0]->packed != nullptr);
  if (!same_path(ws, n_tokens, path)) {
    for (size_t i = 0; i < ws.size(); ++i) matmul_rows({&ws[i], 1}, {&ys[i], 1}, x, n_tokens, {&rows[i], 1});
    return;
  }
  const Acts a = prepare_acts(path, x, n_tokens, ws[0]->ne[0], nullptr);
  for (size_t i = 0; i < ws.size(); ++i) {
    const int64_t b = std::max<int64_t>(0, rows[i].b), e = std::min(rows[i].e, ws[i]->n_rows());
    if (b < e) rows_of(*ws[i], path, x, a, n_tokens, b, e, ys[i]);
  }
}

bool can_pack(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::F16: case DType::BF16:
      return true;
    default:
      return false;
  }
}

size_t packed_bytes(const TensorView& w) {
  if (!can_pack(w.type)) return 0;
  const int64_t qk = traits(w.type).block_size;
  if (w.ne[0] % qk != 0) return 0;
  size_t per = 0;
  switch (w.type) {
    case DType::BF16:
#if defined(LC_BF16_DOT)
      return static_cast<size_t>((w.n_rows() + kPackRows - 1) / kPackRows) * bf_group_elems(w.ne[0]) * 2;
#endif
      [[fallthrough]];
    case DType::F16:
      return static_cast<size_t>(w.n_rows() / kPackRows) * static_cast<size_t>(w.ne[0] * kPackRows + kPfPad) * 2;
    case DType::Q8_0: per = PQ8_0::kBytes; break;
    case DType::Q4_0: per = PQ4_0::kBytes; break;
    case DType::Q4_1: per = PQ4_1::kBytes; break;
    case DType::Q5_0: per = PQ5_0::kBytes; break;
    case DType::Q5_1: per = PQ5_1::kBytes; break;
    case DType::Q4_K: per = PQ4_K::kBytes; break;
    case DType::Q5_K: per = PQ5_K::kBytes; break;
    default: per = PQ6_K::kBytes; break;
  }
  return static_cast<size_t>(w.n_rows() / kPackRows) * static_cast<size_t>(w.ne[0] / qk) * per;
}

void pack_matrix(const TensorView& w, void* dst) {
  LC_CHECK(can_pack(w.type) && w.ne[0] % traits(w.type).block_size == 0);
  uint8_t* d = static_cast<uint8_t*>(dst);
  switch (w.type) {
    case DType::Q8_0: return pack_groups<PQ8_0>(w, d);
    case DType::Q4_0: return pack_groups<PQ4_0>(w, d);
    case DType::Q4_1: return pack_groups<PQ4_1>(w, d);
    case DType::Q5_0: return pack_groups<PQ5_0>(w, d);
    case DType::Q5_1: return pack_groups<PQ5_1>(w, d);
    case DType::Q4_K: return pack_groups<PQ4_K>(w, d);
    case DType::Q5_K: return pack_groups<PQ5_K>(w, d);
    case DType::Q6_K: return pack_groups<PQ6_K>(w, d);
#if defined(LC_BF16_DOT)
    case DType::BF16: return pack_bf_pairs(w, reinterpret_cast<uint16_t*>(d));
#endif
    default: return pack_float(w, reinterpret_cast<uint16_t*>(d));
  }
}

}  // namespace lc::kernels
