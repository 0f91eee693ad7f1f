// The loss curve as CSV and as an SVG drawn by hand (the train module does not link cairo).
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
std::string loss_svg(const std::vector<StepRecord>& h, const std::string& title);
// Writes `text` to a temporary file next to `path`, then renames it into place.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace lc::train
