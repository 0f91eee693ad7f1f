#include "dist/router.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/sys.h"

namespace lc::dist {

using nlohmann::json;

namespace {

constexpr int kFeatures = 5;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type) {
  res.status = status;
  res.set_content(dump(error_body(message, type)), "application/json");
}

// The text a request asks about: the prompt of a completion, the messages of a chat.
std::string prompt_text(const json& body) {
  std::string s;
  if (body.contains("prompt")) {
    const json& p = body["prompt"];
    if (p.is_string()) s = p.get<std::string>();
    else if (p.is_array())
      for (const json& e : p)
        if (e.is_string()) s += e.get<std::string>();
  }
  if (body.contains("messages") && body["messages"].is_array())
    for (const json& m : body["messages"])
      if (m.is_object() && m.contains("content") && m["content"].is_string()) s += m["content"].get<std::string>() + "\n";
  return s;
}

size_t common_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

struct Router::Ticket {
  std::vector<std::vector<double>> x;  // [backend][kFeatures]
  std::vector<char> exclude;           // backends that failed this request
  std::string prompt;
  int assigned = -1;
  double deadline = 0;
};

struct Router::Backend {
  std::string url, host;
  int port = 0;
  BackendStats st;
  double down_until = 0;
  std::deque<std::string> seen;  // recent prompts: what its slots may still have cached
};

Router::Router(const RouterParams& p) : p_(p) {}
Router::~Router() = default;

Expected<std::unique_ptr<Router>> Router::create(const RouterParams& p) {
  if (p.backends.empty()) return make_error(ErrorCode::kInvalidArgument, "route: give at least one --backend URL");
  if (p.max_inflight < 1) return make_error(ErrorCode::kInvalidArgument, "route: --max-inflight must be >= 1");
  if (!(p.slot_s > 0)) return make_error(ErrorCode::kInvalidArgument, "route: --slot must be > 0 seconds");
  auto r = std::unique_ptr<Router>(new Router(p));
  for (const std::string& url : p.backends) {
    auto b = std::make_unique<Backend>();
    b->url = url;
    b->st.url = url;
    std::string rest = url;
    if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
    else if (rest.find("://") != std::string::npos)
      return make_error(ErrorCode::kInvalidArgument, fmt::format("--backend {}: only http:// backends", url));
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    const size_t colon = rest.rfind(':');
    try {
      if (colon == std::string::npos || rest.find('/') != std::string::npos) throw std::invalid_argument(url);
      b->host = rest.substr(0, colon);
      b->port = std::stoi(rest.substr(colon + 1));
    } catch (const std::exception&) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("--backend {}: not http://HOST:PORT", url));
    }
    if (b->host.empty() || b->port < 1 || b->port > 65535)
      return make_error(ErrorCode::kInvalidArgument, fmt::format("--backend {}: not http://HOST:PORT", url));
    r->backends_.push_back(std::move(b));
  }
  LC_ASSIGN_OR_RETURN(r->sched_, make_scheduler(p.policy, static_cast<int>(p.backends.size()), kFeatures, p.eps0));
  r->svr_ = std::make_unique<httplib::Server>();
  const int threads = std::max(p.http_threads, 4);
  r->svr_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  r->svr_->set_read_timeout(30, 0);
  r->svr_->set_write_timeout(30, 0);
  r->svr_->set_tcp_nodelay(true);
  r->routes();
  return r;
}

Expected<int> Router::bind() {
  int port = p_.port;
  if (port == 0) {
    port = svr_->bind_to_any_port(p_.host);
    if (port < 0) return make_error(ErrorCode::kIo, fmt::format("cannot bind {} to a free port", p_.host));
  } else if (!svr_->bind_to_port(p_.host, port)) {
    return make_error(ErrorCode::kIo, fmt::format("cannot bind {}:{} (in use, or not an address of this host)",
                                                  p_.host, port));
  }
  return port;
}

