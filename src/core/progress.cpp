#include "core/progress.h"

#include <fmt/format.h>

#include <cstdio>

#include "core/sys.h"

namespace lc {

Progress::Progress(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), t0_(now_seconds()),
      enabled_(stderr_is_terminal()) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done) {
  if (!enabled_ || finished_) return;
  const double t = now_seconds();
  if (t - last_ < 0.2 && done < total_) return;
  last_ = t;
  const double el = t - t0_;
  const double rate = el > 0 ? static_cast<double>(done) / el : 0.0;
  const double left = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
  fmt::print(stderr, "\r{}: {}/{} {}  {:.1f} {}/s  {:.0f}s left   ", label_,
             done, total_, unit_, rate,
             unit_, left);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace lc
