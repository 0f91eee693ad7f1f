#include "dist/cqb.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>

namespace lc::dist {

double logistic(double z) { return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z)); }

ServiceModel::ServiceModel(int d, double reg) : d_(d), theta_(static_cast<size_t>(d), 0.0),
                                                hinv_(static_cast<size_t>(d * d), 0.0) {
  for (int i = 0; i < d; ++i) hinv_[static_cast<size_t>(i * d + i)] = 1.0 / reg;
}

double ServiceModel::rate(std::span<const double> x) const {
  double z = 0;
  for (int i = 0; i < d_; ++i) z += theta_[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
  return logistic(z);
}

void ServiceModel::observe(std::span<const double> x, bool departed) {
  const size_t d = static_cast<size_t>(d_);
  const double p = rate(x);
  // The curvature of this observation, floored so that a confident wrong estimate still moves.
  const double w = std::max(p * (1 - p), 0.01);
  std::vector<double> hx(d, 0.0);
  for (size_t i = 0; i < d; ++i)
    for (size_t j = 0; j < d; ++j) hx[i] += hinv_[i * d + j] * x[j];
  double xhx = 0;
  for (size_t i = 0; i < d; ++i) xhx += x[i] * hx[i];
  const double c = w / (1 + w * xhx);
  for (size_t i = 0; i < d; ++i)
    for (size_t j = 0; j < d; ++j) hinv_[i * d + j] -= c * hx[i] * hx[j];
  // theta += H^-1 x (y - p), with the updated inverse.
  const double g = (departed ? 1.0 : 0.0) - p;
  for (size_t i = 0; i < d; ++i) {
    double s = 0;
    for (size_t j = 0; j < d; ++j) s += hinv_[i * d + j] * x[j];
    theta_[i] += s * g;
  }
  ++n_;
}

std::vector<Pair> greedy_pairs(const Choice& c, const std::vector<double>& rate) {
  std::vector<Pair> out;
  std::vector<char> job_taken(static_cast<size_t>(c.n_jobs), 0), server_free(static_cast<size_t>(c.n_servers), 0);
  for (int k : c.free_servers) server_free[static_cast<size_t>(k)] = 1;
  const size_t n_pairs = std::min(static_cast<size_t>(c.n_jobs), c.free_servers.size());
  while (out.size() < n_pairs) {
    double best = -1;
    Pair bp;
    for (int j = 0; j < c.n_jobs; ++j) {  // ties: the earlier job, then the lower server
      if (job_taken[static_cast<size_t>(j)]) continue;
      for (int k = 0; k < c.n_servers; ++k) {
        if (!server_free[static_cast<size_t>(k)]) continue;
        const double r = rate[static_cast<size_t>(j) * c.n_servers + k];
        if (r > best) best = r, bp = Pair{j, k};
      }
    }
    if (best < 0) break;
    job_taken[static_cast<size_t>(bp.job)] = 1;
    server_free[static_cast<size_t>(bp.server)] = 0;
    out.push_back(bp);
  }
  return out;
}

namespace {

// First come, first served: the oldest jobs go to the free servers in the order `order`.
std::vector<Pair> fcfs(const Choice& c, const std::vector<int>& order) {
  std::vector<Pair> out;
  for (size_t i = 0; i < order.size() && static_cast<int>(i) < c.n_jobs; ++i)
    out.push_back(Pair{static_cast<int>(i), order[i]});
  return out;
}

class RoundRobin final : public Scheduler {
 public:
  explicit RoundRobin(int n) : n_(n) {}
  std::string name() const override { return "rr"; }
  std::vector<Pair> assign(const Choice& c, std::mt19937_64&) override {
    std::vector<int> order;  // free servers from the one after the last served, in turn
    for (int i = 0; i < n_; ++i) {
      const int k = (next_ + i) % n_;
      if (std::find(c.free_servers.begin(), c.free_servers.end(), k) != c.free_servers.end()) order.push_back(k);
    }
    auto out = fcfs(c, order);
    if (!out.empty()) next_ = (out.back().server + 1) % n_;
    return out;
  }

 private:
  int n_, next_ = 0;
};

class LeastLoaded final : public Scheduler {
 public:
  std::string name() const override { return "least"; }
  std::vector<Pair> assign(const Choice& c, std::mt19937_64&) override {
    std::vector<int> order = c.free_servers;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return (c.load.empty() ? 0 : c.load[static_cast<size_t>(a)]) < (c.load.empty() ? 0 : c.load[static_cast<size_t>(b)]);
    });
    return fcfs(c, order);
  }
};