void Router::run() { svr_->listen_after_bind(); }

void Router::stop() {
  svr_->stop();
  std::lock_guard<std::mutex> lk(mu_);
  cv_.notify_all();
}

std::vector<double> Router::features(const json& body, const std::string& prompt, int k) const {
  const Backend& b = *backends_[static_cast<size_t>(k)];
  size_t cached = 0;
  for (const std::string& s : b.seen) cached = std::max(cached, common_prefix(s, prompt));
  const double n = static_cast<double>(prompt.size());
  const double max_tokens = body.contains("max_tokens") && body["max_tokens"].is_number()
                                ? body["max_tokens"].get<double>() : 256.0;
  return {1.0, std::min(n / 65536.0, 16.0), n > 0 ? static_cast<double>(cached) / n : 0.0,
          std::min(max_tokens / 1024.0, 4.0), body.contains("longctx") ? 1.0 : 0.0};
}

void Router::dispatch_locked() {
  const double now = now_seconds();
  for (;;) {
    Choice c;
    c.n_servers = static_cast<int>(backends_.size());
    c.d = kFeatures;
    for (int k = 0; k < c.n_servers; ++k) {
      const Backend& b = *backends_[static_cast<size_t>(k)];
      c.load.push_back(b.st.in_flight);
      if (b.st.in_flight < p_.max_inflight && b.down_until <= now) c.free_servers.push_back(k);
    }
    if (c.free_servers.empty() || queue_.empty()) return;
    const int n_jobs = static_cast<int>(std::min<size_t>(queue_.size(), 256));
    c.n_jobs = n_jobs;
    c.features.reserve(static_cast<size_t>(n_jobs * c.n_servers * kFeatures));
    for (int j = 0; j < n_jobs; ++j)
      for (int k = 0; k < c.n_servers; ++k) {
        const auto& x = queue_[static_cast<size_t>(j)]->x[static_cast<size_t>(k)];
        c.features.insert(c.features.end(), x.begin(), x.end());
      }
    std::vector<Pair> pairs = sched_->assign(c, rng_);
    // A pair whose backend this request already failed on is taken back; such a request then
    // gets the first free backend it has not failed on.
    std::vector<char> taken(static_cast<size_t>(n_jobs), 0);
    std::vector<char> busy(backends_.size(), 0);
    int given = 0;
    auto give = [&](int j, int k) {
      auto& t = queue_[static_cast<size_t>(j)];
      t->assigned = k;
      Backend& b = *backends_[static_cast<size_t>(k)];
      b.st.in_flight += 1;
      b.st.routed += 1;
      taken[static_cast<size_t>(j)] = 1;
      busy[static_cast<size_t>(k)] = 1;
      ++given;
    };
    for (const Pair& pr : pairs)
      if (!queue_[static_cast<size_t>(pr.job)]->exclude[static_cast<size_t>(pr.server)]) give(pr.job, pr.server);
    for (const Pair& pr : pairs) {
      if (taken[static_cast<size_t>(pr.job)]) continue;
      for (int k : c.free_servers)
        if (!busy[static_cast<size_t>(k)] && !queue_[static_cast<size_t>(pr.job)]->exclude[static_cast<size_t>(k)]) {
          give(pr.job, k);
          break;
        }
    }
    std::deque<std::shared_ptr<Ticket>> rest;
    for (size_t j = 0; j < queue_.size(); ++j)
      if (j >= taken.size() || !taken[j]) rest.push_back(std::move(queue_[j]));
    queue_.swap(rest);
    cv_.notify_all();
    if (given == 0) return;
  }
}

