// A persistent pool of worker threads for data-parallel loops. Decoding issues hundreds of
// parallel loops per token, so workers spin briefly before sleeping: waking a sleeping thread
// costs more than most of those loops.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>
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

  // Inside run(fn): returns once every thread of the pool has called it (a region whose steps
  // depend on each other's results). Every thread must call it the same number of times.
  void barrier();

  // Thread t's part of [0, n) when it is split into nt contiguous ranges aligned to `grain`
  // elements, as parallel_for splits it: {begin, end}, empty for a thread without work.
  static std::pair<int64_t, int64_t> share(int64_t n, int64_t grain, int t, int nt);

  // Splits [0, n) into contiguous ranges, one per thread: fn(begin, end, thread_index).
  // Ranges are aligned to `grain` elements.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

  // Calls fn(i, thread_index) for every i in [0, n), the threads taking the next index as
  // they become free: for items of uneven cost (split-K units of a sparse backend, where
  // some units rotate keys and others do not), where equal ranges leave a thread waiting.
  // Which thread runs an item varies from run to run; results must not depend on it.
  void for_each_dynamic(int64_t n, const std::function<void(int64_t, int)>& fn);

  // Where a multi-threaded run's time goes (`bench speed`; off by default, since it reads the
  // clock at each region). Over the parallel regions run since reset_stats(): their number,
  // their wall time (from handing out the job until every thread is done), the time the caller
  // spent waiting for the other threads (after its own share, and at barriers), and the sum over
  // regions of the latest worker's start after the job was handed out.
  struct Stats {
    int64_t regions = 0;
    double region_s = 0, wait_s = 0, late_s = 0;
    Stats& operator+=(const Stats& o) {
      regions += o.regions;
      region_s += o.region_s;
      wait_s += o.wait_s;
      late_s += o.late_s;
      return *this;
    }
  };
  void set_timing(bool on) { timing_ = on; }
  void reset_stats() { stats_ = Stats{}; }
  const Stats& stats() const { return stats_; }

 private:
  void worker(int idx);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> barrier_count_{0};
  std::atomic<uint32_t> barrier_generation_{0};
  bool timing_ = false;
  Stats stats_;
  std::vector<std::atomic<int64_t>> started_ns_;  // timing: each worker's start in the current region
};

// Default number of threads: the number of cores the process may run on.
int default_thread_count();

}  // namespace lc