class Cqb final : public Scheduler {
 public:
  Cqb(int n, int d, double eps0) : eps0_(eps0) {
    for (int k = 0; k < n; ++k) models_.emplace_back(d);
  }
  std::string name() const override { return "cqb"; }
  std::vector<Pair> assign(const Choice& c, std::mt19937_64& rng) override {
    ++t_;
    const double eps = std::min(1.0, eps0_ / std::pow(static_cast<double>(t_), 0.25));
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<double> rate(static_cast<size_t>(c.n_jobs) * c.n_servers);
    if (u(rng) < eps) {
      for (double& r : rate) r = u(rng);  // a random matching
    } else {
      for (int j = 0; j < c.n_jobs; ++j)
        for (int k = 0; k < c.n_servers; ++k)
          rate[static_cast<size_t>(j) * c.n_servers + k] = models_[static_cast<size_t>(k)].rate(c.x(j, k));
    }
    return greedy_pairs(c, rate);
  }
  void observe(int server, std::span<const double> x, bool departed) override {
    models_[static_cast<size_t>(server)].observe(x, departed);
  }
  const std::vector<ServiceModel>& models() const { return models_; }

 private:
  double eps0_;
  int64_t t_ = 0;
  std::vector<ServiceModel> models_;
};

class Oracle final : public Scheduler {
 public:
  explicit Oracle(std::vector<std::vector<double>> theta) : theta_(std::move(theta)) {}
  std::string name() const override { return "oracle"; }
  std::vector<Pair> assign(const Choice& c, std::mt19937_64&) override {
    std::vector<double> rate(static_cast<size_t>(c.n_jobs) * c.n_servers);
    for (int j = 0; j < c.n_jobs; ++j)
      for (int k = 0; k < c.n_servers; ++k) {
        double z = 0;
        const auto x = c.x(j, k);
        for (int i = 0; i < c.d; ++i) z += theta_[static_cast<size_t>(k)][static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
        rate[static_cast<size_t>(j) * c.n_servers + k] = logistic(z);
      }
    return greedy_pairs(c, rate);
  }

 private:
  std::vector<std::vector<double>> theta_;
};

}  // namespace

Expected<std::unique_ptr<Scheduler>> make_scheduler(std::string_view name, int n_servers, int d, double eps0) {
  if (n_servers < 1) return make_error(ErrorCode::kInvalidArgument, "scheduler: no servers");
  if (name == "rr") return std::unique_ptr<Scheduler>(new RoundRobin(n_servers));
  if (name == "least") return std::unique_ptr<Scheduler>(new LeastLoaded());
  if (name == "cqb") {
    if (d < 1) return make_error(ErrorCode::kInvalidArgument, "scheduler cqb: no features");
    if (!(eps0 >= 0)) return make_error(ErrorCode::kInvalidArgument, "scheduler cqb: eps0 must be >= 0");
    return std::unique_ptr<Scheduler>(new Cqb(n_servers, d, eps0));
  }
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("unknown policy '{}' (rr, least or cqb)", name));
}

std::unique_ptr<Scheduler> make_oracle(std::vector<std::vector<double>> theta) {
  return std::unique_ptr<Scheduler>(new Oracle(std::move(theta)));
}

