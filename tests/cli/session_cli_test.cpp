// The request flow from the command line: run --prompt-cache (a saved Session continues, with
// the same output as a run from scratch), bench run's KV-cache flags, and a truncated haystack
// file that must be an error, not skipped samples.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/run_cli.h"

namespace {

using lc_cli::Result;
using lc_cli::run;

const std::string kStories = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";
const std::string kPrompt = "'Once upon a time, there was a little girl named Lily. She loved to play outside.'";

// The generated text: stdout up to the first blank line of the summary.
std::string text_of(const std::string& out) { return out.substr(0, out.find("\n\nprompt:")); }

TEST(CliSession, PromptCacheContinuesASavedSession) {
  const std::string cache = testing::TempDir() + "prompt_cache.bin";
  std::remove(cache.c_str());
  const std::string base = "run -m " + kStories + " -p " + kPrompt + " -n 24 --temp 0 -c 256";
  Result plain = run(base);
  ASSERT_EQ(plain.code, 0) << plain.out;
  Result first = run(base + " --prompt-cache " + cache);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("0 prompt tokens reused"), std::string::npos) << first.out;
  ASSERT_TRUE(std::filesystem::exists(cache));
  Result second = run(base + " --prompt-cache " + cache);
  ASSERT_EQ(second.code, 0) << second.out;
  // The whole prompt came from the file (the last token is evaluated again for its logits).
  EXPECT_NE(second.out.find("prompt:          1 tokens"), std::string::npos) << second.out;
  EXPECT_EQ(text_of(first.out), text_of(plain.out));
  EXPECT_EQ(text_of(second.out), text_of(plain.out));
  // A longer prompt with the same start reuses the common prefix and matches a fresh run.
  const std::string longer = "run -m " + kStories +
                             " -p 'Once upon a time, there was a little girl named Lily. She loved to play outside. "
                             "One day' -n 24 --temp 0 -c 256";
  Result fresh = run(longer);
  Result cont = run(longer + " --prompt-cache " + cache);
  ASSERT_EQ(cont.code, 0) << cont.out;
  EXPECT_EQ(text_of(cont.out), text_of(fresh.out));
  // Bad files and settings are errors that name the problem.
  {
    std::ofstream(cache, std::ios::binary | std::ios::trunc) << "garbage";
  }
  Result bad = run(base + " --prompt-cache " + cache);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("not a longctx session file"), std::string::npos) << bad.out;
  std::remove(cache.c_str());
  ASSERT_EQ(run(base + " --prompt-cache " + cache).code, 0);
  Result other = run(base + " --kv-type-k f16 --prompt-cache " + cache);
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.out.find("--prompt-cache"), std::string::npos) << other.out;
  Result agnostic = run(base + " --kv-press snapkv:query=agnostic --prompt-cache " + cache);
  EXPECT_EQ(agnostic.code, 1);
  EXPECT_NE(agnostic.out.find("query=agnostic"), std::string::npos) << agnostic.out;
  std::remove(cache.c_str());
}

