// `longctx bench scale-model`: the cost model of context-parallel prefill (dist/cost_model.h)
// fitted to one host's measured prefill times, evaluated for many hosts at long lengths on two
// networks; prints a Markdown table and draws the speed-up against the number of hosts.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "dist/cost_model.h"
#include "options.h"
#include "report/plot.h"

namespace {

namespace dist = lc::dist;

struct ScaleArgs {
  CommonOpts co;  // -m: the model whose layers and KV width set the bytes on the wire
  std::vector<std::string> prefill;  // "T:seconds"
  std::vector<int> hosts{1, 2, 4, 8, 16, 32, 64};
  std::vector<int64_t> lengths{int64_t{1} << 20, int64_t{10} << 20};
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
  fmt::print("\n| tokens | hosts | one host s | star s | star speed-up | star / N | ring 10G s | ring 10G speed-up | "
             "ring 100G s | ring 100G speed-up |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  lc::report::Chart ch;
  ch.title = "Context-parallel prefill: modelled speed-up";
  ch.x_label = "hosts";
  ch.y_label = "speed-up over one host";
  ch.log10_y = true;
  ch.log2_x = true;
  for (int64_t T : a.lengths) {
    lc::report::Series star{fmt::format("star, {}", lc::report::length_label(static_cast<double>(T)))};
    lc::report::Series r10{fmt::format("ring 10G, {}", lc::report::length_label(static_cast<double>(T)))};
    lc::report::Series r100{fmt::format("ring 100G, {}", lc::report::length_label(static_cast<double>(T)))};
    r10.dashed = r100.dashed = true;
    const double one = dist::one_host_prefill(*fit, static_cast<double>(T));
    for (int N : a.hosts) {
      dist::ScaleCase c = base;
      c.tokens = static_cast<double>(T);
      c.hosts = N;
      const double s = dist::star_prefill(*fit, c), g10 = dist::ring_prefill(*fit, c, net10),
                   g100 = dist::ring_prefill(*fit, c, net100);
      fmt::print("| {} | {} | {:.4g} | {:.4g} | {:.2f} | {:.2f} | {:.4g} | {:.2f} | {:.4g} | {:.2f} |\n",
                 lc::report::length_label(static_cast<double>(T)), N, one, s, one / s, one / s / N, g10, one / g10,
                 g100, one / g100);
      star.x.push_back(N), star.y.push_back(one / s);
      r10.x.push_back(N), r10.y.push_back(one / g10);
      r100.x.push_back(N), r100.y.push_back(one / g100);
    }
    ch.series.push_back(std::move(star));
    ch.series.push_back(std::move(r10));
    ch.series.push_back(std::move(r100));
  }
  lc::report::Series ideal{"N (linear)"};
  ideal.dashed = true;
  for (int N : a.hosts) ideal.x.push_back(N), ideal.y.push_back(N);
  ch.series.push_back(std::move(ideal));
  if (lc::Status st = lc::report::write_chart(ch, a.out + "/speedup_vs_hosts"); !st) return fail(st.message());
  lc::report::release_plot_caches();
  fmt::print("\nplot: {}/speedup_vs_hosts.svg, .png\n", a.out);
  return 0;
}

}  // namespace

std::vector<RegisteredCommand> add_dist_commands(CLI::App* bench) {
  auto a = std::make_shared<ScaleArgs>();
  CLI::App* app = bench->add_subcommand(
      "scale-model", "model context-parallel prefill on many hosts from one host's measured prefill times "
                     "(docs/scale-out.md)");
  app->add_option("-m,--model", a->co.model, "GGUF model (its layers and KV width; default: the embedded longctx-2l)");
  app->add_option("--prefill", a->prefill, "measured one-host prefill times, TOKENS:SECONDS, at least two lengths")
      ->delimiter(',')->required();
  app->add_option("--hosts", a->hosts, "host counts")->delimiter(',')->capture_default_str();
  app->add_option("-L,--length", a->lengths, "prompt lengths, e.g. 1M,10M")
      ->delimiter(',')->transform(token_length_value())->capture_default_str();
  app->add_option("--latency-10g", a->lat10, "seconds per message at 10 Gbit/s")->capture_default_str();
  app->add_option("--latency-100g", a->lat100, "seconds per message at 100 Gbit/s")->capture_default_str();
  app->add_option("-o,--out-dir", a->out, "folder for the plot")->capture_default_str();
  return {{app, [a]() { return run_scale(*a); }}};
}
