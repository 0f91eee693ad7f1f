// Block layouts (hand-built blocks), fast vs reference dequantisation, quantise round trips,
// activation quantisers bit-exact against the references, and f16/bf16 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "test_util.h"

namespace lc::kernels {
namespace {

using test::random_floats;
using test::random_row;

// Both decoders (reference and fast) must give `want` for the block.
void expect_decodes(DType t, const void* blk, const std::vector<float>& want) {
  const int64_t n = static_cast<int64_t>(want.size());
  std::vector<float> r(want.size()), f(want.size());
  ASSERT_TRUE(ref::dequantize_row(t, blk, r.data(), n));
  dequantize_row(t, blk, f.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(r[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-7f) << dtype_name(t) << " ref i=" << i;
    EXPECT_NEAR(f[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-7f) << dtype_name(t) << " fast i=" << i;
  }
}

TEST(QuantLayout, Q4_0) {
  BlockQ4_0 b;
  b.d = fp32_to_fp16_ref(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) want[j] = (j - 8) * 0.5f, want[j + 16] = ((15 - j) - 8) * 0.5f;
  expect_decodes(DType::Q4_0, &b, want);
}

TEST(QuantLayout, Q4_1) {
  BlockQ4_1 b;
  b.d = fp32_to_fp16_ref(0.25f);
  b.m = fp32_to_fp16_ref(-1.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) want[j] = j * 0.25f - 1.5f, want[j + 16] = (15 - j) * 0.25f - 1.5f;
  expect_decodes(DType::Q4_1, &b, want);
}

TEST(QuantLayout, Q5_0AndQ5_1) {
  BlockQ5_0 b;
  BlockQ5_1 b1;
  b.d = b1.d = fp32_to_fp16_ref(2.0f);
  b1.m = fp32_to_fp16_ref(1.0f);
  const uint32_t qh = 0xA5C3F00Fu;  // element j gets bit j as its fifth bit
  std::memcpy(b.qh, &qh, 4);
  std::memcpy(b1.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = b1.qs[j] = static_cast<uint8_t>((j * 7 % 16) | (j * 3 % 16) << 4);
  std::vector<float> want(32), want1(32);
  for (int j = 0; j < 32; ++j) {
    const int nib = j < 16 ? (j * 7 % 16) : ((j - 16) * 3 % 16);
    const int q = nib + 16 * static_cast<int>((qh >> j) & 1);
    want[j] = (q - 16) * 2.0f;
    want1[j] = q * 2.0f + 1.0f;
  }
  expect_decodes(DType::Q5_0, &b, want);
  expect_decodes(DType::Q5_1, &b1, want1);
}

TEST(QuantLayout, Q8_0) {
  BlockQ8_0 b;
  b.d = fp32_to_fp16_ref(0.125f);
  std::vector<float> want(32);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128), want[j] = (j * 8 - 128) * 0.125f;
  expect_decodes(DType::Q8_0, &b, want);
}

// 6-bit scales/mins packed as the spec says, from the intended values.
void pack_k4_scales(const int* sc, const int* mn, uint8_t* s) {
  for (int g = 0; g < 4; ++g) {
    s[g] = static_cast<uint8_t>((sc[g] & 63) | ((sc[g + 4] >> 4) << 6));
    s[g + 4] = static_cast<uint8_t>((mn[g] & 63) | ((mn[g + 4] >> 4) << 6));
    s[g + 8] = static_cast<uint8_t>((sc[g + 4] & 15) | ((mn[g + 4] & 15) << 4));
  }
}

TEST(QuantLayout, Q4_KAndQ5_K) {
  const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
  const int mn[8] = {5, 6, 7, 63, 20, 40, 60, 31};
  BlockQ4_K b;
  BlockQ5_K b5;
  b.d = b5.d = fp32_to_fp16_ref(0.5f);
  b.dmin = b5.dmin = fp32_to_fp16_ref(0.25f);
  pack_k4_scales(sc, mn, b.scales);
  std::memcpy(b5.scales, b.scales, 12);
  int q[256], h[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 5 + i / 32) % 16, h[i] = (i * 13 / 7) % 2;
  // chunk c of 64: byte 32c + l holds element 64c + l (low) and 64c + 32 + l (high).
  std::memset(b5.qh, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      b.qs[32 * c + l] = b5.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | q[64 * c + 32 + l] << 4);
      b5.qh[l] |= static_cast<uint8_t>(h[64 * c + l] << (2 * c) | h[64 * c + 32 + l] << (2 * c + 1));
    }
  std::vector<float> want(256), want5(256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 32;
    want[i] = 0.5f * sc[g] * q[i] - 0.25f * mn[g];
    want5[i] = 0.5f * sc[g] * (q[i] + 16 * h[i]) - 0.25f * mn[g];
  }
  expect_decodes(DType::Q4_K, &b, want);
  expect_decodes(DType::Q5_K, &b5, want5);
}

TEST(QuantLayout, Q6_K) {
  BlockQ6_K b;
  b.d = fp32_to_fp16_ref(0.0625f);
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 37 + 11) % 64;
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g * 17 - 128);
  for (int hf = 0; hf < 2; ++hf)
    for (int l = 0; l < 32; ++l) {
      const int* qq = q + 128 * hf;
      b.ql[64 * hf + l] = static_cast<uint8_t>((qq[l] & 15) | (qq[l + 64] & 15) << 4);
      b.ql[64 * hf + l + 32] = static_cast<uint8_t>((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
      b.qh[32 * hf + l] = static_cast<uint8_t>((qq[l] >> 4) | (qq[l + 32] >> 4) << 2 | (qq[l + 64] >> 4) << 4 |
                                               (qq[l + 96] >> 4) << 6);
    }
  std::vector<float> want(256);
  for (int i = 0; i < 256; ++i) want[i] = 0.0625f * b.scales[i / 16] * (q[i] - 32);
  expect_decodes(DType::Q6_K, &b, want);
}

TEST(QuantLayout, Q2_KAndQ3_K) {
  int q2[256], sc[16], mn[16], hb[256], s3[16];
  for (int i = 0; i < 256; ++i) q2[i] = (i * 7 + i / 50) % 4, hb[i] = (i * 11 / 3) % 2;
  for (int g = 0; g < 16; ++g) sc[g] = (g * 5) % 16, mn[g] = 15 - g, s3[g] = (g * 23 + 3) % 64;
  BlockQ2_K b2;
  BlockQ3_K b3;
  b2.d = fp32_to_fp16_ref(0.5f);
  b2.dmin = fp32_to_fp16_ref(0.125f);
  b3.d = fp32_to_fp16_ref(0.25f);
  for (int g = 0; g < 16; ++g) b2.scales[g] = static_cast<uint8_t>(sc[g] | mn[g] << 4);
  std::memset(b2.qs, 0, 64);
  std::memset(b3.hmask, 0, 32);
  std::memset(b3.scales, 0, 12);
  for (int i = 0; i < 256; ++i) {
    const int half = i / 128, k = (i % 128) / 32, l = i % 32;
    b2.qs[32 * half + l] |= static_cast<uint8_t>(q2[i] << (2 * k));
    b3.hmask[l] |= static_cast<uint8_t>(hb[i] << (i / 32));
  }
  std::memcpy(b3.qs, b2.qs, 64);
  for (int g = 0; g < 16; ++g) {
    b3.scales[g % 8] |= static_cast<uint8_t>((s3[g] & 15) << (g < 8 ? 0 : 4));
    b3.scales[8 + g % 4] |= static_cast<uint8_t>((s3[g] >> 4) << (2 * (g / 4)));
  }
  std::vector<float> want2(256), want3(256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 16;
    want2[i] = 0.5f * sc[g] * q2[i] - 0.125f * mn[g];
    want3[i] = 0.25f * (s3[g] - 32) * (q2[i] - (hb[i] ? 0 : 4));
  }
  expect_decodes(DType::Q2_K, &b2, want2);
  expect_decodes(DType::Q3_K, &b3, want3);
}

TEST(Dequantize, FastMatchesReferenceOnRandomBlocks) {
  std::mt19937 rng(1);
  for (DType t : test::kAllWeightTypes) {
    for (int64_t n : {256, 512, 4096 + 256}) {
      const auto row = random_row(rng, t, n);
      std::vector<float> r(static_cast<size_t>(n)), f(static_cast<size_t>(n));
      ASSERT_TRUE(ref::dequantize_row(t, row.data(), r.data(), n));
      dequantize_row(t, row.data(), f.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(f[i], r[i], 1e-6f * std::fabs(r[i]) + 1e-9f) << dtype_name(t) << " n=" << n << " i=" << i;
    }
  }
}

TEST(Dequantize, OddLengthsOfPlainTypes) {
  std::mt19937 rng(2);
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {1, 7, 9, 17, 33, 100}) {
      const auto row = random_row(rng, t, n);
      std::vector<float> r(static_cast<size_t>(n)), f(static_cast<size_t>(n));
      ref::dequantize_row(t, row.data(), r.data(), n);
      dequantize_row(t, row.data(), f.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], r[i]);
    }
}

TEST(ActivationQuant, Q8_0MatchesReferenceBitExact) {
  std::mt19937 rng(3);
  for (int64_t n : {32, 64, 4096}) {
    auto x = random_floats(rng, n, -3, 3);
    x[5] = 0.5f * (3.0f / 127.0f);  // ties land somewhere; whatever they do, both agree
    for (int j = 32; j < std::min<int64_t>(n, 64); ++j) x[static_cast<size_t>(j)] = 0;  // an all-zero block
    std::vector<BlockQ8_0> a(static_cast<size_t>(n / 32)), b(static_cast<size_t>(n / 32));
    ASSERT_TRUE(quantize_row(DType::Q8_0, x.data(), a.data(), n));
    ref::quantize_row_q8_0(x.data(), b.data(), n);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(BlockQ8_0))) << n;
  }
}

