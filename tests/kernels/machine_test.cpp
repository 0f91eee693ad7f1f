// The machine-limit loops do the work they are counted for: their results equal closed forms
// (a loop the compiler shortened or dropped would not), and the bandwidth kernels equal scalar
// loops.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/blas_cpu.h"
#include "kernels/machine.h"

namespace lc::kernels {
namespace {

TEST(MachinePeak, F32LoopDoesEveryFma) {
  // fma(acc, 1, 0.5) per step on kPeakChains x lanes accumulators: iters / 2 each (exact).
  for (int64_t iters : {1, 7, 1000, 100001}) {
    const double want = 0.5 * static_cast<double>(iters) * kPeakChains * peak_lanes_f32();
    EXPECT_EQ(peak_loop_f32(iters, 1.0f, 0.5f), want) << iters;
  }
  // The multiplier is used: acc = acc * 2 + 0.5 after 3 steps is 0.5 * (1 + 2 + 4).
  EXPECT_EQ(peak_loop_f32(3, 2.0f, 0.5f), 3.5 * kPeakChains * peak_lanes_f32());
}

TEST(MachinePeak, Int8LoopDoesEveryDot) {
  // Each step adds 4 products of 1 x 1 to every 32-bit lane of every chain.
  for (int64_t iters : {1, 9, 4096}) {
    const double want = 4.0 * static_cast<double>(iters) * kPeakChains * peak_lanes_int32();
    EXPECT_EQ(peak_loop_int8(iters), want) << iters;
  }
}

TEST(MachinePeak, Bf16LoopDoesEveryPair) {
  if (kernel_isa().find("bf16") == std::string::npos) {
    EXPECT_EQ(peak_loop_bf16(10), 0.0);
    GTEST_SKIP() << "build without AVX512-BF16";
  }
  // Each step adds two products of 1 x 1 to each of 16 lanes per chain.
  for (int64_t iters : {1, 13, 5000})
    EXPECT_EQ(peak_loop_bf16(iters), 2.0 * static_cast<double>(iters) * kPeakChains * 16) << iters;
}

TEST(MachineBandwidth, KernelsEqualScalarLoops) {
  for (int64_t n : {0, 1, 31, 32, 33, 1000, 4099}) {
    std::vector<float> b(static_cast<size_t>(n)), c(static_cast<size_t>(n)), a(static_cast<size_t>(n), -1.0f);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      b[static_cast<size_t>(i)] = static_cast<float>(i % 17) - 8.0f;  // small integers: sums are exact
      c[static_cast<size_t>(i)] = static_cast<float>(i % 5);
      want += b[static_cast<size_t>(i)];
    }
    EXPECT_EQ(read_sum(b.data(), n), want) << n;
    triad(a.data(), b.data(), c.data(), 3.0f, n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)] + 3.0f * c[static_cast<size_t>(i)]) << n << " " << i;
  }
}

TEST(MachineBandwidth, MeasuresTheBufferItWasAskedFor) {
  ThreadPool pool(2);
  const Bandwidth bw = measure_bandwidth(pool, int64_t{4} << 20, 1);
  EXPECT_GE(bw.buffer_bytes, (int64_t{4} << 20) - 4 * 64 * 2);
  EXPECT_LE(bw.buffer_bytes, int64_t{4} << 20);
  EXPECT_GT(bw.read_gbps, 0);
  EXPECT_GT(bw.triad_gbps, 0);
}

TEST(MachineCache, ParsesSysfsOrReportsNothing) {
  const int64_t llc = last_level_cache_bytes();
  EXPECT_GE(llc, 0);
  if (llc > 0) EXPECT_EQ(llc % 1024, 0);
}

// Which OpenBLAS kernels longctx asks for (it re-executes itself with OPENBLAS_CORETYPE).
TEST(BlasCore, AsksForAvx512KernelsWhereTheCpuHasThem) {
  for (const char* c : {"Prescott", "Haswell", "Zen", "Sandybridge"}) {
    EXPECT_STREQ(better_blas_core_for(c, true, true), "SkylakeX") << c;
  }
  for (const char* c : {"SkylakeX", "skylakex", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(better_blas_core_for(c, true, true), nullptr) << c;
  EXPECT_STREQ(better_blas_core_for("Prescott", false, true), "Haswell");
  EXPECT_EQ(better_blas_core_for("Haswell", false, true), nullptr);
  EXPECT_EQ(better_blas_core_for("Zen", false, true), nullptr);
  EXPECT_EQ(better_blas_core_for("Prescott", false, false), nullptr);
  EXPECT_EQ(better_blas_core_for(nullptr, true, true), nullptr);
}

}  // namespace
}  // namespace lc::kernels
