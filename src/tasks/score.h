// Scoring as RULER does it (scripts/eval/synthetic/constants.py and evaluate.py):
// a prediction is post-processed (stripped; control characters become new lines), then
//   string_match_all  = 100 * mean over references of [reference.lower() in prediction.lower()]
//   string_match_part = 100 * max  over references of [reference.lower() in prediction.lower()]
// and a task's score is the mean over its samples. "Effective length" (RULER, Table 3) is the
// longest length whose average stays above a threshold: 85.6, Llama-2-7B's score at 4K.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tasks/tasks.h"

namespace lc::tasks {

inline constexpr double kDefaultThreshold = 85.6;

std::string postprocess_prediction(std::string_view pred);
double string_match_all(std::string_view pred, const std::vector<std::string>& refs);   // 0..100
double string_match_part(std::string_view pred, const std::vector<std::string>& refs);  // 0..100
// 100 when the first integer in the prediction equals the (single) reference, else 0.
double first_number_match(std::string_view pred, const std::vector<std::string>& refs);
// The metric of a task applied to a post-processed prediction.
double score_prediction(Metric m, std::string_view pred, const std::vector<std::string>& refs);

// points: (length, average score). The longest length L such that every tested length up
// to L scores strictly above the threshold (RULER: "exceeds"); 0 when the shortest does not.
int64_t effective_length(std::vector<std::pair<int64_t, double>> points, double threshold = kDefaultThreshold);

}  // namespace lc::tasks
