#include "dist/cost_model.h"

#include <fmt/format.h>

#include <cmath>

namespace lc::dist {

Expected<PrefillFit> PrefillFit::fit(const std::vector<std::pair<double, double>>& points) {
  if (points.size() < 2) return make_error(ErrorCode::kInvalidArgument, "cost model: give at least two lengths");
  // Normal equations of t = a*x1 + b*x2 with x1 = T, x2 = T^2/2.
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  for (const auto& [T, t] : points) {
    if (!(T > 0) || !(t > 0))
      return make_error(ErrorCode::kInvalidArgument, fmt::format("cost model: bad point ({}, {})", T, t));
    const double x1 = T, x2 = T * T / 2;
    s11 += x1 * x1, s12 += x1 * x2, s22 += x2 * x2, r1 += x1 * t, r2 += x2 * t;
  }
  const double det = s11 * s22 - s12 * s12;
  if (!(std::fabs(det) > 0)) return make_error(ErrorCode::kInvalidArgument, "cost model: give two different lengths");
  PrefillFit f;
  f.a = (r1 * s22 - r2 * s12) / det;
  f.b = (r2 * s11 - r1 * s12) / det;
  return f;
}

double one_host_prefill(const PrefillFit& f, double T) { return f.seconds(T, T * T / 2); }

double star_prefill(const PrefillFit& f, const ScaleCase& c) {
  if (c.hosts == 1) return one_host_prefill(f, c.tokens);
  const double k = c.star_blocks, B = c.tokens / (k * c.hosts);
  return f.seconds(k * 2 * B, k * 2 * B * B);  // k times anchor + block: (2B)^2 / 2 pairs
}

double ring_prefill(const PrefillFit& f, const ScaleCase& c, const Network& net) {
  const double N = c.hosts, B = c.tokens / N;
  if (c.hosts == 1) return one_host_prefill(f, c.tokens);
  const double compute = f.seconds(B, c.zigzag ? B * B * N / 2 : B * B * (N - 0.5));
  const double comm = static_cast<double>(c.layers) * (N - 1) * net.message(B * c.wire_bytes_per_token);
  return compute + comm;
}

}  // namespace lc::dist
