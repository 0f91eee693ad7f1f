#include "report/plot.h"

#include <fmt/format.h>

#include <cairo-svg.h>
#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lc::report {

std::string length_label(double v) {
  if (v >= 1048576 && std::fmod(v, 1048576) == 0) return fmt::format("{:.0f}M", v / 1048576);
  if (v >= 1024 && std::fmod(v, 1024) == 0) return fmt::format("{:.0f}K", v / 1024);
  return fmt::format("{:.0f}", v);
}

namespace {

constexpr double kW = 960, kH = 560;
constexpr double kLeft = 80, kRight = 250, kTop = 56, kBottom = 64;

struct Rgb {
  double r, g, b;
};
// A colour-blind-friendly palette (Okabe-Ito, then a few more).
const Rgb kPalette[] = {{0.00, 0.45, 0.70}, {0.90, 0.62, 0.00}, {0.00, 0.62, 0.45}, {0.80, 0.47, 0.65},
                        {0.34, 0.71, 0.91}, {0.84, 0.37, 0.00}, {0.94, 0.89, 0.26}, {0.30, 0.30, 0.30},
                        {0.55, 0.34, 0.16}, {0.50, 0.00, 0.50}};

std::string tick_text(double v) {
  const double a = std::fabs(v);
  if (a >= 1e6 || (a > 0 && a < 1e-3)) return fmt::format("{:.0e}", v);
  if (a >= 100 || std::fabs(v - std::round(v)) < 1e-9) return fmt::format("{:.0f}", v);
  if (a >= 1) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

// Ticks of a linear axis: 1, 2, 5 x 10^k steps, about 6 of them.
std::vector<double> linear_ticks(double lo, double hi) {
  std::vector<double> t;
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 6;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = p;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) {
      step = m * p;
      break;
    }
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

struct Axes {
  double x0, x1, y0, y1;  // data range after the transform (log2 / log10)
  bool lx, ly;
  double px(double x) const {
    const double v = lx ? std::log2(x) : x;
    return kLeft + (v - x0) / (x1 - x0) * (kW - kLeft - kRight);
  }
  double py(double y) const {
    const double v = ly ? std::log10(y) : y;
    return kH - kBottom - (v - y0) / (y1 - y0) * (kH - kTop - kBottom);
  }
};

void text_at(cairo_t* cr, const std::string& s, double x, double y, double ax, double ay) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - e.width * ax - e.x_bearing, y - e.height * ay - e.y_bearing);
  cairo_show_text(cr, s.c_str());
}

