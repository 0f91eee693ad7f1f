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
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q8_K, DType::Q4_K, DType::Q6_K}) {
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
    // super-block's largest): one step of the widest group.
    const int64_t g = (t == DType::Q4_0 || t == DType::Q8_0) ? 32 : 256;
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
        default: bound = amax / 32 * 1.05f; break;  // Q6_K: the +amax end clamps to 31 steps
      }
      for (int64_t i = b * g; i < b * g + g; ++i) {
        ASSERT_EQ(y[i], yr[i]);
        ASSERT_LE(std::fabs(y[i] - x[i]), bound) << dtype_name(t) << " i=" << i;
      }
    }
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
  EXPECT_FALSE(can_quantize(DType::Q5_1));
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
