// `longctx run --cp` under a real mpirun: the text equals the one-process run's, and bad
// starts, dead ranks and hung ranks end the job with messages that name the problem.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_cli.h"

extern char** environ;

namespace lc_cli {
namespace {

const std::string kGoldenModel = std::string(LONGCTX_TEST_DATA) + "/golden/models/llama_gqa_f32.gguf";
// Leak checking is off under mpirun (see tests/CMakeLists.txt: OpenMPI unloads its plugins first).
const std::string kMpirun = "env ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 mpirun --oversubscribe --allow-run-as-root";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A shell command's exit code and stdout; stderr goes to `err` when given.
Result sh(const std::string& cmd, std::string* err = nullptr) {
  // One file per process: ctest runs the DistCli tests as parallel processes.
  const std::string ef = ::testing::TempDir() + "/dist_cli_err." + std::to_string(getpid()) + ".txt";
  FILE* p = popen((cmd + " 2>" + ef).c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  if (err) *err = slurp(ef);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

TEST(DistCli, RingAndWholePrefixStarPrintTheOneProcessText) {
  const std::string args = " run -m " + kGoldenModel + " -p 'Once upon a time there was a little robot who' -n 24 "
                           "--temp 0 -t 1";
  std::string err;
  const Result one = sh(kBin + args, &err);
  ASSERT_EQ(one.code, 0) << err;
  for (const char* np : {"2", "4"}) {
    const Result ring = sh(kMpirun + " -np " + np + " " + kBin + args + " --cp ring", &err);
    ASSERT_EQ(ring.code, 0) << err;
    EXPECT_EQ(ring.out, one.out) << np << " ranks";
    // Every rank reports its shard: two pieces of the prompt (zigzag, the default) and the
    // attention pairs it did.
    for (int r = 0; r < std::stoi(np); ++r) {
      const std::string tag = "cp ring: rank " + std::to_string(r) + "/" + np;
      const size_t at = err.find(tag + ": tokens [");
      ASSERT_NE(at, std::string::npos) << err;
      EXPECT_NE(err.find(") and [", at), std::string::npos) << err;
      EXPECT_NE(err.find(tag + ": prefill attended "), std::string::npos) << err;
    }
  }
  const Result contiguous = sh(kMpirun + " -np 2 " + kBin + args + " --cp ring:split=contiguous", &err);
  ASSERT_EQ(contiguous.code, 0) << err;
  EXPECT_EQ(contiguous.out, one.out);
  EXPECT_NE(err.find("cp ring:split=contiguous: rank 1/2: tokens ["), std::string::npos) << err;
  const Result star = sh(kMpirun + " -np 2 " + kBin + args + " --cp star:anchor=1000000", &err);
  ASSERT_EQ(star.code, 0) << err;
  EXPECT_EQ(star.out, one.out);
  // Blocks of 2 tokens, several per rank, each after its whole prefix: the one-process text too.
  const Result blocks = sh(kMpirun + " -np 2 " + kBin + args + " --cp star:anchor=1000000,block=2", &err);
  ASSERT_EQ(blocks.code, 0) << err;
  EXPECT_EQ(blocks.out, one.out);
  EXPECT_NE(err.find("cp star:anchor=1000000,block=2: rank 1/2: prefill attended "), std::string::npos) << err;
  EXPECT_NE(err.find(" block(s)"), std::string::npos) << err;
}

TEST(DistCli, ClearErrorsBeforeAndAfterMpiStarts) {
  Result r = run("run -p hello -n 1 --cp ring");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("not started by mpirun"), std::string::npos) << r.out;
  r = run("run -p hello -n 1 --cp tree");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown mode 'tree'"), std::string::npos) << r.out;
  r = run("run -p hello -n 1 --cp ring --qttt steps=1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--qttt"), std::string::npos) << r.out;
  // One rank: nothing to spread over.
  std::string err;
  r = sh(kMpirun + " -np 1 " + kBin + " run -p hello -n 1 --cp ring", &err);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(err.find("start at least 2"), std::string::npos) << err;
  // A prompt shorter than the ranks: every rank says so and the job ends.
  r = sh(kMpirun + " -np 4 " + kBin + " run -m " + kGoldenModel + " -p 'a b' -n 1 --cp ring -t 1", &err);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(err.find("fewer than the 8 pieces of the zigzag split over 4 ranks"), std::string::npos) << err;
  r = sh(kMpirun + " -np 4 " + kBin + " run -m " + kGoldenModel + " -p 'a b' -n 1 --cp ring:split=contiguous -t 1",
         &err);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(err.find("fewer than the 4 ranks"), std::string::npos) << err;
  r = run("run -p hello -n 1 --cp ring:split=striped");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("split must be zigzag or contiguous, not 'striped'"), std::string::npos) << r.out;
}

// results.jsonl without the fields that measure time or memory, line by line.
std::vector<nlohmann::json> results_without_timings(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/results.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (const char* k : {"t_prefill", "t_decode", "prefill_tps", "decode_tps", "peak_rss", "kv_alloc_bytes"}) j.erase(k);
    out.push_back(std::move(j));
  }
  return out;
}