void draw(cairo_t* cr, const Chart& c) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  // Data ranges (only points a log axis can show).
  Axes a{0, 1, 0, 1, c.log2_x, c.log10_y};
  bool any = false;
  double xmin = 0, xmax = 0, ymin = 0, ymax = 0;
  for (const auto& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      const double x = s.x[i], y = s.y[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (a.lx && x <= 0) || (a.ly && y <= 0)) continue;
      const double tx = a.lx ? std::log2(x) : x, ty = a.ly ? std::log10(y) : y;
      if (!any) xmin = xmax = tx, ymin = ymax = ty, any = true;
      xmin = std::min(xmin, tx), xmax = std::max(xmax, tx), ymin = std::min(ymin, ty), ymax = std::max(ymax, ty);
    }
  if (c.hline && (!a.ly || *c.hline > 0)) {
    const double h = a.ly ? std::log10(*c.hline) : *c.hline;
    if (any) ymin = std::min(ymin, h), ymax = std::max(ymax, h);
  }
  if (c.y_min) ymin = a.ly ? std::log10(*c.y_min) : *c.y_min;
  if (c.y_max) ymax = a.ly ? std::log10(*c.y_max) : *c.y_max;
  if (!any && !c.y_min) ymin = 0;
  if (!any && !c.y_max) ymax = 1;
  if (xmax - xmin < 1e-9) xmin -= a.lx ? 1 : 1, xmax += a.lx ? 1 : 1;
  if (ymax - ymin < 1e-9) ymin -= a.ly ? 0.5 : 1, ymax += a.ly ? 0.5 : 1;
  const double xpad = (xmax - xmin) * 0.04, ypad = (ymax - ymin) * 0.05;
  a.x0 = xmin - xpad, a.x1 = xmax + xpad;
  a.y0 = c.y_min ? ymin : ymin - ypad;
  a.y1 = c.y_max ? ymax : ymax + ypad;

  const double L = kLeft, R = kW - kRight, T = kTop, B = kH - kBottom;
  // Grid and ticks.
  cairo_set_font_size(cr, 11);
  std::vector<std::pair<double, std::string>> xt, yt;
  if (a.lx) {
    const int lo = static_cast<int>(std::ceil(a.x0 - 1e-9)), hi = static_cast<int>(std::floor(a.x1 + 1e-9));
    const int step = std::max(1, (hi - lo + 1 + 11) / 12);
    for (int k = lo; k <= hi; k += step) xt.emplace_back(std::exp2(k), length_label(std::exp2(k)));
  } else {
    for (double v : linear_ticks(a.x0, a.x1)) xt.emplace_back(v, tick_text(v));
  }
  if (a.ly) {
    const int lo = static_cast<int>(std::floor(a.y0)), hi = static_cast<int>(std::ceil(a.y1));
    // Denser mantissas when the data spans little more than a decade.
    const double span = a.y1 - a.y0;
    const std::vector<double> mant = span < 1.2 ? std::vector<double>{1, 1.5, 2, 3, 4, 5, 7}
                                     : span < 3.5 ? std::vector<double>{1, 2, 5}
                                                  : std::vector<double>{1};
    for (int k = lo; k <= hi; ++k)
      for (double m : mant) {
        const double v = m * std::pow(10.0, k);
        const double lv = std::log10(v);
        if (lv >= a.y0 - 1e-9 && lv <= a.y1 + 1e-9) yt.emplace_back(v, tick_text(v));
      }
  } else {
    for (double v : linear_ticks(a.y0, a.y1)) yt.emplace_back(v, tick_text(v));
  }
  cairo_set_line_width(cr, 1);
  for (const auto& [v, s] : xt) {
    const double x = a.px(v);
    if (x < L - 0.5 || x > R + 0.5) continue;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, x, T), cairo_line_to(cr, x, B), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_move_to(cr, x, B), cairo_line_to(cr, x, B + 5), cairo_stroke(cr);
    text_at(cr, s, x, B + 8, 0.5, 0.0);
  }
  for (const auto& [v, s] : yt) {
    const double y = a.py(v);
    if (y < T - 0.5 || y > B + 0.5) continue;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, L, y), cairo_line_to(cr, R, y), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_move_to(cr, L - 5, y), cairo_line_to(cr, L, y), cairo_stroke(cr);
    text_at(cr, s, L - 8, y, 1.0, 0.5);
  }
  // Frame.
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_rectangle(cr, L, T, R - L, B - T);
  cairo_stroke(cr);
  // Threshold line.
  if (c.hline && (!a.ly || *c.hline > 0)) {
    const double y = a.py(*c.hline);
    if (y >= T && y <= B) {
      cairo_save(cr);
      const double dash[] = {2, 3};
      cairo_set_dash(cr, dash, 2, 0);
      cairo_set_source_rgb(cr, 0.75, 0.1, 0.1);
      cairo_move_to(cr, L, y), cairo_line_to(cr, R, y), cairo_stroke(cr);
      cairo_restore(cr);
      if (!c.hline_label.empty()) {
        cairo_set_source_rgb(cr, 0.75, 0.1, 0.1);
        text_at(cr, c.hline_label, R - 4, y - 3, 1.0, 1.0);
      }
    }
  }
  // Series, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, L, T, R - L, B - T);
  cairo_clip(cr);
  for (size_t si = 0; si < c.series.size(); ++si) {
    const Series& s = c.series[si];
    const Rgb col = kPalette[(s.colour >= 0 ? static_cast<size_t>(s.colour) : si) % std::size(kPalette)];
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_set_line_width(cr, 2);
    if (s.dashed) {
      const double dash[] = {6, 4};
      cairo_set_dash(cr, dash, 2, 0);
    } else {
      cairo_set_dash(cr, nullptr, 0, 0);
    }
    bool pen = false;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (a.lx && s.x[i] <= 0) || (a.ly && s.y[i] <= 0)) {
        pen = false;
        continue;
      }
      if (pen) cairo_line_to(cr, a.px(s.x[i]), a.py(s.y[i]));
      else cairo_move_to(cr, a.px(s.x[i]), a.py(s.y[i]));
      pen = true;
    }
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    for (size_t i = 0; s.markers && i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (a.lx && s.x[i] <= 0) || (a.ly && s.y[i] <= 0)) continue;
      cairo_arc(cr, a.px(s.x[i]), a.py(s.y[i]), 3.5, 0, 2 * M_PI);
      cairo_fill(cr);
    }
  }
  cairo_restore(cr);
  if (!any) {
    cairo_set_source_rgb(cr, 0.5, 0.5, 0.5);
    cairo_set_font_size(cr, 14);
    text_at(cr, "no data", (L + R) / 2, (T + B) / 2, 0.5, 0.5);
  }
  // Title and axis labels.
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  cairo_set_font_size(cr, 16);
  text_at(cr, c.title, (L + R) / 2, T - 20, 0.5, 0.5);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 13);
  text_at(cr, c.x_label + (a.lx ? " (log scale)" : ""), (L + R) / 2, kH - 18, 0.5, 0.5);
  cairo_save(cr);
  cairo_translate(cr, 20, (T + B) / 2);
  cairo_rotate(cr, -M_PI / 2);
  text_at(cr, c.y_label + (a.ly ? " (log scale)" : ""), 0, 0, 0.5, 0.5);
  cairo_restore(cr);
  // Legend, right of the plot; long labels are cut.
  cairo_set_font_size(cr, 11);
  double ly = T + 8;
  for (size_t si = 0; si < c.series.size() && ly < kH - 10; ++si) {
    const Series& s = c.series[si];
    const Rgb col = kPalette[(s.colour >= 0 ? static_cast<size_t>(s.colour) : si) % std::size(kPalette)];
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_set_line_width(cr, 2);
    if (s.dashed) {
      const double dash[] = {6, 4};
      cairo_set_dash(cr, dash, 2, 0);
    }
    cairo_move_to(cr, R + 14, ly), cairo_line_to(cr, R + 40, ly), cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    if (s.markers) {
      cairo_arc(cr, R + 27, ly, 3.5, 0, 2 * M_PI);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    std::string lab = s.label.size() > 30 ? s.label.substr(0, 29) + "…" : s.label;
    text_at(cr, lab, R + 46, ly, 0.0, 0.5);
    ly += 18;
  }
}

}  // namespace

