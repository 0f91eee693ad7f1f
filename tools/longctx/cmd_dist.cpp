// `longctx bench scale-model`: the cost model of context-parallel prefill (dist/cost_model.h)
// fitted to one host's measured prefill times, evaluated for many hosts at long lengths on two
// networks; prints a Markdown table and draws the speed-up against the number of hosts.
#include <fmt/format.h>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <thread>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "dist/cost_model.h"
#include "dist/cqb.h"
#include "dist/router.h"
#include "options.h"
#include "report/plot.h"

namespace {

namespace dist = lc::dist;

struct ScaleArgs {
  CommonOpts co;  // -m: the model whose layers and KV width set the bytes on the wire
  std::vector<std::string> prefill;  // "T:seconds"
  std::vector<int> hosts{1, 2, 4, 8, 16, 32, 64};
  std::vector<int64_t> lengths{int64_t{1} << 20, int64_t{10} << 20};
  std::vector<int> star_blocks{1, 2};  // star: context blocks per host
  std::string out = "scale-model";
  double lat10 = 50e-6, lat100 = 5e-6;
};

int run_scale(const ScaleArgs& a) {
  std::vector<std::pair<double, double>> pts;
  for (const std::string& p : a.prefill) {
    const auto colon = p.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      pts.emplace_back(std::stod(p.substr(0, colon)), std::stod(p.substr(colon + 1)));
    } catch (const std::exception&) {
      return fail(fmt::format("--prefill: '{}' is not TOKENS:SECONDS", p));
    }
  }
  auto fit = dist::PrefillFit::fit(pts);
  if (!fit) return fail(fit.error().message);
  for (int h : a.hosts)
    if (h < 1 || h > 1 << 20) return fail(fmt::format("--hosts: {} is out of range", h));
  for (int k : a.star_blocks)
    if (k < 1 || k > 1 << 20) return fail(fmt::format("--star-blocks: {} is out of range", k));
  auto model = load_model(a.co);
  if (!model) return fail(model.error().message);
  const auto& hp = (*model)->hparams();
  dist::ScaleCase base;
  base.layers = hp.n_layer;
  // What a ring step sends per token and layer: f32 keys and values of every KV head, and the
  // position (src/dist/context_parallel.cpp).
  base.wire_bytes_per_token = static_cast<double>(4 * (hp.n_head_kv * (hp.head_dim + hp.head_dim_v) + 1));
  const dist::Network net10{a.lat10, 10e9 / 8}, net100{a.lat100, 100e9 / 8};
  fmt::print("fit: one host's prefill of T tokens = {:.4g} s * T + {:.4g} s * T^2/2 ({} points); "
             "{} layers, {} bytes per token and layer on the wire\n\n",
             fit->a, fit->b, pts.size(), base.layers, base.wire_bytes_per_token);
  for (const auto& [T, t] : pts)
    fmt::print("  measured T = {:.0f}: {:.3f} s, model {:.3f} s\n", T, t, dist::one_host_prefill(*fit, T));
  auto star_name = [](int k) { return k == 1 ? std::string("star") : fmt::format("star k={}", k); };
  fmt::print("\n| tokens | hosts | one host s |");
  for (int k : a.star_blocks) fmt::print(" {0} s | {0} speed-up | {0} / N |", star_name(k));
  fmt::print(" ring 10G s | ring 10G speed-up | ring 100G s | ring 100G speed-up | contiguous ring 100G speed-up |\n"
             "|---:|---:|---:|");
  for (size_t i = 0; i < a.star_blocks.size(); ++i) fmt::print("---:|---:|---:|");
  fmt::print("---:|---:|---:|---:|---:|\n");
  lc::report::Chart ch;
  ch.title = "Context-parallel prefill: modelled speed-up";
  ch.x_label = "hosts";
  ch.y_label = "speed-up over one host";
  ch.log10_y = true;
  ch.log2_x = true;
  for (int64_t T : a.lengths) {
    std::vector<lc::report::Series> stars;
    for (int k : a.star_blocks)
      stars.push_back(lc::report::Series{
          fmt::format("{}, {}", star_name(k), lc::report::length_label(static_cast<double>(T)))});
    lc::report::Series r10{fmt::format("ring 10G, {}", lc::report::length_label(static_cast<double>(T)))};
    lc::report::Series r100{fmt::format("ring 100G, {}", lc::report::length_label(static_cast<double>(T)))};
    lc::report::Series c100{
        fmt::format("contiguous ring 100G, {}", lc::report::length_label(static_cast<double>(T)))};
    r10.dashed = r100.dashed = c100.dashed = true;
    const double one = dist::one_host_prefill(*fit, static_cast<double>(T));
    for (int N : a.hosts) {
      dist::ScaleCase c = base;
      c.tokens = static_cast<double>(T);
      c.hosts = N;
      dist::ScaleCase cc = c;
      cc.zigzag = false;
      const double g10 = dist::ring_prefill(*fit, c, net10), g100 = dist::ring_prefill(*fit, c, net100),
                   c100_s = dist::ring_prefill(*fit, cc, net100);
      fmt::print("| {} | {} | {:.4g} |", lc::report::length_label(static_cast<double>(T)), N, one);
      for (size_t i = 0; i < a.star_blocks.size(); ++i) {
        dist::ScaleCase sc = c;
        sc.star_blocks = a.star_blocks[i];
        const double s = dist::star_prefill(*fit, sc);
        fmt::print(" {:.4g} | {:.2f} | {:.2f} |", s, one / s, one / s / N);
        stars[i].x.push_back(N), stars[i].y.push_back(one / s);
      }
      fmt::print(" {:.4g} | {:.2f} | {:.4g} | {:.2f} | {:.2f} |\n", g10, one / g10, g100, one / g100, one / c100_s);
      r10.x.push_back(N), r10.y.push_back(one / g10);
      r100.x.push_back(N), r100.y.push_back(one / g100);
      c100.x.push_back(N), c100.y.push_back(one / c100_s);
    }
    for (auto& st : stars) ch.series.push_back(std::move(st));
    ch.series.push_back(std::move(r10));
    ch.series.push_back(std::move(r100));
    ch.series.push_back(std::move(c100));
  }
  lc::report::Series ideal{"N (linear)"};
  ideal.dashed = true;
  for (int N : a.hosts) ideal.x.push_back(N), ideal.y.push_back(N);
  ch.series.push_back(std::move(ideal));
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (lc::Status st = lc::report::write_chart(ch, a.out + "/speedup_vs_hosts"); !st) return fail(st.message());
  lc::report::release_plot_caches();
  fmt::print("\nplot: {}/speedup_vs_hosts.svg, .png\n", a.out);
  return 0;
}

