#include <fmt/format.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <cmath>
#include <limits>
#include <random>

#include "core/dtype.h"
#include "core/fp16.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace lc {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 3, 16, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
          EXPECT_GE(t, 0);
          EXPECT_LT(t, threads);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        }, grain);
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << grain;
      }
    }
  }
}

TEST(ThreadPool, ForEachDynamicCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_thread{0};
      pool.for_each_dynamic(n, [&](int64_t i, int t) {
        if (t < 0 || t >= threads) bad_thread++;
        hits[static_cast<size_t>(i)]++;
      });
      EXPECT_EQ(bad_thread.load(), 0);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPool, RunCallsEveryThreadOnceManyTimes) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 2000; ++rep) {
    std::atomic<int> mask{0};
    pool.run([&](int t) { mask.fetch_or(1 << t); });
    ASSERT_EQ(mask.load(), 0xF);
  }
}

// barrier() inside a region: every thread sees what the others wrote before it, many times over.
TEST(ThreadPool, BarrierOrdersTheStepsOfARegion) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    std::vector<int64_t> slot(static_cast<size_t>(threads));
    std::atomic<int> bad{0};
    for (int rep = 0; rep < 300; ++rep)
      pool.run([&](int t) {
        for (int64_t step = 1; step <= 3; ++step) {
          slot[static_cast<size_t>(t)] = rep * 10 + step;  // plain writes, ordered by the barrier
          pool.barrier();
          for (int u = 0; u < threads; ++u)
            if (slot[static_cast<size_t>(u)] != rep * 10 + step) bad.fetch_add(1);
          pool.barrier();
        }
      });
    EXPECT_EQ(bad.load(), 0) << threads << " threads";
  }
}

// The pool's timing counts the regions run while it is on, and charges the caller's wait for a
// slower thread (a worker that sleeps at least 2 ms while the caller returns at once) to wait_s.
TEST(ThreadPool, StatsCountRegionsAndTheCallersWait) {
  ThreadPool pool(2);
  pool.run([](int) {});
  EXPECT_EQ(pool.stats().regions, 0);  // off by default
  pool.set_timing(true);
  for (int i = 0; i < 3; ++i)
    pool.run([](int t) {
      if (t == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
  pool.set_timing(false);
  pool.run([](int) {});
  const ThreadPool::Stats s = pool.stats();
  EXPECT_EQ(s.regions, 3);
  EXPECT_GE(s.wait_s, 3 * 2e-3);
  EXPECT_GE(s.region_s, s.wait_s);
  EXPECT_GE(s.late_s, 0.0);
  EXPECT_LE(s.late_s, s.region_s);
  ThreadPool::Stats sum;  // runs summed, as bench speed sums its rounds
  sum += s;
  sum += s;
  EXPECT_EQ(sum.regions, 6);
  EXPECT_EQ(sum.region_s, 2 * s.region_s);
  EXPECT_EQ(sum.wait_s, 2 * s.wait_s);
  EXPECT_EQ(sum.late_s, 2 * s.late_s);
  pool.reset_stats();
  EXPECT_EQ(pool.stats().regions, 0);
}

// Pool work flushes subnormals to zero on every thread and for every thread count (so results
// do not depend on it); the caller's floating-point mode is left as it was.
TEST(ThreadPool, FlushesSubnormalsInsideOnly) {
  volatile float tiny = std::numeric_limits<float>::min();  // smallest normal: half is subnormal
  auto halve = [&] { return tiny * 0.5f; };
  ASSERT_GT(halve(), 0.0f);  // IEEE outside the pool
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    std::vector<float> got(8, -1.0f);
    pool.parallel_for(8, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) got[static_cast<size_t>(i)] = halve();
    });
    for (float g : got) EXPECT_EQ(g, 0.0f) << threads << " threads";
    std::vector<float> ran(static_cast<size_t>(threads), -1.0f);
    pool.run([&](int t) { ran[static_cast<size_t>(t)] = halve(); });
    for (float g : ran) EXPECT_EQ(g, 0.0f) << threads << " threads";
    pool.parallel_for(1, [&](int64_t, int64_t, int) { got[0] = halve(); });  // the one-range path
    EXPECT_EQ(got[0], 0.0f);
    std::fill(got.begin(), got.end(), -1.0f);
    pool.for_each_dynamic(8, [&](int64_t i, int) { got[static_cast<size_t>(i)] = halve(); });
    for (float g : got) EXPECT_EQ(g, 0.0f) << threads << " threads, for_each_dynamic";
    EXPECT_GT(halve(), 0.0f) << "the caller's mode is restored";
  }
}

Expected<int> half(int x) {
  if (x % 2) return make_error(fmt::format("{} is odd", x));
  return x / 2;
}

Expected<int> quarter(int x) {
  LC_ASSIGN_OR_RETURN(int h, half(x));
  LC_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

TEST(Status, ExpectedPropagatesErrors) {
  EXPECT_EQ(*quarter(8), 2);
  auto e = quarter(6);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().message, "3 is odd");
}

TEST(DType, TraitsMatchGgufBlockLayouts) {
  EXPECT_EQ(row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 32), 34u);
  EXPECT_EQ(row_bytes(DType::Q4_K, 256), 144u);
  EXPECT_EQ(row_bytes(DType::Q6_K, 512), 420u);
  EXPECT_EQ(row_bytes(DType::BF16, 3), 6u);
  EXPECT_FALSE(dtype_traits(4).has_value());   // removed Q4_2
  EXPECT_FALSE(dtype_traits(99).has_value());
  EXPECT_EQ(dtype_from_name("Q8_0"), DType::Q8_0);
  EXPECT_FALSE(dtype_from_name("q9_9").has_value());
}

}  // namespace
}  // namespace lc
