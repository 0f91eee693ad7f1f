#include "dist/comm.h"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace lc::dist {
namespace {

std::string mpi_error(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(buf, static_cast<size_t>(len));
}

// mpirun ends the other processes with SIGTERM when one of them dies: each says so before it
// goes, so that every rank's output explains why the job stopped.
char g_term_msg[160];
size_t g_term_len = 0;

constexpr int kTagRing = 7, kTagGather = 8, kTagBcast = 9;
extern "C" void on_term(int) {
  if (g_term_len > 0) {
    const ssize_t w = ::write(STDERR_FILENO, g_term_msg, g_term_len);
    (void)w;
  }
  _exit(1);
}

Status check_count(size_t bytes, const char* what) {
  if (bytes > static_cast<size_t>(INT_MAX))
    return make_error(ErrorCode::kUnsupported, fmt::format("{}: a message of {} bytes is over MPI's limit of {} "
                                                           "(use more ranks)", what, bytes, INT_MAX));
  return ok_status();
}

}  // namespace

bool Comm::launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

Expected<std::unique_ptr<Comm>> Comm::init(int* argc, char*** argv, double timeout_s) {
  if (!launched_by_mpi())
    return make_error(ErrorCode::kInvalidArgument,
                      "--cp: this process was not started by mpirun; run it as `mpirun -np N longctx ... --cp MODE` "
                      "with N >= 2");
  if (!(timeout_s > 0) || timeout_s > 86400)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("--cp-timeout: {} s is not in (0, 86400]", timeout_s));
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    if (const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS)
      return make_error(fmt::format("MPI could not start: {}", mpi_error(rc)));
  }
  auto c = std::unique_ptr<Comm>(new Comm());
  c->finalize_ = !inited;
  c->timeout_s_ = timeout_s;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  const std::string msg = fmt::format("longctx: rank {}: stopped by mpirun (another rank of the job ended with an "
                                      "error or was killed)\n", c->rank_);
  g_term_len = std::min(msg.size(), sizeof g_term_msg);
  std::memcpy(g_term_msg, msg.data(), g_term_len);
  std::signal(SIGTERM, on_term);
  return c;
}

Comm::~Comm() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (finalize_ && !fin) MPI_Finalize();
}

Status Comm::wait(void* requests, int n, const std::string& what, const int* peers) {
  auto* req = static_cast<MPI_Request*>(requests);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t spin = 0;; ++spin) {
    int done = 0;
    if (const int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE); rc != MPI_SUCCESS)
      return make_error(fmt::format("{} failed: {}", what, mpi_error(rc)));
    if (done) return ok_status();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > timeout_s_) {
      // The peers whose message has not come: receives still open (MPI_Testall completes none
      // unless all are done, so each is tested alone). When every receive is in, the rank that
      // never took a message sent to it (a stopped receiver holds a large send) is named.
      std::string who;
      for (const bool sends : {false, true}) {
        for (int i = 0; i < n; ++i) {
          if ((peers[i] < 0) != sends) continue;
          int one = 0;
          MPI_Test(&req[i], &one, MPI_STATUS_IGNORE);
          if (!one) who += fmt::format("{}{}", who.empty() ? "" : ", ", sends ? ~peers[i] : peers[i]);
        }
        if (!who.empty()) break;
      }
      if (who.empty()) who = "? (every message came)";
      return make_error(fmt::format("{} waited {:.0f} s (--cp-timeout) for rank {}: it died or hangs", what, waited,
                                    who));
    }
    // Spin briefly (a peer a few microseconds behind), then nap: with more ranks than cores a
    // waiting rank must not take the core of the rank it waits for.
    if (spin > 200) std::this_thread::sleep_for(std::chrono::microseconds(spin > 20000 ? 1000 : 50));
  }
}

Status Comm::sendrecv(const void* send, size_t bytes, int to, void* recv, size_t rbytes, int from) {
  LC_TRY(check_count(bytes, "ring step"));
  LC_TRY(check_count(rbytes, "ring step"));
  MPI_Request r[2];
  const int peers[2] = {from, ~to};
  if (int rc = MPI_Irecv(recv, static_cast<int>(rbytes), MPI_BYTE, from, kTagRing, MPI_COMM_WORLD, &r[0]);
      rc != MPI_SUCCESS)
    return make_error(fmt::format("receive from rank {}: {}", from, mpi_error(rc)));
  if (int rc = MPI_Isend(send, static_cast<int>(bytes), MPI_BYTE, to, kTagRing, MPI_COMM_WORLD, &r[1]);
      rc != MPI_SUCCESS)
    return make_error(fmt::format("send to rank {}: {}", to, mpi_error(rc)));
  bytes_sent_ += bytes;
  return wait(r, 2, fmt::format("the ring step (send to rank {}, receive from rank {})", to, from), peers);
}

