// The longctx binary end to end: outputs checked against llama.cpp goldens, bad input gets a
// clear error and a non-zero exit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <set>
#include <string>

#include "cli/run_cli.h"

#include "model/random_model.h"

namespace {

using lc_cli::kBin;
const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";
const std::string kStories = kGolden + "models/stories260K.gguf";

using lc_cli::Result;
using lc_cli::run;

// `longctx ARGS` exits with 1 and says `why`.
void expect_error(const std::string& args, const std::string& why) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 1) << args;
  EXPECT_NE(r.out.find(why), std::string::npos) << args << ": " << r.out;
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Cli, GreedyRunMatchesLlamaCpp) {
  std::ifstream jf(kGolden + "cases/stories260K/case.json");
  const auto cj = nlohmann::json::parse(jf);
  const std::string prompt = slurp(kGolden + "prompts/p1.txt");
  Result r = run("run -m " + kStories + " -f " + kGolden + "prompts/p1.txt -n 64 --temp 0 -c 512");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(prompt + cj["greedy"]["text"].get<std::string>()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
  EXPECT_NE(r.out.find("peak RSS"), std::string::npos);
}

TEST(Cli, TokenizeMatchesLlamaCpp) {
  Result r = run("tokenize --ids -m " + kStories + " -p 'Once upon a time'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[1, 403, 407, 261, 378]"), std::string::npos) << r.out;
}

TEST(Cli, InfoPrintsHyperParameters) {
  Result r = run("info " + kStories);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"architecture:    llama", "n_layer:         5", "n_embd:          64",
                        "n_head_kv:       4", "blk.0.attn_q.weight", "tokenizer:       llama"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(Cli, PerplexityPrintsLlamaCppFigure) {
  Result r = run("perplexity -m " + kStories + " -f " + kGolden + "prompts/ppl_text.txt -c 128 -b 128");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Final estimate: PPL = 3.7869"), std::string::npos) << r.out;
}

TEST(Cli, BadFlagIsAnError) {
  Result r = run("run --no-such-flag");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("no-such-flag"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " --top-p 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--top-p"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " -n -5");
  EXPECT_NE(r.code, 0);
  expect_error("run -m " + kStories + " -p hi -n 1 --logit-bias 3+500",
               "--logit-bias '3+500': the bias must be in [-100, 100]");
  expect_error("run -m " + kStories + " -p hi -n 1 --logit-bias 99999+1", "token id 99999 is not in the vocabulary");
}

// --logit-bias against the definition: with +100 on one token every sampled token is that one
// (token 300 of stories260K is " ha"); without it the text is another.
TEST(Cli, LogitBiasForcesAToken) {
  const Result r = run("run -m " + kStories + " -p 'Once upon a time' -n 5 --temp 1 --seed 3 -l 300+100");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("Once upon a time ha ha ha ha ha\n", 0), 0u) << r.out;
  const Result plain = run("run -m " + kStories + " -p 'Once upon a time' -n 5 --temp 1 --seed 3");
  EXPECT_NE(plain.out.rfind("Once upon a time ha ha ha ha ha\n", 0), 0u) << plain.out;
}

TEST(Cli, MissingAndHostileFiles) {
  Result r = run("run -m /nonexistent/model.gguf");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;

  const std::string full = slurp(kStories);
  const std::string trunc = write_file("trunc.gguf", full.substr(0, full.size() / 2));
  r = run("info " + trunc);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("trunc.gguf"), std::string::npos) << r.out;

  const std::string magic = write_file("magic.gguf", "GGML" + full.substr(4));
  r = run("info " + magic);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("magic.gguf"), std::string::npos) << r.out;

  const std::string empty = write_file("empty.gguf", "");
  r = run("run -m " + empty);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("empty.gguf"), std::string::npos) << r.out;
}

TEST(Cli, PromptLongerThanContextIsAnError) {
  Result r = run("run -m " + kStories + " -c 32 -p '" + std::string(400, 'a') + "' -n 4");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("context holds 32"), std::string::npos) << r.out;
}

}  // namespace

