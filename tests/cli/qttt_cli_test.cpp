// `--qttt` on the command line: run and bench run adapt W_q and report it; bad specs and
// combinations qTTT cannot serve exit 1 with a message naming the flag.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/run_cli.h"

namespace {

using lc_cli::kBin;
const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";
const std::string kStories = kGolden + "models/stories260K.gguf";
const std::string kPrompt = kGolden + "prompts/p2.txt";  // 207 tokens, past the 128-token training window

using lc_cli::Result;
using lc_cli::run;

TEST(CliQttt, RunAdaptsAndReports) {
  const std::string base = "run -m " + kStories + " -f " + kPrompt + " -n 8 --temp 0 --seed 3 -c 512 -t 1";
  Result r = run(base + " --qttt steps=3,lr=0.01,span=48 --question ' Where did Tom go?'");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t at = r.out.find("qTTT:       3 steps x 48 tokens");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loss on the first span", at), std::string::npos) << r.out;
  // The same seed gives the same spans, hence the same report line up to the timings.
  Result again = run(base + " --qttt steps=3,lr=0.01,span=48 --question ' Where did Tom go?'");
  ASSERT_EQ(again.code, 0) << again.out;
  const auto loss_part = [](const std::string& s) { return s.substr(s.find("loss on the first span"), 40); };
  EXPECT_EQ(loss_part(r.out), loss_part(again.out));
  // steps=0: qTTT off, the output of a plain run.
  Result off = run(base + " --qttt steps=0");
  Result plain = run(base);
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_NE(off.out.find("qTTT:       off"), std::string::npos) << off.out;
  EXPECT_EQ(off.out.substr(0, off.out.find("prompt:")), plain.out.substr(0, plain.out.find("prompt:")));
}

TEST(CliQttt, BadSpecsAndCombinationsAreErrors) {
  const std::string base = "run -m " + kStories + " -f " + kPrompt + " -n 2 -c 512 -t 1 ";
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"--qttt steps=-2", "--qttt 'steps=-2'"}, Case{"--qttt lr=0", "lr=0 must be > 0"},
                        Case{"--qttt span=1", "span=1 must be at least 2"}, Case{"--qttt step=2", "unknown key 'step'"},
                        Case{"--qttt steps=2,span=999", "--qttt span=999 is longer than the context (206 tokens)"},
                        Case{"--qttt steps=2,span=32 --kv-press snapkv:ratio=0.5", "--kv-press"},
                        Case{"--qttt steps=2,span=32 --attn quest:budget=64", "--qttt needs --attn dense"},
                        Case{"--qttt steps=2,span=32 --attn fixed:distance=16,budget=64", "fixed (without budget)"}}) {
    Result r = run(base + c.args);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
}

TEST(CliQttt, BenchRunRecordsQttt) {
  const std::string out = testing::TempDir() + "qttt_bench";
  std::remove((out + "/results.jsonl").c_str());
  Result r = run("bench run -m " + kStories + " --task passkey -L 512 --max-new-tokens 4 -t 1 --no-plots -o " + out +
                 " --qttt none --qttt steps=2,lr=0.001,span=64");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("qttt steps=2,lr=0.001,span=64"), std::string::npos) << r.out;
  std::ifstream in(out + "/results.jsonl");
  std::string line;
  int with = 0, without = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("qttt")) {
      ++with;
      EXPECT_EQ(j["qttt"], "steps=2,lr=0.001,span=64");
      EXPECT_GT(j["t_qttt"].get<double>(), 0.0);
      EXPECT_GT(j["qttt_loss_before"].get<double>(), 0.0);
    } else {
      ++without;
    }
  }
  EXPECT_EQ(with, 1);
  EXPECT_EQ(without, 1);
  r = run("bench run -m " + kStories + " --task passkey -L 512 -t 1 --no-plots -o " + out + " --qttt lr=-1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("lr=-1 must be > 0"), std::string::npos) << r.out;
  r = run("bench run -m " + kStories + " --task passkey -L 512 -t 1 --no-plots -o " + out +
          " --method 'press=snapkv:ratio=0.5;qttt=steps=2,span=32'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--kv-press"), std::string::npos) << r.out;
  r = run("bench ppl -m " + kStories + " -L 256 -o " + out + " --method 'qttt=steps=2,span=32'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("bench ppl does not run qTTT"), std::string::npos) << r.out;
}

}  // namespace