struct RouteSimArgs {
  int64_t slots = 20000;
  int runs = 50;
  double arrival = 0.9, eps0 = 1.0;
  uint64_t seed = 1;
  std::string out = "route-sim";
};

// Two servers with opposite strengths and one average one; job feature u ~ U(0, 1).
std::vector<std::vector<double>> sim_servers() { return {{-2.0, 4.0}, {2.0, -4.0}, {0.0, 0.0}}; }

int run_route_sim(const RouteSimArgs& a) {
  dist::SimParams p;
  p.theta = sim_servers();
  p.arrival = a.arrival;
  p.slots = a.slots;
  p.runs = a.runs;
  p.seed = a.seed;
  p.eps0 = a.eps0;
  const std::vector<std::string> policies{"oracle", "cqb", "least", "rr"};
  auto r = dist::simulate(p, policies);
  if (!r) return fail(r.error().message);
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  std::ofstream csv(a.out + "/queue_length.csv");
  csv << "slot";
  for (const auto& s : *r) csv << "," << s.policy;
  csv << "\n";
  for (int64_t t = 0; t < a.slots; ++t) {
    csv << t + 1;
    for (const auto& s : *r) csv << "," << s.mean_queue[static_cast<size_t>(t)];
    csv << "\n";
  }
  if (!csv) return fail(a.out + "/queue_length.csv: write error");
  fmt::print("servers' true parameters (bias, weight of u): (-2, 4), (2, -4), (0, 0); one arrival per slot with "
             "probability {}; {} runs\n\n| policy | mean queue, last 10% of slots | mean slots in the system |\n"
             "|---|---:|---:|\n", a.arrival, a.runs);
  const int64_t from = a.slots - std::max<int64_t>(1, a.slots / 10);
  for (const auto& s : *r) {
    double m = 0;
    for (int64_t t = from; t < a.slots; ++t) m += s.mean_queue[static_cast<size_t>(t)];
    fmt::print("| {} | {:.2f} | {:.2f} |\n", s.policy, m / static_cast<double>(a.slots - from), s.mean_sojourn);
  }
  // Queue length over time, and the queue-length regret E[Q(T)] - E[Q_oracle(T)] against T (the
  // mean over a window of T/10 slots before T, to tame the noise of one slot).
  lc::report::Chart q;
  q.title = "Queue length over time (mean over runs)";
  q.x_label = "slot";
  q.y_label = "jobs waiting";
  for (const auto& s : *r) {
    lc::report::Series ser{s.policy};
    ser.markers = false;
    for (int64_t t = 0; t < a.slots; t += std::max<int64_t>(1, a.slots / 400)) {
      ser.x.push_back(static_cast<double>(t + 1));
      ser.y.push_back(s.mean_queue[static_cast<size_t>(t)]);
    }
    q.series.push_back(std::move(ser));
  }
  if (lc::Status st = lc::report::write_chart(q, a.out + "/queue_length"); !st) return fail(st.message());
  lc::report::Chart g;
  g.title = "Queue-length regret against the oracle";
  g.x_label = "T (slots)";
  g.y_label = "E[Q(T)] - E[Q_oracle(T)]";
  g.log2_x = true;
  fmt::print("\n| T |");
  for (size_t i = 1; i < r->size(); ++i) fmt::print(" {} regret |", (*r)[i].policy);
  std::string sep = "|---:|";
  for (size_t i = 1; i < r->size(); ++i) sep += "---:|";
  fmt::print("\n{}\n", sep);
  std::vector<int64_t> Ts;
  for (int64_t T = 256; T <= a.slots; T *= 2) Ts.push_back(T);
  std::vector<lc::report::Series> reg(r->size());
  for (size_t i = 1; i < r->size(); ++i) reg[i].label = (*r)[i].policy;
  auto window = [&](const dist::SimResult& s, int64_t T) {
    const int64_t w = std::max<int64_t>(1, T / 10);
    double m = 0;
    for (int64_t t = T - w; t < T; ++t) m += s.mean_queue[static_cast<size_t>(t)];
    return m / static_cast<double>(w);
  };
  for (int64_t T : Ts) {
    fmt::print("| {} |", T);
    for (size_t i = 1; i < r->size(); ++i) {
      const double v = window((*r)[i], T) - window((*r)[0], T);
      fmt::print(" {:.2f} |", v);
      reg[i].x.push_back(static_cast<double>(T));
      reg[i].y.push_back(v);
    }
    fmt::print("\n");
  }
  for (size_t i = 1; i < r->size(); ++i) g.series.push_back(std::move(reg[i]));
  if (lc::Status st = lc::report::write_chart(g, a.out + "/regret_vs_T"); !st) return fail(st.message());
  lc::report::release_plot_caches();
  fmt::print("\nwrote {0}/queue_length.csv, {0}/queue_length.svg/.png, {0}/regret_vs_T.svg/.png\n", a.out);
  return 0;
}