namespace {

TEST(Cli, CalibrateWritesRetrievalHeadsThatLycheeReads) {
  const std::string heads = testing::TempDir() + "heads.txt";
  Result r = run("calibrate -m " + kStories + " -f " + kGolden + "prompts/ppl_text.txt --far 256 --per-layer 2 -c 4096 -o " + heads);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string text = slurp(heads);
  EXPECT_EQ(text.rfind("longctx-retrieval-heads 1\nn_layer 5 n_head 8\n", 0), 0u) << text;
  r = run("run -m " + kStories + " -f " + kGolden + "prompts/ppl_text.txt -c 4096 -n 4 --attn lychee:budget=512,heads=" + heads);
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("calibrate -m " + kStories + " -f " + kGolden + "prompts/p1.txt --far 256 -o " + heads);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("needs more than --far 256"), std::string::npos) << r.out;
  // --total: three heads for the whole model, then head-level sharing across layers.
  r = run("calibrate -m " + kStories + " -f " + kGolden + "prompts/ppl_text.txt --far 256 --total 3 -c 4096 -o " + heads);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string total = slurp(heads);
  size_t listed = 0;
  for (size_t at = total.find(':'); at != std::string::npos; at = total.find(':', at + 1))
    for (size_t i = at + 1; i < total.size() && total[i] != '\n'; ++i)
      listed += total[i] != ' ' && (i + 1 == total.size() || total[i + 1] == ' ' || total[i + 1] == '\n');
  EXPECT_EQ(listed, 3u) << total;
  r = run("run -m " + kStories + " -f " + kGolden + "prompts/ppl_text.txt -c 4096 -n 4 --attn lychee:budget=512,share=head,heads=" +
          heads);
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("calibrate -m " + kStories + " -f " + kGolden + "prompts/ppl_text.txt --far 256 --total 41 -o " + heads);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--total 41 exceeds the model's 40 heads"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " -n 2 --attn lychee:share=model");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("share=model"), std::string::npos) << r.out;
}

// The summary's method line names the press that ran, with its full parameters.
TEST(Cli, RunSummaryNamesThePress) {
  Result r = run("run -m " + kStories + " -p \"Once upon a time there was a little dog who\" -n 2 --kv-press "
                 "snapkv:ratio=0.5,window=4,obs=4+think:channel_ratio=0.25");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("method:     rope"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", kv press snapkv:ratio=0.5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("+think:channel_ratio=0.25,window=32,query=aware"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " -n 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("kv press"), std::string::npos) << r.out;
}

TEST(Cli, MethodFlagsAreValidated) {
  Result r = run("run -m " + kStories + " -n 2 --attn nosuch");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown attention method 'nosuch'"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " -n 2 --rope yarn:factor=0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("factor"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " -n 2 --kv-press snapkv:ratio=2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("ratio"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " -n 2 --kv-type-k q4_0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("q4_0"), std::string::npos) << r.out;
  r = run("run -m " + kStories + " -c 4096 -f " + kGolden + "prompts/ppl_text.txt -n 2 --kv-budget 64K");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("budget"), std::string::npos) << r.out;
  // Under a budget, a spill directory takes the overflow and the run completes.
  r = run("run -m " + kStories + " -c 4096 -f " + kGolden + "prompts/ppl_text.txt -n 2 --kv-budget 64K --kv-spill " +
          testing::TempDir());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("spilled"), std::string::npos) << r.out;
}

// The JSON array a command printed (after any progress lines); empty if there is none.
nlohmann::json json_array_in(const std::string& out) {
  const size_t js = out.find('['), je = out.rfind(']');
  if (js == std::string::npos || je == std::string::npos || je < js) return nlohmann::json::array();
  return nlohmann::json::parse(out.substr(js, je - js + 1));
}

