// The processes of a distributed run, over MPI (OpenMPI, started with mpirun). Every operation
// waits with a deadline: a peer that died or hangs is an error that names it, on every process
// that waits for it, never a silent hang. Errors are values; abort() ends the whole job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace lc::dist {

class Comm {
 public:
  // Initialises MPI for a process started by mpirun (an error, with how to start it, for a
  // process that was not). timeout_s: how long any operation waits for its peers.
  static Expected<std::unique_ptr<Comm>> init(int* argc, char*** argv, double timeout_s);
  // Whether this process was started by mpirun (or another MPI launcher).
  static bool launched_by_mpi();
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout() const { return timeout_s_; }

  // Sends `bytes` to rank `to` while receiving `rbytes` from rank `from` (a ring step).
  Status sendrecv(const void* send, size_t bytes, int to, void* recv, size_t rbytes, int from);
  // Every rank's `bytes` into recv, rank after rank: [size * bytes].
  Status allgather(const void* send, size_t bytes, void* recv);
  // root's buffer into every rank's.
  Status bcast(void* buf, size_t bytes, int root);
  // Every rank's string on rank `root`, in rank order; the other ranks get an empty list.
  Expected<std::vector<std::string>> gather_strings(const std::string& mine, int root);
  // Sum of one value over all ranks.
  Expected<double> sum(double x);
  Status barrier();

  // Prints "longctx: rank R: msg" and ends every process of the job with exit code 1.
  [[noreturn]] void abort(const std::string& msg);

  // Bytes this process has sent since it started (the scale-out measurements).
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  Comm() = default;
  // Waits for the requests with the deadline; `what` names the operation in the error, and
  // peers[i] the rank request i receives from, or ~rank for a send to that rank, to name the
  // ranks that never sent (or, when every message came, never took one).
  Status wait(void* requests, int n, const std::string& what, const int* peers);

  int rank_ = 0, size_ = 1;
  double timeout_s_ = 60;
  bool finalize_ = false;
  uint64_t bytes_sent_ = 0;
};

}  // namespace lc::dist
