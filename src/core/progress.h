// A progress line (done / total, rate, time left) on a terminal; silent otherwise.
#pragma once

#include <cstdint>
#include <string>

namespace lc {

class Progress {
 public:
  Progress(std::string label, int64_t total, std::string unit = "tok");
  ~Progress();
  void update(int64_t done);
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_;
  double t0_, last_ = 0;
  bool enabled_, finished_ = false;
};

}  // namespace lc
