#include "bench/ppl.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <span>

#include "report/plot.h"
#include "core/sys.h"

namespace lc::bench {

Expected<PplCurve> perplexity_by_position(Context& ctx, const std::vector<int32_t>& tokens, int64_t bucket,
                                          const std::function<void(int64_t)>& on_progress) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (bucket < 1) return make_error("perplexity by position: the bucket size must be at least 1");
  if (n < 2) return make_error("perplexity by position: the text has fewer than 2 tokens");
  if (n > ctx.n_ctx())
    return make_error(fmt::format("perplexity by position: {} tokens exceed the context of {}", n,
                                  ctx.n_ctx()));
  const int32_t n_vocab = ctx.model().tokenizer().n_vocab();
  PplCurve c;
  c.n_tokens = n;
  std::vector<double> sum(static_cast<size_t>((n + bucket - 1) / bucket), 0.0);
  std::vector<int64_t> cnt(sum.size(), 0);
  double total = 0;
  ctx.clear();
  const double t0 = now_seconds();
  // The last token predicts nothing, so it is not evaluated.
  const int64_t n_eval = n - 1;
  for (int64_t p = 0; p < n_eval; p += ctx.n_batch()) {
    const int64_t m = std::min(ctx.n_batch(), n_eval - p);
    LC_TRY(ctx.decode(std::span<const int32_t>(tokens.data() + p, static_cast<size_t>(m)), Logits::kAll));
    for (int64_t i = 0; i < m; ++i) {
      const float* lg = ctx.logits(i);
      double mx = lg[0];
      for (int32_t j = 1; j < n_vocab; ++j) mx = std::max<double>(mx, lg[j]);
      double s = 0;
      for (int32_t j = 0; j < n_vocab; ++j) s += std::exp(static_cast<double>(lg[j]) - mx);
      const int64_t target_pos = p + i + 1;  // the position of the predicted token
      const double nll = -(static_cast<double>(lg[tokens[static_cast<size_t>(target_pos)]]) - mx - std::log(s));
      const size_t b = static_cast<size_t>(target_pos / bucket);
      sum[b] += nll;
      ++cnt[b];
      total += nll;
    }
    if (on_progress) on_progress(p + m);
  }
  c.seconds = now_seconds() - t0;
  ctx.clear();
  for (size_t b = 0; b < sum.size(); ++b) {
    if (cnt[b] == 0) continue;
    PplBucket k;
    k.begin = static_cast<int64_t>(b) * bucket;
    k.end = std::min(n, k.begin + bucket);
    k.n = cnt[b];
    k.nll = sum[b] / static_cast<double>(cnt[b]);
    k.ppl = std::exp(k.nll);
    c.buckets.push_back(k);
  }
  c.ppl = std::exp(total / static_cast<double>(n_eval));
  return c;
}

Status write_ppl_csv(const std::vector<PplCurve>& curves, const std::string& path) {
  std::ofstream f(path);
  if (!f) return make_error(fmt::format("{}: cannot write", path));
  f << "model,method,begin,end,n,nll,ppl\n";
  for (const auto& c : curves)
    for (const auto& b : c.buckets)
      f << c.model << ',' << '"' << c.method << '"' << ',' << b.begin << ',' << b.end << ',' << b.n << ',' << b.nll
        << ',' << b.ppl << '\n';
  if (!f) return make_error(fmt::format("{}: write error", path));
  return ok_status();
}

Status write_ppl_plot(const std::vector<PplCurve>& curves, const std::string& stem) {
  std::set<std::string> models;
  for (const auto& c : curves) models.insert(c.model);
  report::Chart ch;
  ch.title = "Perplexity by position";
  ch.x_label = "position (tokens, bucket end)";
  ch.y_label = "perplexity";
  ch.log2_x = true;
  ch.log10_y = true;
  for (const auto& c : curves) {
    report::Series s;
    s.label = models.size() > 1 ? c.model + " · " + c.method : c.method;
    for (const auto& b : c.buckets) {
      s.x.push_back(static_cast<double>(b.end));
      s.y.push_back(b.ppl);
    }
    ch.series.push_back(std::move(s));
  }
  return report::write_chart(ch, stem);
}

}  // namespace lc::bench
