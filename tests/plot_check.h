// Test helpers shared by the test executables that write charts (tests/report, tests/bench).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "report/plot.h"

namespace lc::test {

// cairo keeps fonts from fontconfig in static caches; released before the leak check runs (one
// registration per test program, however many files include this header).
class CairoReset : public ::testing::Environment {
 public:
  void TearDown() override { report::release_plot_caches(); }
};
inline const auto* const kCairoReset = ::testing::AddGlobalTestEnvironment(new CairoReset);

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A chart written as STEM.svg and STEM.png: both present, of some size, of the right kind.
inline void expect_plot(const std::string& stem) {
  const std::string svg = slurp(stem + ".svg");
  const std::string png = slurp(stem + ".png");
  EXPECT_GT(svg.size(), 1000u) << stem;
  EXPECT_NE(svg.find("<svg"), std::string::npos) << stem;
  ASSERT_GT(png.size(), 1000u) << stem;
  EXPECT_EQ(png.substr(1, 3), "PNG") << stem;
}

}  // namespace lc::test
