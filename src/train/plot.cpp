#include "train/plot.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace lc::train {
namespace {

// Tick step of about n intervals over [lo, hi]: 1, 2 or 5 times a power of ten.
double nice_step(double lo, double hi, int n) {
  const double raw = (hi - lo) / n;
  if (!(raw > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<') o += "&lt;";
    else if (ch == '>') o += "&gt;";
    else if (ch == '&') o += "&amp;";
    else if (ch == '"') o += "&quot;";
    else o += ch;
  }
  return o;
}

}  // namespace

std::string loss_csv(const std::vector<StepRecord>& h) {
  std::string s = "step,loss,lr,grad_norm,tokens_per_s,elapsed_s\n";
  for (const auto& r : h)
    s += strprintf("%lld,%.6f,%.6g,%.6g,%.1f,%.3f\n", (long long)r.step, r.loss, static_cast<double>(r.lr),
                   r.grad_norm, r.tokens_per_s, r.elapsed_s);
  return s;
}

std::string loss_svg(const std::vector<StepRecord>& h, const std::string& title) {
  const double W = 800, H = 480, ml = 70, mr = 20, mt = 40, mb = 50;
  const double pw = W - ml - mr, ph = H - mt - mb;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (!h.empty()) {
    x0 = static_cast<double>(h.front().step);
    x1 = static_cast<double>(h.back().step);
    y0 = y1 = h.front().loss;
    for (const auto& r : h) {
      if (!std::isfinite(r.loss)) continue;
      y0 = std::min(y0, r.loss);
      y1 = std::max(y1, r.loss);
    }
  }
  if (x1 <= x0) x1 = x0 + 1;
  const double ys = nice_step(std::min(y0, 0.0), y1, 6);
  y0 = std::floor(std::min(y0, 0.0) / ys) * ys;  // start the axis at 0 so falls read true
  y1 = std::ceil(y1 / ys) * ys;
  if (y1 <= y0) y1 = y0 + ys;
  auto px = [&](double x) { return ml + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return mt + (1 - (y - y0) / (y1 - y0)) * ph; };

  std::string s = strprintf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      W, H, W, H);
  s += strprintf("<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n", W / 2,
                 xml_escape(title).c_str());
  for (double y = y0; y <= y1 + ys * 1e-6; y += ys) {
    s += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ml, py(y), ml + pw, py(y));
    s += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ml - 6, py(y) + 4, y);
  }
  const double xs = std::max(1.0, nice_step(x0, x1, 8));
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs) {
    s += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px(x), mt, px(x), mt + ph);
    s += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", px(x), mt + ph + 16, x);
  }
  s += strprintf("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n", ml, mt, pw, ph);
  s += strprintf("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n", ml + pw / 2, H - 10);
  s += strprintf("<text x=\"16\" y=\"%.0f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.0f)\">training loss</text>\n",
                 mt + ph / 2, mt + ph / 2);
  s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  for (const auto& r : h) {
    if (!std::isfinite(r.loss)) continue;
    s += strprintf("%.1f,%.1f ", px(static_cast<double>(r.step)), py(r.loss));
  }
  s += "\"/>\n</svg>\n";
  return s;
}

Status write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error(strprintf("cannot write '%s': %s", tmp.c_str(), std::strerror(errno)));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return make_error(strprintf("write error on '%s'", tmp.c_str()));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(strprintf("cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(), std::strerror(errno)));
  return Status::ok();
}

}  // namespace lc::train