TEST(ActivationQuant, Q8_KMatchesReferenceBitExact) {
  std::mt19937 rng(4);
  for (int64_t n : {256, 512, 4096}) {
    auto x = random_floats(rng, n, -2, 2);
    x[7] = 5, x[100] = -5;  // ties in magnitude: the first one sets the sign
    if (n > 256)
      for (int j = 256; j < 512; ++j) x[static_cast<size_t>(j)] = 0;
    std::vector<BlockQ8_K> a(static_cast<size_t>(n / 256)), b(static_cast<size_t>(n / 256));
    ASSERT_TRUE(quantize_row(DType::Q8_K, x.data(), a.data(), n));
    ref::quantize_row_q8_k(x.data(), b.data(), n);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].d, b[i].d);
      EXPECT_EQ(0, std::memcmp(a[i].qs, b[i].qs, 256));
      EXPECT_EQ(0, std::memcmp(a[i].bsums, b[i].bsums, 32));
    }
  }
}

// quantize_row then dequantize_row stays within the type's quantisation step.
TEST(Quantize, RoundTripWithinStep) {
  std::mt19937 rng(5);
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q8_K, DType::Q4_K, DType::Q6_K, DType::Q5_0, DType::Q5_1,
                  DType::Q5_K}) {
    ASSERT_TRUE(can_quantize(t));
    const int64_t n = 1024;
    auto x = random_floats(rng, n, -1, 1);
    for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] *= 0.01f;  // a small-range group
    std::vector<uint8_t> q(row_bytes(t, n));
    ASSERT_TRUE(quantize_row(t, x.data(), q.data(), n));
    std::vector<float> y(static_cast<size_t>(n)), yr(static_cast<size_t>(n));
    dequantize_row(t, q.data(), y.data(), n);
    ref::dequantize_row(t, q.data(), yr.data(), n);
    // Bound per block of g elements, from the block's largest magnitude / widest group range:
    // Q4_0 (and Q6_K per group): d = amax/8 and the +amax end clamps to 7, so up to one step; Q8_0: half a step plus
    // the f16 rounding of d; Q8_K: half a step. Q4_K/Q6_K (6/8-bit scales relative to the
    // super-block's largest): one step of the widest group. Q5_0: as Q4_0 with d = amax/16.
    // Q5_1 (d = range/31, rounded to nearest): half a step plus the f16 rounding of d (over 31
    // steps) and of the minimum. Q5_K: one step of the widest group, as Q4_K (its fitted scale
    // is at most range/30.5).
    const bool legacy = t == DType::Q4_0 || t == DType::Q8_0 || t == DType::Q5_0 || t == DType::Q5_1;
    const int64_t g = legacy ? 32 : 256;
    for (int64_t b = 0; b < n / g; ++b) {
      float amax = 0, wide = 0;
      for (int64_t i = b * g; i < b * g + g; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (int64_t s0 = b * g; s0 < b * g + g; s0 += 32) {
        float lo = 0, hi = 0;
        for (int64_t i = s0; i < s0 + 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
        wide = std::max(wide, hi - lo);
      }
      float bound = 0;
      switch (t) {
        case DType::Q4_0: bound = amax / 8 * 1.01f; break;
        case DType::Q8_0: bound = amax / 254 + amax * 1e-3f; break;
        case DType::Q8_K: bound = amax / 254 * 1.0001f; break;
        case DType::Q4_K: bound = wide / 15; break;
        case DType::Q5_0: bound = amax / 16 * 1.01f; break;
        case DType::Q5_1: {
          float lo = x[b * g], hi = x[b * g];
          for (int64_t i = b * g; i < b * g + g; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
          const float d = (hi - lo) / 31;
          bound = d / 2 + 31 * d / 2048 + std::fabs(lo) / 2048 + 1e-7f;
          break;
        }
        case DType::Q5_K: bound = wide / 31; break;
        default: bound = amax / 32 * 1.05f; break;  // Q6_K: the +amax end clamps to 31 steps
      }
      for (int64_t i = b * g; i < b * g + g; ++i) {
        ASSERT_EQ(y[i], yr[i]);
        ASSERT_LE(std::fabs(y[i] - x[i]), bound) << dtype_name(t) << " i=" << i;
      }
    }
  }
}

// ---- Q5_0, Q5_1, Q5_K: ggml's reference quantisers, worked by hand ----

// Q5_0: the value of largest magnitude is x[0] = -4 (the later +4 does not replace it), so
// d = -4 / -16 = 0.25 and q = trunc(x / 0.25 + 16.5): (j - 16) quarters give q = j; -2.625
// (10.5 quarters below zero) goes up to q = 6; +4 (16 quarters) is capped at 31.
TEST(QuantizeByHand, Q5_0) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = (j - 16) * 0.25f;
  x[5] = -2.625f;
  x[30] = 4.0f;
  BlockQ5_0 b;
  ASSERT_TRUE(quantize_row(DType::Q5_0, x, &b, 32));
  EXPECT_EQ(b.d, 0x3400);  // 0.25
  // Low nibble: q[j]; high nibble: q[j + 16] & 15. q = j but q[5] = 6, q[30] = 31.
  const uint8_t qs[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x56, 0x66, 0x77,
                          0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xFE, 0xFF};
  EXPECT_EQ(0, std::memcmp(b.qs, qs, 16));
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  EXPECT_EQ(qh, 0xFFFF0000u);  // q >= 16 exactly for j >= 16
}

