// Scorers against hand-worked cases of RULER's formulas (scripts/eval/synthetic/constants.py):
//   string_match_all  = mean over refs of [ref.lower() in pred.lower()] * 100
//   string_match_part = max  over refs of [ref.lower() in pred.lower()] * 100
#include <gtest/gtest.h>

#include "tasks/score.h"

namespace lc::tasks {
namespace {

TEST(BenchScore, StringMatchAll) {
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 123 and 456.", {"123", "456"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 123.", {"123", "456"}), 50.0);
  EXPECT_DOUBLE_EQ(string_match_all("nothing", {"123", "456", "789"}), 0.0);
  EXPECT_NEAR(string_match_all("a b", {"a", "b", "c"}), 200.0 / 3.0, 1e-9);
  // Case-insensitive substring, as Python's `r.lower() in pred.lower()`.
  EXPECT_DOUBLE_EQ(string_match_all("ANSWER: KITCHEN", {"kitchen"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_all("1234567", {"234"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_all("anything", {}), 0.0);
}

TEST(BenchScore, StringMatchPart) {
  EXPECT_DOUBLE_EQ(string_match_part("Paris, France", {"paris", "Lyon"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_part("Berlin", {"paris", "Lyon"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("both paris and lyon", {"paris", "Lyon"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_part("x", {}), 0.0);
}

TEST(BenchScore, FirstNumber) {
  EXPECT_DOUBLE_EQ(first_number_match(" 12 observations", {"12"}), 100.0);
  EXPECT_DOUBLE_EQ(first_number_match("112", {"12"}), 0.0);  // a substring match would pass this
  EXPECT_DOUBLE_EQ(first_number_match("about 7, not 12", {"12"}), 0.0);
  EXPECT_DOUBLE_EQ(first_number_match("none", {"12"}), 0.0);
}

TEST(BenchScore, Postprocess) {
  // RULER: strip, control characters to new lines, strip again.
  EXPECT_EQ(postprocess_prediction("  abc\tdef\x01 \n"), "abc\ndef");
  EXPECT_EQ(postprocess_prediction("\n\n"), "");
  EXPECT_EQ(score_prediction(Metric::kMatchAll, "x 5 y", {"5"}), 100.0);
  EXPECT_EQ(score_prediction(Metric::kMatchPart, "x 5 y", {"6", "5"}), 100.0);
  EXPECT_EQ(score_prediction(Metric::kFirstNumber, "x 5 y", {"5"}), 100.0);
}

TEST(BenchScore, EffectiveLength) {
  EXPECT_EQ(effective_length({{4096, 95}, {8192, 90}, {16384, 86}, {32768, 80}}), 16384);
  EXPECT_EQ(effective_length({{32768, 80}, {4096, 95}, {16384, 86}, {8192, 90}}), 16384);  // any order
  EXPECT_EQ(effective_length({{4096, 80}, {8192, 90}}), 0);       // the shortest already fails
  EXPECT_EQ(effective_length({{4096, 95}, {8192, 85.6}, {16384, 99}}), 4096);  // must exceed; stays above
  EXPECT_EQ(effective_length({{4096, 95}, {8192, 96}}), 8192);
  EXPECT_EQ(effective_length({}), 0);
  EXPECT_EQ(effective_length({{1024, 50}, {2048, 40}}, 30.0), 2048);
}

}  // namespace
}  // namespace lc::tasks