TEST(Cli, BenchSpeedTimesEachBackendOverOneFill) {
  Result r = run("bench speed -m " + kStories + " -p 16 -n 2 -d 300 -r 1 --no-warmup -a dense -a quest:budget=64 "
                 "--fill-attn infllm:sinks=4,local=64,topk=0 -o json --no-limits");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json_array_in(r.out);
  ASSERT_EQ(j.size(), 4u) << r.out;
  EXPECT_EQ(j[0]["attn"], "dense");
  EXPECT_EQ(j[2]["attn"], "quest:budget=64,page=16,dense_layers=2");
  // Not interleaved: quest's speed relative to dense on the same test is the ratio of means.
  EXPECT_NEAR(j[2]["vs_first"].get<double>(), j[2]["avg_ts"].get<double>() / j[0]["avg_ts"].get<double>(), 1e-9);
  for (const auto& row : j) {
    EXPECT_EQ(row["n_depth"], 300);
    EXPECT_EQ(row["kv_bytes_per_token"], 1280);  // 5 layers x 4 heads x (8 + 8) floats
    EXPECT_GT(row["avg_ts"].get<double>(), 0.0);
  }
  // --budget: every backend set to read the same number of keys (dense is the baseline).
  r = run("bench speed -m " + kStories + " -p 16 -n 2 -d 600 -r 1 --no-warmup -a dense -a quest -a dssa --budget 512 "
          "--fill-attn infllm:sinks=4,local=64,topk=0 -o json --no-limits");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto jb = json_array_in(r.out);
  ASSERT_EQ(jb.size(), 6u) << r.out;
  EXPECT_EQ(jb[0]["attn"], "dense");
  EXPECT_EQ(jb[2]["attn"], "quest:budget=512,page=16,dense_layers=0");
  EXPECT_EQ(jb[4]["attn"], "dssa:switch=512,block=64,kernel=32,stride=16,topk=6,sinks=64,local=128");
  r = run("bench speed -m " + kStories + " -p 16 -n 2 -a quest:budget=64 --budget 512");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("sets budget= itself"), std::string::npos) << r.out;
  // bench run --budget: each method's attention spec rewritten, as results.jsonl records it.
  const std::string out = testing::TempDir() + "bench_run_budget";
  std::filesystem::remove_all(out);
  r = run("bench run -m " + kStories + " --task passkey -L 700 --samples 1 -t 1 --no-plots --budget 512 -o " + out +
          " --method 'attn=dense;name=d' --method 'attn=infllm;name=i' --method 'attn=lychee:retrieval=1;name=l'");
  ASSERT_EQ(r.code, 0) << r.out;
  std::set<std::string> attn;
  std::ifstream rows(out + "/results.jsonl");
  for (std::string line; std::getline(rows, line);) attn.insert(nlohmann::json::parse(line)["attn"].get<std::string>());
  EXPECT_EQ(attn, (std::set<std::string>{"dense", "infllm:sinks=128,local=128,block=128,topk=1",
                                         "lychee:block=64,sinks=64,local=256,budget=128,retrieval=1"}));
  expect_error("bench run -m " + kStories + " --task passkey -L 700 --budget 512 -o " + out + "x",
               "runs the model's default attention");
  expect_error("bench speed -m " + kStories + " -p 16 -n 2 -a nosuch", "nosuch");
  expect_error("bench speed -m " + kStories + " -p 16 -n 2 --fill-attn quest:page=0", "--fill-attn");
}

// --interleave takes the repetitions in turns across the backends; a backend that evicts
// (streaming) makes the next turn refill, and every row still has all its repetitions.
TEST(Cli, BenchSpeedInterleavedRepetitions) {
  Result r = run("bench speed -m " + kStories + " -p 16 -n 2 -d 300 -r 3 --interleave -a dense "
                 "-a streaming:sinks=4,window=64 --fill-attn infllm:sinks=4,local=64,topk=0 -o json --no-limits");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json_array_in(r.out);
  ASSERT_EQ(j.size(), 4u) << r.out;
  const char* tests[] = {"pp16 @ d300", "pp16 @ d300", "tg2 @ d300", "tg2 @ d300"};
  for (size_t i = 0; i < j.size(); ++i) {
    EXPECT_EQ(j[i]["attn"], i % 2 == 0 ? "dense" : "streaming:sinks=4,window=64") << i;
    EXPECT_EQ(j[i]["test"], tests[i]) << i;
    EXPECT_EQ(j[i]["n_depth"], 300) << i;
    ASSERT_EQ(j[i]["samples_ts"].size(), 3u) << i;
    for (const auto& x : j[i]["samples_ts"]) EXPECT_GT(x.get<double>(), 0.0) << i;
    // The speed relative to dense on the same test is the mean of the per-turn ratios.
    double want = 0;
    for (size_t k = 0; k < 3; ++k) want += j[i]["samples_ts"][k].get<double>() / j[i - i % 2]["samples_ts"][k].get<double>();
    EXPECT_NEAR(j[i]["vs_first"].get<double>(), want / 3, 1e-9) << i;
  }
  EXPECT_EQ(j[0]["vs_first"].get<double>(), 1.0);
}

