// Contextual queueing bandits (Bae, Kang and Lee, "Queue Length Regret Bounds for Contextual
// Queueing Bandits", ICLR 2026, arXiv 2601.19300):
// jobs wait in one queue, each with a feature vector per server; a server that serves job x for
// one time slot completes it with probability sigma(theta_k . x), theta_k unknown. The agent
// picks job-server pairs to maximise departures while it learns the theta_k. CQB-eps explores a
// random pair with probability eps_t and otherwise takes the pairs of the highest estimated
// rate, estimating theta_k by logistic regression on the slots it has seen.
//
// Here: the learner (online Newton steps of the regularised logistic likelihood), the policies
// the router (longctx route) and the simulation share (round-robin, least-loaded, CQB-eps, and
// the oracle that knows theta and takes the pairs of the highest true rate), and a simulation in
// discrete time with known rates, where the queue-length regret E[Q_policy(T)] - E[Q_oracle(T)]
// can be computed (docs/scale-out.md).
// The exploration schedule eps_t = min(1, eps0 / t^(1/4)) is this project's choice: the paper's
// exact schedule was not available here.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lc::dist {

double logistic(double z);

// One server's departure probability as a logistic function of the job's features.
class ServiceModel {
 public:
  explicit ServiceModel(int d, double reg = 1.0);
  int dim() const { return d_; }
  double rate(std::span<const double> x) const;
  // One slot of service of a job x: departed or not. An online Newton step: the inverse
  // Hessian of the regularised log-likelihood is kept by Sherman-Morrison updates.
  void observe(std::span<const double> x, bool departed);
  const std::vector<double>& theta() const { return theta_; }
  int64_t n_observed() const { return n_; }

 private:
  int d_;
  std::vector<double> theta_, hinv_;  // hinv_: [d, d]
  int64_t n_ = 0;
};

// The jobs waiting and the servers that can take one now. x(j, k): job j's features as server k
// sees them (e.g. the prefix server k has cached), dim d each.
struct Choice {
  int n_jobs = 0, n_servers = 0, d = 0;
  std::vector<double> features;   // [n_jobs, n_servers, d]
  std::vector<int> free_servers;  // servers that can take a job now
  std::vector<int> load;          // [n_servers] jobs in service at each (least-loaded)
  std::span<const double> x(int j, int k) const {
    return {features.data() + (static_cast<size_t>(j) * n_servers + k) * d, static_cast<size_t>(d)};
  }
};

struct Pair {
  int job = 0, server = 0;
  bool operator==(const Pair&) const = default;
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual std::string name() const = 0;
  // Job-server pairs for this slot: each job and each free server at most once.
  virtual std::vector<Pair> assign(const Choice& c, std::mt19937_64& rng) = 0;
  // Feedback: server k served job x for one slot (or a request took `slots` slots: departed
  // only in the last).
  virtual void observe(int server, std::span<const double> x, bool departed) {}
};

// "rr" (jobs first come first served, servers in turn), "least" (to the free server with the
// fewest jobs in service), "cqb" (CQB-eps; eps0 and the features' dimension), "oracle" (the true
// theta, for the simulation).
Expected<std::unique_ptr<Scheduler>> make_scheduler(std::string_view name, int n_servers, int d, double eps0 = 1.0);
std::unique_ptr<Scheduler> make_oracle(std::vector<std::vector<double>> theta);

// Pairs of the highest rate first, greedily (rate(j, k) for every waiting j and free k).
std::vector<Pair> greedy_pairs(const Choice& c, const std::vector<double>& rate /*[n_jobs, n_servers]*/);

struct SimParams {
  std::vector<std::vector<double>> theta;  // [servers][d] true parameters; feature 0 is 1
  double arrival = 0.5;   // probability of one arrival per slot
  int64_t slots = 10000;  // horizon T
  int runs = 20;          // independent runs averaged
  uint64_t seed = 1;
  double eps0 = 1.0;
  int queue_cap = 1 << 20;  // arrivals beyond are dropped (a bounded simulation)
};

struct SimResult {
  std::string policy;
  std::vector<double> mean_queue;  // [slots] mean over runs of the queue length after each slot
  double mean_sojourn = 0;         // mean slots from arrival to departure over every departed job
};

// Every policy on the same arrivals and features (common random numbers across policies).
Expected<std::vector<SimResult>> simulate(const SimParams& p, const std::vector<std::string>& policies);

}  // namespace lc::dist
