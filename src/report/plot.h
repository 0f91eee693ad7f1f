// Line charts of benchmark results and training curves, drawn with cairo into an SVG and a PNG
// of the same picture: axes with ticks, a title, a legend, optional log scales and a threshold
// line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace lc::report {

struct Series {
  std::string label;
  std::vector<double> x, y;  // same size; points are drawn in the order given
  bool dashed = false;
  int colour = -1;           // palette index; -1: the series' position
  bool markers = true;       // a dot at every point (off for long curves, e.g. a loss per step)
};

struct Chart {
  std::string title, x_label, y_label;
  bool log2_x = false;       // lengths: ticks at powers of two, labelled 4K, 8K, ...
  bool log10_y = false;      // speeds and memory spanning decades
  std::optional<double> y_min, y_max;
  std::optional<double> hline;  // e.g. the effective-length threshold
  std::string hline_label;
  std::vector<Series> series;
};

// Writes <path_stem>.svg and <path_stem>.png.
Status write_chart(const Chart& c, const std::string& path_stem);
// Frees cairo's static font caches (fonts come from fontconfig). Call only when no drawing is
// in progress and none will start in another thread, e.g. at the end of a command; drawing
// afterwards works but loads the fonts again.
void release_plot_caches();
// "512", "4K", "128K", "1M".
std::string length_label(double v);

}  // namespace lc::report