int g_route_pipe[2] = {-1, -1};

int run_route(const dist::RouterParams& p) {
  auto r = dist::Router::create(p);
  if (!r) return fail(r.error().message);
  if (pipe(g_route_pipe) != 0) return fail("cannot create a pipe");
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    const char b = 0;
    (void)!write(g_route_pipe[1], &b, 1);
  };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  auto port = (*r)->bind();
  if (!port) return fail(port.error().message);
  dist::Router* router = r->get();
  std::thread sig([router] {
    char b = 0;
    while (read(g_route_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    router->stop();
  });
  fmt::print("routing on http://{}:{}\n", p.host, *port);
  std::fflush(stdout);
  fmt::print(stderr, "longctx route: {} backends, policy {}, {} requests each at once\n", p.backends.size(), p.policy,
             p.max_inflight);
  router->run();
  const char b = 0;
  (void)!write(g_route_pipe[1], &b, 1);
  sig.join();
  return 0;
}

}  // namespace

std::vector<RegisteredCommand> add_route_commands(CLI::App* app) {
  auto p = std::make_shared<dist::RouterParams>();
  CLI::App* route = app->add_subcommand(
      "route", "an HTTP front that forwards OpenAI requests to several `longctx serve` backends: round-robin, "
               "least-loaded or CQB-eps (a learnt contextual queueing bandit), with retries (docs/scale-out.md)");
  route->add_option("--backend", p->backends, "backend URL http://HOST:PORT (repeat the flag)")->required();
  route->add_option("--host", p->host, "address to listen on")->capture_default_str();
  route->add_option("--port", p->port, "port (0: any free port, printed)")->check(CLI::Range(0, 65535))
      ->capture_default_str();
  route->add_option("--policy", p->policy, "rr, least or cqb")->capture_default_str();
  route->add_option("--max-inflight", p->max_inflight, "requests a backend serves at once")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  route->add_option("--max-queue", p->max_queue, "requests that may wait; beyond, 429")->capture_default_str();
  route->add_option("--eps0", p->eps0, "CQB-eps exploration: eps_t = min(1, eps0 / t^(1/4))")
      ->check(CLI::Range(0.0, 100.0))->capture_default_str();
  route->add_option("--slot", p->slot_s, "CQB's time slot, seconds")->check(CLI::Range(1e-3, 3600.0))
      ->capture_default_str();
  route->add_option("--retries", p->retries, "other backends tried after a failure")->check(CLI::Range(0, 64))
      ->capture_default_str();
  route->add_option("--timeout", p->timeout_s, "a request's deadline, seconds, waiting included")
      ->check(CLI::Range(1.0, 86400.0))->capture_default_str();
  return {{route, [p]() { return run_route(*p); }}};
}