// Q5_1: x[j] = -1 + j/8, so m = -1, d = 3.875 / 31 = 0.125 and q = trunc(8 (x + 1) + 0.5) = j,
// except x[6] = -1 + 6.5/8 (a tie: up to 7) and x[9] = -1 + 8.25/8 (down to 8).
TEST(QuantizeByHand, Q5_1) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = -1 + 0.125f * j;
  x[6] = -1 + 0.125f * 6.5f;
  x[9] = -1 + 0.125f * 8.25f;
  BlockQ5_1 b;
  ASSERT_TRUE(quantize_row(DType::Q5_1, x, &b, 32));
  EXPECT_EQ(b.d, 0x3000);  // 0.125
  EXPECT_EQ(b.m, 0xBC00);  // -1
  const uint8_t qs[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x67, 0x77,
                          0x88, 0x98, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF};
  EXPECT_EQ(0, std::memcmp(b.qs, qs, 16));
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  EXPECT_EQ(qh, 0xFFFF0000u);
}

// A Q5_K super-block of values the format holds exactly: group g is d * sc[g] * q - dmin * mn[g]
// with q a permutation of 0..31, d = 2^-8, dmin = 2^-7, and the largest scale and offset 63.
// The group fit finds each (sc[g] d, mn[g] dmin) (its first guess, range / 31, is already
// exact), the 6-bit quantisation against the largest gives back sc and mn, d = 63 d / 63, and
// every q comes back: the block is d, dmin, the packed sc/mn and the q of the construction.
void q5_k_exact_block(const int* sc, const int* mn, const int* q, float* x, BlockQ5_K* want) {
  const float d = 1.0f / 256, dmin = 1.0f / 128;
  for (int i = 0; i < 256; ++i) x[i] = d * sc[i / 32] * q[i] - dmin * mn[i / 32];
  want->d = fp32_to_fp16_ref(d);
  want->dmin = fp32_to_fp16_ref(dmin);
  pack_k4_scales(sc, mn, want->scales);
  std::memset(want->qh, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      want->qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
      want->qh[l] |= static_cast<uint8_t>((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
    }
}

TEST(QuantizeByHand, Q5_K) {
  const int sc[8] = {63, 10, 1, 33, 47, 5, 20, 60};
  const int mn[8] = {0, 63, 7, 12, 40, 2, 31, 63};
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (7 * (i % 32) + 3 * (i / 32)) % 32;  // 7 is odd: a permutation per group
  float x[256];
  BlockQ5_K want, got;
  q5_k_exact_block(sc, mn, q, x, &want);
  EXPECT_EQ(want.d, 0x1C00);
  EXPECT_EQ(want.dmin, 0x2000);
  ASSERT_TRUE(quantize_row(DType::Q5_K, x, &got, 256));
  EXPECT_EQ(got.d, want.d);
  EXPECT_EQ(got.dmin, want.dmin);
  EXPECT_EQ(0, std::memcmp(got.scales, want.scales, 12));
  EXPECT_EQ(0, std::memcmp(got.qh, want.qh, 32));
  EXPECT_EQ(0, std::memcmp(got.qs, want.qs, 128));
  std::vector<float> y(256);
  dequantize_row(DType::Q5_K, &got, y.data(), 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], x[i]) << i;
}

// Values each format represents exactly come back exactly, over many random blocks.
TEST(Quantize, Q5TypesExactOnRepresentableValues) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> q32(0, 31), e(-12, -2), off(0, 40), s63(1, 62), m63(0, 62), pos(0, 31);
  for (int trial = 0; trial < 200; ++trial) {
    // Q5_0: (q - 16) d with q = 0 present (the value of largest magnitude, -16 d) and d any f16.
    float x[256], y[256];
    const float d0 = fp16_to_fp32_ref(fp32_to_fp16_ref(std::ldexp(1.0f + q32(rng) / 37.0f, e(rng))));
    for (int j = 0; j < 32; ++j) x[j] = (q32(rng) - 16) * d0;
    x[pos(rng)] = -16 * d0;
    BlockQ5_0 b0;
    ASSERT_TRUE(quantize_row(DType::Q5_0, x, &b0, 32));
    dequantize_row(DType::Q5_0, &b0, y, 32);
    for (int j = 0; j < 32; ++j) ASSERT_EQ(y[j], x[j]) << "q5_0 trial " << trial << " j=" << j;
    // Q5_1: (q - k) d with q = 0 and q = 31 present, d a power of two.
    const float d1 = std::ldexp(1.0f, e(rng));
    const int k = off(rng);
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(q32(rng) - k) * d1;
    const int p0 = pos(rng), p1 = (p0 + 1 + pos(rng) % 31) % 32;
    x[p0] = static_cast<float>(-k) * d1;
    x[p1] = static_cast<float>(31 - k) * d1;
    BlockQ5_1 b1;
    ASSERT_TRUE(quantize_row(DType::Q5_1, x, &b1, 32));
    dequantize_row(DType::Q5_1, &b1, y, 32);
    for (int j = 0; j < 32; ++j) ASSERT_EQ(y[j], x[j]) << "q5_1 trial " << trial << " j=" << j;
    // Q5_K: random scales and offsets (one of each 63), levels 0 and 31 in every group.
    int sc[8], mn[8], q[256];
    for (int g = 0; g < 8; ++g) sc[g] = s63(rng), mn[g] = m63(rng);
    sc[pos(rng) % 8] = 63;
    mn[pos(rng) % 8] = 63;
    for (int g = 0; g < 8; ++g) {
      for (int l = 0; l < 32; ++l) q[32 * g + l] = q32(rng);
      const int a = pos(rng), c = (a + 1 + pos(rng) % 31) % 32;
      q[32 * g + a] = 0;
      q[32 * g + c] = 31;
    }
    BlockQ5_K want, got;
    q5_k_exact_block(sc, mn, q, x, &want);
    ASSERT_TRUE(quantize_row(DType::Q5_K, x, &got, 256));
    ASSERT_EQ(0, std::memcmp(&got, &want, sizeof(BlockQ5_K))) << "q5_k trial " << trial;
    dequantize_row(DType::Q5_K, &got, y, 256);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], x[i]) << "q5_k trial " << trial << " i=" << i;
  }
}

