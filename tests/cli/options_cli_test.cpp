// Values with unit suffixes on the command line (tools/longctx/options.h): --kv-budget sizes
// and the bench commands' -L lengths are read by CLI11 (lists split by ->delimiter, bounds by
// CLI::Range) through the project's own parsers, so every form they took before gives the same
// number ("0300" is 300, not octal; "1.5G" is a fraction of a GiB), and a bad value is a parse
// error that names the flag.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/run_cli.h"

namespace {

using lc_cli::Result;
using lc_cli::run;

const std::string kStories = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";
const std::string kText = std::string(LONGCTX_TEST_DATA) + "/golden/prompts/ppl_text.txt";

// The budget a run was given, as its "budget reached" error states it in bytes.
TEST(CliOptions, KvBudgetSizes) {
  const std::string base = "run -m " + kStories + " -c 4096 -f " + kText + " -n 2 --kv-budget ";
  for (const char* same : {"64K", "64k", "64KB", "64kib", "65536", "65536B", "0.0625M"}) {
    Result r = run(base + same);
    EXPECT_EQ(r.code, 1) << same << ": " << r.out;
    EXPECT_NE(r.out.find("(--kv-budget 65536 bytes)"), std::string::npos) << same << ": " << r.out;
  }
  Result r = run(base + "62.5K");  // a fraction of a unit: 64000 bytes
  EXPECT_NE(r.out.find("(--kv-budget 64000 bytes)"), std::string::npos) << r.out;
  r = run(base + "064K");  // a leading zero is decimal
  EXPECT_NE(r.out.find("(--kv-budget 65536 bytes)"), std::string::npos) << r.out;
  r = run(base + "''");  // empty: no cap
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* bad : {"lots", "-5", "12X", "0x10", "1.2.3G", "5Gb_x", "M"}) {
    Result b = run(base + bad);
    EXPECT_NE(b.code, 0) << bad << ": " << b.out;
    EXPECT_NE(b.out.find("--kv-budget: size '"), std::string::npos) << bad << ": " << b.out;
    EXPECT_NE(b.out.find("512M"), std::string::npos) << bad << ": " << b.out;  // the forms it takes
  }
}

// The "length" of every JSON line bench tasks wrote, in order.
std::vector<int64_t> lengths_of(const std::string& out) {
  std::vector<int64_t> v;
  std::stringstream ss(out);
  for (std::string line; std::getline(ss, line);)
    if (!line.empty() && line[0] == '{') v.push_back(nlohmann::json::parse(line)["length"].get<int64_t>());
  return v;
}

TEST(CliOptions, BenchLengths) {
  const std::string tasks = "bench tasks -m " + kStories + " --task passkey --samples 1 ";
  Result r = run(tasks + "-L 1K,0300,2k -L 512");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lengths_of(r.out), (std::vector<int64_t>{1024, 300, 2048, 512}));
  r = run(tasks + "-L 1K,,2K,");  // empty items add nothing, as before
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lengths_of(r.out), (std::vector<int64_t>{1024, 2048}));
  r = run(tasks);  // the default, 4K
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lengths_of(r.out), (std::vector<int64_t>{4096}));
  // Bad items, and lengths below each command's minimum, name the flag.
  const std::vector<std::string> bad = {
      tasks + "-L x",          tasks + "-L 4K,y",    tasks + "-L 0",  tasks + "-L 0x10",  tasks + "-L -4",
      tasks + "-L 1.5K",       tasks + "-L 1G",      "bench run -m " + kStories + " --task passkey -L 4Q",
      "bench press -m " + kStories + " -L 1",         "bench press -m " + kStories + " -L 300,K",
      "bench ppl -m " + kStories + " -L 15",          "bench ppl -m " + kStories + " -L 4K,8K"};
  for (const std::string& cmd : bad) {
    Result b = run(cmd);
    EXPECT_NE(b.code, 0) << cmd << ": " << b.out;
    EXPECT_NE(b.out.find("--length"), std::string::npos) << cmd << ": " << b.out;
  }
}

}  // namespace
