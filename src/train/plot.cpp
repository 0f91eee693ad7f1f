#include "train/plot.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "report/plot.h"

namespace lc::train {

std::string loss_csv(const std::vector<StepRecord>& h) {
  std::string s = "step,loss,lr,grad_norm,tokens_per_s,elapsed_s\n";
  for (const auto& r : h)
    s += fmt::format("{},{:.6f},{:.6g},{:.6g},{:.1f},{:.3f}\n", r.step, r.loss, static_cast<double>(r.lr),
                     r.grad_norm, r.tokens_per_s, r.elapsed_s);
  return s;
}

Status write_loss_chart(const std::vector<StepRecord>& h, const std::string& title, const std::string& stem) {
  report::Chart c;
  c.title = title;
  c.x_label = "step";
  c.y_label = "training loss";
  c.y_min = 0.0;  // the axis starts at 0 so that falls read true
  report::Series s;
  s.label = "training loss";
  s.markers = h.size() <= 60;  // dots would merge into a band on long runs
  for (const auto& r : h) {
    s.x.push_back(static_cast<double>(r.step));
    s.y.push_back(r.loss);
  }
  c.series.push_back(std::move(s));
  // Drawn next to the files, then renamed into place: a run stopped while writing (the curve is
  // rewritten at every checkpoint) leaves the previous curve whole.
  const std::string tmp = stem + ".tmp";
  LC_TRY(report::write_chart(c, tmp));
  for (const char* ext : {".svg", ".png"}) {
    const std::string from = tmp + ext, to = stem + ext;
    if (std::rename(from.c_str(), to.c_str()) != 0)
      return make_error(fmt::format("cannot rename '{}' to '{}': {}", from, to, std::strerror(errno)));
  }
  return ok_status();
}

Status write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error(fmt::format("cannot write '{}': {}", tmp, std::strerror(errno)));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return make_error(fmt::format("write error on '{}'", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
  return ok_status();
}

}  // namespace lc::train