TEST(DistCli, DistributedBenchRunWritesTheOneProcessReports) {
  const std::string base = ::testing::TempDir() + "/dist_bench";
  std::filesystem::remove_all(base);
  const std::string args = " bench run --task niah_single_1,passkey,vt -L 512,1K --samples 3 -t 1 -o ";
  std::string err;
  ASSERT_EQ(sh(kBin + args + base + "/one", &err).code, 0) << err;
  for (const char* np : {"2", "3"}) {
    const std::string dir = base + "/np" + np;
    const Result r = sh(kMpirun + " -np " + np + " " + kBin + args + dir, &err);
    ASSERT_EQ(r.code, 0) << err;
    EXPECT_NE(r.out.find("18 sample(s) run"), std::string::npos) << r.out;
    const auto want = results_without_timings(base + "/one");
    ASSERT_EQ(want.size(), 18u);
    EXPECT_EQ(results_without_timings(dir), want) << np << " ranks";
    // The plots of scores are the same drawings (cairo numbers its surfaces per process).
    auto drawing = [](std::string svg) { return std::regex_replace(svg, std::regex("surface[0-9]+"), "surface"); };
    for (const char* f : {"effective_length.csv", "accuracy_vs_length.svg", "accuracy_by_task-baseline.svg"})
      EXPECT_TRUE(drawing(slurp(dir + "/" + f)) == drawing(slurp(base + "/one/" + f))) << f << ", " << np << " ranks";
    // A second distributed run over the same folder resumes every sample.
    const Result again = sh(kMpirun + " -np " + np + " " + kBin + args + dir, &err);
    ASSERT_EQ(again.code, 0) << err;
    EXPECT_NE(again.out.find("0 sample(s) run, 18 resumed"), std::string::npos) << again.out;
    EXPECT_EQ(results_without_timings(dir).size(), 18u);
  }
}

// Starts mpirun with 2 ranks on a long generation (the project's model, a 2K-token prompt, 100K
// tokens), waits until rank 1 reports its pid, sends it the signal, and waits for the job to end
// (at most 120 s; then it kills the job and fails).
struct JobEnd {
  int code = 0;
  std::string err;
};
JobEnd disturb_rank_one(int signal_number) {
  JobEnd je;
  const std::string dir = ::testing::TempDir();
  const std::string tag = std::to_string(getpid());  // the tests that call this run in parallel
  const std::string ef = dir + "/dist_cli_job." + tag + ".txt", pf = dir + "/dist_cli_prompt." + tag + ".txt";
  {
    std::ofstream p(pf);
    for (int i = 0; i < 200; ++i) p << "The quick brown fox jumps over the lazy dog number " << i << ". ";
  }
  std::filesystem::remove(ef);
  const std::string cmd = "exec " + kMpirun + " -np 2 " + kBin + " run -f " + pf +
                          " -n 100000 --ignore-eos -t 1 --cp ring --cp-timeout 4 > /dev/null 2> " + ef;
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t job = 0;
  EXPECT_EQ(posix_spawn(&job, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  pid_t rank1 = 0;
  const std::string mark = "rank 1/2 started, pid ";
  for (int i = 0; i < 600 && rank1 == 0; ++i) {
    const std::string err = slurp(ef);
    if (const auto at = err.find(mark); at != std::string::npos && err.find('\n', at) != std::string::npos)
      rank1 = std::stoi(err.substr(at + mark.size()));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(rank1, 0) << "rank 1 never started: " << slurp(ef);
  if (rank1 != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(1));  // into the work
    kill(rank1, signal_number);
  }
  int status = 0;
  bool ended = false;
  for (int i = 0; i < 1200 && !ended; ++i) {
    ended = waitpid(job, &status, WNOHANG) == job;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!ended) {
    ADD_FAILURE() << "the job did not end within 120 s of rank 1's signal " << signal_number;
    kill(job, SIGKILL);
    if (rank1) kill(rank1, SIGKILL);
    waitpid(job, &status, 0);
  }
  if (rank1 != 0 && signal_number == SIGSTOP) kill(rank1, SIGKILL);  // in case mpirun left it stopped
  je.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  je.err = slurp(ef);
  return je;
}

TEST(DistCli, KilledRankEndsTheJobAndEveryRankSaysWhy) {
  const JobEnd je = disturb_rank_one(SIGKILL);
  EXPECT_NE(je.code, 0);
  EXPECT_NE(je.err.find("rank 1"), std::string::npos) << je.err;
  // Rank 0 learns of it, from mpirun or from its own wait.
  EXPECT_TRUE(je.err.find("longctx: rank 0: stopped by mpirun") != std::string::npos ||
              je.err.find("longctx: rank 0:") != std::string::npos)
      << je.err;
}

TEST(DistCli, HungRankIsNamedWithinTheTimeout) {
  const JobEnd je = disturb_rank_one(SIGSTOP);
  EXPECT_NE(je.code, 0);
  EXPECT_NE(je.err.find("(--cp-timeout) for rank 1: it died or hangs"), std::string::npos) << je.err;
}

}  // namespace
}  // namespace lc_cli