// bench press: the row's KV bytes follow the ratio; --fill-attn prefills under another backend
// and a bad one is named.
TEST(Cli, BenchPressRowAndFillBackend) {
  const std::string base = "bench press -m " + kStories + " -L 300 -n 2 -t 1 -c 512 ";
  for (const std::string fill : {"", "--fill-attn infllm:sinks=4,local=64,topk=0 "}) {
    Result r = run(base + fill + "--kv-press snapkv:ratio=0.5,window=32 --header");
    ASSERT_EQ(r.code, 0) << r.out;
    const size_t at = r.out.find("| snapkv");
    ASSERT_NE(at, std::string::npos) << r.out;
    // | press | context | KV before | KV after | ...: 300 tokens x 1280 bytes, then half.
    std::vector<std::string> cells;
    std::stringstream row(r.out.substr(at + 1, r.out.find('\n', at) - at - 1));
    for (std::string c; std::getline(row, c, '|');) cells.push_back(c);
    ASSERT_GE(cells.size(), 4u) << r.out;
    EXPECT_EQ(std::stoll(cells[1]), 300);
    EXPECT_NEAR(std::stod(cells[2]), 300.0 * 1280 / (1 << 20), 0.05);
    EXPECT_NEAR(std::stod(cells[3]), 150.0 * 1280 / (1 << 20), 0.05);
  }
  Result r = run(base + "--fill-attn quest:page=0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--fill-attn"), std::string::npos) << r.out;
}