TEST(CliSession, BenchRunTakesTheCacheFlags) {
  const std::string out = testing::TempDir() + "bench_kv_flags";
  std::filesystem::remove_all(out);
  Result r = run("bench run -m " + kStories + " --task passkey -L 512 --max-new-tokens 4 -t 1 --no-plots --out-dir " +
                 out + " --kv-block 32 --kv-type-k f16 --kv-type-v bf16 --kv-budget 64M");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out + "/results.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto j = nlohmann::json::parse(line);
  // K in f16 and V in bf16: 2 bytes per element each; the blocks hold 32 tokens.
  EXPECT_GT(j["kv_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["kv_bytes"].get<int64_t>() % (32 * 2 * 8), 0) << line;
  r = run("bench run -m " + kStories + " --task passkey -L 512 -t 1 --no-plots --out-dir " + out +
          " --kv-type-k q4_0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("q4_0"), std::string::npos) << r.out;
  r = run("bench run -m " + kStories + " --task passkey -L 512 -t 1 --no-plots --out-dir " + out + " --kv-budget lots");
  EXPECT_NE(r.code, 0);  // a CLI11 parse error now, with CLI11's exit code
  EXPECT_NE(r.out.find("--kv-budget: size 'lots' is not a byte size"), std::string::npos) << r.out;
  std::filesystem::remove_all(out);
}

// kvzip's reconstruction passes append the context again after it: at the default context size
// (the longest length) they cannot fit and the error says so; -c 0 lets the cache grow.
TEST(CliSession, BenchRunContextSizeLetsKvzipReconstruct) {
  const std::string out = testing::TempDir() + "bench_ctx_size";
  std::filesystem::remove_all(out);
  const std::string base = "bench run -m " + kStories + " --task passkey -L 512 --max-new-tokens 4 -t 1 --no-plots " +
                           "--kv-press kvzip:ratio=0.5 --out-dir " + out;
  Result r = run(base);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("reconstruction pass"), std::string::npos) << r.out;
  r = run(base + " -c 0");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out + "/results.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(nlohmann::json::parse(line)["press"], "kvzip:ratio=0.5") << line;
  r = run(base + " -c 256");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--ctx-size 256 is below the longest length 512"), std::string::npos) << r.out;
  std::filesystem::remove_all(out);
}

TEST(CliSession, TruncatedHaystackIsAnErrorNotASkip) {
  const std::string dir = testing::TempDir() + "short_haystack";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/opticks.txt");
    for (int i = 0; i < 50; ++i) f << "light is refracted ";
  }
  const std::string out = testing::TempDir() + "short_haystack_out";
  std::filesystem::remove_all(out);
  Result r = run("bench run -m " + kStories + " --task niah_single_2 -L 1K -t 1 --no-plots --out-dir " + out +
                 " --data-dir " + dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("skipped"), std::string::npos) << r.out;
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// docs/methods.md is the output of `longctx methods --markdown`: the method tables come from
// the registries' own declarations and parsers, and a change to a method that is not
// regenerated into the docs fails here.
TEST(CliMethods, DocsTablesComeFromTheRegistries) {
  Result r = run("methods --markdown");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(std::string(LONGCTX_TEST_DATA) + "/../../docs/methods.md", std::ios::binary);
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(r.out, doc) << "regenerate with: ./build/longctx methods --markdown > docs/methods.md";
  // Every method of the three registries, with keys where it has any.
  for (const char* m : {"`yarn`", "`logn`", "`dense`", "`quest`", "`fixed`", "`lychee`", "`snapkv`", "`keydiff`",
                        "`specpc`", "`adakv`"})
    EXPECT_NE(r.out.find(std::string("| ") + m + " |"), std::string::npos) << m;
  EXPECT_NE(r.out.find("`budget` (int, default 2048, [1, 1073741824]): tokens a query head attends"),
            std::string::npos);
  Result plain = run("methods");
  ASSERT_EQ(plain.code, 0);
  EXPECT_NE(plain.out.find("Attention backends (--attn"), std::string::npos) << plain.out;
}

}  // namespace

namespace {

// bench speed's lists are CLI11 lists with a range check: a bad item names the flag.
TEST(CliOptions, BenchSpeedListsAreValidated) {
  for (const char* bad : {"-p x", "-p 16,-3", "-n 1e40", "-d 5,,6x"}) {
    Result r = run("bench speed -m " + kStories + " -r 1 " + bad);
    EXPECT_NE(r.code, 0) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--n-"), std::string::npos) << bad << ": " << r.out;
  }
  // Small bandwidth buffers keep the run short; the figures are not checked, only that each
  // test has its bound and the fraction is the result over it.
  Result ok = run("bench speed -m " + kStories + " -p 8,16 -n 2 -r 1 --no-warmup --format json --limits-mib 8");
  ASSERT_EQ(ok.code, 0) << ok.out;
  const auto j = nlohmann::json::parse(ok.out.substr(ok.out.find('[')));
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["n_prompt"], 8);
  EXPECT_EQ(j[1]["n_prompt"], 16);
  EXPECT_EQ(j[2]["n_gen"], 2);
  EXPECT_LE(j[0]["machine"]["buffer_bytes"].get<int64_t>(), int64_t{8} << 20);
  EXPECT_GT(j[0]["machine"]["buffer_bytes"].get<int64_t>(), int64_t{7} << 20);
  EXPECT_GT(j[0]["machine"]["read_gbps"].get<double>(), 0.0);
  for (const auto& row : j) {
    ASSERT_GT(row["bound_ts"].get<double>(), 0.0) << row.dump();
    EXPECT_NEAR(row["of_bound"].get<double>(), row["avg_ts"].get<double>() / row["bound_ts"].get<double>(), 1e-9);
  }
  EXPECT_NE(run("bench speed -m " + kStories + " -p 8 -n 0 -r 1 --limits-mib -1").code, 0);
}

}  // namespace
