// The machine's limits, measured: streaming memory bandwidth and peak arithmetic throughput at
// the vector ISA this build uses. `bench speed` divides what a model needs per token by these
// to print how close decode is to the memory bound and prefill to the compute bound.
#pragma once

#include <cstdint>
#include <string>

#include "core/thread_pool.h"

namespace lc::kernels {

// The largest data cache the CPU reports (sysfs, else cpuid's cache parameters), 0 when
// neither says.
int64_t last_level_cache_bytes();

// The ISA the kernels were built for: "avx512" (with "+vnni", "+bf16" when present) or "avx2".
std::string kernel_isa();

struct Bandwidth {
  double read_gbps = 0;   // sum of a buffer, split over the pool (what decode does to weights)
  double triad_gbps = 0;  // STREAM triad a[i] = b[i] + s c[i], 3 arrays' bytes per pass
  int64_t buffer_bytes = 0;  // per array
};
// Best of `reps` passes over buffers of `bytes` each (at least several times the last-level
// cache, or the figures measure the cache). Each thread first touches the part it reads.
Bandwidth measure_bandwidth(ThreadPool& pool, int64_t bytes, int reps);

struct PeakOps {
  double f32_gflops = 0;   // fused multiply-add, 2 flops each, widest vector of the build
  double bf16_gflops = 0;  // vdpbf16ps (2 flops per pair); 0 when the build has no AVX512-BF16
  double int8_gops = 0;    // int8 dot products, 2 ops per product: vpdpbusd, or maddubs+madd on AVX2
};
// Register-only loops, independent accumulator chains on every pool thread, `iters` steps each.
PeakOps measure_peak(ThreadPool& pool, int64_t iters);

// The loops above, exposed for tests: each returns the sum of its accumulators after `iters`
// steps starting from zero, so that a test can check the work was done (a closed form). The
// f32 loop adds 0.5 per step to each of kPeakChains x lanes accumulators (fma(acc, 1, 0.5)),
// the bf16 loop 1 x 2 per pair, the int8 loop 1 x 1 x 4 per 32-bit lane.
inline constexpr int kPeakChains = 12;
double peak_loop_f32(int64_t iters, float one, float half);
double peak_loop_bf16(int64_t iters);  // 0 when the build has no AVX512-BF16
double peak_loop_int8(int64_t iters);
int peak_lanes_f32();   // f32 lanes per vector
int peak_lanes_int32(); // 32-bit lanes per int8 dot vector
// Sum of n floats (vector loads, several accumulators) and the triad, for the bandwidth figures.
double read_sum(const float* x, int64_t n);
void triad(float* a, const float* b, const float* c, float s, int64_t n);

}  // namespace lc::kernels