TEST(Quantize, PlainTypes) {
  std::mt19937 rng(6);
  const int64_t n = 77;
  auto x = random_floats(rng, n, -100, 100);
  std::vector<uint16_t> h(static_cast<size_t>(n));
  std::vector<float> f(static_cast<size_t>(n));
  ASSERT_TRUE(quantize_row(DType::F16, x.data(), h.data(), n));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h[i], fp32_to_fp16_ref(x[i]));
  ASSERT_TRUE(quantize_row(DType::BF16, x.data(), h.data(), n));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h[i], fp32_to_bf16(x[i]));
  ASSERT_TRUE(quantize_row(DType::F32, x.data(), f.data(), n));
  EXPECT_EQ(f, x);
  EXPECT_FALSE(quantize_row(DType::Q2_K, x.data(), h.data(), 256));
  EXPECT_FALSE(can_quantize(DType::Q4_1));
}

TEST(Fp16, EdgeCasesAgreeWithReference) {
  const float cases[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 65519.99f, 1e9f, -1e9f,
                         INFINITY, -INFINITY, 5.96046448e-8f /* smallest subnormal */,
                         2.98023224e-8f /* half of it: tie to 0 */, 2.98023254e-8f, 8.9406967e-8f /* 1.5 sub: tie to even */,
                         6.097555e-5f /* largest subnormal region */, 6.1035156e-5f /* smallest normal */,
                         1.0009765625f /* 1 + 2^-10 */, 1.00048828125f /* tie: 1 + 2^-11 -> 1 */,
                         1.00146484375f /* tie: 1 + 3*2^-11 -> up */, 1e-10f, -3.0e-5f};
  for (float f : cases) {
    EXPECT_EQ(fp32_to_fp16(f), fp32_to_fp16_ref(f)) << f;
    uint16_t viaRow;
    quantize_row(DType::F16, &f, &viaRow, 1);
    EXPECT_EQ(viaRow, fp32_to_fp16_ref(f)) << f;
  }
  EXPECT_EQ(fp32_to_fp16_ref(1.00048828125f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16_ref(1.00146484375f), 0x3c02);
  const uint16_t nan = fp32_to_fp16(NAN);
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x3ff, 0);
  // Every half widens exactly, by row (SIMD) and one by one.
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  std::vector<float> wide(65536);
  dequantize_row(DType::F16, all.data(), wide.data(), 65536);
  for (int i = 0; i < 65536; ++i) {
    const float r = fp16_to_fp32_ref(static_cast<uint16_t>(i));
    if (std::isnan(r)) {
      EXPECT_TRUE(std::isnan(wide[static_cast<size_t>(i)]));
    } else {
      ASSERT_EQ(fp32_to_bits(wide[static_cast<size_t>(i)]), fp32_to_bits(r)) << i;
      ASSERT_EQ(fp32_to_fp16(r), static_cast<uint16_t>(i)) << i;  // and narrows back
    }
  }
}

TEST(Bf16, RoundingAndSpecials) {
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(fp32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to inf
  const uint16_t n = fp32_to_bf16(fp32_from_bits(0x7f800001u));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(bf16_to_fp32(n)));
  std::vector<uint16_t> v = {0x3f80, 0xbf80, 0x0001, 0x7f80, 0xff80, 0x8000, 0x4049, 0x3f81, 0x1234};
  std::vector<float> f(v.size());
  dequantize_row(DType::BF16, v.data(), f.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(fp32_to_bits(f[i]), static_cast<uint32_t>(v[i]) << 16);
}

}  // namespace
}  // namespace lc::kernels
