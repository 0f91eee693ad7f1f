#include "tasks/score.h"

#include <algorithm>
#include <cctype>

#include "tasks/text.h"

namespace lc::tasks {

namespace {
std::string strip(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}
}  // namespace

std::string postprocess_prediction(std::string_view pred) {
  std::string s = strip(pred);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  return strip(s);
}

double string_match_all(std::string_view pred, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0.0;
  const std::string p = to_lower(pred);
  double hit = 0;
  for (const auto& r : refs) hit += p.find(to_lower(r)) != std::string::npos ? 1.0 : 0.0;
  return 100.0 * hit / static_cast<double>(refs.size());
}

double string_match_part(std::string_view pred, const std::vector<std::string>& refs) {
  const std::string p = to_lower(pred);
  for (const auto& r : refs)
    if (p.find(to_lower(r)) != std::string::npos) return 100.0;
  return 0.0;
}

double first_number_match(std::string_view pred, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0.0;
  size_t i = 0;
  while (i < pred.size() && !std::isdigit(static_cast<unsigned char>(pred[i]))) ++i;
  size_t j = i;
  while (j < pred.size() && std::isdigit(static_cast<unsigned char>(pred[j]))) ++j;
  if (i == j) return 0.0;
  return pred.substr(i, j - i) == refs[0] ? 100.0 : 0.0;
}

double score_prediction(Metric m, std::string_view pred, const std::vector<std::string>& refs) {
  switch (m) {
    case Metric::kMatchAll: return string_match_all(pred, refs);
    case Metric::kMatchPart: return string_match_part(pred, refs);
    case Metric::kFirstNumber: return first_number_match(pred, refs);
  }
  return 0.0;
}

int64_t effective_length(std::vector<std::pair<int64_t, double>> points, double threshold) {
  std::sort(points.begin(), points.end());
  int64_t best = 0;
  for (const auto& [len, score] : points) {
    if (!(score > threshold)) break;
    best = len;
  }
  return best;
}

}  // namespace lc::tasks
