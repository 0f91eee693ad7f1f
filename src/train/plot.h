// The loss curve as CSV, and drawn as SVG and PNG by the benchmark's line charts (report/plot.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace lc::train {

struct StepRecord {
  int64_t step = 0;        // 1-based optimizer step
  double loss = 0;         // mean training loss of the step's batch
  float lr = 0;
  double grad_norm = 0;    // before clipping
  double tokens_per_s = 0; // this step
  double elapsed_s = 0;    // since the start of the run (resumed runs continue the count)
};

std::string loss_csv(const std::vector<StepRecord>& h);
// Writes <stem>.svg and <stem>.png (the same picture: loss against step, the axis from 0).
Status write_loss_chart(const std::vector<StepRecord>& h, const std::string& title, const std::string& stem);
// Writes `text` to a temporary file next to `path`, then renames it into place.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace lc::train
