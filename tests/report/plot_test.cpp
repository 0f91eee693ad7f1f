// Line charts: empty and odd charts still draw (an SVG and a PNG), bad paths fail, length
// labels. (Moved from tests/bench/run_test.cpp with the plots, src/bench -> src/report.)
#include <gtest/gtest.h>

#include "plot_check.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "report/plot.h"

namespace lc::report {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("longctx_report_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

using test::expect_plot;
using test::slurp;

TEST(BenchPlot, EmptyAndOddCharts) {
  const std::string out = fresh_dir("plot");
  fs::create_directories(out);
  Chart empty;
  empty.title = "nothing";
  ASSERT_TRUE(write_chart(empty, out + "/empty").is_ok());
  expect_plot(out + "/empty");
  Chart one;
  one.title = "one point";
  one.log2_x = true;
  one.log10_y = true;
  one.series.push_back({"a", {4096}, {12.5}, false, -1});
  one.series.push_back({"zero and nan are skipped", {1024, 2048}, {0.0, std::nan("")}, true, -1});
  ASSERT_TRUE(write_chart(one, out + "/one").is_ok());
  expect_plot(out + "/one");
  EXPECT_FALSE(write_chart(one, "/nonexistent/dir/x").is_ok());
  EXPECT_EQ(length_label(4096), "4K");
  EXPECT_EQ(length_label(131072), "128K");
  EXPECT_EQ(length_label(1048576), "1M");
  EXPECT_EQ(length_label(1000), "1000");
  fs::remove_all(out);
}

}  // namespace
}  // namespace lc::report
