// The project's reader model (compiled into longctx, the default of `read`) finds a needle in a
// 64K-token document through memagent and through sculptor, end to end: the real binary, the
// real model, greedy decoding.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/run_cli.h"

namespace {

using lc_cli::Result;
using lc_cli::run;

// About 64K tokens of the essay haystack (data/haystack/opticks.txt, 3.45 bytes a token) with
// the needle sentence at `depth` of the text, between two sentences.
std::string needle_doc(const std::string& needle, double depth) {
  std::ifstream in(std::string(LONGCTX_TEST_DATA) + "/../../data/haystack/opticks.txt", std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string src = ss.str();
  EXPECT_GT(src.size(), 100000u);
  std::string doc;
  while (doc.size() < 64 * 1024 * 345 / 100) doc += src;
  doc.resize(64 * 1024 * 345 / 100);
  const size_t at = doc.find(". ", static_cast<size_t>(static_cast<double>(doc.size()) * depth));
  doc.insert(at + 2, needle + " ");
  return doc;
}

struct Case {
  const char* reader;
  const char* key;
  const char* value;
  double depth;
};

TEST(ReadEndToEnd, ANeedleAt64KThroughMemAgentAndSculptor) {
  const Case cases[] = {
      {"sculptor", "quiet-harbor", "6150472", 0.35},
      {"memagent", "quiet-harbor", "6150472", 0.35},
  };
  for (const auto& c : cases) {
    const std::string path =
        (std::filesystem::temp_directory_path() / (std::string("lc_read_e2e_") + c.reader + ".txt")).string();
    std::ofstream(path, std::ios::binary)
        << needle_doc(std::string("One of the special magic numbers for ") + c.key + " is: " + c.value + ".", c.depth);
    const std::string q = std::string("What is the special magic number for ") + c.key + " mentioned in the provided text?";
    Result r = run("read -f " + path + " -q '" + q + "' --reader " + c.reader);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.substr(0, r.out.find('\n')), c.value) << c.reader << "\n" << r.out;
    EXPECT_NE(r.out.find("document:   6"), std::string::npos) << r.out;  // 6x,xxx tokens
    std::filesystem::remove(path);
  }
}

}  // namespace
