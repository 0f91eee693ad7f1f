// `longctx read`: the answer on stdout, the run's figures on stderr, and clear errors for bad
// flags and files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/run_cli.h"

namespace {

using lc_cli::Result;
using lc_cli::run;

std::string write_doc(const std::string& name, const std::string& text) {
  const std::string p = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TEST(CliRead, ReadsWithTheEmbeddedModelAndPrintsTheFigures) {
  std::string doc;
  for (int i = 0; i < 200; ++i) doc += "The grass is green and the sky is blue. ";
  const std::string path = write_doc("lc_read_cli_doc.txt", doc);
  const std::string log = path + ".jsonl";
  Result r = run("read -f " + path + " -q 'What is the special magic number?' --reader mapreduce:answer=4 --log " + log);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"reader:     mapreduce:chunk=", "document:   ", "model:      ", "calls, ", "document tokens/s",
                        "peak RSS"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // One JSON line per call.
  std::ifstream in(log);
  int lines = 0;
  for (std::string l; std::getline(in, l);) lines += l.rfind("{\"chunk\":", 0) == 0;
  EXPECT_GE(lines, 2);
  const size_t at = r.out.find("model:      ");
  EXPECT_EQ(std::stoi(r.out.substr(at + 12)), lines) << r.out;
  std::filesystem::remove(log);
  std::filesystem::remove(path);
}

TEST(CliRead, BadInputIsAClearError) {
  const std::string path = write_doc("lc_read_cli_small.txt", "Some text here. More text there.");
  struct Case {
    std::string args, want;
  };
  const Case cases[] = {
      {"read -q x", "--file is required"},
      {"read -f " + path, "--question is required"},
      {"read -f /nonexistent/doc.txt -q x", "/nonexistent/doc.txt: cannot open document file"},
      {"read -f " + write_doc("lc_read_cli_empty.txt", "") + " -q x", "the document is empty"},
      {"read -f " + path + " -q x --reader nosuch", "unknown reader 'nosuch'"},
      {"read -f " + path + " -q x --reader memagent:chunk=-3", "key 'chunk' expects an integer"},
      {"read -f " + path + " -q x --resume", "--resume needs --checkpoint FILE"},
      {"read -f " + path + " -q x --reader-prompts /nonexistent", "/nonexistent/memagent_update.txt"},
  };
  for (const auto& c : cases) {
    Result r = run(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_LT(r.code, 128) << c.args << ": crashed\n" << r.out;
    EXPECT_NE(r.out.find(c.want), std::string::npos) << c.args << "\n" << r.out;
  }
  std::filesystem::remove(path);
}

}  // namespace