Expected<std::vector<SimResult>> simulate(const SimParams& p, const std::vector<std::string>& policies) {
  const int K = static_cast<int>(p.theta.size());
  if (K < 1) return make_error(ErrorCode::kInvalidArgument, "simulation: no servers");
  const int d = static_cast<int>(p.theta[0].size());
  for (const auto& t : p.theta)
    if (static_cast<int>(t.size()) != d || d < 1)
      return make_error(ErrorCode::kInvalidArgument, "simulation: every server needs a parameter of the same size");
  if (!(p.arrival >= 0 && p.arrival <= 1) || p.slots < 1 || p.runs < 1)
    return make_error(ErrorCode::kInvalidArgument, "simulation: arrival in [0, 1], slots and runs >= 1");
  std::vector<SimResult> out;
  for (const std::string& name : policies) {
    SimResult res;
    res.policy = name;
    res.mean_queue.assign(static_cast<size_t>(p.slots), 0.0);
    double sojourn_sum = 0;
    int64_t departed_n = 0;
    for (int run = 0; run < p.runs; ++run) {
      std::unique_ptr<Scheduler> sched;
      if (name == "oracle") {
        sched = make_oracle(p.theta);
      } else {
        LC_ASSIGN_OR_RETURN(sched, make_scheduler(name, K, d, p.eps0));
      }
      // Common random numbers: the same arrivals, features and service coins for every policy.
      std::mt19937_64 arrivals(p.seed * 1000003 + static_cast<uint64_t>(run));
      std::mt19937_64 coins(p.seed * 7919 + static_cast<uint64_t>(run) * 31 + 1);
      std::mt19937_64 own(p.seed * 104729 + static_cast<uint64_t>(run) * 17 + 3);
      std::uniform_real_distribution<double> u(0, 1);
      struct Job {
        std::vector<double> x;
        int64_t born;
      };
      std::deque<Job> queue;
      Choice c;
      c.n_servers = K;
      c.d = d;
      c.free_servers.resize(static_cast<size_t>(K));
      std::iota(c.free_servers.begin(), c.free_servers.end(), 0);
      for (int64_t t = 0; t < p.slots; ++t) {
        const bool arrives = u(arrivals) < p.arrival;
        std::vector<double> x(static_cast<size_t>(d), 1.0);
        for (int i = 1; i < d; ++i) x[static_cast<size_t>(i)] = u(arrivals);
        if (arrives && static_cast<int>(queue.size()) < p.queue_cap) queue.push_back(Job{x, t});
        std::vector<double> coin(static_cast<size_t>(K));
        for (double& v : coin) v = u(coins);
        c.n_jobs = static_cast<int>(std::min<size_t>(queue.size(), 4096));  // the oldest 4096 are candidates
        c.features.resize(static_cast<size_t>(c.n_jobs) * K * d);
        for (int j = 0; j < c.n_jobs; ++j)
          for (int k = 0; k < K; ++k)
            std::copy(queue[static_cast<size_t>(j)].x.begin(), queue[static_cast<size_t>(j)].x.end(),
                      c.features.begin() + (static_cast<size_t>(j) * K + k) * d);
        std::vector<char> leave(static_cast<size_t>(c.n_jobs), 0);
        for (const Pair& pr : sched->assign(c, own)) {
          const auto xj = c.x(pr.job, pr.server);
          double z = 0;
          for (int i = 0; i < d; ++i) z += p.theta[static_cast<size_t>(pr.server)][static_cast<size_t>(i)] * xj[static_cast<size_t>(i)];
          const bool dep = coin[static_cast<size_t>(pr.server)] < logistic(z);
          sched->observe(pr.server, xj, dep);
          if (dep) {
            leave[static_cast<size_t>(pr.job)] = 1;
            sojourn_sum += static_cast<double>(t - queue[static_cast<size_t>(pr.job)].born + 1);
            ++departed_n;
          }
        }
        std::deque<Job> rest;
        for (size_t j = 0; j < queue.size(); ++j)
          if (j >= leave.size() || !leave[j]) rest.push_back(std::move(queue[j]));
        queue.swap(rest);
        res.mean_queue[static_cast<size_t>(t)] += static_cast<double>(queue.size()) / p.runs;
      }
    }
    res.mean_sojourn = departed_n ? sojourn_sum / static_cast<double>(departed_n) : 0;
    out.push_back(std::move(res));
  }
  return out;
}

}  // namespace lc::dist
