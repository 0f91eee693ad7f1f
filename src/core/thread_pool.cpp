#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define LC_PAUSE() _mm_pause()
#else
#define LC_PAUSE() ((void)0)
#endif

namespace lc {

namespace {
constexpr int kSpinIterations = 1 << 16;

thread_local bool tl_caller = false;  // the thread running fn(0) of a timed region

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if defined(__x86_64__)
constexpr unsigned kFtzDaz = 0x8040;  // MXCSR flush-to-zero (bit 15) | denormals-are-zero (bit 6)
#endif

// Pool work runs with subnormal floats flushed to zero (FTZ: results, DAZ: inputs). On x86 an
// operation that reads or writes a subnormal takes a slow microcode path, and a model's
// numbers do produce them (the attention kernels, Quest's bounds and the matmuls all slowed
// down, so no single source was fixed): on a random-weight SmolLM2-135M at a 64K context,
// decoding ran 2.3x (dense) to 3.5x (quest) slower without the flush (docs/performance.md).
// A subnormal is below 2^-126 in magnitude, so flushing it changes no result that matters;
// TensorFlow and ONNX Runtime flush in their compute threads the same way. Every thread of
// the pool (the caller too, for the duration of the call) and the one-thread path use the
// same mode, so results do not depend on the number of threads; the caller's own mode is
// restored on return.
class FlushSubnormals {
 public:
#if defined(__x86_64__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};
}  // namespace

int default_thread_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)), started_ns_(static_cast<size_t>(n_threads_)) {
  threads_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int idx) {
#if defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | kFtzDaz);  // for the thread's lifetime (see FlushSubnormals)
#endif
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      if (spin < kSpinIterations / 16) {
        LC_PAUSE();
      } else {
        std::this_thread::yield();
      }
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    if (timing_) started_ns_[static_cast<size_t>(idx)].store(now_ns(), std::memory_order_relaxed);
    (*job_)(idx);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  FlushSubnormals flush;
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  const bool timing = timing_;
  const int64_t t0 = timing ? now_ns() : 0;
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  tl_caller = timing;
  fn(0);
  tl_caller = false;
  const int64_t t1 = timing ? now_ns() : 0;
  // Spin briefly (the usual case: workers finish within microseconds), then yield so that an
  // oversubscribed machine can run the worker we are waiting for.
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations / 16) {
      LC_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
  if (timing) {
    const int64_t t2 = now_ns();
    int64_t late = 0;
    for (int i = 1; i < n_threads_; ++i)
      late = std::max(late, started_ns_[static_cast<size_t>(i)].load(std::memory_order_relaxed) - t0);
    stats_.regions += 1;
    stats_.region_s += static_cast<double>(t2 - t0) * 1e-9;
    stats_.wait_s += static_cast<double>(t2 - t1) * 1e-9;
    stats_.late_s += static_cast<double>(late) * 1e-9;
  }
}

void ThreadPool::barrier() {
  if (n_threads_ == 1) return;
  const uint32_t g = barrier_generation_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_generation_.fetch_add(1, std::memory_order_release);
    return;
  }
  const int64_t t0 = tl_caller ? now_ns() : 0;
  for (int spin = 0; barrier_generation_.load(std::memory_order_acquire) == g; ++spin) {
    if (spin < kSpinIterations / 16) {
      LC_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
  if (tl_caller) stats_.wait_s += static_cast<double>(now_ns() - t0) * 1e-9;  // only the caller writes stats_
}

std::pair<int64_t, int64_t> ThreadPool::share(int64_t n, int64_t grain, int t, int nt) {
  if (n <= 0 || nt <= 0) return {0, 0};
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  const int64_t c0 = n_chunks * t / nt, c1 = n_chunks * (t + 1) / nt;
  return {std::min(n, c0 * grain), std::min(n, c1 * grain)};
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  const int nt = static_cast<int>(std::min<int64_t>(n_threads_, n_chunks));
  if (nt <= 1) {
    FlushSubnormals flush;
    fn(0, n, 0);
    return;
  }
  run([&](int t) {
    if (t >= nt) return;
    const auto [b, e] = share(n, grain, t, nt);
    if (b < e) fn(b, e, t);
  });
}

void ThreadPool::for_each_dynamic(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ <= 1 || n == 1) {
    FlushSubnormals flush;
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  run([&](int t) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed))
      fn(i, t);
  });
}

}  // namespace lc
