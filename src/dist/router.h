// `longctx route`: an HTTP front that forwards OpenAI requests to several `longctx serve`
// backends. Requests wait in one queue; a scheduler (dist/cqb.h: round-robin, least-loaded or
// CQB-eps) matches waiting requests with backends that have a free place (at most
// max_inflight requests each). A request's features as backend k sees them are
// [1, prompt size, the share of its prompt backend k has seen before (its cached prefix),
// max_tokens, whether it asks for long-context methods]; CQB-eps learns each backend's rate
// from the service times it observes: a request served in s seconds counts as floor(s / slot)
// slots without departure and one with.
// A backend that fails before it answered (no connection, or a 5xx) is left out for a while and
// the request goes to another (up to `retries` times); one that fails in the middle of a stream
// ends that stream with an error event. No request is lost: each gets an answer or an error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "dist/cqb.h"

namespace httplib {
class Server;
}

namespace lc::dist {

struct RouterParams {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port
  std::vector<std::string> backends;  // http://HOST:PORT
  std::string policy = "rr";          // rr, least, cqb
  int max_inflight = 4;               // requests a backend serves at once
  size_t max_queue = 256;             // waiting requests; beyond: 429
  double eps0 = 1.0;                  // CQB-eps exploration
  double slot_s = 0.25;               // CQB's time slot, seconds
  int retries = 2;                    // other backends tried after a failure
  double down_s = 5;                  // a failed backend is left out this long
  double timeout_s = 600;             // a request's deadline, waiting included
  int http_threads = 64;
};

struct BackendStats {
  std::string url;
  int64_t routed = 0, completed = 0, failed = 0;
  int in_flight = 0;
};

class Router {
 public:
  static Expected<std::unique_ptr<Router>> create(const RouterParams& p);
  ~Router();
  Expected<int> bind();
  void run();   // blocks until stop()
  void stop();
  nlohmann::json stats() const;

 private:
  struct Ticket;
  struct Backend;
  explicit Router(const RouterParams& p);
  void routes();
  std::vector<double> features(const nlohmann::json& body, const std::string& prompt, int k) const;
  // Waits until the ticket is given a backend (or the deadline passes): the backend's index, or -1.
  int acquire(const std::shared_ptr<Ticket>& t);
  void release(int k, const std::shared_ptr<Ticket>& t, bool ok, double seconds);
  void dispatch_locked();

  RouterParams p_;
  std::unique_ptr<httplib::Server> svr_;
  std::unique_ptr<Scheduler> sched_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Ticket>> queue_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::mt19937_64 rng_{12345};
  std::atomic<int64_t> total_{0}, rejected_{0};
};

}  // namespace lc::dist
