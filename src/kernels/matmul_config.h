// Tuning switches of matmul that benchmarks and tests flip; the engine leaves the defaults.
#pragma once

namespace lc::kernels {

// How matmul multiplies f32/f16/bf16 weights when n_tokens > 1: our register-tiled kernel, or
// OpenBLAS sgemm on panels of weight rows converted to f32 (each thread its own rows, OpenBLAS
// itself single-threaded). kAuto is the faster one on the machines we measured (see matmul.cpp).
enum class FloatGemm { kAuto, kOwn, kBlas };
void set_float_gemm(FloatGemm g);
FloatGemm float_gemm();

}  // namespace lc::kernels