int Router::acquire(const std::shared_ptr<Ticket>& t) {
  std::unique_lock<std::mutex> lk(mu_);
  t->assigned = -1;
  queue_.push_back(t);
  dispatch_locked();
  while (t->assigned < 0) {
    const double left = t->deadline - now_seconds();
    bool all_failed = true;
    for (size_t k = 0; k < backends_.size(); ++k) all_failed = all_failed && t->exclude[k];
    if (left <= 0 || all_failed) {
      std::erase(queue_, t);
      return -1;
    }
    // Down backends come back on their own: wake up to dispatch again.
    cv_.wait_for(lk, std::chrono::milliseconds(static_cast<int64_t>(std::min(left, 0.5) * 1000) + 1));
    dispatch_locked();
  }
  return t->assigned;
}

void Router::release(int k, const std::shared_ptr<Ticket>& t, bool ok, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  Backend& b = *backends_[static_cast<size_t>(k)];
  b.st.in_flight -= 1;
  if (ok) {
    b.st.completed += 1;
    const auto& x = t->x[static_cast<size_t>(k)];
    const int64_t slots = std::min<int64_t>(static_cast<int64_t>(seconds / p_.slot_s), 200);
    for (int64_t i = 0; i < slots; ++i) sched_->observe(k, x, false);
    sched_->observe(k, x, true);
    b.seen.push_back(t->prompt.substr(0, 1 << 20));
    if (b.seen.size() > 32) b.seen.pop_front();
  } else {
    b.st.failed += 1;
    b.down_until = now_seconds() + p_.down_s;
    t->exclude[static_cast<size_t>(k)] = 1;
  }
  dispatch_locked();
  cv_.notify_all();
}

json Router::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  json bs = json::array();
  for (const auto& b : backends_)
    bs.push_back({{"url", b->url}, {"routed", b->st.routed}, {"completed", b->st.completed},
                  {"failed", b->st.failed}, {"in_flight", b->st.in_flight}});
  return {{"policy", p_.policy}, {"queue", queue_.size()}, {"requests", total_.load()},
          {"rejected", rejected_.load()}, {"backends", bs}};
}

