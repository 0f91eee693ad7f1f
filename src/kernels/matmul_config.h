// Tuning switches of matmul that benchmarks and tests flip; the engine leaves the defaults.
#pragma once

namespace lc::kernels {

// How matmul multiplies f32/f16/bf16 weights when n_tokens > 1: our register-tiled kernel, or
// OpenBLAS sgemm on panels of weight rows converted to f32 (each thread its own rows, OpenBLAS
// itself single-threaded). kAuto is the faster one on the machines we measured (see matmul.cpp).
enum class FloatGemm { kAuto, kOwn, kBlas };
void set_float_gemm(FloatGemm g);
FloatGemm float_gemm();

// How far ahead (bytes) a decode step's product over packed nibble weights (Q4_0, Q4_1, Q5_0,
// Q5_1) and k-quants (Q4_K, Q5_K, Q6_K) prefetches the weight stream, 0 for none. Those types
// spend more instructions per byte than Q8_0, so fewer cache lines are in flight and the
// hardware prefetcher alone leaves the core short of memory bandwidth (docs/performance.md,
// "Prefetching the weight stream").
constexpr int kDefaultStreamPrefetch = 2048;
void set_stream_prefetch(int bytes);
int stream_prefetch();

// True when packed BF16 weights multiply activations rounded to bf16 with vdpbf16ps (builds
// with AVX512-BF16), as llama.cpp does for BF16 weights; else f32 activations and FMAs.
bool bf16_dot_products();

}  // namespace lc::kernels
