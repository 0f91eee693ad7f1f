// Shared helpers of the kernel tests: random data and random raw blocks of every type.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/fp16.h"
#include "kernels/quant_blocks.h"

namespace lc::kernels::test {

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

// A row of n elements of type t made of random bytes (every bit pattern of the codes occurs),
// with the f16/f32 scale fields overwritten by finite values of sensible magnitude.
inline std::vector<uint8_t> random_row(std::mt19937& rng, DType t, int64_t n) {
  const size_t bytes = row_bytes(t, n);
  std::vector<uint8_t> v(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : v) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> sc(0.001f, 0.02f);
  std::uniform_real_distribution<float> any(-1.f, 1.f);
  auto f16 = [&](float x) { return fp32_to_fp16_ref(x); };
  auto put16 = [&](size_t off, uint16_t h) { std::memcpy(v.data() + off, &h, 2); };
  const auto& tr = traits(t);
  const int64_t nb = n / tr.block_size;
  for (int64_t b = 0; b < nb; ++b) {
    const size_t o = static_cast<size_t>(b) * tr.block_bytes;
    switch (t) {
      case DType::F32:
        for (int64_t i = 0; i < n; ++i) {
          const float x = any(rng);
          std::memcpy(v.data() + 4 * i, &x, 4);
        }
        return v;
      case DType::F16:
        for (int64_t i = 0; i < n; ++i) put16(2 * i, f16(any(rng)));
        return v;
      case DType::BF16:
        for (int64_t i = 0; i < n; ++i) put16(2 * i, fp32_to_bf16(any(rng)));
        return v;
      case DType::Q4_0: case DType::Q5_0: case DType::Q8_0:
        put16(o, f16(sc(rng) * (byte(rng) & 1 ? 1 : -1)));
        break;
      case DType::Q4_1: case DType::Q5_1:
        put16(o, f16(sc(rng)));
        put16(o + 2, f16(-sc(rng) * 8));
        break;
      case DType::Q2_K:
        put16(o + 80, f16(sc(rng)));
        put16(o + 82, f16(sc(rng)));
        break;
      case DType::Q3_K:
        put16(o + 108, f16(sc(rng) * 0.1f));
        break;
      case DType::Q4_K: case DType::Q5_K:
        put16(o, f16(sc(rng) * 0.1f));
        put16(o + 2, f16(sc(rng) * 0.1f));
        break;
      case DType::Q6_K:
        put16(o + 208, f16(sc(rng) * 0.1f));
        break;
      default:
        break;
    }
  }
  return v;
}

inline const DType kAllWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                                        DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                                        DType::Q4_K, DType::Q5_K, DType::Q6_K};

}  // namespace lc::kernels::test