// make-model --layers writes the shape with another depth (a draft for speckv); out of range is
// an error naming the flag.
TEST(Cli, MakeModelLayers) {
  const std::string out = testing::TempDir() + "cli_make_model_2l.gguf";
  const std::string vocab = std::string(LONGCTX_TEST_DATA) + "/vocab/ggml-vocab-gpt-2.gguf";
  Result r = run("make-model --type q8_0 --layers 2 --vocab " + vocab + " -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run("info " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("n_layer:         2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n_embd:          576\n"), std::string::npos) << r.out;
  std::remove(out.c_str());
  r = run("make-model --layers 5000 --vocab " + vocab + " -o " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--layers"), std::string::npos) << r.out;
}

// make-model --shape qwen2.5-0.5b with Qwen2's vocabulary and llama.cpp's q4_k_m mixture (one
// layer: the file is mostly the 151936-token embedding). Unknown shapes and types are errors
// that list the known ones.
TEST(Cli, MakeModelQwenShapeAndMixture) {
  const std::string out = testing::TempDir() + "cli_make_model_qwen.gguf";
  const std::string vocab = std::string(LONGCTX_TEST_DATA) + "/vocab/ggml-vocab-qwen2.gguf";
  Result r = run("make-model --shape qwen2.5-0.5b --type q4_k_m --layers 1 --vocab " + vocab + " -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run("info " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"architecture:    qwen2\n", "n_vocab:         151936\n", "n_embd:          896\n",
                        "n_layer:         1\n", "n_ff:            4864\n", "output:          tied to token_embd",
                        "token_embd.weight                q8_0", "blk.0.attn_q.weight              q5_0",
                        "blk.0.attn_q.bias                f32", "blk.0.ffn_down.weight            q6_k"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  r = run("run -m " + out + " -p hello -n 2 --temp 0 -c 64");
  EXPECT_EQ(r.code, 0) << r.out;
  std::remove(out.c_str());

  r = run("make-model --shape llama-7b --vocab " + vocab + " -o " + out);
  EXPECT_EQ(r.code, 1);
  for (const char* s : {"--shape", "llama-7b", "smollm2-135m", "qwen2.5-0.5b"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  r = run("make-model --type q3_k_m --vocab " + vocab + " -o " + out);
  EXPECT_EQ(r.code, 1);
  for (const char* s : {"--type", "q3_k_m", "q4_k_m", "q6_k"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  r = run("make-model --type q4_k --vocab " + vocab + " -o " + out);  // rows of 576 cannot be Q4_K
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("576"), std::string::npos) << r.out;
  EXPECT_FALSE(std::ifstream(out).good());
}

// make-vocab trains a byte-level BPE vocabulary on the curriculum's text; train takes it as
// --vocab and exports a model that carries it. Missing or bad input names the flag.
TEST(Cli, MakeVocabFeedsTrain) {
  const std::string vocab = testing::TempDir() + "cli_bpe_vocab.gguf";
  const std::string model = testing::TempDir() + "cli_bpe_model.gguf";
  Result r = run("make-vocab --curriculum default --from-vocab " + kStories +
                 " --samples 20 --seq-len 512 --size 400 -o " + vocab);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("400 tokens"), std::string::npos) << r.out;
  r = run("train --vocab " + vocab + " --curriculum default --seq-len 512 --cur-min-len 300 --steps 2 --batch 1 "
          "--n-layer 1 --n-embd 32 --n-head 2 --n-ff 64 -t 1 -o " + model);
  ASSERT_EQ(r.code, 0) << r.out;
  // The header names OpenBLAS's kernels. On a CPU with AVX2 and FMA longctx never trains with
  // the SSE3 kernels OpenBLAS falls back to on CPU models it does not know (kernels/blas_cpu.h).
  EXPECT_NE(r.out.find(" kernels"), std::string::npos) << r.out;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_EQ(r.out.find("OpenBLAS Prescott kernels"), std::string::npos) << r.out;
  }
  r = run("info " + model);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("gpt2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("400"), std::string::npos) << r.out;
  r = run("tokenize -m " + model + " --ids -p 'the pass key is 4395874'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("[398, ", 0), 0u) << r.out;  // BOS (<s>, id 398) first
  for (const char* f : {".loss.csv", ".loss.svg", ".loss.png"}) std::remove((model + f).c_str());
  std::remove(model.c_str());
  std::remove(vocab.c_str());

  r = run("make-vocab -o " + vocab);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--data"), std::string::npos) << r.out;
  r = run("make-vocab --curriculum default -o " + vocab);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--from-vocab"), std::string::npos) << r.out;
  r = run("make-vocab --data " + testing::TempDir() + "no_such_file.txt -o " + vocab);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no_such_file.txt"), std::string::npos) << r.out;
  r = run("make-vocab --curriculum default --from-vocab " + kStories + " --samples 2 --size 10 -o " + vocab);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("size 10"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// Draft-guided presses, query-agnostic mode and bad press input on the command line.
TEST(Cli, KvPressDraftAndQueryModes) {
  const std::string gqa = kGolden + "models/llama_gqa_f32.gguf";
  // A draft press without --draft: exit 1, says what is missing.
  Result r = run("run -m " + gqa + " -n 2 --kv-press speckv:ratio=0.5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--draft"), std::string::npos) << r.out;
  r = run("run -m " + gqa + " -n 2 --kv-press specpc:budget=100");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--draft"), std::string::npos) << r.out;
  // A draft with another vocabulary: exit 1, names both files.
  lc::RandomModelSpec rs;
  rs.n_layer = 1, rs.n_embd = 32, rs.n_head = 2, rs.n_head_kv = 1, rs.n_ff = 32, rs.n_ctx_train = 128;
  rs.vocab_path = std::string(LONGCTX_TEST_DATA) + "/vocab/ggml-vocab-gpt-2.gguf";
  const std::string other = testing::TempDir() + "cli_gpt2_draft.gguf";
  ASSERT_TRUE(lc::write_random_model(rs, other).is_ok());
  r = run("run -m " + gqa + " -n 2 --kv-press speckv:ratio=0.5 --draft " + other);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(other), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(gqa), std::string::npos) << r.out;
  std::remove(other.c_str());
  r = run("run -m " + gqa + " -n 2 --kv-press speckv:ratio=0.5 --draft /nonexistent/draft.gguf");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/draft.gguf"), std::string::npos) << r.out;
  // Bad keys and values name the press and the key.
  r = run("run -m " + gqa + " -n 2 --kv-press speckv:lookahead=0 --draft " + kStories);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("lookahead"), std::string::npos) << r.out;
  r = run("run -m " + gqa + " -n 2 --kv-press specpc:budget=100,pool=3 --draft " + kStories);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("pool"), std::string::npos) << r.out;
  r = run("run -m " + gqa + " -n 2 --kv-press snapkv:ratio=0.5,query=sideways");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("query"), std::string::npos) << r.out;
  // A press incompatible with the attention backend.
  r = run("run -m " + gqa + " -n 2 --kv-press h2o:ratio=0.5 --attn quest");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("quest"), std::string::npos) << r.out;
  // Valid setups run: a draft of the same vocabulary, and the same model as its own draft.
  const std::string prompt = "-f " + kGolden + "prompts/p2.txt";
  r = run("run -m " + gqa + " " + prompt + " -n 4 --temp 0 --kv-press speckv:ratio=0.5,obs=8,lookahead=2 --draft " + kStories);
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("run -m " + gqa + " " + prompt + " -n 4 --temp 0 --kv-press specpc:ratio=0.5,window=8 --draft " + gqa);
  EXPECT_EQ(r.code, 0) << r.out;
  // Query-agnostic with a question; chat refuses it.
  r = run("run -m " + gqa + " " + prompt + " --question \" Where?\" -n 4 --temp 0 --kv-press knorm:ratio=0.5,query=agnostic");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("chat -m " + gqa + " --kv-press knorm:ratio=0.5,query=agnostic < /dev/null");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("agnostic"), std::string::npos) << r.out;
}

}  // namespace