std::vector<RegisteredCommand> add_dist_commands(CLI::App* bench) {
  auto a = std::make_shared<ScaleArgs>();
  CLI::App* app = bench->add_subcommand(
      "scale-model", "model context-parallel prefill on many hosts from one host's measured prefill times "
                     "(docs/scale-out.md)");
  app->add_option("-m,--model", a->co.model, "GGUF model (its layers and KV width; default: the embedded longctx-2l)");
  app->add_option("--prefill", a->prefill, "measured one-host prefill times, TOKENS:SECONDS, at least two lengths")
      ->delimiter(',')->required();
  app->add_option("--hosts", a->hosts, "host counts")->delimiter(',')->capture_default_str();
  app->add_option("--star-blocks", a->star_blocks,
                   "star: context blocks per host, one set of star columns each (--cp star:block=T/(kN))")
      ->delimiter(',')->capture_default_str();
  app->add_option("-L,--length", a->lengths, "prompt lengths, e.g. 1M,10M")
      ->delimiter(',')->transform(token_length_value())->capture_default_str();
  app->add_option("--latency-10g", a->lat10, "seconds per message at 10 Gbit/s")->capture_default_str();
  app->add_option("--latency-100g", a->lat100, "seconds per message at 100 Gbit/s")->capture_default_str();
  app->add_option("-o,--out-dir", a->out, "folder for the plot")->capture_default_str();
  auto b = std::make_shared<RouteSimArgs>();
  CLI::App* sim = bench->add_subcommand(
      "route-sim", "simulate the router's policies (round-robin, least-loaded, CQB-eps) against the oracle on servers "
                   "of known logistic service rates: queue length over time and queue-length regret against T");
  sim->add_option("-T,--slots", b->slots, "time slots")->check(CLI::Range(int64_t{256}, int64_t{1} << 24))
      ->capture_default_str();
  sim->add_option("--runs", b->runs, "independent runs averaged")->check(CLI::Range(1, 100000))->capture_default_str();
  sim->add_option("--arrival", b->arrival, "probability of an arrival per slot")->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sim->add_option("--eps0", b->eps0, "CQB-eps exploration: eps_t = min(1, eps0 / t^(1/4))")
      ->check(CLI::Range(0.0, 100.0))->capture_default_str();
  sim->add_option("--seed", b->seed, "seed")->capture_default_str();
  sim->add_option("-o,--out-dir", b->out, "folder for the CSV and the plots")->capture_default_str();
  return {{app, [a]() { return run_scale(*a); }}, {sim, [b]() { return run_route_sim(*b); }}};
}