void Router::routes() {
  httplib::Server& s = *svr_;
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"status", "ok"}}), "application/json");
  });
  s.Get("/router/stats", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(stats()), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const json st = stats();
    std::string m = "# TYPE longctx_router_queue gauge\n";
    m += fmt::format("longctx_router_queue {}\n", st["queue"].get<size_t>());
    m += fmt::format("# TYPE longctx_router_rejected_total counter\nlongctx_router_rejected_total {}\n",
                     st["rejected"].get<int64_t>());
    m += "# TYPE longctx_router_backend_requests_total counter\n";
    for (const json& b : st["backends"]) {
      const std::string u = b["url"].get<std::string>();
      m += fmt::format("longctx_router_backend_requests_total{{backend=\"{}\",result=\"completed\"}} {}\n", u,
                       b["completed"].get<int64_t>());
      m += fmt::format("longctx_router_backend_requests_total{{backend=\"{}\",result=\"failed\"}} {}\n", u,
                       b["failed"].get<int64_t>());
      m += fmt::format("longctx_router_backend_in_flight{{backend=\"{}\"}} {}\n", u, b["in_flight"].get<int>());
    }
    res.set_content(m, "text/plain; version=0.0.4");
  });
  auto forward = [this](const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, false);
    if (!body.is_object()) return send_error(res, 400, "the body is not a JSON object", "invalid_request_error");
    total_ += 1;
    auto t = std::make_shared<Ticket>();
    t->prompt = prompt_text(body);
    t->exclude.assign(backends_.size(), 0);
    t->deadline = now_seconds() + p_.timeout_s;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (int k = 0; k < static_cast<int>(backends_.size()); ++k) t->x.push_back(features(body, t->prompt, k));
      if (queue_.size() >= p_.max_queue) {
        rejected_ += 1;
        return send_error(res, 429, fmt::format("the router's queue is full ({} requests waiting)", queue_.size()),
                          "rate_limit_error");
      }
    }
    httplib::Headers hdrs;
    if (req.has_header("Authorization")) hdrs.emplace("Authorization", req.get_header_value("Authorization"));
    const bool stream = body.value("stream", false);
    const std::string path = req.path;
    if (!stream) {
      for (int attempt = 0; attempt <= p_.retries; ++attempt) {
        const int k = acquire(t);
        if (k < 0) break;
        Backend& b = *backends_[static_cast<size_t>(k)];
        httplib::Client cli(b.host, b.port);
        cli.set_read_timeout(static_cast<time_t>(p_.timeout_s), 0);
        const double t0 = now_seconds();
        auto r = cli.Post(path, hdrs, req.body, "application/json");
        const bool ok = r && r->status < 500;
        release(k, t, ok, now_seconds() - t0);
        if (ok) {
          res.status = r->status;
          res.set_header("X-Longctx-Backend", b.url);  // which backend answered (not on streams)
          res.set_content(r->body, r->get_header_value("Content-Type"));
          return;
        }
      }
      return send_error(res, 502, "no backend answered the request (every one tried failed, or none was free "
                                  "before the deadline)", "server_error");
    }
    // Streamed: the answer's events are passed on as they come. A backend that fails before
    // sending anything is replaced by another; one that fails after ends the stream with an
    // error event.
    res.set_chunked_content_provider("text/event-stream", [this, t, hdrs, path, rbody = req.body](
                                                              size_t, httplib::DataSink& sink) {
      auto fail_event = [&](const std::string& msg) {
        const std::string ev = "data: " + dump(error_body(msg, "server_error")) + "\n\n";
        sink.write(ev.data(), ev.size());
        sink.done();
        return true;
      };
      for (int attempt = 0; attempt <= p_.retries; ++attempt) {
        const int k = acquire(t);
        if (k < 0) break;
        Backend& b = *backends_[static_cast<size_t>(k)];
        httplib::Client cli(b.host, b.port);
        cli.set_read_timeout(static_cast<time_t>(p_.timeout_s), 0);
        httplib::Request breq;
        breq.method = "POST";
        breq.path = path;
        breq.headers = hdrs;
        breq.set_header("Content-Type", "application/json");
        breq.body = rbody;
        int status = 0;
        bool wrote = false, client_gone = false;
        std::string held;  // an error answer's body
        breq.response_handler = [&](const httplib::Response& r) {
          status = r.status;
          return true;
        };
        breq.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
          if (status >= 400) {
            held.append(d, n);
            return true;
          }
          wrote = true;
          if (!sink.write(d, n)) {
            client_gone = true;  // the backend sees the disconnect and frees its slot
            return false;
          }
          return true;
        };
        const double t0 = now_seconds();
        auto r = cli.send(breq);
        const bool backend_failed = !client_gone && (!r || status >= 500);
        release(k, t, !backend_failed, now_seconds() - t0);
        if (client_gone) return false;
        if (status >= 400 && status < 500) {  // the request itself is wrong: the backend's error
          const std::string ev = "data: " + held + "\n\n";
          sink.write(ev.data(), ev.size());
          sink.done();
          return true;
        }
        if (!backend_failed) {
          sink.done();
          return true;
        }
        if (wrote) return fail_event(fmt::format("backend {} failed in the middle of the answer", b.url));
      }
      return fail_event("no backend answered the request (every one tried failed, or none was free before the "
                        "deadline)");
    });
  };
  s.Post("/v1/chat/completions", forward);
  s.Post("/v1/completions", forward);
  s.Post("/chat/completions", forward);
  s.Post("/completions", forward);
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    for (const auto& b : backends_) {
      httplib::Client cli(b->host, b->port);
      httplib::Headers hdrs;
      if (req.has_header("Authorization")) hdrs.emplace("Authorization", req.get_header_value("Authorization"));
      if (auto r = cli.Get("/v1/models", hdrs); r && r->status < 500) {
        res.status = r->status;
        res.set_content(r->body, "application/json");
        return;
      }
    }
    send_error(res, 502, "no backend answered", "server_error");
  });
}

}  // namespace lc::dist