// Collectives are point-to-point messages here, so that a wait that times out knows which
// ranks did not send (MPI's collectives cannot say); N is small (one per host).
Status Comm::allgather(const void* send, size_t bytes, void* recv) {
  LC_TRY(check_count(bytes, "gather"));
  std::vector<MPI_Request> req;
  std::vector<int> peers;
  auto* out = static_cast<char*>(recv);
  std::memcpy(out + static_cast<size_t>(rank_) * bytes, send, bytes);
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    req.emplace_back();
    peers.push_back(j);
    if (int rc = MPI_Irecv(out + static_cast<size_t>(j) * bytes, static_cast<int>(bytes), MPI_BYTE, j, kTagGather,
                           MPI_COMM_WORLD, &req.back());
        rc != MPI_SUCCESS)
      return make_error(fmt::format("gather: receive from rank {}: {}", j, mpi_error(rc)));
  }
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    req.emplace_back();
    peers.push_back(~j);
    if (int rc = MPI_Isend(send, static_cast<int>(bytes), MPI_BYTE, j, kTagGather, MPI_COMM_WORLD, &req.back());
        rc != MPI_SUCCESS)
      return make_error(fmt::format("gather: send to rank {}: {}", j, mpi_error(rc)));
    bytes_sent_ += bytes;
  }
  return wait(req.data(), static_cast<int>(req.size()), "the gather of attention partials", peers.data());
}

Status Comm::bcast(void* buf, size_t bytes, int root) {
  LC_TRY(check_count(bytes, "broadcast"));
  std::vector<MPI_Request> req;
  std::vector<int> peers;
  if (rank_ == root) {
    for (int j = 0; j < size_; ++j) {
      if (j == root) continue;
      req.emplace_back();
      peers.push_back(~j);
      if (int rc = MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, j, kTagBcast, MPI_COMM_WORLD, &req.back());
          rc != MPI_SUCCESS)
        return make_error(fmt::format("broadcast: send to rank {}: {}", j, mpi_error(rc)));
      bytes_sent_ += bytes;
    }
  } else {
    req.emplace_back();
    peers.push_back(root);
    if (int rc = MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, root, kTagBcast, MPI_COMM_WORLD, &req.back());
        rc != MPI_SUCCESS)
      return make_error(fmt::format("broadcast: receive from rank {}: {}", root, mpi_error(rc)));
  }
  if (req.empty()) return ok_status();
  return wait(req.data(), static_cast<int>(req.size()), fmt::format("the broadcast from rank {}", root), peers.data());
}

Expected<std::vector<std::string>> Comm::gather_strings(const std::string& mine, int root) {
  std::vector<uint64_t> sizes(static_cast<size_t>(size_));
  const uint64_t n = mine.size();
  LC_TRY(allgather(&n, sizeof n, sizes.data()));
  std::vector<std::string> out;
  std::vector<MPI_Request> req;
  std::vector<int> peers;
  if (rank_ == root) {
    out.resize(static_cast<size_t>(size_));
    for (int j = 0; j < size_; ++j) {
      LC_TRY(check_count(sizes[static_cast<size_t>(j)], "gather"));
      if (j == rank_) {
        out[static_cast<size_t>(j)] = mine;
        continue;
      }
      out[static_cast<size_t>(j)].resize(sizes[static_cast<size_t>(j)]);
      req.emplace_back();
      peers.push_back(j);
      if (int rc = MPI_Irecv(out[static_cast<size_t>(j)].data(), static_cast<int>(sizes[static_cast<size_t>(j)]),
                             MPI_BYTE, j, kTagGather, MPI_COMM_WORLD, &req.back());
          rc != MPI_SUCCESS)
        return make_error(fmt::format("gather: receive from rank {}: {}", j, mpi_error(rc)));
    }
  } else {
    LC_TRY(check_count(mine.size(), "gather"));
    req.emplace_back();
    peers.push_back(~root);
    if (int rc = MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, root, kTagGather, MPI_COMM_WORLD,
                           &req.back());
        rc != MPI_SUCCESS)
      return make_error(fmt::format("gather: send to rank {}: {}", root, mpi_error(rc)));
    bytes_sent_ += mine.size();
  }
  if (!req.empty())
    LC_TRY(wait(req.data(), static_cast<int>(req.size()), fmt::format("the gather of results on rank {}", root),
                peers.data()));
  return out;
}

Expected<double> Comm::sum(double x) {
  std::vector<double> all(static_cast<size_t>(size_));
  LC_TRY(allgather(&x, sizeof x, all.data()));
  double s = 0;
  for (double v : all) s += v;  // in rank order: the same on every rank
  return s;
}

Status Comm::barrier() {
  std::vector<char> all(static_cast<size_t>(size_));
  const char one = 1;
  return allgather(&one, 1, all.data());
}

void Comm::abort(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "longctx: rank %d: %s\n", rank_, msg.c_str());
  std::fflush(stderr);
  g_term_len = 0;  // the job is ending on purpose: the SIGTERM that follows says nothing more
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}

}  // namespace lc::dist
