// Byte layouts of the ggml block-quantised types, as the GGUF specification defines them
// (ggml-common.h). Every struct is packed to the exact on-disk size: weights are read straight
// out of a memory-mapped file, so the structs describe those bytes, never a padded copy.
// Half-precision fields are raw IEEE binary16 bits (fp16.h converts them).
#pragma once

#include <cstdint>

namespace lc::kernels {

inline constexpr int kQK32 = 32;   // elements per block of the "legacy" types
inline constexpr int kQKK = 256;   // elements per super-block of the k-quants
inline constexpr int kKScaleBytes = 12;  // packed 6-bit scales + mins of Q4_K / Q5_K

// value = (q - 8) * d, q a nibble. Element j < 16 is the low nibble of qs[j], element
// j >= 16 the high nibble of qs[j - 16].
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
// value = q * d + m, nibbles ordered as in Q4_0.
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
// value = (q - 16) * d with q = nibble | (bit j of qh) << 4 (qh little-endian 32 bits).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// value = q * d + m, 5-bit q as in Q5_0.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// value = q * d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
// Q8_0 plus s = d * sum(qs): the activation format ggml pairs with Q4_1 / Q5_1 weights.
struct BlockQ8_1 {
  uint16_t d, s;
  int8_t qs[32];
};

// Super-blocks of 256 = 16 groups of 16 (Q2_K, Q3_K, Q6_K) or 8 groups of 32 (Q4_K, Q5_K).
// Q2_K: value = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4), q 2 bits. Group g of 16;
// the 2-bit fields are laid out per 128-element half: byte qs[32 * half + l] holds, at bit
// shift 2k, element 128 * half + 32 * k + l.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
// Q3_K: value = d * (s[g] - 32) * (q - (hmask bit set ? 0 : 4)), q the 2 low bits laid out
// as in Q2_K, the high bit of element 32 * k' + l (k' = 0..7) is bit k' of hmask[l].
// s[g] is 6 bits: low 4 from scales[g % 8] (low nibble for g < 8, high nibble after),
// high 2 from scales[8 + g % 4] at bit shift 2 * (g / 4).
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
// Q4_K: value = d * sc[g] * q - dmin * mn[g], groups of 32, q a nibble. Per 64 elements
// (chunk c): qs[32c + l] low nibble = element 64c + l, high nibble = element 64c + 32 + l.
// sc/mn are 6 bits packed into 12 bytes: for g < 4, sc = scales[g] & 63, mn = scales[g+4] & 63;
// for g >= 4, sc = (scales[g+4] & 15) | (scales[g-4] >> 6) << 4,
//             mn = (scales[g+4] >> 4) | (scales[g] >> 6) << 4.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// Q5_K: Q4_K plus a fifth bit: element 64c + l has bit (2c) of qh[l], element 64c + 32 + l
// bit (2c + 1).
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// Q6_K: value = d * scales[g] * (q - 32), q 6 bits, groups of 16. Per 128-element half h,
// with L = ql + 64h, H = qh + 32h, for l in 0..31:
//   element 128h +      l: L[l]      & 15 | (H[l] >> 0 & 3) << 4
//   element 128h + 32 + l: L[l + 32] & 15 | (H[l] >> 2 & 3) << 4
//   element 128h + 64 + l: L[l]      >> 4 | (H[l] >> 4 & 3) << 4
//   element 128h + 96 + l: L[l + 32] >> 4 | (H[l] >> 6 & 3) << 4
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
// Activations for the k-quant dot products: value = q * d; bsums[g] = sum of the 16 qs of g.
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// 6-bit scale and min of group g (0..7) of a Q4_K / Q5_K super-block.
inline void k4_scale_min(const uint8_t* s, int g, int& sc, int& mn) {
  if (g < 4) {
    sc = s[g] & 63;
    mn = s[g + 4] & 63;
  } else {
    sc = (s[g + 4] & 15) | ((s[g - 4] >> 6) << 4);
    mn = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

}  // namespace lc::kernels