void release_plot_caches() { cairo_debug_reset_static_data(); }

}  // namespace lc::report

#if defined(__SANITIZE_ADDRESS__)
// cairo's text goes through fontconfig, which leaks a little of its configuration the first
// time it loads it (FcInitLoadConfigAndFonts, inside libfontconfig; nothing of ours holds
// it). release_plot_caches() frees what cairo keeps, and this tells LeakSanitizer to ignore the
// rest, so that sanitizer builds of the tests and of longctx exit cleanly after drawing a plot.
// Weak, so that a program with suppressions of its own keeps them.
extern "C" __attribute__((weak)) const char* __lsan_default_suppressions() { return "leak:libfontconfig.so\n"; }
#endif

namespace lc::report {

Status write_chart(const Chart& c, const std::string& stem) {
  {
    const std::string path = stem + ".svg";
    cairo_surface_t* svg = cairo_svg_surface_create(path.c_str(), kW, kH);
    if (cairo_surface_status(svg) != CAIRO_STATUS_SUCCESS) {
      cairo_surface_destroy(svg);
      return make_error(fmt::format("{}: cannot create the SVG file", path));
    }
    cairo_t* cr = cairo_create(svg);
    draw(cr, c);
    cairo_destroy(cr);
    cairo_surface_finish(svg);
    const cairo_status_t st = cairo_surface_status(svg);
    cairo_surface_destroy(svg);
    if (st != CAIRO_STATUS_SUCCESS) return make_error(fmt::format("{}: {}", path, cairo_status_to_string(st)));
  }
  {
    const std::string path = stem + ".png";
    cairo_surface_t* img = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, static_cast<int>(kW), static_cast<int>(kH));
    cairo_t* cr = cairo_create(img);
    draw(cr, c);
    cairo_destroy(cr);
    const cairo_status_t st = cairo_surface_write_to_png(img, path.c_str());
    cairo_surface_destroy(img);
    if (st != CAIRO_STATUS_SUCCESS) return make_error(fmt::format("{}: cannot write the PNG ({})", path, cairo_status_to_string(st)));
  }
  return ok_status();
}

}  // namespace lc::report
