#include "core/progress.h"

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
  std::fprintf(stderr, "\r%s: %lld/%lld %s  %.1f %s/s  %.0fs left   ", label_.c_str(),
               static_cast<long long>(done), static_cast<long long>(total_), unit_.c_str(), rate,
               unit_.c_str(), left);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace lc
