// A persistent pool of worker threads for data-parallel loops. Decoding issues hundreds of
// parallel loops per token, so workers spin briefly before sleeping: waking a sleeping thread
// costs more than most of those loops.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace lc {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index) once on each of the size() threads (the caller is thread 0) and
  // returns when all have finished.
  void run(const std::function<void(int)>& fn);

  // Splits [0, n) into contiguous ranges, one per thread: fn(begin, end, thread_index).
  // Ranges are aligned to `grain` elements.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

  // Calls fn(i, thread_index) for every i in [0, n), the threads taking the next index as
  // they become free: for items of uneven cost (split-K units of a sparse backend, where
  // some units rotate keys and others do not), where equal ranges leave a thread waiting.
  // Which thread runs an item varies from run to run; results must not depend on it.
  void for_each_dynamic(int64_t n, const std::function<void(int64_t, int)>& fn);

 private:
  void worker(int idx);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

// Default number of threads: the number of cores the process may run on.
int default_thread_count();

}  // namespace lc
