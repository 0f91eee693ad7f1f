#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define LC_PAUSE() _mm_pause()
#else
#define LC_PAUSE() ((void)0)
#endif

namespace lc {

namespace {
constexpr int kSpinIterations = 1 << 16;

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

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
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
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0);
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
    const int64_t c0 = n_chunks * t / nt, c1 = n_chunks * (t + 1) / nt;
    const int64_t b = c0 * grain, e = std::min(n, c1 * grain);
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
